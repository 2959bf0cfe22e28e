"""The ``stage2`` executable (``stage2_data.cli.run``) ends as any Python program does (``sys.exit``
with the command's code): threads that are not daemons waited for (a thread pool left open does not
hold it), exit handlers run, buffered output written; it keeps OpenBLAS to one thread unless told;
a usage error is the command's own and says what was meant; output whose reader went away ends the
command quietly. Each case runs in a process of its own, as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import REPO, STAGE2, Ran, python, run, stage2, subprocess_env

from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()  # not a daemon: waited for
from concurrent.futures import ThreadPoolExecutor
left_open = ThreadPoolExecutor(2)  # never shut down: its idle workers must not hold the exit
left_open.submit(lambda: None).result()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("still buffered")  # a pipe: block-buffered, written only by the final flush
from stage2_data.cli import run
try:
    run(sys.argv[2:])
except SystemExit:  # the interpreter's own exit: what the process ends with
    (out / "exit").write_text("normal")
    raise
"""


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["validate", "/nonexistent/store"], 2, "stage2 validate: error: no complete VIN offline store"),
        (["--help"], 0, ""),
        (["no-such-command"], 2, "invalid choice: 'no-such-command'"),
    ],
)
def test_the_executable_exits_with_its_code_after_threads_handlers_and_output(
    tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    p = run([sys.executable, "-c", SCRIPT, str(tmp_path), *argv], timeout=120)
    assert p.returncode == code, p.stderr
    assert says in p.stderr
    assert p.stdout.startswith("still buffered")
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "exit").read_text() == "normal"
    if argv == ["--help"]:
        assert "usage: stage2" in p.stdout


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


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # a positional argument given as an option
        (
            ["validate", "--store", "store"],
            "stage2 validate: error: unrecognized arguments: --store. Fix: give store without --store",
        ),
        # a misspelt option, next to the arguments a command takes (its value, 2, is read as the
        # build's optional profile argument: the misspelt option alone is unrecognized)
        (
            ["build", "--profile", "p.toml", "--data-root", "root", "--concurency", "2"],
            "stage2 build: error: unrecognized arguments: --concurency. Fix: --concurrency, not --concurency",
        ),
        # a misspelt required option: argparse says the required one is missing; the typo is named too
        (
            ["list", "p.toml", "--data-rot", "root"],
            "the following arguments are required: --data-root; unrecognized arguments: --data-rot. "
            "Fix: --data-root, not --data-rot",
        ),
        # --profile, taken, with the required --data-root missing: only that is said (it said
        # --profile was not an option: QA)
        (
            ["build", "--profile", "p.toml"],
            "stage2 build: error: the following arguments are required: --data-root. Fix: give it "
            "(`stage2 build --help` says what it takes, with an example)",
        ),
        # no command at all
        (
            [],
            "stage2: error: the following arguments are required: COMMAND. Fix: `stage2 --help` lists them",
        ),
        # nothing close: the command's own --help
        (
            ["validate", "--bogus", "store"],
            "stage2 validate: error: unrecognized arguments: --bogus. Fix: `stage2 validate --help`",
        ),
        # a misspelt command
        (["bild"], "invalid choice: 'bild'"),
        # stage2's own option after a command
        (
            ["summary", "--version", "store"],
            "stage2 summary: error: unrecognized arguments: --version. Fix: stage2 --version, before any command",
        ),
        # a prefix of an option is not that option (argparse took `--store DIR` as `--store-url DIR`
        # and the build wrote its store outside the data root: QA)
        (
            ["build", "p.toml", "--data-root", "root", "--store", "/tmp/elsewhere", "--dry"],
            "stage2 build: error: unrecognized arguments: --store /tmp/elsewhere --dry. "
            "Fix: --store-url, not --store; --dry-run, not --dry",
        ),
        # two options that exclude each other: which (it said no fix: QA)
        (
            ["pin", "p.toml", "--write", "--check"],
            "stage2 pin: error: argument --check: not allowed with argument --write. Fix: give --write or "
            "--check, not both (`stage2 pin --help` says what each does)",
        ),
    ],
    ids=[
        "positional-as-option",
        "misspelt-option",
        "misspelt-required-option",
        "profile-option-without-data-root",
        "no-command",
        "unknown-option",
        "misspelt-command",
        "version-after-a-command",
        "prefix-of-an-option",
        "options-that-exclude-each-other",
    ],
)
def test_a_usage_error_names_the_command_and_what_was_meant(argv: list[str], says: str) -> None:
    """A usage error is the command's own (its usage line, its name), and says what was meant."""
    p = stage2(*argv, timeout=120)
    assert p.returncode == 2, p.tail()
    assert says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    if not argv:
        assert p.stderr.startswith("usage: stage2 "), p.stderr
    elif argv[0] == "bild":
        assert p.stderr.rstrip().endswith("Fix: stage2 build, not bild"), p.stderr
    else:
        assert p.stderr.startswith(f"usage: stage2 {argv[0]} "), p.stderr


