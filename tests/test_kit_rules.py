"""One rule set for the kit manifests, whatever decodes them.

A differential test over a corpus of *broken* kits: every input is read twice, once as the library
reads it (msgspec decodes a file fast when every line fits the row schema, else the exact decoder
runs) and once with the fast decoders switched off (stdlib ``json`` only). Both must give the same
rows and the same problems (same messages, naming the same file and line), for the pair manifest,
the action manifests and the link check. Each case also names a problem it must report, and
whether msgspec decodes it (so the corpus exercises the rules behind both decoders).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.profiles import KIT_PATHS, profile_data
from stage2_data import kit, layout
from stage2_data.kit import manifests
from stage2_data.profile import Profile, parse_profile

CK = "owner_auto_eval_rfm_auto_eval_rfm"
P, A, R = "pairs", "autoeval", "roboarena"  # the pair manifest, the two action manifests


def tid(n: int) -> str:
    return str(uuid.UUID(int=n * 7919 + 12345, version=4))


def sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def pair(n: int, split: str, chosen: int, rejected: int) -> dict[str, Any]:
    return {
        "pair_id": f"p{n:06d}",
        "split": split,
        "task": "put the bowl on the plate",
        "chosen_trajectory_id": tid(chosen),
        "chosen_frames_path": layout.frames_relpath(CK, tid(chosen)),
        "rejected_trajectory_id": tid(rejected),
        "rejected_frames_path": layout.frames_relpath(CK, tid(rejected)),
    }


def action(n: int, source: str, recovered: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "stage2_trajectory_id": tid(n),
        "source": source,
        "cache_key": CK,
        "status": "recovered" if recovered else "source_has_no_actions",
        "sidecar_path": layout.sidecar_relpath(source, tid(n)) if recovered else None,
        "sidecar_sha256": sha(n) if recovered else None,
    }
    return row


# A clean kit: trajectories reused by several pairs of one split; two action manifests.
CLEAN_PAIRS = [
    pair(1, "train", 1, 2),
    pair(2, "train", 1, 3),
    pair(3, "val", 4, 5),
    pair(4, "test", 6, 7),
    pair(5, "train", 2, 3),
    pair(6, "val", 5, 8),
]
CLEAN_ACTIONS = {
    "autoeval": [action(1, "autoeval", True), action(2, "autoeval", False), action(3, "autoeval", True)],
    "roboarena": [action(4, "roboarena", True), action(5, "roboarena", True), action(9, "roboarena", False)],
}


class Kit:
    """A kit root in a tmp folder: the pair manifest, the action manifests, a profile naming them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pairs = root / KIT_PATHS["pair_manifest"]
        self.actions = root / KIT_PATHS["action_manifest_dir"]
        self.pairs.parent.mkdir(parents=True)
        self.actions.mkdir(parents=True)
        self.set_rows(self.pairs, CLEAN_PAIRS)
        for source, rows in CLEAN_ACTIONS.items():
            self.set_rows(self.action(source), rows)
        # a data root: some frames files and sidecars present, one sidecar that no row names
        self.data_root = root / "data"
        derived = layout.derived_root(self.data_root)
        for rel in [
            *(layout.frames_relpath(CK, tid(n)) for n in (1, 2, 3, 5, 8)),
            *(
                f"{layout.DERIVED_DIR}/{layout.sidecar_relpath(s, tid(n))}"
                for s, n in ((A, 1), (R, 4), (R, 42))
            ),
        ]:
            (self.data_root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.data_root / rel).write_bytes(b"x")
        assert derived.is_dir()

    def action(self, source: str) -> Path:
        return self.actions / f"{source}.jsonl"

    # --- raw lines -----------------------------------------------------------------------------
    @staticmethod
    def lines(path: Path) -> list[bytes]:
        return path.read_bytes().split(b"\n")[:-1]

    @staticmethod
    def write(path: Path, lines: list[bytes], end: bytes = b"\n") -> None:
        path.write_bytes(b"".join(line + end for line in lines))

    def set_rows(self, path: Path, rows: list[Any]) -> None:
        self.write(path, [json.dumps(r).encode() for r in rows])

    def rows(self, path: Path) -> list[Any]:
        return [json.loads(line) for line in self.lines(path)]

    def edit(self, path: Path, i: int, **fields: Any) -> None:
        """Row ``i`` with fields changed (a value ``...`` removes the field)."""
        rows = self.rows(path)
        rows[i] = {k: v for k, v in {**rows[i], **fields}.items() if v is not ...}
        self.set_rows(path, rows)

    def put_line(self, path: Path, i: int, line: bytes) -> None:
        lines = self.lines(path)
        lines[i] = line
        self.write(path, lines)

    def insert_line(self, path: Path, i: int, line: bytes) -> None:
        lines = self.lines(path)
        lines.insert(i, line)
        self.write(path, lines)

    def profile(self) -> Profile:
        return parse_profile(
            profile_data(
                "rules",
                {"repo_id": "org/processed_datasets", "revision": "c" * 40},
                [{"path": f"{CK}.tar", "cache_key": CK}],
                expected={
                    "cache_dirs": 1,
                    "archives": 1,
                    "trajectories": 9,
                    "pair_rows": 6,
                    "unique_frame_files": 8,
                    "action_manifest_rows": 6,
                    "resolved_sidecars": 4,
                },
            )
        ).with_kit_root(self.root)


