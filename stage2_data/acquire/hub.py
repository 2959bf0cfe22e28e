"""The hub: a pinned source, the environment it honours, and the mapping of client errors.

Everything that talks to the hub goes through the client's own functions (``HfApi``,
``get_hf_file_metadata``, ``hf_hub_url``, ``build_hf_headers``, ``http_stream_backoff``,
``hf_raise_for_status``); the endpoint is always passed explicitly, so the same code talks to
https://huggingface.co or to the loopback hub (``stage2_data.demo``'s hub server) by changing only
``HubSource.endpoint``. The token is never logged, never put in an exception message, a repr or a
record.

The environment is honoured as ``huggingface_hub`` documents it, but read when a call is made (the
client itself reads it once, at import): ``HF_ENDPOINT`` is the endpoint when none is given
(``--endpoint`` wins), ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) means use what is on disk
and request nothing (:func:`hub_offline`, :class:`HubOfflineError`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..errors import HubError, HubSetupError, ProfileError, SettingError
from ..profile import Profile
from .endpoint import hub_offline, pin_check_command, resolve_endpoint

try:  # huggingface_hub >= 2 uses httpx2; 1.x uses httpx
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - depends on the installed client
    import httpx as _httpx  # type: ignore[no-redef]

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class HubOfflineError(HubError):
    """Offline mode (``HF_HUB_OFFLINE``) is on and something not on disk was needed; ``missing``
    names it. Nothing was requested."""

    def __init__(self, message: str, *, fix: str | None = None, missing: list[str] | None = None) -> None:
        self.missing = list(missing or [])
        super().__init__(message, fix=fix)


class PinDisagreesError(ProfileError):
    """A pin (an archive's ``size`` or ``sha256`` in the profile) is wrong: the hub's listing at the
    pinned revision gives the file other values, found against a verified archive on disk (the
    listing agrees with the file, which stays) or by the hub's answer to its download. A bad
    profile, however it was found: the build cannot run (exit 2, docs/commands.md).
    ``upstream``: the listing's (size, sha256), when a download found it; ``said``: what the
    download's answer said."""

    could_not_run = True

    def __init__(
        self,
        message: str,
        *,
        fix: str,
        path: str,
        keys: list[str],
        upstream: tuple[int, str] | None = None,
        said: str | None = None,
    ) -> None:
        self.path = path
        self.keys = keys
        self.upstream = upstream
        self.said = said
        super().__init__(message, fix=fix)


def require_online(source: HubSource, what: str) -> None:
    """Raise HubOfflineError when offline mode is on: ``what`` needs the hub."""
    if hub_offline():
        raise HubOfflineError(
            f"{what} needs the hub ({source.label} at {source.api_endpoint}), and HF_HUB_OFFLINE is set: "
            "nothing was requested.",
            fix="unset HF_HUB_OFFLINE (or set it to 0) and re-run",
        )


# ----- what a command is given: the token's variable, a hub folder ------------------------------------
#: the environment variable holding the hub token when no ``--token-env`` is given (read when set)
DEFAULT_TOKEN_ENV = "HF_TOKEN"


def require_token_env(name: str | None) -> str | None:
    """The hub token: from the environment variable ``name`` (``--token-env NAME``), else (``name``
    None: no ``--token-env``) from ``HF_TOKEN`` when it is set, else None (anonymous). A variable
    named by ``--token-env`` that is not set (or is empty) is refused (SettingError, exit 2) before
    anything is requested: the command would otherwise go on anonymously, and a private or gated
    repository would then fail far from the cause. Call it with ``args.token_env`` where the option's
    default is None; the token itself is never put in a message."""
    if name is None:
        return os.environ.get(DEFAULT_TOKEN_ENV) or None
    value = os.environ.get(name)
    if not value:
        said = "is not set" if value is None else "is empty"
        raise SettingError(
            f"--token-env {name}: the environment variable {name} {said}.",
            fix=f"export {name}=<your token>, or leave out --token-env for a public repo",
        )
    return value


def require_hub_folder(profile: Profile, folder: str | os.PathLike[str]) -> None:
    """Refuse (HubSetupError, exit 2) a ``--hub-folder`` (a folder: its callers refuse anything else
    first) that holds none of the profile's archives (not one ``[[archives]] path`` is a file under
    it; entries marked ``unknown = true`` are guesses and are not looked for): the wrong folder was
    given (the kit's, say, instead of the repository's), and every download would fail blaming the
    profile. Called before anything is served or launched (``stage2 pin``, ``stage2 build``)."""
    given = os.fspath(folder)
    where = Path(given)
    wanted = [a.path for a in profile.archives if not a.unknown]
    if not wanted or any((where / path).is_file() for path in wanted):
        return
    demo = profile.kit_root.parent / "upstream"  # `stage2 demo --out OUT`: OUT/demo/{kit,upstream}
    if demo.resolve() != where.resolve() and any((demo / path).is_file() for path in wanted):
        for_demo = f"for this demo: {demo}"
    else:
        for_demo = "for the demo: OUT/demo/upstream, beside the kit of `stage2 demo --out OUT`"
    raise HubSetupError(
        f"--hub-folder {given} holds none of the profile's {len(wanted)} archives "
        f"(looked for e.g. {where / wanted[0]}).",
        fix=f"pass the folder that holds the dataset's files ({for_demo})",
    )


# ----- the source ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HubSource:
    """A repository pinned at a revision, and where to reach it. ``repr`` never shows the token."""

    repo_id: str
    repo_type: str
    revision: str
    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)
    # the local folder a loopback endpoint serves (`stage2 pin --hub-folder` takes it), when known
    hub_folder: str | None = None
    # the profile file the source was read from, when known: the fixes' commands name it
    profile_path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.repo_type not in ("dataset", "model", "space"):
            raise ProfileError(
                f"repo_type {self.repo_type!r} of {self.repo_id} is not dataset, model or space.",
                fix="set [source] repo_type to dataset, model or space",
            )

    @classmethod
    def from_profile(
        cls, profile: Profile, *, endpoint: str | None = None, token: str | None = None
    ) -> HubSource:
        s = profile.source
        return cls(
            repo_id=s.repo_id,
            repo_type=s.repo_type,
            revision=s.revision,
            endpoint=endpoint,
            token=token,
            profile_path=str(profile.profile_path) if profile.profile_path else None,
        )

    @property
    def api_endpoint(self) -> str:
        """The endpoint actually used: the explicit one, else ``HF_ENDPOINT`` (read now), else the real hub."""
        return resolve_endpoint(self.endpoint)

    @property
    def label(self) -> str:
        return f"{self.repo_type} repo {self.repo_id}"

    def api(self) -> HfApi:
        return HfApi(endpoint=self.api_endpoint, token=self.token)

    def file_url(self, path: str) -> str:
        return hf_hub_url(
            self.repo_id, path, repo_type=self.repo_type, revision=self.revision, endpoint=self.api_endpoint
        )

    def redact(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token else text


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # the LFS oid; None for a file stored in git (not LFS)


# ----- client errors ------------------------------------------------------------------------------
def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        return status in TRANSIENT_STATUS
    if isinstance(e, OfflineModeIsEnabled):
        return False
    if isinstance(e, _httpx.TimeoutException | _httpx.NetworkError | _httpx.RemoteProtocolError):
        return True
    # http_get's own length check ("Consistency check failed: file should be of size ...").
    return isinstance(e, OSError) and "Consistency check failed" in str(e)


def _is_client_error(e: BaseException) -> bool:
    return isinstance(e, HfHubHTTPError | OfflineModeIsEnabled | _httpx.HTTPError) or _is_transient(e)


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL (the port only when the URL names one)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def _redirected_host(e: BaseException, endpoint: str) -> str | None:
    """The origin (``scheme://host[:port]``) of the request that failed, when it is not the
    endpoint's: the hub redirected the request there (its CDN or storage). None otherwise."""
    try:
        url = str(e.request.url)  # type: ignore[attr-defined]  # httpx raises RuntimeError when unset
    except (AttributeError, RuntimeError):
        return None
    failed = _origin(url)
    return failed if failed != _origin(endpoint) else None


def _hub_error(
    e: BaseException, source: HubSource, *, what: str, path: str | None = None, note: str = ""
) -> HubError:
    """A HubError naming the repo, revision, endpoint (and file) and the fix, for a client error."""
    ep = source.api_endpoint
    rev = source.revision
    if isinstance(e, GatedRepoError):
        msg = f"{what}: {source.label} at {ep} is gated and the token has no access to it."
        fix = "accept the repository's conditions on the hub, then pass a token that has access (HF_TOKEN)"
    elif isinstance(e, RepositoryNotFoundError):
        msg = (
            f"{what}: {source.label} not found at {ep} (or private and not accessible with the given token)."
        )
        fix = (
            "check [source] repo_id and repo_type in the profile; for a private repo pass a token (HF_TOKEN)"
        )
    elif isinstance(e, RevisionNotFoundError):
        msg = f"{what}: revision {rev} of {source.label} does not exist at {ep}."
        fix = (
            "set [source] revision to an existing full 40-hex commit of the repository, then run `stage2 pin`"
        )
    elif isinstance(e, RemoteEntryNotFoundError):
        msg = f"{what}: {path!r} does not exist in {source.label} at revision {rev} ({ep})."
        fix = (
            "check the archive path in the profile; "
            f"{pin_check_command(source.profile_path or '<profile>', ep, source.hub_folder)} "
            "lists every archive missing upstream"
        )
    elif isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            msg = f"{what}: the hub at {ep} rejected the token for {source.label} (HTTP 401)."
            fix = "pass a valid token (HF_TOKEN) or none for a public repository"
        elif status == 403:
            msg = f"{what}: the token may not read {source.label} at {ep} (HTTP 403)."
            fix = "use a token with read access to the repository"
        else:
            msg = f"{what}: the hub at {ep} answered HTTP {status} ({_first_line(str(e))})."
            fix = "retry later; if it persists, check the hub's status page"
    elif isinstance(e, OfflineModeIsEnabled):
        msg = f"{what}: huggingface_hub offline mode is on (HF_HUB_OFFLINE), {ep} was not contacted."
        fix = "unset HF_HUB_OFFLINE (or set it to 0) and re-run"
    elif isinstance(e, _httpx.HTTPError) and (other := _redirected_host(e, ep)) is not None:
        msg = (
            f"{what}: {other} could not be reached ({type(e).__name__}: {_first_line(str(e)) or 'no detail'}); "
            f"the hub at {ep} answered and redirected the request there."
        )
        fix = (
            f"the hub is reachable, the host it sends downloads to is not: check that this machine may reach "
            f"{other} (network, firewall, proxy: HTTPS_PROXY / NO_PROXY), then re-run; partial files resume"
        )
    elif isinstance(e, _httpx.HTTPError):
        msg = f"{what}: hub unreachable at {ep} ({type(e).__name__}: {_first_line(str(e)) or 'no detail'})."
        fix = (
            "check the network and the endpoint (--endpoint / HF_ENDPOINT); "
            "for the loopback hub, check that it is running"
        )
    else:
        msg = f"{what}: {type(e).__name__}: {_first_line(str(e))} ({ep})."
        fix = "retry; if it persists, check the hub and the network"
    return HubError(source.redact(msg + note), fix=fix)
