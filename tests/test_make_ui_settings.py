"""`make ui` (``stage2_pipelines.ui``) says what is true and prints commands that run as pasted: the
busy port's fix repeats the settings this `make ui` was given, the nothing-built hint says what the
instance records and builds with the UI's own settings, and a core install without the pipeline
extra is told what to install (one line, exit 2), not shown a traceback."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import subprocess_env

from stage2_data.demo import DemoPaths
from stage2_pipelines.config import BuildConfig, write_instance_yaml

UI = [sys.executable, "-m", "stage2_pipelines.ui"]


def _settings(words: list[str]) -> dict[str, str]:
    """The ``NAME=value`` words in front of a command, in order."""
    out: dict[str, str] = {}
    for w in words:
        name, eq, value = w.partition("=")
        if not eq or not name.isidentifier():
            break
        out[name] = value
    return out


def _busy_port_fix(env: dict[str, str], cwd: Path) -> tuple[str, list[str]]:
    """`make ui` with ``env`` (its STAGE2_UI_PORT held by someone else): its one line, and the
    command its fix suggests (what follows "is free now): "), as the shell splits it."""
    r = subprocess.run(UI, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    said = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in said and len(said.splitlines()) == 1, r.stdout + r.stderr
    assert said.startswith(f"make ui: port {env['STAGE2_UI_PORT']} on 127.0.0.1 is not free"), said
    command = said.split(" is free now): ", 1)[1]
    return said, shlex.split(command, comments=True)


def test_the_busy_ports_fix_repeats_the_settings_it_was_given(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """A pasted `UI:` line (profile, data root, hub folder, instance) on a port a `make ui` holds:
    the fix suggested `STAGE2_UI_PORT=3001 make ui`, which drops the line's settings (and is then
    refused: the default instance is the other UI's). It repeats every STAGE2_* and DAGSTER_HOME
    setting, quoted, with the free port in front, and runs as pasted in a shell that has none of
    them; storage options (credentials) are said, not printed."""
    given = {
        "STAGE2_PROFILE": str(demo_cache.profile),
        "STAGE2_DATA_ROOT": str(tmp_path / "data of 'the' try"),
        "STAGE2_HUB_FOLDER": str(demo_cache.upstream),
        "STAGE2_STORE_OPTIONS": '{"secret": "do-not-print"}',
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    bare = {k: v for k, v in os.environ.items() if not k.startswith("STAGE2_") and k != "DAGSTER_HOME"}
    bare.pop("MAKELEVEL", None)
    with socket.socket() as held, socket.socket() as held_again:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        said, words = _busy_port_fix({**bare, **given, "STAGE2_UI_PORT": port}, tmp_path)
        assert "do-not-print" not in said and said.endswith("  # with STAGE2_STORE_OPTIONS set as now"), said
        settings = _settings(words)
        free = settings.pop("STAGE2_UI_PORT")
        assert words[0] == f"STAGE2_UI_PORT={free}" and free != port, words
        assert settings == {k: v for k, v in given.items() if k != "STAGE2_STORE_OPTIONS"}, said
        assert words[len(settings) + 1 :] == UI, said
        # pasted into a shell where none of them is set: the same settings (refused again only
        # because the suggested port is taken now, so nothing starts)
        try:
            held_again.bind(("127.0.0.1", int(free)))
            held_again.listen()
        except OSError:
            pass  # taken by someone else since: busy either way
        command = said.split(" is free now): ", 1)[1]
        r = subprocess.run(
            ["sh", "-c", command], env=bare, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
    again = r.stderr.strip()
    assert r.returncode == 2 and again.startswith(f"make ui: port {free} on 127.0.0.1 is not free"), again
    settings = _settings(shlex.split(again.split(" is free now): ", 1)[1], comments=True))
    del settings["STAGE2_UI_PORT"]
    assert settings == {k: v for k, v in given.items() if k != "STAGE2_STORE_OPTIONS"}, again
    assert not (tmp_path / "home").exists()  # refused before anything started or was written


def test_the_busy_ports_fix_under_make_is_make_ui(tmp_path: Path) -> None:
    """Started by `make ui` (make sets MAKELEVEL), the fix is `make ui` with the settings in front;
    a setting given as an empty value is repeated as one."""
    from stage2_pipelines.ui import port_problem

    env = {
        "MAKELEVEL": "1",
        "STAGE2_DATA_ROOT": "/d",
        "STAGE2_KIT_ROOT": "",
        "DAGSTER_HOME": "/h",
        "HOME": "/x",
    }
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        said = port_problem(str(port), {**env, "STAGE2_UI_PORT": str(port)})
    assert said is not None, port
    words = shlex.split(said.split(" is free now): ", 1)[1])
    assert words[0].startswith("STAGE2_UI_PORT=") and int(words[0].split("=")[1]) > port, said
    assert words[1:] == ["STAGE2_DATA_ROOT=/d", "STAGE2_KIT_ROOT=", "DAGSTER_HOME=/h", "make", "ui"], said


def _instance_with_runs(home: Path, jobs: tuple[str, ...], tags: dict[str, str] | None = None) -> None:
    """Runs of ``jobs``, one after another, recorded in the instance at ``home`` with ``tags``:
    download_and_extract fails, any other succeeds."""
    import dagster as dg

    @dg.op
    def ok() -> None:
        pass

    @dg.op
    def boom() -> None:
        raise RuntimeError("hub unreachable")

    write_instance_yaml(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for name in jobs:
            op = boom if name == "download_and_extract" else ok
            job = dg.GraphDefinition(name=name, node_defs=[op]).to_job()
            job.execute_in_process(instance=instance, raise_on_error=False, tags=tags)


def test_nothing_built_over_an_instance_with_runs_does_not_say_no_runs(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """Nothing published, but the instance holds runs (a failed build): the hint said "so the UI
    shows no runs". It says how many are recorded and how the last one ended; with none, as before."""
    from stage2_pipelines.ui import nothing_built_hint

    empty, home = tmp_path / "data", tmp_path / "home"
    write_instance_yaml(home)
    said = nothing_built_hint(demo_cache.profile, empty, home=home, build=None)
    assert said is not None and ", so the UI shows no runs: `make demo` builds it" in said, said
    _instance_with_runs(home, ("check_profile", "unpack_action_sidecars"))
    said = nothing_built_hint(demo_cache.profile, empty, home=home, build=None)
    assert said == (
        f"nothing is published in {empty} yet; 2 runs are recorded, the last (unpack_action_sidecars) "
        "succeeded (see Runs): `make demo` builds it (its runs then show on their jobs' pages), or use "
        "Materialize all on the asset graph"
    )
    # a failed run before a run that succeeded (QA: the hint said only that the last succeeded)
    _instance_with_runs(home, ("download_and_extract", "unpack_action_sidecars"))
    said = nothing_built_hint(demo_cache.profile, empty, home=home, build=None)
    assert said == (
        f"nothing is published in {empty} yet; 4 runs are recorded, 1 of them failed (the newest: "
        "download_and_extract; its page on Runs names why): fix that, then `make demo` builds it (its "
        "runs then show on their jobs' pages), or use Materialize all on the asset graph"
    )


