"""Pinned, verified, resumable downloads: the real huggingface_hub client against the loopback hub."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import threading
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from bench.profiles import profile_data as bench_profile
from stage2_data import layout
from stage2_data.acquire import (
    EXTRACTION_FACTOR,
    DownloadCancelled,
    DownloadsFailedError,
    HubSource,
    PinError,
    RemoteFile,
    archive_state,
    check_revision,
    download_archive,
    download_archives,
    download_profile,
    list_remote_files,
    pin_profile,
    required_free_bytes,
)
from stage2_data.acquire.download import PinDisagreesError
from stage2_data.acquire.retry import BACKOFF_ENV
from stage2_data.demo.hubserver import HubServer
from stage2_data.errors import ChecksumMismatchError, HubError, ProfileError
from stage2_data.profile import ArchiveSpec, Profile, QuarantinedSpec, parse_profile
from stage2_data.publish.quarantine import quarantined_files

REPO = "org/robot-data"
REV = "1a8eb2d279c70964fadeaf8019a77c490c3abe02"
OTHER_REV = "f" * 40
MiB = 1024 * 1024
FAST = {"attempts": 4, "backoff": 0.01}  # keep retries short in tests
E = TypeVar("E", bound=Exception)


class Upstream(NamedTuple):
    folder: Path
    files: dict[str, bytes]

    def sha(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    folder = tmp_path_factory.mktemp("upstream")
    rnd = random.Random(11)
    files = {
        # Over the client's 10 MiB read chunk, so that a dropped connection leaves a partial file.
        "big_cache_key.tar": rnd.randbytes(24 * MiB + 123),
        "split_key.tar.part-aa": rnd.randbytes(2 * MiB),
        "split_key.tar.part-ab": rnd.randbytes(MiB + 5),
        "bad_failure_set.tar": rnd.randbytes(MiB),
        "unlisted_other.tar": rnd.randbytes(300_000),
        "README.md": b"# upstream\n",
    }
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    return Upstream(folder, files)


def profile_data(up: Upstream, *, pinned: bool = True, archives: list[str] | None = None) -> dict[str, Any]:
    keys = {
        "big_cache_key.tar": "big_cache_key",
        "split_key.tar.part-aa": "split_key",
        "split_key.tar.part-ab": "split_key",
    }
    paths = archives if archives is not None else list(keys)
    arch = []
    for p in paths:
        a: dict[str, Any] = {"path": p, "cache_key": keys.get(p, p.split(".")[0])}
        if pinned and p in up.files:
            a.update(size=len(up.files[p]), sha256=up.sha(p))
        arch.append(a)
    return bench_profile(
        "test_profile",
        {"repo_id": REPO, "repo_type": "dataset", "revision": REV},
        arch,
        expected={"cache_dirs": 2, "archives": 3},
        quarantined=[{"path": "bad_failure_set.tar", "reason": "known-bad"}],
    )


@pytest.fixture
def profile(upstream: Upstream) -> Profile:
    return parse_profile(profile_data(upstream))


@pytest.fixture
def hub(upstream: Upstream):
    with HubServer(upstream.folder, repo_id=REPO, revision=REV) as server:
        yield server


@pytest.fixture
def source(hub: HubServer) -> HubSource:
    return HubSource(REPO, "dataset", REV, endpoint=hub.url)


def spec_of(up: Upstream, path: str, **over: Any) -> ArchiveSpec:
    d: dict[str, Any] = {"path": path, "cache_key": "k", "size": len(up.files[path]), "sha256": up.sha(path)}
    d.update(over)
    return ArchiveSpec(**d)


def closed_port_endpoint() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# ----- source, listing, revision -----------------------------------------------------------------
def test_hubsource_repr_hides_token(profile: Profile) -> None:
    src = HubSource.from_profile(profile, endpoint="http://127.0.0.1:1", token="hf_SECRETtoken42")
    assert (src.repo_id, src.repo_type, src.revision) == (REPO, "dataset", REV)
    assert "hf_SECRETtoken42" not in repr(src)
    assert "hf_SECRETtoken42" not in str(src)
    assert src.api_endpoint == "http://127.0.0.1:1"
    with pytest.raises(ProfileError):
        HubSource(REPO, "bucket", REV)


def test_list_remote_files(source: HubSource, upstream: Upstream) -> None:
    files = list_remote_files(source)
    assert set(files) == set(upstream.files)
    for p, data in upstream.files.items():
        assert files[p] == RemoteFile(p, len(data), upstream.sha(p))


def test_check_revision(source: HubSource, hub: HubServer) -> None:
    assert check_revision(source) == REV
    with pytest.raises(HubError, match=f"resolves to commit {REV}") as ei:
        check_revision(HubSource(REPO, "dataset", "main", endpoint=hub.url))
    assert "never a pin" in str(ei.value)
    with pytest.raises(HubError, match=f"revision {OTHER_REV} of dataset repo {REPO} does not exist"):
        check_revision(HubSource(REPO, "dataset", OTHER_REV, endpoint=hub.url))
    with pytest.raises(HubError, match="org/nope not found"):
        list_remote_files(HubSource("org/nope", "dataset", REV, endpoint=hub.url))
    with pytest.raises(HubError, match="does not exist"):
        list_remote_files(HubSource(REPO, "dataset", OTHER_REV, endpoint=hub.url))


# ----- download ----------------------------------------------------------------------------------
def test_download_verifies_records_and_then_skips(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-aa"
    spec = spec_of(upstream, path)
    seen: list[int] = []
    res = download_archive(source, spec, tmp_path, progress=seen.append, **FAST)
    final = layout.archive_path(tmp_path, path)
    assert final.read_bytes() == upstream.files[path]
    assert (res.skipped, res.size, res.sha256, res.resumed_from) == (False, spec.size, spec.sha256, 0)
    assert res.bytes_downloaded == spec.size == sum(seen)
    assert res.local_path == final
    assert res.mb_per_s > 0
    rec = json.loads(layout.verified_record_path(tmp_path, path).read_text())
    st = final.stat()
    assert rec["path"] == path and rec["size"] == spec.size and rec["sha256"] == spec.sha256
    assert rec["mtime_ns"] == st.st_mtime_ns and rec["revision"] == REV and rec["verified_at"]
    assert (rec["inode"], rec["ctime_ns"]) == (st.st_ino, st.st_ctime_ns)
    assert not layout.partial_path(tmp_path, path).exists()
    assert archive_state(tmp_path, spec).state == "verified"
    assert [m for m, _ in hub.file_requests(path)] == ["HEAD", "GET"]

    hub.clear_log()
    again = download_archive(source, spec, tmp_path, **FAST)
    assert again.skipped and again.bytes_downloaded == 0 and again.sha256 == spec.sha256
    assert hub.log_snapshot() == []  # no request at all


def dropping_at(hub: HubServer, upstream: Upstream, path: str, offset: int) -> ArchiveSpec:
    """The spec of ``path``, which the hub now serves with the connection dropped at ``offset``."""
    hub.faults.drop_after[path] = offset
    return spec_of(upstream, path)


def test_dropped_connection_resumes_within_one_call(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "big_cache_key.tar"
    spec = dropping_at(hub, upstream, path, 12 * MiB)
    res = download_archive(source, spec, tmp_path, **FAST)
    assert layout.archive_path(tmp_path, path).read_bytes() == upstream.files[path]
    assert res.sha256 == spec.sha256 and not res.skipped
    gets = [rng for m, rng in hub.file_requests(path) if m == "GET"]
    assert gets[0] is None and len(gets) == 2
    assert gets[1] is not None and gets[1].startswith("bytes=")
    resumed_at = int(gets[1].split("=")[1].rstrip("-"))
    assert 0 < resumed_at <= 12 * MiB
    assert res.bytes_downloaded == spec.size  # the part before the drop plus the rest


def test_drop_then_503_resumes_in_our_retry_loop(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "big_cache_key.tar"
    spec = dropping_at(hub, upstream, path, 12 * MiB)

    def arm(n: int) -> None:  # once bytes flow, the client's own resume will meet a 503
        if not armed:
            armed.append(n)
            hub.faults.fail_first[path] = 1

    armed: list[int] = []
    res = download_archive(source, spec, tmp_path, progress=arm, **FAST)
    assert res.attempts == 2 and res.sha256 == spec.sha256
    gets = [rng for m, rng in hub.file_requests(path) if m == "GET"]
    assert gets[0] is None and gets[1] == gets[2] and gets[1] is not None and gets[1] != "bytes=0-"
    assert layout.archive_path(tmp_path, path).read_bytes() == upstream.files[path]


class Interrupted(Exception):
    pass


def interrupt_after(limit: int):
    seen = [0]

    def progress(n: int) -> None:
        seen[0] += n
        if seen[0] >= limit:
            raise Interrupted(f"stopped after {seen[0]} bytes")

    return progress


def test_resume_across_calls(source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path) -> None:
    path = "big_cache_key.tar"
    spec = spec_of(upstream, path)
    with pytest.raises(Interrupted):  # e.g. the process was stopped mid-download
        download_archive(source, spec, tmp_path, progress=interrupt_after(10 * MiB), **FAST)
    part = layout.partial_path(tmp_path, path)
    kept = part.stat().st_size
    assert 0 < kept < spec.size
    st = archive_state(tmp_path, spec)
    assert (st.state, st.bytes_local) == ("partial", kept)
    assert not layout.archive_path(tmp_path, path).exists()

    hub.clear_log()
    res = download_archive(source, spec, tmp_path, **FAST)
    assert res.resumed_from == kept
    assert res.bytes_downloaded == spec.size - kept < spec.size
    assert ("GET", f"bytes={kept}-") in hub.file_requests(path)
    assert layout.archive_path(tmp_path, path).read_bytes() == upstream.files[path]


def test_cancel_keeps_the_partial(source: HubSource, upstream: Upstream, tmp_path: Path) -> None:
    path = "big_cache_key.tar"
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled, match="partial file is kept"):
        download_archive(
            source, spec_of(upstream, path), tmp_path, progress=lambda n: cancel.set(), cancel=cancel, **FAST
        )
    assert layout.partial_path(tmp_path, path).stat().st_size > 0
    assert not layout.archive_path(tmp_path, path).exists()
    res = download_archive(source, spec_of(upstream, path), tmp_path, **FAST)
    assert res.resumed_from > 0 and res.sha256 == upstream.sha(path)


def test_resume_when_server_ignores_range(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "big_cache_key.tar"
    spec = spec_of(upstream, path)
    with pytest.raises(Interrupted):
        download_archive(source, spec, tmp_path, progress=interrupt_after(10 * MiB), **FAST)
    assert layout.partial_path(tmp_path, path).stat().st_size > 0
    hub.faults.ignore_range = True  # answers 200 + the whole body: the client must start over
    res = download_archive(source, spec, tmp_path, **FAST)
    assert res.sha256 == spec.sha256 and res.resumed_from == 0
    assert layout.archive_path(tmp_path, path).read_bytes() == upstream.files[path]


def test_transient_503_is_retried(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-ab"
    hub.faults.fail_first[path] = 2
    res = download_archive(source, spec_of(upstream, path), tmp_path, **FAST)
    assert res.attempts == 3 and res.sha256 == upstream.sha(path)
    hub.faults.fail_first[path] = 5
    layout.archive_path(tmp_path, path).unlink()
    with pytest.raises(HubError, match="HTTP 503") as ei:
        download_archive(source, spec_of(upstream, path), tmp_path, attempts=2, backoff=0.01)
    assert "gave up after 2 attempt(s)" in str(ei.value)


def failed_download(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path, fault: str, path: str, exc: type[E]
) -> E:
    """The ``exc`` raised by downloading ``path`` while the hub serves it with ``fault`` (a ``HubFaults`` set)."""
    getattr(hub.faults, fault).add(path)
    with pytest.raises(exc) as ei:
        download_archive(source, spec_of(upstream, path), tmp_path, **FAST)
    return ei.value


def test_corrupt_body_is_a_checksum_mismatch(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-aa"
    err = failed_download(source, hub, upstream, tmp_path, "corrupt", path, ChecksumMismatchError)
    bad = bytearray(upstream.files[path])
    bad[len(bad) // 2] ^= 0xFF
    assert err.path == path and err.expected == upstream.sha(path)
    assert err.actual == hashlib.sha256(bad).hexdigest()
    assert path in str(err) and err.expected in str(err) and err.actual in str(err)
    assert err.fix and "stage2 pin" in err.fix
    assert not layout.archive_path(tmp_path, path).exists()
    assert not layout.partial_path(tmp_path, path).exists()
    assert not layout.verified_record_path(tmp_path, path).exists()


def test_missing_file_names_the_file(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-ab"
    err = failed_download(source, hub, upstream, tmp_path, "missing", path, HubError)
    assert path in str(err) and "does not exist" in str(err) and REV in str(err)
    assert hub.file_requests(path) == [("HEAD", None)]  # a 404 is not retried
    # A path the upstream never had.
    with pytest.raises(HubError, match="nope.tar"):
        download_archive(
            source, ArchiveSpec(path="nope.tar", cache_key="k", size=3, sha256="0" * 64), tmp_path
        )


def test_wrong_revision_and_size(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-ab"
    spec = spec_of(upstream, path)
    with pytest.raises(HubError, match=f"revision {OTHER_REV}.*does not exist"):
        download_archive(HubSource(REPO, "dataset", OTHER_REV, endpoint=hub.url), spec, tmp_path, **FAST)
    hub.clear_log()
    with pytest.raises(ProfileError, match="not a full 40-hex commit"):
        download_archive(HubSource(REPO, "dataset", "main", endpoint=hub.url), spec, tmp_path, **FAST)
    assert hub.log_snapshot() == []
    with pytest.raises(PinDisagreesError, match=f"the pin size = {spec.size + 1} .* is wrong") as ei:
        download_archive(source, spec_of(upstream, path, size=spec.size + 1), tmp_path, **FAST)
    assert ei.value.keys == ["size"] and ei.value.upstream == (spec.size, spec.sha256)  # a bad profile
    assert [m for m, _ in hub.file_requests(path)] == ["HEAD"]  # refused before any GET
    assert not layout.partial_path(tmp_path, path).exists()


def test_never_requests_quarantined_unlisted_unpinned(
    source: HubSource, hub: HubServer, upstream: Upstream, profile: Profile, tmp_path: Path
) -> None:
    q = spec_of(upstream, "bad_failure_set.tar")
    with pytest.raises(ProfileError, match="quarantined"):
        download_archive(source, q, tmp_path, quarantined=profile.quarantined_paths())
    with pytest.raises(ProfileError, match="not listed"):
        download_archive(
            source, spec_of(upstream, "unlisted_other.tar"), tmp_path, listed=profile.archive_paths()
        )
    with pytest.raises(ProfileError, match="not pinned"):
        download_archive(source, ArchiveSpec(path="split_key.tar.part-aa", cache_key="split_key"), tmp_path)
    # A batch with one bad entry requests nothing at all.
    with pytest.raises(ProfileError, match="bad_failure_set.tar"):
        download_archives(
            source, [*profile.archives, q], tmp_path, quarantined=profile.quarantined_paths(), **FAST
        )
    assert hub.log_snapshot() == []
    assert not any(tmp_path.rglob("*.tar*"))


def test_reverify_and_unrecorded_files(
    source: HubSource, hub: HubServer, upstream: Upstream, tmp_path: Path
) -> None:
    path = "split_key.tar.part-aa"
    spec = spec_of(upstream, path)
    download_archive(source, spec, tmp_path, **FAST)
    final = layout.archive_path(tmp_path, path)
    record = layout.verified_record_path(tmp_path, path)

    # Reverify of a good file: re-hashed (a new record is written), nothing requested.
    hub.clear_log()
    ino = record.stat().st_ino
    res = download_archive(source, spec, tmp_path, reverify=True, **FAST)
    assert res.skipped and hub.log_snapshot() == []
    assert record.stat().st_ino != ino

    # Damage the file in place, keeping its size and mtime: its ctime moved, so the record no longer
    # matches: re-hashed, found wrong, moved to the quarantine folder (not deleted), downloaded again.
    st = final.stat()
    data = bytearray(final.read_bytes())
    data[1000] ^= 0x01
    final.write_bytes(bytes(data))
    os.utime(final, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert archive_state(tmp_path, spec).state == "unverified"
    res = download_archive(source, spec, tmp_path, **FAST)
    assert not res.skipped and res.bytes_downloaded == spec.size
    assert final.read_bytes() == upstream.files[path]
    assert res.moved_aside is not None and res.moved_aside.read_bytes() == bytes(data)
    assert res.moved_aside.is_relative_to(layout.quarantine_root(tmp_path))
    assert [q.original for q in quarantined_files(tmp_path)] == [f"archives/{path}"]
    # why, as moved.json and `stage2 list` say it: the file's bytes, not the pin, which the hub's
    # listing agrees with (QA, stop 56: "it disagreed with its pin" read as a typo in the pin)
    (why,) = {q.reason for q in quarantined_files(tmp_path)}
    got = hashlib.sha256(bytes(data)).hexdigest()
    assert why.startswith(f"its bytes ({spec.size} bytes, sha256 {got}) disagreed with its pin "), why
    assert why.endswith(", as the pin does: the local file's bytes are what changed"), why

    # A final file without a record is re-hashed, not downloaded again.
    record.unlink()
    assert archive_state(tmp_path, spec).state == "unverified"
    hub.clear_log()
    res = download_archive(source, spec, tmp_path, **FAST)
    assert res.skipped and hub.log_snapshot() == [] and record.exists()
    # A wrong final file without a record is moved aside, then downloaded again.
    record.unlink()
    final.write_bytes(b"x" * spec.size)  # type: ignore[operator]
    res = download_archive(source, spec, tmp_path, **FAST)
    assert not res.skipped and final.read_bytes() == upstream.files[path]
    assert res.moved_aside is not None and res.moved_aside.read_bytes() == b"x" * spec.size  # type: ignore[operator]
    assert len(quarantined_files(tmp_path)) == 2


def test_a_verified_file_a_new_revision_changed_is_said_so(tmp_path: Path) -> None:
    """A verified archive whose profile moved to another revision, where the hub has other bytes
    under the same path: moved aside and downloaded again, and its reason says the pin changed,
    not the file (it said "the local file's bytes are what changed" of a file nobody touched: QA)."""
    old, new = tmp_path / "at-old", tmp_path / "at-new"
    for folder, data in ((old, b"a" * 5000), (new, b"b" * 6000)):
        folder.mkdir()
        (folder / "k.tar").write_bytes(data)
    root = tmp_path / "root"
    specs = {}
    for folder, rev in ((old, REV), (new, OTHER_REV)):
        data = (folder / "k.tar").read_bytes()
        specs[rev] = ArchiveSpec(
            path="k.tar", cache_key="k", size=len(data), sha256=hashlib.sha256(data).hexdigest()
        )
        with HubServer(folder, repo_id=REPO, revision=rev) as server:
            res = download_archive(
                HubSource(REPO, "dataset", rev, endpoint=server.url), specs[rev], root, **FAST
            )
        assert layout.archive_path(root, "k.tar").read_bytes() == data
    assert res.moved_aside is not None and res.moved_aside.read_bytes() == b"a" * 5000
    (why,) = {q.reason for q in quarantined_files(root)}
    assert why.endswith(
        ", as the pin does: the file was verified against another pin (its record says the same sha256), "
        "so the pin changed (another profile or revision), not the file"
    ), why


def test_a_pin_typo_is_refused_by_name_and_the_verified_file_kept(
    source: HubSource,
    hub: HubServer,
    upstream: Upstream,
    profile: Profile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = "split_key.tar.part-ab"
    spec = profile.archive(path)
    download_archive(source, spec, tmp_path, **FAST)
    final = layout.archive_path(tmp_path, path)
    prof_file = tmp_path / "profile.toml"
    typo = spec.sha256[:-1] + ("0" if spec.sha256[-1] != "0" else "1")  # type: ignore[index]
    bad = profile.model_copy(
        update={
            "archives": [
                a.model_copy(update={"sha256": typo}) if a.path == path else a for a in profile.archives
            ],
            "profile_path": prof_file,
        }
    )
    hub.clear_log()
    with pytest.raises(PinDisagreesError) as ei:
        download_archive(source, bad.archive(path), tmp_path, profile=bad, **FAST)
    msg = str(ei.value)
    index = [a.path for a in profile.archives].index(path)
    assert f'{prof_file}: archives[{index}].sha256 = "{typo}"' in msg, msg
    assert f'archives[{index}].sha256 = "{spec.sha256}"' in ei.value.fix, ei.value.fix  # type: ignore[operator]
    assert ei.value.keys == ["sha256"] and "left where it is" in msg
    assert final.read_bytes() == upstream.files[path]  # kept, byte-identical
    assert not layout.quarantine_root(tmp_path).exists()
    assert [m for m, _ in hub.file_requests(path)] == []  # nothing downloaded

    # Offline: the same typo moves the file aside (never deleted) and says where.
    hub.clear_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set") as oi:
        download_archive(source, bad.archive(path), tmp_path, profile=bad, **FAST)
    (moved,) = [q.path for q in quarantined_files(tmp_path)]
    assert f"moved to {moved}" in str(oi.value) and moved.read_bytes() == upstream.files[path]
    assert not final.exists() and hub.log_snapshot() == []


def test_download_archives_gathers_failures(
    source: HubSource, hub: HubServer, upstream: Upstream, profile: Profile, tmp_path: Path
) -> None:
    hub.faults.missing.add("split_key.tar.part-ab")
    hub.faults.corrupt.add("split_key.tar.part-aa")
    with pytest.raises(DownloadsFailedError) as ei:
        download_archives(source, profile.archives, tmp_path, workers=3, **FAST)
    err = ei.value
    assert isinstance(err, HubError)
    assert set(err.errors) == {"split_key.tar.part-ab", "split_key.tar.part-aa"}
    assert isinstance(err.errors["split_key.tar.part-aa"], ChecksumMismatchError)
    assert "split_key.tar.part-ab" in str(err) and "split_key.tar.part-aa" in str(err)
    assert [r.path for r in err.results] == ["big_cache_key.tar"]
    hub.faults.missing.clear()
    hub.faults.corrupt.clear()
    total: list[int] = []
    results = download_archives(source, profile.archives, tmp_path, progress=total.append, **FAST)
    assert [r.path for r in results] == [a.path for a in profile.archives]
    assert results[0].skipped and not results[1].skipped
    assert sum(total) == sum(r.bytes_downloaded for r in results)
    assert all(archive_state(tmp_path, a).state == "verified" for a in profile.archives)


def test_downloads_start_largest_first(
    source: HubSource, hub: HubServer, upstream: Upstream, profile: Profile, tmp_path: Path
) -> None:
    """One worker shows the order: the largest remainder first (a partial file counts for what is
    left), and the results in the order asked."""
    specs = list(profile.archives)  # big (24 MiB), part-aa (2 MiB), part-ab (1 MiB)
    part = layout.partial_path(tmp_path, "big_cache_key.tar")
    part.parent.mkdir(parents=True)
    part.write_bytes(upstream.files["big_cache_key.tar"][: 23 * MiB])  # 1 MiB + 123 bytes left
    results = download_archives(source, specs, tmp_path, workers=1, **FAST)
    gets = [p.rpartition(f"/{REV}/")[2] for m, p, _ in hub.log_snapshot() if m == "GET" and "/resolve/" in p]
    assert gets == ["split_key.tar.part-aa", "big_cache_key.tar", "split_key.tar.part-ab"]
    assert [r.path for r in results] == [a.path for a in specs]
    assert profile.archive_paths_largest_first() == [
        "big_cache_key.tar",
        "split_key.tar.part-aa",
        "split_key.tar.part-ab",
    ]
    assert profile.cache_keys_largest_first() == ["big_cache_key", "split_key"]


def test_download_profile(source: HubSource, upstream: Upstream, profile: Profile, tmp_path: Path) -> None:
    results = download_profile(profile, source, tmp_path, **FAST)
    assert len(results) == 3 and all(r.sha256 == upstream.sha(r.path) for r in results)
    assert not layout.archive_path(tmp_path, "bad_failure_set.tar").exists()
    with pytest.raises(ProfileError, match="not the profile's"):
        download_profile(profile, HubSource(REPO, "dataset", OTHER_REV, endpoint=source.endpoint), tmp_path)


# ----- local state and disk ----------------------------------------------------------------------
def test_archive_state_and_required_free_bytes(
    source: HubSource, upstream: Upstream, profile: Profile, tmp_path: Path
) -> None:
    total = profile.total_archive_bytes()
    assert {archive_state(tmp_path, a).state for a in profile.archives} == {"missing"}
    assert required_free_bytes(profile, tmp_path) == total + int(
        len(upstream.files["big_cache_key.tar"]) * 1.15
    ) + int(
        (len(upstream.files["split_key.tar.part-aa"]) + len(upstream.files["split_key.tar.part-ab"])) * 1.15
    )
    big = profile.archive("big_cache_key.tar")
    download_archive(source, big, tmp_path, **FAST)
    st = archive_state(tmp_path, big)
    assert (st.state, st.bytes_local, st.size, st.sha256) == ("verified", big.size, big.size, big.sha256)
    split_bytes = total - (big.size or 0)
    expected = split_bytes + int((big.size or 0) * EXTRACTION_FACTOR) + int(split_bytes * EXTRACTION_FACTOR)
    assert required_free_bytes(profile, tmp_path) == expected
    # A folder and a record a build cannot read: the build extracts the key again, so it still
    # counts (the extraction a build keeps is tests/test_acquire_cli.py's)
    layout.cache_dir(tmp_path, "big_cache_key").mkdir(parents=True)
    layout.extraction_record_path(tmp_path, "big_cache_key").parent.mkdir(parents=True)
    layout.extraction_record_path(tmp_path, "big_cache_key").write_text("{}")
    assert required_free_bytes(profile, tmp_path) == expected
    # A partial download counts only what is left.
    part = layout.partial_path(tmp_path, "split_key.tar.part-aa")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(b"\0" * 1000)
    assert archive_state(tmp_path, profile.archive("split_key.tar.part-aa")).state == "partial"
    assert required_free_bytes(profile, tmp_path) == expected - 1000


# ----- pin ---------------------------------------------------------------------------------------
def test_pin_fills_an_unpinned_profile(source: HubSource, upstream: Upstream) -> None:
    unpinned = parse_profile(profile_data(upstream, pinned=False))
    assert len(unpinned.unpinned()) == 3
    pinned, changes = pin_profile(unpinned, source)
    assert pinned.unpinned() == []
    for a in pinned.archives:
        assert (a.size, a.sha256) == (len(upstream.files[a.path]), upstream.sha(a.path))
    assert len(changes) == 3 and all("pinned" in c for c in changes)
    # Round trip through TOML, and pinning a pinned profile changes nothing.
    import tomllib

    again = parse_profile(tomllib.loads(pinned.to_toml()))
    assert again.archives == pinned.archives
    assert pin_profile(again, source)[1] == []


def test_pin_refuses_with_every_problem(source: HubSource, hub: HubServer, upstream: Upstream) -> None:
    data = profile_data(upstream, archives=["big_cache_key.tar", "split_key.tar.part-aa", "gone.tar"])
    data["archives"][1]["size"] += 1
    prof = parse_profile(data)
    with pytest.raises(PinError) as ei:
        pin_profile(prof, source)
    err = ei.value
    assert isinstance(err, ProfileError)
    assert len(err.problems) == 2
    assert any("gone.tar" in p and "not found upstream" in p for p in err.problems)
    assert any("split_key.tar.part-aa" in p and "size" in p for p in err.problems)

    data = profile_data(upstream, pinned=False)
    data["archives"][0]["sha256"] = "0" * 64
    with pytest.raises(PinError, match="sha256 0{64} in the profile"):
        pin_profile(parse_profile(data), source)


def test_pin_refuses_quarantined_active_and_bad_revision(
    source: HubSource, hub: HubServer, upstream: Upstream, profile: Profile
) -> None:
    # The model refuses this combination; build it past validation to check pin's own check.
    bad = profile.model_copy(update={"quarantined": [QuarantinedSpec(path="split_key.tar", reason="x")]})
    hub.clear_log()
    with pytest.raises(PinError, match="quarantined, yet listed under"):
        pin_profile(bad, source)
    assert hub.log_snapshot() == []
    with pytest.raises(ProfileError, match="not a full 40-hex commit"):
        pin_profile(profile, HubSource(REPO, "dataset", "main", endpoint=hub.url))
    other = parse_profile({**profile_data(upstream), "source": {"repo_id": REPO, "revision": OTHER_REV}})
    with pytest.raises(HubError, match="does not exist"):
        pin_profile(other, HubSource(REPO, "dataset", OTHER_REV, endpoint=hub.url))


# ----- secrets and reachability ------------------------------------------------------------------
def test_token_never_leaks(upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = "hf_TopSecretToken0123456789"
    caplog.set_level(logging.DEBUG)
    with HubServer(upstream.folder, repo_id=REPO, revision=REV, token=secret) as server:
        good = HubSource(REPO, "dataset", REV, endpoint=server.url, token=secret)
        path = "split_key.tar.part-ab"
        server.faults.fail_first[path] = 1
        res = download_archive(good, spec_of(upstream, path), tmp_path, **FAST)
        assert res.sha256 == upstream.sha(path)
        assert secret not in layout.verified_record_path(tmp_path, path).read_text()
        wrong = HubSource(REPO, "dataset", REV, endpoint=server.url, token=secret[::-1])
        texts = [repr(good), str(good), repr(wrong)]
        for call in (
            lambda: list_remote_files(wrong),
            lambda: download_archive(wrong, spec_of(upstream, "split_key.tar.part-aa"), tmp_path, **FAST),
            lambda: download_archives(wrong, [spec_of(upstream, "big_cache_key.tar")], tmp_path, **FAST),
        ):
            with pytest.raises(HubError) as ei:
                call()
            texts += [str(ei.value), repr(ei.value), str(ei.value.fix)]
            assert "401" in str(ei.value) or "not found" in str(ei.value)
        anonymous = HubSource(REPO, "dataset", REV, endpoint=server.url, token=None)
        with pytest.raises(HubError, match="private"):
            check_revision(anonymous)
    for text in [*texts, caplog.text]:
        assert secret not in text and secret[::-1] not in text


def test_hub_unreachable_names_the_endpoint(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """That it also fails quickly is measured in bench/ (bench_acquire.hub_unreachable_vs_curl). The
    default policy's 5 attempts, with short waits (its real 1, 2, 4, 8 s schedule:
    test_acquire_network.py::test_the_default_policy_waits_1_2_4_8_s)."""
    monkeypatch.setenv(BACKOFF_ENV, "0.05")
    endpoint = closed_port_endpoint()
    src = HubSource(REPO, "dataset", REV, endpoint=endpoint)
    with pytest.raises(HubError) as ei:
        list_remote_files(src)
    assert endpoint in str(ei.value) and "unreachable" in str(ei.value)
    with pytest.raises(HubError) as ei:
        download_archive(src, spec_of(upstream, "split_key.tar.part-ab"), tmp_path, attempts=2, backoff=0.01)
    assert endpoint in str(ei.value) and "unreachable" in str(ei.value)
    assert ei.value.fix and "endpoint" in ei.value.fix


# ----- resumes at any offset -----------------------------------------------------------------------
def test_resume_from_an_unaligned_partial_and_drop(
    source: HubSource,
    hub: HubServer,
    upstream: Upstream,
    tmp_path: Path,
) -> None:
    path = "big_cache_key.tar"
    spec = dropping_at(hub, upstream, path, 3 * MiB + 1)  # the connection drops again, at an unaligned offset
    part = layout.partial_path(tmp_path, path)
    part.parent.mkdir(parents=True)
    kept = 5 * MiB + 777  # not a multiple of a block or a page
    part.write_bytes(upstream.files[path][:kept])
    res = download_archive(source, spec, tmp_path, **FAST)
    assert res.resumed_from == kept and res.sha256 == spec.sha256
    assert layout.archive_path(tmp_path, path).read_bytes() == upstream.files[path]
    gets = [rng for m, rng in hub.file_requests(path) if m == "GET"]
    assert gets[0] == f"bytes={kept}-" and len(gets) == 2


def test_a_cache_key_offline_names_each_missing_part_and_its_fix_once(
    source: HubSource, hub: HubServer, profile: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both parts of a split archive missing offline: the cache key's one error names each part and
    says their shared fix once, at its end."""
    from stage2_data.steps.acquire import step_download_cache_dir

    parts = ["split_key.tar.part-aa", "split_key.tar.part-ab"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as ei:
        step_download_cache_dir(profile, source, tmp_path, profile.archive(parts[0]).cache_key)
    text = str(ei.value)
    assert all(str(layout.archive_path(tmp_path, p)) in text for p in parts), text
    assert text.count("Fix:") == 1 and "fix:" not in text, text
    assert text.rstrip().endswith("re-run") and text.count("nothing was requested") == 2, text
    assert hub.log_snapshot() == []


def test_what_was_moved_aside_is_listed_one_item_per_move_even_after_the_data_root_moved(
    tmp_path: Path,
) -> None:
    """`stage2 list` and `gc --quarantine` show one item per thing moved aside: a store's folder is
    one item with all its files, read from the quarantine folder's moved.json even after the data
    root itself was moved elsewhere; a file that no moved.json names is an item of its own."""
    from stage2_data.publish.quarantine import moved_items, quarantine_files

    root = tmp_path / "root"
    store = root / "stores" / "p" / "v2-abc"
    for rel in ("manifest.json", "shards/shard-000000/zarr.json", "shards/shard-000000/frames/c/0"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_bytes(b"x" * 10)
    archive = layout.archive_path(root, "a.tar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"y" * 7)
    quarantine_files(root, [store], "failed the publication gate")
    quarantine_files(root, [archive], "disagreed with its pin")
    moved = tmp_path / "elsewhere"
    root.rename(moved)  # the data root moved: moved.json still names the old paths
    stray = layout.quarantine_root(moved) / "by-hand" / "notes.txt"  # no moved.json
    stray.parent.mkdir()
    stray.write_text("mine")
    items = moved_items(quarantined_files(moved), moved)
    assert [(i.original, i.is_dir, i.files, i.size, i.reason) for i in items] == [
        ("stores/p/v2-abc", True, 3, 30, "failed the publication gate"),
        ("archives/a.tar", False, 1, 7, "disagreed with its pin"),
        ("notes.txt", False, 1, 4, ""),  # in the folder "by-hand", which sorts after the UTC times
    ], items
    assert items[0].path == layout.quarantine_root(moved) / items[0].folder / "stores/p/v2-abc"
