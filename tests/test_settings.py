"""The ``STAGE2_*`` settings the code location parses (``BuildConfig.from_env``): every value it
takes, and every other one refused with a ``SettingError`` naming the variable and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stage2_data.errors import SettingError
from stage2_pipelines.config import (
    EXECUTOR_NAMES,
    BuildConfig,
    check_dagster_home,
    check_settings,
    env_executor,
    env_flag,
    env_store_options,
)
from stage2_pipelines.executors import EXECUTORS


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("", False),
        ("0", False),
        ("no", False),
        ("False", False),
        ("1", True),
        ("true", True),
        (" YES ", True),
    ],
)
def test_a_flag_is_a_yes_or_a_no(raw: str, value: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGE2_REVERIFY", raw)
    assert env_flag("STAGE2_REVERIFY") is value


def test_a_flag_that_is_neither_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not read as yes: ``maybe`` (or a typo of ``false``) used to turn re-hashing on."""
    monkeypatch.setenv("STAGE2_REVERIFY", "maybe")
    with pytest.raises(SettingError, match=r"^STAGE2_REVERIFY='maybe' is not a yes or no\. Fix: "):
        env_flag("STAGE2_REVERIFY")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{bad", "STAGE2_STORE_OPTIONS is not valid JSON (Expecting property name"),
        ("[1]", "STAGE2_STORE_OPTIONS holds a JSON array, not an object"),
        ('"secret"', "STAGE2_STORE_OPTIONS holds a JSON string, not an object"),
        ("null", "STAGE2_STORE_OPTIONS holds a JSON null, not an object"),
    ],
)
def test_storage_options_that_are_not_an_object_are_refused_unechoed(
    raw: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named, with the fix (an example that works in a shell), and the value never echoed: storage
    options may hold credentials."""
    monkeypatch.setenv("STAGE2_STORE_OPTIONS", raw)
    with pytest.raises(SettingError) as got:
        env_store_options()
    said = str(got.value)
    assert said.startswith(says) and "Fix: set it to a JSON object" in said, said
    assert raw in says or raw not in said.split(" Fix: ")[0], said  # ("null" is the kind it names)


def test_storage_options_as_a_build_passes_them_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """``to_env`` of a config gives that config again (its settings, as a build's code server loads
    them): storage options, the reverify flag, the executor and its scheduler."""
    config = BuildConfig(
        profile_path="/p.toml",
        data_root="/d",
        endpoint="http://127.0.0.1:9",
        reverify=True,
        store_url="s3://bucket/stores",
        store_options={"endpoint_url": "http://127.0.0.1:9000", "anon": True},
        executor="dask",
        dask_address="tcp://127.0.0.1:8786",
    )
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    assert BuildConfig.from_env() == config
    monkeypatch.setenv("STAGE2_STORE_OPTIONS", "")
    assert env_store_options() == {}


def test_the_executor_names_are_the_executors() -> None:
    """``config`` cannot import ``executors`` (which imports it): the names it accepts are kept equal here."""
    assert EXECUTOR_NAMES == EXECUTORS


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"STAGE2_EXECUTOR": "foo"},
            "STAGE2_EXECUTOR='foo' is not an executor (in_process, multiprocess, dask, k8s)",
        ),
        ({"STAGE2_EXECUTOR": "dask"}, "STAGE2_EXECUTOR=dask needs STAGE2_DASK_ADDRESS"),
        (
            {"STAGE2_EXECUTOR": "k8s", "STAGE2_K8S_EXECUTOR_CONFIG": "/nonexistent/executor.yaml"},
            "STAGE2_EXECUTOR=k8s: its executor config /nonexistent/executor.yaml does not exist",
        ),
    ],
    ids=["unknown", "dask-without-scheduler", "k8s-without-config"],
)
def test_an_executor_the_definitions_cannot_build_is_named(
    env: dict[str, str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STAGE2_DASK_ADDRESS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as got:
        env_executor()
    assert str(got.value).startswith(says) and " Fix: " in str(got.value), str(got.value)


def test_the_default_executor_is_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STAGE2_EXECUTOR", raising=False)
    monkeypatch.delenv("STAGE2_DASK_ADDRESS", raising=False)
    assert env_executor() == ("in_process", None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STAGE2_REVERIFY", "maybe"),
        ("STAGE2_STORE_OPTIONS", "{bad"),
        ("STAGE2_STORE_OPTIONS", "[1]"),
        ("STAGE2_EXECUTOR", "foo"),
    ],
)
def test_the_config_of_the_environment_refuses_each_one(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BuildConfig.from_env`` (what the code location loads) raises the named error, not the
    JSON, type or value error of a parse, nor reads ``maybe`` as yes."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=f"^{name}"):
        BuildConfig.from_env()


@pytest.mark.parametrize("where", ["file", "under-a-file", "fifo", "broken-link"])
def test_a_dagster_home_that_cannot_be_a_folder_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DAGSTER_HOME naming a file (or a FIFO, a broken link, a path through a file): a SettingError
    naming the variable and what stands there; the fix changes the setting, never the file (a
    user's); with the data root known, it names the instance the build then uses."""
    mine = tmp_path / "mine"
    if where == "fifo":
        os.mkfifo(mine)
    elif where == "broken-link":
        mine.symlink_to(tmp_path / "gone")
    else:
        mine.write_text("a user's file\n")
    home = mine / "home" if where == "under-a-file" else mine
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with pytest.raises(SettingError) as got:
        check_settings()
    said = str(got.value)
    assert said.startswith(f"DAGSTER_HOME={str(home)!r} "), said
    kind = {"fifo": "a FIFO", "broken-link": "a broken symbolic link"}.get(where, "a regular file")
    assert f"{kind}, not a folder" in said, said
    if where == "under-a-file":
        assert f"goes through {mine}, a regular file" in said, said
    assert (
        "Fix: set DAGSTER_HOME to a folder (or unset it: `stage2 build` then uses <data root>/.dagster"
        in said
    )
    assert "move or delete" not in said, said
    with pytest.raises(SettingError) as got:
        check_dagster_home(tmp_path / "data")
    assert str(got.value).endswith(f"(or unset it: the build then uses {tmp_path / 'data' / '.dagster'})")
    assert mine.is_symlink() or mine.exists()


@pytest.mark.parametrize("where", ["folder", "to-make", "unset", "empty"])
def test_a_dagster_home_that_is_or_can_be_a_folder_is_taken(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "unset":
        monkeypatch.delenv("DAGSTER_HOME", raising=False)
    else:
        value = {"folder": str(tmp_path), "to-make": str(tmp_path / "a" / "b"), "empty": ""}[where]
        monkeypatch.setenv("DAGSTER_HOME", value)
    check_dagster_home(tmp_path / "data")
    check_settings()


def test_stage2_build_refuses_an_executor_name_that_is_none(tmp_path: Path) -> None:
    """STAGE2_EXECUTOR=foo was taken without a word by `stage2 build` (its own runs take
    --executor), a no-op and --reverify included, and then broke `make ui` and the daemon (QA,
    stop 56): refused before any work, as the other settings read late are."""
    from helpers.cli import stage2, subprocess_env

    r = stage2(
        "build", "--profile", str(tmp_path / "p.toml"), "--data-root", str(tmp_path / "root"),
        env=subprocess_env(STAGE2_EXECUTOR="foo"),
    )  # fmt: skip
    assert r.returncode == 2, r.tail()
    assert r.stderr.startswith("stage2 build: error: STAGE2_EXECUTOR='foo' is not an executor"), r.stderr
    assert "Fix: " in r.stderr and not (tmp_path / "root").exists()
