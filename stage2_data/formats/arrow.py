"""The ``processed_dataset`` Arrow files of a cache directory: the one reader.

A cache directory holds ``processed_dataset/*.arrow``: the shards of a Hugging Face
``save_to_disk`` folder, in the Arrow IPC *stream* format (what ``save_to_disk`` writes) or the IPC
*file* format (``ARROW1`` magic). They are read memory-mapped, one batch at a time, or, for a
reader that must hold what it parses to a recorded sha256 (the kit's join), read into memory once,
hashed and parsed from those very bytes (``sha256_into``).

One policy parameter decides what a missing column means, ``missing``:

* ``"error"`` (the extraction's :func:`~stage2_data.extract.read_processed_rows`): a shard without
  one of the asked columns raises FormatError naming the shard, the missing columns and the
  columns it has;
* ``"drop"`` (the kit's join): the columns a shard lacks are left out of its table, so the caller
  sees which are absent (``table.column_names``) and reports each as its own problem. Shards that
  then differ in their columns raise the "different schemas" error.

The result keeps the asked column order and the shards' schema metadata. Errors are FormatError
(a ``ValueError``) with one spelling; callers wrap them in their own error with their own fix.
Whatever the bytes, nothing else escapes a read: every batch is validated in full before it is
handed out (a corrupt offset never reaches a reader of the values), pyarrow's errors become
FormatError, and a file that is another format (Parquet, gzip, JSON, ...) is a
:class:`~stage2_data.errors.FileTypeError` saying which.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from ..errors import FileTypeError, FormatError, Stage2Error
from .sniff import describe, sniff

__all__ = [
    "PROCESSED_SUBDIR",
    "MissingPolicy",
    "arrow_batches",
    "list_shards",
    "read_processed_table",
    "read_shard",
]

PROCESSED_SUBDIR = "processed_dataset"
MissingPolicy = Literal["error", "drop"]
_FILE_MAGIC = b"ARROW1"


def list_shards(cache_dir: Path) -> list[Path]:
    """The ``processed_dataset/*.arrow`` regular files of a cache directory, in name order ([] when
    the folder is absent)."""
    d = Path(cache_dir) / PROCESSED_SUBDIR
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if p.suffix == ".arrow" and p.is_file()), key=lambda p: p.name)


def _unreadable(path: Path, e: BaseException) -> FormatError:
    return FormatError(f"not a readable Arrow IPC file ({type(e).__name__}: {str(e)[:300]})", file=str(path))


def _validated(path: Path, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches, each validated in full (offsets, lengths, UTF-8) before it is yielded; any error
    while reading or validating one is FormatError naming the file."""
    while True:
        try:
            batch = next(batches)
            batch.validate(full=True)
        except StopIteration:
            return
        except Stage2Error:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ValueError, ...
            raise _unreadable(path, e) from None
        yield batch


@contextlib.contextmanager
def arrow_batches(
    path: Path, data: bytes | None = None
) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """``(schema, batches)`` of one Arrow IPC file, stream or file format, memory-mapped (or parsed
    from ``data``, its bytes already read); the batches are read one at a time while the block runs,
    each validated in full. Raises OSError (the file cannot be opened), FileTypeError (it is another
    format) or FormatError (unreadable)."""
    opened = pa.memory_map(str(path), "r") if data is None else pa.BufferReader(data)
    with opened as source:
        head = source.read(512)
        source.seek(0)
        try:
            if head.startswith(_FILE_MAGIC):
                freader = pa_ipc.open_file(source)
                schema = freader.schema
                batches: Iterator[pa.RecordBatch] = (
                    freader.get_batch(i) for i in range(freader.num_record_batches)
                )
            else:
                sreader = pa_ipc.open_stream(source)
                schema, batches = sreader.schema, iter(sreader)
        except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on odd bytes
            kind = sniff(head)
            if kind not in (None, "arrow"):
                raise FileTypeError(
                    f"is not an Arrow IPC file: its bytes are {describe(kind)}", found=kind, file=str(path)
                ) from None
            raise _unreadable(path, e) from None
        yield schema, _validated(path, batches)


def read_shard(
    path: Path,
    columns: Sequence[str] | None = None,
    *,
    missing: MissingPolicy = "error",
    data: bytes | None = None,
) -> pa.Table:
    """One shard as a table: every column, or only ``columns`` (in that order; see ``missing``),
    parsed from ``data`` when given (the file's bytes, already read). Raises FormatError naming the
    file when it is unreadable or (``missing="error"``) lacks a column; OSError when it cannot be
    opened."""
    try:
        with arrow_batches(path, data) as (schema, batches):
            if columns is None:
                return pa.Table.from_batches(list(batches), schema=schema)
            absent = [c for c in columns if c not in schema.names]
            if absent and missing == "error":
                raise FormatError(
                    f"no column(s) {', '.join(map(repr, absent))} (columns: {', '.join(schema.names)})",
                    file=str(path),
                )
            cols = [c for c in columns if c in schema.names]
            out_schema = pa.schema([schema.field(c) for c in cols], metadata=schema.metadata)
            selected = [
                pa.RecordBatch.from_arrays([b.column(c) for c in cols], schema=out_schema) for b in batches
            ]
            return pa.Table.from_batches(selected, schema=out_schema)
    except Stage2Error:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow's errors on odd bytes (OSError: cannot open)
        raise _unreadable(path, e) from e


def read_processed_table(
    cache_dir: Path,
    columns: Sequence[str] | None = None,
    *,
    missing: MissingPolicy = "error",
    sha256_into: MutableMapping[str, str] | None = None,
) -> pa.Table:
    """Every shard of ``<cache_dir>/processed_dataset/`` concatenated in file-name order (only
    ``columns`` if given, in that order; ``missing`` decides about absent columns).

    With ``sha256_into``, each shard is read into memory once and parsed from those bytes, and the
    sha256 of the bytes parsed is put there under the shard's path relative to ``cache_dir``
    (``processed_dataset/<name>``): what the caller holds to a record. A shard that cannot be read
    is a FormatError naming it.

    Raises FormatError: no shard (naming the folder), an unreadable shard or a missing column
    (naming the shard), shards whose schemas differ (naming the folder)."""
    pdir = Path(cache_dir) / PROCESSED_SUBDIR
    shards = list_shards(Path(cache_dir))
    if not shards:
        raise FormatError(f"no {PROCESSED_SUBDIR}/*.arrow file", file=str(cache_dir))
    tables = []
    for shard in shards:
        data = None
        if sha256_into is not None:
            try:
                data = shard.read_bytes()
            except OSError as e:
                raise _unreadable(shard, e) from None
            sha256_into[f"{PROCESSED_SUBDIR}/{shard.name}"] = hashlib.sha256(data).hexdigest()
        tables.append(read_shard(shard, columns, missing=missing, data=data))
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid as e:
        raise FormatError(f"its Arrow files have different schemas ({e})", file=str(pdir)) from e
