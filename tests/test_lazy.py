"""The library's packages import their modules on first use (stage2_data/_lazy.py): every name a
package lists resolves, a submodule is reachable as an attribute as before, a name it does not have is
an AttributeError, and importing the package alone imports none of its heavy dependencies."""

from __future__ import annotations

import importlib
import sys

import pytest
from helpers.cli import python, subprocess_env

from stage2_data._lazy import exported_names

LAZY = [
    "stage2_data.acquire",
    "stage2_data.extract",
    "stage2_data.kit",
    "stage2_data.store",
    "stage2_data.steps",
]


@pytest.mark.parametrize("package", LAZY)
def test_every_listed_name_resolves_and_is_in_all(package: str) -> None:
    pkg = importlib.import_module(package)
    assert pkg.__file__ is not None
    names = exported_names(pkg.__file__)
    assert len(names) >= 5
    assert set(names) == set(pkg.__all__)  # the one list and what `import *` and the docs offer agree
    for name, (module, attr) in names.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(f"{package}.{module}"), attr)
    assert set(names) <= set(dir(pkg))


def test_a_submodule_is_an_attribute_and_an_unknown_name_is_an_attribute_error() -> None:
    store = importlib.import_module("stage2_data.store")
    assert store.shard_io is sys.modules["stage2_data.store.shard_io"]
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = store.no_such_name
    with pytest.raises(ImportError):
        exec("from stage2_data.store import no_such_name", {})


def test_importing_a_package_imports_what_is_used_only() -> None:
    """In a fresh interpreter: the packages alone import no heavy dependency; the store's reader
    imports zarr when it is first named, as the eager package did at its import."""
    code = (
        "import json, sys\n"
        "import stage2_data.acquire, stage2_data.extract, stage2_data.kit, stage2_data.store, stage2_data.steps\n"
        "heavy = ('huggingface_hub', 'pyarrow', 'zarr', 'dagster')\n"
        "before = sorted(m for m in heavy if m in sys.modules)\n"
        "from stage2_data.store import VinOfflineDataset\n"
        "print(json.dumps([before, 'zarr' in sys.modules]))\n"
    )
    assert python(code, env=subprocess_env()).last_json() == [[], True]
