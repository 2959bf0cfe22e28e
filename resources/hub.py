"""The hub source: the real Hugging Face Hub, or the loopback hub serving a local folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from stage2_data.acquire import HubSource
from stage2_data.profile import check_full_commit

REAL_HUB_ENDPOINT = "https://huggingface.co"


class HubSourceResource(dg.ConfigurableResource):
    """A dataset repository pinned at a full commit. ``endpoint`` is the only thing that changes
    between the loopback demo hub and the real hub. The token is read from the environment
    variable named by ``token_env_var`` at run time and never stored in config or metadata."""

    repo_id: str = Field(description="e.g. robometer/processed_datasets")
    repo_type: str = Field(default="dataset", description="dataset | model | space")
    revision: str = Field(description="a full 40-hex commit; branch names are refused")
    endpoint: str = Field(default=REAL_HUB_ENDPOINT, description="hub base URL")
    token_env_var: str = Field(default="HF_TOKEN", description="environment variable holding the token")

    _revision = field_validator("revision")(lambda cls, v: check_full_commit(v))

    @field_validator("repo_type")
    @classmethod
    def _repo_type(cls, v: str) -> str:
        if v not in ("dataset", "model", "space"):
            raise ValueError(f"repo_type {v!r} must be dataset, model or space")
        return v

    def source(self) -> HubSource:
        token = os.environ.get(self.token_env_var) or None
        return HubSource(
            repo_id=self.repo_id,
            repo_type=self.repo_type,
            revision=self.revision,
            endpoint=self.endpoint,
            token=token,
        )


class LoopbackHubResource(HubSourceResource):
    """The local implementation: serves ``folder`` over the hub's HTTP protocol on 127.0.0.1 for the
    duration of a run (the real ``huggingface_hub`` client talks to it); ``endpoint`` is set when it starts."""

    folder: str = Field(description="folder served as the dataset repo")
    endpoint: str = Field(default="", description="filled in when the server starts")
    _server: object = PrivateAttr(default=None)

    def source(self) -> HubSource:
        return replace(super().source(), hub_folder=self.folder)

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[LoopbackHubResource]:
        from stage2_data.demo.hubserver import serve_pinned

        server = serve_pinned(
            self.folder, repo_id=self.repo_id, revision=self.revision, repo_type=self.repo_type
        ).start()
        try:
            yield self.model_copy(update={"endpoint": server.url})
        finally:
            server.stop()
