"""pin, list: pin a profile's archives from the hub's listing; show what is on disk."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import os
import re
import shlex
import stat
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The hub client (huggingface_hub and its HTTP stack, a slow import) is imported by the commands that
# talk to the hub, not when the CLI builds its parser.
from ..acquire import DEFAULT_ENDPOINT, archive_state, required_free_parts, resolve_endpoint
from ..errors import HubError, ProfileError, Stage2Error
from ..formats.sha256sums import read_regular_bytes
from ..fsutil import free_bytes, human_bytes, shown
from ..layout import HEX40_RE, quarantine_root, unused_root
from ..profile import Profile, load_profile, parse_profile
from ..publish import atomic_write_bytes
from .common import (
    EXIT_FAILED,
    HUB_FOLDER_LEFT_OUT,
    add_profile,
    add_token_env,
    eprint,
    finish_command,
    print_json,
    require_folder_option,
    with_demo_hub_folder,
)

if TYPE_CHECKING:
    from ..acquire import RemoteFile


def _pin_again(args: argparse.Namespace, mode: str) -> str:
    """``stage2 pin`` with this command's profile and hub (``--endpoint``, ``--hub-folder``), paths
    quoted for a shell, then ``mode`` (``--write``): the command to paste."""
    hub = [
        f"{option} {shlex.quote(str(value))}"
        for option, value in (
            ("--endpoint", getattr(args, "endpoint", None)),
            ("--hub-folder", getattr(args, "hub_folder", None)),
        )
        if value
    ]
    return " ".join(["stage2 pin", shlex.quote(str(args.profile)), *hub, mode])


# ----- pin ---------------------------------------------------------------------------------------
#: the [source] revision a profile is checked with while its own (a branch, tag or short hash) is
#: resolved on the hub; never written, never requested
_UNRESOLVED = "0" * 40


def _floating_revision(path: Path) -> tuple[str, dict[str, Any], str] | None:
    """(text, parsed TOML, revision) of the profile at ``path`` when its [source] revision is a
    string that is not a full commit (a branch name, tag or short hash, which `stage2 pin` resolves);
    None otherwise, and when the file cannot be read or parsed (``load_profile`` names why)."""
    try:
        text = read_regular_bytes(path).decode("utf-8").removeprefix("\ufeff")
        data = tomllib.loads(text)
    except (OSError, Stage2Error, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None
    src = data.get("source")
    rev = src.get("revision") if isinstance(src, dict) else None
    if not isinstance(rev, str) or HEX40_RE.match(rev):
        return None
    return text, data, rev


def _load_for_pin(path: Path) -> tuple[Profile, str | None]:
    """The profile at ``path`` as `stage2 pin` reads it, and the revision to resolve on the hub (None
    when [source] revision is a full commit). A branch name, tag or short hash there, which every
    other command refuses, is set aside: the rest of the profile is checked as ``load_profile``
    checks it (every problem at once, before any request), with a placeholder revision that the
    caller replaces by the commit the hub names."""
    floating = _floating_revision(path)
    if floating is None:
        return load_profile(path), None
    text, data, rev = floating
    if not rev.strip():
        raise ProfileError(
            f"{path}: [source] revision is empty.",
            fix=f'set revision under [source] in {path} to the branch, tag or commit to pin (e.g. "main"), '
            "then run `stage2 pin` again: it writes the full commit",
        )
    data["source"]["revision"] = _UNRESOLVED
    profile = parse_profile(data, source=str(path), path=path, check_totals=True, text=text)
    profile.require_kit_paths()
    return profile, rev


_SOURCE_RE = re.compile(r"^\s*\[\s*source\s*\]\s*(#.*)?$")
_REVISION_RE = re.compile(r"""^(\s*revision\s*=\s*)("[^"\\\n]*"|'[^'\n]*')(.*)$""", re.DOTALL)


