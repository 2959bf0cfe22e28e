"""The stage table (stage2_data.stages) and the build's walk over it (runner.walk_stages): what each
stage needs, what a failure holds back, and the kit stage running beside the main line; and when a
launched build starts its streamed runs (runner.stream_runs)."""

from __future__ import annotations

import threading
import time

import pytest

from stage2_data.profile import Profile, load_profile
from stage2_data.stages import (
    ACQUIRE,
    EXTRACT,
    KIT,
    PROFILE,
    STAGES,
    STORE,
    Stage,
    needs,
    ready_stages,
    stage_partitions,
    stages_after,
    stream_groups,
)
from stage2_pipelines.runner import stream_runs, walk_stages


def test_every_stage_comes_after_the_stages_it_needs() -> None:
    names = [s.name for s in STAGES]
    for i, s in enumerate(STAGES):
        assert set(s.after) <= set(names[:i]), s.name
    assert needs(STORE) == {"profile", "acquire", "kit", "extract"}
    assert needs(KIT) == {"profile"} and needs(PROFILE) == set()
    assert stages_after(PROFILE) == [ACQUIRE, KIT] and stages_after(STORE) == []
    assert ready_stages([]) == [PROFILE]
    assert ready_stages(["profile"], ["profile"]) == [ACQUIRE, KIT]
    assert ready_stages(["profile", "acquire"], ["profile", "acquire", "kit"]) == [EXTRACT]
    assert ready_stages(["profile", "acquire", "extract"], ["profile", "acquire", "kit", "extract"]) == []
    assert ready_stages(["profile", "acquire", "kit", "extract"], names[:4]) == [STORE]


def test_a_failure_holds_back_only_what_needs_it(demo_cache) -> None:
    prof: Profile = load_profile(demo_cache.profile)
    bad = prof.cache_keys()[0]  # the acquire stage's partitions are cache keys (their archives)
    failed: list[tuple[Stage, str | None]] = [(ACQUIRE, bad)]
    assert stage_partitions(KIT, prof, failed) == [None]  # the kit needs no archive
    assert stage_partitions(EXTRACT, prof, failed) == [k for k in prof.cache_keys_largest_first() if k != bad]
    assert stage_partitions(STORE, prof, failed) == []
    assert stage_partitions(EXTRACT, prof, [(KIT, None)]) == prof.cache_keys_largest_first()
    assert stage_partitions(STORE, prof, [(KIT, None)]) == []


def test_the_kit_stage_runs_beside_the_main_line() -> None:
    """The acquire stage's run waits (up to 10 s) for the kit stage to start: it can only pass if the
    kit runs at the same time, in another thread; the store starts after both the kit and the
    extraction are over; the main line stays in the calling thread. (A build's kit run is a process:
    its thread only waits for it; test_pipeline checks the runs' times.)"""
    kit_started = threading.Event()
    seen: dict[str, tuple[str, float, float]] = {}
    lock = threading.Lock()

    def run(stage: Stage) -> None:
        t0 = time.monotonic()
        if stage is KIT:
            kit_started.set()
            time.sleep(0.3)  # still running while the main line goes on
        if stage is ACQUIRE:
            assert kit_started.wait(10), "the kit stage did not start beside the acquire stage"
        with lock:
            seen[stage.name] = (threading.current_thread().name, t0, time.monotonic())

    walk_stages(run, beside={"kit"})
    main = threading.current_thread().name
    assert set(seen) == {s.name for s in STAGES}
    assert {n for n, (thread, _, _) in seen.items() if thread == main} == {
        "profile",
        "acquire",
        "extract",
        "store",
    }
    assert seen["kit"][0] != main
    assert seen["store"][1] >= max(seen["kit"][2], seen["extract"][2])


def test_one_after_another_with_nothing_beside() -> None:
    order: list[tuple[str, str]] = []
    walk_stages(lambda s: order.append((s.name, threading.current_thread().name)))
    assert [n for n, _ in order] == [s.name for s in STAGES]
    assert {t for _, t in order} == {threading.current_thread().name}