def test_a_command_taking_a_profile_also_takes_it_as_profile_option(demo_cache, tmp_path: Path) -> None:
    """`stage2 build`, `verify`, `list` and `pin` take the profile as their first argument or as
    ``--profile``: the same output either way; none, or two different ones, is the command's usage
    error."""
    prof, root = str(demo_cache.profile), str(tmp_path / "root")
    as_argument = stage2("list", prof, "--data-root", root, "--json", timeout=120)
    as_option = stage2("list", "--profile", prof, "--data-root", root, "--json", timeout=120)

    def listed(p: Ran) -> dict:  # what the profile and data root say (not the disk's free bytes now)
        assert p.returncode == 0, p.tail()
        out = p.json()
        out["disk"].pop("free_bytes")
        return out

    assert listed(as_option) == listed(as_argument)
    both = stage2("list", prof, "--profile", prof, "--data-root", root, "--json", timeout=120)
    assert listed(both) == listed(as_argument)
    for argv, says in (
        (["verify", "--data-root", root], "the following arguments are required: profile"),
        (
            ["pin", prof, "--profile", "other.toml", "--check"],
            f"two profiles given: {prof} and --profile other.toml. Fix: give the profile once",
        ),
        (["build", "--data-root", root], "the following arguments are required: profile"),
        (
            ["build", prof, "--profile", "other.toml", "--data-root", root],
            f"two profiles given: {prof} and --profile other.toml. Fix: give the profile once",
        ),
    ):
        p = stage2(*argv, timeout=120)
        assert p.returncode == 2 and says in p.stderr, p.tail()
        assert p.stderr.startswith(f"usage: stage2 {argv[0]} ") and "Traceback" not in p.stderr
    # `stage2 build` takes it first too: the profile named is the one it reads
    missing = str(tmp_path / "missing.toml")
    build = stage2("build", missing, "--data-root", root, timeout=120)
    assert build.returncode == 2 and f"profile file {missing} does not exist" in build.stderr, build.tail()
    pin = stage2("pin", "--profile", prof, "--check", "--endpoint", "http://127.0.0.1:9", timeout=120)
    assert pin.returncode == 2 and "unrecognized" not in pin.stderr and "required" not in pin.stderr, (
        pin.tail()
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["build", "--profile", "p.toml", "--data-root", "root", "--concurrency", "0"],
            "argument --concurrency: '0' is not a number of runs or partitions at once (an integer >= 1)",
        ),
        (
            ["build", "--profile", "p.toml", "--data-root", "root", "--concurrency", "-2"],
            "argument --concurrency: '-2' is not a number of runs or partitions at once (an integer >= 1)",
        ),
        (
            ["verify", "p.toml", "--data-root", "root", "--workers", "many"],
            "argument --workers: 'many' is not a number of hashing threads (an integer >= 1)",
        ),
        (
            ["serve-hub", "folder", "--repo-id", "a/b", "--revision", "c" * 40, "--port", "70000"],
            "argument --port: '70000' is not a TCP port (an integer >= 0 and <= 65535)",
        ),
        (
            ["gc", "stores", "--keep", "-1"],
            "argument --keep: '-1' is not a number of stores (an integer >= 0)",
        ),
    ],
    ids=["concurrency-0", "concurrency-negative", "workers-word", "port-too-big", "keep-negative"],
)
def test_a_count_option_out_of_its_range_is_a_usage_error(argv: list[str], says: str) -> None:
    """A count no command can use (no runs at once, no hashing threads, a port past 65535) is
    refused before any work, with what the option takes; it is never read as "the default"."""
    p = stage2(*argv, timeout=120)
    assert p.returncode == 2, p.tail()
    assert (
        p.stderr.startswith(f"usage: stage2 {argv[0]} ") and f"stage2 {argv[0]}: error: {says}" in p.stderr
    ), p.stderr


