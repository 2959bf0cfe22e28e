"""The ``stage2`` command. Expected failures print one line (what is wrong, and the fix) and exit non-zero.

No traceback reaches a user: an error of the family (``Stage2Error``) is its one line and exit 2; an
``OSError`` that escaped a guard (a read-only or full disk, permission denied, a file where a folder
should be) is named as a ``FileSystemError`` (exit 2); anything else is a bug, reported in one line
with how to see its traceback (``STAGE2_TRACEBACK=1``), exit 3. A reader of the output that went
away (``stage2 list ... | head``) ends the command quietly with 141, as SIGPIPE ends other tools.
An argument a command does not take is named with that command's usage, and with the option meant
when one is close (``--data-rot``) or when it is a positional argument given as an option.

The core's commands live in ``stage2_data/commands/``, one module per group, each with
``register(subparsers)``; they need only the core install. Commands that need an extra are plugins:
entry points of the ``stage2.commands`` group, one per command, each naming its
``register(subparsers)`` (``build`` and ``demo`` come from the Dagster layer,
``stage2_pipelines.commands``). A plugin whose extra is missing is still listed: running it prints
one line saying what to install, and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import select
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

from .commands import command_modules, common
from .commands.common import EXIT_BUG, EXIT_ERROR, eprint, resolve_profile
from .errors import SettingError, Stage2Error
from .oserrors import fs_error

PLUGIN_GROUP = "stage2.commands"
PLUGIN_EXTRA = "pipeline"  # the extra that provides the plugins
DIST = "stage2-data"
EXIT_PIPE = 141  # stdout's reader went away: what a shell reports for a command SIGPIPE ended
TRACEBACK_ENV = "STAGE2_TRACEBACK"


def _direct_url() -> dict[str, Any]:
    """Where this stage2-data was installed from (its ``direct_url.json``; {} from an index)."""
    import json
    from importlib.metadata import distributions

    # every copy of the metadata on the path (a checkout's own stage2_data.egg-info may come first)
    for dist in distributions(name=DIST):
        text = dist.read_text("direct_url.json")
        try:
            info = json.loads(text) if text else None
        except ValueError:
            info = None
        if isinstance(info, dict):
            return info
    return {}


def _checkout() -> Path | None:
    """The folder of an editable install (a checkout), else None."""
    from urllib.parse import unquote, urlsplit

    info = _direct_url()
    url = str(info.get("url") or "")
    if url.startswith("file://") and (info.get("dir_info") or {}).get("editable"):
        return Path(unquote(urlsplit(url).path))
    return None


def extras() -> list[str]:
    """Every extra of stage2-data, in order: a checkout's pyproject.toml (an editable install's
    metadata is as old as its last `pip install`), else the installed metadata's ``Provides-Extra``."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, metadata

    checkout = _checkout()
    if checkout is not None:
        try:
            with open(checkout / "pyproject.toml", "rb") as f:
                return list(tomllib.load(f)["project"]["optional-dependencies"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        return list(metadata(DIST).get_all("Provides-Extra") or [])
    except PackageNotFoundError:
        return []


def install_line(extra: str = PLUGIN_EXTRA) -> str:
    """The pip command that adds ``extra`` to this installation: from the checkout it was installed
    from (``pip install -e '<folder>[extra]'``), the wheel or git URL it came from, else the name
    (a package index)."""
    checkout = _checkout()
    if checkout is not None:
        return f"pip install -e '{checkout}[{extra}]'"
    info = _direct_url()
    url = str(info.get("url") or "")
    if url:
        vcs = info.get("vcs_info") or {}
        ref = f"{vcs['vcs']}+{url}" if vcs.get("vcs") and not url.startswith(vcs["vcs"] + "+") else url
        return f"pip install '{DIST}[{extra}] @ {ref}'"
    return f"pip install '{DIST}[{extra}]'"


def missing_extra_text(
    name: str, extra: str = PLUGIN_EXTRA, *, who: str | None = None, subject: str = "this command"
) -> str:
    """What ``stage2 <name>`` (``who``: another command) says without its extra, on one line as
    every refusal is (``<who>: error: ... Fix: ...``): the command that installs it here (from the
    checkout or the wheel it was installed from: stage2-data is on no package index), and every
    extra."""
    every = ", ".join(extras()) or extra
    return (
        f"{who or f'stage2 {name}'}: error: {subject} needs the {extra!r} extra (Dagster), which is not "
        f"installed here. Fix: install it with {install_line(extra)} (every extra of {DIST}: {every})"
    )


def _missing_extra(name: str, err: ModuleNotFoundError) -> Callable[[Any], None]:
    """A stand-in for plugin command ``name`` whose module did not import: it takes any arguments
    and says what to install."""

    def run(args: argparse.Namespace) -> int:
        eprint(f"{missing_extra_text(name)} [{err}]")
        return EXIT_ERROR

    def register(sub: Any) -> None:
        p = sub.add_parser(
            name,
            help=f"(not installed: {install_line()})",
            epilog=missing_extra_text(name),
            add_help=False,
        )
        p.set_defaults(func=run, any_arguments=True)

    return register


def plugin_commands() -> list[Callable[[Any], None]]:
    """The ``register`` functions of the plugin commands, by name."""
    out = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            out.append(ep.load())
        except ModuleNotFoundError as err:
            out.append(_missing_extra(ep.name, err))
    return out


def make_parser() -> argparse.ArgumentParser:
    return _parser_and_commands()[0]


def _parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``stage2`` parser, and each command's own parser by name."""
    parser = _Parser(
        prog="stage2",
        description="Turn a pinned profile of a Hugging Face dataset into a verified, immutable Zarr v3 training store.",
        epilog="Example: after `make demo`, in the checkout:\n"
        "  stage2 build --profile .demo/demo/kit/profile.toml --data-root .demo/data --hub-folder .demo/demo/upstream",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in [*plugin_commands(), *(m.register for m in command_modules())]:
        register(sub)
    return parser, dict(sub.choices)


def _takes(command: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """The options and the positional arguments of ``command``, read from its usage line."""
    usage = command.format_usage().split(command.prog, 1)[-1]
    options = sorted(set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", usage)))
    required = re.sub(r"\[[^\[\]]*\]", " ", re.sub(r"\[[^\[\]]*\]", " ", usage))
    return options, [w for w in required.split() if re.fullmatch(r"[a-z][a-z0-9_]*", w)]


def _not_taken(args: Sequence[str], command: argparse.ArgumentParser) -> list[str]:
    """The options among ``args`` that ``command`` does not take (by their whole name: the parser
    takes no prefix of one)."""
    options, _ = _takes(command)
    names = [a.split("=", 1)[0] for a in args if re.match(r"--?[A-Za-z]", a)]
    return [n for n in names if n not in options]


def unrecognized_text(extra: Sequence[str], command: argparse.ArgumentParser) -> str:
    """What a command says of arguments it does not take: each of them, and the fix: the option
    meant when one is close (``--data-rot``: ``--data-root``), the positional argument meant when
    ``--NAME`` is one (``stage2 list --profile P``), else its ``--help``."""
    options, positionals = _takes(command)
    fixes: list[str] = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        if not name.startswith("-"):
            continue
        bare = name.lstrip("-").replace("-", "_")
        if bare in positionals:
            fixes.append(f"give {bare} without {name} ({command.prog} ... {bare.upper()} ...)")
        elif name == "--version":  # an option of `stage2` itself, not of its commands
            fixes.append("stage2 --version, before any command")
        elif len(whole := [o for o in options if o.startswith(name)]) == 1:  # a prefix of one option
            fixes.append(f"{whole[0]}, not {name}")
        elif close := difflib.get_close_matches(name, options, n=1, cutoff=0.75):
            fixes.append(f"{close[0]}, not {name}")
    fix = "; ".join(fixes) or f"`{command.prog} --help` lists what it takes"
    return f"unrecognized arguments: {' '.join(extra)}. Fix: {fix}"


#: what ``stage2 --version`` reports beside stage2-data: the packages a bug report needs (the ones
#: installed; the core install has no Dagster)
VERSION_OF = ("dagster", "zarr", "numpy", "huggingface_hub")


def version_text() -> str:
    """``stage2-data <version>``, then each installed package of :data:`VERSION_OF` with its
    version, and the Python that runs it."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    found = [f"{d} {v}" for d in VERSION_OF if (v := of(d)) is not None]
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{DIST} {of(DIST) or 'unknown'} ({', '.join([*found, f'Python {python}'])})"


class _Version(argparse.Action):
    """``--version``: :func:`version_text` on stdout, exit 0 (computed only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, help="print the versions of stage2-data and its parts, then exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        print(version_text())
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose "required" error also names the options given that it does not take
    (argparse reports a missing argument first: ``--data-rot X`` is then "--data-root is required"),
    and whose "invalid choice" of a command names the command meant (``stage2 bild``)."""

    given: Sequence[str] = ()  # the command's own arguments (set by :func:`main`)
    argv: Sequence[str] = ()  # the whole command line: `stage2 --json` with no command asks for JSON too

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # An option is taken by its whole name only: argparse's default takes a prefix of one, so
        # `build --store DIR` was `--store-url DIR` (the store written outside the data root: QA),
        # and a prefix taken today could stand for another option added later.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            unknown = _not_taken(self.given, self)
            if unknown:
                message = f"{message}; {unrecognized_text(unknown, self)}"
            elif self.prog == "stage2":
                message = (
                    f"{message}. Fix: `stage2 --help` lists them (`stage2 demo --out DIR` builds the demo)"
                )
            else:
                message = (
                    f"{message}. Fix: give it (`{self.prog} --help` says what it takes, with an example)"
                )
        elif both := re.match(r"argument (\S+): not allowed with argument (\S+)$", message):
            message = f"{message}. Fix: give {both[2]} or {both[1]}, not both (`{self.prog} --help` says what each does)"
        elif (
            typo := re.match(r"argument COMMAND: invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        ) and (close := difflib.get_close_matches(typo[1], re.findall(r"'([^']+)'", typo[2]), n=1)):
            message = f"{message}. Fix: stage2 {close[0]}, not {typo[1]}"
        if "--json" in self.argv:  # one JSON object on stdout too, as for any other error
            said, _, fix = message.partition(". Fix: ")
            command = self.prog.removeprefix("stage2").strip() or "stage2"
            with contextlib.suppress(OSError, ValueError):
                common.print_json(
                    {
                        "ok": False,
                        "command": command,
                        "error": "UsageError",
                        "message": said,
                        "fix": fix or f"`{self.prog} --help` lists what it takes",
                        "problems": [message],
                    }
                )
        super().error(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser_and_commands()
    _Parser.given = argv[1:]  # the command's own arguments
    _Parser.argv = argv
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "any_arguments", False):
        command = commands.get(args.command, parser)
        command.error(unrecognized_text(extra, command))
    if (empty := _empty_argument(argv[1:])) is not None:
        return _run_command(_refuse_empty(empty), args)
    resolve_profile(args, commands.get(args.command, parser))
    func: Callable[[argparse.Namespace], int] = args.func
    return _run_command(func, args)


def _empty_argument(given: Sequence[str]) -> str | None:
    """The name of an argument given as an empty string (``--data-root ""``, ``--data-root=``, an
    empty positional), else None: an unset shell variable, taken as the working folder it would
    otherwise build into or read."""
    for i, a in enumerate(given):
        if a == "":
            return given[i - 1] if i and given[i - 1].startswith("--") else "an argument"
        if a.startswith("--") and a.endswith("=") and len(a) > 3:
            return a[:-1]
    return None


def _refuse_empty(name: str) -> Callable[[argparse.Namespace], int]:
    option = name.startswith("--")

    def refuse(args: argparse.Namespace) -> int:
        raise SettingError(
            f'{name} is empty ("": an unset shell variable?).'
            if option
            else 'an argument is empty ("": an unset shell variable?); as a path it would be the working folder.',
            fix=f"give {name} a value, or leave the option out"
            if option
            else "give it a value (`.` for the working folder)",
        )

    return refuse


def stdout_reader_gone() -> bool:
    """True when standard output is a pipe whose reader went away (``stage2 list | head``): its
    flush fails with a broken pipe, or, with nothing left to flush, polling the pipe reports an
    error (Linux and macOS report one for a pipe without a reader). False when there is no standard
    output at all (started with it closed: the output has nowhere to go, as ``print`` then does)."""
    stream = sys.stdout
    if stream is None:
        return False
    try:
        stream.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _end_on_closed_stdout() -> int:
    """The exit of a command whose output's reader went away: standard output pointed at the null
    device (the interpreter's last flush then has nowhere to fail), no message, ``EXIT_PIPE``."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_PIPE


def _json_error(args: argparse.Namespace, err: BaseException, **said: str) -> None:
    """With ``--json``, a command that printed no JSON object before failing prints one now
    (:func:`~.commands.common.error_document`: ``ok`` false, the error and its fix); a command that
    printed its own (``build``'s summary, ``validate``'s report) is left as it is."""
    if getattr(args, "json", False) and common.json_printed == 0:
        with contextlib.suppress(OSError, ValueError):  # no standard output to print on: stderr said it
            common.print_json(common.error_document(args.command, err, **said))


def _run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``func(args)``, every expected failure as one line and an exit code (and, with ``--json``,
    as one JSON object on stdout: :func:`_json_error`)."""
    common.json_printed = 0
    try:
        return func(args)
    except Stage2Error as err:
        eprint(f"stage2 {args.command}: error: {err}")
        _json_error(args, err)
        return EXIT_ERROR
    except KeyboardInterrupt as err:
        eprint("interrupted")
        _json_error(args, err, message="interrupted", fix="")
        return 130
    except OSError as err:  # an environment fault no guard named: named here
        if isinstance(err, BrokenPipeError) and stdout_reader_gone():
            return _end_on_closed_stdout()
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()  # then the line and the exit code, as without it
        named = fs_error(err, "")
        eprint(f"stage2 {args.command}: error: {named}")  # the line names the command
        _json_error(args, named)
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001 - the last guard: one line, never a traceback
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()  # then the line and the exit code, as without it
        what = " ".join(f"{type(err).__name__}: {err}".split())[:500]
        fix = f"re-run with {TRACEBACK_ENV}=1 to see the traceback, and report it"
        eprint(f"stage2 {args.command}: internal error: {what}. This is a bug. Fix: {fix}")
        _json_error(args, err, message=f"internal error: {what}. This is a bug.", fix=fix)
        return EXIT_BUG


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``stage2`` executable: :func:`main`, whose code is the process's exit status (a normal
    interpreter exit)."""
    # No stage2 command does linear algebra, and OpenBLAS starts a thread per core at numpy's import
    # that spins for a while, taking CPU from the work in every process (the build, its beside
    # process, its workers, which inherit this); a user's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        code: Any = main(argv)
        if sys.stdout is not None:  # None: started with standard output closed
            sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (while it imports): no traceback
        eprint("stage2: interrupted")
        code = 130
    except SystemExit as exiting:  # argparse's --help and usage errors
        code = exiting.code
        if stdout_reader_gone():
            pipe = _end_on_closed_stdout()
            code = pipe if code in (0, None) else code
    except BrokenPipeError:  # the output's reader went away while --help or a command printed
        code = _end_on_closed_stdout()
    sys.exit(code)


if __name__ == "__main__":
    run()
