"""Which errors stop `stage2 build` with exit 2 (the environment: the build could not run) rather
than 1 (a problem found in the data): each error says it (``Stage2Error.could_not_run``), every
subclass inherits it, and the build's exit code reads it from the failed steps. The faults that
reach it through `stage2 build` are in tests/test_faults_*.py (exit 2 asserted per row)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import stage2_data
from stage2_data.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    FileSystemError,
    HubError,
    KitError,
    ProblemsError,
    Stage2Error,
    StoreValidationError,
)
from stage2_pipelines.commands import build_exit_code
from stage2_pipelines.runs import INTERNAL_ERROR


def _every_error_class() -> set[type[Stage2Error]]:
    for mod in pkgutil.walk_packages(stage2_data.__path__, "stage2_data."):
        if not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    out: set[type[Stage2Error]] = set()
    todo: list[type[Stage2Error]] = [Stage2Error]
    while todo:
        cls = todo.pop()
        out.add(cls)
        todo += cls.__subclasses__()
    return out


# the library's errors that are the environment's (exit 2), by name; every other is the data's
ENVIRONMENT = {
    "DiskSpaceError",
    "FileSystemError",
    "HubError",
    "HubOfflineError",
    "RetryAfterTooLongError",
    "UnknownRevisionError",
    "PinDisagreesError",
    "StorageAccessError",
    "StoresInUseError",
}
# hub errors that are not: a stop (said as such), several downloads (each names its own error)
NOT_THE_HUB = {"DownloadCancelled", "RetryCancelled", "DownloadsFailedError"}


def test_every_library_error_says_whether_the_environment_stopped_it() -> None:
    classes = _every_error_class()
    names = {c.__name__ for c in classes}
    assert names >= ENVIRONMENT | NOT_THE_HUB, (ENVIRONMENT | NOT_THE_HUB) - names
    said = {c.__name__ for c in classes if c.could_not_run}
    assert said == ENVIRONMENT, said ^ ENVIRONMENT


def test_a_new_kind_of_hub_error_is_the_environments_without_a_list() -> None:
    class AnotherHubError(HubError):
        pass

    class AnotherProblem(ProblemsError):
        pass

    assert AnotherHubError("x").could_not_run
    assert not AnotherProblem("x", ["y"]).could_not_run
    assert DiskSpaceError("x").could_not_run and FileSystemError("x").could_not_run
    assert not ChecksumMismatchError.could_not_run
    assert not KitError("x", ["y"]).could_not_run and not StoreValidationError("x", ["y"]).could_not_run


def _summary(*errors: dict[str, object]) -> dict[str, object]:
    return {"ok": False, "errors": list(errors)}


@pytest.mark.parametrize(
    ("errors", "code"),
    [
        ([{"message": "x", "error": "HubError", "could_not_run": True}], 2),
        ([{"message": "x", "error": "KitError", "could_not_run": False}], 1),
        # a failed check's error has no class: the data's
        ([{"message": "check a:b failed: c", "asset": "a", "check": "b"}], 1),
        # one environment error among the data's: the build could not run
        (
            [
                {"message": "x", "error": "KitError", "could_not_run": False},
                {"message": "y", "error": "DiskSpaceError", "could_not_run": True},
            ],
            2,
        ),
        # a bug outranks everything
        (
            [
                {"message": f"{INTERNAL_ERROR}KeyError: 'a'", "error": "KeyError", "could_not_run": False},
                {"message": "y", "error": "DiskSpaceError", "could_not_run": True},
            ],
            3,
        ),
    ],
    ids=["environment", "data", "check", "mixed", "bug"],
)
def test_build_exit_code(errors: list[dict[str, object]], code: int) -> None:
    assert build_exit_code(_summary(*errors)) == code
    assert build_exit_code({"ok": True, "errors": []}) == 0
