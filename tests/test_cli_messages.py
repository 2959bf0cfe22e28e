"""The CLI's messages as a user meets them: every suggested command works when pasted in a shell
(paths quoted, the hub it needs named), `--json` is one object on an error too, and the help and the
command reference say what the commands take."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.cli import REPO, Ran, stage2, subprocess_env

from stage2_data.acquire import HubSource, download_archive
from stage2_data.acquire.download import PinDisagreesError
from stage2_data.acquire.endpoint import pin_check_command
from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.profile import load_profile

FAST = {"attempts": 1, "backoff": 0.0}


def _pasted(command: str, **kw: object) -> Ran:
    """``command`` (a ``stage2 ...`` line as a message shows it) run as a shell would split it."""
    argv = shlex.split(command)
    assert argv[0] == "stage2", command
    return stage2(*argv[1:], **kw)  # type: ignore[arg-type]


def _backquoted(text: str, start: str) -> list[str]:
    return [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(start)]


# ----- a. the pin a build disagrees with -----------------------------------------------------------
def _spaced_demo(demo: DemoPaths, tmp_path: Path) -> Path:
    """The demo's profile in a folder whose name has a space (its kit beside it)."""
    spaced = tmp_path / "my kits" / "kit"
    spaced.parent.mkdir()
    demo.kit_root.rename(spaced)
    return spaced / demo.profile.name


def test_a_wrong_pin_names_a_pin_command_that_runs_against_the_folder_the_build_served(
    demo: DemoPaths, tmp_path: Path
) -> None:
    profile_path = _spaced_demo(demo, tmp_path)
    profile = load_profile(profile_path)
    spec = profile.archives[0]
    assert spec.size is not None
    root = tmp_path / "data root"
    with HubServer(demo.upstream, repo_id=demo.repo_id, revision=demo.revision) as hub:
        source = HubSource.from_profile(profile, endpoint=hub.url)
        download_archive(source, spec, root, profile=profile, **FAST)  # type: ignore[arg-type]
        text = profile_path.read_text()
        profile_path.write_text(text.replace(f"size = {spec.size}\n", f"size = {spec.size + 1}\n", 1))
        bad = load_profile(profile_path)
        # the build's runs serve its --hub-folder on a loopback port of their own, gone when it ends
        served = replace(source, hub_folder=str(demo.upstream))
        with pytest.raises(PinDisagreesError) as ei:
            download_archive(served, bad.archives[0], root, profile=bad, **FAST)  # type: ignore[arg-type]
        with pytest.raises(PinDisagreesError) as unknown_folder:
            download_archive(source, bad.archives[0], root, profile=bad, **FAST)  # type: ignore[arg-type]
    (command,) = _backquoted(ei.value.fix or "", "stage2 pin")
    assert hub.url not in command and "--hub-folder" in command, command
    p = _pasted(command, timeout=120)  # the loopback port is gone; the command serves the folder itself
    assert p.returncode == 2, p.tail()
    assert "Fix:" in p.stderr and f"size {spec.size + 1} in the profile, {spec.size} upstream" in p.stderr
    assert str(profile_path) in p.stderr and "usage:" not in p.stderr
    # the folder not known: what to put in place of DIR is said, and no dead loopback --endpoint
    said = unknown_folder.value.fix or ""
    assert "--hub-folder DIR --check" in said and "--endpoint" not in said, said
    assert shlex.quote(str(profile_path)) in said, said


def test_the_pin_command_names_a_lasting_endpoint_and_quotes_paths() -> None:
    where = "/kits/my kit/profile.toml"
    real, mirror = "https://huggingface.co", "https://hub.example.org/a b"
    assert pin_check_command(where, real) == "`stage2 pin '/kits/my kit/profile.toml' --check`"
    assert pin_check_command(where, mirror) == (
        "`stage2 pin '/kits/my kit/profile.toml' --endpoint 'https://hub.example.org/a b' --check`"
    )


def test_pin_takes_a_hub_folder_as_build_does(demo: DemoPaths, tmp_path: Path) -> None:
    profile_path = _spaced_demo(demo, tmp_path)
    p = stage2("pin", str(profile_path), "--hub-folder", str(demo.upstream), "--check", timeout=120)
    assert p.returncode == 0 and "pinned and matching the hub's listing" in p.stdout, p.tail()
    gone = stage2("pin", str(profile_path), "--hub-folder", str(tmp_path / "nowhere"), timeout=120)
    assert gone.returncode == 2 and "--hub-folder" in gone.stderr and "does not exist" in gone.stderr
    both = stage2("pin", str(profile_path), "--hub-folder", "x", "--endpoint", "y", timeout=120)
    assert both.returncode == 2 and "not allowed with" in both.stderr, both.tail()


