"""Which stores stay: readers' leases, and the retention policy that removes old stores (``stage2 gc``).

**Leases (local stores).** A reader of a store in a profile's stores folder (a folder with a
``current`` link: the stores retention removes) holds a shared ``flock`` on
``<profile folder>/.leases/<store>.lock`` (the store's *gate*, next to the store folder, never inside
it: a store stays immutable) for as long as it is open. Removing a store takes the gate exclusively without waiting (``LOCK_EX | LOCK_NB``): while
any reader holds it the store is kept and reported as "in use by pid X" (the holders are read from
``/proc/locks``). While the remover holds it no reader can start; it renames the store to a
``.old-`` temp (:mod:`stage2_data.publish`), unlinks the gate, releases it and deletes the temp. A
reader that was waiting then finds its gate unlinked or the store gone and says so; it never reads a
half-deleted store. The kernel releases a ``flock`` when its holder exits, however it exits
(SIGKILL included): a crashed reader never blocks removal. A process forked from a reader (a
DataLoader worker) inherits the lease; a reader unpickled in a spawned process takes its own. Where
the gate cannot be created (a read-only mount) a reader reads without a lease. Where something else
stands in the way (``.leases`` a file, not a folder; a gate that is a folder) a reader is refused
with a named error and ``gc`` removes nothing of that profile's stores: a reader never reads
without a lease that ``gc`` would need to see, and the user's file is left where it is (the fix
says to move it). A gate that is not a regular file (a FIFO, a device, a socket) is refused the same
way, before it is opened: opening a FIFO for reading would wait for a writer forever.

**Object storage** has no locks: readers there hold no lease, and ``gc`` keeps the ``keep`` most
recent previous stores and removes the rest, saying that a reader still reading a removed store
would fail (choose ``keep`` above the number of stores readers may still be reading).

**Retention.** :func:`collect_stores` over one profile's stores folder (``stores/<profile>/``, or
``<url>/<profile>/``): the published store (``current``) is never removed, nor the ``keep`` most
recent previous stores (by ``created_at``; default 1: :data:`DEFAULT_KEEP`, or
``STAGE2_KEEP_STORES``), nor a leased store, nor anything that is not a complete store of this
format (its ``manifest.json`` says so); the temps that dead writers left there are swept.
Without a published store nothing is removed. A local ``current`` publishes a store only when it is
a symbolic link to a folder directly inside the profile's folder (its name not hidden) holding a
``manifest.json``, as object storage's ``CURRENT`` object (:meth:`FsspecLocation.current`); any
other ``current`` (a link to an empty folder, to ``.leases``, to another profile's store, to
nothing; a folder or file named ``current``) publishes nothing, and ``gc`` refuses with a named
error saying what it points at and the fix, removing nothing: it would otherwise judge every store
"previous".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import layout
from ..errors import FileSystemError, Stage2Error, StoreError, StoreNotFoundError
from ..formats.sha256sums import file_kind
from ..fsutil import human_bytes, open_regular, shown, tree_usage
from ..oserrors import fs_error
from ..publish import remove_stale, stale_temps, temp_path
from ..publish.quarantine import manifest_listed_paths
from ..publish.readonly import remove_tree
from ..storage import CURRENT_OBJECT, StoreLocation
from .format import MANIFEST_NAME, STORE_FORMAT
from .manifest import load_manifest

__all__ = [
    "DEFAULT_KEEP",
    "KEEP_ENV",
    "LEASES_DIR",
    "GcReport",
    "StoreLease",
    "StoreVerdict",
    "acquire_lease",
    "check_current",
    "collect_stores",
    "default_keep",
    "lease_holders",
    "lease_path",
    "profile_roots",
    "resolve_keep",
    "retention_after_publish",
]

#: the folder, next to the store folders, holding one gate file per store (``<store>.lock``)
LEASES_DIR = ".leases"
#: how many stores besides ``current`` a build keeps when nothing says otherwise
DEFAULT_KEEP = 1

#: the name a build gives a store's folder, ``v<format version>-<input key>`` (hex): only folders
#: so named are judged as stores; a copy under another name (``my-backup``) is a user's, left alone
BUILT_NAME_RE = re.compile(r"\Av\d+-[0-9a-f]{16}\Z")
#: the environment variable a build reads its ``keep`` from (an integer >= 0, or ``all``: never remove)
KEEP_ENV = "STAGE2_KEEP_STORES"

#: what taking or checking a gate meets when something that is not a folder stands where the
#: leases folder should be (or a folder where the gate file should be): never read past
_IN_THE_WAY = (errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ELOOP)


# ----- leases ---------------------------------------------------------------------------------------
def lease_path(store: Path) -> Path:
    """The gate file of a local store folder: ``<parent>/.leases/<name>.lock``."""
    return store.parent / LEASES_DIR / f"{store.name}.lock"


def _gate_in_the_way(store: Path, e: OSError, doing: str) -> Stage2Error:
    """``e`` (something not a folder where ``.leases`` should be, or not a file where the gate
    should be) as a named error: the path in the way and the fix (move it; nothing is deleted)."""
    return fs_error(e, f"{doing} {store} (its readers' lease: `stage2 gc` keeps a store while it is read)")


def _check_leases_folder(store: Path, doing: str) -> None:
    """Raise the named error when ``<store's folder>/.leases`` exists and is not a folder (a file,
    a link to no folder), or the store's gate is a folder: no lease can be taken or seen there."""
    gate = lease_path(store)
    leases = gate.parent

    def in_the_way(code: int, what: str, path: Path) -> Stage2Error:
        return _gate_in_the_way(store, OSError(code, what, str(path)), doing)

    try:
        st = os.stat(leases)
    except FileNotFoundError:
        if os.path.islink(leases):
            raise in_the_way(
                errno.EEXIST, "a link to nothing, where the readers' leases folder should be", leases
            ) from None
        return
    except OSError as e:
        if e.errno in _IN_THE_WAY:
            raise _gate_in_the_way(store, e, doing) from e
        return  # no permission and the like: taking the gate says what it says
    if not stat.S_ISDIR(st.st_mode):
        raise in_the_way(errno.EEXIST, "not a folder, where the readers' leases folder should be", leases)
    try:
        mode = os.stat(gate).st_mode
    except OSError:  # absent (made when taken), or unreadable: said when taken
        return
    if not stat.S_ISREG(mode):
        raise _gate_refusal(store, mode, doing)  # an OSError too, never suppressed


