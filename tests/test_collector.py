"""The garbage collector's policy of a ``stage2`` process (stage2_data/collector.py): paused while it
imports, what the imports built frozen, back on after; a process that is not the executable is left
alone; and OpenBLAS kept to one thread. Each case runs in a fresh interpreter: both are process-wide."""

from __future__ import annotations

import textwrap

import pytest
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


def test_the_stage2_executable_owns_it_and_turns_it_back_on() -> None:
    """Through ``cli.run`` (the console script): a command's end finds the collector on, with its
    start-up's objects frozen."""
    got = _python(
        """
        import atexit, gc, json, sys
        from stage2_data import cli
        atexit.register(lambda: print(json.dumps({"on": gc.isenabled(), "frozen": gc.get_freeze_count()})))
        cli.run(["validate", "--help"])
        """
    )
    assert got["on"] is True
    assert isinstance(got["frozen"], int) and got["frozen"] > 10_000


@pytest.mark.parametrize(("given", "want"), [(None, "1"), ("4", "4")])
def test_the_stage2_executable_keeps_openblas_to_one_thread_unless_told(given: str | None, want: str) -> None:
    """No command does linear algebra: OpenBLAS's spinning thread per core is not started (the
    build's helper processes inherit it); a user's own OPENBLAS_NUM_THREADS wins."""
    env = subprocess_env(drop=["OPENBLAS_NUM_THREADS"], **({"OPENBLAS_NUM_THREADS": given} if given else {}))
    code = (
        "import atexit, json, os\n"
        "from stage2_data import cli\n"
        "atexit.register(lambda: print(json.dumps(os.environ.get('OPENBLAS_NUM_THREADS'))))\n"
        "cli.run(['validate', '--help'])"
    )
    assert python(code, env=env).last_json() == want
