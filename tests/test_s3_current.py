"""The ``CURRENT`` object and moving a store aside on object storage, against a real S3 API (moto's
server on 127.0.0.1, through s3fs, as tests/test_store_backends.py runs it).

* A ``CURRENT`` that names no complete store (a typo, ``../x``, ``/etc``, empty) is no publication:
  ``stage2 gc`` removes nothing, as locally with a dangling ``current`` link, and every command
  that reads the published store names the object and what it holds, with a fix that works.
* ``stage2 validate .../current`` checks the store ``CURRENT`` names, as every reader reads it.
* A store that fails the publication gate is moved aside (copied to ``<profile>/.quarantine/``,
  then withdrawn), never deleted; ``stage2 gc URL --quarantine`` lists and removes it.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_store import INPUTS, PROFILE, make_upstream

from stage2_data.cli import main
from stage2_data.errors import StoreNotFoundError
from stage2_data.storage import CURRENT_OBJECT, QUARANTINE_DIR, StoreLocation
from stage2_data.store import MANIFEST_NAME, VinOfflineWriter

pytest.importorskip("moto.server", reason="moto[server] is a dev dependency (pyproject)")
pytest.importorskip("s3fs", reason="s3fs is a dev dependency (pyproject)")
from test_store_backends import s3_endpoint  # noqa: E402,F401 - the S3 server on loopback, one per session

STORES = ("v2-aaaa000000000001", "v2-bbbb000000000002")


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small store on local disk, uploaded under each test's own names."""
    root = tmp_path_factory.mktemp("built")
    up = make_upstream(root / "up", range(1, 6))
    VinOfflineWriter(root / "store", profile=PROFILE, inputs=INPUTS, rows_per_shard=4).write(
        up.samples, up.pairs
    )
    return root / "store"


