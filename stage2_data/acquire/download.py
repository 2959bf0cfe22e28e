"""Pinned, verified downloads: one archive, several at once, or a whole profile.

A download goes to ``archives/.partial/<path>.part`` (see ``transport``) and is hashed while the
bytes arrive; only a file whose sha256 equals its pin is moved (``os.replace``) to
``archives/<path>``, next to its verification record (see ``state``).

A final file under ``archives/`` was verified once: it is never deleted. When it disagrees with its
pin (``state.check_existing``), the hub's listing at the pinned revision says which side is wrong
(``_settle``): the file (the pin is then refused by name, :class:`PinDisagreesError`, and the file
stays) or the pin (the file is moved to the quarantine folder, see ``quarantine``, and downloaded
again; offline, a :class:`~.hub.HubOfflineError` says where it went). A partial download that never
verified may still be discarded.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from .. import layout
from ..errors import ChecksumMismatchError, HubError, ProblemsError, ProfileError, Stage2Error
from ..fsutil import require_free_space
from ..profile import ArchiveSpec, Profile
from ..publish import fsync_dir
from ..publish.quarantine import quarantine_files
from .endpoint import hub_offline, pin_check_command
from .hub import HubOfflineError, HubSource, PinDisagreesError, RemoteFile
from .listing import list_remote_files
from .retry import DEFAULT_ATTEMPTS, default_backoff
from .state import (
    LocalFile,
    _write_record,
    archive_state,
    check_existing,
    record_origin,
    remaining_download_bytes,
    require_build_space,
    set_record_origin,
    source_origin,
)
from .transport import confirm_at_source, fetch_partial

log = logging.getLogger(__name__)

PIN_FIX = "run `stage2 pin` to fill size and sha256 from the hub's listing at the pinned revision"
MISMATCH_FIX = (
    "re-run the build to download it again; if it persists, run `stage2 pin` and check the upstream file"
)


@dataclass
class DownloadResult:
    path: str
    local_path: Path
    size: int
    sha256: str
    seconds: float
    bytes_downloaded: int  # body bytes received by this call (all attempts)
    resumed_from: int  # bytes of an earlier partial this call started from (0: from scratch)
    skipped: bool  # True: already verified locally, nothing downloaded
    attempts: int = 0  # HTTP download attempts made by this call
    moved_aside: Path | None = None  # where a local file that disagreed with its pin was moved first

    @property
    def mb_per_s(self) -> float:
        return self.bytes_downloaded / self.seconds / 1e6 if self.seconds > 0 else 0.0


class DownloadsFailedError(ProblemsError, HubError):
    """Several downloads failed; ``errors`` maps each failed path to its exception."""

    could_not_run = False  # each failed path's own error says what it was

    def __init__(
        self,
        title: str,
        problems: list[str],
        *,
        errors: dict[str, BaseException],
        results: list[DownloadResult],
        fix: str | None = None,
    ) -> None:
        self.errors = errors
        self.results = results
        super().__init__(title, problems, fix=fix)


def _value(key: str, value: object) -> str:
    return f'{key} = "{value}"' if key == "sha256" else f"{key} = {value}"


@dataclass(frozen=True)
class _Pin:
    """The pin of one archive as a message names it: ``<profile>: archives[i].sha256 = "…"``, or,
    without the profile, ``sha256 = "…" of the [[archives]] entry with path = "…"``."""

    keys: list[str]  # the keys whose pinned value differs from the file: size, sha256
    head: str  # "<profile file>: " or ""
    key_prefix: str  # "archives[i]." or ""
    tail: str  # "" or " of the [[archives]] entry with path = ..."
    where: str  # the profile file, or "<profile>"

    def named(self, values: dict[str, object]) -> str:
        body = " and ".join(self.key_prefix + _value(k, values[k]) for k in self.keys)
        return f"{self.head}{body}{self.tail}"


def _pin_of(spec: ArchiveSpec, size: int, sha256: str, profile: Profile | None) -> _Pin:
    """The pin of ``spec``, its keys those whose value is not ``size`` / ``sha256`` (the file's)."""
    keys = [k for k, a, b in (("size", spec.size, size), ("sha256", spec.sha256, sha256)) if a != b]
    index = None
    if profile is not None:
        index = next((i for i, a in enumerate(profile.archives) if a.path == spec.path), None)
    where = str(profile.profile_path) if profile is not None and profile.profile_path else "<profile>"
    if index is None:
        return _Pin(keys, "", "", f' of the [[archives]] entry with path = "{spec.path}"', where)
    return _Pin(keys, f"{where}: ", f"archives[{index}].", "", where)


def _settle(
    source: HubSource, spec: ArchiveSpec, data_root: Path, local: LocalFile, profile: Profile | None
) -> Path:
    """A verified file that disagrees with its pin: which side is wrong?

    Online, the hub's listing at the pinned revision decides: when it lists the file's own size and
    sha256, the pin is wrong (PinDisagreesError; the file stays). Otherwise (the hub agrees with the
    pin, with neither, or cannot be asked), the file and its record are moved to the quarantine
    folder, never deleted; returns the file's new path (the caller downloads again). Offline
    (``HF_HUB_OFFLINE``), the file is moved as well and HubOfflineError says where."""
    pin = _pin_of(spec, local.size, local.sha256, profile)
    pinned = pin.named({"size": spec.size, "sha256": spec.sha256})
    file_values = pin.named({"size": local.size, "sha256": local.sha256})
    found = f"{local.path} holds {local.size} bytes with sha256 {local.sha256}"
    offline = hub_offline()
    hub_says = "HF_HUB_OFFLINE is set: the hub was not asked which side is wrong"
    remote: RemoteFile | None = None
    if not offline:
        try:
            remote = list_remote_files(source).get(spec.path)
        except HubError as e:
            hub_says = f"the hub's listing could not be read ({e.message.splitlines()[0]})"
        else:
            if remote is not None and (remote.size, remote.sha256) == (local.size, local.sha256):
                raise PinDisagreesError(
                    f"the pin {pinned} is wrong: the verified file {found}, and the hub's listing of "
                    f"{source.label} at {source.revision} ({source.api_endpoint}) lists the same size and "
                    "sha256 for it. The file was left where it is; nothing was downloaded.",
                    fix=f"correct the pin to the upstream value: {file_values} "
                    f"({pin_check_command(pin.where, source.api_endpoint, source.hub_folder)} shows the same disagreement); then re-run: "
                    "nothing needs downloading",
                    path=spec.path,
                    keys=pin.keys,
                )
            hub_says = (
                f"{spec.path} is not in the hub's listing at {source.revision}"
                if remote is None
                else f"the hub's listing at {source.revision} says {remote.size} bytes, sha256 {remote.sha256}"
            )
    if remote is not None and (remote.size, remote.sha256) == (spec.size, spec.sha256):
        verified = local.record.get("sha256") if isinstance(local.record, dict) else None
        hub_says += (
            ", as the pin does: the file was verified against another pin (its record says the same "
            "sha256), so the pin changed (another profile or revision), not the file"
            if verified == local.sha256
            else ", as the pin does: the local file's bytes are what changed"
        )
    reason = (
        f"its bytes ({local.size} bytes, sha256 {local.sha256}) disagreed with its pin {pinned}; {hub_says}"
    )
    record = layout.verified_record_path(data_root, spec.path)
    moved = quarantine_files(
        data_root,
        [local.path, record],
        reason,
        archive=spec.path,
        size=local.size,
        sha256=local.sha256,
        pinned_size=spec.size,
        pinned_sha256=spec.sha256,
    )
    where = moved[0] if moved else local.path
    log.warning("%s: %s; moved to %s (not deleted)", spec.path, reason, where)
    if offline:
        raise HubOfflineError(
            f"HF_HUB_OFFLINE is set and {found}, which disagrees with its pin {pinned}: it was moved "
            f"to {where} (not deleted); nothing was requested.",
            fix=f"if the pin is wrong (the file is the upstream one: {pin_check_command(pin.where, source.api_endpoint, source.hub_folder)} "
            f"online tells), correct it ({file_values}) and move the file back: "
            f"mv {shlex.quote(str(where))} {shlex.quote(str(local.path))}; "
            "else unset HF_HUB_OFFLINE to download the pinned file again",
            missing=[spec.path],
        )
    return where


def _wrong_pin(
    source: HubSource, spec: ArchiveSpec, err: PinDisagreesError, profile: Profile | None
) -> PinDisagreesError:
    """A download's answer disagreed with the pin and the hub's listing gives the file other values
    than the pin (``err``, raised where the profile is not known): the same refusal as for a
    verified file on disk (``_settle``), naming the pin by its key in the profile file and the
    upstream value to write there."""
    if err.upstream is None:
        return err
    size, sha256 = err.upstream
    pin = _pin_of(spec, size, sha256, profile)
    pinned = pin.named({"size": spec.size, "sha256": spec.sha256})
    upstream = pin.named({"size": size, "sha256": sha256})
    return PinDisagreesError(
        f"the pin {pinned} is wrong: {err.said}, and the hub's listing of {source.label} at "
        f"{source.revision} ({source.api_endpoint}) lists {spec.path} with {size} bytes, sha256 {sha256}. "
        "The archive was not downloaded.",
        fix=f"correct the pin to the upstream value: {upstream} "
        f"({pin_check_command(pin.where, source.api_endpoint, source.hub_folder)} shows the same "
        "disagreement); then re-run",
        path=spec.path,
        keys=pin.keys,
        upstream=err.upstream,
        said=err.said,
    )


def _precheck(
    source: HubSource,
    specs: Iterable[ArchiveSpec],
    quarantined: Collection[str],
    listed: Collection[str] | None,
) -> list[str]:
    """Every reason (no request made) why these archives must not be requested."""
    problems: list[str] = []
    if not layout.HEX40_RE.match(source.revision):
        problems.append(
            f"revision {source.revision!r} of {source.label} is not a full 40-hex commit; "
            "a branch name, tag or short hash is never a pin"
        )
    for spec in specs:
        if spec.path in quarantined or layout.split_base(spec.path) in quarantined:
            problems.append(f"{spec.path} is quarantined: it is never downloaded")
        elif listed is not None and spec.path not in listed:
            problems.append(f"{spec.path} is not listed under [[archives]] of the profile")
        elif spec.unknown:
            problems.append(
                f"{spec.path} is marked unknown = true (a guessed name, never requested); run `stage2 pin` "
                "to see the closest upstream names, set path and cache_key, and delete `unknown = true`"
            )
        elif not spec.pinned:
            problems.append(f"{spec.path} is not pinned (no size/sha256 in the profile); {PIN_FIX}")
    return problems


def _raise_precheck(problems: list[str]) -> None:
    if problems:
        raise ProfileError(
            "refusing to download: " + "; ".join(problems) + ".",
            fix="pin the archive (`stage2 pin`), or remove it from the request",
        )


def download_archive(
    source: HubSource,
    spec: ArchiveSpec,
    data_root: Path,
    *,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    quarantined: Collection[str] = frozenset(),
    listed: Collection[str] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float | None = None,  # None: STAGE2_RETRY_BACKOFF, else DEFAULT_BACKOFF
    cancel: threading.Event | None = None,
    profile: Profile | None = None,
) -> DownloadResult:
    """Download one pinned archive into ``archives/<path>`` and verify it against its pin.

    Refused before any request (ProfileError): an unpinned, unknown (``unknown = true``) or
    quarantined archive, one not in ``listed`` (when given), a revision that is not a full commit.
    Skipped without any request: a final file whose verification record matches (inode, size,
    mtime_ns, ctime_ns, pinned sha256), unless ``reverify``. A final file without a matching record
    is re-hashed and kept if it matches; if it does not, it is never deleted (``_settle``: the pin
    refused by name when the hub's listing agrees with the file, else the file moved to the
    quarantine folder and downloaded again). ``profile`` (when given) lets a refusal name the
    profile file and the key (``archives[i].sha256``). Offline (``HF_HUB_OFFLINE``), anything else is HubOfflineError, with no
    request. Transient failures are retried by the one retry policy (``retry.py``: ``attempts`` in
    all, backoff ``backoff`` x 2^n seconds, or the hub's ``Retry-After``, bounded), each retry
    resuming from the partial file. A sha256 mismatch deletes the partial and raises
    ChecksumMismatchError.
    """
    _raise_precheck(_precheck(source, [spec], quarantined, listed))
    assert spec.size is not None and spec.sha256 is not None
    if profile is not None and profile.profile_path and source.profile_path is None:
        # a hub error's fix names the pin check of this very profile
        source = replace(source, profile_path=str(profile.profile_path))
    data_root = Path(data_root)
    t0 = time.monotonic()
    final = layout.archive_path(data_root, spec.path)
    moved: Path | None = None
    was = "disagreed with its pin"  # why what was at ``final`` was moved, for a failure's message
    origin = source_origin(source)
    if final.is_file():
        prior = record_origin(data_root, spec)
        if prior is not None and prior != origin:
            # verified from another repo or revision than the profile now names: the hub confirms
            # the file there first, as a first download would (a typo in a pin never stands)
            _confirm_origin(source, spec, prior, attempts, backoff)
        found = check_existing(spec, data_root, final, origin, reverify)
        if not isinstance(found, LocalFile):
            if prior is not None and prior != origin:
                set_record_origin(data_root, spec, origin)
            return DownloadResult(
                spec.path, final, spec.size, found, time.monotonic() - t0, 0, 0, skipped=True, attempts=0
            )
        moved = _settle(source, spec, data_root, found, profile)
    elif os.path.lexists(final):
        # a folder, FIFO, socket, device or dangling link where the archive goes: the download's
        # rename would replace some of them and fail on the rest; it is moved aside whole (what a
        # folder holds included) and said, never read, replaced or deleted
        (moved,) = quarantine_files(
            data_root,
            [final],
            "not an archive file: it stood where the archive goes (a folder, FIFO, device or link)",
            archive=spec.path,
        )
        was = "was not an archive file"
        log.warning("%s is not a file: moved to %s; the archive is downloaded", final, moved)
    if hub_offline():
        raise offline_error(data_root, [spec.path])
    backoff = default_backoff() if backoff is None else backoff  # read only when a request is made
    try:
        res = _download(source, spec, data_root, progress, max(1, attempts), backoff, cancel, t0)
    except Stage2Error as e:
        err = _wrong_pin(source, spec, e, profile) if isinstance(e, PinDisagreesError) else e
        if moved is not None:  # the message says where the file that was there went
            err.message += f" (What was at {final} {was} and was moved to {moved}.)"
        if err is e:
            raise
        raise err from None
    res.moved_aside = moved
    return res


def _download(
    source: HubSource,
    spec: ArchiveSpec,
    data_root: Path,
    progress: Callable[[int], None] | None,
    attempts: int,
    backoff: float,
    cancel: threading.Event | None,
    t0: float,
) -> DownloadResult:
    assert spec.size is not None and spec.sha256 is not None
    final = layout.archive_path(data_root, spec.path)
    part = layout.partial_path(data_root, spec.path)
    fetched = fetch_partial(
        source,
        spec,
        part,
        progress=progress,
        attempts=attempts,
        backoff=backoff,
        cancel=cancel,
    )
    digest = fetched.sha256
    if digest != spec.sha256:
        part.unlink(missing_ok=True)
        raise ChecksumMismatchError(spec.path, spec.sha256, digest, fix=MISMATCH_FIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    fsync_dir(final.parent)
    _write_record(data_root, spec, final, digest, source_origin(source))
    return DownloadResult(
        spec.path,
        final,
        spec.size,
        digest,
        time.monotonic() - t0,
        fetched.received,
        fetched.resumed_from,
        skipped=False,
        attempts=fetched.attempts,
    )


def _confirm_origin(
    source: HubSource, spec: ArchiveSpec, prior: tuple[object, ...], attempts: int, backoff: float | None
) -> None:
    """Ask the hub whether the profile's source holds ``spec`` as pinned (``confirm_at_source``);
    the verified file and its record stay as they are whatever it answers."""
    was = "{}:{}@{}".format(*(p or "?" for p in prior))
    if hub_offline():
        raise HubOfflineError(
            f"HF_HUB_OFFLINE is set and {spec.path} was verified from {was}, not from the profile's "
            f"{source.repo_type}:{source.repo_id}@{source.revision}: the hub must confirm it there once; "
            "nothing was requested.",
            fix="unset HF_HUB_OFFLINE for one build (or correct [source] in the profile if it is a typo)",
            missing=[spec.path],
        )
    try:
        confirm_at_source(
            source, spec, attempts=max(1, attempts), backoff=default_backoff() if backoff is None else backoff
        )
    except HubError as e:
        e.message += (
            f" ({spec.path} on disk was verified from {was}; it was left where it is. If the profile's "
            "[source] repo_id or revision is a typo, correct it.)"
        )
        raise


def offline_error(data_root: Path, missing: list[str]) -> HubOfflineError:
    """Offline (``HF_HUB_OFFLINE``), and the archives ``missing`` (profile paths) are not on disk:
    the one error that names each (one by its path; several by the archives folder, then their
    names), said before anything is requested."""
    if len(missing) == 1:
        where = f"1 archive(s) are not on disk: {layout.archive_path(data_root, missing[0])}"
    else:
        where = f"{len(missing)} archive(s) are not on disk in {layout.archives_dir(data_root)}: {', '.join(missing)}"
    return HubOfflineError(
        f"HF_HUB_OFFLINE is set and {where}; nothing was requested.",
        fix="unset HF_HUB_OFFLINE to download them, or copy each archive there (a file whose size and "
        "sha256 equal its pin is accepted) and re-run",
        missing=missing,
    )


# ----- many downloads -----------------------------------------------------------------------------
def default_workers(n: int) -> int:
    return max(1, min(4, n))


def download_archives(
    source: HubSource,
    specs: Iterable[ArchiveSpec],
    data_root: Path,
    *,
    workers: int | None = None,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    quarantined: Collection[str] = frozenset(),
    listed: Collection[str] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float | None = None,  # None: STAGE2_RETRY_BACKOFF, else DEFAULT_BACKOFF
    check_space: bool = True,
    profile: Profile | None = None,
) -> list[DownloadResult]:
    """Download several archives concurrently (``workers`` threads, default ``min(4, n)``), the
    largest remainder first; results come back in the order of ``specs``.

    Every archive is checked first (nothing is requested if one is unpinned, quarantined or
    unlisted), and the free disk for what remains to download. Failures are gathered: one
    DownloadsFailedError lists every failed file (the others are complete and verified).
    ``progress`` is called from the worker threads.
    """
    specs = list(specs)
    _raise_precheck(_precheck(source, specs, quarantined, listed))
    data_root = Path(data_root)
    if hub_offline():
        missing = [s.path for s in specs if archive_state(data_root, s).state != "verified"]
        if missing:  # a file without its record is re-hashed below; only absent ones are refused here
            absent = [p for p in missing if not layout.archive_path(data_root, p).is_file()]
            if absent:
                raise offline_error(data_root, absent)
    remaining = {s.path: remaining_download_bytes(data_root, s) for s in specs}
    if backoff is None and any(remaining.values()):  # a bad setting: one error, not one per archive
        backoff = default_backoff()
    if check_space and specs:
        needed = sum(remaining.values())
        require_free_space(layout.archives_dir(data_root), needed, f"downloading {len(specs)} archive(s)")
    cancel = threading.Event()
    results: dict[str, DownloadResult] = {}
    errors: dict[str, BaseException] = {}
    pool = ThreadPoolExecutor(
        max_workers=workers or default_workers(len(specs)), thread_name_prefix="download"
    )
    try:
        futures: dict[Future[DownloadResult], ArchiveSpec] = {
            pool.submit(
                download_archive,
                source,
                s,
                data_root,
                reverify=reverify,
                progress=progress,
                quarantined=quarantined,
                listed=listed,
                attempts=attempts,
                backoff=backoff,
                cancel=cancel,
                profile=profile,
            ): s
            # largest remainder first: the last download ends soonest
            for s in sorted(specs, key=lambda s: -remaining[s.path])
        }
        for fut, s in futures.items():
            try:
                results[s.path] = fut.result()
            except Exception as e:
                errors[s.path] = e
    except BaseException:
        cancel.set()  # Ctrl-C: stop every download at its next chunk; partial files are kept
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    done = [results[s.path] for s in specs if s.path in results]
    if errors:
        errors = {s.path: errors[s.path] for s in specs if s.path in errors}  # in the order asked
        problems = [f"{p}: {source.redact(str(e))}" for p, e in errors.items()]
        raise DownloadsFailedError(
            f"{len(errors)} of {len(specs)} archive download(s) failed",
            problems,
            errors=errors,
            results=done,
            fix="fix the named problem(s) and re-run: verified archives are skipped, partial ones resume",
        )
    return done


def download_profile(
    profile: Profile,
    source: HubSource,
    data_root: Path,
    *,
    workers: int | None = None,
    reverify: bool = False,
    progress: Callable[[int], None] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float | None = None,  # None: STAGE2_RETRY_BACKOFF, else DEFAULT_BACKOFF
) -> list[DownloadResult]:
    """All archives of a profile: checks the source against the profile, the free disk for the
    downloads and the extraction that follows (``required_free_bytes``), then downloads."""
    src = profile.source
    if (source.repo_id, source.repo_type, source.revision) != (src.repo_id, src.repo_type, src.revision):
        raise ProfileError(
            f"the hub source {source.repo_type}:{source.repo_id}@{source.revision} is not the profile's "
            f"[source] {src.repo_type}:{src.repo_id}@{src.revision}.",
            fix="build the source from the profile (HubSource.from_profile)",
        )
    profile.require_known()
    _raise_precheck(_precheck(source, profile.archives, profile.quarantined_paths(), profile.archive_paths()))
    require_build_space(profile, Path(data_root))
    return download_archives(
        source,
        profile.archives,
        data_root,
        workers=workers,
        reverify=reverify,
        progress=progress,
        quarantined=profile.quarantined_paths(),
        listed=profile.archive_paths(),
        attempts=attempts,
        backoff=backoff,
        check_space=False,
        profile=profile,
    )