def _gate_refusal(store: Path, mode: int, doing: str) -> Stage2Error:
    """The named error of a gate of ``store`` that is not a regular file (``mode``: its
    ``st_mode``, a link followed): a folder, a FIFO, a device or a socket is never read as a lease."""
    gate = lease_path(store)
    if stat.S_ISDIR(mode):
        return _gate_in_the_way(
            store, OSError(errno.EISDIR, "a folder, where a store's lease file should be", str(gate)), doing
        )
    return FileSystemError(
        f"{doing} {store}: its readers' lease {gate} is {file_kind(mode)}, not a regular file "
        "(the lease file `stage2 gc` checks before it removes a store); nothing was read from it.",
        fix=f"remove it (rm {shlex.quote(str(gate))}): the next reader makes the lease file again",
    )


def _open_gate(store: Path, flags: int, doing: str) -> int:
    """The gate of ``store`` opened with ``flags`` (without waiting: a FIFO there is refused, never
    read); raises the named error when it is not a regular file (checked before opening and on
    what was opened), OSError otherwise."""
    return open_regular(
        lease_path(store), flags, 0o666, refuse=lambda mode: _gate_refusal(store, mode, doing)
    )


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class StoreLease:
    """A reader's shared lock on one local store's gate, held until :meth:`release`."""

    def __init__(self, store: Path, gate: Path, fd: int) -> None:
        self.store = store
        self.gate = gate
        self._fd: int | None = fd
        self._pid = os.getpid()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Close the gate (no ``LOCK_UN``: a process forked from this one keeps its inherited lease)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"StoreLease({str(self.store)!r}, held={self.held})"


