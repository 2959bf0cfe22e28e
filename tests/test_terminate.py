"""A stop's cancel (``launch.terminate_runs``) against a real instance and a real run: a run whose
steps have all ended is let end by itself (Dagster's Terminate would mark it canceling, and a success
recorded just after that is lost: the run is failed), a run with a step still going is canceled."""

# no `from __future__ import annotations`: Dagster checks an op's context hint as a class
import threading
import time
from collections.abc import Iterator

import dagster as dg
import pytest

from stage2_pipelines.launch import terminate_runs

# the run's one step ends at once; its resource's teardown (after every step) waits for this
TEARDOWN = threading.Event()
# the step waits for this
STEP = threading.Event()


@dg.resource
def slow_teardown(_context: dg.InitResourceContext) -> Iterator[None]:
    yield None
    TEARDOWN.wait(30)


@dg.op(required_resource_keys={"slow_teardown"})
def quick(context: dg.OpExecutionContext) -> None:
    del context


@dg.op
def waits() -> None:
    STEP.wait(30)


@dg.job(resource_defs={"slow_teardown": slow_teardown})
def ends_slowly() -> None:
    quick()


@dg.job
def step_goes_on() -> None:
    waits()


def _start(job: dg.JobDefinition, instance: dg.DagsterInstance) -> tuple[threading.Thread, str]:
    """Execute ``job`` in a thread; its run's id once its first step has started."""
    before = {r.run_id for r in instance.get_runs()}
    thread = threading.Thread(target=lambda: job.execute_in_process(instance=instance, raise_on_error=False))
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for run in instance.get_runs():
            if run.run_id not in before and instance.get_run_step_stats(run.run_id):
                return thread, run.run_id
        time.sleep(0.05)
    raise AssertionError(f"{job.name} did not start a step within 30 s")


def _events(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [
        e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event is not None
    ]


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    TEARDOWN.clear()
    STEP.clear()
    with dg.instance_for_test() as instance:
        yield instance
    TEARDOWN.set()
    STEP.set()


def test_a_run_whose_steps_have_ended_is_let_end(instance: dg.DagsterInstance) -> None:
    thread, run_id = _start(ends_slowly, instance)
    deadline = time.monotonic() + 30
    while not all(s.end_time for s in instance.get_run_step_stats(run_id)):
        assert time.monotonic() < deadline, "the step did not end within 30 s"
        time.sleep(0.05)
    threading.Timer(1.0, TEARDOWN.set).start()
    terminate_runs(instance, [run_id], wait_s=10.0)
    thread.join(30)
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS, run
    assert "PIPELINE_CANCELING" not in _events(instance, run_id), _events(instance, run_id)


def test_a_run_whose_step_goes_on_is_canceled(instance: dg.DagsterInstance) -> None:
    thread, run_id = _start(step_goes_on, instance)
    t0 = time.monotonic()
    # an in-process run cannot be interrupted from here: the cancel is asked at once, and the run,
    # still not ended when the wait is over, is recorded as canceled
    terminate_runs(instance, [run_id], wait_s=1.0)
    assert time.monotonic() - t0 < 10
    events = _events(instance, run_id)
    assert "PIPELINE_CANCELING" in events, events
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.CANCELED, run
    STEP.set()
    thread.join(30)