def test_a_file_system_error_no_guard_named_names_the_command_once(tmp_path: Path) -> None:
    """An OSError that reaches the CLI's last guard is one line: the command once, the path, what
    the system said, and the fix (here a file where `stage2 demo --out` needs a folder)."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder\n")
    p = stage2("demo", "--out", str(blocker), timeout=120)
    assert p.returncode == 2, p.tail()
    assert p.stderr.startswith(f"stage2 demo: error: {blocker}: "), p.stderr
    assert p.stderr.count("stage2 demo") == 1 and "Fix: a file stands where a folder is needed" in p.stderr


def test_version_names_stage2_data_and_the_parts_a_bug_report_needs() -> None:
    """``stage2 --version``: the installed stage2-data's version (from its metadata), then Dagster's,
    zarr's, numpy's, the hub client's and Python's; exit 0, nothing on stderr."""
    from importlib.metadata import version

    p = stage2("--version", timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.tail()
    assert p.stdout.startswith(f"stage2-data {version('stage2-data')} ("), p.stdout
    for dist in ("dagster", "zarr", "numpy", "huggingface_hub"):
        assert f"{dist} {version(dist)}" in p.stdout, p.stdout
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}." in p.stdout, p.stdout


@pytest.mark.parametrize("what", ["list", "help"])
def test_output_whose_reader_went_away_ends_quietly_with_141(what: str, demo_cache, tmp_path: Path) -> None:
    """``stage2 list ... | head``: a reader that stops reading is not a file system error. The
    command ends with no message and exit 141 (what a shell reports for a command SIGPIPE ended),
    here with the pipe's reader closed before the command writes anything."""
    argv = (
        [*STAGE2, "list", str(demo_cache.profile), "--data-root", str(tmp_path)]
        if what == "list"
        else [
            *STAGE2,
            "build",
            "--help",
        ]
    )
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr
    assert p.stderr == ""


def test_a_command_started_with_its_output_closed_runs_and_exits_0(demo_cache, tmp_path: Path) -> None:
    """``stage2 list ... >&-``: with no standard output at all the command still does its work, as
    ``print`` then writes nowhere, and exits 0 with no traceback."""
    argv = [*STAGE2, "list", str(demo_cache.profile), "--data-root", str(tmp_path)]
    p = subprocess.run(
        ["bash", "-c", 'exec "$@" >&-', "_", *argv], stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


REV = "f9da5e59a8ad9dc371af6f29f76621420746df4d"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["serve-hub", "{missing}", "--repo-id", "a/b", "--revision", REV],
            "the hub folder {missing} does not exist",
        ),
        (
            ["serve-hub", "{tmp}", "--repo-id", "ab", "--revision", REV],
            "repo_id 'ab' is not 'namespace/name'",
        ),
        (
            ["serve-hub", "{tmp}", "--repo-id", "a/b", "--revision", "f9da"],
            "revision 'f9da' is not a full 40-hex commit",
        ),
    ],
    ids=["serve-hub-folder", "serve-hub-repo-id", "serve-hub-revision"],
)
def test_a_folder_or_id_argument_that_is_not_one_is_named(argv: list[str], says: str, tmp_path: Path) -> None:
    """Arguments that name a folder or a hub identity, wrong: one line with the fix and exit 2 (not
    an internal error), before anything is served, downloaded or written."""
    (tmp_path / "p.toml").write_text("")
    fill = {"tmp": str(tmp_path), "missing": str(tmp_path / "missing")}
    p = stage2(*[a.format(**fill) for a in argv], timeout=120)
    assert p.returncode == 2, p.tail()
    line = p.stderr.strip()
    assert line.startswith(f"stage2 {argv[0]}: error: {says.format(**fill)}") and "Fix:" in line, line
    assert "internal error" not in line and len(line.splitlines()) == 1, line
    assert not (tmp_path / "root").exists()


