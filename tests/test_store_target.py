"""The store target is a resource: the same build writes the store to local disk or to object storage
(a real S3 API: moto's server on 127.0.0.1), with the same fingerprint."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stage2_data import layout
from stage2_data.demo import DemoPaths
from stage2_data.steps import CURRENT_OBJECT
from stage2_data.storage import StoreLocation
from stage2_data.store import VinOfflineStoreReader, validate_vin_offline_store
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


def test_build_writes_the_store_to_s3_with_the_local_fingerprint(
    built: dict, demo_cache: DemoPaths, s3: tuple[str, dict], tmp_path: Path, dagster_home: Path
) -> None:
    url, options = s3
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
    assert s["store"].startswith(url + "/") and s["fingerprint"] == built["summary"]["fingerprint"]
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
