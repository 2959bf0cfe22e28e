"""Where the Definitions get their profile, data root and hub from (the CLI passes them; the UI reads env)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_ROOT = REPO_ROOT / ".demo"
REAL_PROFILE = REPO_ROOT / "manifests" / "stage2_core_v1.toml"


@dataclass(frozen=True)
class BuildConfig:
    profile_path: str
    data_root: str
    endpoint: str = "https://huggingface.co"
    kit_root: str | None = None
    hub_folder: str | None = None  # serve this folder on loopback for each run instead of `endpoint`
    token_env_var: str = "HF_TOKEN"
    reverify: bool = False
    webhook_url: str | None = None  # alerts are POSTed here when set
    store_url: str | None = (
        None  # fsspec URL of the stores root (s3://bucket/prefix); default <data_root>/stores
    )
    store_options: dict[str, Any] | None = None  # fsspec storage options for store_url
    # where the steps run (pipelines/executors.py): in_process | multiprocess | dask | k8s
    executor: str = "in_process"
    dask_address: str | None = None  # dask scheduler (tcp://host:8786); None: a LocalCluster per build

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_env(cls) -> BuildConfig:
        demo_profile = DEMO_ROOT / "demo" / "kit" / "profile.toml"
        default_profile = demo_profile if demo_profile.is_file() else REAL_PROFILE
        return cls(
            profile_path=os.environ.get("STAGE2_PROFILE", str(default_profile)),
            data_root=os.environ.get("STAGE2_DATA_ROOT", str(DEMO_ROOT / "data")),
            endpoint=os.environ.get("STAGE2_HUB_ENDPOINT", "https://huggingface.co"),
            kit_root=os.environ.get("STAGE2_KIT_ROOT") or None,
            hub_folder=os.environ.get("STAGE2_HUB_FOLDER") or None,
            token_env_var=os.environ.get("STAGE2_TOKEN_ENV", "HF_TOKEN"),
            webhook_url=os.environ.get("STAGE2_ALERT_WEBHOOK") or None,
            store_url=os.environ.get("STAGE2_STORE_URL") or None,
            store_options=json.loads(os.environ.get("STAGE2_STORE_OPTIONS") or "{}"),
            executor=os.environ.get("STAGE2_EXECUTOR") or "in_process",
            dask_address=os.environ.get("STAGE2_DASK_ADDRESS") or None,
        )