def test_a_refused_builds_json_names_the_profile_when_it_parsed(demo_cache, tmp_path: Path) -> None:
    """`stage2 build --json` refused before it ran (offline, nothing on disk) still prints one object
    on stdout, naming the profile it read; a profile that does not parse leaves it null."""
    env = subprocess_env(HF_HUB_OFFLINE="1")
    root = str(tmp_path / "root")
    p = stage2("build", str(demo_cache.profile), "--data-root", root, "--json", env=env, timeout=120)
    assert p.returncode == 2, p.tail()
    out = p.json()
    assert out["profile"] == load_profile(demo_cache.profile).name and not out["ok"], out
    assert out["errors"][0]["error"] == "HubOfflineError", out
    bad = stage2("build", str(tmp_path / "none.toml"), "--data-root", root, "--json", env=env, timeout=120)
    assert bad.returncode == 2 and bad.json()["profile"] is None, bad.tail()


def test_a_dask_address_without_the_dask_executor_is_refused(tmp_path: Path) -> None:
    """`--dask-address` names the scheduler of `--executor dask`; with another executor it would
    be ignored (and yet printed on the build's UI line): refused before anything runs, naming both
    and the two fixes."""
    p = stage2(
        "build", "p.toml", "--data-root", str(tmp_path / "root"), "--dask-address", "tcp://h:8786",
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.tail()
    assert (
        "--dask-address tcp://h:8786 is for --executor dask; this build's executor is in_process" in p.stderr
    )
    assert "Fix: add --executor dask" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("foo", "--dask-address 'foo' is not a scheduler address (missing port number in address 'foo')"),
        ("tcp://127.0.0.1:1", "--dask-address tcp://127.0.0.1:1: no scheduler answers at 127.0.0.1:1"),
    ],
    ids=["unparsed", "unreachable"],
)
def test_a_dask_address_that_is_no_scheduler_is_refused_before_any_run(
    demo_cache, tmp_path: Path, address: str, says: str
) -> None:
    """`--executor dask --dask-address` that does not parse, or where nothing listens: refused before
    anything runs, exit 2, naming the address and the fix (it was the first run's "internal error"
    after the build had started, and a build whose stages were up to date passed with it)."""
    pytest.importorskip("distributed")
    root = tmp_path / "root"
    p = stage2(
        "build", str(demo_cache.profile), "--data-root", str(root), "--hub-folder", str(demo_cache.upstream),
        "--executor", "dask", "--dask-address", address, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.tail()
    line = p.stderr.strip()
    assert line.startswith(f"stage2 build: error: {says}") and "Fix: " in line, line
    assert "internal error" not in line and "Traceback" not in line and len(line.splitlines()) == 1, line
    assert not root.exists()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (
            "endpoint_url=http://127.0.0.1:9000",
            "--storage-option (endpoint_url) is given without --store-url",
        ),
        ("foo", "--storage-option 'foo' is not KEY=VALUE"),
    ],
    ids=["without-store-url", "malformed"],
)
def test_a_storage_option_without_a_store_url_is_refused(
    option: str, says: str, demo_cache, tmp_path: Path
) -> None:
    """`--storage-option` is for the store on `--store-url`: without one it would be ignored (the
    store goes under --data-root), so it is refused by name before anything runs; a malformed one
    is named as such. (Offline with nothing on disk, a build not refused so fails on the hub.)"""
    root = tmp_path / "root"
    p = stage2(
        "build", str(demo_cache.profile), "--data-root", str(root), "--storage-option", option,
        env=subprocess_env(HF_HUB_OFFLINE="1"), timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.tail()
    line = p.stderr.strip()
    assert line.startswith(f"stage2 build: error: {says}") and "Fix:" in line, line
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert not root.exists()


@pytest.fixture
def file_url_stores(store: Path, tmp_path: Path) -> Path:
    """A data root's stores folder holding one profile's store and its `current` link, as a build
    with `--store-url file://...` writes it."""
    import shutil

    profile = tmp_path / "stores" / "p"
    profile.mkdir(parents=True)
    shutil.copytree(store, profile / "v2-aaaa000000000001")
    (profile / "current").symlink_to("v2-aaaa000000000001")
    return tmp_path / "stores"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["validate", "file://{stores}/p/current"], "is valid"),
        (["summary", "file://{stores}/p/current"], "fingerprint:"),
        (["gc", "file://{stores}", "--dry-run"], "kept         v2-aaaa000000000001"),
    ],
    ids=["validate", "summary", "gc"],
)
def test_the_store_commands_take_the_file_url_a_build_takes(
    argv: list[str], says: str, file_url_stores: Path
) -> None:
    """`stage2 build --store-url file:///x` writes under /x: validate, summary and gc take the same
    URL (its `//` is not folded into `file:/x`, which reads as a mistyped URL)."""
    p = stage2(*[a.format(stores=file_url_stores) for a in argv], timeout=120)
    assert p.returncode == 0, p.tail()
    assert says in p.stdout and "starts like a URL" not in p.stderr, p.tail()


