"""Where the Definitions get their profile, data root and hub from (the CLI passes them; the UI and
the daemon read the environment), and where every other path comes from.

Nothing here is derived from this file's location, so an installed wheel behaves as a checkout:
relative defaults are relative to the current working directory (for `dagster dev -w
workspace.yaml`, the workspace's folder), and every one of them can be set explicitly.

| variable | what | default |
|---|---|---|
| ``STAGE2_DEMO_ROOT`` | the demo's folder (`make demo`, `make ui`) | ``./.demo`` |
| ``STAGE2_PROFILE`` | the profile the definitions load (`make ui`: the demo unless set) | the demo's if generated, else ``./manifests/stage2_core_v1.toml`` |
| ``STAGE2_DATA_ROOT`` | the data root | ``<demo root>/data`` |
| ``STAGE2_K8S_EXECUTOR_CONFIG`` | the ``k8s_job_executor`` config | ``deploy/k8s/executor.yaml`` as installed (``stage2_deploy``) |
| ``STAGE2_WORKSPACE`` | the workspace file ``make ui`` serves | the module ``stage2_pipelines.definitions`` |
| ``DAGSTER_HOME`` | the instance of ``make ui`` | ``./.dagster_home`` |
| ``STAGE2_STREAM_RUN_MB`` | the archive MB a streamed run carries at least (a build's and a rebuild's) | ``stages.STREAM_RUN_BYTES`` |

(and the hub, token, store, alert and executor settings of :meth:`BuildConfig.from_env`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import stage2_deploy
from stage2_data.errors import SettingError, env_number
from stage2_data.fsutil import not_a_folder_on
from stage2_data.publish.atomic import current_umask
from stage2_data.stages import STREAM_RUN_BYTES

DEFAULT_PROFILE = Path("manifests") / "stage2_core_v1.toml"  # the real profile, in a checkout


#: how a step's failure that no guard named begins (runs.py); the build then exits 3, as any
#: command's bug does
INTERNAL_ERROR = "internal error: "

# What SQLite says (through SQLAlchemy or sqlite3) when the disk holding a Dagster instance's
# database cannot take a write: the instance's own files, not the data's (the build's summary and a
# step's failure name it as a full disk, not as a bug)
INSTANCE_DISK_FULL = ("database or disk is full", "disk I/O error")


def _path(env: str, default: Path | str) -> Path:
    """``$env`` if set, else ``default``; relative paths are relative to the working directory."""
    return Path(os.environ.get(env) or default).expanduser().absolute()


def demo_root() -> Path:
    return _path("STAGE2_DEMO_ROOT", ".demo")


def default_profile() -> Path:
    """The demo's profile when the demo was generated, else the real profile (in a checkout)."""
    demo_profile = demo_root() / "demo" / "kit" / "profile.toml"
    return demo_profile if demo_profile.is_file() else DEFAULT_PROFILE.absolute()


def k8s_executor_config_path() -> Path:
    """``STAGE2_K8S_EXECUTOR_CONFIG``, else the ``deploy/k8s/executor.yaml`` shipped in the package."""
    env = os.environ.get("STAGE2_K8S_EXECUTOR_CONFIG")
    return Path(env) if env else stage2_deploy.path("k8s/executor.yaml")


def stream_run_bytes() -> int:
    """The archive bytes a streamed run carries at least: ``STAGE2_STREAM_RUN_MB`` (MB), else
    ``stages.STREAM_RUN_BYTES``."""
    return int(env_number("STAGE2_STREAM_RUN_MB", STREAM_RUN_BYTES / 1e6) * 1e6)


# The extra of stage2-data each executor needs beyond the pipeline extra, and the modules it brings.
EXECUTOR_EXTRAS = {"dask": ("dask", ("dagster_dask", "distributed")), "k8s": ("k8s", ("dagster_k8s",))}


def require_executor(executor: str) -> None:
    """Refuse ``executor`` when the extra it needs is not installed: a named error with the command
    that installs it here, before any work (`stage2 build --executor dask`) or when the definitions
    load (``STAGE2_EXECUTOR``), rather than an import error from inside Dagster."""
    if executor not in EXECUTOR_EXTRAS:
        return
    extra, modules = EXECUTOR_EXTRAS[executor]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        from stage2_data.cli import install_line

        raise SettingError(
            f"the {executor} executor needs the {extra!r} extra ({', '.join(missing)} not installed here).",
            fix=f"install it with: {install_line(extra)}; or choose another executor (in_process, multiprocess)",
        )