# ------------------------------------------------------------------------------------------------
# The corpus
# ------------------------------------------------------------------------------------------------


def _path(k: Kit, target: str) -> Path:
    return k.pairs if target == P else k.action(target)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def with_field(target: str, i: int, raw_value: bytes, name: bytes = b"extra") -> Callable[[Kit], None]:
    """Row ``i`` with one more field, spelled raw (any JSON, valid or not)."""

    def mutate(k: Kit) -> None:
        path = _path(k, target)
        line = k.lines(path)[i]
        k.put_line(path, i, line[:-1] + b', "' + name + b'": ' + raw_value + b"}")

    return mutate


def with_value(target: str, i: int, name: str, raw_value: bytes) -> Callable[[Kit], None]:
    """Row ``i`` with field ``name``'s value spelled raw."""

    def mutate(k: Kit) -> None:
        path = _path(k, target)
        row = k.rows(path)[i]
        row[name] = "\x00MARK\x00"
        line = json.dumps(row).encode().replace(b'"\\u0000MARK\\u0000"', raw_value)
        k.put_line(path, i, line)

    return mutate


def edit(target: str, i: int, **fields: Any) -> Callable[[Kit], None]:
    return lambda k: k.edit(_path(k, target), i, **fields)


def put_line(target: str, i: int, line: bytes) -> Callable[[Kit], None]:
    return lambda k: k.put_line(_path(k, target), i, line)


def insert_line(target: str, i: int, line: bytes) -> Callable[[Kit], None]:
    return lambda k: k.insert_line(_path(k, target), i, line)


def raw(target: str, fn: Callable[[bytes], bytes]) -> Callable[[Kit], None]:
    """The whole file's bytes transformed."""

    def mutate(k: Kit) -> None:
        path = _path(k, target)
        path.write_bytes(fn(path.read_bytes()))

    return mutate


def both(*mutations: Callable[[Kit], None]) -> Callable[[Kit], None]:
    def mutate(k: Kit) -> None:
        for m in mutations:
            m(k)

    return mutate


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Kit], None]
    expect: str | None  # a fragment of one reported problem (None: the input is valid)
    fast: bool  # msgspec decodes every manifest of this case (the rules alone find the problem)