def test_the_ui_says_when_its_instance_records_other_data_roots(tmp_path: Path) -> None:
    """One DAGSTER_HOME for builds of two data roots (Dagster's usual setting): the UI over one of
    them showed the other's store, checks and stale marks as the latest of each asset, without a
    word (QA, stop 56). `make ui` now says so at start, with the fix; not for its own runs alone."""
    from stage2_data.stages import DATA_ROOT_TAG
    from stage2_pipelines.ui import shared_instance_hint

    home, mine, other = tmp_path / "home", tmp_path / "mine", tmp_path / "other"
    write_instance_yaml(home)
    assert shared_instance_hint(home, mine) is None  # no runs at all
    _instance_with_runs(home, ("check_profile",), {DATA_ROOT_TAG: str(mine.resolve())})
    assert shared_instance_hint(home, mine) is None  # its own runs only
    _instance_with_runs(home, ("check_profile",), {DATA_ROOT_TAG: str(other.resolve())})
    said = shared_instance_hint(home, mine)
    assert said is not None and said.startswith(
        f"the Dagster instance {home} also records the runs of 1 other data root ({other.resolve()}): "
        "its UI shows each asset, its checks and stale marks as whichever data root materialized it last"
    ), said
    assert said.endswith(
        f"Fix: one instance per data root: DAGSTER_HOME={mine}/.dagster for this data root's builds and "
        "its UI (what `stage2 build` uses when DAGSTER_HOME is unset)"
    ), said
    # the data root's own instance holding runs of the folder it was copied from: not a shared
    # instance, nothing said (its fix would be what is already the case)
    own = mine / ".dagster"
    write_instance_yaml(own)
    _instance_with_runs(own, ("check_profile",), {DATA_ROOT_TAG: str(other.resolve())})
    assert shared_instance_hint(own, mine) is None


