"""The hub's listing of a pinned revision and the revision check, retried by the one retry policy.

``resolve_revision`` (the commit a branch, tag or short hash names) and ``check_revision`` call the
client's ``HfApi.repo_info``; ``list_remote_files`` reads the tree endpoint page by page through the
client's own session, headers and error mapping (``get_session``, ``build_hf_headers``,
``hf_raise_for_status``): ``HfApi.list_repo_tree`` would retry each page by the client's own policy,
which honours no HTTP-date ``Retry-After`` and no cap. Every request here is retried by
``retry.with_retries``, as the downloads are.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any
from urllib.parse import quote

from huggingface_hub import constants as hf_constants
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from .. import layout
from ..errors import HubError
from .hub import HubSource, RemoteFile, require_online
from .retry import RetryPolicy, with_retries


def resolve_revision(source: HubSource, *, policy: RetryPolicy | None = None) -> str:
    """The full commit ``source.revision`` (a commit, a branch name, a tag or a short hash) names on
    the hub now: ``HfApi.repo_info(revision=...).sha``. HubError when the hub knows no such revision
    (its cause a ``RevisionNotFoundError``) or gives no commit."""
    what = f"resolving revision {source.revision}"
    require_online(source, what)
    info, _ = with_retries(
        lambda _attempt: source.api().repo_info(
            source.repo_id, repo_type=source.repo_type, revision=source.revision
        ),
        source,
        what=what,
        policy=policy,
    )
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not layout.HEX40_RE.match(sha):
        raise HubError(
            f"the hub at {source.api_endpoint} gave no commit for revision {source.revision} of {source.label}"
            + (f" (it gave {sha!r})." if sha else "."),
            fix="check the endpoint (--endpoint / HF_ENDPOINT)",
        )
    return sha


def check_revision(source: HubSource, *, policy: RetryPolicy | None = None) -> str:
    """Resolve ``source.revision`` on the hub; return the commit. Raises HubError when it does not
    exist, or when the hub resolves it to another commit (a branch name or tag is never a pin)."""
    sha = resolve_revision(source, policy=policy)
    if sha != source.revision:
        raise HubError(
            f"revision {source.revision!r} of {source.label} resolves to commit {sha} at {source.api_endpoint}, "
            f"not to the pinned {source.revision!r}; a branch name, tag or short hash is never a pin.",
            fix=f"set [source] revision = {sha!r} in the profile (after checking that commit), then run `stage2 pin`",
        )
    return str(sha)


def _tree_page(
    source: HubSource, url: str, params: dict[str, str] | None, _attempt: int = 1
) -> tuple[list[Any], str | None]:
    response = get_session().get(
        url,
        params=params,
        headers=build_hf_headers(token=source.token),
        timeout=hf_constants.HF_HUB_DOWNLOAD_TIMEOUT,
    )
    hf_raise_for_status(response)
    data = response.json()
    if not isinstance(data, list):
        raise HubError(
            f"the hub at {source.api_endpoint} answered the listing of {source.label} with "
            f"{type(data).__name__}, not a list of entries.",
            fix="check the endpoint (--endpoint / HF_ENDPOINT)",
        )
    return data, response.links.get("next", {}).get("url")


def list_remote_files(source: HubSource, *, policy: RetryPolicy | None = None) -> dict[str, RemoteFile]:
    """Every file of the repository at the pinned revision: {path: RemoteFile(path, size, sha256)}."""
    check_revision(source, policy=policy)
    what = f"listing {source.label} at {source.revision}"
    url: str | None = (
        f"{source.api_endpoint}/api/{source.repo_type}s/{source.repo_id}/tree/{quote(source.revision, safe='')}"
    )
    params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
    out: dict[str, RemoteFile] = {}
    while url is not None:
        page = functools.partial(_tree_page, source, url, params)  # called with the attempt number
        entries, url = with_retries(page, source, what=what, policy=policy)[0]
        params = None  # the next link carries the query
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("type") != "file":  # a folder
                continue
            path = str(entry["path"])
            lfs = entry.get("lfs")
            size = int(entry.get("size") or 0)
            if isinstance(lfs, dict):
                out[path] = RemoteFile(path, int(lfs.get("size") or size), str(lfs["oid"]))
            else:
                out[path] = RemoteFile(path, size, None)
    return dict(sorted(out.items()))


def closest_files(name: str, remote: dict[str, RemoteFile], *, exclude: set[str], n: int = 3) -> list[str]:
    """The ``n`` upstream archives whose names are closest to ``name`` (difflib), for a message: a
    split archive is named once, as ``<base>.part-aa..-af (6 parts)``; files in ``exclude`` (already
    in the profile) are left out. Only ``.tar`` archives and their parts are considered."""
    groups: dict[str, list[str]] = {}
    for path in remote:
        if path in exclude:
            continue
        base = layout.split_base(path)
        if base.endswith(".tar"):
            groups.setdefault(base, []).append(path)
    want = layout.split_base(name)
    best = difflib.get_close_matches(want, list(groups), n=n, cutoff=0.0)
    out = []
    for base in best:
        parts = sorted(groups[base])
        if parts == [base]:
            out.append(base)
        else:
            out.append(f"{parts[0]} .. {parts[-1]} ({len(parts)} parts)")
    return out
