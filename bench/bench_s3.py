"""The store on object storage: a real S3 API (moto's server, its own process on 127.0.0.1) vs local disk.

* ``s3_store_write_vs_local``: build the same store (pre-decoded ``.npy`` frames, as in
  ``bench_store``) at ``s3://bucket/prefix`` vs in a local folder. The S3 writer encodes each shard in
  a local scratch folder, uploads its objects (parallel PUTs), validates the uploaded store and
  writes ``manifest.json`` last; the local writer writes, fsyncs and renames.
* ``s3_store_read_vs_local``: random-order ``reader.read_frames(i)`` of every sample, warm (shard
  indexes cached after the first touch of a shard; then one ranged GET per sample on S3, one
  ``pread`` locally).
* ``s3_store_validate_deep_vs_local``: ``validate_vin_offline_store(deep=True)`` (every object
  re-hashed, fingerprint recomputed).

Loopback only: the ratios measure the protocol and client overhead (HTTP, request latency, the
moto server's own speed), not a network. A real S3 endpoint adds its round-trip time per request.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.bench_store import INPUTS, PROFILE, make_upstream
from bench.run import entry
from stage2_data.store import VinOfflineStoreReader, VinOfflineWriter, validate_vin_offline_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1 in its own process (as a real endpoint would be)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def options(self) -> dict[str, Any]:
        return {
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"},
        }

    def bucket(self) -> str:
        import boto3

        name = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ranged_get_ms(url: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The server's own cost of one 64 KiB ranged GET, from the largest shard object of the store and
    from a 1 MiB object: moto reads the whole object to serve a range, so its ranged GETs slow down
    with the object's size (real S3 does not); this separates that from the reader's cost."""
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    key = url.split("://", 1)[1]
    sizes = {k: v["size"] for k, v in fs.find(key, detail=True).items()}
    big = max(sizes, key=lambda k: sizes[k])
    small = f"{key}-probe/small"
    fs.pipe_file(small, os.urandom(1 << 20))
    out: dict[str, Any] = {"largest_object_mib": round(sizes[big] / (1 << 20), 1)}
    for name, k in (("ranged_get_ms_largest_object", big), ("ranged_get_ms_1mib_object", small)):
        t = time.perf_counter()
        for _ in range(20):
            fs.cat_file(k, start=4096, end=4096 + (64 << 10))
        out[name] = round((time.perf_counter() - t) / 20 * 1000, 2)
    fs.rm_file(small)
    return out


def s3_vs_local(workdir: Path) -> list[dict[str, Any]]:
    n = int(os.environ.get("BENCH_S3_TRAJ", "180"))  # 180 x ~1.4 MiB = ~250 MiB decoded
    samples, pairs, arrays = make_upstream(workdir / "up", n, npy=True)
    decoded = sum(a.nbytes for a in arrays)
    del arrays
    server = MotoServer()
    try:
        opts = server.options()
        best = {"w_s3": float("inf"), "w_local": float("inf")}
        url = local = ""
        for rep in range(2):
            url = f"s3://{server.bucket()}/stores/bench/v1"
            local = str(workdir / f"local{rep}")
            t = time.perf_counter()
            VinOfflineWriter(local, profile=PROFILE, inputs=INPUTS, rows_per_shard=64).write(samples, pairs)
            best["w_local"] = min(best["w_local"], time.perf_counter() - t)
            t = time.perf_counter()
            VinOfflineWriter(
                url, profile=PROFILE, inputs=INPUTS, rows_per_shard=64, storage_options=opts
            ).write(samples, pairs)
            best["w_s3"] = min(best["w_s3"], time.perf_counter() - t)

        order = list(range(n))
        random.Random(0).shuffle(order)

        def read_all(target: str, o: dict[str, Any] | None) -> float:
            r = VinOfflineStoreReader(target, o)
            for i in order[:8]:  # warm: open the shard groups, cache the shard indexes
                r.read_frames(i)
            t0 = time.perf_counter()
            for i in order:
                r.read_frames(i)
            return time.perf_counter() - t0

        r_s3 = min(read_all(url, opts) for _ in range(2))
        r_local = min(read_all(local, None) for _ in range(2))
        probe = _ranged_get_ms(url, opts)
        t = time.perf_counter()
        assert validate_vin_offline_store(url, deep=True, storage_options=opts) == []
        v_s3 = time.perf_counter() - t
        t = time.perf_counter()
        assert validate_vin_offline_store(local, deep=True) == []
        v_local = time.perf_counter() - t
    finally:
        server.stop()
    mib = decoded / (1 << 20)
    common = {"trajectories": n, "decoded_mib": round(mib, 1), "endpoint": "moto server, 127.0.0.1"}
    return [
        entry(
            "s3_store_write_vs_local",
            best["w_s3"],
            "the same store written to local disk",
            best["w_local"],
            None,
            s3_mib_per_s=round(mib / best["w_s3"], 1),
            local_mib_per_s=round(mib / best["w_local"], 1),
            **common,
        ),
        entry(
            "s3_store_read_vs_local",
            r_s3,
            "the same random reads from local disk",
            r_local,
            None,
            s3_ms_per_sample=round(1000 * r_s3 / n, 3),
            local_ms_per_sample=round(1000 * r_local / n, 3),
            **probe,
            **common,
        ),
        entry(
            "s3_store_validate_deep_vs_local",
            v_s3,
            "the same deep validation on local disk",
            v_local,
            None,
            **common,
        ),
    ]


BENCHMARKS = [s3_vs_local]