def acquire_lease(store: Path) -> StoreLease | None:
    """Take a shared lease on the local store folder ``store`` (see the module doc).

    Waits only while a remover holds the gate (a rename). None when the gate cannot be created
    here (a read-only mount, no permission): the caller reads without a lease. Raises a named
    error (FileSystemError) when something stands in the way (``.leases`` a file, the gate a
    folder): a reader never reads without the lease ``stage2 gc`` would see."""
    gate = lease_path(store)
    for _ in range(50):
        _check_leases_folder(store, "opening")
        try:
            gate.parent.mkdir(exist_ok=True)
            fd = _open_gate(store, os.O_RDONLY | os.O_CREAT, "opening")
        except Stage2Error:
            raise  # a gate that is not a regular file (FileSystemError is an OSError too)
        except OSError as e:
            if e.errno in _IN_THE_WAY:
                raise _gate_in_the_way(store, e, "opening") from e
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return None
        if _same_file(fd, gate):
            return StoreLease(store, gate, fd)
        os.close(fd)  # a remover unlinked this gate while we waited: take the new one
    raise StoreError(f"{store}: could not take a reader's lease on {gate}.", fix="try again")


def _proc_locks() -> list[tuple[int, int, int, int]]:
    """(pid, major, minor, inode) of every held lock in ``/proc/locks`` (Linux; [] elsewhere)."""
    out: list[tuple[int, int, int, int]] = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->":  # "->": a waiter, not a holder
            continue
        try:
            maj, mnr, ino = parts[5].split(":")
            out.append((int(parts[4]), int(maj, 16), int(mnr, 16), int(ino)))
        except ValueError:
            continue
    return out


def lease_holders(store: Path) -> list[int]:
    """The pids holding a lock on ``store``'s gate, as far as ``/proc/locks`` shows them."""
    try:
        st = os.stat(lease_path(store))
    except OSError:
        return []
    key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    return sorted({pid for pid, *rest in _proc_locks() if tuple(rest) == key})


def _in_use(store: Path) -> str:
    pids = lease_holders(store)
    if pids:
        return f"in use by pid {', '.join(str(p) for p in pids)}"
    return "in use by a reader (its lease is held)"


# ----- the report -------------------------------------------------------------------------------------
@dataclass
class StoreVerdict:
    """What retention did (or would do) with one entry of a profile's stores folder."""

    name: str
    action: str  # "removed", "would remove", "kept", "left alone"
    reason: str
    bytes: int | None = None
    created_at: str | None = None
    #: bytes its removal frees (its files not hard-linked into another store, as merged stores are);
    #: None for a store that is kept
    freed: int | None = None

    def line(self) -> str:
        size = human_bytes(self.bytes) if self.bytes is not None else "-"
        return f"{self.action:<12} {self.name}  {size}  {self.reason}".rstrip()