def rewrite_revision(text: str, commit: str) -> str:
    """``text`` with the ``revision = "..."`` line of its [source] table set to ``commit``; every other
    line, and a comment after the value, kept. Unchanged when [source] has no such line (an inline
    table, a dotted key, an escaped string): the caller then writes the whole profile."""
    lines = text.splitlines(keepends=True)
    in_source = False
    for n, line in enumerate(lines):
        if _TABLE_RE.match(line):
            in_source = bool(_SOURCE_RE.match(line))
        elif in_source and (m := _REVISION_RE.match(line)):
            lines[n] = f'{m.group(1)}"{commit}"{m.group(3)}'
            return "".join(lines)
    return text


_TABLE_RE = re.compile(r"^\s*\[")
_ARCHIVES_RE = re.compile(r"^\s*\[\[\s*archives\s*\]\]\s*(#.*)?$")


def _key_of(line: str) -> tuple[str, Any] | None:
    """(key, value) of a one-line ``key = value`` TOML line, else None."""
    try:
        doc = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    if len(doc) != 1:
        return None
    ((k, v),) = doc.items()
    return k, v


def rewrite_pins(text: str, pinned: Profile) -> str:
    """``text`` with each ``[[archives]]`` table's ``size``/``sha256`` set from ``pinned``; comments,
    order and every other line are kept. Existing lines are replaced in place; missing ones are
    added after the table's ``cache_key`` (or ``path``) line."""
    pins = {a.path: a for a in pinned.archives}
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not _ARCHIVES_RE.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _TABLE_RE.match(lines[j]):
            j += 1
        table = lines[i:j]
        keys = {n: kv for n, line in enumerate(table) if n and (kv := _key_of(line)) is not None}
        path = next((v for k, v in keys.values() if k == "path"), None)
        spec = pins.get(path) if isinstance(path, str) else None
        if spec is None or spec.size is None or spec.sha256 is None:
            out.extend(table)
            i = j
            continue
        want = {"size": f"size = {spec.size}\n", "sha256": f'sha256 = "{spec.sha256}"\n'}
        new = list(table)
        for n, (k, _) in keys.items():
            if k in want:
                indent = table[n][: len(table[n]) - len(table[n].lstrip())]
                new[n] = indent + want.pop(k)
        if want:
            anchor = max(
                (n for n, (k, _) in keys.items() if k in ("cache_key", "path", "size", "sha256")), default=0
            )
            if not new[anchor].endswith("\n"):
                new[anchor] += "\n"
            new[anchor + 1 : anchor + 1] = [want[k] for k in ("size", "sha256") if k in want]
        out.extend(new)
        i = j
    return "".join(out)


def cmd_pin(args: argparse.Namespace) -> int:
    from ..acquire.hub import require_hub_folder, require_token_env
    from ..errors import HubSetupError

    path = Path(args.profile).resolve()
    token = require_token_env(args.token_env)
    if args.hub_folder:  # served on loopback for this command, as `stage2 build --hub-folder` does
        require_folder_option("--hub-folder", args.hub_folder, HubSetupError, HUB_FOLDER_LEFT_OUT)
        profile, floating = _load_for_pin(path)
        require_hub_folder(profile, args.hub_folder)  # the wrong folder: refused, not "closest" names
        with _served(profile, args.hub_folder, floating=floating is not None) as endpoint:
            return _pin(args, path, profile, floating, endpoint, token)
    endpoint = resolve_endpoint(args.endpoint)
    profile, floating = _load_for_pin(path)
    try:
        return _pin(args, path, profile, floating, endpoint, token)
    except HubError as e:
        raise with_demo_hub_folder(e, path) from None


@contextlib.contextmanager
def _served(profile: Profile, folder: str, *, floating: bool) -> Iterator[str]:
    """``folder`` served on loopback as the profile's repository for the length of the block; its
    URL. At the profile's pinned revision, or (``floating``: the profile names a branch, tag or short
    hash) at the folder's own commit, which ``main`` and its short hash name. HubSetupError when the
    folder cannot be served."""
    from ..demo.hubserver import serve_pinned

    src = profile.source
    revision = None if floating else src.revision
    with serve_pinned(folder, repo_id=src.repo_id, revision=revision, repo_type=src.repo_type) as server:
        yield server.url


