"""One exception family for the whole library.

Every error names the culprit (file, line, key, member or id) and, where there is one, the fix.
``str(err)`` is the one line a user sees; ``err.fix`` is the command or action that fixes it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import ClassVar

#: What only a bug in the code raises, whatever the bytes it reads: where reading a store treats
#: any other failure as damage (zarr parsing a metadata file may raise almost anything), these are
#: raised as they are, so a bug is an internal error, never a good store called damaged and set aside.
CODE_ERRORS: tuple[type[BaseException], ...] = (NameError, ImportError, SyntaxError)


class Stage2Error(Exception):
    """Base of every error raised by stage2-data."""

    #: True when what stopped the work is the environment, not the data: a full or read-only disk,
    #: a file system's refusal, a pin the hub contradicts or cannot serve, object storage that
    #: refuses (``stage2 build`` exits 2 for it, 1 for a problem found in the data). Subclasses
    #: inherit it, so a new kind of hub error is one without a list to extend.
    could_not_run: ClassVar[bool] = False

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        if not self.fix:
            return self.message
        if "\n" in self.message:  # a list of problems: the fix on a line of its own, after it
            return f"{self.message.rstrip()}\nFix: {self.fix}"
        stop = "" if self.message.rstrip().endswith((".", "!", "?")) else "."
        return f"{self.message.rstrip()}{stop} Fix: {self.fix}"

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled whole (a worker process's error reaches the caller as it was raised): subclasses
        # take other arguments than ``args`` holds, so the state is restored, not re-initialised.
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))


def _restore_error(cls: type[Stage2Error], args: tuple[object, ...], state: dict[str, object]) -> Stage2Error:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ProfileError(Stage2Error, ValueError):
    """A profile file is malformed: unknown/missing key, wrong form, unsafe path."""


class UnknownArchivesError(ProfileError):
    """A profile has ``[[archives]]`` entries marked ``unknown = true``: nothing may be requested
    under a guessed name (``entries``: their guessed paths)."""

    def __init__(self, message: str, *, fix: str | None = None, entries: list[str] | None = None) -> None:
        self.entries = list(entries or [])
        super().__init__(message, fix=fix)


class HubError(Stage2Error):
    """The hub (or the loopback hub) refused or failed a request."""

    could_not_run = True


class HubSetupError(Stage2Error, ValueError):
    """A loopback hub cannot serve what it was given: a folder that is not one, a revision that is
    not a full commit, a repo id or type it does not take (``stage2 serve-hub``, ``--hub-folder``)."""


class ChecksumMismatchError(Stage2Error):
    """A file's sha256 differs from its pin."""

    def __init__(self, path: str, expected: str, actual: str, *, fix: str | None = None) -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(f"sha256 mismatch for {path}: expected {expected}, got {actual}.", fix=fix)


class UnsafeArchiveError(Stage2Error):
    """A tar member would escape its folder, is a link/device, or is otherwise refused."""


class ArchiveError(Stage2Error):
    """An archive is corrupt, truncated, incomplete or has an unexpected layout."""


class DiskSpaceError(Stage2Error, OSError):
    """Not enough free disk for what is about to be written."""

    could_not_run = True


class FileSystemError(Stage2Error, OSError):
    """The file system refused an operation: a read-only file system, permission denied, a file
    where a folder should be (``stage2_data/oserrors.py`` names the path and the fix)."""

    could_not_run = True


class ProblemsError(Stage2Error):
    """Several problems gathered and reported at once."""

    def __init__(self, title: str, problems: Sequence[str], *, fix: str | None = None) -> None:
        self.problems = list(problems)
        shown = "\n".join(f"  - {p}" for p in self.problems[:50])
        more = f"\n  ... and {len(self.problems) - 50} more" if len(self.problems) > 50 else ""
        super().__init__(f"{title}: {len(self.problems)} problem(s):\n{shown}{more}", fix=fix)


class InputsChangedError(ProblemsError):
    """What a step is about to read or has read (an extracted file, an unpacked sidecar) is not what
    its record says any more: changed since the extract stage or the unpack checked it."""


class KitError(ProblemsError):
    """The kit (pair manifest, checksums, action manifests, sidecars) has problems."""


class StoreError(Stage2Error):
    """A VIN offline store is invalid or cannot be written."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No complete store at that path (no manifest.json)."""


class StoreVersionError(StoreError):
    """The store was written by another OFFLINE_DATASET_VERSION."""


class StoreValidationError(ProblemsError, StoreError):
    """Validation of a store found problems."""


class LoaderError(Stage2Error, ValueError):
    """The training loader (``stage2_data.loader``) was given something it cannot batch or select."""


class SplitNameError(LoaderError, StoreError):
    """A split name that is none of a store's (a typo: ``"trian"``, ``"validation"``): the same error
    from the reader, the dataset and the loader's selection, a LoaderError and a StoreError both."""


class MixedResolutionError(LoaderError):
    """A batch holds frames of more than one (H, W): group batches by resolution instead."""


class SettingError(Stage2Error, ValueError):
    """An environment setting (``STAGE2_*``) holds something that is not what it takes."""


def env_number(
    name: str,
    default: float,
    *,
    what: str | None = None,
    fix: str | None = None,
    error: type[SettingError] = SettingError,
) -> float:
    """The finite number >= 0 the environment variable ``name`` holds (``default`` when unset or
    empty); any other value raises ``error``, naming the variable, its value, ``what`` it takes and
    the ``fix`` (by default: set it to a number, or unset it for ``default``)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise error(
            f"{name}={raw!r} is not {what or 'a finite number >= 0.'}",
            fix=fix or f"set it to one, or unset it for {default:g}",
        )
    return value


class PreviewError(Stage2Error, ValueError):
    """A preview cannot be drawn or written: an unknown source, ``n`` < 1, an unwritable output."""


class FormatError(Stage2Error, ValueError):
    """A file, or a member of an archive, does not parse as its format.

    ``detail`` is the reason alone; ``file`` and ``member`` name the culprit when the caller gave
    them (``str(err)`` is ``"<file>: member '<member>': <detail>"``, with the parts that are known).
    It is a ``ValueError``, so code that catches ``ValueError`` around a parse keeps working.
    """

    def __init__(
        self, detail: str, *, file: str | None = None, member: str | None = None, fix: str | None = None
    ) -> None:
        self.detail = detail
        self.file = file
        self.member = member
        where = [p for p in (file, None if member is None else f"member {member!r}") if p]
        super().__init__(": ".join([*where, detail]), fix=fix)


class FileTypeError(FormatError):
    """A file is not what its name says: its first bytes (magic) say another format, e.g. a ``.tar``
    that is gzip- or zstd-compressed, an ``.npz`` that is not a zip, an HTML page saved in place of
    a file (``stage2_data/formats/sniff.py``). ``found`` is what the bytes say."""

    def __init__(
        self,
        detail: str,
        *,
        found: str,
        file: str | None = None,
        member: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.found = found
        super().__init__(detail, file=file, member=member, fix=fix)
