"""``HubServer``: a ``HubRepository`` served over HTTP on the loopback interface, and its command line.

Command line: ``python -m stage2_data.demo.hubserver FOLDER [--repo-id R] [--revision REV] [--port P]``
prints the URL on one line and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from ...errors import HubSetupError
from .handler import HubHTTPServer
from .repository import (
    HUB_MARKER,
    REPO_TYPES,
    HubFaults,
    HubRepository,
    check_repo_names,
    declared_source,
    hub_folder,
)


class HubServer(HubRepository):
    """One repository at one revision, served over HTTP on the loopback interface."""

    _server: HubHTTPServer | None = None
    _thread: threading.Thread | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"HubServer({self.repo_type}:{self.repo_id}@{self.revision}, url={self.url if self._server else None})"

    def start(self) -> HubServer:
        if self._server is not None:
            return self
        self.scan()
        try:
            self._server = HubHTTPServer((self.host, self.port), self)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise HubSetupError(
                f"cannot serve the hub on {self.host}:{self.port}: another program listens on that port",
                fix="serve it on another port (`--port`; 0 takes a free one), or stop that program",
            ) from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="hubserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def serve_until_signal(self) -> None:
        """Start, print the URL on one line, and serve until SIGTERM or SIGINT; then stop. The
        handler only sets a flag: one that took a lock (``threading.Event.set``) could deadlock,
        run in this thread while this thread holds that lock in ``Event.wait``, as a burst of
        signals showed. The wait is in slices: a signal the kernel hands to another thread
        interrupts no sleep of this one, and the handler (run by this thread between bytecodes)
        must get its turn."""
        stopped = [False]

        def on_signal(*_: object) -> None:
            stopped[0] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        with self:
            print(self.url, flush=True)
            while not stopped[0]:
                time.sleep(0.25)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_pinned(
    folder: str | os.PathLike[str], *, repo_id: str, revision: str | None, repo_type: str = "dataset"
) -> HubServer:
    """``folder`` as the hub of a build or a pin (``--hub-folder``), not started: at the one commit a
    folder has, which ``main`` also names: the one its :data:`~.repository.HUB_MARKER` declares it
    mirrors, else its own (:func:`~.repository.folder_commit`). A ``revision`` that is another
    commit, or a ``repo_id`` other than the declared one, is refused (HubSetupError naming both):
    the real hub refuses a mistyped revision, and a folder served at any revision it is asked for
    would let a typo in a profile be built and published under that revision. None: the folder's
    commit, for a profile that names a branch (``stage2 pin`` resolves it)."""
    server = HubServer(Path(folder), repo_id=repo_id, revision=None, repo_type=repo_type)
    _refuse_other_source(server.folder, server.declared, server.revision, repo_id=repo_id, revision=revision)
    return server


def check_declared_source(folder: str | os.PathLike[str], *, repo_id: str, revision: str) -> None:
    """What :func:`serve_pinned` refuses, judged from the folder's :data:`~.repository.HUB_MARKER`
    alone (one small file read, no file of the folder hashed): a folder declaring another commit or
    repo is refused; a folder without a declaration passes (its commit is a digest of its files,
    which only serving it computes)."""
    declared = declared_source(Path(folder))
    if declared is not None:
        _refuse_other_source(Path(folder), declared, declared["revision"], repo_id=repo_id, revision=revision)


def served_as(
    folder: str | os.PathLike[str], *, repo_id: str | None, revision: str | None
) -> tuple[str, str | None]:
    """The repository and commit a command line serves ``folder`` as: for each one not given, what
    the folder's :data:`~.repository.HUB_MARKER` declares. A given one that differs from the
    declaration is refused (HubSetupError naming both): the folder's files would be handed out as a
    repository or commit they are not from, and a profile pinned from that hub would name a commit
    no hub has. Without a declaration ``repo_id`` is needed; ``revision`` None is then the folder's
    own commit (:func:`~.repository.folder_commit`)."""
    check_repo_names(repo_id, revision)  # what is given is named first, as HubRepository names it
    path = hub_folder(folder)
    declared = declared_source(path)
    if declared:
        other = []
        if revision is not None and revision != declared["revision"]:
            other.append(f"--revision {revision}")
        if repo_id is not None and repo_id.lower() != declared.get("repo_id", repo_id).lower():
            other.append(f"--repo-id {repo_id}")
        if other:
            what = f"{declared['repo_id']} at commit" if "repo_id" in declared else "commit"
            raise HubSetupError(
                f"the hub folder {path} declares in its {HUB_MARKER} that it mirrors {what} "
                f"{declared['revision']}; {' and '.join(other)} would serve its files as what they "
                "are not.",
                fix="leave out --repo-id and --revision (they default to what the folder declares), or "
                "serve the folder of that repository and commit",
            )
        repo_id = declared.get("repo_id") or repo_id  # as declared (the hub's ids ignore case)
        revision = declared["revision"]
    if repo_id is None:
        raise HubSetupError(
            f"no --repo-id given, and the hub folder {path} declares none (no repo_id in a {HUB_MARKER} there).",
            fix="pass --repo-id namespace/name, as the profile's [source] repo_id holds it (e.g. "
            "robometer/processed_datasets)",
        )
    return repo_id, revision


def _refuse_other_source(
    folder: Path, declared: dict[str, str] | None, commit: str, *, repo_id: str, revision: str | None
) -> None:
    """HubSetupError when the folder (at ``commit``; ``declared`` its declaration, if any) is not the
    profile's ``repo_id`` at ``revision``."""
    from ...errors import HubSetupError

    what = (
        f"the commit its {HUB_MARKER} declares it mirrors"
        if declared
        else f"a digest of its files (the one revision a folder without a {HUB_MARKER} has)"
    )
    if revision is not None and revision != commit:
        raise HubSetupError(
            f"the hub folder {folder} is at commit {commit} ({what}), not at the "
            f"profile's [source] revision {revision}.",
            fix=f'set the profile\'s [source] revision to "{commit}" (or to "main" and run '
            "`stage2 pin PROFILE --hub-folder FOLDER --write`), or pass the folder the profile was "
            f"pinned from"
            + (
                ""
                if declared
                else f", or declare the commit the folder mirrors in {folder / HUB_MARKER}: "
                f'{{"repo_id": "{repo_id}", "revision": "<the 40-hex commit>"}}'
            ),
        )
    if declared and declared.get("repo_id", repo_id).lower() != repo_id.lower():  # the hub's ids ignore case
        raise HubSetupError(
            f"the hub folder {folder} mirrors {declared['repo_id']} (its {HUB_MARKER}), not the "
            f"profile's [source] repo_id {repo_id}.",
            fix=f'set the profile\'s [source] repo_id to "{declared["repo_id"]}", or pass the folder of '
            f"{repo_id}",
        )


