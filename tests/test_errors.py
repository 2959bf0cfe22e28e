"""Every error of the library survives pickling whole (a store shard written in a worker process
raises it there and the caller sees it as raised: message, fix and the fields that name the culprit)."""

from __future__ import annotations

import pickle

import pytest

from stage2_data.errors import (
    ChecksumMismatchError,
    FormatError,
    KitError,
    Stage2Error,
    UnknownArchivesError,
)
from stage2_data.store import StoreInputError

ERRORS = {
    "plain": Stage2Error("something is wrong.", fix="do this"),
    "checksum": ChecksumMismatchError("a.tar", "0" * 64, "1" * 64, fix="re-download a.tar"),
    "format": FormatError("bad magic", file="x.npz", member="frames.npy"),
    "problems": StoreInputError("cannot build the store", ["x.npz: unreadable"], fix="correct it"),
    "kit": KitError("kit", ["p1", "p2"]),
    "unknown": UnknownArchivesError("guessed names", fix="stage2 pin", entries=["a.tar"]),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_survive_pickling(name: str) -> None:
    err = ERRORS[name]
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err) and back.args == err.args
    assert back.__dict__ == err.__dict__  # message, fix, problems, file, member, paths, entries
    assert isinstance(back, Exception)