def _pin(
    args: argparse.Namespace,
    path: Path,
    profile: Profile,
    floating: str | None,
    endpoint: str,
    token: str | None,
) -> int:
    from ..acquire import HubSource, PinError, pin_profile
    from ..acquire.pin import UnknownEntry, resolve_floating_revision

    hub = f"the hub folder {args.hub_folder}" if args.hub_folder else endpoint
    if floating is not None:  # a branch, tag or short hash: pinned to the commit it names now
        asked = HubSource.from_profile(profile, endpoint=endpoint, token=token)
        asked = dataclasses.replace(asked, revision=floating)
        commit = resolve_floating_revision(asked, where=str(path), again=_pin_again(args, "--write"), hub=hub)
        source_spec = profile.source.model_copy(update={"revision": commit})
        profile = profile.model_copy(update={"source": source_spec})
    source = HubSource.from_profile(profile, endpoint=endpoint, token=token)
    unknown: list[UnknownEntry] = []
    try:
        pinned, changes = pin_profile(profile, source, unknown_out=unknown)
    except PinError as e:  # one line (the CLI's, and --json's object): the profile, every problem, the fix
        raise ProfileError(
            f"{path}: {e.message.splitlines()[0]} " + "; ".join(e.problems), fix=e.fix
        ) from None
    old = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the TOML
    new = rewrite_pins(old, pinned)
    if floating is not None:
        new = rewrite_revision(new, pinned.source.revision)
    try:
        check = parse_profile(tomllib.loads(new), source=str(path), path=path)
        same = check.archives == pinned.archives and check.source.model_dump() == pinned.source.model_dump()
    except (tomllib.TOMLDecodeError, ProfileError):
        same = False
    if not same:  # never write a file that does not say what the listing (and the hub) says
        new = pinned.to_toml()
    changed = new != old
    diff = "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{path}", f"{path} (pinned)")
    )
    written = False
    if args.write and changed:
        # the file as it was kept: its line endings (CRLF stays CRLF) and its exact mode (the
        # umask would take bits off a shared kit's 664 profile)
        raw = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
        atomic_write_bytes(
            path, (new.replace("\n", "\r\n") if b"\r\n" in raw else new).encode("utf-8"), mode=mode
        )
        os.chmod(path, mode)
        written = True
    commit = pinned.source.revision
    resolved = ""
    if floating is not None:
        moves = "" if commit.startswith(floating) else " (a branch or tag moves; a commit does not)"
        resolved = f"[source] revision {floating!r} resolves to commit {commit} at {hub} now{moves}"
    if args.json:
        print_json(
            {
                "profile": str(path),
                "revision": commit,
                "resolved_from": floating,
                "endpoint": source.api_endpoint,
                "changed": changed,
                "written": written,
                "changes": changes,
                "archives": [{"path": a.path, "size": a.size, "sha256": a.sha256} for a in pinned.archives],
                "unknown": [{"index": u.index, "path": u.path, "closest": u.closest} for u in unknown],
            }
        )
    elif not changed and unknown:
        print(
            f"{path}: {len(pinned.archives) - len(unknown)} archive(s) pinned and matching the hub's listing"
        )
    elif not changed:
        print(f"{path}: all {len(pinned.archives)} archive(s) pinned and matching the hub's listing")
    elif written:
        if floating is not None:
            print(f'{path}: {resolved}: wrote revision = "{commit}"')
        if changes or floating is None:
            print(f"{path}: pinned {len(changes)} archive(s) from {source.label} at {commit}")
        for c in changes:
            print(f"  {c}")
    elif args.check:
        if floating is not None:
            print(
                f"{path}: {resolved}: not a pin yet (run `{_pin_again(args, '--write')}`, or write "
                f'revision = "{commit}" under [source])'
            )
        if changes or floating is None:
            print(f"{path}: {len(changes)} archive(s) not pinned yet (run `{_pin_again(args, '--write')}`)")
        for c in changes:
            print(f"  {c}")
    else:
        print(diff, end="")
        if floating is not None:
            eprint(
                f'{path}: {resolved}: write revision = "{commit}" under [source], or re-run with --write, '
                "which writes it with the pins"
            )
        what = f"{len(changes)} archive(s)" if floating is None else f"revision, {len(changes)} archive(s)"
        eprint(f"{path} would change ({what}); re-run with --write to write it")
    if unknown:
        eprint(
            f"{path}: {len(unknown)} [[archives]] entr{'y is' if len(unknown) == 1 else 'ies are'} marked "
            "unknown = true (never requested):"
        )
        for u in unknown:
            eprint(f"  {u.line()}")
        eprint(
            "  Fix: set each entry's path and cache_key to the right upstream archive (every part of a split "
            "one: one [[archives]] entry per part), delete its `unknown = true` line, then run "
            f"`{_pin_again(args, '--write')}`"
        )
    if (changed and not written) or unknown:
        return EXIT_FAILED
    return 0


