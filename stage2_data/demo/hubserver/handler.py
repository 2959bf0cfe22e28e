"""The HTTP side of the loopback hub: routing, the hub's endpoints, ``Range``, errors, fault injection.

Every request is answered from a ``HubRepository`` (``repository.py``); the handler keeps no state
of its own between requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ...hashing import BUF_SIZE
from .repository import INFO, RESOLVE_PREFIX, TREE, TREE_PAGE_SIZE_EXPAND, HubRepository

SHORT_HASH_RE = re.compile(r"\A[0-9a-f]{7,39}\Z")  # an abbreviated commit, as git shows one
RATE_STEP = 256 * 1024  # bytes sent between two pauses of a paced download (``rate``, ``link_rate``)


class HubHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server for one repository that can cut its open connections on shutdown."""

    daemon_threads = True
    allow_reuse_address = True
    hub: HubRepository

    def __init__(self, addr: tuple[str, int], hub: HubRepository) -> None:
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


class _Reply(Exception):
    """An error answer (raised inside the endpoints, written by ``_Handler._dispatch``)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        *,
        size: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.size = size
        self.headers = headers or {}


class _Dropped(Exception):
    """The connection was closed on purpose (fault injection)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stage2-hubserver"
    timeout = 120
    server: HubHTTPServer

    @property
    def hub(self) -> HubRepository:
        return self.server.hub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        return None

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # ----- routing and answers ---------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        raw_path = split.path
        query = parse_qs(split.query)
        rng = self.headers.get("Range")
        hub.log_request(method, unquote(raw_path), rng)
        body = b""
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        try:
            self._check_auth()
            api_prefix = f"/api/{hub.repo_type}s/{hub.repo_id}"
            resolve_prefix = f"/{RESOLVE_PREFIX[hub.repo_type]}{hub.repo_id}/resolve/"
            if raw_path == api_prefix or raw_path.startswith(api_prefix + "/"):
                self._api(method, raw_path[len(api_prefix) :], query, body)
            elif raw_path.startswith(resolve_prefix):
                if method not in ("GET", "HEAD"):
                    raise _Reply(405, f"method {method} not allowed")
                self._resolve(method, raw_path[len(resolve_prefix) :])
            elif raw_path.startswith("/api/") or "/resolve/" in raw_path:
                raise _Reply(404, "Repository not found", "RepoNotFound")
            else:
                raise _Reply(404, "Not found")
        except _Reply as r:
            self._send_reply(method, r)
        except _Dropped:
            self.close_connection = True
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _check_auth(self) -> None:
        auth = self.headers.get("Authorization")
        if self.hub.authorized(auth):
            return
        if auth is None:
            # The real hub answers an anonymous request to a private repo as if it did not exist.
            raise _Reply(401, "Repository not found", "RepoNotFound")
        raise _Reply(401, "Invalid credentials in Authorization header")

    def _resolve_rev(self, rev: str) -> str:
        """The commit ``rev`` names: the served commit, the branch ``main``, or a short hash of the
        commit (as git abbreviates it: 7 or more hex digits); else 404 RevisionNotFound."""
        commit = self.hub.revision
        if rev in (commit, "main") or (SHORT_HASH_RE.match(rev) and commit.startswith(rev)):
            return commit
        raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _send_reply(self, method: str, r: _Reply) -> None:
        payload = json.dumps({"error": r.message}).encode()
        self.send_response(r.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        if r.code:
            self.send_header("X-Error-Code", r.code)
        self.send_header("X-Error-Message", r.message)
        if r.status == 416:
            self.send_header("Content-Range", f"bytes */{r.size or 0}")
        for k, v in r.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(payload)

    def _send_json(self, method: str, obj: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(payload)

    # ----- /api ------------------------------------------------------------------------------
    def _api(self, method: str, rest: str, query: dict[str, list[str]], body: bytes) -> None:
        segs = rest.split("/")[1:] if rest else []
        if not segs or (segs[0] == "revision" and len(segs) == 2):
            if method not in ("GET", "HEAD"):
                raise _Reply(405, f"method {method} not allowed")
            self._reject(INFO)
            rev = self._resolve_rev(unquote(segs[1]) if segs else "main")
            blobs = _flag(query, "blobs")
            self._send_json(method, self._repo_info(rev, blobs=blobs))
        elif segs[0] == "tree" and len(segs) >= 2:
            if method not in ("GET", "HEAD"):
                raise _Reply(405, f"method {method} not allowed")
            self._reject(TREE)
            rev = self._resolve_rev(unquote(segs[1]))
            sub = unquote("/".join(segs[2:])).strip("/")
            self._tree(method, rev, sub, query)
        elif segs[0] == "paths-info" and len(segs) == 2:
            if method != "POST":
                raise _Reply(405, f"method {method} not allowed")
            rev = self._resolve_rev(unquote(segs[1]))
            self._paths_info(rev, self.headers.get("Content-Type", ""), body)
        else:
            raise _Reply(404, "Not found")

    def _reject(self, target: str) -> None:
        """Answer with the injected error status of ``target``, if any (``HubFaults.reject``)."""
        r = self.hub.take_reject(target)
        if r is None:
            return
        headers = {}
        if r.retry_after is not None:
            headers["Retry-After"] = (
                formatdate(time.time() + r.retry_after, usegmt=True)
                if r.http_date
                else str(int(r.retry_after))
            )
        text = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
        raise _Reply(r.status, text.get(r.status, f"HTTP {r.status}"), headers=headers)

    def _repo_info(self, commit: str, *, blobs: bool) -> dict[str, Any]:
        hub = self.hub
        files = hub.files()
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
        author = hub.repo_id.split("/", 1)[0]
        return {
            "_id": hashlib.sha1(hub.repo_id.encode()).hexdigest()[:24],
            "id": hub.repo_id,
            "author": author,
            "sha": commit,
            "createdAt": hub.date,
            "lastModified": hub.date,
            "private": hub.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(e.size for e in files.values()),
        }

    def _tree(self, method: str, commit: str, sub: str, query: dict[str, list[str]]) -> None:
        hub = self.hub
        recursive = _flag(query, "recursive")
        expand = _flag(query, "expand")
        files = hub.files()
        dirs = hub.dirs(files)
        if sub and sub not in dirs:
            if sub in files:  # the hub lists a file path as that one file
                entries = [files[sub].tree_entry(expand=expand, commit=commit, date=hub.date)]
                self._send_json(method, entries)
                return
            raise _Reply(404, f"{sub} does not exist on {commit}", "EntryNotFound")
        prefix = sub + "/" if sub else ""

        def wanted(p: str) -> bool:
            if not p.startswith(prefix):
                return False
            return recursive or "/" not in p[len(prefix) :]

        items: list[dict[str, Any]] = [hub.dir_entry(d, files, expand=expand) for d in dirs if wanted(d)]
        items += [
            e.tree_entry(expand=expand, commit=commit, date=hub.date) for p, e in files.items() if wanted(p)
        ]
        items.sort(key=lambda it: (it["type"] != "directory", it["path"]))
        page_size = TREE_PAGE_SIZE_EXPAND if expand else hub.tree_page_size
        page_size = min(page_size, hub.tree_page_size)
        start = int((query.get("cursor") or ["0"])[0] or 0)
        page = items[start : start + page_size]
        headers = {}
        if start + page_size < len(items):
            sub_part = "/" + quote(sub, safe="") if sub else ""
            base = f"{hub.url}/api/{hub.repo_type}s/{hub.repo_id}/tree/{quote(commit, safe='')}{sub_part}"
            nxt = f"{base}?recursive={str(recursive).lower()}&expand={str(expand).lower()}&cursor={start + page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send_json(method, page, headers)

    def _paths_info(self, commit: str, ctype: str, body: bytes) -> None:
        hub = self.hub
        if "json" in ctype:
            data = json.loads(body or b"{}")
            paths = data.get("paths", [])
            expand = bool(data.get("expand", False))
        else:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
            paths = form.get("paths", [])
            expand = _flag(form, "expand")
        files = hub.files()
        dirs = set(hub.dirs(files))
        out = []
        for p in paths:
            p = str(p).strip("/")
            if p in files:
                out.append(files[p].tree_entry(expand=expand, commit=commit, date=hub.date))
            elif p in dirs:
                out.append(hub.dir_entry(p, files, expand=expand))
        self._send_json("POST", out)

    # ----- /resolve --------------------------------------------------------------------------
    def _resolve(self, method: str, rest: str) -> None:
        hub = self.hub
        rev_raw, _, fpath_raw = rest.partition("/")
        commit = self._resolve_rev(unquote(rev_raw))
        rel = unquote(fpath_raw)
        entry = None if hub.is_missing(rel) else hub.file(rel)
        if entry is None:
            raise _Reply(404, "Entry not found", "EntryNotFound")

        drop_at: int | None = None
        corrupt = False
        if method == "GET":
            self._reject(rel)
            faults = hub.take_get_faults(rel)
            if faults.fail:
                raise _Reply(503, "Service temporarily unavailable")
            drop_at, corrupt, ignore_range = faults.drop_at, faults.corrupt, faults.ignore_range
            if rel in hub.faults.redirect:
                self._send_page(302, b"", "text/plain", {"Location": hub.faults.redirect[rel] + self.path})
                return
            if rel in hub.faults.html:
                page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Log in</body></html>"
                self._send_page(200, page, "text/html; charset=utf-8", {})
                return
        else:
            ignore_range = hub.faults.ignore_range

        size = entry.size
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and not ignore_range:
            parsed = parse_range(rng, size)
            if parsed == "unsatisfiable":
                raise _Reply(416, f"Range {rng} not satisfiable for a file of {size} bytes", size=size)
            if isinstance(parsed, tuple):
                start, end = parsed
                status = 206
        length = max(0, end - start + 1)
        lie = hub.faults.content_length.get(rel) if method == "GET" else None
        if lie is not None:  # a lying Content-Length: send at most that many bytes, then hang up
            length = min(length, lie)

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length if lie is None else lie))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{entry.sha256}"')
        self.send_header("X-Linked-Etag", f'"{entry.sha256}"')
        self.send_header("X-Linked-Size", str(size))
        self.send_header("X-Repo-Commit", commit)
        name = PurePosixPath(rel).name
        self.send_header(
            "Content-Disposition", f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        )
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if method == "HEAD" or length == 0:
            return
        send = length if drop_at is None else min(length, drop_at)
        flip_at = size // 2 if corrupt else None
        rate = hub.faults.rate
        with open(entry.abspath, "rb") as f:
            if flip_at is None:
                sent = 0
                t0 = time.monotonic()
                while sent < send:
                    paced = rate is not None or hub.faults.link_rate is not None
                    step = min(send - sent, RATE_STEP) if paced else send - sent
                    due = hub.reserve_link(step)  # the shared link's turn for these bytes
                    if due is not None and (wait := due - time.monotonic()) > 0:
                        time.sleep(wait)
                    n = self.connection.sendfile(f, start + sent, step)
                    if n == 0:
                        break
                    sent += n
                    if rate is not None and (ahead := t0 + sent / rate - time.monotonic()) > 0:
                        time.sleep(ahead)
            else:
                self._send_flipped(f, start, send, flip_at)
        if (drop_at is not None and send < length) or lie is not None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            raise _Dropped()

    def _send_page(self, status: int, body: bytes, ctype: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _send_flipped(self, f: Any, start: int, count: int, flip_at: int) -> None:
        f.seek(start)
        pos = start
        remaining = count
        while remaining > 0:
            chunk = bytearray(f.read(min(BUF_SIZE, remaining)))
            if not chunk:
                break
            if pos <= flip_at < pos + len(chunk):
                chunk[flip_at - pos] ^= 0xFF
            self.wfile.write(chunk)
            pos += len(chunk)
            remaining -= len(chunk)


def _flag(query: dict[str, list[str]], key: str) -> bool:
    vals = query.get(key) or []
    return bool(vals) and vals[-1].strip().lower() in ("1", "true", "yes")


_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def parse_range(value: str, size: int) -> tuple[int, int] | str | None:
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
