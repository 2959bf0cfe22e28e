"""``stage2 build`` and ``stage2 demo``: the commands that run the asset graph, plugged into the core
CLI (``stage2_data.cli``) from the Dagster layer through the ``stage2.commands`` entry points
(``build = "stage2_pipelines.commands:register_build"``, ``demo = ...:register_demo``).

Without the pipeline extra (Dagster missing) this module still loads: ``stage2 build --help`` shows
every option and the line that installs the extra, and running either command says what to install
(exit 2). Dagster itself is imported when a command runs, not when the CLI starts (every ``stage2``
command builds the parser, and importing Dagster is the slowest part of a start).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import socket
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from stage2_data import layout
from stage2_data.acquire import archive_state, hub_offline, offline_error, resolve_endpoint
from stage2_data.acquire.hub import DEFAULT_TOKEN_ENV, require_hub_folder, require_token_env
from stage2_data.checks import STANDALONE_CHECKS
from stage2_data.commands.common import (
    EXIT_BUG,
    EXIT_ERROR,
    EXIT_FAILED,
    HUB_FOLDER_LEFT_OUT,
    KIT_ROOT_LEFT_OUT,
    add_profile,
    add_storage_option,
    add_token_env,
    count_of,
    eprint,
    print_json,
    require_folder_option,
    storage_options,
    with_demo_hub_folder,
)
from stage2_data.errors import (
    DiskSpaceError,
    HubError,
    HubSetupError,
    ProfileError,
    SettingError,
    Stage2Error,
    StoreError,
)
from stage2_data.fsutil import not_a_folder_on, python_str
from stage2_data.oserrors import fs_error
from stage2_data.profile import Profile, load_profile
from stage2_data.publish import data_root_lock, sweep_data_root
from stage2_data.stages import STAGES
from stage2_data.storage import StoreLocation, check_stores_target, check_stores_url

from .config import (
    INSTANCE_DISK_FULL,
    INTERNAL_ERROR,
    BuildConfig,
    build_command,
    check_dask_address,
    check_settings,
    demo_root,
    env_flag,
    require_executor,
    shared_instance_note,
    ui_command,
)
from .stops import stop_guard
from .uptodate import (
    build_summary,
    instance_home,
    published_store,
    stage_status,
    store_stage_settings,
    up_to_date_build,
    up_to_date_summary,
)

#: the pipeline extra is installed (Dagster is importable)
HAVE_PIPELINE = find_spec("dagster") is not None
NOT_INSTALLED = "" if HAVE_PIPELINE else " (not installed: needs the pipeline extra)"


def _without_pipeline(name: str) -> Callable[[argparse.Namespace], int]:
    """``stage2 <name>`` where the pipeline extra is missing: says what to install, exit 2."""

    def run(args: argparse.Namespace) -> int:
        from stage2_data.cli import missing_extra_text

        eprint(missing_extra_text(name))
        return EXIT_ERROR

    return run


def _register(p: argparse.ArgumentParser, name: str, func: Callable[[argparse.Namespace], int]) -> None:
    """``func`` for ``p``; without the pipeline extra, a stand-in that says what to install, and the
    install line at the end of ``--help`` (every option is still listed)."""
    if HAVE_PIPELINE:
        p.set_defaults(func=func)
        return
    from stage2_data.cli import extras, install_line

    p.formatter_class = argparse.RawDescriptionHelpFormatter  # the install line kept whole
    if p.description:
        p.description = textwrap.fill(p.description, 100)
    said = (
        f"Needs the 'pipeline' extra (Dagster), not installed here. Install it with:\n"
        f"  {install_line()}\n" + textwrap.fill(f"(every extra: {', '.join(extras()) or 'pipeline'})", 100)
    )
    p.epilog = f"{p.epilog}\n\n{said}" if p.epilog else said
    p.set_defaults(func=_without_pipeline(name))


# ----- build -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_runs(verbose: bool) -> Iterator[None]:
    """For the length of the build, the runs' own console log (a DEBUG line per event, tracebacks of
    expected failures) goes away unless --verbose; every event is still recorded in the instance (see
    the UI). ``STAGE2_RUN_LOG_LEVEL`` says so to the runs and the processes the build starts; it is
    put back as it was afterwards, so a build called in a longer-lived process (a notebook, a test
    session) leaves that process's settings alone."""
    before = os.environ.get("STAGE2_RUN_LOG_LEVEL")
    if verbose:
        os.environ.pop("STAGE2_RUN_LOG_LEVEL", None)
    else:
        os.environ["STAGE2_RUN_LOG_LEVEL"] = "CRITICAL"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("STAGE2_RUN_LOG_LEVEL", None)
        else:
            os.environ["STAGE2_RUN_LOG_LEVEL"] = before


