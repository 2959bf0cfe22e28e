"""The one retry policy of every request to the hub (downloads, ``pin``, ``list``, revision checks).

A transient failure (a timeout, a dropped connection, HTTP 408, 429, 500, 502, 503, 504) is retried
up to ``attempts`` times in all. The wait before a retry is the server's ``Retry-After`` when a 429
or 503 carries one (delta-seconds, ``Retry-After: 120``, or an HTTP-date, ``Retry-After: Wed, 21 Oct
2026 07:28:00 GMT``), else exponential backoff (``backoff`` x 2^n seconds, at most ``max_backoff``:
1, 2, 4, 8 s by default; ``STAGE2_RETRY_BACKOFF`` sets the first wait, a bad value is a
:class:`RetrySettingError`).
A ``Retry-After`` beyond ``max_retry_after`` is not waited for: the call fails at once with
:class:`RetryAfterTooLongError`, which says when to retry. Anything else is not retried: it is
mapped to a :class:`~stage2_data.errors.HubError` naming the repo, revision, endpoint and fix.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from ..errors import HubError, SettingError, Stage2Error, env_number
from .cancel import PROCESS_CANCEL  # the process is stopping: no retry waits any longer
from .hub import HubSource, _first_line, _hub_error, _is_client_error, _is_transient

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ATTEMPTS = 5
DEFAULT_BACKOFF = 1.0  # seconds before the first retry; doubled on each further retry
BACKOFF_ENV = "STAGE2_RETRY_BACKOFF"
"""Overrides DEFAULT_BACKOFF: seconds (a number >= 0) before the first retry of the default policy."""
MAX_BACKOFF = 30.0
MAX_RETRY_AFTER = 300.0
"""The longest ``Retry-After`` waited for, in seconds (the hub's rate-limit window is 5 minutes);
``STAGE2_MAX_RETRY_AFTER`` overrides it."""
RETRY_AFTER_STATUS = frozenset({429, 503})


class RetryAfterTooLongError(HubError):
    """The hub asked to retry later than the policy waits (``Retry-After`` beyond the cap)."""

    def __init__(self, message: str, *, retry_at: datetime, seconds: float, fix: str) -> None:
        self.retry_at = retry_at
        self.seconds = seconds
        super().__init__(message, fix=fix)


class RetryCancelled(HubError):
    """The process is stopping: a retry was not made."""

    could_not_run = False  # a stop, said as such


class RetrySettingError(SettingError):
    """``STAGE2_RETRY_BACKOFF`` is not a number of seconds >= 0."""


def default_backoff() -> float:
    """The first backoff of the default policy, in seconds: ``STAGE2_RETRY_BACKOFF`` when set (a
    finite number >= 0), else DEFAULT_BACKOFF. Raises RetrySettingError for any other value."""
    return env_number(
        BACKOFF_ENV,
        DEFAULT_BACKOFF,
        what="a number of seconds >= 0 (the wait before the first retry of a request to the hub).",
        fix=f"set {BACKOFF_ENV} to a number of seconds such as {DEFAULT_BACKOFF:g} (doubled on each "
        f"further retry, at most {MAX_BACKOFF:g} s), or unset it for the default",
        error=RetrySettingError,
    )


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait by a ``Retry-After`` value: delta-seconds or an HTTP-date (a date in the past
    is 0). None: absent or malformed."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after_of(e: BaseException) -> float | None:
    """The ``Retry-After`` wait a 429/503 answer asked for, in seconds; None if it asked none."""
    response = getattr(e, "response", None)
    if getattr(response, "status_code", None) not in RETRY_AFTER_STATUS:
        return None
    headers = getattr(response, "headers", None)
    return parse_retry_after(headers.get("retry-after") if headers is not None else None)


def _cap_from_env() -> float:
    raw = os.environ.get("STAGE2_MAX_RETRY_AFTER", "").strip()
    try:
        return float(raw) if raw else MAX_RETRY_AFTER
    except ValueError:
        return MAX_RETRY_AFTER


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure (see the module's docstring)."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff: float = field(default_factory=default_backoff)  # DEFAULT_BACKOFF, or STAGE2_RETRY_BACKOFF
    max_backoff: float = MAX_BACKOFF
    max_retry_after: float | None = None  # None: MAX_RETRY_AFTER, or STAGE2_MAX_RETRY_AFTER

    @property
    def retry_after_cap(self) -> float:
        return self.max_retry_after if self.max_retry_after is not None else _cap_from_env()

    def backoff_wait(self, attempt: int) -> float:
        """The backoff before retry number ``attempt`` (1: after the first failure)."""
        return float(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))


def _too_long(
    e: BaseException, source: HubSource, what: str, seconds: float, cap: float
) -> RetryAfterTooLongError:
    status = getattr(getattr(e, "response", None), "status_code", None)
    at = datetime.fromtimestamp(time.time() + seconds, UTC).replace(microsecond=0)
    when = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return RetryAfterTooLongError(
        f"{what}: the hub at {source.api_endpoint} answered HTTP {status} and asks to retry after "
        f"{seconds:.0f} s (at {when}), longer than the {cap:.0f} s stage2 waits; nothing more was requested.",
        retry_at=at,
        seconds=seconds,
        fix=f"re-run after {when} (verified archives are kept and partial ones resume), "
        "or set STAGE2_MAX_RETRY_AFTER to a number of seconds to wait that long",
    )


def with_retries(
    call: Callable[[int], T],
    source: HubSource,
    *,
    what: str,
    path: str | None = None,
    policy: RetryPolicy | None = None,
    cancelled: Callable[[], BaseException] | None = None,
    give_up_note: Callable[[], str] | None = None,
) -> tuple[T, int]:
    """``call(attempt)`` until it returns, retrying transient failures by ``policy``; returns (its
    value, the attempts made). A ``Stage2Error`` passes through; another client error becomes a
    HubError (naming ``what`` and ``path``); anything else propagates unchanged. ``cancelled()``
    makes the error raised when the process stops during a wait; ``give_up_note()`` adds to the
    message after the last attempt."""
    policy = policy or RetryPolicy()
    attempts = max(1, policy.attempts)
    for attempt in range(1, attempts + 1):
        try:
            return call(attempt), attempt
        except Stage2Error:
            raise
        except Exception as e:  # OSError too: _is_transient decides what is retried
            if not _is_transient(e):
                if _is_client_error(e):
                    raise _hub_error(e, source, what=what, path=path) from e
                raise
            last = e
        asked = retry_after_of(last)
        cap = policy.retry_after_cap
        if asked is not None and asked > cap:
            raise _too_long(last, source, what, asked, cap) from last
        if attempt == attempts:
            note = give_up_note() if give_up_note is not None else ""
            raise _hub_error(
                last, source, what=f"{what} (gave up after {attempts} attempt(s))", path=path, note=note
            ) from last
        wait = asked if asked is not None else policy.backoff_wait(attempt)
        log.warning(
            "%s: attempt %d/%d failed (%s); retrying in %.1fs%s",
            path or what,
            attempt,
            attempts,
            source.redact(_first_line(f"{type(last).__name__}: {last}")),
            wait,
            " (the hub's Retry-After)" if asked is not None else "",
        )
        if PROCESS_CANCEL.wait(wait):  # the process is stopping: no more waiting
            if cancelled is not None:
                raise cancelled() from last
            raise RetryCancelled(f"{what}: stopped while waiting to retry.", fix="re-run the command")
    raise AssertionError("unreachable")  # pragma: no cover
