"""Where a build's steps execute: Dagster's own executors, chosen by ``BuildConfig.executor``.

- ``in_process`` (default): every step in the run's own process.
- ``multiprocess``: Dagster's multiprocess executor, one child process per step.
- ``dask``: the dagster-dask executor on a ``dask.distributed`` cluster, one Dask task per step.
  ``BuildConfig.dask_address`` names the scheduler (``tcp://host:8786``); without it ``build_all``
  starts a ``LocalCluster`` of worker processes on 127.0.0.1 for the duration of the build.
- ``k8s``: dagster-k8s ``k8s_job_executor``, one Kubernetes Job (pod) per step, configured from
  ``STAGE2_K8S_EXECUTOR_CONFIG`` (default: ``deploy/k8s/executor.yaml`` as shipped in the package,
  ``stage2_deploy``); for runs launched in a cluster by the daemon or the UI, not by
  ``stage2 build`` on a workstation.

A stage is one run of its named job whatever the executor (``stage2 build`` and the UI's
single-run backfills alike): a partitioned stage is one step over its partition range, which works
on several partitions at once in threads, and records each partition's materialization and check
results. The executor decides where each step executes (another process, a Dask worker, a pod).

dagster-dask names a Dask task ``<job>.<step>``: the same key for every partition run of one job.
Dask treats equal keys as one task, so two partition runs in flight on a shared cluster would be
merged (the second run receives the first run's events and its own partition never executes).
``stage2_dask_executor`` is dagster-dask's executor with the run id added to the task key, and
Dagster's run objects passed to the worker as one opaque argument (Dask walks tuples in task
arguments, and a ``DagsterRun`` with op concurrency, as ``archive_file``'s ``downloads`` pool gives,
refuses iteration: upstream fails every such run); otherwise the same config schema for
``existing`` and ``local`` clusters and the same worker function (``query_on_dask_worker``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

from .config import EXECUTOR_NAMES, BuildConfig, k8s_executor_config_path, require_executor

EXECUTORS = EXECUTOR_NAMES


class _Opaque:
    """Dagster's run objects as one opaque argument: Dask walks tuples (and so NamedTuples) inside
    task arguments, which Dagster's ``@record`` types refuse (``DagsterRun.run_op_concurrency``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Opaque, (self.value,))


def _on_worker(dependencies: Any, args: _Opaque) -> list[Any]:
    """Runs in a Dask worker: dagster-dask's step function (execute the step against the instance).

    A step whose upstream step failed (a blocking check of its asset failed, or its code raised) or
    did not run is not run, as Dagster's own executors skip it: dagster-dask submits every step
    with its upstream steps' futures and runs it once they are done, whatever they did, so a store
    was built and published after the join's blocking check had failed."""
    if any(
        not events or any(getattr(e, "is_step_failure", False) for e in events) for events in dependencies
    ):
        return []
    from dagster_dask.executor import query_on_dask_worker

    return list(query_on_dask_worker(dependencies, *args.value))