def _preflight_hub(profile: Profile, data_root: Path, endpoint: str, *, reach: bool) -> None:
    """Fail in a second, with one message, when archives must be downloaded and they cannot be:
    offline (``HF_HUB_OFFLINE``: every missing archive named, nothing requested), or, with
    ``reach``, the hub does not answer (instead of every archive retrying with backoff). Nothing to
    download: no network needed."""
    # missing or partial archives need the hub; verified ones and unverified files on disk (re-hashed
    # locally) do not
    todo = [a.path for a in profile.archives if archive_state(data_root, a).state in ("missing", "partial")]
    if not todo:
        return
    if hub_offline():  # one message for the build, not one failed partition per cache key
        raise offline_error(data_root, todo)
    if not reach:  # a hub folder: served on loopback by the runs themselves
        return
    from stage2_data.acquire.retry import default_backoff  # imports the hub client

    u = urlsplit(endpoint)
    if not u.hostname:
        raise HubError(
            f"--endpoint {endpoint!r} is not a URL.", fix="pass e.g. --endpoint https://huggingface.co"
        )
    port = u.port or (443 if u.scheme == "https" else 80)
    last: OSError | None = None
    pause = min(0.5, default_backoff() / 2)  # half the first retry wait (STAGE2_RETRY_BACKOFF), <= 0.5 s
    for _ in range(3):
        try:
            with socket.create_connection((u.hostname, port), timeout=10):
                return
        except OSError as e:
            last = e
            time.sleep(pause)
    raise with_demo_hub_folder(
        HubError(
            f"hub unreachable at {endpoint} ({type(last).__name__}: {last}); {len(todo)} archive(s) still to download.",
            fix="check the network and --endpoint (for a loopback hub: is `stage2 serve-hub` running?)",
        ),
        profile.profile_path or "",
    )


def cmd_build(args: argparse.Namespace) -> int:
    return _json_on_refusal(args, Path(args.data_root).resolve(), lambda: _cmd_build(args))


def _json_on_refusal(args: argparse.Namespace, data_root: Path, run: Callable[[], int]) -> int:
    """``run()``; with ``--json``, a refusal before anything ran still prints one object on stdout
    (:func:`refused_summary`), and the message still goes to stderr (re-raised)."""
    try:
        return run()
    except Stage2Error as err:
        if args.json:
            print_json(refused_summary(data_root, err, _profile_name(getattr(args, "profile", None))))
        raise


def _profile_name(path: str | None) -> str | None:
    """The name of the profile at ``path``, when it parses (a refusal may be about the profile)."""
    try:
        return load_profile(path).name if path else None
    except Stage2Error:
        return None


def refused_summary(data_root: Path, err: Stage2Error, profile: str | None = None) -> dict[str, Any]:
    """``--json``'s object for a build refused before it ran anything: a build's summary
    (``uptodate.build_summary``: every key), nothing run or published, the refusal as its one error;
    the profile's name when the profile parsed."""
    return build_summary(
        data_root=str(data_root),
        profile=profile,
        errors=[
            {
                "step": None,
                "partition": None,
                "message": str(err),
                "error": type(err).__name__,
                "could_not_run": True,  # refused before it ran: exit 2
            }
        ],
    )


