"""A package whose names are imported from its modules when first used (PEP 562), so that importing
one light module of it does not import all of them.

A package's ``__init__.py`` lists what it offers as ordinary relative imports under ``if
TYPE_CHECKING:`` (what type checkers, linters and readers see) and ends with::

    __getattr__, __dir__ = lazy_package(__name__, __file__)

That block is the one list: it is read from the file (``ast``), never imported at run time. A name is
imported from its module on first access and kept on the package; a submodule's name imports that
submodule, as an eager package's did. Measured here: ``stage2 build`` with nothing to do imported
huggingface_hub, pyarrow and zarr (~0.35 s of its ~0.9 s) through the re-exports of ``acquire``,
``extract``, ``kit``, ``store`` and ``steps``, for a few constants and a stat walk.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def exported_names(init_file: str) -> dict[str, tuple[str, str]]:
    """What ``init_file`` imports under ``if TYPE_CHECKING:``: each name bound, its module (relative
    to the package) and the name there."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), filename=init_file)
    names: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
                for alias in stmt.names:
                    names[alias.asname or alias.name] = (stmt.module, alias.name)
    return names


def lazy_package(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose ``__init__.py`` is
    ``init_file`` (see the module's docstring)."""
    names = exported_names(init_file)

    def __getattr__(name: str) -> Any:
        if name in names:
            module, attr = names[name]
            value = getattr(importlib.import_module(f"{package}.{module}"), attr)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