CASES = [
    # --- the pair manifest: structure --------------------------------------------------------
    Case("pair_missing_field", edit(P, 2, task=...), "pairs.jsonl:3: missing field(s) task", False),
    Case(
        "pair_two_missing_fields", edit(P, 0, split=..., task=...), ":1: missing field(s) split, task", False
    ),
    Case("pair_unknown_field", edit(P, 1, zz=1, aa="x"), ":2: unknown field(s) aa, zz", False),
    Case("pair_missing_and_unknown", edit(P, 1, task=..., note="x"), ":2: unknown field(s) note", False),
    Case("pair_int_id", edit(P, 3, pair_id=7), ":4: field(s) pair_id must be non-empty strings", False),
    Case("pair_null_task", edit(P, 3, task=None), ":4: field(s) task must be non-empty strings", False),
    Case("pair_empty_split", edit(P, 0, split=""), ":1: field(s) split must be non-empty strings", False),
    Case("pair_bool_split", edit(P, 0, split=True), "field(s) split must be non-empty strings", False),
    Case("pair_list_task", edit(P, 0, task=["a"]), "field(s) task must be non-empty strings", False),
    Case("pair_nested_task", edit(P, 0, task={"a": {"b": [1]}}), "task must be non-empty strings", False),
    Case("pair_huge_int", with_value(P, 2, "task", b"9" * 5000), ":3: field(s) task must be", False),
    Case("pair_huge_negative_int", with_value(P, 2, "task", b"-" + b"1" * 4400), ":3: field(s) task", False),
    Case("pair_huge_int_extra", with_field(P, 2, b"7" * 6000), ":3: unknown field(s) extra", False),
    Case("pair_float_id", with_value(P, 0, "pair_id", b"1e999"), "pair_id must be non-empty strings", False),
    Case("pair_nan", with_value(P, 0, "task", b"NaN"), "field(s) task must be non-empty strings", False),
    Case("pair_infinity", with_value(P, 0, "task", b"-Infinity"), "task must be non-empty strings", False),
    Case("pair_deep_value", with_value(P, 0, "task", _nested(50)), "task must be non-empty strings", False),
    Case("pair_very_deep_value", with_value(P, 0, "task", _nested(5000)), ":1: malformed JSON", False),
    # a field given twice: readers disagree on which value counts (Python's and msgspec's the last)
    Case("pair_duplicate_key", with_field(P, 0, b'"val"', b"split"), ":1: field(s) split given more", False),
    Case("pair_duplicate_key_bad_last", with_field(P, 0, b"1", b"split"), ":1: field(s) split given", False),
    Case(
        "pair_duplicate_key_escaped",
        with_field(P, 2, b'"p9"', b"pair\\u005fid"),
        "pairs.jsonl:3: field(s) pair_id given more than once on one line",
        False,
    ),
    Case(
        "pair_key_spelled_in_a_value",
        edit(P, 1, task='"split" twice: "split"'),
        None,
        True,
    ),
    Case(
        "pair_escaped_key",
        put_line(P, 0, json.dumps(CLEAN_PAIRS[0]).replace("pair_id", "pair\\u005fid").encode()),
        None,
        True,
    ),
    # a lone surrogate escape: well-formed JSON, but no Unicode text (no UTF-8 writer takes it)
    Case(
        "pair_lone_surrogate",
        with_value(P, 0, "task", b'"\\ud800drawer"'),
        "pairs.jsonl:1: field 'task' holds a lone surrogate (\\ud800), which is not valid Unicode text",
        False,
    ),
    Case(
        "pair_lone_low_surrogate",
        with_value(P, 5, "pair_id", b'"x\\udc00"'),
        ":6: field 'pair_id' holds a lone surrogate (\\udc00)",
        False,
    ),
    Case("pair_lone_surrogate_upper", with_value(P, 2, "split", b'"\\uDBFF"'), ":3: field 'split'", False),
    Case(
        "pair_high_then_high",
        with_value(P, 0, "task", b'"\\ud83d\\ud83d\\ude00"'),
        ":1: field 'task' holds a lone surrogate (\\ud83d)",
        False,
    ),
    Case(
        "pair_high_then_other_escape",
        with_value(P, 0, "task", b'"\\ud800\\u0041"'),
        ":1: field 'task' holds a lone surrogate",
        False,
    ),
    Case(
        "pair_lone_surrogate_in_key",
        put_line(P, 1, json.dumps(CLEAN_PAIRS[1]).replace('"task"', '"ta\\ud800sk"').encode()),
        ":2: the name of field 'ta\\ud800sk' holds a lone surrogate (\\ud800)",
        False,
    ),
    Case(
        "pair_lone_surrogate_fix",
        with_value(P, 0, "task", b'"\\ud800"'),
        "(column 51); fix: correct the text of line 1: write the character itself",
        False,
    ),
    Case("pair_surrogate_pair", with_value(P, 0, "task", b'"\\ud83d\\ude00"'), None, True),
    Case("pair_escaped_backslash_u", with_value(P, 0, "task", b'"\\\\ud800"'), None, True),
    Case("pair_raw_tab_in_string", with_value(P, 0, "task", b'"a\tb"'), ":1: malformed JSON", False),
    Case("pair_raw_nul_in_string", with_value(P, 0, "task", b'"a\x00b"'), ":1: malformed JSON", False),
    Case("pair_del_in_string", with_value(P, 0, "task", b'"a\x7fb"'), None, True),
    Case("pair_bad_escape", with_value(P, 0, "task", b'"a\\xb"'), ":1: malformed JSON", False),
    Case("pair_non_ascii_task", edit(P, 4, task="mets le bol sur l’assiette ✓"), None, True),
    # --- the pair manifest: lines ------------------------------------------------------------
    Case("pair_blank_line", insert_line(P, 2, b""), None, False),
    Case("pair_whitespace_line", insert_line(P, 2, b" \t "), None, False),
    Case("pair_blank_lines_at_end", raw(P, lambda b: b + b"\n\n  \n"), None, False),
    Case("pair_leading_spaces", raw(P, lambda b: b.replace(b'{"pair_id"', b'  \t{"pair_id"')), None, True),
    Case(
        "pair_form_feed", put_line(P, 1, b"\x0c" + json.dumps(CLEAN_PAIRS[1]).encode() + b"\x0b"), None, False
    ),
    Case("pair_nbsp", put_line(P, 1, json.dumps(CLEAN_PAIRS[1]).encode() + "\u00a0".encode()), None, False),
    Case(
        "pair_trailing_garbage",
        put_line(P, 3, json.dumps(CLEAN_PAIRS[3]).encode() + b" x"),
        ":4: malformed JSON",
        False,
    ),
    Case(
        "pair_two_objects_one_line",
        put_line(P, 3, json.dumps(CLEAN_PAIRS[3]).encode() * 2),
        ":4: malformed JSON",
        False,
    ),
    Case(
        "pair_object_over_two_lines",
        put_line(P, 3, json.dumps(CLEAN_PAIRS[3], indent=1).encode()),
        "malformed JSON",
        False,
    ),
    Case(
        "pair_trailing_comma",
        put_line(P, 3, json.dumps(CLEAN_PAIRS[3]).encode()[:-1] + b",}"),
        ":4: malformed",
        False,
    ),
    Case("pair_truncated_last_line", raw(P, lambda b: b[:-20]), ":6: malformed JSON", False),
    Case("pair_no_final_newline", raw(P, lambda b: b[:-1]), None, True),
    Case("pair_crlf", raw(P, lambda b: b.replace(b"\n", b"\r\n")), None, False),
    Case("pair_lone_cr", raw(P, lambda b: b.replace(b"\n", b"\r")), None, False),
    Case("pair_mixed_line_ends", raw(P, lambda b: b.replace(b"\n", b"\r", 2)), None, False),
    Case(
        "pair_cr_as_whitespace",
        put_line(P, 2, json.dumps(CLEAN_PAIRS[2]).replace(', "task"', ',\r "task"').encode()),
        ":3: malformed JSON",
        False,
    ),
    Case(
        "pair_cr_inside_line",
        put_line(P, 2, b'{"pair_id": "p9",\r "split": "val"}'),
        ":3: malformed JSON",
        False,
    ),
    Case("pair_bom", raw(P, lambda b: b"\xef\xbb\xbf" + b), ":1: malformed JSON", False),
    Case("pair_invalid_utf8", with_value(P, 2, "task", b'"caf\xe9"'), ":3: not UTF-8 text", False),
    Case("pair_invalid_utf8_line_start", insert_line(P, 1, b"\xff\xfe"), ":2: not UTF-8 text", False),
    Case("pair_overlong_utf8", with_value(P, 0, "task", b'"\xc0\xaf"'), ":1: not UTF-8 text", False),
    Case("pair_utf16", raw(P, lambda b: b.decode().encode("utf-16")), "not UTF-8 text", False),
    Case("pair_array_line", insert_line(P, 0, b"[1, 2]"), ":1: expected a JSON object, found list", False),
    Case("pair_string_line", insert_line(P, 0, b'"pair"'), ":1: expected a JSON object, found str", False),
    Case("pair_number_line", insert_line(P, 0, b"12"), ":1: expected a JSON object, found int", False),
    Case(
        "pair_huge_number_line",
        insert_line(P, 0, b"1" * 5000),
        ":1: expected a JSON object, found int",
        False,
    ),
    Case("pair_null_line", insert_line(P, 6, b"null"), ":7: expected a JSON object, found NoneType", False),
    Case("pair_true_line", insert_line(P, 6, b"true"), ":7: expected a JSON object, found bool", False),
    Case("pair_empty_object", insert_line(P, 6, b"{}"), ":7: missing field(s) pair_id, split", False),
    Case("pair_empty_file", raw(P, lambda b: b""), None, True),
    Case("pair_only_newlines", raw(P, lambda b: b"\n\n"), None, False),
    Case("pair_missing_file", lambda k: k.pairs.unlink(), "pair manifest does not exist", True),
    # --- the pair manifest: rules ------------------------------------------------------------
    Case(
        "pair_duplicate_id",
        edit(P, 4, pair_id="p000002"),
        ":5: duplicate pair_id 'p000002' (first on line 2)",
        True,
    ),
    Case("pair_bad_split", edit(P, 0, split="dev"), ":1: pair 'p000001': split 'dev' is not one of", True),
    Case("pair_split_case", edit(P, 0, split="Train"), "split 'Train' is not one of train, val, test", True),
    Case("pair_leakage", edit(P, 2, split="train"), ":6: leakage: trajectory", True),
    Case(
        "pair_frames_path_form",
        edit(P, 1, chosen_frames_path="frames/x.npz"),
        ":2: pair 'p000002': chosen_frames_path",
        True,
    ),
    Case(
        "pair_frames_path_other_id",
        edit(P, 1, rejected_frames_path=layout.frames_relpath(CK, tid(99))),
        f"names trajectory {tid(99)}, not its rejected_trajectory_id",
        True,
    ),
    Case(
        "pair_two_frames_paths",
        edit(P, 1, chosen_frames_path=layout.frames_relpath("other_ck", tid(1))),
        f"trajectory {tid(1)} has frames path",
        True,
    ),
    Case(
        "pair_frames_path_newline",
        edit(P, 1, chosen_frames_path=layout.frames_relpath(CK, tid(1)) + "\n"),
        "has frames path",
        True,
    ),
    Case(
        "pair_same_trajectory_twice",
        edit(P, 0, rejected_trajectory_id=tid(1), rejected_frames_path=layout.frames_relpath(CK, tid(1))),
        None,
        True,
    ),
    # --- the action manifests: structure -----------------------------------------------------
    Case(
        "action_missing_field",
        edit(A, 1, cache_key=...),
        "autoeval.jsonl:2: missing field(s) cache_key",
        False,
    ),
    Case("action_missing_optional", edit(A, 1, sidecar_path=..., sidecar_sha256=...), None, True),
    Case(
        "action_int_id",
        edit(R, 0, stage2_trajectory_id=4),
        "roboarena.jsonl:1: field(s) stage2_trajectory_id have the wrong type",
        False,
    ),
    Case("action_empty_status", edit(R, 0, status=""), ":1: field(s) status have the wrong type", False),
    Case("action_null_source", edit(R, 0, source=None), ":1: field(s) source have the wrong type", False),
    Case(
        "action_int_sidecar_path",
        edit(A, 0, sidecar_path=5, sidecar_sha256=[]),
        ":1: field(s) sidecar_path, sidecar_sha256 have the wrong type",
        False,
    ),
    Case("action_nested_status", edit(A, 0, status={"s": "recovered"}), "status have the wrong type", False),
    Case("action_extra_fields", edit(A, 0, note="x", n=1, z=None, f=1.5), None, True),
    Case("action_extra_nested", with_field(A, 0, b'{"a": [1, {"b": [null, true]}]}'), None, True),
    Case("action_extra_deep_64", with_field(A, 0, _nested(63)), None, True),
    Case("action_extra_deep_200", with_field(A, 1, _nested(200)), None, False),
    Case(
        "action_extra_very_deep", with_field(A, 1, _nested(3000)), "autoeval.jsonl:2: malformed JSON", False
    ),
    Case("action_extra_deep_objects", with_field(A, 2, b'{"a":' * 300 + b"1" + b"}" * 300), None, False),
    Case("action_extra_huge_int", with_field(R, 1, b"8" * 5000), None, True),
    Case("action_extra_huge_float", with_field(R, 1, b"1" * 5000 + b".5e-99999"), None, True),
    Case("action_extra_nan", with_field(R, 1, b"NaN"), None, False),
    Case("action_extra_infinity", with_field(R, 1, b"[Infinity, -Infinity]"), None, False),
    Case(
        "action_extra_lone_surrogate",  # ignored fields too, as for bytes that are not UTF-8
        with_field(R, 1, b'"\\udfff"'),
        "roboarena.jsonl:2: field 'extra' holds a lone surrogate (\\udfff)",
        False,
    ),
    Case(
        "action_extra_nested_lone_surrogate",
        with_field(A, 0, b'{"a": [1, "ok \\ud83d\\ude00", "\\ud83d"]}'),
        "autoeval.jsonl:1: field 'extra' (at ['a'][2]) holds a lone surrogate (\\ud83d)",
        False,
    ),
    Case(
        "action_lone_surrogate_status",
        with_value(A, 1, "status", b'"\\udc80"'),
        "autoeval.jsonl:2: field 'status' holds a lone surrogate (\\udc80)",
        False,
    ),
    Case(
        "action_lone_surrogate_sidecar_path",
        with_value(R, 0, "sidecar_path", b'"action_sidecars/roboarena/\\ud800.npz"'),
        "roboarena.jsonl:1: field 'sidecar_path' holds a lone surrogate (\\ud800)",
        False,
    ),
    Case(
        "action_extra_invalid_utf8", with_field(R, 1, b'"\xff"'), "roboarena.jsonl:2: not UTF-8 text", False
    ),
    Case("action_extra_bad_json", with_field(R, 1, b"[1,]"), "roboarena.jsonl:2: malformed JSON", False),
    Case("action_extra_leading_zero", with_field(R, 1, b"01"), "roboarena.jsonl:2: malformed JSON", False),
    Case(
        "action_duplicate_key",
        with_field(A, 1, b'"recovered"', b"status"),
        ":2: field(s) status given",
        False,
    ),
    Case(
        "action_duplicate_optional_key",
        with_field(A, 1, b"null", b"sidecar_sha256"),
        ":2: field(s) sidecar_sha256 given more than once",
        False,
    ),
    # an unknown field is ignored: given twice, neither value counts
    Case("action_duplicate_unknown_key", both(with_field(A, 1, b"1"), with_field(A, 1, b"2")), None, True),
    # --- the action manifests: lines ---------------------------------------------------------
    Case("action_crlf", raw(R, lambda b: b.replace(b"\n", b"\r\n")), None, False),
    Case("action_bom", raw(R, lambda b: b"\xef\xbb\xbf" + b), "roboarena.jsonl:1: malformed JSON", False),
    Case("action_blank_lines", both(insert_line(R, 1, b""), insert_line(A, 3, b"   ")), None, False),
    Case("action_truncated", raw(A, lambda b: b[: len(b) // 2]), "autoeval.jsonl:2: malformed JSON", False),
    Case("action_garbage_line", insert_line(A, 1, b"}{"), "autoeval.jsonl:2: malformed JSON", False),
    Case("action_non_object", insert_line(A, 1, b'["x"]'), ":2: expected a JSON object, found list", False),
    Case("action_empty_file", raw(A, lambda b: b""), None, True),
    Case(
        "action_no_manifest",
        both(lambda k: k.action(A).unlink(), lambda k: k.action(R).unlink()),
        "no <source>.jsonl action manifest",
        True,
    ),
    Case("action_other_files_ignored", lambda k: (k.actions / "notes.txt").write_text("{"), None, True),
    Case(
        "action_missing_folder",
        lambda k: shutil.rmtree(k.actions),
        "action manifest folder does not exist",
        True,
    ),
    # --- the action manifests: rules ---------------------------------------------------------
    Case("sha_short", edit(A, 0, sidecar_sha256=sha(1)[:63]), "autoeval.jsonl:1: trajectory", True),
    Case("sha_long", edit(A, 0, sidecar_sha256=sha(1) + "0"), "sidecar_sha256 is not 64 lowercase hex", True),
    Case("sha_uppercase", edit(A, 2, sidecar_sha256=sha(3).upper()), ":3: trajectory", True),
    Case("sha_non_hex", edit(R, 1, sidecar_sha256="g" * 64), "roboarena.jsonl:2: trajectory", True),
    Case(
        "sha_non_ascii", edit(R, 1, sidecar_sha256="é" * 64), "sidecar_sha256 is not 64 lowercase hex", True
    ),
    Case("sha_empty", edit(R, 1, sidecar_sha256=""), "is 'recovered' but has no sidecar_sha256", True),
    Case(
        "sha_trailing_newline",
        edit(R, 1, sidecar_sha256=sha(5) + "\n"),
        "sidecar_sha256 is not 64 lowercase hex",
        True,
    ),
    Case(
        "sha_spaces",
        edit(R, 1, sidecar_sha256=" " + sha(5)[1:]),
        "sidecar_sha256 is not 64 lowercase hex",
        True,
    ),
    Case(
        "sha_on_unrecovered_row",
        edit(R, 2, sidecar_sha256="x"),
        "sidecar_sha256 is not 64 lowercase hex",
        True,
    ),
    Case(
        "action_duplicate_id_in_file",
        edit(A, 2, stage2_trajectory_id=tid(1), sidecar_path=layout.sidecar_relpath(A, tid(1))),
        f"autoeval.jsonl:3: duplicate stage2_trajectory_id {tid(1)} (first at ",
        True,
    ),
    Case(
        "action_duplicate_id_across_files",
        edit(R, 2, stage2_trajectory_id=tid(2)),
        f"roboarena.jsonl:3: duplicate stage2_trajectory_id {tid(2)}",
        True,
    ),
    Case("action_source_not_stem", edit(R, 0, source="autoeval"), "roboarena.jsonl:1: trajectory", True),
    Case(
        "action_recovered_no_path",
        edit(A, 0, sidecar_path=None),
        "is 'recovered' but has no sidecar_path",
        True,
    ),
    Case(
        "action_recovered_nothing",
        edit(A, 0, sidecar_path=..., sidecar_sha256=...),
        "but has no sidecar_path / sidecar_sha256",
        True,
    ),
    Case(
        "action_unrecovered_with_path",
        edit(A, 1, sidecar_path=layout.sidecar_relpath(A, tid(2))),
        "has status 'source_has_no_actions' but a sidecar_path",
        True,
    ),
    Case(
        "action_path_form",
        edit(A, 0, sidecar_path="sidecars/x.npz"),
        "is not action_sidecars/<source>/trajectory_<ID>.npz",
        True,
    ),
    Case(
        "action_path_other_id", edit(A, 0, sidecar_path=layout.sidecar_relpath(A, tid(77))), "should be", True
    ),
    Case(
        "action_path_other_source",
        edit(A, 0, sidecar_path=layout.sidecar_relpath(R, tid(1))),
        "should be",
        True,
    ),
    Case(
        "action_slash_in_id",
        edit(A, 0, stage2_trajectory_id="a/b", sidecar_path=layout.sidecar_relpath(A, "a/b")),
        "is not action_sidecars",
        True,
    ),
    # --- several at once ---------------------------------------------------------------------
    Case(
        "many_problems",
        both(
            edit(P, 4, pair_id="p000002", split="dev"),
            insert_line(P, 2, b"{"),
            edit(A, 0, sidecar_sha256="ABC", note=1),
            insert_line(A, 2, b'{"stage2_trajectory_id": 1}'),
            edit(R, 1, stage2_trajectory_id=tid(1), source="x"),
        ),
        "pairs.jsonl:3: malformed JSON",
        False,
    ),
    Case(
        "many_rule_problems",
        both(
            edit(P, 4, pair_id="p000002", split="dev"),
            edit(A, 0, sidecar_sha256="ABC"),
            edit(R, 1, stage2_trajectory_id=tid(1), source="x"),
        ),
        "roboarena.jsonl:2: trajectory",
        True,
    ),
]


@contextmanager
def exact_decoders_only() -> Iterator[None]:
    """The fast (msgspec) decoders switched off, as tests/test_kit_checks.py does."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifests, "_pairs_fast", lambda path: None)
        mp.setattr(manifests, "_actions_fast", lambda d: None)
        yield


def read_all(k: Kit) -> dict[str, Any]:
    """Everything the rules decide: rows, problems, and the link check's report."""
    pairs, pair_problems = kit.load_pairs(k.pairs)
    actions, action_problems = kit.load_action_manifests(k.actions)
    link = kit.link_check(k.profile(), k.data_root).to_dict()
    del link["seconds"], link["fs_seconds"]
    return {
        "pairs": pairs,
        "pair_problems": pair_problems,
        "actions": actions,
        "action_problems": action_problems,
        "link": link,
    }


def fast_decodes(k: Kit) -> bool:
    pairs_ok = not k.pairs.is_file() or manifests._pairs_fast(k.pairs) is not None
    actions_ok = not k.actions.is_dir() or manifests._actions_fast(k.actions) is not None
    return pairs_ok and actions_ok


@pytest.fixture
def clean(tmp_path: Path) -> Kit:
    return Kit(tmp_path / "kit")


def test_the_clean_kit_is_clean_and_fast(clean: Kit) -> None:
    got = read_all(clean)
    assert got["pair_problems"] == [] and got["action_problems"] == []
    assert [r.pair_id for r in got["pairs"]] == [p["pair_id"] for p in CLEAN_PAIRS]
    assert len(got["actions"]) == 6 and got["actions"][3].where == f"{clean.action(R)}:1"
    assert fast_decodes(clean)
    with exact_decoders_only():
        assert read_all(clean) == got


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fast_and_exact_decoders_agree_on_a_broken_kit(case: Case, clean: Kit) -> None:
    case.mutate(clean)
    fast = read_all(clean)
    with exact_decoders_only():
        exact = read_all(clean)
    assert fast == exact
    problems = fast["pair_problems"] + fast["action_problems"]
    if case.expect is None:
        assert problems == []
    else:
        assert any(case.expect in p for p in problems), problems
    assert fast_decodes(clean) is case.fast
    # every problem names its file (and its line, when it is about a line)
    for p in problems:
        assert p.startswith((str(clean.pairs), str(clean.actions))), p


def test_fast_and_exact_decoders_agree_near_the_recursion_limit(clean: Kit) -> None:
    """Both decoders recurse per nesting level, each with its own headroom: every depth up to the
    recursion limit (a value valid, or "nested too deeply") decodes alike both ways."""
    path = clean.action(A)
    original = clean.lines(path)
    limit = sys.getrecursionlimit()
    for depth in range(limit - 250, limit + 5):
        clean.write(
            path, [*original[:1], original[1][:-1] + b', "deep": ' + _nested(depth) + b"}", *original[2:]]
        )
        fast = kit.load_action_manifests(clean.actions)
        with exact_decoders_only():
            assert kit.load_action_manifests(clean.actions) == fast, depth


def test_problems_of_interleaved_lines_come_in_line_order(clean: Kit) -> None:
    """Structural problems (found while decoding) and rule problems (found on rows) are reported in
    line order, as one pass over the file would report them."""
    p = clean.pairs
    clean.edit(p, 1, pair_id="p000001", zz=1)  # line 2: unknown field, then duplicate pair_id
    clean.insert_line(p, 1, b"[]")  # the new line 2: not an object
    clean.edit(p, 5, split="dev")  # line 6
    _, problems = kit.load_pairs(p)
    assert [x.split(": ", 1)[0] for x in problems] == [f"{p}:2", f"{p}:3", f"{p}:3", f"{p}:6"]
    assert "unknown field(s) zz" in problems[1] and "duplicate pair_id 'p000001'" in problems[2]


def _mutations(line: bytes, rng: random.Random) -> bytes:
    alphabet = b'{}[]":,\\ \t\r\n0123456789eE.+-tfnaul/xu\xff\xc3\x80\x00\x7f'
    data = bytearray(line)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(3)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            del data[min(pos, len(data) - 1)]
        elif op == 1:
            data.insert(pos, rng.choice(alphabet))
        elif data:
            data[min(pos, len(data) - 1)] = rng.choice(alphabet)
    return bytes(data)


@pytest.mark.parametrize("seed", range(8))
def test_fast_and_exact_decoders_agree_on_fuzzed_lines(seed: int, clean: Kit) -> None:
    """Random byte edits of a few lines of each manifest: same rows, same problems, both ways."""
    rng = random.Random(seed)
    originals = {path: path.read_bytes() for path in (clean.pairs, clean.action(A), clean.action(R))}
    decoded_fast = 0
    for _ in range(40):
        for path, data in originals.items():
            lines = data.split(b"\n")
            for i in rng.sample(range(len(lines) - 1), 2):
                lines[i] = _mutations(lines[i], rng)
            path.write_bytes(b"\n".join(lines))
        fast = read_all(clean)
        decoded_fast += fast_decodes(clean)
        with exact_decoders_only():
            exact = read_all(clean)
        assert fast == exact
    assert decoded_fast < 40  # the edits break lines (the fast decoder gives way)
