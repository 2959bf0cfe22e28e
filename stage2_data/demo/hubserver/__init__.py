"""A loopback server that speaks the Hugging Face Hub HTTP protocol, with fault injection (a test double).

It serves one folder as one repository at exactly one revision (a 40-hex commit, or with
``revision=None`` the folder's own: a sha1 over its files' paths and sha256, ``folder_commit``); the
branch name ``main`` and a short hash of the commit (7 or more hex digits) name it too, as on the
real hub (``HfApi.repo_info(revision="main").sha`` is the commit). Every file is presented as an LFS file:
the tree listing carries its size and sha256 (``lfs.oid``), a ``HEAD`` on ``resolve`` carries
``X-Repo-Commit``, ``ETag``/``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, a ``GET`` supports
``Range``. Errors carry the hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) so that ``huggingface_hub`` maps them to its own exception classes.

Faults (``HubFaults``, changeable while it runs): dropped connections, corrupt bytes, missing files,
ignored ``Range``, transient 503s, pacing (per download, or of all downloads together), and ``reject``: any status (429, 500, 503) on a file's GET,
the repo info or the listing, with ``Retry-After`` in delta-seconds or HTTP-date form.

Endpoints (``{t}`` is ``models``, ``datasets`` or ``spaces``; resolve URLs of datasets and spaces
are prefixed by ``datasets/`` and ``spaces/``, models have no prefix)::

    GET  /api/{t}/{repo_id}[/revision/{rev}]           repo info (HfApi.repo_info / dataset_info)
    GET  /api/{t}/{repo_id}/tree/{rev}[/{path}]         tree listing (HfApi.list_repo_tree), paginated
    POST /api/{t}/{repo_id}/paths-info/{rev}            paths info (HfApi.get_paths_info)
    HEAD /[{t}/]{repo_id}/resolve/{rev}/{path}          file metadata (get_hf_file_metadata)
    GET  /[{t}/]{repo_id}/resolve/{rev}/{path}          file bytes (http_get), Range supported

Modules: ``repository`` (the folder as a repository: files, faults, request log), ``handler`` (HTTP),
``server`` (``HubServer``: start/stop, and the command line).

Command line: ``python -m stage2_data.demo.hubserver FOLDER [--repo-id R] [--revision REV] [--port P]``
prints the URL on one line and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

from .repository import INFO, TREE, HubFaults, Reject, folder_commit
from .server import HubServer, check_declared_source, main, serve_pinned, served_as

__all__ = [
    "INFO",
    "TREE",
    "HubFaults",
    "HubServer",
    "Reject",
    "check_declared_source",
    "folder_commit",
    "main",
    "serve_pinned",
    "served_as",
]