def _interruptible(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, where waiting for the next one ends at SIGINT or SIGTERM with Dagster's
    ``DagsterExecutionInterruptedError`` (the run is then marked as interrupted).

    While a run executes, Dagster holds SIGINT and SIGTERM back until a step reaches a point where it
    may stop; an executor waiting on a remote cluster would wait on. Here a signal raises while
    waiting; one that arrives while the caller handles an item raises at the next wait. The handlers
    found are restored afterwards. Handlers can be set only from the main thread: elsewhere this is
    ``items`` as they come."""
    if threading.current_thread() is not threading.main_thread():
        yield from items
        return
    state = {"waiting": False, "signalled": False}

    def on_signal(_signum: int, _frame: Any) -> None:
        state["signalled"] = True
        if state["waiting"]:
            raise dg.DagsterExecutionInterruptedError()

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, on_signal)
    try:
        while True:
            if state["signalled"]:
                raise dg.DagsterExecutionInterruptedError()
            state["waiting"] = True
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                state["waiting"] = False
            yield item
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _dask_executor_def() -> dg.ExecutorDefinition:
    import dask.distributed
    from dagster_dask.executor import DaskExecutor, get_dask_resource_requirements

    class RunScopedDaskExecutor(DaskExecutor):
        """dagster-dask's executor; task keys carry the run id so concurrent runs never merge."""

        def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[Any]:
            if not plan_context.instance.is_persistent:
                raise dg.DagsterInvariantViolationError(
                    "the Dask executor needs a persistent Dagster instance: set DAGSTER_HOME"
                )
            if self.cluster_type == "existing":
                cluster: Any = self.cluster_configuration["address"]
                owned = None
            else:
                from dask.distributed import LocalCluster

                owned = cluster = LocalCluster(**self.build_dict(plan_context.job_name))
            run_id = plan_context.dagster_run.run_id
            try:
                with dask.distributed.Client(cluster) as client:
                    futures: dict[str, Any] = {}
                    for level in execution_plan.get_steps_to_execute_by_level():
                        for step in level:
                            deps = [futures[k] for inp in step.step_inputs for k in inp.dependency_keys]
                            futures[step.key] = client.submit(
                                _on_worker,
                                deps,
                                _Opaque(
                                    (
                                        plan_context.reconstructable_job,
                                        plan_context.dagster_run,
                                        plan_context.run_config,
                                        [step.key],
                                        plan_context.instance.get_ref(),
                                        execution_plan.known_state,
                                    )
                                ),
                                key=f"{plan_context.job_name}.{step.key}.{run_id}",
                                resources=get_dask_resource_requirements(step.tags),
                            )
                    done = dask.distributed.as_completed(list(futures.values()), with_results=True)
                    for _future, events in _interruptible(done):
                        yield from events
            finally:
                if owned is not None:
                    owned.close()

    @dg.executor(
        name="stage2_dask",
        requirements=dg.multiple_process_executor_requirements(),
        config_schema={
            "cluster": dg.Field(
                dg.Selector(
                    {
                        "existing": dg.Field(
                            {"address": dg.StringSource}, description="Connect to a running scheduler."
                        ),
                        "local": dg.Field(
                            dg.Permissive(), is_required=False, description="LocalCluster parameters."
                        ),
                    }
                )
            )
        },
    )
    def stage2_dask_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
        cluster: dict[str, Any] = dict(init_context.executor_config["cluster"])  # type: ignore[call-overload]
        ((cluster_type, cluster_config),) = cluster.items()
        return RunScopedDaskExecutor(cluster_type, cluster_config)

    return stage2_dask_executor


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise dg.DagsterInvariantViolationError(
            f"executor config {path} does not exist; set STAGE2_K8S_EXECUTOR_CONFIG to deploy/k8s/executor.yaml"
        ) from None
    if not isinstance(doc, dict):
        raise dg.DagsterInvariantViolationError(f"{path}: expected a mapping of executor config")
    return doc


def k8s_executor_config(path: Path | None = None) -> dict[str, Any]:
    """The ``k8s_job_executor`` config of ``deploy/k8s/executor.yaml`` (its ``execution.config``), or
    of ``path`` / ``STAGE2_K8S_EXECUTOR_CONFIG``."""
    path = Path(path or k8s_executor_config_path())
    doc = _load_yaml(path)
    try:
        return dict(doc["execution"]["config"])
    except (KeyError, TypeError):
        raise dg.DagsterInvariantViolationError(
            f"{path}: expected `execution: config: {{...}}` (the k8s_job_executor config)"
        ) from None


def executor_def(executor: str) -> dg.ExecutorDefinition:
    """The (unconfigured) executor definition for ``executor``; its config goes in the run config."""
    if executor == "in_process":
        return dg.in_process_executor
    if executor == "multiprocess":
        return dg.multiprocess_executor
    require_executor(executor)
    if executor == "dask":
        return _dask_executor_def()
    if executor == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    raise ValueError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}")


def executor_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``execution`` part of the run config for a build config (as a dict)."""
    executor = config.get("executor") or "in_process"
    if executor == "multiprocess":
        return {"execution": {"config": {"max_concurrent": int(config.get("max_concurrent") or 0)}}}
    if executor == "dask":
        address = config.get("dask_address")
        cluster: dict[str, Any] = (
            {"existing": {"address": address}}
            if address
            else {
                "local": {"n_workers": 2, "processes": True, "host": "127.0.0.1", "dashboard_address": None}
            }
        )
        return {"execution": {"config": {"cluster": cluster}}}
    if executor == "k8s":
        return {"execution": {"config": k8s_executor_config()}}
    return {}


@contextmanager
def local_dask_cluster(
    address: str | None = None, n_workers: int = 2, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """A ``dask.distributed`` scheduler (at ``address``, ``tcp://127.0.0.1:<port>``, else any port)
    and ``n_workers`` worker processes (one thread each) on 127.0.0.1 for the duration of a build;
    yields the scheduler address. ``env``: variables the worker processes get (a launched run's
    steps load the code location there, from the build's ``STAGE2_*`` settings)."""
    from dask.distributed import LocalCluster

    port = int(address.rsplit(":", 1)[1]) if address else 0
    with LocalCluster(
        scheduler_port=port,
        env=dict(env or {}),
        n_workers=n_workers,
        processes=True,
        threads_per_worker=1,  # Dagster steps are not thread-safe
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        yield cluster.scheduler_address


def configured_executor(config: BuildConfig) -> dg.ExecutorDefinition:
    """The executor of the Definitions, configured from ``BuildConfig.executor``: where the steps of
    every run launched against the code location execute (`stage2 build`'s, the UI's, schedules',
    sensors' and backfills', none of which passes an executor in its run config)."""
    executor = config.executor
    if executor == "dask" and not config.dask_address:
        raise dg.DagsterInvariantViolationError(
            "STAGE2_EXECUTOR=dask needs STAGE2_DASK_ADDRESS (the scheduler, e.g. tcp://dask-scheduler:8786)"
        )
    exec_config = executor_run_config({"executor": executor, "dask_address": config.dask_address})
    return executor_def(executor).configured(exec_config.get("execution", {}).get("config", {}))
