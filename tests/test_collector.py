"""The garbage collector's policy of the kit stage's child process (stage2_data/collector.py, applied
by pipelines/beside.py): paused while it imports, what the imports built frozen, back on after; a
process that does not own it is left alone. Each case runs in a fresh interpreter: it is process-wide."""

from __future__ import annotations

import textwrap

from helpers.cli import python, subprocess_env


def _python(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; what it printed last, as JSON."""
    return dict(python(textwrap.dedent(code), env=subprocess_env()).last_json())


def test_a_process_that_does_not_own_the_collector_is_left_alone() -> None:
    got = _python(
        """
        import gc, json
        from stage2_data import collector
        with collector.paused():
            inside = gc.isenabled()
            import decimal  # something to build
        print(json.dumps({"inside": inside, "after": gc.isenabled(), "frozen": gc.get_freeze_count()}))
        """
    )
    assert got == {"inside": True, "after": True, "frozen": 0}


def test_owned_the_collector_is_off_until_the_last_overlapping_stretch_ends_then_freezes() -> None:
    got = _python(
        """
        import gc, json, threading
        from stage2_data import collector
        collector.own()
        seen = {"owned": gc.isenabled()}
        entered, release = threading.Event(), threading.Event()
        def other():  # a second stretch on a thread (the build's pandas import)
            with collector.paused():
                entered.set()
                release.wait()
        t = threading.Thread(target=other)
        t.start()
        entered.wait()
        with collector.paused():
            import decimal, fractions
            seen["inside"] = gc.isenabled()
        seen["main_ended"] = gc.isenabled()  # the thread's stretch still open
        seen["frozen_early"] = gc.get_freeze_count()
        release.set()
        t.join()
        seen["after"] = gc.isenabled()
        seen["frozen"] = gc.get_freeze_count()
        class Cycle:
            pass
        c = Cycle(); c.me = c; del c  # built later: collected as usual
        seen["collected"] = gc.collect()
        print(json.dumps(seen))
        """
    )
    assert got["owned"] is False and got["inside"] is False and got["main_ended"] is False
    assert got["frozen_early"] == 0  # nothing frozen while a stretch is open
    assert got["after"] is True
    assert (
        isinstance(got["frozen"], int) and got["frozen"] > 1_000
    )  # the interpreter's and the imports' objects
    assert isinstance(got["collected"], int) and got["collected"] >= 1
