"""A user's first hour with `stage2`, as QA met it on a fresh clone: a wrong folder, a relative path
run from elsewhere, a mistyped data root, a token variable not set. Each is refused in one line that
names the culprit and a fix that works (exit 2), before anything runs; never a table of mismatches,
a page of errors blaming the profile, or a silent success."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import REPO, Ran, python_argv, run, stage2, subprocess_env

from stage2_data.demo import DemoPaths

#: a variable no test environment sets (the token variable a user forgot to export)
UNSET = "STAGE2_TEST_FIRST_HOUR_TOKEN"


def _env(**values: str) -> dict[str, str]:
    return subprocess_env(drop=(UNSET, "HF_TOKEN"), **values)


def _one_line(r: Ran, command: str) -> str:
    """The one error line of a refused ``stage2 <command>`` (exit 2, no traceback, no table)."""
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line == line.splitlines()[0] and "Traceback" not in line, line
    assert line.startswith(f"stage2 {command}: error: ") and " Fix: " in line, line
    assert "MISMATCH" not in r.stdout, r.stdout
    return line


# ----- 1. verify: a kit root that does not exist or holds none of the kit's files --------------------
def test_verify_refuses_a_kit_root_that_does_not_exist(demo_cache: DemoPaths, tmp_path: Path) -> None:
    nokit = tmp_path / "nokit"
    r = stage2("verify", str(demo_cache.profile), "--data-root", str(tmp_path), "--kit-root", str(nokit))
    line = _one_line(r, "verify")
    assert f"--kit-root {nokit} does not exist. Fix: pass an existing folder to --kit-root" in line, line


def test_verify_refuses_a_kit_root_holding_none_of_the_kit(demo_cache: DemoPaths, tmp_path: Path) -> None:
    empty = tmp_path / "empty kit"
    empty.mkdir()
    r = stage2("verify", str(demo_cache.profile), "--data-root", str(tmp_path), "--kit-root", str(empty))
    line = _one_line(r, "verify")
    assert f"the kit root {empty} holds none of the kit's files (missing: pair_manifest {empty}/" in line
    assert line.endswith(
        "Fix: pass --kit-root the folder holding the kit (by default it is the profile's own folder)"
    )
    # the fix followed: the kit's folder verifies (its data root is not built: exit 1, a report)
    r = stage2(
        "verify",
        str(demo_cache.profile),
        "--data-root",
        str(tmp_path),
        "--kit-root",
        str(demo_cache.kit_root),
    )
    assert r.returncode == 1 and "holds none" not in r.stderr and "FAILED" in r.stdout, r.tail()


def test_verify_of_the_committed_profile_without_its_kit_names_the_kit_root(tmp_path: Path) -> None:
    """The committed profile's kit lives elsewhere (its [kit] paths start with manifests/ and
    derived/, relative to the kit's own folder): without --kit-root the kit root is the profile's
    folder, which holds none of it. Said as that (the paths below it are why they read
    .../manifests/manifests/...), not as 80 problems."""
    r = stage2("verify", "manifests/stage2_core_v1.toml", "--data-root", str(tmp_path))
    line = _one_line(r, "verify")
    assert f"the kit root {REPO / 'manifests'} holds none of the kit's files" in line, line
    assert "Fix: pass --kit-root the folder holding the kit" in line, line
    assert r.stdout == "", r.stdout


# ----- 2. a --hub-folder that holds none of the profile's archives -------------------------------------
def test_pin_refuses_a_hub_folder_holding_none_of_the_archives(demo_cache: DemoPaths) -> None:
    kit = demo_cache.kit_root  # the kit folder, not the repository's
    r = stage2("pin", str(demo_cache.profile), "--hub-folder", str(kit), "--check", env=_env(), timeout=120)
    line = _one_line(r, "pin")
    first = sorted(demo_cache.upstream.glob("*.tar"))[0].name
    assert f"--hub-folder {kit} holds none of the profile's 14 archives (looked for e.g. {kit}/" in line, line
    assert first in line and "closest" not in r.stdout + r.stderr, line
    assert line.endswith(
        f"Fix: pass the folder that holds the dataset's files (for this demo: {demo_cache.upstream})"
    )
    # the fix followed
    ok = stage2(
        "pin", str(demo_cache.profile), "--hub-folder", str(demo_cache.upstream), "--check", env=_env()
    )
    assert ok.returncode == 0, ok.tail()


def test_build_refuses_a_hub_folder_holding_none_of_the_archives(
    demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    root = tmp_path / "root"
    kit = demo_cache.kit_root
    r = stage2(
        "build",
        "--profile",
        str(demo_cache.profile),
        "--data-root",
        str(root),
        "--hub-folder",
        str(kit),
        env=_env(HF_HUB_OFFLINE="1"),  # refused before the offline check, or it names what is missing
        timeout=120,
    )
    line = _one_line(r, "build")
    assert f"--hub-folder {kit} holds none of the profile's 14 archives" in line, line


@pytest.mark.parametrize("command", ["pin", "build"])
def test_a_revision_the_hub_folder_is_not_at_is_refused(
    command: str, demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """A mistyped [source] revision with --hub-folder: the real hub refuses a revision it does not
    know, and the folder has one commit, its own; it used to be served at whatever revision the
    profile named, so `pin --check` passed and a build published a store under the typo (QA).
    Both refuse before anything is served, naming the folder's commit; the fix followed passes."""
    from helpers.faults import copy_kit

    profile = copy_kit(demo_cache, tmp_path / "kit")
    typo = "1" * 40
    text = profile.read_text()
    profile.write_text(text.replace(demo_cache.revision, typo))
    args = {
        "pin": ["pin", str(profile), "--check"],
        "build": ["build", "--profile", str(profile), "--data-root", str(tmp_path / "root")],
    }[command]
    r = stage2(*args, "--hub-folder", str(demo_cache.upstream), env=_env(), timeout=120)
    line = _one_line(r, command)
    assert f"is at commit {demo_cache.revision}" in line and f"revision {typo}" in line, line
    assert f'Fix: set the profile\'s [source] revision to "{demo_cache.revision}"' in line, line
    assert not any((tmp_path / "root" / d).exists() for d in ("archives", "stores"))  # nothing fetched
    profile.write_text(text)  # the fix followed
    ok = stage2("pin", str(profile), "--hub-folder", str(demo_cache.upstream), "--check", env=_env())
    assert ok.returncode == 0, ok.tail()