# ----- b. the unknown archives of a build ------------------------------------------------------------
def test_a_build_with_unknown_archives_names_a_pin_write_that_takes_the_profile(tmp_path: Path) -> None:
    spaced = tmp_path / "my profiles" / "core.toml"
    spaced.parent.mkdir()
    spaced.write_text((REPO / "manifests" / "stage2_core_v1.toml").read_text())
    assert load_profile(spaced).unknown_archives(), "the committed profile has unknown archives"
    env = subprocess_env(HF_HUB_OFFLINE="1")
    p = stage2("build", "--profile", str(spaced), "--data-root", str(tmp_path / "root"), env=env, timeout=120)
    assert p.returncode == 2 and "unknown = true" in p.stderr, p.tail()
    commands = _backquoted(p.stderr, "stage2 pin")
    assert commands and all(shlex.split(c)[2] == str(spaced) for c in commands), commands
    (write,) = [c for c in commands if c.endswith("--write")]
    # pasted: it reads the profile (offline here: the hub is not asked), not a usage error
    ran = _pasted(write, env=env, timeout=120)
    assert ran.returncode != 0 and "usage:" not in ran.stderr and "required" not in ran.stderr, ran.tail()


# ----- c. the install line without the pipeline extra --------------------------------------------------
def test_without_the_pipeline_extra_no_package_index_is_offered() -> None:
    from stage2_data.cli import install_line, missing_extra_text

    said = missing_extra_text("build")
    assert install_line() in said and "package index" not in said, said
    assert "pip install 'stage2-data[pipeline]'" not in said, said


# ----- e. help, the reference, profile names -------------------------------------------------------------
def test_serve_hub_help_says_what_each_option_is() -> None:
    p = stage2("serve-hub", "--help")
    assert p.returncode == 0, p.tail()
    text = p.stdout
    assert "Serve FOLDER as one Hugging Face dataset repository" in text
    options = text.split("options:", 1)[1]
    for option in ("--repo-id REPO_ID", "--revision REVISION", "--port PORT"):
        line = next(ln for ln in options.splitlines() if ln.strip().startswith(option))
        assert line.strip() != option, f"{option} has no help text:\n{text}"
    assert re.search(r"^\s+folder\s+\S", text, re.MULTILINE), text


def _synopsis() -> dict[str, str]:
    doc = (REPO / "docs" / "commands.md").read_text()
    block = doc.split("```text\n", 1)[1].split("```", 1)[0]
    out: dict[str, str] = {}
    name = ""
    for line in block.splitlines():
        if line.startswith("stage2 "):
            name = line.split()[1]
            out[name] = line
        elif name:
            out[name] += " " + line.strip()
    return out


@pytest.mark.parametrize(
    "command",
    [
        "build",
        "pin",
        "list",
        "verify",
        "validate",
        "summary",
        "preview",
        "export-rrd",
        "merge",
        "gc",
        "demo",
        "serve-hub",
    ],
)
def test_the_reference_synopsis_lists_every_option_the_help_lists(command: str) -> None:
    usage = stage2(command, "--help", env=subprocess_env(COLUMNS="1000")).stdout.split("\n\n", 1)[0]
    options = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage)) - {"--help", "--profile"}
    line = _synopsis()[command]
    assert {o for o in options if o not in line} == set(), line


def test_an_invalid_profile_name_is_said_in_words(demo: DemoPaths, tmp_path: Path) -> None:
    bad = tmp_path / "bad profile.toml"
    text = demo.profile.read_text()
    name = next(ln for ln in text.splitlines() if ln.startswith("name = "))
    bad.write_text(text.replace(name, 'name = "my profile!"', 1))
    p = stage2("list", str(bad), "--data-root", str(tmp_path / "root"), timeout=120)
    assert p.returncode == 2, p.tail()
    line = p.stderr.strip()
    assert "should match pattern" not in line and "^[" not in line, line
    assert f"invalid profile {bad}: key 'name' = 'my profile!'" in line, line
    assert "letters, digits, '_', '.' and '-'" in line and "start with a letter or a digit" in line, line


# ----- f. --json on an error ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["summary", "{none}"],
        ["validate", "{none}"],
        ["preview", "{none}"],
        ["export-rrd", "{none}", "0"],
        ["gc", "{none}"],
        ["merge", "{none}", "{none}", "--out", "{tmp}/merged"],
        ["verify", "{none}", "--data-root", "{tmp}"],
        ["list", "{none}", "--data-root", "{tmp}"],
        ["pin", "{none}"],
        ["summary"],  # a usage error
        [],  # no command at all: `stage2 --json`
    ],
    ids=lambda a: " ".join(a) or "no command",
)
def test_json_is_one_object_on_an_error_too(argv: list[str], tmp_path: Path) -> None:
    args = [a.format(none=tmp_path / "none", tmp=tmp_path) for a in argv]
    p = stage2(*args, "--json", timeout=120)
    assert p.returncode == 2, p.tail()
    doc = p.json()  # the whole of stdout: one object
    assert doc["ok"] is False and doc["error"] and doc["message"] and doc["fix"], doc
    assert "Traceback" not in p.stderr and p.stderr.strip(), p.tail()