def check_dask_address(address: str, *, option: str = "--dask-address", timeout: float = 5.0) -> None:
    """Refuse a Dask scheduler address that does not parse, or where no scheduler accepts a
    connection, before any run starts (else each run's first step fails inside Dagster's executor
    as an error of its own, and a build whose stages are up to date passes with it unchecked).
    Needs the dask extra (:func:`require_executor` first)."""
    import socket

    from distributed.comm import parse_address, parse_host_port

    fix = (
        "pass the scheduler's address as tcp://HOST:PORT (a scheduler listens on 8786 unless told "
        f"otherwise; `dask scheduler` prints its address), or leave out {option} for a local cluster"
    )
    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except (ValueError, TypeError) as e:
        raise SettingError(f"{option} {address!r} is not a scheduler address ({e}).", fix=fix) from None
    if scheme not in ("tcp", "tls"):
        raise SettingError(
            f"{option} {address!r}: a build reaches its scheduler over tcp or tls, not {scheme}.", fix=fix
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise SettingError(
            f"{option} {address}: no scheduler answers at {host}:{port} ({e.strerror or e}).",
            fix="start the scheduler there (`dask scheduler`) or correct the host and port; or leave out "
            f"{option} for a local cluster",
        ) from None


def check_settings() -> None:
    """Refuse, before any work, the environment's settings that are read late:
    ``STAGE2_KEEP_STORES`` (the store stage applies it after publishing) and
    ``STAGE2_STREAM_RUN_MB`` (read when a build or a rebuild requests its streamed runs) and
    ``STAGE2_STORE_URL`` (opened by the store stage, after every download), and
    ``STAGE2_EXECUTOR``'s name. `stage2 build` checks
    them at its start, and the code location when its definitions load, so a daemon started with a
    bad value fails to load its code location with the named error, at once, instead of failing a
    rebuild's sensor tick or store step days later."""
    from stage2_data.errors import StoreError
    from stage2_data.storage import check_stores_url
    from stage2_data.store.retention import default_keep

    default_keep()
    stream_run_bytes()
    check_dagster_home()
    # the executor of runs the UI and the daemon launch: a name no executor has is refused here
    # too (a build's own runs take --executor; the rest of env_executor's checks need its extras)
    if executor := os.environ.get("STAGE2_EXECUTOR", "").strip():
        _check_executor_name(executor)
    if url := os.environ.get("STAGE2_STORE_URL"):
        try:
            check_stores_url(url)
        except StoreError as e:
            raise SettingError(f"STAGE2_STORE_URL={url!r}: {e.message}", fix=e.fix) from None


_FLAG_TRUE = ("1", "true", "yes", "on")
_FLAG_FALSE = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """The yes or no the environment variable ``name`` holds: ``1``/``true``/``yes``/``on`` or
    ``0``/``false``/``no``/``off`` (any case), unset or empty for no. Anything else is refused rather
    than read as yes (``false`` used to turn the setting on)."""
    raw = os.environ.get(name, "")
    if raw.strip().lower() in _FLAG_TRUE:
        return True
    if raw.strip().lower() in _FLAG_FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a yes or no.", fix=f"set {name}=1 (yes), or unset it (no)")


STORE_OPTIONS_EXAMPLE = """STAGE2_STORE_OPTIONS='{"endpoint_url": "http://127.0.0.1:9000"}'"""


def env_store_options() -> dict[str, Any]:
    """The fsspec storage options of ``STAGE2_STORE_OPTIONS``: a JSON object (``{}`` when unset or
    empty). Anything else is refused naming the variable but not its value, which may hold
    credentials (as ``ui_command`` never prints it)."""
    raw = os.environ.get("STAGE2_STORE_OPTIONS", "").strip()
    if not raw:
        return {}
    fix = f"set it to a JSON object of fsspec storage options, e.g. {STORE_OPTIONS_EXAMPLE}, or unset it"
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:  # said: where the text stops parsing, not the text
        raise SettingError(
            f"STAGE2_STORE_OPTIONS is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}; "
            "the value is not shown: it may hold credentials).",
            fix=fix,
        ) from None
    if not isinstance(options, dict):
        raise SettingError(
            f"STAGE2_STORE_OPTIONS holds a JSON {_json_kind(options)}, not an object of storage options.",
            fix=fix,
        )
    return options


def _json_kind(value: object) -> str:
    """What JSON calls the type of the parsed ``value``."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


#: every value ``STAGE2_EXECUTOR`` takes (``executors.EXECUTORS``)
EXECUTOR_NAMES = ("in_process", "multiprocess", *EXECUTOR_EXTRAS)


def _check_executor_name(executor: str) -> None:
    """Refuse a ``STAGE2_EXECUTOR`` that names no executor."""
    if executor not in EXECUTOR_NAMES:
        raise SettingError(
            f"STAGE2_EXECUTOR={executor!r} is not an executor ({', '.join(EXECUTOR_NAMES)}).",
            fix="set it to one of them, or unset it for in_process (`stage2 build` takes --executor)",
        )


def env_executor() -> tuple[str, str | None]:
    """``STAGE2_EXECUTOR`` (default ``in_process``) and ``STAGE2_DASK_ADDRESS``, refused unless the
    code location can build that executor: a known name, a scheduler address for ``dask``, its extra
    installed (:func:`require_executor`), and for ``k8s`` its config file
    (``STAGE2_K8S_EXECUTOR_CONFIG``) present. Otherwise the Definitions would fail to build with an
    error that names no variable."""
    executor = os.environ.get("STAGE2_EXECUTOR", "").strip() or "in_process"
    dask_address = os.environ.get("STAGE2_DASK_ADDRESS", "").strip() or None
    _check_executor_name(executor)
    if executor == "dask" and not dask_address:
        raise SettingError(
            "STAGE2_EXECUTOR=dask needs STAGE2_DASK_ADDRESS (the scheduler the steps run on).",
            fix="set STAGE2_DASK_ADDRESS=tcp://<scheduler host>:8786, or choose another executor "
            "(in_process, multiprocess)",
        )
    require_executor(executor)
    if executor == "k8s" and not (path := k8s_executor_config_path()).is_file():
        what = "is not a file" if path.exists() else "does not exist"
        given = os.environ.get("STAGE2_K8S_EXECUTOR_CONFIG")
        raise SettingError(
            f"STAGE2_EXECUTOR=k8s: its executor config {path} {what}"
            + (f" (STAGE2_K8S_EXECUTOR_CONFIG={given!r})." if given else " (the one installed with stage2)."),
            fix="set STAGE2_K8S_EXECUTOR_CONFIG to a k8s_job_executor config file (as deploy/k8s/executor.yaml)"
            + (", or unset it for the one installed" if given else ", or reinstall stage2-data"),
        )
    return executor, dask_address


def dagster_home() -> Path:
    """``DAGSTER_HOME`` for ``make ui`` (``stage2 build`` defaults to ``<data root>/.dagster``)."""
    return _path("DAGSTER_HOME", ".dagster_home")


#: what unsetting DAGSTER_HOME gives, where the data root is not known (``check_settings``)
_UNSET_HOME = "`stage2 build` then uses <data root>/.dagster, `make ui` ./.dagster_home"


def check_dagster_home(data_root: Path | None = None) -> None:
    """Refuse a ``DAGSTER_HOME`` that cannot be the Dagster instance's folder: it names a file (or a
    device, a pipe, a socket, a broken link), or a path through one. A ``SettingError`` saying so,
    whose fix changes the setting, never the file (a user's, which nothing here moves or deletes):
    set it to a folder, or unset it (the build then uses ``<data_root>/.dagster``). Unset, empty,
    a folder, or a path still to be made under a folder: nothing to say."""
    raw = os.environ.get("DAGSTER_HOME")
    if not raw:
        return
    home = Path(raw).expanduser().absolute()
    unset = f"the build then uses {Path(data_root) / '.dagster'}" if data_root is not None else _UNSET_HOME
    fix = f"set DAGSTER_HOME to a folder (or unset it: {unset})"
    # a path still to be made under folders is made by the build; an unreadable one is named by
    # the instance's own set-up
    found = not_a_folder_on(home)
    if found is None:
        return
    part, kind = found
    what = "names" if part == home else f"goes through {part},"
    raise SettingError(
        f"DAGSTER_HOME={raw!r} {what} {kind}, not a folder: the Dagster instance a build records "
        f"its runs into is a folder (what stands there is left as it is).",
        fix=fix,
    )


# The first line of every dagster.yaml stage2 writes: a file starting with it is stage2's, rewritten
# whenever it differs from what this version writes for its folder; any other is the user's, kept.
INSTANCE_YAML_MARK = "# Written by stage2 for a local instance."
INSTANCE_YAML_HEAD = f"""\
{INSTANCE_YAML_MARK} Rewritten by `stage2 build` when the instance's folder
# moved (a copied or moved data root records into its own instance) or this version of stage2
# writes it otherwise; delete this first line to keep your own edits. Launched runs start at once
# (no queue waiting for a daemon). One consolidated SQLite event log (WAL) instead of one database
# per run. Step logs go to files (the UI shows them). Each is Dagster's own documented class.
"""


def own_instance(home: Path | str, data_root: Path | str) -> bool:
    """Whether ``home`` is ``data_root``'s own instance (``<data root>/.dagster``, what a build uses
    when DAGSTER_HOME is unset): the runs of another data root in it were copied or moved with the
    data root (their tag names the folder it was built in), not a shared instance."""
    return Path(home).resolve() == (Path(data_root) / ".dagster").resolve()


def shared_instance_note(home: Path | str, data_root: Path | str, others: list[str]) -> str:
    """What a build of ``data_root`` and the UI over it say when the instance at ``home`` also
    records the runs of the data roots ``others``: Dagster keeps one state per asset in an instance,
    so its UI shows each asset, its checks and its stale marks as whichever data root materialized
    it last; the fix gives each data root an instance of its own."""
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    own = Path(data_root) / ".dagster"
    return (
        f"the Dagster instance {home} also records the runs of {len(others)} other data "
        f"root{'s' if len(others) > 1 else ''} ({shown}): its UI shows each asset, its checks and stale "
        "marks as whichever data root materialized it last (the store path in its metadata says "
        f"which). Fix: one instance per data root: DAGSTER_HOME={shlex.quote(str(own))} for this "
        "data root's builds and its UI (what `stage2 build` uses when DAGSTER_HOME is unset)"
    )


def instance_config(home: Path) -> dict[str, Any]:
    """The configuration of a local instance at ``home`` (its ``dagster.yaml``, as data)."""
    return {
        "telemetry": {"enabled": False},
        # no first-visit "Join the Dagster community" dialog over the UI (the webserver shows it
        # while nux is enabled and no one has dismissed it on this machine)
        "nux": {"enabled": False},
        # runs start as soon as they are launched (`stage2 build`, the UI), without waiting in a queue
        # for a daemon; a daemon still runs schedules and sensors
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "DefaultRunCoordinator"},
        # Dagster's consolidated event log: one database for every run's events, where `storage:
        # sqlite:` creates, migrates and opens a database per run (docs/architecture.md, "Instance")
        "event_log_storage": {
            "module": "dagster.core.storage.event_log",
            "class": "ConsolidatedSqliteEventLogStorage",
            "config": {"base_dir": str(home / "history")},
        },
        "compute_logs": {
            "module": "dagster.core.storage.local_compute_log_manager",
            "class": "LocalComputeLogManager",
            "config": {"base_dir": str(home / "storage")},
        },
    }


def instance_yaml(home: Path) -> str:
    """The text of ``dagster.yaml`` for a local instance at ``home``: the configuration written by a
    YAML serializer (any path, whatever its characters, is one quoted scalar)."""
    import yaml  # PyYAML (a Dagster dependency): imported when an instance is written

    return INSTANCE_YAML_HEAD + yaml.safe_dump(instance_config(home), sort_keys=False, allow_unicode=True)


def write_instance_yaml(home: Path) -> None:
    """``home/dagster.yaml`` for a local instance: written when missing, and rewritten (atomically)
    when it is stage2's (its first line is :data:`INSTANCE_YAML_MARK`) but differs from
    :func:`instance_yaml`: the instance's folder was copied or moved, so its storage paths name
    another folder's. A ``dagster.yaml`` of the user's own is kept as it is."""
    home = Path(home).absolute()
    cfg = home / "dagster.yaml"
    want = instance_yaml(home)
    try:
        have: str | None = cfg.read_text(encoding="utf-8")
    except FileNotFoundError:
        have = None
    if have == want or (have is not None and not have.startswith(INSTANCE_YAML_MARK)):
        return
    home.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".dagster.yaml.", suffix=".tmp", dir=home)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(want)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, cfg)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class BuildConfig:
    profile_path: str
    data_root: str
    endpoint: str = "https://huggingface.co"
    kit_root: str | None = None
    hub_folder: str | None = None  # serve this folder on loopback for each run instead of `endpoint`
    token_env_var: str = "HF_TOKEN"
    reverify: bool = False
    webhook_url: str | None = None  # alerts are POSTed here when set
    store_url: str | None = (
        None  # fsspec URL of the stores root (s3://bucket/prefix); default <data_root>/stores
    )
    store_options: dict[str, Any] | None = None  # fsspec storage options for store_url
    # where the steps run (stage2_pipelines/executors.py): in_process | multiprocess | dask | k8s
    executor: str = "in_process"
    dask_address: str | None = None  # dask scheduler (tcp://host:8786); None: a LocalCluster per build

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def to_env(self) -> dict[str, str]:
        """The environment for which :meth:`from_env` gives this config: a build's code server
        loads the definitions from it, as the UI and the daemon load theirs."""
        return {
            "STAGE2_PROFILE": str(Path(self.profile_path).absolute()),
            "STAGE2_DATA_ROOT": str(Path(self.data_root).absolute()),
            "STAGE2_HUB_ENDPOINT": self.endpoint,
            "STAGE2_KIT_ROOT": self.kit_root or "",
            "STAGE2_HUB_FOLDER": self.hub_folder or "",
            "STAGE2_TOKEN_ENV": self.token_env_var,
            "STAGE2_REVERIFY": "1" if self.reverify else "",
            "STAGE2_ALERT_WEBHOOK": self.webhook_url or "",
            "STAGE2_STORE_URL": self.store_url or "",
            "STAGE2_STORE_OPTIONS": json.dumps(self.store_options or {}),
            "STAGE2_EXECUTOR": self.executor,
            "STAGE2_DASK_ADDRESS": self.dask_address or "",
        }

    @classmethod
    def from_env(cls) -> BuildConfig:
        """The config the environment's ``STAGE2_*`` settings give; a value that does not parse
        raises :class:`SettingError` naming the variable and the fix (the code location then fails
        to load with that one line, and `make ui` says it before anything starts)."""
        from stage2_data.acquire import resolve_endpoint  # $HF_ENDPOINT, read now (not at import)

        executor, dask_address = env_executor()
        return cls(
            profile_path=str(_path("STAGE2_PROFILE", default_profile())),
            data_root=str(_path("STAGE2_DATA_ROOT", demo_root() / "data")),
            endpoint=os.environ.get("STAGE2_HUB_ENDPOINT") or resolve_endpoint(),
            kit_root=os.environ.get("STAGE2_KIT_ROOT") or None,
            hub_folder=os.environ.get("STAGE2_HUB_FOLDER") or None,
            token_env_var=os.environ.get("STAGE2_TOKEN_ENV", "HF_TOKEN"),
            reverify=env_flag("STAGE2_REVERIFY"),
            webhook_url=os.environ.get("STAGE2_ALERT_WEBHOOK") or None,
            store_url=os.environ.get("STAGE2_STORE_URL") or None,
            store_options=env_store_options(),
            executor=executor,
            dask_address=dask_address,
        )


def demo_settings() -> dict[str, str]:
    """What `make ui` serves when no ``STAGE2_PROFILE`` is set: the demo of ``STAGE2_DEMO_ROOT``,
    as `make demo` builds it (its profile, its data root, its hub folder served on loopback)."""
    demo = demo_root()
    return {
        "STAGE2_PROFILE": str(demo / "demo" / "kit" / "profile.toml"),
        "STAGE2_DATA_ROOT": os.environ.get("STAGE2_DATA_ROOT") or str(demo / "data"),
        "STAGE2_HUB_FOLDER": os.environ.get("STAGE2_HUB_FOLDER") or str(demo / "demo" / "upstream"),
    }


# Settings of a build the UI command does not repeat: --reverify is for that build alone, alerts
# are the UI's own setting, and storage options may hold credentials (said, not printed).
_UI_UNSAID = {"STAGE2_REVERIFY", "STAGE2_ALERT_WEBHOOK", "STAGE2_STORE_OPTIONS"}
_UI_DEFAULTS = {"STAGE2_TOKEN_ENV": "HF_TOKEN", "STAGE2_EXECUTOR": "in_process"}


def build_command(config: BuildConfig, home: Path) -> str:
    """The `stage2 build` that builds with ``config``'s settings (the UI's: ``BuildConfig.from_env``)
    into the instance at ``home`` (``DAGSTER_HOME``, so its runs show in this UI), quoted for the
    shell: the profile and data root, and each other setting the build takes as an option when it
    is not the default (kit root, hub folder or endpoint, token variable, executor, store URL).
    Storage options are not printed (credentials): the caller says so."""
    from stage2_data.acquire import DEFAULT_ENDPOINT

    words = ["stage2", "build", config.profile_path, "--data-root", config.data_root]
    if config.kit_root:
        words += ["--kit-root", config.kit_root]
    if config.hub_folder:  # served on loopback by the runs, instead of the endpoint
        words += ["--hub-folder", config.hub_folder]
    elif config.endpoint != DEFAULT_ENDPOINT:
        words += ["--endpoint", config.endpoint]
    if config.token_env_var != "HF_TOKEN":
        words += ["--token-env", config.token_env_var]
    if config.executor in ("multiprocess", "dask"):  # (k8s is the UI's and the daemon's only)
        words += ["--executor", config.executor]
        if config.dask_address:
            words += ["--dask-address", config.dask_address]
    if config.store_url:
        words += ["--store-url", config.store_url]
    return f"DAGSTER_HOME={shlex.quote(str(home))} " + " ".join(shlex.quote(w) for w in words)


def ui_command(config: BuildConfig, home: Path, cwd: Path | None = None) -> str:
    """The shell command that serves the web UI over a build's instance (``home``) with the build's
    own settings, so that the UI's code location is the one its runs ran (Re-execute runs them
    again as they ran): `make ui` in a checkout (``cwd`` holds the Makefile and workspace.yaml),
    else this interpreter's ``-m stage2_pipelines.ui``; prefixed with the build's settings unless
    they are the demo's that `make ui` serves by default."""
    from stage2_data.acquire import DEFAULT_ENDPOINT  # loaded already by the build that asks

    cwd = Path.cwd() if cwd is None else cwd
    env = {k: v for k, v in config.to_env().items() if v and k not in _UI_UNSAID and _UI_DEFAULTS.get(k) != v}
    if config.hub_folder or env.get("STAGE2_HUB_ENDPOINT") == DEFAULT_ENDPOINT:
        # a hub folder is served on loopback by the runs; the default hub needs no setting
        env.pop("STAGE2_HUB_ENDPOINT", None)
    if env == demo_settings():  # the demo `make ui` serves, of the folder it was built in: said
        # when it is not `.demo` where the command runs (STAGE2_DEMO_ROOT moved it)
        moved = demo_root() != (cwd / ".demo").absolute()
        said = {"STAGE2_DEMO_ROOT": str(demo_root())} if moved else {}
        said["DAGSTER_HOME"] = str(home)
    else:
        said = {**env, "DAGSTER_HOME": str(home)}
    checkout = (cwd / "Makefile").is_file() and (cwd / "workspace.yaml").is_file()
    run = "make ui" if checkout else f"{shlex.quote(sys.executable)} -m stage2_pipelines.ui"
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in said.items()) + f" {run}"
    if config.store_options:  # a shell comment: the line still runs as pasted
        line += "  # with STAGE2_STORE_OPTIONS set as for the build"
    return line
