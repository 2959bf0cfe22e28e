"""``stores/<profile>/current`` is a symbolic link to the published store (docs/spec/vin-store.md,
Layout). When something else stands there (a user replaced the link by a copy of the store folder,
or by a file), publishing the link moves it, never deleted, into the data root's quarantine folder
(``quarantine/<UTC time>/stores/<profile>/current``, with its ``moved.json``), as a store that
fails the publication gate is moved, and the build goes on; it was a raw ``IsADirectoryError`` of
the rename, exit 2, with a generic fix."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.built import build as build_cli
from helpers.built import build_once, copy_built, fingerprint
from helpers.cli import stage2
from helpers.faults import Prepared

from stage2_data import layout
from stage2_data.errors import StoreError
from stage2_data.storage import StoreLocation


def _moved(root: Path) -> list[tuple[Path, dict]]:
    """(quarantine folder, its moved.json) of every move into ``root``'s quarantine folder."""
    q = layout.quarantine_root(root)
    if not q.is_dir():
        return []
    return [(f, json.loads((f / "moved.json").read_text())) for f in sorted(q.iterdir())]


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_publish_current_moves_a_current_that_is_not_a_link_aside(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "data"
    stores = layout.stores_root(root, "prof")
    (stores / "v2-aaaa").mkdir(parents=True)
    (stores / "v2-aaaa" / "manifest.json").write_text("{}")
    current = stores / layout.CURRENT_LINK
    if kind == "folder":  # `rm current; cp -a v2-... current`, read-only as a published store
        shutil.copytree(stores / "v2-aaaa", current)
        os.chmod(current / "manifest.json", 0o444)
        os.chmod(current, 0o555)
    else:
        current.write_text("not a link")
    moved = StoreLocation.parse(stores).publish_current("v2-aaaa")
    assert current.is_symlink() and os.readlink(current) == "v2-aaaa"
    ((folder, doc),) = _moved(root)
    dest = folder / layout.STORES_DIR / "prof" / layout.CURRENT_LINK
    assert moved == f"{current} -> {dest}"  # the build's `moved aside:` line (it said nothing)
    assert doc["files"] == [{"from": str(current), "to": str(dest)}]
    said = "a folder" if kind == "folder" else "a regular file"
    assert f"`current` was {said}, not a symbolic link" in doc["reason"]
    if kind == "folder":
        assert (dest / "manifest.json").read_text() == "{}"
    else:
        assert dest.read_text() == "not a link"
    # a link is swapped as before (nothing moved)
    (stores / "v2-bbbb").mkdir()
    assert StoreLocation.parse(stores).publish_current("v2-bbbb") is None
    assert os.readlink(current) == "v2-bbbb" and len(_moved(root)) == 1


def test_publish_current_outside_a_data_root_names_the_problem(tmp_path: Path) -> None:
    """No data root around the stores folder (no quarantine folder to move it to): a named error
    saying what ``current`` is and the command that moves it; nothing is moved or deleted."""
    stores = tmp_path / "somewhere"
    (stores / "v2-aaaa").mkdir(parents=True)
    (stores / layout.CURRENT_LINK).mkdir()
    with pytest.raises(StoreError) as ei:
        StoreLocation.parse(stores).publish_current("v2-aaaa")
    msg = str(ei.value)
    assert f"{stores / 'current'} is a folder, not a symbolic link" in msg, msg
    assert f"mv {stores / 'current'} {stores / 'current.moved'}" in msg, msg
    assert (stores / layout.CURRENT_LINK).is_dir() and not (stores / layout.CURRENT_LINK).is_symlink()


# ----- through `stage2 build`, as a user runs it ---------------------------------------------------
pytestmark_build = pytest.mark.usefixtures("fault_instance")


@pytest.fixture(scope="module")
def built(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(prepared, tmp_path_factory.mktemp("built-current") / "root")


@pytestmark_build
def test_build_moves_a_current_folder_aside_and_publishes_the_link(
    prepared: Prepared, built: Path, tmp_path: Path
) -> None:
    """`rm current; cp -a v2-... current`, then `stage2 build`: the build publishes the link again
    (exit 0, the clean fingerprint) and the folder that stood there is in the quarantine folder,
    whole, where `stage2 list` shows it."""
    root = copy_built(built, tmp_path / "root")
    stores = layout.stores_root(root, prepared.profile_name)
    current = stores / layout.CURRENT_LINK
    name = os.readlink(current)
    current.unlink()
    shutil.copytree(stores / name, current, symlinks=True)  # (cp -a: read-only, as the store)
    r = build_cli(prepared.demo.profile, root)
    assert r.returncode == 0 and fingerprint(r) == prepared.fingerprint, r.tail()
    assert current.is_symlink() and os.readlink(current) == name
    ((folder, doc),) = _moved(root)
    dest = folder / layout.STORES_DIR / prepared.profile_name / layout.CURRENT_LINK
    assert "`current` was a folder, not a symbolic link" in doc["reason"]
    assert (dest / "manifest.json").read_bytes() == (stores / name / "manifest.json").read_bytes()
    listed = stage2("list", str(prepared.demo.profile), "--data-root", str(root))
    moved = f"{folder.name}/{layout.STORES_DIR}/{prepared.profile_name}/{layout.CURRENT_LINK}/"
    assert listed.returncode == 0 and moved in listed.stdout, listed.tail()


@pytestmark_build
def test_a_current_folder_is_never_read_as_the_published_store(
    prepared: Prepared, built: Path, tmp_path: Path
) -> None:
    """A folder named ``current`` (a copy of a store, or anything else) is not a publication: the
    build extends nothing from it, and the published-store lookup of the nightly verify and the
    training API says what stands there and what to run, instead of reading the folder."""
    from stage2_data.errors import StoreNotFoundError
    from stage2_data.profile import load_profile
    from stage2_data.steps import current_store

    root = copy_built(built, tmp_path / "root")
    stores = layout.stores_root(root, prepared.profile_name)
    current = stores / layout.CURRENT_LINK
    name = os.readlink(current)
    current.unlink()
    shutil.copytree(stores / name, current, symlinks=True)
    assert StoreLocation.parse(stores).current() is None
    with pytest.raises(StoreNotFoundError) as ei:
        current_store(load_profile(prepared.demo.profile), root)
    msg = str(ei.value)
    assert "is a folder or file, not the symbolic link a build publishes" in msg, msg
    assert str(layout.quarantine_root(root)) in msg, msg