def _cmd_build(args: argparse.Namespace) -> int:
    check_settings()
    reverify = args.reverify or env_flag("STAGE2_REVERIFY")  # the flag, or the setting
    if args.dask_address and args.executor != "dask":  # it would be ignored, yet shown on the UI line
        raise SettingError(
            f"--dask-address {args.dask_address} is for --executor dask; this build's executor is "
            f"{args.executor}.",
            fix="add --executor dask to run the steps on that scheduler, or leave out --dask-address",
        )
    require_executor(args.executor)
    if args.dask_address:  # parsed and reached now, not by the first run's first step
        check_dask_address(args.dask_address)
    options = storage_options(args)  # each KEY=VALUE, refused now if one is not
    if args.store_url:  # opened by the store stage, after every download: refused now if it cannot be
        check_stores_url(args.store_url)
    elif options:  # they are the store's, and only a store on --store-url takes them
        raise StoreError(
            f"--storage-option ({', '.join(options)}) is given without --store-url: storage options "
            "are for a store written to object storage, and this build writes its store under "
            "--data-root.",
            fix="add --store-url URL (e.g. --store-url s3://bucket/stores) to write the store there, "
            "or leave out --storage-option",
        )
    # folders the build reads, refused before any download (a step would find them missing late)
    require_folder_option("--kit-root", args.kit_root, ProfileError, KIT_ROOT_LEFT_OUT)
    require_folder_option("--hub-folder", args.hub_folder, HubSetupError, HUB_FOLDER_LEFT_OUT)
    profile = load_profile(args.profile, kit_root=args.kit_root)  # fail fast on a bad profile
    profile.require_known()  # nothing is ever requested under a guessed name
    profile.require_kit_found()  # a wrong --kit-root: refused now, not after the downloads
    require_token_env(args.token_env)  # a --token-env that names no variable: refused, not ignored
    if args.hub_folder:  # the wrong folder (the kit's, say): named now, not as 14 missing archives
        require_hub_folder(profile, args.hub_folder)
    data_root = Path(args.data_root).resolve()
    if not_a_folder_on(data_root) is not None:  # named as given, not as the first path made under it
        raise fs_error(NotADirectoryError(errno.ENOTDIR, "Not a directory", str(data_root)), "--data-root")
    if args.store_url:  # credentials, endpoint, bucket: probed now, not after every download
        check_stores_target(args.store_url, profile.name, options)
    endpoint = resolve_endpoint(args.endpoint)  # --endpoint, else $HF_ENDPOINT, else the real hub
    _preflight_hub(profile, data_root, endpoint, reach=not args.hub_folder)
    config = BuildConfig(
        profile_path=str(Path(args.profile).resolve()),
        data_root=str(data_root),
        endpoint=endpoint,
        kit_root=str(Path(args.kit_root).resolve()) if args.kit_root else None,
        hub_folder=str(Path(args.hub_folder).resolve()) if args.hub_folder else None,
        token_env_var=args.token_env or DEFAULT_TOKEN_ENV,
        reverify=reverify,
        executor=args.executor,
        dask_address=args.dask_address,
        store_url=args.store_url,
        store_options=options,
    )
    if args.dry_run:
        return _print_plan(args, config, profile)
    return _run_build(args, config, profile, concurrency=args.concurrency, progress=not args.no_progress)


def _print_plan(args: argparse.Namespace, config: BuildConfig, profile: Profile) -> int:
    """``--dry-run``: what the build would do now and why (``steps.plan``), after every refusal a
    build makes before it runs; nothing is run, swept or created (an absent data root stays absent).
    Holds the data root's lock while it reads, so a build running there is named, not raced."""
    from stage2_data.steps.plan import build_plan

    data_root = Path(config.data_root)
    exists = data_root.is_dir()
    with data_root_lock(data_root, command="build --dry-run") if exists else contextlib.nullcontext():
        plan = build_plan(
            profile,
            data_root,
            store_stage_settings(config),
            reverify=config.reverify,
            store_url=config.store_url,
        )
    if args.json:
        print_json(plan.to_dict())
    else:
        print("\n".join(plan.lines()))
    return 0