def test_the_build_the_hint_suggests_has_the_uis_settings(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """The hint's `stage2 build` named the profile and data root only: with STAGE2_HUB_FOLDER set it
    went to the real hub ("hub unreachable"). It carries every setting the build takes as an option
    (parsed back by `stage2 build`'s own parser), DAGSTER_HOME (its runs in this UI's instance),
    and never the storage options."""
    from stage2_data.cli import make_parser
    from stage2_pipelines.ui import build_command, nothing_built_hint

    home = tmp_path / "the home"
    config = BuildConfig(
        profile_path=str(demo_cache.profile),
        data_root=str(tmp_path / "da ta"),
        endpoint="http://127.0.0.1:9",
        kit_root=str(tmp_path / "kit"),
        hub_folder=str(demo_cache.upstream),
        token_env_var="MY_TOKEN",
        executor="dask",
        dask_address="tcp://127.0.0.1:8786",
        store_url="s3://bucket/stores",
        store_options={"secret": "do-not-print"},
    )
    write_instance_yaml(home)
    said = nothing_built_hint(demo_cache.profile, Path(config.data_root), home=home, build=config)
    assert said is not None and "do-not-print" not in said, said
    assert f"`{build_command(config, home)}` (with a --storage-option KEY=VALUE for each of " in said, said
    words = shlex.split(build_command(config, home))
    assert words[:3] == [f"DAGSTER_HOME={home}", "stage2", "build"], words
    args = make_parser().parse_args(words[2:])
    assert (args.profile, args.data_root, args.kit_root, args.hub_folder) == (
        config.profile_path, config.data_root, config.kit_root, config.hub_folder,
    )  # fmt: skip
    assert args.endpoint is None  # the hub folder is served instead of any endpoint
    assert (args.token_env, args.executor, args.dask_address, args.store_url) == (
        "MY_TOKEN", "dask", "tcp://127.0.0.1:8786", "s3://bucket/stores",
    )  # fmt: skip
    plain = BuildConfig(profile_path="/p.toml", data_root="/d", endpoint="http://127.0.0.1:9")
    assert (
        build_command(plain, Path("/h"))
        == "DAGSTER_HOME=/h stage2 build /p.toml --data-root /d --endpoint http://127.0.0.1:9"
    )


@pytest.fixture
def without_dagster(tmp_path: Path) -> dict[str, str]:
    """An environment where ``dagster`` cannot be imported, as in a core install without the
    pipeline extra: a ``sitecustomize`` (on PYTHONPATH) hides it from every interpreter started
    with it (``sys.modules['dagster'] = None``: ``find_spec`` answers None and an import fails)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['dagster'] = None\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess_env(PYTHONPATH=path, DAGSTER_HOME=str(tmp_path / "home"))


def test_the_ui_without_the_pipeline_extra_says_what_to_install(
    without_dagster: dict[str, str], tmp_path: Path
) -> None:
    """`python -m stage2_pipelines.ui` (the UI command of an installed wheel) without the pipeline
    extra died with a ModuleNotFoundError traceback. It says what `stage2 build` says without it
    (the install line here, every extra), in one line, exit 2."""
    from stage2_data.cli import install_line, missing_extra_text

    hidden = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('dagster'))"],
        env=without_dagster, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert hidden.stdout.strip() == "None", hidden.stderr  # the environment hides it
    r = subprocess.run(UI, env=without_dagster, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in said and r.stdout == "", r.stdout + r.stderr
    assert said == missing_extra_text("build", who="make ui", subject="the web UI"), said
    assert (
        said.startswith("make ui: error: the web UI needs the 'pipeline' extra (Dagster)")
        and f"Fix: install it with {install_line()}" in said
    )
    assert not (tmp_path / "home").exists()


def test_the_ui_says_its_settings_on_help_and_refuses_arguments(tmp_path: Path) -> None:
    """`python -m stage2_pipelines.ui --help` started the whole UI on port 3000 (QA): it prints its
    usage, the settings it reads; any other argument is refused in one line; nothing is served."""
    env = subprocess_env(DAGSTER_HOME=str(tmp_path / "home"))
    helped = subprocess.run(
        [sys.executable, "-m", "stage2_pipelines.ui", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: make ui"), helped.stderr
    assert "STAGE2_UI_PORT" in helped.stdout and "STAGE2_PROFILE" in helped.stdout
    assert "STAGE2_STORE_URL" in helped.stdout and "STAGE2_EXECUTOR" in helped.stdout  # every build setting
    wrong = subprocess.run(
        [sys.executable, "-m", "stage2_pipelines.ui", "--port", "3001"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and wrong.stderr.startswith("make ui: takes no arguments (got --port 3001)")
    assert "Fix:" in wrong.stderr and not (tmp_path / "home").exists()
