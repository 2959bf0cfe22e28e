"""The fault matrix, profile rows: a profile that does not load is refused by `stage2 build` before
anything is written (one line, exit 2); expected totals the data does not reach fail a check of the
final stage.

The matrix: tests/faults_table.py (rows), tests/helpers/faults.py (what every row asserts).
"""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import REPO, stage2
from helpers.faults import (
    NOWHERE,
    SMALL,
    Prepared,
    converge,
    copy_kit,
    copy_root,
    demo_hub,
    fault_cases,
    final_refused,
    forget_archive,
    outside,
    refused,
    run_cfg,
)
from pydantic import ValidationError

from stage2_data import checks as C
from stage2_data.commands.common import HUB_FOLDER_LEFT_OUT, KIT_ROOT_LEFT_OUT
from stage2_data.demo import DemoPaths
from stage2_data.errors import ProfileError
from stage2_data.profile import CROSS_CHECK, Profile, load_profile, parse_profile
from stage2_pipelines.runs import run_selection

# A broken profile: each (profile text, what the one-line refusal names besides the file and "Fix:").
Broken = Callable[[DemoPaths], list[tuple[str, tuple[str, ...]]]]


def _branch(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    text = demo.profile.read_text().replace(f'revision = "{demo.revision}"', 'revision = "main"')
    return [(text, ("source.revision", "'main'", "40-hex"))]


def _unknown_key(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    text = "bogus = 1\n" + demo.profile.read_text()
    return [(text, ("unknown key 'bogus'", "remove it or check its spelling"))]


def _quarantined_active(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    q = sorted(load_profile(demo.profile).quarantined_paths())[0]
    text = demo.profile.read_text() + f'\n[[archives]]\npath = "{q}"\ncache_key = "quarantined_key"\n'
    return [(text, (q, "also listed under [[archives]]", "remove one of the two entries"))]


def _archive_twice(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    """One [[archives]] entry written twice: named by the second one's key and line (it was named
    as key '(top level)', with no line)."""
    good = demo.profile.read_text()
    first = good.index("[[archives]]")
    second = good.index("[[archives]]", first + 1)
    text = good[:second] + good[first:second] + good[second:]
    path = load_profile(demo.profile).archives[0].path
    line = text.count("\n", 0, text.index(f'path = "{path}"', second)) + 1
    return [
        (
            text,
            (
                f"key 'archives[1].path' (line {line}): '{path}' is listed twice (also as archives[0].path)",
                "remove one of the two entries",
            ),
        )
    ]


def _dotdot(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    good = demo.profile.read_text()
    victim = f"{SMALL}.tar"
    kit = good.replace(load_profile(demo.profile).kit.pair_manifest, "../../etc/pairs.jsonl")
    archive = good.replace(f'path = "{victim}"', f'path = "../{victim}"')
    return [
        (archive, (f"../{victim}", "contains '..'", "plain relative path")),
        (kit, ("kit.pair_manifest", "contains '..'")),
    ]


def _own_file_as_archive(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    """An archive's path naming the build's own record of a verified archive (a typo, or a listing
    pasted whole): the build judged that record against the pin and moved it aside (QA)."""
    good = demo.profile.read_text()
    victim = f"{SMALL}.tar"
    said = "names a file stage2 keeps beside the archives"
    return [
        (
            good.replace(f'path = "{victim}"', f'path = "{victim}.verified.json"'),
            (f"{victim}.verified.json", said),
        ),
        (good.replace(f'path = "{victim}"', f'path = ".partial/{victim}"'), (f".partial/{victim}", said)),
    ]


def _name_too_long(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    """A profile name longer than a folder name may be: it loaded, and the build failed only at the
    store, after every download, with a raw "File name too long" (QA)."""
    good = demo.profile.read_text()
    name = load_profile(demo.profile).name
    long = "x" * 300
    return [
        (good.replace(f'name = "{name}"', f'name = "{long}"', 1), ("key 'name'", "(line ", "at most 100"))
    ]


def _wrong_type(demo: DemoPaths) -> list[tuple[str, tuple[str, ...]]]:
    """A count written as a bool, text or a float was taken as a number (`size = true` as 1 B: a
    verified archive then disagreed with its pin); a size no file can have was taken too."""
    good = demo.profile.read_text()
    size = re.search(r"^size = (\d+)$", good, re.M)
    cache_dirs = re.search(r"^cache_dirs = (\d+)$", good, re.M)
    assert size and cache_dirs
    one = good.replace(size.group(0), "size = true", 1)
    text = good.replace(cache_dirs.group(0), f'cache_dirs = "{cache_dirs.group(1)}"', 1)
    floats = good.replace(size.group(0), f"size = {size.group(1)}.0", 1)
    # beyond any file's size: loaded, then listed as 90949470177.3 TiB to fetch (QA, stop 56)
    huge = good.replace(size.group(0), "size = 99999999999999999999999", 1)

    def line(m: re.Match[str]) -> str:  # each message names the line of the value, and the value
        return f"(line {good.count(chr(10), 0, m.start()) + 1})"

    whole = "it must be a whole number"
    return [
        (one, ("key 'archives[0].size' = True", line(size), whole)),
        (text, (f"key 'expected.cache_dirs' = '{cache_dirs.group(1)}'", line(cache_dirs), whole)),
        (floats, (f"key 'archives[0].size' = {size.group(1)}.0", line(size), whole)),
        (
            huge,
            ("key 'archives[0].size' = 99999999999999999999999", line(size), "less than 9223372036854775808"),
        ),
    ]


@fault_cases(
    net_branch=_branch,
    prof_wrong_type=_wrong_type,
    prof_unknown_key=_unknown_key,
    prof_quarantined_active=_quarantined_active,
    prof_archive_twice=_archive_twice,
    prof_dotdot=_dotdot,
    prof_own_file_as_archive=_own_file_as_archive,
    prof_name_too_long=_name_too_long,
)
def test_fault_profile_refused(demo: DemoPaths, tmp_path: Path, dagster_home: Path, case: Broken) -> None:
    """`stage2 build` on a broken profile: exit 2, one line naming the key and file, nothing written."""
    from stage2_pipelines.config import BuildConfig
    from stage2_pipelines.runner import build_all

    good = demo.profile.read_text()
    for bad_text, names in case(demo):
        demo.profile.write_text(bad_text)
        before = outside(tmp_path)
        root = tmp_path / "root"
        out = stage2("build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", NOWHERE)
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        for n in (str(demo.profile), "Fix:", *names):
            assert n in out.stderr, f"{n!r} not in {out.stderr}"
        assert not root.exists()
        assert outside(tmp_path) == before
        with pytest.raises(ProfileError):  # build_all itself refuses too, before it takes the lock
            build_all(BuildConfig(str(demo.profile), str(root), endpoint=NOWHERE))
        assert not root.exists()
        demo.profile.write_text(good)
        load_profile(demo.profile)


@pytest.mark.usefixtures("fault_instance")
def test_fault_prof_totals(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    good = demo.profile.read_text()
    n = load_profile(demo.profile).expected.trajectories
    demo.profile.write_text(good.replace(f"trajectories = {n}\n", f"trajectories = {n + 1}\n"))
    line = good[: good.index(f"trajectories = {n}\n")].count("\n") + 1
    r, root = final_refused(
        prepared,
        demo,
        tmp_path,
        f"trajectories is {n}, expected {n + 1}",
        "[expected]",
        f"`expected.trajectories` in {demo.profile}, line {line}",  # where to correct a wrong profile
        check=C.TRAJECTORIES_MATCH_EXPECTED,
    )
    demo.profile.write_text(good)
    converge(prepared, run_cfg(demo, root), root, [])


@pytest.mark.usefixtures("fault_instance")
def test_fault_prof_unknown_archive(prepared: Prepared, demo: DemoPaths, tmp_path: Path) -> None:
    """An entry whose upstream name is not known: nothing is requested under the guess; `stage2 pin`
    names the closest upstream archives; once named, it pins and downloads."""
    good = demo.profile.read_text()
    real = f"{SMALL}.tar"
    guess = f"{SMALL}_rfm_libero10.tar"
    spec = load_profile(demo.profile).archive(real)
    table = f'path = "{real}"\ncache_key = "{SMALL}"\nsize = {spec.size}\nsha256 = "{spec.sha256}"\n'
    assert table in good
    demo.profile.write_text(good.replace(table, f'path = "{guess}"\ncache_key = "{SMALL}"\nunknown = true\n'))
    root = copy_root(prepared, tmp_path / "root")
    forget_archive(root, real)
    before = outside(tmp_path, root)
    with demo_hub(demo) as hub:
        out = stage2("pin", str(demo.profile), "--endpoint", hub.url)
        assert out.returncode == 1, out.tail()
        assert f"{guess} (unknown): closest upstream: {real}" in out.stderr, out.stderr
        assert "Fix:" in out.stderr and "delete its `unknown = true` line" in out.stderr
        cfg = run_cfg(demo, root, hub.url)
        r = run_selection(cfg, ["archive_file"], SMALL)
        refused(r, guess, "marked unknown = true", "stage2 pin")
        # `stage2 build` refuses the profile up front: one line naming the entry, exit 2
        out = stage2("build", "--profile", str(demo.profile), "--data-root", str(root), "--endpoint", hub.url)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.tail()
        assert "archives[" in out.stderr and f"({guess})" in out.stderr and "stage2 pin" in out.stderr
        assert not [p for _, p, _ in hub.log_snapshot() if guess in p]  # never requested
        assert outside(tmp_path, root) == before
        # named from pin's suggestion, `unknown` deleted: pin fills it in, and it downloads
        demo.profile.write_text(good.replace(table, f'path = "{real}"\ncache_key = "{SMALL}"\n'))
        out = stage2("pin", str(demo.profile), "--endpoint", hub.url, "--write")
        assert out.returncode == 0, out.tail()
        assert load_profile(demo.profile).archive(real) == spec
        assert run_selection(cfg, ["archive_file"], SMALL)["success"]
    demo.profile.write_text(good)


@fault_cases(prof_kit_root_wrong="wrong")
def test_fault_kit_root_wrong(tmp_path: Path, demo_cache: DemoPaths, case: str) -> None:
    """A kit root that holds none of the kit's files (a wrong --kit-root, or a profile copied away
    from its kit): refused before any download, each missing file named; the right one builds."""
    root = tmp_path / "root"
    away = tmp_path / "away"
    away.mkdir()
    shutil.copy(demo_cache.profile, away / "profile.toml")
    before = outside(tmp_path)
    common = ["--data-root", str(root), "--hub-folder", str(demo_cache.upstream)]
    for argv, kit in (
        (["--profile", str(demo_cache.profile), "--kit-root", str(away)], away),
        (["--profile", str(away / "profile.toml")], away),
    ):
        r = stage2("build", *argv, *common)
        assert r.returncode == 2, r.tail()
        line = r.stderr.strip()
        assert line.startswith(
            f"stage2 build: error: the kit root {kit} holds none of the kit's files (missing: "
        ), line
        assert f"pair_manifest {kit}/" in line and line.endswith(
            "Fix: pass --kit-root the folder holding the kit (by default it is the profile's own folder)"
        ), line
    assert not root.exists() and outside(tmp_path) == before
    r = stage2(
        "build",
        "--profile",
        str(away / "profile.toml"),
        "--kit-root",
        str(demo_cache.profile.parent),
        *common,
    )
    assert r.returncode == 0, r.tail()


@fault_cases(prof_kit_path_typo="typo")
def test_fault_kit_path_typo(tmp_path: Path, demo_cache: DemoPaths, case: str) -> None:
    """One `[kit]` path that names no file: refused before any download (it used to be found after
    every archive was downloaded and extracted), naming the key, its value, its line and the path
    it resolves to, with the fix; corrected, the build starts and succeeds."""
    kit = tmp_path / "kit"
    profile = copy_kit(demo_cache, kit)
    good = profile.read_text()
    m = re.search(r'^pair_manifest = "([^"]+)"$', good, re.M)
    assert m
    profile.write_text(good.replace(m.group(0), 'pair_manifest = "manifests/nope.jsonl"'))
    line = good.count("\n", 0, m.start()) + 1
    root = tmp_path / "root"
    before = outside(tmp_path)
    common = ["--profile", str(profile), "--data-root", str(root), "--hub-folder", str(demo_cache.upstream)]
    r = stage2("build", *common)
    assert r.returncode == 2, r.tail()
    said = r.stderr.strip()
    for part in (
        f"profile {profile}: 1 of the kit's 5 files are missing: ",
        f"[kit] pair_manifest = 'manifests/nope.jsonl' (line {line}): {kit}/manifests/nope.jsonl does not exist",
        f"Fix: correct the path under [kit] in {profile} (relative to the kit root {kit})",
    ):
        assert part in said, (part, said)
    assert "Traceback" not in said and not root.exists() and outside(tmp_path) == before
    profile.write_text(good)
    r = stage2("build", *common)
    assert r.returncode == 0, r.tail()


@fault_cases(prof_kit_root_missing="--kit-root", prof_hub_folder_missing="--hub-folder")
def test_fault_folder_option_missing(tmp_path: Path, demo_cache: DemoPaths, case: str) -> None:
    """A folder option of `stage2 build` that names no folder: refused before any work (a missing
    kit root used to be found only after every archive was downloaded and extracted); for the hub
    folder, `stage2 serve-hub` refuses it the same way, with its other arguments."""
    root = tmp_path / "root"
    (tmp_path / "a-file").write_text("")
    before = outside(tmp_path)
    argv = ["build", "--profile", str(demo_cache.profile), "--data-root", str(root)]
    if case == "--kit-root":
        argv += ["--hub-folder", str(demo_cache.upstream)]
    without = KIT_ROOT_LEFT_OUT if case == "--kit-root" else HUB_FOLDER_LEFT_OUT
    for given, what, cwd in (
        (tmp_path / "missing", "does not exist", REPO),
        (tmp_path / "a-file", "is not a folder", REPO),
        # a relative path, from another folder than the one it was meant from: said where it looked
        (
            Path("missing"),
            f"does not exist (a relative path is taken from the working folder {tmp_path})",
            tmp_path,
        ),
    ):
        r = stage2(*argv, case, str(given), cwd=cwd)
        assert r.returncode == 2, r.tail()
        line = r.stderr.strip()
        assert line == (
            f"stage2 build: error: {case} {given} {what}. Fix: pass an existing folder to {case}, or leave "
            f"it out ({without})"
        ), line
    assert not root.exists() and outside(tmp_path) == before
    if case == "--hub-folder":
        rev = demo_cache.revision
        for args, said in (
            (
                [str(tmp_path / "missing"), "--repo-id", demo_cache.repo_id, "--revision", rev],
                "does not exist",
            ),
            (
                [str(demo_cache.upstream), "--repo-id", "no-slash", "--revision", rev],
                "is not 'namespace/name'",
            ),
            (
                [str(demo_cache.upstream), "--repo-id", demo_cache.repo_id, "--revision", rev[:8]],
                "40-hex commit",
            ),
        ):
            r = stage2("serve-hub", *args, timeout=60)
            assert r.returncode == 2 and said in r.stderr and "Fix:" in r.stderr, r.tail()
            assert "internal error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _without_entry(text: str, path: str) -> str:
    """``text`` (a profile) without the ``[[archives]]`` table of ``path`` (and its blank line)."""
    start = text.index(f'[[archives]]\npath = "{path}"\n')
    end = text.index("\n\n", start) + 2
    return text[:start] + text[end:]


def test_expected_totals_the_entries_contradict_are_refused_when_the_profile_loads(
    demo: DemoPaths, tmp_path: Path
) -> None:
    """An archive removed from a copied profile (and a sidecar total off by one): `stage2 build` and
    `stage2 pin` refuse it when they load it, before any server starts or anything is written, each
    total named with its line and the value that matches, with the file's other problems; the
    values written as said, the profile loads."""
    good = demo.profile.read_text()
    prof = load_profile(demo.profile)
    e = prof.expected
    gone = next(a for a in prof.archives if len(prof.archives_by_cache_key()[a.cache_key]) == 1)
    sidecars = sum(e.sidecars_by_source.values())
    assert e.resolved_sidecars == sidecars  # the demo's own totals agree with its entries
    text = _without_entry(good, gone.path).replace(
        f"resolved_sidecars = {sidecars}\n", f"resolved_sidecars = {sidecars + 1}\n"
    )
    lines = text.splitlines()
    line = {k: lines.index(f"{k} = {getattr(e, k) + (k == 'resolved_sidecars')}") + 1 for k in
            ("cache_dirs", "archives", "resolved_sidecars")}  # fmt: skip
    want = {"cache_dirs": e.cache_dirs - 1, "archives": e.archives - 1, "resolved_sidecars": sidecars}
    root = tmp_path / "root"
    # alone (a build used to start its servers and fail a check of its first run, exit 1), then
    # with another problem of the file (an unknown key on line 1): said in the same line
    for bogus in ("", "bogus = 1\n"):
        demo.profile.write_text(bogus + text)
        before = outside(tmp_path)
        for argv in (
            [
                "build",
                "--profile",
                str(demo.profile),
                "--data-root",
                str(root),
                "--hub-folder",
                str(demo.upstream),
            ],
            ["pin", str(demo.profile), "--hub-folder", str(demo.upstream)],
        ):
            out = stage2(*argv, timeout=120)
            assert out.returncode == 2, out.tail()
            said = out.stderr.strip()
            assert len(said.splitlines()) == 1 and "Traceback" not in said, said
            assert str(demo.profile) in said and ("unknown key 'bogus'" in said) == bool(bogus), said
            for key, value in want.items():
                was = getattr(e, key) + (key == "resolved_sidecars")
                assert f"key 'expected.{key}' = {was} (line {line[key] + bool(bogus)})" in said, said
                assert f"`{key} = {value}`" in said.split("Fix: ", 1)[1], said
            assert not root.exists() and outside(tmp_path) == before
    # the values its fix names, written at the lines it names: the profile loads
    fixed = text.splitlines()
    for key, value in re.findall(r"`(\w+) = (\d+)`", said.split("Fix: ", 1)[1]):
        fixed[line[key] - 1] = f"{key} = {value}"
    demo.profile.write_text("\n".join(fixed) + "\n")
    assert load_profile(demo.profile).expected.archives == e.archives - 1
    demo.profile.write_text(good)


def test_a_profile_saved_with_a_byte_order_mark_loads(demo: DemoPaths, tmp_path: Path) -> None:
    """Some editors save UTF-8 with a byte-order mark; TOML parsers refuse it as "Invalid statement
    (at line 1, column 1)", where nothing visible is wrong. It is not part of the text: the
    profile loads as without it."""
    bom = tmp_path / "profile.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + demo.profile.read_bytes())
    plain = load_profile(demo.profile)
    got = load_profile(bom, kit_root=demo.profile.parent)
    assert got.model_dump(exclude={"profile_path", "kit_root"}) == plain.model_dump(
        exclude={"profile_path", "kit_root"}
    )
    # `stage2 pin` reads the file itself too (to rewrite its pins in place)
    demo.profile.write_bytes(bom.read_bytes())
    checked = stage2("pin", str(demo.profile), "--check", "--hub-folder", str(demo.upstream))
    assert checked.returncode == 0, checked.tail()
    assert "internal error" not in checked.stdout + checked.stderr


def test_problems_between_entries_are_named_by_their_key_and_line(demo_cache: DemoPaths) -> None:
    """The model's checks across entries (a path listed twice, a quarantined path listed as active,
    the parts of one tar under several cache_keys, one cache_key fed by several tars) are raised at
    the key each is about (its loc in the ValidationError, no key written into the message and parsed
    back): each is said once, by its key, with the line where that key is written."""
    good = demo_cache.profile.read_text()
    prof = load_profile(demo_cache.profile)
    first, second, *_ = prof.archives
    part = next(a for a in prof.archives if a.path.endswith(".part-ab"))
    quarantined = prof.quarantined[0].path
    start = good.index(f'[[archives]]\npath = "{first.path}"\n')
    end = good.index("\n\n", start) + 2
    text = good[:end] + good[start:end] + good[end:]  # the first entry twice: archives[1]
    # the second tar under the first's cache_key; a part of a split tar under a key of its own
    text = text.replace(f'cache_key = "{second.cache_key}"', f'cache_key = "{first.cache_key}"', 1)
    at_part = text.index(f'path = "{part.path}"\n')
    text = text[:at_part] + text[at_part:].replace(
        f'cache_key = "{part.cache_key}"', 'cache_key = "other_key"', 1
    )
    text += f'\n[[archives]]\npath = "{quarantined}"\ncache_key = "quarantined_key"\n'

    def line(needle: str, after: int = 0) -> int:
        return text.count("\n", 0, text.index(needle, after)) + 1

    with pytest.raises(ValidationError) as ei:
        Profile.model_validate(tomllib.loads(text))
    found = [(e["type"], e["loc"]) for e in ei.value.errors()]
    assert found == [
        (CROSS_CHECK, ("archives", 1, "path")),
        (CROSS_CHECK, ("quarantined", 0, "path")),
        (CROSS_CHECK, ("archives",)),
        (CROSS_CHECK, ("archives",)),
    ], found
    with pytest.raises(ProfileError) as pe:
        parse_profile(tomllib.loads(text), source="P", text=text)
    repeated = line(f'path = "{first.path}"', end)
    listed = line(f'path = "{quarantined}"')  # under [[quarantined]], before the active entry
    said = [
        f"key 'archives[1].path' (line {repeated}): {first.path!r} is listed twice (also as "
        "archives[0].path); remove one of the two entries",
        f"key 'quarantined[0].path' (line {listed}): "
        f"{quarantined!r} is also listed under [[archives]]; a quarantined file is never downloaded: "
        "remove one of the two entries",
        f"key 'archives': parts of {part.path.rsplit('.part-', 1)[0]!r} name different cache_keys "
        f"{sorted([part.cache_key, 'other_key'])}",
        f"key 'archives': cache_key {first.cache_key!r} is fed by several tars "
        f"{sorted([first.path, second.path])}",
    ]
    assert str(pe.value).startswith("invalid profile P: " + "; ".join(said) + ". Fix: "), str(pe.value)