def _run_build(
    args: argparse.Namespace,
    config: BuildConfig,
    profile: Profile,
    *,
    concurrency: int | None,
    progress: bool,
) -> int:
    """Run the build with a progress display (unless --json) and print its summary; the exit code."""
    from .progress import BuildProgress  # imports rich

    # SIGTERM/SIGINT stop the build from any stage, workers included, and publish nothing (stops.py)
    current = None if config.store_url else layout.current_store_path(Path(config.data_root), profile.name)
    started = time.time()
    with _quiet_runs(args.verbose), stop_guard(watch=current) as stop, contextlib.ExitStack() as held:
        show = progress and not args.json
        bar = (
            BuildProgress(profile, stream=held.enter_context(_terminal()), data_root=Path(config.data_root))
            if show
            else None
        )
        on_run = stop.on_run(bar.on_run if bar else None)
        try:
            summary = _build_or_no_op(
                config,
                profile,
                concurrency=concurrency,
                on_run=on_run,
                run_in_process=True if getattr(args, "run_in_process", False) else None,
            )
        except Exception as err:
            named = instance_refused(err, instance_home(Path(config.data_root)))
            if named is None:
                raise
            raise named from None
        finally:
            if bar:
                with contextlib.suppress(Exception):
                    bar.close()
        if not stop.stopped:  # still guarded: a signal now is a stop after the store was published
            summary["ui"] = ui_command(config, Path(summary["dagster_home"]))
            if args.json:
                print_json(summary)
            else:
                again = build_command(config, Path(summary["dagster_home"]))
                if config.store_options:  # never printed (credentials)
                    again += " --storage-option ...  # this build's --storage-option values"
                print_build_summary(summary, config.store_options, rebuild=again)
    if stop.stopped:
        if args.json:  # one object whatever happened: the stop is its one error
            print_json(stopped_summary(config, profile, stop, since=started))
        eprint(stop.message())
        return stop.exit_code
    return build_exit_code(summary)


def instance_refused(err: BaseException, home: Path) -> Stage2Error | None:
    """The Dagster instance's database at ``home`` refusing a write for want of disk (SQLite's
    "database or disk is full", or its "disk I/O error" when not even a journal fits) as a named
    error with the folder and the fix; None for any other error. The data root's own writes are
    checked for space before they start; the instance's run and event records are not."""
    if type(err).__name__ != "OperationalError":
        return None
    said = " ".join(str(err).split("\n")[0].split())
    if not any(words in said for words in INSTANCE_DISK_FULL):
        return None
    return DiskSpaceError(
        f"the Dagster instance at {home} could not record the build's runs: its database says {said[:200]!r}",
        fix=f"free space on the disk that holds {home} (`df -h {home}`), then run the build again "
        "(what was built is kept: the build resumes)",
    )


def stopped_summary(config: BuildConfig, profile: Profile, stop: Any, *, since: float) -> dict[str, Any]:
    """``--json``'s object for a build stopped by a signal: a build's summary (every key), the stop
    as its one error (``"error": "Stopped"``, the message says whether the store was published),
    and the runs it started since ``since`` with their status (canceled, most)."""
    store, fingerprint = (None, None)
    if stop.published() and not config.store_url:
        store, fingerprint = published_store(Path(config.data_root), profile)
    runs: list[dict[str, Any]] = []
    if "dagster" in sys.modules:  # else it stopped before its first run
        from .runner import started_runs

        with contextlib.suppress(Exception):  # the instance unreadable: the stop is still said
            runs = started_runs(Path(config.data_root), since)
    return build_summary(
        runs=runs,
        profile=profile.name,
        data_root=config.data_root,
        dagster_home=str(instance_home(Path(config.data_root))),
        store=store,
        fingerprint=fingerprint,
        errors=[
            {
                "step": None,
                "partition": None,
                "message": stop.message(),
                "error": "Stopped",
                "could_not_run": False,
            }
        ],
    )


def build_exit_code(summary: dict[str, Any]) -> int:
    """0 when the build published its store; 3 when a step raised what no guard named (a bug, as
    every command's internal error); 2 when a step could not run (a full or read-only disk, a file
    system refusal, a bad pin, a hub that cannot serve it); else 1 (a check or a step found problems
    in the data)."""
    if summary["ok"]:
        return 0
    if any(str(e.get("message") or "").startswith(INTERNAL_ERROR) for e in summary["errors"]):
        return EXIT_BUG
    if any(e.get("could_not_run") for e in summary["errors"]):
        return EXIT_ERROR
    return EXIT_FAILED


