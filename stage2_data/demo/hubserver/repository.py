"""The served repository, without sockets: its files (sha256 cached), faults, request log and listings.

``HubServer`` (``server.py``) is this plus a running HTTP server; the request handler
(``handler.py``) reads the repository through this class only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from ...errors import HubSetupError, Stage2Error
from ...formats.sha256sums import read_regular_bytes
from ...hashing import sha256_file
from ...layout import HEX40_RE

REPO_TYPES = ("model", "dataset", "space")
RESOLVE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
SKIP_DIRS = {".git"}
#: at a hub folder's top: the repo and commit it mirrors, declared by whoever filled it (``stage2
#: demo`` writes one): ``{"repo_id": ..., "revision": <40 hex>}``; not a file of the repository
HUB_MARKER = ".stage2-hub.json"
MAX_MARKER_BYTES = 65536  # a declaration is a line; anything larger is refused unread
TREE_PAGE_SIZE = 1000  # the real hub's page size (50 with expand=True)
TREE_PAGE_SIZE_EXPAND = 50


INFO = "@info"
"""``HubFaults.reject`` key of the repo info endpoint (``HfApi.repo_info``: the revision check)."""
TREE = "@tree"
"""``HubFaults.reject`` key of the tree listing endpoint (each page)."""


@dataclass
class Reject:
    """Answer ``status`` to the next ``count`` requests of one target, optionally with ``Retry-After``."""

    count: int = 1
    status: int = 503
    retry_after: float | None = None
    """seconds the answer asks the client to wait (None: no ``Retry-After`` header)."""
    http_date: bool = False
    """``Retry-After`` as an HTTP-date (now + ``retry_after``) instead of delta-seconds."""


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
    link_rate: float | None = None
    """bytes per second for all file downloads together (one shared link, a token bucket without
    burst: concurrent downloads split it); None: unshared. Applies on top of ``rate``."""
    reject: dict[str, Reject] = field(default_factory=dict)
    """target -> answer its next requests with an error status (429, 500, 503, ...), optionally with
    ``Retry-After``; a target is a repo file path (its GETs), ``INFO`` (repo info) or ``TREE`` (the
    listing). Consumed like ``fail_first``."""
    content_length: dict[str, int] = field(default_factory=dict)
    """path -> its GETs carry this ``Content-Length`` (a lying one; at most that many bytes are sent,
    then the connection is closed); HEAD keeps the true size."""
    html: set[str] = field(default_factory=set)
    """paths whose GETs are answered 200 with an HTML login page (``text/html``) instead of the bytes."""
    redirect: dict[str, str] = field(default_factory=dict)
    """path -> its GETs are redirected (302) to this base URL + the request's path (e.g. a dead host)."""


@dataclass(frozen=True)
class FileEntry:
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


class GetFaults(NamedTuple):
    """What the faults make of one GET."""

    fail: bool  # answer 503
    drop_at: int | None  # close the connection after this many body bytes
    corrupt: bool  # flip one byte in the middle of the file
    ignore_range: bool  # answer 200 with the full body


def folder_commit(files: dict[str, FileEntry]) -> str:
    """The commit a folder is served at when it is given none (``HubRepository(revision=None)``): a
    sha1 over one ``<path>\\0<sha256>\\n`` line per file, in path order. It changes when a file
    does; the demo's revision is this of its upstream folder."""
    lines = "".join(f"{rel}\0{e.sha256}\n" for rel, e in sorted(files.items()))
    return hashlib.sha1(lines.encode("utf-8", "surrogateescape")).hexdigest()  # any file name


def declared_source(folder: Path) -> dict[str, str] | None:
    """What a hub folder's :data:`HUB_MARKER` declares it mirrors (``repo_id`` and ``revision``, a
    40-hex commit); None when it has none. HubSetupError naming the file when it is not such a
    declaration."""
    path = Path(folder) / HUB_MARKER
    doc: Any
    try:  # a regular file only, opened without blocking: a FIFO there is named, never waited on
        if os.stat(path).st_size > MAX_MARKER_BYTES:
            raise ValueError(f"larger than {MAX_MARKER_BYTES} bytes")
        doc = json.loads(read_regular_bytes(path).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, Stage2Error) as e:
        doc = e
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("revision"), str)
        or not HEX40_RE.match(doc["revision"])
        or not isinstance(doc.get("repo_id", "x/y"), str)
        or "/" not in doc.get("repo_id", "x/y")
    ):
        why = (
            (getattr(doc, "message", None) or str(doc))
            if isinstance(doc, Exception)
            else "not an object with a 40-hex revision"
        )
        raise HubSetupError(
            f"{path} does not declare the commit the folder mirrors ({why.rstrip('.')}).",
            fix='write it as {"repo_id": "namespace/name", "revision": "<the 40-hex commit>"}, or remove '
            "it (the folder is then at its own commit, a digest of its files)",
        )
    return {k: str(doc[k]) for k in ("repo_id", "revision") if k in doc}