@pytest.fixture
def profile_root(
    s3_endpoint: str,  # noqa: F811 - the fixture imported above
    local_store: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[StoreLocation, dict[str, Any], list[str]]:
    """``s3://<new bucket>/stores/p`` holding two complete stores; the options and the matching
    ``--storage-option`` arguments (credentials in the environment, as a user keeps them)."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    opts = {"client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    root = StoreLocation.parse(f"s3://{bucket}/stores/p", opts)
    src = StoreLocation.parse(local_store)
    for name in STORES:
        dst = root.child(name)
        rels = src.tree_files(local_store)
        for rel in [r for r in rels if r != MANIFEST_NAME] + [MANIFEST_NAME]:  # the manifest last
            dst.put_file(local_store / rel, dst.root / rel)
    root.invalidate()
    return root, opts, [f"--storage-option=client_kwargs={json.dumps(opts['client_kwargs'])}"]


def _stores_left(root: StoreLocation) -> list[str]:
    root.invalidate()
    return [n for n in STORES if root.is_file(root.root / n / MANIFEST_NAME)]


BAD_CURRENT = ["v2-typo", "../v2-aaaa000000000001", "/etc", "", "v2-aaaa000000000001/shards", ".quarantine"]


@pytest.mark.parametrize(
    "named", BAD_CURRENT, ids=["typo", "dotdot", "absolute", "empty", "nested", "hidden"]
)
@pytest.mark.parametrize("keep", ["0", "1"])
def test_gc_removes_nothing_when_current_names_no_store(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
    named: str,
    keep: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, opt_args = profile_root
    root.write_bytes(root.root / CURRENT_OBJECT, (named + "\n").encode())
    assert main(["gc", root.url, "--keep", keep, *opt_args]) == 0
    out = capsys.readouterr().out
    assert "no store is published (no current): nothing removed" in out, out
    assert main(["gc", root.url, "--keep", keep, "--json", *opt_args]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["roots"]
    assert {e["name"]: e["action"] for e in rep["stores"]} == dict.fromkeys(STORES, "kept"), rep
    assert _stores_left(root) == list(STORES)
    assert root.current() is None  # not a publication
    # a CURRENT naming a complete store is one: the other store goes with --keep 0
    root.write_bytes(root.root / CURRENT_OBJECT, f"{STORES[1]}\n".encode())
    assert root.current() is not None and root.current().url == f"{root.url}/{STORES[1]}"  # type: ignore[union-attr]
    assert main(["gc", root.url, "--keep", "0", *opt_args]) == 0
    assert _stores_left(root) == [STORES[1]]


def test_gc_json_gives_the_current_store_the_created_at_of_its_manifest(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
    local_store: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`stage2 gc URL --dry-run --json` reports the current store's `created_at` from its manifest,
    as it does the previous store's (both uploaded from one store: one manifest)."""
    root, _, opt_args = profile_root
    created = json.loads((local_store / MANIFEST_NAME).read_text())["created_at"]
    assert created
    root.publish_current(STORES[1])
    assert main(["gc", root.url, "--dry-run", "--json", *opt_args]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["roots"]
    got = {e["name"]: (e["reason"], e["created_at"]) for e in rep["stores"]}
    assert got[STORES[1]] == ("current", created), rep
    assert got[STORES[0]][1] == created, rep


@pytest.mark.parametrize(
    "named", ["v2-typo", "/etc", "", "../x"], ids=["typo", "absolute", "empty", "dotdot"]
)
@pytest.mark.parametrize("command", ["validate", "summary"])
@pytest.mark.parametrize("via", ["current", "profile"])
def test_readers_name_a_current_object_that_names_no_store(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
    named: str,
    command: str,
    via: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, opt_args = profile_root
    root.write_bytes(root.root / CURRENT_OBJECT, (named + "\n").encode())
    target = f"{root.url}/current" if via == "current" else root.url
    assert main([command, target, "--json", *opt_args]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "StoreNotFoundError", doc
    said = (
        f"the {CURRENT_OBJECT} object at {root.url}/{CURRENT_OBJECT} names {named!r}, which is not a store ("
    )
    assert doc["message"].startswith(said), doc["message"]
    assert "s3:///" not in doc["message"] and "nothing is there" not in doc["message"]
    # the fix reads a complete store of that folder when pasted (credentials stay in the environment)
    pasted = doc["fix"].split(f"stage2 {command} ", 1)[1].split(" (", 1)[0]
    assert main([command, *shlex.split(pasted)]) == 0, pasted
    assert f"{root.url}/{STORES[0]}" in capsys.readouterr().out


@pytest.mark.parametrize("named", ["v2-typo", ""], ids=["typo", "empty"])
def test_the_training_api_names_a_current_object_that_names_no_store(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]], named: str
) -> None:
    """``VinOfflineDataset`` (and so preview, export-rrd and the loader, which open through the
    same reader) says what the ``CURRENT`` object holds, not "nothing is there"."""
    from stage2_data.errors import StoreNotFoundError
    from stage2_data.store import VinOfflineDataset

    root, opts, _ = profile_root
    root.write_bytes(root.root / CURRENT_OBJECT, (named + "\n").encode())
    root.invalidate()
    for target in (f"{root.url}/current", root.url):
        with pytest.raises(StoreNotFoundError) as ei:
            VinOfflineDataset(target, storage_options=opts)
        msg = str(ei.value)
        assert f"the {CURRENT_OBJECT} object at {root.url}/{CURRENT_OBJECT} names {named!r}" in msg, msg
        assert "nothing is there" not in msg, msg


def test_the_build_s_published_store_names_a_current_object_that_names_no_store(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]], tmp_path: Path
) -> None:
    """``current_store`` (the store check of `stage2 verify` and the UI) says the same, with the
    build that publishes again (on the same --store-url) as the fix."""
    from stage2_data.steps.store import current_store

    root, opts, _ = profile_root
    root.write_bytes(root.root / CURRENT_OBJECT, b"/etc\n")
    profile = SimpleNamespace(name="p", profile_path=tmp_path / "p.toml")
    store_url = root.url.rsplit("/", 1)[0]
    with pytest.raises(StoreNotFoundError) as e:
        current_store(profile, tmp_path, store_url=store_url, storage_options=opts)  # type: ignore[arg-type]
    assert e.value.message.startswith(
        f"the CURRENT object at {root.url}/CURRENT names '/etc', which is not a store"
    )
    assert f"--store-url {store_url} --storage-option" in (e.value.fix or "")