def test_a_hub_folder_declares_the_commit_it_mirrors(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """The demo's folder declares the repo and commit it mirrors (`.stage2-hub.json`): a file added
    to it later (another dataset's archive) leaves it at that commit, as a real hub's pinned commit
    stays buildable after new ones; it refused every build (QA round 3). A declaration of another
    repo is refused, naming it; a folder without one, holding a file whose name is not UTF-8, is at
    a commit of its own (named), never an internal error."""
    import json
    import os
    import shutil

    hub = tmp_path / "hub"
    shutil.copytree(demo_cache.upstream, hub)
    marker = hub / ".stage2-hub.json"
    assert json.loads(marker.read_text())["revision"] == demo_cache.revision
    (hub / "other_dataset.tar").write_bytes(b"not ours")
    ok = stage2("pin", str(demo_cache.profile), "--hub-folder", str(hub), "--check", env=_env())
    assert ok.returncode == 0, ok.tail()
    marker.write_text(json.dumps({"repo_id": "someone/else", "revision": demo_cache.revision}))
    r = stage2("pin", str(demo_cache.profile), "--hub-folder", str(hub), "--check", env=_env())
    line = _one_line(r, "pin")
    assert "mirrors someone/else (its .stage2-hub.json), not the profile's [source] repo_id" in line, line
    marker.write_text("[" * 100000 + "]" * 100000)  # nested too deeply to decode: named
    r = stage2("pin", str(demo_cache.profile), "--hub-folder", str(hub), "--check", env=_env())
    assert "does not declare the commit the folder mirrors" in _one_line(r, "pin")
    marker.unlink()
    os.mkfifo(marker)  # named, never waited on
    r = stage2("pin", str(demo_cache.profile), "--hub-folder", str(hub), "--check", env=_env(), timeout=60)
    line = _one_line(r, "pin")
    assert "does not declare the commit the folder mirrors" in line and "is a FIFO" in line, line
    marker.unlink()
    os.close(os.open(os.path.join(os.fsencode(hub), b"bad\xffname.txt"), os.O_CREAT | os.O_WRONLY))
    r = stage2("pin", str(demo_cache.profile), "--hub-folder", str(hub), "--check", env=_env())
    line = _one_line(r, "pin")
    assert "is at commit " in line and "a digest of its files" in line, line
    assert f"or declare the commit the folder mirrors in {marker}" in line, line


@pytest.mark.parametrize("where", [(), ("build",)], ids=["stage2", "stage2-build"])
def test_the_help_example_builds_the_demo_as_pasted(
    where: tuple[str, ...], demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path
) -> None:
    """The example at the end of `stage2 --help` and `stage2 build --help` runs as pasted in a
    checkout after `make demo` (`.demo/demo` the demo, `.demo/data` its data root): it named the
    real profile, whose unpinned entries are refused, and a hub on a port nothing serves (QA)."""
    import shlex

    (tmp_path / ".demo").mkdir()
    (tmp_path / ".demo" / "demo").symlink_to(demo_cache.root)  # the demo, as `make demo` lays it out
    import re

    text = " ".join(stage2(*where, "--help", cwd=tmp_path).stdout.split())  # however it is wrapped
    m = re.search(
        r"Example: after `make demo`, in the checkout: (stage2 build( --?[\w-]+( [^\s-]\S*)?)+)", text
    )
    assert m, text
    r = stage2(*shlex.split(m.group(1))[1:], env=_env(), cwd=tmp_path, timeout=600)
    example = m.group(1)
    assert r.returncode == 0, (example, r.tail())


# ----- 3. a relative store path run from the wrong folder --------------------------------------------
def test_a_relative_store_path_names_the_working_folder(tmp_path: Path) -> None:
    given = ".demo/data/stores/stage2_core_v1_demo/current"
    for command in ("summary", "validate"):
        r = stage2(command, given, cwd=tmp_path)
        line = _one_line(r, command)
        assert f"no complete VIN offline store at {tmp_path / given}: nothing is there" in line, line
        assert f"the relative path {given} was taken relative to the working folder {tmp_path})" in line, line
        fix = line.split(" Fix: ", 1)[1]
        assert fix.startswith(
            f"run the command from the folder {given} is relative to, or pass its absolute path"
        )
        # no data root made up from a path that leads nowhere
        assert f"--data-root {tmp_path / '.demo' / 'data'}" not in fix, fix
        assert fix.endswith("--data-root <the data root stage2 build filled>"), fix


def test_a_missing_store_under_an_existing_data_root_names_it(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    r = stage2("summary", "data/stores/p/current", cwd=tmp_path)
    line = _one_line(r, "summary")
    assert f"--data-root {root}" in line, line
    gone = tmp_path / "gone" / "stores" / "p" / "current"  # absolute: no note, no made-up data root
    line = _one_line(stage2("summary", str(gone)), "summary")
    assert "relative" not in line and line.endswith("--data-root <the data root stage2 build filled>"), line


# ----- 4. list: a data root that does not exist ---------------------------------------------------------
def test_list_says_a_data_root_that_does_not_exist(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """A mistyped --data-root listed every archive missing, as if a build's downloads were gone. What a
    first build there needs is still listed (exit 0), with the data root said not to exist yet."""
    typo = tmp_path / "typo_root"
    r = stage2("list", str(demo_cache.profile), "--data-root", str(typo), env=_env())
    assert r.returncode == 0 and "missing 14" in r.stdout, r.tail()
    assert f"data root  {typo}  (does not exist yet: nothing is downloaded there)" in r.stdout, r.stdout
    assert r.stderr.strip() == (
        f"note: {typo} does not exist, so every archive below is missing there; if a build filled another "
        "folder, pass that one as --data-root"
    ), r.stderr
    assert not typo.exists()
    j = stage2("list", str(demo_cache.profile), "--data-root", str(typo), "--json", env=_env())
    assert j.returncode == 0 and j.json()["data_root_exists"] is False, j.tail()


# ----- 5. --token-env naming a variable that is not set -----------------------------------------------
@pytest.mark.parametrize("command", ["pin", "list"])
def test_token_env_not_set_is_refused(demo_cache: DemoPaths, tmp_path: Path, command: str) -> None:
    where = (
        ["--hub-folder", str(demo_cache.upstream), "--check"]
        if command == "pin"
        else ["--data-root", str(tmp_path)]
    )
    r = stage2(command, str(demo_cache.profile), *where, "--token-env", UNSET, env=_env())
    line = _one_line(r, command)
    assert line.endswith(
        f"--token-env {UNSET}: the environment variable {UNSET} is not set. Fix: export {UNSET}=<your token>, "
        "or leave out --token-env for a public repo"
    ), line
    # the fix followed, and without --token-env: no token needed for this repository
    for env in (_env(**{UNSET: "hf_secret"}), _env()):
        argv = [command, str(demo_cache.profile), *where] + (["--token-env", UNSET] if UNSET in env else [])
        ok = stage2(*argv, env=env)
        assert ok.returncode == 0 and "hf_secret" not in ok.stdout + ok.stderr, ok.tail()


def test_build_refuses_a_token_env_not_set(demo_cache: DemoPaths, tmp_path: Path, dagster_home: Path) -> None:
    r = stage2(
        "build",
        "--profile",
        str(demo_cache.profile),
        "--data-root",
        str(tmp_path / "root"),
        "--hub-folder",
        str(demo_cache.upstream),
        "--token-env",
        UNSET,
        env=_env(HF_HUB_OFFLINE="1"),
        timeout=120,
    )
    line = _one_line(r, "build")
    assert f"--token-env {UNSET}: the environment variable {UNSET} is not set." in line, line


# ----- the demo's profile without its hub folder -----------------------------------------------------
@pytest.mark.parametrize("command", ["build", "pin"])
def test_the_demos_profile_against_an_unreachable_hub_names_its_hub_folder(
    demo_cache: DemoPaths, tmp_path: Path, command: str
) -> None:
    """A generated demo's profile names the real hub's repository, which this machine may not reach
    (and which does not hold the demo's revision): `stage2 build` and `stage2 pin` of it without
    --hub-folder, the hub out of reach, say where its archives are and the option that serves them,
    and that fix works as written."""
    unreachable = "http://127.0.0.1:9"
    args = [str(demo_cache.profile), "--endpoint", unreachable]
    if command == "build":
        args += ["--data-root", str(tmp_path / "root"), "--json"]
    env = _env(STAGE2_RETRY_BACKOFF="0.01")
    r = stage2(command, *args, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.tail()
    said = r.stderr.strip().splitlines()[-1]
    upstream = demo_cache.upstream.absolute()
    assert f"its archives are in {upstream}; add --hub-folder {upstream}" in said, said
    if command == "pin":  # the fix, followed: the demo's profile is pinned already (nothing to write)
        again = stage2("pin", str(demo_cache.profile), "--hub-folder", str(upstream), env=env)
        assert again.returncode == 0, again.tail()


def test_an_editors_lock_link_beside_the_action_manifests_is_not_the_kits(
    demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """Emacs leaves a link to nothing, `.#racer.jsonl`, beside a manifest it edits: it was read as
    an action manifest (verify listed every sidecar as unnamed; a build stopped late on a raw
    FileNotFoundError: QA). A hidden file is not the kit's; a link to nothing under a kit name is
    refused at once, by name."""
    from helpers.faults import copy_kit

    profile = copy_kit(demo_cache, tmp_path / "kit")
    actions = profile.parent / "derived" / "action_manifests"
    (actions / ".#racer.jsonl").symlink_to("root@vm.12345:1733490000")
    (tmp_path / "root").mkdir()
    r = stage2("verify", str(profile), "--data-root", str(tmp_path / "root"))
    assert r.returncode == 1 and ".#racer.jsonl" not in r.stdout + r.stderr, r.tail()  # unbuilt: a report
    (actions / "zz.jsonl").symlink_to("nothing-there")
    r = stage2("verify", str(profile), "--data-root", str(tmp_path / "root"))
    line = _one_line(r, "verify")
    assert f"{actions / 'zz.jsonl'} is a symbolic link to nothing, not a regular file" in line, line


def test_a_build_whose_step_raises_an_unnamed_error_exits_3(demo_cache: DemoPaths, tmp_path: Path) -> None:
    """A step that raises what no guard names (here: the sidecar step replaced by one that divides
    by zero, before the command builds its definitions) is a bug: the build says `internal error:`
    in one line, prints no traceback, and exits 3 as every command's bug does (it exited 1, as if a
    check had found a problem in the data: QA)."""
    code = (
        "import stage2_data.steps as s\n"
        "def broken(*a, **k):\n"
        "    return 1 // 0\n"
        "s.step_sidecars = broken\n"
        "import sys\n"
        "from stage2_data.cli import run\n"
        "sys.argv = ['stage2', *sys.argv[1:]]\n"
        "run()\n"
    )
    argv = ["build", "--profile", str(demo_cache.profile), "--data-root", str(tmp_path / "root"),
            "--hub-folder", str(demo_cache.upstream), "--run-in-process", "--no-progress"]  # fmt: skip
    r = run(python_argv(code, *argv), env=subprocess_env(drop=("CI",), DAGSTER_HOME=str(tmp_path / "home")))
    out = r.stdout + r.stderr
    assert r.returncode == 3, r.tail()
    assert "internal error: ZeroDivisionError" in out and "Traceback" not in out, out