def test_an_error_in_a_stage_beside_reaches_the_caller() -> None:
    def run(stage: Stage) -> None:
        if stage is KIT:
            raise RuntimeError("kit stage broke")

    with pytest.raises(RuntimeError, match="kit stage broke"):
        walk_stages(run, beside={"kit"})


def test_streamed_runs_are_whole_ranges_of_at_least_the_bytes_asked(demo_cache) -> None:
    """A launched build's streamed runs (``stream_groups``): every cache key once; each run a whole
    range of consecutive partitions holding at least the bytes asked unless it is the last of its
    range; a key left out (its upstream failed) ends a range; the run with most bytes first."""
    prof: Profile = load_profile(demo_cache.profile)
    order = prof.cache_keys()
    by_key = prof.archives_by_cache_key()

    def size(group: list[str]) -> int:
        return sum(a.size or 0 for k in group for a in by_key[k])

    keys = prof.cache_keys_largest_first()
    assert stream_groups(prof, keys, 1 << 40) == [order]  # far more than every archive: one run
    assert sorted(stream_groups(prof, keys, 0)) == [[k] for k in order]  # nothing: a run per key
    left_out = order[len(order) // 2]
    for least in (1, 2_000_000, 3_000_000, 5_000_000):
        groups = stream_groups(prof, [k for k in keys if k != left_out], least)
        assert sorted(k for g in groups for k in g) == sorted(set(order) - {left_out})
        for g in groups:
            first = order.index(g[0])
            assert g == order[first : first + len(g)], g  # consecutive: a whole range
            assert left_out not in g
            whole = size(g) >= least
            last_of_range = first + len(g) == len(order) or order[first + len(g)] == left_out
            assert whole or last_of_range, (least, g)
            assert size(g[:-1]) < least, (least, g)  # it ends as soon as it holds enough
        assert [size(g) for g in groups] == sorted((size(g) for g in groups), reverse=True)


def test_the_next_streamed_run_starts_once_a_runs_downloads_are_over() -> None:
    """Two slots. The first run says its downloads are over, then both it and the second (still
    downloading) wait, up to 10 s each, for the third run to start: that can only pass if the third
    run starts once the first run's downloads are over, while it still extracts, not once a run has
    ended. Each run's result is recorded as it ends."""
    third_started = threading.Event()
    recorded: list[str] = []

    def run(keys: list[str], downloaded) -> dict:
        if keys == ["a"]:
            downloaded()
        if keys != ["c"]:
            assert third_started.wait(10), f"run {keys} waited 10 s for the third run to start"
        else:
            third_started.set()
        return {"keys": keys}

    stream_runs([["a"], ["b"], ["c"]], 2, run, lambda r: recorded.append(r["keys"][0]), poll=0.05)
    assert sorted(recorded) == ["a", "b", "c"]


def test_streamed_runs_downloading_at_once_never_exceed_the_slots() -> None:
    """Six runs, two slots: at no time do more than two runs download (a run downloads until it
    says so or ends; half of them never say so), and every run starts in the groups' order."""
    lock = threading.Lock()
    downloading: set[str] = set()
    most = 0
    starts: list[str] = []

    def run(keys: list[str], downloaded) -> dict:
        nonlocal most
        key = keys[0]
        with lock:
            starts.append(key)
            downloading.add(key)
            most = max(most, len(downloading))
        time.sleep(0.05)
        with lock:
            downloading.discard(key)
        if key in "ace":
            downloaded()
            time.sleep(0.1)  # extracting: no longer downloading
        return {"keys": keys}

    groups = [[k] for k in "abcdef"]
    done: list[str] = []
    stream_runs(groups, 2, run, lambda r: done.append(r["keys"][0]), poll=0.01)
    assert most == 2 and starts == list("abcdef") and sorted(done) == list("abcdef")


def test_a_streamed_runs_error_reaches_the_caller() -> None:
    def run(keys: list[str], downloaded) -> dict:
        if keys == ["b"]:
            raise RuntimeError("run b broke")
        return {"keys": keys}

    with pytest.raises(RuntimeError, match="run b broke"):
        stream_runs([["a"], ["b"], ["c"]], 2, run, lambda r: None, poll=0.01)
