"""The store target is a resource: the same build writes the store to local disk or to object storage
(a real S3 API: moto's server on 127.0.0.1), with the same fingerprint."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.profile import load_profile
from stage2_data.steps import CURRENT_OBJECT
from stage2_data.steps.store_inputs import kit_inputs
from stage2_data.storage import StoreLocation
from stage2_data.store import VinOfflineStoreReader, store_fingerprint, validate_vin_offline_store
from stage2_data.store.manifest import manifest_data_files
from stage2_pipelines.config import BuildConfig
from stage2_pipelines.runner import build_all


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, dict]]:
    import boto3
    from moto import server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"stores-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    ).create_bucket(Bucket=bucket)
    options = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    try:
        yield f"s3://{bucket}/team", options
    finally:
        server.stop()


def _manifest_diff(a: dict, b: dict) -> list[str]:
    """The manifest keys (fingerprint-relevant ones) whose values differ, with both values, then the
    data files whose sha256 differ: what a fingerprint mismatch came from."""
    keys = sorted((set(a) | set(b)) - {"created_at", "fingerprint", "local"})
    out = [
        f"{k}: {json.dumps(a.get(k))[:400]} != {json.dumps(b.get(k))[:400]}"
        for k in keys
        if a.get(k) != b.get(k)
    ]
    fa, fb = dict(manifest_data_files(a)), dict(manifest_data_files(b))
    out += [
        f"file {r}: {fa.get(r)} != {fb.get(r)}" for r in sorted(set(fa) | set(fb)) if fa.get(r) != fb.get(r)
    ]
    return out


def _rows_diff(local: list[dict], remote: list[dict]) -> list[str]:
    """The first sample_index rows that differ between the two stores (a sample's frames, actions
    or metadata that changed between the builds)."""
    out = [f"row {a} != {b}" for a, b in zip(local, remote, strict=False) if a != b][:3]
    return out + ([f"{len(local)} rows != {len(remote)} rows"] if len(local) != len(remote) else [])


def _input_diff(built_root: Path, root: Path) -> list[str]:
    """The files the store is built from (the join table the S3 build wrote again, the frames and
    sidecars it read) that differ between the shared build's data root and the S3 build's copy."""
    out = []
    for sub in ("tables", "derived", "processed_datasets"):
        for p in sorted((built_root / sub).rglob("*")):
            q = root / p.relative_to(built_root)
            if p.is_file() and (not q.is_file() or q.read_bytes() != p.read_bytes()):
                out.append(f"{q.relative_to(root)} differs from the shared build's")
    return out


def test_build_writes_the_store_to_s3_with_the_local_fingerprint(
    built: dict, demo_cache: DemoPaths, s3: tuple[str, dict], tmp_path: Path, dagster_home: Path
) -> None:
    url, options = s3
    local_store = layout.current_store_path(built["root"], "stage2_core_v1_demo")
    local_manifest = json.loads((local_store / "manifest.json").read_text())
    # the shared build is still what it was (its bytes give its fingerprint): a test that changed it
    # would show here, not as an S3 difference
    assert store_fingerprint(local_store) == built["summary"]["fingerprint"] == local_manifest["fingerprint"]
    # and the shared demo's kit and pins are still the ones it was built from
    assert kit_inputs(load_profile(demo_cache.profile)) == local_manifest["inputs"]
    root = tmp_path / "root"
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(".dagster", "stores"))
    config = BuildConfig(
        profile_path=str(demo_cache.profile),
        data_root=str(root),
        endpoint="http://127.0.0.1:9",  # verified archives are never requested again
        store_url=url,
        store_options=options,
    )
    s = build_all(config, concurrency=1)
    assert s["ok"], ([c for c in s["checks"] if not c["passed"]], s["errors"])
    assert s["store"].startswith(url + "/")
    s3_reader = VinOfflineStoreReader(s["store"], options)
    assert s["fingerprint"] == built["summary"]["fingerprint"], (
        _manifest_diff(local_manifest, s3_reader.manifest),
        _rows_diff(VinOfflineStoreReader(local_store).sample_index, s3_reader.sample_index),
        _input_diff(built["root"], root),
    )
    assert not layout.stores_root(root, "stage2_core_v1_demo").exists()  # nothing written locally
    parent = StoreLocation.parse(s["store"].rsplit("/", 1)[0], options)
    assert parent.read_bytes(parent.root / CURRENT_OBJECT).decode().strip() == s["store"].rsplit("/", 1)[1]
    assert validate_vin_offline_store(s["store"], deep=True, storage_options=options) == []
    reader = VinOfflineStoreReader(s["store"], options)
    assert reader.manifest["fingerprint"] == built["summary"]["fingerprint"]
    assert reader.read_frames(0).dtype.name == "uint8"
    # the same inputs again: the store on S3 is reused, not rebuilt
    again = build_all(config, concurrency=1)
    assert again["ok"] and again["fingerprint"] == s["fingerprint"]


@pytest.mark.parametrize("local_store", [False, True], ids=["fresh-root", "root-with-a-local-store"])
def test_a_first_build_on_s3_says_no_store_is_published(
    built: dict,
    demo_cache: DemoPaths,
    s3: tuple[str, dict],
    tmp_path: Path,
    dagster_home: Path,
    local_store: bool,
) -> None:
    """`stage2 build --store-url s3://...` where nothing was ever published writes the store whole and
    says why as a local first build does: no store is published (not that extension is local only).
    Over a data root that also holds a local store (nothing of it changes), the store stage's line
    says it wrote the store, not "nothing changed" (it judged the stage by the data root alone)."""
    import os

    from helpers.cli import stage2

    url, options = s3
    url = f"{url}/first-{uuid.uuid4().hex[:8]}"  # nothing published under it (the test above publishes)
    root = tmp_path / "root"
    skip = (".dagster",) if local_store else (".dagster", "stores")
    shutil.copytree(built["root"], root, symlinks=True, ignore=shutil.ignore_patterns(*skip))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=options["key"], AWS_SECRET_ACCESS_KEY=options["secret"])
    env.update(
        AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull
    )
    r = stage2(
        "build", "--profile", str(demo_cache.profile), "--data-root", str(root),
        "--endpoint", "http://127.0.0.1:9",  # verified archives are never requested again
        "--store-url", url, f"--storage-option=client_kwargs={json.dumps(options['client_kwargs'])}",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.tail()
    assert "store update: rebuilt: no store is published for this profile\n" in r.stdout, r.stdout
    store_lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[5/5]")]
    assert store_lines and not any("nothing changed" in ln or "up to date" in ln for ln in store_lines), (
        r.stderr
    )
    assert f"store:        {url}/stage2_core_v1_demo/" in r.stdout, r.stdout
    assert "\nsamples:      " in r.stdout and " pairs: " in r.stdout, (
        r.stdout
    )  # read from the store's manifest
    # the path to keep, as on a local disk: `current`, which readers follow through CURRENT
    current = f"{url}/stage2_core_v1_demo/current"
    assert f"current:      {current}\n" in r.stdout and "storage_options=" in r.stdout, r.stdout
    from stage2_data.store import VinOfflineDataset

    with VinOfflineDataset(current, split="train", storage_options=options) as ds:
        assert len(ds) > 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "s3:/bucket/stores",
            "'s3:/bucket/stores' starts like a URL but is not one (a URL is s3://BUCKET/PREFIX)",
        ),
        ("s3:bucket", "'s3:bucket' starts like a URL but is not one"),
        ("s3://", "'s3://' names no bucket. Fix: write s3://BUCKET/PREFIX"),
        ("gs://bucket/stores", "gs://bucket/stores: cannot open the storage (Please install gcsfs"),
        ("gs://bucket/stores", "Fix: `pip install gcsfs`"),  # the package for this scheme, not s3fs
        ("memory://bucket", "fsspec's memory:// file system lives in one process"),  # gone with its run
        # not object storage: an internal error and a traceback (QA)
        ("ftp://x/y", "'ftp://x/y': a store cannot be on ftp:// (stores are kept in a local folder"),
        # a folder under the working folder, named as a host (QA: the store landed in ./relative/x)
        (
            "file://relative/x",
            "'file://relative/x' is not a file:// URL of a folder: its path must be absolute",
        ),
    ],
    ids=[
        "one-slash",
        "no-slash",
        "no-bucket",
        "backend-not-installed",
        "backend-fix",
        "memory",
        "ftp",
        "file-relative",
    ],
)
def test_a_store_url_that_cannot_be_one_is_refused_before_any_download(
    url: str, says: str, demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """`--store-url` is opened by the store stage, after every download: a URL mistyped into a local
    path (which would have written a local folder `s3:`), a URL without a bucket, or a scheme whose
    fsspec backend is missing is refused at the start, in one line, before anything is written."""
    from helpers.cli import stage2

    root = tmp_path / "root"
    r = stage2(
        "build", "--profile", str(demo_cache.profile), "--data-root", str(root),
        "--hub-folder", str(demo_cache.upstream), "--store-url", url, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.tail()
    assert r.stderr.startswith("stage2 build: error: ") and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Fix:" in r.stderr, r.stderr
    assert not root.exists() and not (tmp_path / "s3:").exists() and not (tmp_path / "relative").exists()


@pytest.mark.parametrize("command", ["validate", "summary", "gc"])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://x/y", "'ftp://x/y': a store cannot be on ftp://"),
        ("zip://x", "'zip://x': a store cannot be on zip://"),  # its fix named the working folder
        ("file://relative/x", "'file://relative/x' is not a file:// URL of a folder"),
    ],
    ids=["ftp", "zip", "file-relative"],
)
def test_a_store_url_no_store_can_be_at_is_named_by_every_command(
    command: str, url: str, says: str, tmp_path: Path
) -> None:
    """A URL of a scheme that is not object storage was an internal error with a traceback (ftp://),
    or a fix that said to delete the working folder (zip://); a file:// URL with a relative path
    read a folder under the working folder (QA). Each is one line naming it, with the fix."""
    from helpers.cli import stage2

    r = stage2(command, url, cwd=tmp_path)
    assert r.returncode == 2, r.tail()
    assert r.stderr.startswith(f"stage2 {command}: error: ") and says in r.stderr, r.stderr
    assert (
        len(r.stderr.strip().splitlines()) == 1
        and "Fix: write a local folder" in r.stderr
        or ("Fix: write file:///relative/x if you meant /relative/x" in r.stderr)
    ), r.stderr


def test_a_url_scheme_is_read_whatever_its_case(tmp_path: Path) -> None:
    """`FILE:///x` is `file:///x` (URL schemes ignore case): it was refused as a scheme no store
    can be on, with a fix recommending file:// (QA)."""
    from helpers.cli import stage2

    r = stage2("validate", f"FILE://{tmp_path}/none", cwd=tmp_path)
    assert r.returncode == 2 and f"no complete VIN offline store at {tmp_path}/none" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["validate", "summary"])
def test_a_store_url_mistyped_into_a_path_is_named_by_the_readers(command: str, tmp_path: Path) -> None:
    """`stage2 validate s3:/bucket/x` reads a local path that does not exist: it is named as the
    URL it was meant to be (as `--store-url` is), not as a missing local store; a local folder of
    that name still opens."""
    from helpers.cli import stage2

    r = stage2(command, "s3:/bucket/x", cwd=tmp_path)
    assert r.returncode == 2, r.tail()
    assert "'s3:/bucket/x' starts like a URL but is not one" in r.stderr, r.stderr
    assert "Fix: write s3://BUCKET/PREFIX, with two slashes" in r.stderr, r.stderr
    (tmp_path / "s3:" / "bucket" / "x").mkdir(parents=True)
    r = stage2(command, "s3:/bucket/x", cwd=tmp_path)
    assert r.returncode == 2 and "no complete VIN offline store at" in r.stderr, r.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("no-credentials", "no credentials for the object storage were found (NoCredentialsError"),
        ("unreachable", "cannot reach the storage endpoint http://127.0.0.1:"),
        ("no-such-bucket", "does not exist at the storage endpoint http://127.0.0.1:"),
    ],
    ids=["no-credentials", "unreachable", "no-such-bucket"],
)
def test_a_store_url_that_cannot_be_written_is_refused_before_any_download(
    fault: str, says: str, s3: tuple[str, dict], demo_cache: DemoPaths, tmp_path: Path
) -> None:
    """The store stage writes to `--store-url` after every download and extraction: no credentials,
    an endpoint that does not answer or a bucket that does not exist is found by a probe at the
    start instead, and refused in one line with its fix (exit 2), before anything is written."""
    import os

    from helpers.cli import stage2

    url, options = s3
    endpoint = options["client_kwargs"]["endpoint_url"]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_MAX_ATTEMPTS="1")
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    if fault != "no-credentials":
        env.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
    if fault == "unreachable":
        endpoint = f"http://127.0.0.1:{_closed_port()}"
    if fault == "no-such-bucket":
        url = f"s3://missing-{uuid.uuid4().hex[:12]}/team"
    client = json.dumps({"endpoint_url": endpoint, "region_name": "us-east-1"})
    root = tmp_path / "root"
    r = stage2(
        "build", "--profile", str(demo_cache.profile), "--data-root", str(root),
        "--hub-folder", str(demo_cache.upstream), "--store-url", url,
        f"--storage-option=client_kwargs={client}", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.tail()
    line = r.stderr.strip()
    assert line.startswith(f"stage2 build: error: {url}/stage2_core_v1_demo: "), line
    assert says in line and "Fix: " in line, line
    assert len(line.splitlines()) == 1 and "internal error" not in line, line
    assert not root.exists()


def test_a_writable_store_url_passes_the_probe_and_keeps_nothing_of_it(s3: tuple[str, dict]) -> None:
    """The probe of a usable `--store-url` writes one small object under `<url>/<profile>/` and
    deletes it: nothing of it is left for a reader, retention or gc to see."""
    from stage2_data.storage import check_stores_target

    url, options = s3
    check_stores_target(url, "probe_profile", options)
    loc = StoreLocation.parse(f"{url}/probe_profile", options)
    loc.invalidate()
    assert loc.tree_files(loc.root) == []