def test_a_file_url_with_one_slash_is_named_with_the_url_meant(tmp_path: Path) -> None:
    p = stage2("validate", f"file:{tmp_path}/s/p/current", timeout=120)
    assert p.returncode == 2, p.tail()
    assert f"Fix: write file://{tmp_path}/s/p/current, or the path alone" in p.stderr, p.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["build", "--profile", "{profile}", "--data-root", ""], "--data-root is empty"),
        (["build", "--profile", "{profile}", "--data-root="], "--data-root is empty"),
        (["validate", ""], "an argument is empty"),
        (["gc", "", "--dry-run"], "an argument is empty"),
        (["build", "--profile", "{profile}", "--data-root", "r", "--endpoint", ""], "--endpoint is empty"),
    ],
    ids=["build-data-root", "build-data-root-equals", "validate", "gc", "build-endpoint"],
)
def test_an_empty_argument_is_refused_not_taken_as_the_working_folder(
    args: list[str], says: str, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`--data-root ""` (an unset shell variable) built the store into the working folder, exit 0
    (QA: into the git checkout). An empty argument is refused in one line, nothing written."""
    argv = [a.replace("{profile}", str(demo_cache.profile)) for a in args]
    r = stage2(*argv, cwd=tmp_path)
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line.startswith(f"stage2 {argv[0]}: error: {says}") and "Fix: give " in line, line
    assert len(line.splitlines()) == 1 and list(tmp_path.iterdir()) == [], (line, list(tmp_path.iterdir()))


@pytest.mark.parametrize("traceback_env", ["", "1"])
def test_an_internal_error_exits_3_with_or_without_its_traceback(
    traceback_env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last guard: a bug is one line and exit 3; with STAGE2_TRACEBACK=1 the traceback comes
    first, then the same line and the same exit (it was a raw traceback and exit 1: QA)."""
    import argparse

    from stage2_data.cli import TRACEBACK_ENV, _run_command

    monkeypatch.setenv(TRACEBACK_ENV, traceback_env)

    def buggy(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug for the test")

    assert _run_command(buggy, argparse.Namespace(command="list", json=False)) == 3
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        "This is a bug. Fix: re-run with STAGE2_TRACEBACK=1 to see the traceback, and report it"
    )
    assert ("Traceback (most recent call last)" in err) == bool(traceback_env), err


def test_python_dash_m_stage2_data_is_the_stage2_command() -> None:
    """`python -m stage2_data` runs `stage2` (a habit, and the way in without the script on PATH):
    the same usage errors with their fix, the same exit codes."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "stage2_data", "bild"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stderr.rstrip().endswith("Fix: stage2 build, not bild"), r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "stage2_data", "--version"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("stage2-data "), r.stdout