@dataclass
class GcReport:
    """One profile's stores folder after retention."""

    root: str
    keep: int
    dry_run: bool
    current: str | None = None
    entries: list[StoreVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(
            (e.bytes or 0) if e.freed is None else e.freed
            for e in self.entries
            if e.action in ("removed", "would remove")
        )

    def lines(self) -> list[str]:
        head = f"{self.root}: keep {self.keep} previous store(s) besides current"
        head += f" ({self.current})" if self.current else " (none published)"
        if self.dry_run:
            head += "; dry run, nothing removed"
        out = [head] + [f"  {e.line()}" for e in self.entries] + [f"  note: {n}" for n in self.notes]
        verb = "would free" if self.dry_run else "freed"
        out.append(f"  {verb} {human_bytes(self.freed_bytes)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "keep": self.keep,
            "dry_run": self.dry_run,
            "current": self.current,
            "stores": [asdict(e) for e in self.entries],
            "notes": list(self.notes),
            "freed_bytes": self.freed_bytes,
        }


# ----- retention --------------------------------------------------------------------------------------
def default_keep(env: Mapping[str, str] | None = None) -> int | None:
    """``keep`` from ``STAGE2_KEEP_STORES`` (an integer >= 0; ``all``: None, never remove), else
    :data:`DEFAULT_KEEP`. Raises Stage2Error for anything else."""
    raw = (os.environ if env is None else env).get(KEEP_ENV, "").strip()
    return DEFAULT_KEEP if not raw else resolve_keep(raw, source=KEEP_ENV)


def resolve_keep(value: int | str | None, *, source: str = "keep_stores") -> int | None:
    """A ``keep`` setting as retention takes it: None -> :func:`default_keep` (the environment, else
    :data:`DEFAULT_KEEP`); an integer >= 0 (or its text); ``"all"`` -> None (never remove).
    Raises Stage2Error for anything else."""
    if value is None:
        return default_keep()
    if isinstance(value, str) and value.strip().lower() == "all":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise Stage2Error(
            f"{source}={value!r} is not a number of stores.",
            fix=f"set {source} to an integer >= 0 (stores kept besides current), or 'all'",
        )
    return n


def _our_manifest(loc: StoreLocation) -> dict[str, Any] | None:
    m = load_manifest(loc).manifest
    return m if m is not None and m.get("format") == STORE_FORMAT else None


def _created_at(loc: StoreLocation) -> str | None:
    """The ``created_at`` its manifest records (any format), or None when it records none."""
    m = load_manifest(loc).manifest
    created = m.get("created_at") if m is not None else None
    return str(created) if created else None


def _store_bytes(loc: StoreLocation) -> int:
    """The bytes of the store's files (a local one's on-disk usage)."""
    return tree_usage(loc.root)[1] if loc.is_local else sum(loc.file_sizes().values())


def _lock_exclusive(fd: int) -> bool:
    """Take ``fd``'s flock exclusively without waiting: False when a reader holds it shared."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _not_the_stores(loc: StoreLocation, manifest: dict[str, Any]) -> str | None:
    """Why a store folder is kept whole though the policy would remove it: it holds a file (an
    object) its ``manifest`` does not list (a note put inside, a chunk added, whatever its name), or
    an entry that is not a regular file, or its manifest does not say what its files are; None when
    everything in it is the manifest's."""
    listed, why = manifest_listed_paths(manifest)
    if listed is None:
        return f"its manifest.json does not say what its files are ({why}): kept whole"
    listed.add(MANIFEST_NAME)
    extra = sorted(_local_extra(loc.root, listed) if loc.is_local else set(loc.file_sizes()) - listed)
    if not extra:
        return None
    shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
    return (
        f"holds what is not the store's ({shown}): kept whole, nothing of yours is removed; move "
        "those out and run gc again, or remove the folder yourself"
    )


def _local_extra(root: Path, listed: set[str]) -> set[str]:
    """Every entry under ``root`` that is not a regular file its manifest lists (links, FIFOs and
    the like included: never followed), as a path under ``root``."""
    extra: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):  # links to folders are not walked into
        base = os.path.relpath(dirpath, root)
        for name in (*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))):
            rel = name if base == "." else f"{base}/{name}"
            if rel not in listed or not stat.S_ISREG(os.lstat(os.path.join(dirpath, name)).st_mode):
                extra.add(rel)
    return extra


def _not_a_folder(entry: os.DirEntry[str]) -> str:
    """Why gc leaves ``entry`` (in a profile's stores folder, not a folder there) alone."""
    if entry.is_symlink():
        return (
            f"a symlink (to {shown(os.readlink(entry.path))}), not a store folder: gc never follows or "
            "removes links; remove it yourself if you no longer need it"
        )
    return "a file, not a store folder: never removed by gc; remove it yourself if you no longer need it"