def hub_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` resolved, or HubSetupError when it is not a folder (what is there, if anything)."""
    path = Path(folder).resolve()
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise HubSetupError(
            f"the hub folder {path} {what}.",
            fix="pass the folder to serve as the hub's repository (the demo's: .demo/demo/upstream)",
        )
    return path


def check_repo_names(repo_id: str | None, revision: str | None) -> None:
    """HubSetupError for a ``repo_id`` that is not ``namespace/name`` or a ``revision`` that is not
    a full 40-hex commit (None: not given, nothing to say)."""
    if revision is not None and not HEX40_RE.match(revision):
        raise HubSetupError(
            f"revision {revision!r} is not a full 40-hex commit.",
            fix="pass the whole commit id (40 hex digits), as the profile's [source] revision holds it",
        )
    if repo_id is not None and "/" not in repo_id:
        raise HubSetupError(
            f"repo_id {repo_id!r} is not 'namespace/name'.",
            fix="pass it as the profile's [source] repo_id holds it, e.g. robometer/processed_datasets",
        )


class HubRepository:
    """One folder as one repository at one revision: what every request is answered from.

    ``revision``: the full 40-hex commit it is served at; None: the folder's own commit
    (:func:`folder_commit`). The branch ``main`` and a short hash of that commit (7 or more hex
    digits) name it too, as on the real hub."""

    def __init__(
        self,
        folder: Path,
        *,
        repo_id: str,
        revision: str | None,
        repo_type: str = "dataset",
        host: str = "127.0.0.1",
        port: int = 0,
        faults: HubFaults | None = None,
        token: str | None = None,
    ) -> None:
        check_repo_names(repo_id, revision)
        if repo_type not in REPO_TYPES:
            raise HubSetupError(
                f"repo_type {repo_type!r} is not one of {', '.join(REPO_TYPES)}.", fix="pass one of them"
            )
        self.folder = hub_folder(folder)
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.host = host
        self.port = port
        self.faults = faults if faults is not None else HubFaults()
        self._token = token
        self.tree_page_size = TREE_PAGE_SIZE
        self.request_log: list[tuple[str, str, str | None]] = []
        self.request_times: list[float] = []  # time.monotonic() of each request_log entry
        self._log_lock = threading.Lock()
        self._fault_lock = threading.Lock()
        self._cache: dict[str, FileEntry] = {}
        self._cache_lock = threading.Lock()
        self._link_lock = threading.Lock()
        self._link_free_at = 0.0  # time.monotonic() at which the shared link has sent all it owes
        self._date = datetime.fromtimestamp(0, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        # None: the commit the folder declares it mirrors, else its own (each file hashed here once;
        # scan() reuses the hashes)
        self.declared = declared_source(self.folder) if revision is None else None
        if revision is None:
            revision = self.declared["revision"] if self.declared else folder_commit(self.files())
        self.revision: str = revision

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def date(self) -> str:
        """The date every commit and file is reported with (the newest file's mtime once started)."""
        return self._date

    def scan(self) -> None:
        """Hash every file once (before the first request); the newest mtime becomes the date."""
        mtimes = [e.mtime_ns for e in self.files().values()]
        if mtimes:
            self._date = datetime.fromtimestamp(max(mtimes) / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    # ----- access ----------------------------------------------------------------------------
    @property
    def private(self) -> bool:
        """A token is required (the repository is reported as private)."""
        return self._token is not None

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may see the repository."""
        return self._token is None or authorization == f"Bearer {self._token}"

    # ----- faults ----------------------------------------------------------------------------
    def is_missing(self, rel: str) -> bool:
        with self._fault_lock:
            return rel in self.faults.missing

    def take_get_faults(self, rel: str) -> GetFaults:
        """The faults of one GET of ``rel``, consuming the one-shot ones (``fail_first``, ``drop_after``)."""
        with self._fault_lock:
            ignore_range = self.faults.ignore_range
            n_fail = self.faults.fail_first.get(rel, 0)
            if n_fail > 0:
                if n_fail == 1:
                    del self.faults.fail_first[rel]
                else:
                    self.faults.fail_first[rel] = n_fail - 1
                return GetFaults(fail=True, drop_at=None, corrupt=False, ignore_range=ignore_range)
            drop_at = self.faults.drop_after.pop(rel) if rel in self.faults.drop_after else None
            return GetFaults(
                fail=False, drop_at=drop_at, corrupt=rel in self.faults.corrupt, ignore_range=ignore_range
            )

    def take_reject(self, target: str) -> Reject | None:
        """The rejection of one request of ``target`` (see ``HubFaults.reject``), consuming it."""
        with self._fault_lock:
            r = self.faults.reject.get(target)
            if r is None or r.count <= 0:
                return None
            if r.count == 1:
                del self.faults.reject[target]
            else:
                self.faults.reject[target] = Reject(r.count - 1, r.status, r.retry_after, r.http_date)
            return r

    # ----- the shared link (``HubFaults.link_rate``) ---------------------------------------------
    def reserve_link(self, nbytes: int) -> float | None:
        """Book ``nbytes`` on the shared link: the ``time.monotonic()`` at which they have passed it
        (the sender waits until then, then sends them), right after everything booked before; None
        when the link is not paced."""
        rate = self.faults.link_rate
        if rate is None:
            return None
        with self._link_lock:
            self._link_free_at = max(self._link_free_at, time.monotonic()) + nbytes / rate
            return self._link_free_at

    @property
    def link_free_at(self) -> float:
        """The ``time.monotonic()`` at which the last byte booked on the shared link passes it (when
        the last paced byte was sent, once downloads are over); 0.0 before any."""
        with self._link_lock:
            return self._link_free_at

    # ----- request log -----------------------------------------------------------------------
    def log_request(self, method: str, path: str, rng: str | None) -> None:
        with self._log_lock:
            self.request_log.append((method, path, rng))
            self.request_times.append(time.monotonic())

    def timed_log(self) -> list[tuple[float, str, str, str | None]]:
        """(monotonic time, method, path, range) of every request so far."""
        with self._log_lock:
            return [(t, *r) for t, r in zip(self.request_times, self.request_log, strict=True)]

    def log_snapshot(self) -> list[tuple[str, str, str | None]]:
        with self._log_lock:
            return list(self.request_log)

    def clear_log(self) -> None:
        with self._log_lock:
            self.request_log.clear()
            self.request_times.clear()

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
    def _entry(self, rel: str, abspath: Path, st: os.stat_result) -> FileEntry:
        with self._cache_lock:
            cached = self._cache.get(rel)
            if cached is not None and (cached.size, cached.mtime_ns) == (st.st_size, st.st_mtime_ns):
                return cached
        entry = FileEntry(rel, abspath, st.st_size, st.st_mtime_ns, sha256_file(abspath))
        with self._cache_lock:
            self._cache[rel] = entry
        return entry

    def files(self) -> dict[str, FileEntry]:
        """Every file of the repository (sha256 computed once, again only if size/mtime changed)."""
        out: dict[str, FileEntry] = {}
        for dirpath, dirnames, filenames in os.walk(self.folder):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                ap = Path(dirpath) / name
                if name == HUB_MARKER and dirpath == str(self.folder):
                    continue  # the folder's declaration, not a file of the repository
                try:
                    st = ap.stat()
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):  # a link counts as what it points to
                    continue
                rel = ap.relative_to(self.folder).as_posix()
                out[rel] = self._entry(rel, ap, st)
        with self._cache_lock:
            for gone in set(self._cache) - set(out):
                del self._cache[gone]
        return dict(sorted(out.items()))

    def file(self, rel: str) -> FileEntry | None:
        """The repository file at ``rel``, as :meth:`files` lists it: a regular file, or a symlink to
        one wherever it points (a folder of links, such as a hub cache's snapshot, serves what its
        listing shows); None for a path that leaves the folder by its own parts (``..``) or is
        not a file."""
        p = PurePosixPath(rel)
        if not rel or rel.startswith("/") or any(part in ("..", ".", "") for part in rel.split("/")):
            return None
        if p.parts and p.parts[0] in SKIP_DIRS or rel == HUB_MARKER:
            return None
        ap = self.folder / rel
        try:
            st = ap.stat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return self._entry(rel, ap, st)

    def dirs(self, files: dict[str, FileEntry]) -> list[str]:
        dirs: set[str] = set()
        for rel in files:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return sorted(dirs)

    def dir_entry(self, path: str, files: dict[str, FileEntry], *, expand: bool) -> dict[str, Any]:
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
