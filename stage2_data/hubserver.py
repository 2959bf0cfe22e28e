"""A loopback server that speaks the Hugging Face Hub HTTP protocol, with fault injection.

It serves one folder as one repository at exactly one revision (a 40-hex commit; the branch name
``main`` is accepted as an alias of it, as on the real hub). Every file is presented as an LFS file:
the tree listing carries its size and sha256 (``lfs.oid``), a ``HEAD`` on ``resolve`` carries
``X-Repo-Commit``, ``ETag``/``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, a ``GET`` supports
``Range``. Errors carry the hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) so that ``huggingface_hub`` maps them to its own exception classes.

Endpoints (``{t}`` is ``models``, ``datasets`` or ``spaces``; resolve URLs of datasets and spaces
are prefixed by ``datasets/`` and ``spaces/``, models have no prefix)::

    GET  /api/{t}/{repo_id}[/revision/{rev}]           repo info (HfApi.repo_info / dataset_info)
    GET  /api/{t}/{repo_id}/tree/{rev}[/{path}]         tree listing (HfApi.list_repo_tree), paginated
    POST /api/{t}/{repo_id}/paths-info/{rev}            paths info (HfApi.get_paths_info)
    HEAD /[{t}/]{repo_id}/resolve/{rev}/{path}          file metadata (get_hf_file_metadata)
    GET  /[{t}/]{repo_id}/resolve/{rev}/{path}          file bytes (http_get), Range supported

Command line: ``python -m stage2_data.hubserver FOLDER --repo-id R --revision REV [--port P]``
prints the URL on one line and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .hashing import BUF_SIZE

HEX40_RE = re.compile(r"^[0-9a-f]{40}$")
REPO_TYPES = ("model", "dataset", "space")
RESOLVE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
SKIP_DIRS = {".git"}
TREE_PAGE_SIZE = 1000  # the real hub's page size (50 with expand=True)
TREE_PAGE_SIZE_EXPAND = 50
RATE_STEP = 256 * 1024  # bytes sent between two pauses of a paced download (``HubFaults.rate``)


@dataclass
class HubFaults:
    """Faults to inject; all optional, and all may be changed while the server runs.

    ``drop_after`` and ``fail_first`` entries are consumed as they fire (an entry of ``drop_after``
    fires once; a ``fail_first`` count is decremented and removed at zero), so a test can look at
    them to see what happened and add them again to repeat a fault.
    """

    drop_after: dict[str, int] = field(default_factory=dict)
    """path -> close the connection after N body bytes (first GET only, then serve normally)."""
    corrupt: set[str] = field(default_factory=set)
    """paths served with right-length wrong bytes on GET (HEAD and listings keep the true sha256)."""
    missing: set[str] = field(default_factory=set)
    """paths answered 404 EntryNotFound on HEAD/GET (listings still list them)."""
    ignore_range: bool = False
    """answer 200 with the full body even when a Range is asked."""
    fail_first: dict[str, int] = field(default_factory=dict)
    """path -> answer 503 to the next N GETs (a transient error)."""
    rate: float | None = None
    """bytes per second per file download (paced as a CDN paces one connection); None: as fast as
    the loopback goes."""


@dataclass(frozen=True)
class _FileEntry:
    path: str  # repo path, posix
    abspath: Path
    size: int
    mtime_ns: int
    sha256: str

    @property
    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
        ).encode("ascii")

    @property
    def git_oid(self) -> str:
        """The git blob id of the LFS pointer file (what the real hub reports as ``oid``)."""
        p = self.pointer
        return hashlib.sha1(b"blob %d\0" % len(p) + p).hexdigest()

    def tree_entry(self, *, expand: bool, commit: str, date: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": "file",
            "oid": self.git_oid,
            "size": self.size,
            "path": self.path,
            "lfs": {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer)},
        }
        if expand:
            entry["lastCommit"] = {"id": commit, "title": "upload", "date": date}
            entry["securityFileStatus"] = {
                "status": "safe",
                "avScan": {"virusFound": False, "virusNames": None},
                "pickleImportScan": None,
            }
        return entry


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    hub: HubServer

    def __init__(self, addr: tuple[str, int], hub: HubServer) -> None:
        self.hub = hub
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (a cancelled or resumed download) is normal, not a server error.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def close_open_connections(self) -> None:
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stage2-hubserver"
    timeout = 120
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        return None

    def do_GET(self) -> None:
        self.server.hub._handle(self, "GET")

    def do_HEAD(self) -> None:
        self.server.hub._handle(self, "HEAD")

    def do_POST(self) -> None:
        self.server.hub._handle(self, "POST")


class _Reply(Exception):
    """An error answer (raised inside the handlers, written by ``_handle``)."""

    def __init__(
        self, status: int, message: str, code: str | None = None, *, size: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.size = size


class _Dropped(Exception):
    """The connection was closed on purpose (fault injection)."""


class HubServer:
    """One repository at one revision, served over HTTP on the loopback interface."""

    def __init__(
        self,
        folder: Path,
        *,
        repo_id: str,
        revision: str,
        repo_type: str = "dataset",
        host: str = "127.0.0.1",
        port: int = 0,
        faults: HubFaults | None = None,
        token: str | None = None,
    ) -> None:
        if not HEX40_RE.match(revision):
            raise ValueError(f"revision {revision!r} is not a full 40-hex commit")
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type {repo_type!r} is not one of {REPO_TYPES}")
        if "/" not in repo_id:
            raise ValueError(f"repo_id {repo_id!r} is not 'namespace/name'")
        self.folder = Path(folder).resolve()
        if not self.folder.is_dir():
            raise ValueError(f"{self.folder} is not a folder")
        self.repo_id = repo_id
        self.revision = revision
        self.repo_type = repo_type
        self.host = host
        self.port = port
        self.faults = faults if faults is not None else HubFaults()
        self._token = token
        self.tree_page_size = TREE_PAGE_SIZE
        self.request_log: list[tuple[str, str, str | None]] = []
        self._log_lock = threading.Lock()
        self._fault_lock = threading.Lock()
        self._cache: dict[str, _FileEntry] = {}
        self._cache_lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._date = datetime.fromtimestamp(0, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def __repr__(self) -> str:  # never shows the token
        return f"HubServer({self.repo_type}:{self.repo_id}@{self.revision}, url={self.url if self._server else None})"

    # ----- life cycle ------------------------------------------------------------------------
    def start(self) -> HubServer:
        if self._server is not None:
            return self
        self.files()  # hash every file once, before the first request
        mtimes = [e.mtime_ns for e in self._cache.values()]
        if mtimes:
            self._date = datetime.fromtimestamp(max(mtimes) / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        self._server = _Server((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="hubserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ----- request log -----------------------------------------------------------------------
    def _log(self, method: str, path: str, rng: str | None) -> None:
        with self._log_lock:
            self.request_log.append((method, path, rng))

    def log_snapshot(self) -> list[tuple[str, str, str | None]]:
        with self._log_lock:
            return list(self.request_log)

    def clear_log(self) -> None:
        with self._log_lock:
            self.request_log.clear()

    def file_requests(self, path: str) -> list[tuple[str, str | None]]:
        """(method, range) of every ``resolve`` request made for the repo file ``path``."""
        prefix = f"/{RESOLVE_PREFIX[self.repo_type]}{self.repo_id}/resolve/"
        out = []
        for method, p, rng in self.log_snapshot():
            if p.startswith(prefix):
                rest = p[len(prefix) :]
                _, _, fpath = rest.partition("/")
                if fpath == path:
                    out.append((method, rng))
        return out

    # ----- files -----------------------------------------------------------------------------
    def _entry(self, rel: str, abspath: Path, st: os.stat_result) -> _FileEntry:
        with self._cache_lock:
            cached = self._cache.get(rel)
            if cached is not None and (cached.size, cached.mtime_ns) == (st.st_size, st.st_mtime_ns):
                return cached
        h = hashlib.sha256()
        with open(abspath, "rb", buffering=0) as f:
            buf = bytearray(BUF_SIZE)
            view = memoryview(buf)
            while n := f.readinto(buf):
                h.update(view[:n])
        entry = _FileEntry(rel, abspath, st.st_size, st.st_mtime_ns, h.hexdigest())
        with self._cache_lock:
            self._cache[rel] = entry
        return entry

    def files(self) -> dict[str, _FileEntry]:
        """Every file of the repository (sha256 computed once, again only if size/mtime changed)."""
        out: dict[str, _FileEntry] = {}
        for dirpath, dirnames, filenames in os.walk(self.folder):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                ap = Path(dirpath) / name
                try:
                    st = ap.stat()
                except OSError:
                    continue
                if not ap.is_file():
                    continue
                rel = ap.relative_to(self.folder).as_posix()
                out[rel] = self._entry(rel, ap, st)
        with self._cache_lock:
            for gone in set(self._cache) - set(out):
                del self._cache[gone]
        return dict(sorted(out.items()))

    def file(self, rel: str) -> _FileEntry | None:
        p = PurePosixPath(rel)
        if not rel or rel.startswith("/") or any(part in ("..", ".", "") for part in rel.split("/")):
            return None
        if p.parts and p.parts[0] in SKIP_DIRS:
            return None
        ap = self.folder / rel
        try:
            st = ap.stat()
        except OSError:
            return None
        if not ap.is_file() or not ap.resolve().is_relative_to(self.folder):
            return None
        return self._entry(rel, ap, st)

    def _dirs(self, files: dict[str, _FileEntry]) -> list[str]:
        dirs: set[str] = set()
        for rel in files:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return sorted(dirs)

    def _dir_entry(self, path: str, files: dict[str, _FileEntry], *, expand: bool) -> dict[str, Any]:
        inside = sorted(f"{e.git_oid} {r}" for r, e in files.items() if r.startswith(path + "/"))
        entry: dict[str, Any] = {
            "type": "directory",
            "oid": hashlib.sha1("\n".join(inside).encode()).hexdigest(),
            "size": 0,
            "path": path,
        }
        if expand:
            entry["lastCommit"] = {"id": self.revision, "title": "upload", "date": self._date}
        return entry

    # ----- HTTP ------------------------------------------------------------------------------
    def _resolve_rev(self, rev: str) -> str:
        if rev in (self.revision, "main"):
            return self.revision
        raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _handle(self, h: _Handler, method: str) -> None:
        split = urlsplit(h.path)
        raw_path = split.path
        query = parse_qs(split.query)
        rng = h.headers.get("Range")
        self._log(method, unquote(raw_path), rng)
        body = b""
        if method == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            body = h.rfile.read(length) if length else b""
        try:
            self._check_auth(h)
            api_prefix = f"/api/{self.repo_type}s/{self.repo_id}"
            resolve_prefix = f"/{RESOLVE_PREFIX[self.repo_type]}{self.repo_id}/resolve/"
            if raw_path == api_prefix or raw_path.startswith(api_prefix + "/"):
                self._api(h, method, raw_path[len(api_prefix) :], query, body)
            elif raw_path.startswith(resolve_prefix):
                if method not in ("GET", "HEAD"):
                    raise _Reply(405, f"method {method} not allowed")
                self._resolve(h, method, raw_path[len(resolve_prefix) :])
            elif raw_path.startswith("/api/") or "/resolve/" in raw_path:
                raise _Reply(404, "Repository not found", "RepoNotFound")
            else:
                raise _Reply(404, "Not found")
        except _Reply as r:
            self._send_error(h, method, r)
        except _Dropped:
            h.close_connection = True
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            h.close_connection = True

    def _check_auth(self, h: _Handler) -> None:
        if self._token is None:
            return
        auth = h.headers.get("Authorization")
        if auth is None:
            # The real hub answers an anonymous request to a private repo as if it did not exist.
            raise _Reply(401, "Repository not found", "RepoNotFound")
        if auth != f"Bearer {self._token}":
            raise _Reply(401, "Invalid credentials in Authorization header")

    def _send_error(self, h: _Handler, method: str, r: _Reply) -> None:
        payload = json.dumps({"error": r.message}).encode()
        h.send_response(r.status)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(payload)))
        if r.code:
            h.send_header("X-Error-Code", r.code)
        h.send_header("X-Error-Message", r.message)
        if r.status == 416:
            h.send_header("Content-Range", f"bytes */{r.size or 0}")
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(payload)

    def _send_json(self, h: _Handler, method: str, obj: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(payload)

    # ----- /api ------------------------------------------------------------------------------
    def _api(self, h: _Handler, method: str, rest: str, query: dict[str, list[str]], body: bytes) -> None:
        segs = rest.split("/")[1:] if rest else []
        if not segs or (segs[0] == "revision" and len(segs) == 2):
            if method not in ("GET", "HEAD"):
                raise _Reply(405, f"method {method} not allowed")
            rev = self._resolve_rev(unquote(segs[1]) if segs else "main")
            blobs = _flag(query, "blobs")
            self._send_json(h, method, self._repo_info(rev, blobs=blobs))
        elif segs[0] == "tree" and len(segs) >= 2:
            if method not in ("GET", "HEAD"):
                raise _Reply(405, f"method {method} not allowed")
            rev = self._resolve_rev(unquote(segs[1]))
            sub = unquote("/".join(segs[2:])).strip("/")
            self._tree(h, method, rev, sub, query)
        elif segs[0] == "paths-info" and len(segs) == 2:
            if method != "POST":
                raise _Reply(405, f"method {method} not allowed")
            rev = self._resolve_rev(unquote(segs[1]))
            self._paths_info(h, rev, h.headers.get("Content-Type", ""), body)
        else:
            raise _Reply(404, "Not found")

    def _repo_info(self, commit: str, *, blobs: bool) -> dict[str, Any]:
        files = self.files()
        siblings = []
        for e in files.values():
            s: dict[str, Any] = {"rfilename": e.path}
            if blobs:
                s.update(
                    size=e.size,
                    blobId=e.git_oid,
                    lfs={"sha256": e.sha256, "size": e.size, "pointerSize": len(e.pointer)},
                )
            siblings.append(s)
        author = self.repo_id.split("/", 1)[0]
        return {
            "_id": hashlib.sha1(self.repo_id.encode()).hexdigest()[:24],
            "id": self.repo_id,
            "author": author,
            "sha": commit,
            "createdAt": self._date,
            "lastModified": self._date,
            "private": self._token is not None,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(e.size for e in files.values()),
        }

    def _tree(self, h: _Handler, method: str, commit: str, sub: str, query: dict[str, list[str]]) -> None:
        recursive = _flag(query, "recursive")
        expand = _flag(query, "expand")
        files = self.files()
        dirs = self._dirs(files)
        if sub and sub not in dirs:
            if sub in files:  # the hub lists a file path as that one file
                entries = [files[sub].tree_entry(expand=expand, commit=commit, date=self._date)]
                self._send_json(h, method, entries)
                return
            raise _Reply(404, f"{sub} does not exist on {commit}", "EntryNotFound")
        prefix = sub + "/" if sub else ""

        def wanted(p: str) -> bool:
            if not p.startswith(prefix):
                return False
            return recursive or "/" not in p[len(prefix) :]

        items: list[dict[str, Any]] = [self._dir_entry(d, files, expand=expand) for d in dirs if wanted(d)]
        items += [
            e.tree_entry(expand=expand, commit=commit, date=self._date) for p, e in files.items() if wanted(p)
        ]
        items.sort(key=lambda it: (it["type"] != "directory", it["path"]))
        page_size = TREE_PAGE_SIZE_EXPAND if expand else self.tree_page_size
        page_size = min(page_size, self.tree_page_size)
        start = int((query.get("cursor") or ["0"])[0] or 0)
        page = items[start : start + page_size]
        headers = {}
        if start + page_size < len(items):
            sub_part = "/" + quote(sub, safe="") if sub else ""
            base = f"{self.url}/api/{self.repo_type}s/{self.repo_id}/tree/{quote(commit, safe='')}{sub_part}"
            nxt = f"{base}?recursive={str(recursive).lower()}&expand={str(expand).lower()}&cursor={start + page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send_json(h, method, page, headers)

    def _paths_info(self, h: _Handler, commit: str, ctype: str, body: bytes) -> None:
        if "json" in ctype:
            data = json.loads(body or b"{}")
            paths = data.get("paths", [])
            expand = bool(data.get("expand", False))
        else:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
            paths = form.get("paths", [])
            expand = _flag(form, "expand")
        files = self.files()
        dirs = set(self._dirs(files))
        out = []
        for p in paths:
            p = str(p).strip("/")
            if p in files:
                out.append(files[p].tree_entry(expand=expand, commit=commit, date=self._date))
            elif p in dirs:
                out.append(self._dir_entry(p, files, expand=expand))
        self._send_json(h, "POST", out)

    # ----- /resolve --------------------------------------------------------------------------
    def _resolve(self, h: _Handler, method: str, rest: str) -> None:
        rev_raw, _, fpath_raw = rest.partition("/")
        commit = self._resolve_rev(unquote(rev_raw))
        rel = unquote(fpath_raw)
        with self._fault_lock:
            missing = rel in self.faults.missing
        entry = None if missing else self.file(rel)
        if entry is None:
            raise _Reply(404, "Entry not found", "EntryNotFound")

        drop_at: int | None = None
        corrupt = False
        if method == "GET":
            with self._fault_lock:
                n_fail = self.faults.fail_first.get(rel, 0)
                if n_fail > 0:
                    if n_fail == 1:
                        del self.faults.fail_first[rel]
                    else:
                        self.faults.fail_first[rel] = n_fail - 1
                    raise _Reply(503, "Service temporarily unavailable")
                if rel in self.faults.drop_after:
                    drop_at = self.faults.drop_after.pop(rel)
                corrupt = rel in self.faults.corrupt
                ignore_range = self.faults.ignore_range
        else:
            ignore_range = self.faults.ignore_range

        size = entry.size
        start, end = 0, size - 1
        status = 200
        rng = h.headers.get("Range")
        if rng and not ignore_range:
            parsed = _parse_range(rng, size)
            if parsed == "unsatisfiable":
                raise _Reply(416, f"Range {rng} not satisfiable for a file of {size} bytes", size=size)
            if isinstance(parsed, tuple):
                start, end = parsed
                status = 206
        length = max(0, end - start + 1)

        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(length))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{entry.sha256}"')
        h.send_header("X-Linked-Etag", f'"{entry.sha256}"')
        h.send_header("X-Linked-Size", str(size))
        h.send_header("X-Repo-Commit", commit)
        name = PurePosixPath(rel).name
        h.send_header("Content-Disposition", f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if method == "HEAD" or length == 0:
            return
        send = length if drop_at is None else min(length, drop_at)
        flip_at = size // 2 if corrupt else None
        rate = self.faults.rate
        with open(entry.abspath, "rb") as f:
            if flip_at is None:
                sent = 0
                t0 = time.monotonic()
                while sent < send:
                    step = send - sent if rate is None else min(send - sent, RATE_STEP)
                    n = h.connection.sendfile(f, start + sent, step)
                    if n == 0:
                        break
                    sent += n
                    if rate is not None and (ahead := t0 + sent / rate - time.monotonic()) > 0:
                        time.sleep(ahead)
            else:
                _send_flipped(h, f, start, send, flip_at)
        if drop_at is not None and send < length:
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            raise _Dropped()


def _send_flipped(h: _Handler, f: Any, start: int, count: int, flip_at: int) -> None:
    f.seek(start)
    pos = start
    remaining = count
    while remaining > 0:
        chunk = bytearray(f.read(min(BUF_SIZE, remaining)))
        if not chunk:
            break
        if pos <= flip_at < pos + len(chunk):
            chunk[flip_at - pos] ^= 0xFF
        h.wfile.write(chunk)
        pos += len(chunk)
        remaining -= len(chunk)


def _flag(query: dict[str, list[str]], key: str) -> bool:
    vals = query.get(key) or []
    return bool(vals) and vals[-1].strip().lower() in ("1", "true", "yes")


_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def _parse_range(value: str, size: int) -> tuple[int, int] | str | None:
    """``(start, end)`` inclusive; ``"unsatisfiable"``; or None to ignore (malformed, multi-range)."""
    m = _RANGE_RE.match(value)
    if not m:
        return None
    a, b = m.group(1), m.group(2)
    if not a and not b:
        return None
    if not a:  # suffix range: the last N bytes
        n = int(b)
        if n == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(a)
    end = int(b) if b else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)


def _rate(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive rate in MB/s")
    return value * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m stage2_data.hubserver",
        description="Serve FOLDER as one Hugging Face Hub repository at one revision, on the loopback interface.",
    )
    ap.add_argument("folder", type=Path)
    ap.add_argument("--repo-id", required=True)
    ap.add_argument("--revision", required=True, help="the full 40-hex commit the repo is served at")
    ap.add_argument("--repo-type", default="dataset", choices=REPO_TYPES)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--token-env",
        default=None,
        help="name of an environment variable holding a token every request must carry (never on the command line)",
    )
    ap.add_argument(
        "--rate-mb-s",
        type=_rate,
        default=None,
        metavar="MB_S",
        help="pace each file download to this many MB/s (as one connection to a CDN); default: unpaced",
    )
    args = ap.parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"error: environment variable {args.token_env} is empty or unset", file=sys.stderr)
            return 2
    try:
        server = HubServer(
            args.folder,
            repo_id=args.repo_id,
            revision=args.revision,
            repo_type=args.repo_type,
            host=args.host,
            port=args.port,
            token=token,
            faults=HubFaults(rate=args.rate_mb_s),
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server.start()
    print(server.url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
