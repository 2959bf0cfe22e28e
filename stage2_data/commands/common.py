"""What every command shares (the core's and the plugins', e.g. ``stage2_pipelines.commands``):
output helpers, exit codes, the ``--storage-option`` and ``--json`` arguments."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HubError, Stage2Error, StoreError

EXIT_FAILED = 1  # the command ran and found problems (a failed check, an invalid store)
EXIT_ERROR = 2  # the command could not run (bad input, bad arguments)
EXIT_BUG = 3  # an exception no guard named escaped: a bug

# what leaving out a folder option means, said in the fix of one that names no folder
KIT_ROOT_LEFT_OUT = "the kit is then the profile's own folder"
HUB_FOLDER_LEFT_OUT = "the archives then come from the hub at --endpoint, $HF_ENDPOINT or huggingface.co"


def count_of(what: str, minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for ``what`` ("a number of stores"): an integer in ``[minimum, maximum]``;
    anything else is a usage error that says what the option takes (``--concurrency 0``)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or n < minimum or (maximum is not None and n > maximum):
            upto = f" and <= {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"{value!r} is not {what} (an integer >= {minimum}{upto})")
        return n

    return parse


#: how many JSON objects :func:`print_json` printed in this process (a command's ``--json`` prints
#: one; the CLI prints :func:`error_document` on an error only when the command printed none)
json_printed = 0


def print_json(obj: Any) -> None:
    global json_printed
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    json_printed += 1


def error_document(
    command: str, err: BaseException, *, message: str | None = None, fix: str | None = None
) -> dict[str, Any]:
    """``--json``'s one object for a command that could not run: ``ok`` false, the command, the
    error's class, its message and fix (a :class:`~stage2_data.errors.Stage2Error`'s, else the
    ``message``/``fix`` given), and ``problems``: the one line stderr shows. The same keys as
    ``stage2 validate``'s object for a store it cannot open."""
    msg = message if message is not None else str(getattr(err, "message", None) or err)
    fix = fix if fix is not None else getattr(err, "fix", None)
    line = str(err) if message is None else (f"{msg} Fix: {fix}" if fix else msg)
    return {
        "ok": False,
        "command": command,
        "error": type(err).__name__,
        "message": msg,
        "fix": fix,
        "problems": [line],
    }


def eprint(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


def storage_options(args: argparse.Namespace, *targets: object) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` (repeatable) -> fsspec storage options; VALUE is parsed as JSON
    when it is JSON (numbers, booleans, objects such as ``client_kwargs={...}``), else kept as text.
    Refused when every one of ``targets`` (the command's stores, as ``_target`` gives them: a local
    one a Path) is local, as `stage2 build` refuses them without --store-url: options a command
    does not use are a mistake the user should hear of (a misplaced flag, a store named wrongly)."""
    out: dict[str, Any] = {}
    for item in getattr(args, "storage_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StoreError(
                f"--storage-option {item!r} is not KEY=VALUE.",
                fix="e.g. --storage-option endpoint_url=http://127.0.0.1:9000",
            )
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    if out and targets and all(isinstance(t, Path) for t in targets):
        raise StoreError(
            f"--storage-option ({', '.join(sorted(out))}) is given with local paths only ({targets[0]}): "
            "storage options are for object storage (s3://, gs://, ...).",
            fix="leave out --storage-option, or name what is on object storage by its URL (s3://bucket/...)",
        )
    return out or None


def add_storage_option(p: Any) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="an fsspec storage option for s3:// (or other URL) stores, repeatable; e.g. "
        "endpoint_url=http://127.0.0.1:9000 key=ID secret=SECRET",
    )


def add_profile(p: Any) -> None:
    """The profile .toml: the command's first argument, or ``--profile PROFILE`` as `stage2 build`
    takes it (:func:`resolve_profile` makes them one ``args.profile``)."""
    p.add_argument("profile", nargs="?", help="profile .toml (or --profile PROFILE)")
    p.add_argument(
        "--profile", dest="profile_option", metavar="PROFILE", help="the profile .toml, as PROFILE"
    )


def add_token_env(p: Any) -> None:
    """``--token-env NAME``: the environment variable holding the hub token (default None: HF_TOKEN
    when set; :func:`~stage2_data.acquire.hub.require_token_env` refuses a name that is not set)."""
    p.add_argument(
        "--token-env",
        default=None,
        metavar="NAME",
        help="environment variable holding the hub token, refused when not set (default: HF_TOKEN, when set)",
    )


def resolve_profile(args: argparse.Namespace, command: argparse.ArgumentParser) -> None:
    """``args.profile`` from the argument or ``--profile`` (a command of :func:`add_profile`); the
    command's usage error when neither or two different ones are given."""
    if not hasattr(args, "profile_option"):
        return
    given = [v for v in (args.profile, args.profile_option) if v is not None]
    if not given:
        if getattr(args, "profile_required", True):
            command.error("the following arguments are required: profile (or --profile PROFILE)")
        return
    if len(set(given)) > 1:
        command.error(f"two profiles given: {given[0]} and --profile {given[1]}. Fix: give the profile once")
    args.profile = given[0]


def finish_command(
    p: Any,
    func: Callable[[argparse.Namespace], int],
    *,
    json_help: str = "print one JSON object",
    storage_option: bool = False,
) -> None:
    """What a command's parser ends with: ``--json``, ``--storage-option`` (a command that opens a
    store), and the function the command runs."""
    p.add_argument("--json", action="store_true", help=json_help)
    if storage_option:
        add_storage_option(p)
    p.set_defaults(func=func)


def require_folder_option(
    option: str, folder: str | os.PathLike[str] | None, error: type[Stage2Error], without: str
) -> None:
    """Refuse (``error``, exit 2) a folder option given as a path that is no folder, before any work
    (a step would find it missing late): what is there, where a relative path was looked for, and
    what leaving the option out means (``without``)."""
    if not folder or Path(folder).is_dir():
        return
    if Path(folder).exists():
        what = "is not a folder"
    elif Path(folder).is_absolute():
        what = "does not exist"
    else:
        what = f"does not exist (a relative path is taken from the working folder {Path.cwd()})"
    raise error(
        f"{option} {folder} {what}.",
        fix=f"pass an existing folder to {option}, or leave it out ({without})",
    )


def with_demo_hub_folder(err: HubError, profile_path: Path | str) -> HubError:
    """``err`` (the hub could not be reached or read) with, when ``profile_path`` is the profile of a
    generated demo (``<demo>/kit/profile.toml``), the fix that works there: that demo's archives are
    in its hub folder, which ``--hub-folder`` serves on loopback (the real hub may be out of reach,
    and does not hold the demo's revision). ``err`` as it is for any other profile."""
    from ..demo import demo_hub_folder

    folder = demo_hub_folder(profile_path)
    if folder is None:
        return err
    hint = f"this is a generated demo's profile: its archives are in {folder}; add --hub-folder {folder}"
    return HubError(err.message, fix=f"{hint} (else: {err.fix})" if err.fix else hint)
