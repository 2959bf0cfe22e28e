"""The one parser (and writer) of each file format the product reads.

* :mod:`.npz` -- ``.npy`` headers, npz (zip) members, the deterministic npy/npz writer;
* :mod:`.arrow` -- the ``processed_dataset/*.arrow`` files of a cache directory;
* :mod:`.jsonl` -- line-exact JSON Lines reading and canonical writing;
* :mod:`.sha256sums` -- ``sha256sum`` checksum files, every spelling;
* :mod:`.sniff` -- what a file's first bytes (magic) say it is, for "not what its name says" errors.

Import the submodule you need (``from stage2_data.formats.npz import npz_members``): the package
itself imports neither numpy nor pyarrow. Parse errors are :class:`FormatError` (a ``ValueError``
of the :mod:`stage2_data.errors` family); the checksum parser reports ``ProblemsError``.
"""

from __future__ import annotations

from ..errors import FormatError

__all__ = ["FormatError", "arrow", "jsonl", "npz", "sha256sums", "sniff"]