def test_validate_checks_the_store_current_names(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, opt_args = profile_root
    root.publish_current(STORES[1])
    assert main(["validate", f"{root.url}/current", "--deep", *opt_args]) == 0
    out = capsys.readouterr().out
    assert f"store {root.url}/current (the store it names: {root.url}/{STORES[1]}) is valid (deep" in out, out
    assert main(["validate", f"{root.url}/current", "--json", *opt_args]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["resolved"] == f"{root.url}/{STORES[1]}", doc
    # what is checked is that store: a chunk of it deleted is found, named in that store
    store = root.child(STORES[1])
    chunk = next(r for r in store.tree_files(store.root) if "/frames/c/" in r)
    store.delete(store.root / chunk)
    store.invalidate()
    assert main(["validate", f"{root.url}/current", *opt_args]) == 1
    out = capsys.readouterr().out
    assert f"(the store it names: {root.url}/{STORES[1]}) is INVALID" in out and chunk in out, out
    assert "current/manifest.json" not in out


def test_a_store_failing_the_gate_on_object_storage_is_moved_aside_never_deleted(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stage2_data.steps.store import move_store_aside
    from stage2_data.store.gate import publication_gate

    root, _, opt_args = profile_root
    root.publish_current(STORES[1])
    out = root.child(STORES[1])
    chunk = next(r for r in out.tree_files(out.root) if "/frames/c/" in r)
    out.delete(out.root / chunk)
    out.invalidate()
    before = {r: out.read_bytes(out.root / r) for r in out.tree_files(out.root)}
    gate = publication_gate(out)
    assert not gate.passed
    moved, line = move_store_aside(out, tmp_path, "p", gate.problems)
    src, dest_url = moved.split(" -> ")
    assert (
        src == out.url
        and dest_url.startswith(f"{root.url}/{QUARANTINE_DIR}/")
        and dest_url.endswith(f"/{STORES[1]}")
    )
    assert f"failed the publication gate ({chunk}" in line or "failed the publication gate (" in line
    assert f"moved to {dest_url} and built again" in line, line
    root.invalidate()
    assert out.tree_files(out.root) == []  # withdrawn from where readers look ...
    dest = StoreLocation.parse(dest_url, out.storage_options)
    assert {
        r: dest.read_bytes(dest.root / r) for r in dest.tree_files(dest.root)
    } == before  # ... kept, byte for byte
    record = json.loads(dest.read_bytes(dest.root.parent / "moved.json"))
    assert record["reason"] == "failed the publication gate" and record["files"] == [
        {"from": src, "to": dest_url}
    ]
    assert record["problems"] == gate.problems[:20]
    # retention never sees it; only gc --quarantine removes it, and says what and where
    assert main(["gc", root.url, "--keep", "0", "--json", *opt_args]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["roots"]
    assert QUARANTINE_DIR not in {e["name"] for e in rep["stores"]}
    # a note put in the store's copy, and a chunk-shaped object its manifest does not list, are
    # not the store's: kept and named, as in a local quarantine (they went with the prefix)
    user = ["NOTES.txt", "shards/shard-000000/frames/c/9/9/9/9/9"]
    for rel in user:
        dest.write_bytes(dest.root / rel, b"mine")
    dest.invalidate()
    assert main(["gc", root.url, "--quarantine", "--dry-run", *opt_args]) == 0
    text = capsys.readouterr().out
    assert f"would remove  {dest_url}/  folder of {len(before)} file(s)" in text, text
    for rel in user:
        assert f"  kept (not the store's: its manifest.json does not list it): {dest_url}/{rel}\n" in text, (
            text
        )
    assert dest.tree_files(dest.root) != []
    assert main(["gc", root.url, "--quarantine", "--json", *opt_args]) == 0
    doc = json.loads(capsys.readouterr().out)["quarantine"]
    assert doc["removed_files"] == len(before) and [m["path"] for m in doc["moved"]] == [dest_url], doc
    assert [k["path"] for k in doc["kept"]] == [f"{dest_url}/{rel}" for rel in user], doc
    dest.invalidate()
    assert sorted(dest.tree_files(dest.root)) == sorted(user)
    assert all(dest.read_bytes(dest.root / rel) == b"mine" for rel in user)
    with pytest.raises(FileNotFoundError):  # its record went with the store
        dest.read_bytes(dest.root.parent / "moved.json")


def _aws_env(**values: str) -> dict[str, str]:
    """This process's environment without any AWS credentials or configuration (nothing found on
    this machine either: no files, no instance metadata), one attempt per request, and ``values``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_MAX_ATTEMPTS="1",
    )
    env.update(values)
    return env


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint_option(endpoint: str) -> str:
    return "--storage-option=client_kwargs=" + json.dumps(
        {"endpoint_url": endpoint, "region_name": "us-east-1"}
    )


FAULTS = {
    "no-credentials": "no credentials for the object storage were found (NoCredentialsError",
    "unreachable": "cannot reach the storage endpoint http://127.0.0.1:",
    "no-such-bucket": "does not exist at the storage endpoint http://127.0.0.1:",
    "access-denied": "access denied (PermissionError",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("command", ["validate", "summary", "gc"])
def test_storage_that_cannot_be_used_is_named_not_a_bug(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
    s3_endpoint: str,  # noqa: F811 - the fixture imported above
    fault: str,
    command: str,
) -> None:
    """No credentials, an endpoint that does not answer, a bucket that does not exist, credentials
    without access: one line naming the URL, what failed and the fix, exit 2 (never "internal
    error ... This is a bug", exit 3); with no credentials, the fix (key= and secret=) then reads."""
    from helpers.cli import stage2
    from moto.core.authorization import enable_iam_authentication

    root, _, opt_args = profile_root
    target = root.url if command == "gc" else f"{root.url}/{STORES[0]}"
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env, args, guard = _aws_env(**creds), [target, *opt_args], contextlib.nullcontext()
    if fault == "no-credentials":
        env = _aws_env()
    elif fault == "unreachable":
        args = [target, _endpoint_option(f"http://127.0.0.1:{_closed_port()}")]
    elif fault == "no-such-bucket":
        args = [target.replace(root.url.split("/")[2], f"t-{uuid.uuid4().hex[:16]}", 1), *opt_args]
    else:  # a user of that storage with no policy at all, once IAM is enforced
        import boto3

        iam = boto3.client("iam", endpoint_url=s3_endpoint, region_name="us-east-1")
        user = f"u-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        env = _aws_env(AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
        guard = enable_iam_authentication()
    with guard:
        r = stage2(command, *args, env=env, timeout=120)
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line.startswith(f"stage2 {command}: error: s3://"), line
    assert FAULTS[fault] in line and "Fix: " in line, line
    assert len(line.splitlines()) == 1 and "internal error" not in line and "Traceback" not in line, line
    if fault == "no-credentials":  # the fix given works
        assert "--storage-option key=ACCESS_KEY_ID --storage-option secret=SECRET_ACCESS_KEY" in line
        keys = ["--storage-option", "key=testing", "--storage-option", "secret=testing"]
        again = stage2(command, *args, *keys, env=env, timeout=120)
        assert again.returncode == 0, again.tail()


def test_the_python_api_names_storage_that_cannot_be_used(
    profile_root: tuple[StoreLocation, dict[str, Any], list[str]],
) -> None:
    """The reader a training job opens (``VinOfflineStoreReader``, under ``VinOfflineDataset``)
    raises the same named error (a ``StoreError``), not botocore's."""
    from helpers.cli import python

    root, opts, _ = profile_root
    code = (
        "import json, sys\n"
        "from stage2_data.errors import StoreError\n"
        "from stage2_data.store import VinOfflineStoreReader\n"
        "try:\n"
        "    VinOfflineStoreReader(sys.argv[1], json.loads(sys.argv[2]))\n"
        "except StoreError as e:\n"
        "    print(json.dumps([type(e).__name__, e.message, e.fix]))\n"
    )
    r = python(code, f"{root.url}/current", json.dumps(opts), env=_aws_env())
    name, message, fix = r.last_json()
    assert name == "StorageAccessError" and "no credentials" in message and "AWS_ACCESS_KEY_ID" in fix
    unreachable = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}}
    r = python(
        code,
        f"{root.url}/current",
        json.dumps(unreachable),
        env=_aws_env(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y"),
    )
    name, message, fix = r.last_json()
    assert name == "StorageAccessError" and "cannot reach the storage endpoint" in message, message