def _rate(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive rate in MB/s")
    return value * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m stage2_data.demo.hubserver",
        description="Serve FOLDER as one Hugging Face Hub repository at one revision, on the loopback interface.",
    )
    ap.add_argument("folder", type=Path)
    ap.add_argument("--repo-id", default=None, help="default: the one the folder's .stage2-hub.json declares")
    ap.add_argument(
        "--revision",
        default=None,
        help="the full 40-hex commit the repo is served at; default: the one the folder's .stage2-hub.json "
        "declares, else a digest of its files",
    )
    ap.add_argument("--repo-type", default="dataset", choices=REPO_TYPES)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--token-env",
        default=None,
        help="name of an environment variable holding a token every request must carry (never on the command line)",
    )
    ap.add_argument(
        "--rate-mb-s",
        type=_rate,
        default=None,
        metavar="MB_S",
        help="pace each file download to this many MB/s (as one connection to a CDN); default: unpaced",
    )
    ap.add_argument(
        "--link-rate-mb-s",
        type=_rate,
        default=None,
        metavar="MB_S",
        help="pace all file downloads together to this many MB/s (one shared link); default: unpaced",
    )
    args = ap.parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"error: environment variable {args.token_env} is empty or unset", file=sys.stderr)
            return 2
    try:
        repo_id, revision = served_as(args.folder, repo_id=args.repo_id, revision=args.revision)
        server = HubServer(
            args.folder,
            repo_id=repo_id,
            revision=revision,
            repo_type=args.repo_type,
            host=args.host,
            port=args.port,
            token=token,
            faults=HubFaults(rate=args.rate_mb_s, link_rate=args.link_rate_mb_s),
        )
        server.serve_until_signal()
    except ValueError as e:  # a setting it cannot serve (HubSetupError among them): one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