def _remove_local(store: Path, current: Path | None, dry_run: bool) -> tuple[str, str]:
    """Remove one local store unless a reader holds its gate; (action, reason)."""
    gate = lease_path(store)
    _check_leases_folder(store, "removing")  # else readers may hold leases gc cannot see
    try:
        if dry_run:
            if not os.path.lexists(gate):
                return "would remove", ""
            fd = _open_gate(store, os.O_RDONLY, "removing")
            try:
                held = not _lock_exclusive(fd)
            finally:
                os.close(fd)
            return ("kept", _in_use(store)) if held else ("would remove", "")
        gate.parent.mkdir(exist_ok=True)
        fd = _open_gate(store, os.O_RDONLY | os.O_CREAT, "removing")
    except Stage2Error:
        raise
    except OSError as e:
        if e.errno in _IN_THE_WAY:
            raise _gate_in_the_way(store, e, "removing") from e
        raise
    try:
        if not _lock_exclusive(fd):
            return "kept", _in_use(store)
        if not _same_file(fd, gate):
            return "kept", "its lease changed while it was checked (run gc again)"
        if current is not None and os.path.realpath(current) == str(store):
            return "kept", "current"
        old = temp_path(store, "old")
        os.rename(store, old)  # from here no reader can open it (and none holds it)
        gate.unlink(missing_ok=True)
    finally:
        os.close(fd)
    remove_tree(old)
    return "removed", ""


def _orphan_gates(root: Path, dry_run: bool) -> None:
    """Remove gate files whose store is gone and that no reader holds."""
    leases = root / LEASES_DIR
    if dry_run or not leases.is_dir():
        return
    for gate in sorted(leases.glob("*.lock")):
        if (root / gate.name[: -len(".lock")]).exists():
            continue
        try:  # not a regular file (a FIFO): not a gate gc made, left as it is
            fd = open_regular(gate, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, gate):
                gate.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            os.close(fd)