@contextlib.contextmanager
def _terminal() -> Iterator[IO[str]]:
    """stderr as it is now, for the progress display: Dagster swaps file descriptor 2 for a step's
    log file while the step runs (Dagster's step logs), and a quiet build sends the runs' console to
    a file (``runner.runs_console``); the display must reach the terminal."""
    try:
        fd = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # not a real file: as is
        yield sys.stderr
        return
    with os.fdopen(fd, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8", errors="replace") as f:
        yield f


def _build_or_no_op(
    config: BuildConfig,
    profile: Profile,
    *,
    concurrency: int | None,
    on_run: Callable[[dict[str, Any]], None],
    run_in_process: bool | None = None,
) -> dict[str, Any]:
    """The build's summary. Under the data root's lock, a build with every stage up to date is
    answered before Dagster is imported (``uptodate``: a no-op costs a scandir walk, not an instance);
    otherwise the runner runs the stages (the lock is re-entrant: it stays held throughout)."""
    with contextlib.ExitStack() as held:
        status = None
        if not config.store_url:
            data_root = Path(config.data_root).resolve()
            held.enter_context(data_root_lock(data_root))
            sweep_data_root(data_root)
            status = stage_status(config, profile)  # once: the no-op, the stages beside, the runner
            # a no-op: every archive verified from this very source (repo and revision), as a
            # real hub's pinned revision never changes; a folder that now declares another source
            # is refused all the same, as every run over it (a `--reverify`, the UI's) would be
            summary = up_to_date_build(config, profile, status)
            if summary is not None:
                if config.hub_folder:
                    from stage2_data.demo.hubserver import check_declared_source

                    src = profile.source
                    check_declared_source(config.hub_folder, repo_id=src.repo_id, revision=src.revision)
                for stage in STAGES:
                    on_run(up_to_date_summary(stage))
                return summary
        if config.hub_folder:  # a revision the folder is not at: refused, as the real hub refuses it
            from stage2_data.demo.hubserver import serve_pinned

            src = profile.source
            serve_pinned(
                config.hub_folder, repo_id=src.repo_id, revision=src.revision, repo_type=src.repo_type
            )
        from .runner import build_all

        return build_all(
            config, concurrency=concurrency, on_run=on_run, status=status, run_in_process=run_in_process
        )


def print_build_summary(
    s: dict[str, Any], storage_options: dict[str, Any] | None = None, *, rebuild: str | None = None
) -> None:
    """The summary's lines; ``rebuild``: the command that runs this build again, as pasted (a no-op
    while nothing changed; with ``--reverify`` it runs every check again, said when nothing ran)."""
    reverify = _with_option(rebuild, "--reverify") if rebuild else None
    checks = s["checks"]
    passed = sum(c["passed"] for c in checks)
    print(f"profile:      {s['profile']}")
    print(f"data root:    {s['data_root']}")
    if s["runs"] or not s.get("up_to_date"):
        print(f"runs:         {len(s['runs'])} (Dagster instance at {s['dagster_home']})")
        # the verify checks a step records from its own work (assets/_common.py,
        # record_standalone_results): the UI lists them beside these; each finding is counted here once
        recorded = {
            (a, n)
            for r in s["runs"]
            for a in r.get("materialized") or ()
            for n in STANDALONE_CHECKS.get(a, ())
        }
        also = f" (the UI lists {len(recorded)} more: verify checks recorded from the same steps' work)"
        print(f"checks:       {passed}/{len(checks)} passed" + (also if recorded else ""))
    else:  # no run: the instance of the runs that built what is up to date (the UI line below
        # serves it), and their checks, which still stand
        print(
            f"runs:         0 (every stage up to date; its runs are in the Dagster instance at {s['dagster_home']})"
        )
        again = reverify or "stage2 build PROFILE --data-root DATA_ROOT --reverify"
        print(f"checks:       none run (every stage up to date; `{again}` runs them)")
    if s.get("instance_shared_with"):
        print(
            f"instance:     {shared_instance_note(s['dagster_home'], s['data_root'], s['instance_shared_with'])}"
        )
    for m in s.get("moved_aside") or []:
        print(f"moved aside:  {m} (kept, never deleted; `stage2 list` shows it)")
    if s.get("store_update"):
        print(f"store update: {s['store_update']}")
    if s.get("retention_error"):
        print(f"retention:    not applied ({s['retention_error']}); no store removed")
    if s.get("removed_stores"):  # verified stores removed by the retention policy: said, never silent
        print(
            f"removed:      {', '.join(s['removed_stores'])} (retention: `current` and "
            "STAGE2_KEEP_STORES previous stores kept; STAGE2_KEEP_STORES=all keeps every store)"
        )
    if s["ok"]:
        print(f"store:        {s['store']}")
        print(f"fingerprint:  {s['fingerprint']}")
        _print_store_counts(s["store"], storage_options)
        current = _current_link(s)
        if current is not None:  # the path to keep: the versioned folder goes by the retention policy
            print(f"current:      {current}")
            print("open it:      from stage2_data.store import VinOfflineDataset")
            if "://" in current:  # object storage: the reader follows the profile's CURRENT object
                print(f'              ds = VinOfflineDataset({python_str(current)}, split="train",')
                print(
                    "                                     storage_options={...})  # this build's --storage-option values"
                )
            else:
                print(f'              ds = VinOfflineDataset({python_str(current)}, split="train")')
    else:
        print("BUILD FAILED" + (f" (stopped after {s['stopped_after']})" if s.get("stopped_after") else ""))
        for c in checks:
            if not c["passed"]:
                part = f"[{c['partition']}]" if c.get("partition") else ""
                print(f"  failed check {c['asset']}{part}:{c['check']}: {c['description']}")
        said = {(c.get("partition"), c["description"]) for c in checks if not c["passed"]}
        shown = {(c.get("partition"), c["asset"], c["check"]) for c in checks if not c["passed"]}
        for e in s["errors"]:
            if (e.get("partition"), e["message"]) in said:
                continue  # the failed check above already says it
            if e.get("check") and (e.get("partition"), e.get("asset"), e["check"]) in shown:
                continue  # the step failed because of that check: said above
            part = f"[{e['partition']}]" if e.get("partition") else ""
            print(f"  error {e['step']}{part}: {e['message']}")
    if rebuild:
        print(f"rebuild:      {rebuild}")
        if s["ok"]:
            print("              (redoes only what changed; with --reverify it checks everything again)")
        else:
            print("              (after the fix; it resumes from what was built and checked)")
    print(f"UI:           {s['ui']}")
    print("              then open http://127.0.0.1:3000 (the build's runs are on their jobs' pages)")


def _with_option(command: str, option: str) -> str:
    """``command`` with ``option`` added before a trailing shell comment, if any."""
    head, sep, comment = command.partition("  # ")
    return f"{head} {option}" + (f"  # {comment}" if sep else "")


def _current_link(s: dict[str, Any]) -> str | None:
    """The published store's ``current`` link (relative to the working folder when it lies under
    it, as a user pastes it): the data root's, or the one beside the store in a local stores folder
    (``--store-url file://``); on object storage ``<url>/<profile>/current``, which readers follow
    through the profile's ``CURRENT`` object. None when nothing is published."""
    store = s.get("store")
    if not store:
        return None
    if "://" in str(store):
        return f"{str(store).rstrip('/').rsplit('/', 1)[0]}/{layout.CURRENT_LINK}"
    link = layout.current_store_path(Path(s["data_root"]), s["profile"])
    if Path(store).resolve() != link.resolve():
        link = Path(store).parent / layout.CURRENT_LINK
        if not link.is_symlink() or Path(store).resolve() != link.resolve():
            return None
    try:
        return str(link.relative_to(Path.cwd()))
    except ValueError:
        return str(link)


def _print_store_counts(store: str | None, storage_options: dict[str, Any] | None = None) -> None:
    """The published store's counts, as its manifest records them (the writer counted them, the
    build's validation checked them): a no-op build prints them without opening the store. A store
    on object storage is read with the build's ``storage_options``."""
    if not store:
        return
    try:
        loc = StoreLocation.parse(store, storage_options)
        stats = json.loads(loc.read_bytes(loc.root / "manifest.json").decode("utf-8"))["stats"]
        per_split = {sp: int(stats["per_split"].get(sp, 0)) for sp in layout.SPLIT_NAMES}
        line = f"samples:      {stats['samples']}  pairs: {stats['pairs']}  per split: {per_split}"
    # best effort: the checks passed
    except (OSError, ValueError, KeyError, TypeError, AttributeError, Stage2Error):
        return
    print(line)


# ----- demo --------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve() if args.out else demo_root()
    data_root = Path(args.data_root).resolve() if args.data_root else out / "data"
    return _json_on_refusal(args, data_root, lambda: _cmd_demo(args, out, data_root))


def _cmd_demo(args: argparse.Namespace, out: Path, data_root: Path) -> int:
    from stage2_data.demo import generate_demo

    check_settings()
    demo = generate_demo(out / "demo", full_cardinality=args.full_cardinality)
    eprint(f"demo generated at {demo.root} (profile {demo.profile})")
    # The demo's hub folder, served on loopback by each run that downloads (LoopbackHubResource):
    # `make ui` loads the same settings, so the UI re-executes the demo's runs as they ran.
    eprint(f"hub: {demo.upstream}, served on loopback by the runs that download")
    config = BuildConfig(
        profile_path=str(demo.profile), data_root=str(data_root), hub_folder=str(demo.upstream)
    )
    return _run_build(args, config, load_profile(demo.profile), concurrency=None, progress=True)


def _add_build_args(p: argparse.ArgumentParser) -> None:
    # the profile as every profile command takes it: first argument, or --profile; required only
    # where the command can run (without the extra, `stage2 build` says what to install)
    add_profile(p)
    p.set_defaults(profile_required=HAVE_PIPELINE)
    p.add_argument(
        "--data-root", required=HAVE_PIPELINE, help="where archives, extracted data and the store go"
    )
    p.add_argument("--kit-root", help="kit root (default: the folder holding the profile)")
    p.add_argument(
        "--endpoint",
        default=None,
        help="hub endpoint (default: $HF_ENDPOINT if set, else https://huggingface.co)",
    )
    p.add_argument(
        "--hub-folder", help="serve this local folder on loopback as the hub instead of --endpoint"
    )
    add_token_env(p)
    p.add_argument(
        "--concurrency",
        type=count_of("a number of runs or partitions at once"),
        default=None,
        help="how much at once: launched download_and_extract runs downloading (default 2; the "
        "next starts as soon as one's downloads are over), or a run's "
        "partitions with --run-in-process (default: sized for the machine); 1: one run per stage, "
        "one partition at a time",
    )
    p.add_argument(
        "--reverify",
        action="store_true",
        help="trust none of the build's own records: re-hash every archive, extract and unpack again, "
        "and reuse a store only when one written anew from the inputs gives its fingerprint",
    )
    p.add_argument(
        "--executor",
        choices=["in_process", "multiprocess", "dask"],
        default="in_process",
        help="where each run's steps execute (Dagster executor; default in_process)",
    )
    p.add_argument(
        "--dask-address",
        default=None,
        help="with --executor dask: the scheduler (tcp://host:8786); default: a local cluster for the build",
    )
    p.add_argument(
        "--store-url",
        default=None,
        help="write the store under this fsspec URL (e.g. s3://bucket/stores) instead of <data-root>/stores",
    )
    add_storage_option(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="say what a build would do now and why (each stage up to date or why it would run; what "
        "is left to download and extract), after the same refusals as a build; run and change nothing",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress display (automatic when not a terminal or CI)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also print the Dagster runs' own event log")
    _add_in_process_arg(p)


def _add_in_process_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-in-process",
        action="store_true",
        help="execute the runs in this process, one after another, instead of launching them through "
        "the instance (they are then on the UI's Runs page only, not on their jobs' pages); also "
        "STAGE2_RUN_IN_PROCESS=1",
    )


def register_build(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="materialize every asset and partition (download, extract, verify, join, store)" + NOT_INSTALLED,
        description="Materialize every asset and every partition through Dagster (runs recorded in DAGSTER_HOME, "
        "default <data-root>/.dagster). Exit 0 only when every asset materialized and every check passed.",
        epilog="Example: after `make demo`, in the checkout: stage2 build --profile .demo/demo/kit/profile.toml "
        "--data-root .demo/data --hub-folder .demo/demo/upstream --json",
    )
    _add_build_args(p)
    _register(p, "build", cmd_build)


def register_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="generate the embedded demo, serve it on a loopback hub, and build it" + NOT_INSTALLED,
        description="Generate the embedded demo (a small upstream repository and its kit) under "
        "OUT/demo, serve its repository on a loopback hub for the runs that download, and build it "
        "into OUT/data (or --data-root) as stage2 build does; exit 0 only when every asset "
        "materialized and every check passed.",
        epilog="Example: stage2 demo --out .demo",
    )
    p.add_argument(
        "--out", help="folder for the demo and its data root (default $STAGE2_DEMO_ROOT, else .demo)"
    )
    p.add_argument("--data-root", help="data root (default OUT/data)")
    p.add_argument(
        "--full-cardinality", action="store_true", help="the real profile's counts with tiny payloads"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the Dagster runs' own event log")
    _add_in_process_arg(p)
    _register(p, "demo", cmd_demo)