# ----- list --------------------------------------------------------------------------------------
def _short(sha: str | None) -> str:
    return f"{sha[:12]}…" if sha else "-"


def cmd_list(args: argparse.Namespace) -> int:
    from ..acquire.hub import require_token_env

    token = require_token_env(args.token_env)
    profile = load_profile(args.profile)
    data_root = Path(args.data_root).resolve()
    if data_root.exists() and not data_root.is_dir():
        raise Stage2Error(
            f"data root {data_root} is not a folder.",
            fix="pass the --data-root that `stage2 build` filled (it holds processed_datasets/ and derived/)",
        )
    # a data root that does not exist yet is listed (what a first build there needs), said so: a
    # mistyped one must not read as every archive lost
    fresh = not data_root.exists()
    remote: dict[str, RemoteFile] | None = None
    if args.endpoint:
        from ..acquire import HubSource, list_remote_files

        remote = list_remote_files(HubSource.from_profile(profile, endpoint=args.endpoint, token=token))
    rows: list[dict[str, Any]] = []
    for a in sorted(profile.archives, key=lambda a: a.path):
        st = archive_state(data_root, a)
        row: dict[str, Any] = {
            "path": a.path,
            "cache_key": a.cache_key,
            "size": a.size,
            "sha256": a.sha256,
            "pinned": a.pinned,
            "unknown": a.unknown,
            "state": st.state,
            "bytes_local": st.bytes_local,
        }
        if remote is not None:
            up = remote.get(a.path)
            row["upstream"] = (
                "unknown name"
                if a.unknown
                else "missing"
                if up is None
                else "matches"
                if (up.size, up.sha256) == (a.size, a.sha256)
                else "unpinned"
                if not a.pinned
                else "differs"
            )
        rows.append(row)
    quarantined = [
        {"path": q.path, "reason": q.reason, **({"upstream": q.path in remote} if remote is not None else {})}
        for q in profile.quarantined
    ]
    from ..publish.quarantine import moved_items, quarantined_files

    aside = quarantined_files(data_root)
    aside_items = moved_items(aside, data_root)
    aside_bytes = sum(f.size for f in aside)
    quarantine = {
        "folder": str(quarantine_root(data_root)),
        "moved": [item.to_dict() for item in aside_items],
        "files": [f.to_dict() for f in aside],
        "bytes": aside_bytes,
    }
    from ..extract.inspect import unused_cache_dirs

    unused_dirs = unused_cache_dirs(data_root)
    unused_bytes = sum(d.size for d in unused_dirs)
    unused = {
        "folder": str(unused_root(data_root)),
        "dirs": [d.to_dict() for d in unused_dirs],
        "bytes": unused_bytes,
    }
    download, extraction = required_free_parts(profile, data_root)
    free = free_bytes(data_root)
    by_state = {
        s: [r for r in rows if r["state"] == s] for s in ("verified", "unverified", "partial", "missing")
    }
    totals = {
        "archives": len(rows),
        "pinned": sum(r["pinned"] for r in rows),
        "bytes": profile.total_archive_bytes(),
        **{s: len(v) for s, v in by_state.items()},
        "verified_bytes": sum(r["bytes_local"] for r in by_state["verified"]),
        "partial_bytes": sum(r["bytes_local"] for r in by_state["partial"]),
        "to_download_bytes": download,
        "to_extract_bytes": extraction,
        "required_free_bytes": download + extraction,
    }
    # an archive without a pinned size counts 0 in what the build needs: the need is then a lower bound
    unsized = sum(1 for r in rows if not r["size"] and r["state"] != "verified")
    disk = {
        "path": str(data_root),
        "free_bytes": free,
        "enough": free >= download + extraction and not unsized,
        "archives_without_size": unsized,
    }
    if args.json:
        print_json(
            {
                "profile": profile.name,
                "profile_path": str(profile.profile_path),
                "repo_id": profile.source.repo_id,
                "revision": profile.source.revision,
                "data_root": str(data_root),
                "data_root_exists": not fresh,
                "archives": rows,
                "quarantined": quarantined,
                "quarantine": quarantine,
                "unused": unused,
                "totals": totals,
                "disk": disk,
            }
        )
        return 0
    print(f"profile    {profile.name} ({profile.profile_path})")
    print(f"source     {profile.source.repo_type} {profile.source.repo_id} @ {profile.source.revision}")
    print(
        f"data root  {data_root}" + ("  (does not exist yet: nothing is downloaded there)" if fresh else "")
    )
    if fresh:
        print(
            f"note: {data_root} does not exist, so every archive below is missing there; if a build "
            "filled another folder, pass that one as --data-root",
            file=sys.stderr,
        )
    print()
    w = max([len("ARCHIVE"), *(len(r["path"]) for r in rows)])
    head = f"{'ARCHIVE':<{w}}  {'SIZE':>10}  {'SHA256':<13}  STATE"
    if remote is not None:
        head += "                     UPSTREAM"
    print(head)
    for r in rows:
        state = r["state"]
        if state == "partial":
            pct = f" ({100 * r['bytes_local'] / r['size']:.0f}%)" if r["size"] else ""
            state = f"partial {human_bytes(r['bytes_local'])}{pct}"
        elif state == "unverified":
            state = "present, not verified"
        size = human_bytes(r["size"]) if r["size"] else "unknown" if r["unknown"] else "unpinned"
        line = f"{r['path']:<{w}}  {size:>10}  {_short(r['sha256']):<13}  {state}"
        if remote is not None:
            line = f"{line:<{w + 55}}  {r['upstream']}"
        print(line)
    if quarantined:
        print()
        print("quarantined (never downloaded):")
        for q in quarantined:
            mark = "" if remote is None else ("  [upstream]" if q["upstream"] else "  [not upstream]")
            print(f"  {q['path']}  {q['reason']}{mark}")
    if aside:
        print()
        print(
            f"moved aside (quarantine folder {quarantine['folder']}, removed only by "
            f"`stage2 gc <data_root>/stores --quarantine`): {len(aside_items)} item(s), {len(aside)} file(s), "
            f"{human_bytes(aside_bytes)}"
        )
        for item in aside_items:
            print(f"  {item.line()}  {item.reason}")
    if unused_dirs:
        print()
        print(
            f"unused (cache directories the profile no longer lists, moved aside by a build into "
            f"{unused['folder']}; `stage2 gc <data_root>/stores --unused` removes them): "
            f"{len(unused_dirs)} folder(s), {human_bytes(unused_bytes)}"
        )
        for d in unused_dirs:
            print(f"  {shown(d.path.name)}/  {d.files} file(s), {human_bytes(d.size)}")
    t = totals
    print()
    print(
        f"totals     {t['archives']} archive(s), {human_bytes(t['bytes'])} pinned ({t['pinned']} pinned); "
        f"verified {t['verified']} ({human_bytes(t['verified_bytes'])}), partial {t['partial']} "
        f"({human_bytes(t['partial_bytes'])}), present unverified {t['unverified']}, missing {t['missing']}"
    )
    need = f"need {human_bytes(t['required_free_bytes'])}"
    if unsized:
        need = f"need at least {human_bytes(t['required_free_bytes'])}"
    print(
        f"disk       {need} for the rest of the build "
        f"({human_bytes(download)} to download + {human_bytes(extraction)} to extract); "
        f"{human_bytes(free)} free at {data_root}"
        + ("  -> NOT ENOUGH" if free < download + extraction else "")
    )
    if unsized:
        print(
            f"           {unsized} archive(s) have no pinned size, so they count 0 above. "
            f"Fix: {_pin_again(args, '--write')}"
        )
    if t["unverified"]:
        print(
            f"           {t['unverified']} archive(s) present, not verified: a build hashes each first and "
            "downloads it again if it does not match its pin (one of the pinned size counts 0 above)"
        )
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "pin",
        help="fill or check each archive's size and sha256 from the hub's listing at the pinned revision",
        description="Read the hub's own file listing at the profile's pinned revision and fill in (or check) "
        "every [[archives]] entry's size and sha256 (the LFS oid). Without --write, print the diff and exit 1 "
        "if the profile would change. A [source] revision that is a branch name, tag or short hash is "
        "resolved on the hub to its full commit, which --write writes in its place (without --write, pin "
        "names that commit and the line to write). Entries marked unknown = true are never requested: pin "
        "names the closest upstream archives for each and exits 1. Refuses (exit 2) when an archive is "
        "missing upstream (naming the closest upstream files), a pinned value disagrees with the listing, a "
        "quarantined file is listed under [[archives]], or the hub knows no such revision.",
        epilog="Example: stage2 pin manifests/stage2_core_v1.toml --write   "
        "(CI: stage2 pin manifests/stage2_core_v1.toml --check)",
    )
    add_profile(p)
    hub = p.add_mutually_exclusive_group()
    hub.add_argument(
        "--endpoint",
        default=None,
        help=f"hub endpoint (default: $HF_ENDPOINT if set, else {DEFAULT_ENDPOINT})",
    )
    hub.add_argument(
        "--hub-folder",
        default=None,
        metavar="DIR",
        help="serve this local folder on loopback as the hub instead of --endpoint (as `stage2 build "
        "--hub-folder` does)",
    )
    add_token_env(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", action="store_true", help="write the pinned profile (atomically, comments kept)"
    )
    mode.add_argument("--check", action="store_true", help="exit 1 if anything would change; print no diff")
    finish_command(p, cmd_pin)

    p = sub.add_parser(
        "list",
        help="every archive with size, pin and local state; quarantined ones; totals; free disk",
        description="Show every archive of the profile with its pinned size and sha256 and its state under the "
        "data root (missing, partial with the bytes so far, present but not verified, verified), the "
        "quarantined files, what was moved aside into the data root's quarantine folder (one line per archive or store, with its size), the cache directories moved to unused/ because the profile no longer lists them, totals, and the free disk against what the rest of the build needs. Local only, "
        "unless --endpoint is given (then each archive is also checked against the hub's listing).",
        epilog="Example: stage2 list manifests/stage2_core_v1.toml --data-root /data/stage2 --json",
    )
    add_profile(p)
    p.add_argument("--data-root", required=True, help="the data root of the build")
    p.add_argument("--endpoint", default=None, help="also compare with the hub's listing at this endpoint")
    add_token_env(p)
    finish_command(p, cmd_list)
