"""``stage2 pin``: fill a profile's sizes and sha256 from the hub's listing at the pinned revision,
and name the closest upstream files for every entry missing upstream or marked unknown."""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.errors import RevisionNotFoundError

from .. import layout
from ..errors import HubError, ProblemsError, ProfileError
from ..profile import ArchiveSpec, Profile
from .hub import HubSource, RemoteFile
from .listing import closest_files, list_remote_files, resolve_revision


class PinError(ProblemsError, ProfileError):
    """``pin`` refused: the profile disagrees with the hub's listing."""


class UnknownRevisionError(HubError):
    """The profile's [source] revision (a branch name, tag or short hash) names nothing the hub
    knows in the repository; ``revision`` is that name."""

    def __init__(self, message: str, *, fix: str, revision: str) -> None:
        self.revision = revision
        super().__init__(message, fix=fix)


def resolve_floating_revision(source: HubSource, *, where: str, again: str, hub: str | None = None) -> str:
    """The full commit that ``source.revision``, a branch name, tag or short hash, resolves to on the
    hub now (``HfApi.repo_info(revision=...).sha``), for ``stage2 pin`` to write into the profile.
    UnknownRevisionError when the hub knows no such revision of the repository: ``where`` (the
    profile) and ``again`` (the command to re-run) make its fix, ``hub`` names the hub in it (default:
    its endpoint). Other failures: HubError."""
    try:
        return resolve_revision(source)
    except HubError as e:
        if not isinstance(e.__cause__, RevisionNotFoundError):
            raise
        raise UnknownRevisionError(
            f"{where}: [source] revision {source.revision!r} is no branch, tag or commit of "
            f"{source.label} at {hub or source.api_endpoint}.",
            fix=f"set revision under [source] in {where} to a branch, tag or commit the repository has "
            f'(e.g. "main", or the full 40-hex commit you want), then run `{again}`',
            revision=source.revision,
        ) from None


@dataclass(frozen=True)
class UnknownEntry:
    """An ``[[archives]]`` entry marked ``unknown = true``, with the closest upstream archives."""

    index: int
    path: str  # the guess
    closest: list[str]

    def line(self) -> str:
        near = "; ".join(self.closest) if self.closest else "no archive upstream"
        return f"archives[{self.index}] {self.path} (unknown): closest upstream: {near}"


def unknown_entries(profile: Profile, remote: dict[str, RemoteFile]) -> list[UnknownEntry]:
    """Every entry marked unknown, with the closest archives of the listing not already in the profile."""
    taken = {a.path for a in profile.archives if not a.unknown} | profile.quarantined_paths()
    return [
        UnknownEntry(i, a.path, closest_files(a.path, remote, exclude=taken))
        for i, a in profile.unknown_archives()
    ]


def pin_profile(
    profile: Profile,
    source: HubSource,
    *,
    remote: dict[str, RemoteFile] | None = None,
    unknown_out: list[UnknownEntry] | None = None,
) -> tuple[Profile, list[str]]:
    """Fill every missing size/sha256 from the hub's listing at the pinned revision (``remote``:
    that listing, when the caller already has it). Entries marked ``unknown`` are left as they are;
    nothing is ever requested under their guessed names; ``unknown_out`` (when given) receives
    each, with the closest upstream archives (:func:`unknown_entries`).

    Refuses (PinError, a ProfileError listing every problem) when an archive is missing
    upstream (naming the closest upstream files), a pinned size or sha256 differs from the listing,
    an upstream file has no sha256 (not an LFS file), a quarantined file is listed under
    [[archives]], or ``source`` names another repository or revision than the profile. A revision
    that is not a full commit, or that does not exist, is refused before or by the hub
    (ProfileError / HubError): a branch, tag or short hash is resolved first
    (:func:`resolve_floating_revision`). Returns the new profile and one human-readable line per change.
    """
    problems: list[str] = []
    src = profile.source
    if (source.repo_id, source.repo_type, source.revision) != (src.repo_id, src.repo_type, src.revision):
        problems.append(
            f"the hub source {source.repo_type}:{source.repo_id}@{source.revision} is not the profile's "
            f"[source] {src.repo_type}:{src.repo_id}@{src.revision}"
        )
    if not layout.HEX40_RE.match(source.revision):
        raise ProfileError(
            f"revision {source.revision!r} is not a full 40-hex commit; a branch name, tag or short hash "
            "is never a pin.",
            fix="set [source] revision to the full commit you want to pin",
        )
    quarantined = profile.quarantined_paths()
    for i, a in enumerate(profile.archives):
        if a.path in quarantined or layout.split_base(a.path) in quarantined:
            problems.append(
                f"archives[{i}] {a.path}: quarantined, yet listed under [[archives]]; "
                "a quarantined file is never downloaded: remove one of the two entries"
            )
    if problems:
        raise PinError(
            f"cannot pin profile {profile.name}",
            problems,
            fix="correct the profile, then run `stage2 pin` again",
        )

    if remote is None:
        remote = list_remote_files(source)
    if unknown_out is not None:
        unknown_out.extend(unknown_entries(profile, remote))
    taken = {a.path for a in profile.archives if not a.unknown} | quarantined
    changes: list[str] = []
    new_archives: list[ArchiveSpec] = []
    for i, a in enumerate(profile.archives):
        if a.unknown:
            new_archives.append(a)
            continue
        r = remote.get(a.path)
        if r is None:
            near = closest_files(a.path, remote, exclude=taken)
            problems.append(
                f"archives[{i}] {a.path}: not found upstream in {source.label} at revision {source.revision}"
                + (f" (closest upstream: {'; '.join(near)})" if near else "")
            )
            new_archives.append(a)
            continue
        if r.sha256 is None:
            problems.append(
                f"archives[{i}] {a.path}: upstream lists no sha256 (not an LFS file); cannot pin it"
            )
            new_archives.append(a)
            continue
        if a.size is not None and a.size != r.size:
            problems.append(f"archives[{i}] {a.path}: size {a.size} in the profile, {r.size} upstream")
        if a.sha256 is not None and a.sha256 != r.sha256:
            problems.append(f"archives[{i}] {a.path}: sha256 {a.sha256} in the profile, {r.sha256} upstream")
        if a.size is None or a.sha256 is None:
            changes.append(f"pinned {a.path}: size={r.size} sha256={r.sha256}")
        new_archives.append(a.model_copy(update={"size": r.size, "sha256": r.sha256}))
    if problems:
        raise PinError(
            f"cannot pin profile {profile.name}: it disagrees with the hub's listing of {source.label} "
            f"at {source.revision}",
            problems,
            fix="correct the named [[archives]] entries (or the revision) so they match upstream, then pin again",
        )
    validated = [ArchiveSpec.model_validate(a.model_dump()) for a in new_archives]
    return profile.model_copy(update={"archives": validated}), changes
