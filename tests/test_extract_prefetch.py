"""The archive prefetcher (stage2_data/extract/prefetch.py): archives are asked into the page cache in
extraction order, never more than its budget ahead of the extractions that finished, only for cache
dirs that will be extracted, and its thread stops with the stage."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from stage2_data.extract.prefetch import Prefetcher, prefetch_budget
from stage2_data.profile import load_profile
from stage2_data.steps import archives_to_extract


def _files(tmp: Path, sizes: dict[str, int]) -> list[tuple[str, list[Path]]]:
    out = []
    for key, size in sizes.items():
        p = tmp / f"{key}.tar"
        p.write_bytes(os.urandom(size))
        out.append((key, [p]))
    return out


def _wait(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_prefetch_runs_ahead_in_order_within_its_budget(tmp_path: Path) -> None:
    groups = _files(tmp_path, {"a": 3000, "b": 3000, "c": 3000, "d": 100})
    with Prefetcher(groups, budget=6500) as pf:
        assert _wait(lambda: pf.prefetched == ["a", "b"])
        time.sleep(0.2)
        assert pf.prefetched == ["a", "b"]  # "c" would pass the budget while a and b are ahead
        pf.done("a")
        assert _wait(lambda: pf.prefetched == ["a", "b", "c", "d"])


def test_a_group_bigger_than_the_budget_still_goes_when_nothing_is_ahead(tmp_path: Path) -> None:
    groups = _files(tmp_path, {"big": 5000, "next": 10})
    with Prefetcher(groups, budget=1000) as pf:
        assert _wait(lambda: pf.prefetched == ["big"])
        pf.done("big")
        assert _wait(lambda: pf.prefetched == ["big", "next"])


def test_prefetch_stops_with_the_stage_and_skips_what_is_done(tmp_path: Path) -> None:
    groups = _files(tmp_path, {"a": 3000, "b": 3000, "c": 3000})
    pf = Prefetcher(groups, budget=3500)
    with pf:
        assert _wait(lambda: pf.prefetched == ["a"])
        pf.done("b")  # extracted before its turn (another worker): never asked for
        pf.done("a")
        assert _wait(lambda: pf.prefetched == ["a", "c"])
    assert pf._thread is not None and not pf._thread.is_alive()
    with Prefetcher(groups, budget=1) as blocked:  # stopped while it waits for room
        assert _wait(lambda: blocked.prefetched == ["a"])
    assert blocked._thread is not None and not blocked._thread.is_alive()
    assert prefetch_budget() > 0


@pytest.mark.skipif(shutil.which("fincore") is None, reason="fincore (util-linux) shows the page cache")
def test_prefetched_archives_are_in_the_page_cache(tmp_path: Path) -> None:
    groups = _files(tmp_path, {"a": 8 << 20})
    path = groups[0][1][0]
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache (clean pages)
    os.close(fd)

    def cached() -> int:
        out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)], capture_output=True, text=True)
        return int(out.stdout.split()[0])

    assert cached() < (8 << 20)
    with Prefetcher(groups, budget=1 << 30) as pf:
        assert _wait(lambda: pf.prefetched == ["a"])
        assert _wait(lambda: cached() == 8 << 20)


def test_only_cache_dirs_to_extract_are_prefetched(built: dict, demo_cache: object, tmp_path: Path) -> None:
    from stage2_data import layout

    prof = load_profile(demo_cache.profile)  # type: ignore[attr-defined]
    keys = list(prof.archives_by_cache_key())
    assert archives_to_extract(prof, built["root"], keys) == []  # all up to date: nothing is read
    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True)
    layout.extraction_record_path(root, keys[0]).unlink()  # this one must be extracted again
    assert archives_to_extract(prof, root, keys) == [
        (keys[0], [layout.archive_path(root, a.path) for a in prof.archives_by_cache_key()[keys[0]]])
    ]