def _local_current(root: Path) -> Path | None:
    """The store the ``current`` link of the local profile folder ``root`` (a realpath) publishes;
    None when there is no ``current``. Anything else standing there (a link to a folder that is not
    a complete store directly inside ``root``, to nothing; a folder or a file) publishes nothing:
    StoreNotFoundError saying what it points at and the fix, so that retention removes nothing."""
    link = root / layout.CURRENT_LINK
    try:
        mode = os.lstat(link).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISLNK(mode):
        what = f"{link} is {file_kind(mode)}, not the symbolic link to a store a build makes"
    else:
        real = Path(os.path.realpath(link))
        points = f"{link} points at {os.readlink(link)}" + (
            f" ({real})" if str(real) != os.readlink(link) else ""
        )
        if not os.path.lexists(real):
            why = "nothing is there"
        elif real.parent != root or real.name.startswith("."):
            why = f"not a folder directly inside {root}"
        elif not real.is_dir():
            why = f"it is {file_kind(os.stat(real).st_mode)}, not a folder"
        elif not (real / MANIFEST_NAME).is_file():
            why = f"no {MANIFEST_NAME} in it: not a complete store"
        else:
            return real
        what = f"{points}, which is not a store ({why})"
    stores = sorted(
        (e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")),
        reverse=True,
    )
    stores = [n for n in stores if n != layout.CURRENT_LINK and (root / n / MANIFEST_NAME).is_file()]
    data_root = root.parent.parent if root.parent.name == layout.STORES_DIR else None
    build = "rebuild: `stage2 build --profile <the profile's .toml>"
    build += f" --data-root {shlex.quote(str(data_root))}`" if data_root is not None else "`"
    build += " publishes its store and makes current again"
    if stores:
        point = f"ln -sfn {shlex.quote(stores[0])} {shlex.quote(str(link))}"
        if not stat.S_ISLNK(mode):
            point = f"mv {shlex.quote(str(link))} <elsewhere> && {point}"
        fix = f"{build}; or point current at a store of this folder ({', '.join(stores)}): {point}"
    else:
        fix = f"{build} (no complete store is in {root})"
    raise StoreNotFoundError(
        f"{what}: it publishes no store, so `stage2 gc` cannot tell the current store from previous "
        "ones; nothing was removed.",
        fix=fix,
    )


def check_current(root: StoreLocation) -> None:
    """Raise the named error :func:`collect_stores` raises when the local profile folder ``root``'s
    ``current`` publishes no store (:func:`_local_current`); nothing on object storage (a
    ``CURRENT`` naming no store removes nothing there). For a caller judging several profile
    folders: check each before any is collected, so that none is removed when one is refused."""
    if root.is_local:
        _local_current(Path(os.path.realpath(root.root)))


def collect_stores(
    target: str | os.PathLike[str] | StoreLocation,
    keep: int = DEFAULT_KEEP,
    *,
    dry_run: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> GcReport:
    """Apply the retention policy to one profile's stores folder (``stores/<profile>/`` or
    ``<url>/<profile>/``): keep ``current``, the ``keep`` most recent previous stores and every
    leased store; remove the other complete stores of this format; sweep dead writers' temps.
    ``dry_run`` removes nothing and reports what would go."""
    if keep < 0:
        raise Stage2Error(f"keep must be >= 0, got {keep}.", fix="keep 0 or more previous stores")
    loc = StoreLocation.parse(target, storage_options)
    if loc.is_local:  # compared with the realpath of ``current`` below
        loc = StoreLocation.parse(os.path.realpath(loc.root))
    report = GcReport(root=loc.url, keep=keep, dry_run=dry_run)
    if loc.is_local:
        root = loc.root
        current_path = _local_current(root)
        entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
        names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        for e in sorted(entries, key=lambda e: e.name):
            if e.name != layout.CURRENT_LINK and not e.is_dir(follow_symlinks=False):
                report.entries.append(StoreVerdict(shown(e.name), "left alone", _not_a_folder(e)))
    else:
        report.notes.append(
            "object storage: readers hold no lease there; a reader still reading a removed store fails "
            "(keep more stores if readers may still be on them)"
        )
        cur = loc.current()
        current_path = cur.root if cur is not None else None
        if cur is None and (why := loc.current_problem()) is not None:
            report.notes.append(why)
        names = sorted(
            n for n in loc.listdir_names(loc.root) if n != CURRENT_OBJECT and not n.startswith(".")
        )
    if current_path is not None:
        report.current = current_path.name
    stores: list[tuple[str, str, StoreLocation]] = []  # (created_at, name, loc)
    manifests: dict[str, dict[str, Any]] = {}  # by name: each store's manifest, read once
    for name in names:
        child = loc.child(name)
        if current_path is not None and child.root == current_path:
            report.entries.append(
                StoreVerdict(name, "kept", "current", _store_bytes(child), _created_at(child))
            )
            continue
        if BUILT_NAME_RE.fullmatch(name) is None:  # whatever it holds: a build never wrote it here
            report.entries.append(
                StoreVerdict(
                    name,
                    "left alone",
                    "not named as a build names a store (v<version>-<key>): a copy or a folder of "
                    "yours, never removed by gc; remove it yourself if you no longer need it",
                )
            )
            continue
        m = _our_manifest(child)
        if m is None:
            why = "no manifest.json" if not child.is_file(child.root / MANIFEST_NAME) else "another format"
            report.entries.append(StoreVerdict(name, "left alone", f"not a complete store of ours ({why})"))
            continue
        stores.append((str(m.get("created_at") or ""), name, child))
        manifests[name] = m
    if current_path is None:
        report.notes.append("no store is published (no current): nothing removed")
        for created, name, _child in sorted(stores, reverse=True):
            report.entries.append(
                StoreVerdict(name, "kept", "no current store to judge it against", created_at=created or None)
            )
        return report
    stores.sort(reverse=True)  # newest first
    if loc.is_local:  # something in the way of a lease: refused before anything is removed
        for _, _, child in stores[keep:]:
            _check_leases_folder(child.root, "removing")
    for i, (created, name, child) in enumerate(stores):
        size = _store_bytes(child)
        if i < keep:
            report.entries.append(
                StoreVerdict(name, "kept", f"previous ({i + 1} of {keep} kept)", size, created)
            )
            continue
        if (extra := _not_the_stores(child, manifests[name])) is not None:
            report.entries.append(StoreVerdict(name, "kept", extra, size, created))  # frees nothing
            continue
        # what its removal frees, measured before it goes (a kept store has no such value)
        freed = tree_usage(child.root, unique=True)[1] if loc.is_local else None
        if loc.is_local:
            action, reason = _remove_local(child.root, loc.root / layout.CURRENT_LINK, dry_run)
        elif dry_run:
            action, reason = "would remove", ""
        else:
            child.withdraw(MANIFEST_NAME)
            action, reason = "removed", ""
        # a store a lease keeps (``_remove_local``) frees nothing either
        report.entries.append(
            StoreVerdict(name, action, reason, size, created, None if action == "kept" else freed)
        )
    if loc.is_local:
        temps = stale_temps(loc.root) if dry_run else remove_stale(loc.root)
        for t in temps:
            report.entries.append(
                StoreVerdict(t.name, "would remove" if dry_run else "removed", "a temp its dead writer left")
            )
        _orphan_gates(loc.root, dry_run)
    return report


def profile_roots(
    target: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> list[StoreLocation]:
    """The profile stores folders ``target`` names: itself when it is one (it has ``current`` /
    ``CURRENT`` or a store folder), else each of its sub-folders that is one (a ``stores/`` folder).
    Raises StoreError when it names none."""
    loc = StoreLocation.parse(target, storage_options)

    def is_profile_root(x: StoreLocation) -> bool:
        if x.is_local:
            if (x.root / layout.CURRENT_LINK).is_symlink():
                return True
        elif x.is_file(x.root / CURRENT_OBJECT):
            return True
        for n in x.listdir_names(x.root):
            if not n.startswith(".") and x.is_file(x.root / n / MANIFEST_NAME):
                return True
        return False

    if not loc.is_dir(loc.root):
        what = "no such folder"
        if loc.is_local and os.path.lexists(loc.root):  # there, but not a folder: say what it is
            what = f"it is {file_kind(os.lstat(loc.root).st_mode)}, not a folder"
        raise StoreError(
            f"{loc.url}: {what}.",
            fix="name a stores folder (<data_root>/stores) or one profile's (<data_root>/stores/<profile>)",
        )
    if is_profile_root(loc):
        return [loc]
    roots = [loc.child(n) for n in sorted(loc.listdir_names(loc.root)) if not n.startswith(".")]
    roots = [r for r in roots if r.is_dir(r.root) and is_profile_root(r)]
    if not roots:
        fix = "name a stores folder (<data_root>/stores) or one profile's (<data_root>/stores/<profile>)"
        if loc.is_file(loc.root / MANIFEST_NAME):  # a store itself (a `current` link, a store folder)
            parent = loc.root.resolve().parent if loc.is_local else loc.root.parent
            fix = f"name the profile's stores folder that holds it: {loc.display(parent)}"
            raise StoreError(f"{loc.url} is a store, not a folder of stores.", fix=fix)
        if loc.is_dir(loc.root / "stores"):  # a data root
            fix = f"name its stores folder: {loc.display(loc.root / 'stores')}"
        raise StoreError(
            f"{loc.url} holds no stores (no current link, no store folder, no profile folder with them).",
            fix=fix,
        )
    return roots


def retention_after_publish(root: StoreLocation, keep: int | str | None = None) -> dict[str, Any]:
    """What a build runs after it published a store: :func:`collect_stores` with ``keep`` (see
    :func:`resolve_keep`: None reads ``STAGE2_KEEP_STORES``, default 1; ``"all"`` never removes).
    Never raises: a failure (a bad setting too) is reported in the returned summary."""
    try:
        n = resolve_keep(keep)
        if n is None:
            return {"keep": "all", "removed": [], "kept": [], "freed_bytes": 0}
        rep = collect_stores(root, n)
    except Exception as e:  # retention never fails a build that already published its store
        return {"keep": keep, "error": f"{type(e).__name__}: {e}"}
    return {
        "keep": n,
        "removed": [e.name for e in rep.entries if e.action == "removed"],
        "kept": [f"{e.name} ({e.reason})" for e in rep.entries if e.action == "kept"],
        "freed_bytes": rep.freed_bytes,
        **({"notes": rep.notes} if rep.notes else {}),
    }
