"""The loopback hub, exercised through the real huggingface_hub client over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import get_session

from stage2_data.demo.hubserver import HubFaults, HubServer, handler

REPO = "org/robot-data"
REV = "1a8eb2d279c70964fadeaf8019a77c490c3abe02"
OTHER_REV = "0" * 40
ROOT = Path(__file__).resolve().parents[1]


class Upstream(NamedTuple):
    folder: Path
    files: dict[str, bytes]

    def __getitem__(self, key: str) -> bytes:  # type: ignore[override]
        return self.files[key]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    folder = tmp_path_factory.mktemp("upstream")
    rnd = random.Random(7)
    files = {
        "a.tar": rnd.randbytes(3 * 1024 * 1024 + 17),
        "b.tar.part-aa": rnd.randbytes(1024 * 1024),
        "sub/dir/c.bin": rnd.randbytes(1000),
        "README.md": b"# demo\n",
    }
    for rel, data in files.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return Upstream(folder, files)


@pytest.fixture
def hub(upstream: Upstream):
    with HubServer(upstream.folder, repo_id=REPO, revision=REV) as server:
        yield server


def _api(server: HubServer, token: str | bool | None = False) -> HfApi:
    return HfApi(endpoint=server.url, token=token)  # type: ignore[arg-type]


def _url(server: HubServer, path: str, revision: str = REV, repo_id: str = REPO) -> str:
    return hf_hub_url(repo_id, path, repo_type="dataset", revision=revision, endpoint=server.url)


# ----- listings ----------------------------------------------------------------------------------
def test_tree_listing_gives_size_and_lfs_sha256(hub: HubServer, upstream: Upstream) -> None:
    entries = list(_api(hub).list_repo_tree(REPO, repo_type="dataset", revision=REV, recursive=True))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    folders = {e.path for e in entries if isinstance(e, RepoFolder)}
    assert set(files) == set(upstream.files)
    assert folders == {"sub", "sub/dir"}
    for rel, data in upstream.files.items():
        f = files[rel]
        assert f.size == len(data)
        assert f.lfs is not None
        assert f.lfs.size == len(data)
        assert f.lfs.sha256 == hashlib.sha256(data).hexdigest()
        assert len(f.blob_id) == 40

    top = list(_api(hub).list_repo_tree(REPO, repo_type="dataset", revision=REV))
    assert {e.path for e in top} == {"a.tar", "b.tar.part-aa", "README.md", "sub"}
    sub = list(_api(hub).list_repo_tree(REPO, "sub", repo_type="dataset", revision="main", recursive=True))
    assert {e.path for e in sub} == {"sub/dir", "sub/dir/c.bin"}


def test_tree_pagination_follows_link_header(hub: HubServer) -> None:
    full = [e.path for e in _api(hub).list_repo_tree(REPO, repo_type="dataset", revision=REV, recursive=True)]
    hub.tree_page_size = 2
    paged = [
        e.path for e in _api(hub).list_repo_tree(REPO, repo_type="dataset", revision=REV, recursive=True)
    ]
    assert paged == full
    tree_calls = [p for m, p, _ in hub.log_snapshot() if "/tree/" in p]
    assert len(tree_calls) == 1 + 3  # one unpaged call, then ceil(6 / 2) pages


def test_repo_info_and_main_alias(hub: HubServer, upstream: Upstream) -> None:
    api = _api(hub)
    assert api.dataset_info(REPO, revision=REV).sha == REV
    assert api.dataset_info(REPO, revision="main").sha == REV  # the branch resolves to the commit
    info = api.repo_info(REPO, repo_type="dataset", files_metadata=True)
    assert info.sha == REV
    assert info.private is False
    sib = {s.rfilename: s for s in info.siblings or []}
    assert set(sib) == set(upstream.files)
    assert sib["a.tar"].lfs is not None
    assert sib["a.tar"].lfs.sha256 == hashlib.sha256(upstream["a.tar"]).hexdigest()
    assert sib["a.tar"].size == len(upstream["a.tar"])


def test_a_short_hash_resolves_to_the_commit(hub: HubServer, upstream: Upstream) -> None:
    api = _api(hub)
    assert api.dataset_info(REPO, revision=REV[:7]).sha == REV  # as git abbreviates it
    assert api.repo_info(REPO, repo_type="dataset", revision=REV[:12]).sha == REV
    assert get_session().get(_url(hub, "README.md", revision=REV[:7])).content == upstream["README.md"]
    for other in (REV[:6], REV[1:8], OTHER_REV[:7], REV.upper()[:7], "v1.0"):
        with pytest.raises(RevisionNotFoundError):
            api.dataset_info(REPO, revision=other)


def test_a_folder_served_without_a_commit_is_at_its_own(upstream: Upstream, tmp_path: Path) -> None:
    lines = "".join(
        f"{rel}\0{hashlib.sha256(data).hexdigest()}\n" for rel, data in sorted(upstream.files.items())
    )
    own = hashlib.sha1(lines.encode()).hexdigest()
    with HubServer(upstream.folder, repo_id=REPO, revision=None) as server:
        api = _api(server)
        assert server.revision == own
        assert api.dataset_info(REPO, revision="main").sha == own
        assert api.dataset_info(REPO, revision=own[:7]).sha == own
        assert api.dataset_info(REPO).sha == own
        with pytest.raises(RevisionNotFoundError):
            api.dataset_info(REPO, revision=REV)
    (tmp_path / "x.bin").write_bytes(b"one")
    first = HubServer(tmp_path, repo_id=REPO, revision=None).revision
    (tmp_path / "x.bin").write_bytes(b"two")
    assert HubServer(tmp_path, repo_id=REPO, revision=None).revision != first  # a new file, a new commit


def test_paths_info(hub: HubServer, upstream: Upstream) -> None:
    got = _api(hub).get_paths_info(REPO, ["a.tar", "sub", "nope.tar"], repo_type="dataset", revision=REV)
    by_path = {e.path: e for e in got}
    assert set(by_path) == {"a.tar", "sub"}
    a = by_path["a.tar"]
    assert isinstance(a, RepoFile) and a.lfs is not None
    assert a.lfs.sha256 == hashlib.sha256(upstream["a.tar"]).hexdigest()
    assert isinstance(by_path["sub"], RepoFolder)


# ----- resolve: HEAD and GET ---------------------------------------------------------------------
def test_head_metadata_through_client(hub: HubServer, upstream: Upstream) -> None:
    meta = get_hf_file_metadata(_url(hub, "a.tar"), token=False)
    assert meta.commit_hash == REV
    assert meta.etag == hashlib.sha256(upstream["a.tar"]).hexdigest()
    assert meta.size == len(upstream["a.tar"])
    meta_main = get_hf_file_metadata(_url(hub, "sub/dir/c.bin", revision="main"), token=False)
    assert meta_main.commit_hash == REV


def test_head_has_headers_and_no_body_keepalive(hub: HubServer, upstream: Upstream) -> None:
    data = upstream["a.tar"]
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    path = f"/datasets/{REPO}/resolve/{REV}/a.tar"
    conn.request("HEAD", path)
    r = conn.getresponse()
    assert r.status == 200
    assert r.read() == b""
    assert r.getheader("X-Repo-Commit") == REV
    assert r.getheader("ETag") == f'"{hashlib.sha256(data).hexdigest()}"'
    assert r.getheader("X-Linked-Etag") == f'"{hashlib.sha256(data).hexdigest()}"'
    assert r.getheader("X-Linked-Size") == str(len(data))
    assert r.getheader("Content-Length") == str(len(data))
    assert r.getheader("Accept-Ranges") == "bytes"
    # Same connection: if the HEAD had carried a body, this response would not parse.
    conn.request("GET", path, headers={"Range": "bytes=10-19"})
    r2 = conn.getresponse()
    assert r2.status == 206
    assert r2.read() == data[10:20]
    # And a 404 on HEAD has no body either.
    conn.request("HEAD", f"/datasets/{REPO}/resolve/{REV}/nope")
    r3 = conn.getresponse()
    assert r3.status == 404 and r3.read() == b""
    conn.request("GET", path, headers={"Range": "bytes=0-3"})
    assert conn.getresponse().read() == data[:4]
    conn.close()


def test_range_requests(hub: HubServer, upstream: Upstream) -> None:
    data = upstream["a.tar"]
    size = len(data)
    s = get_session()
    url = _url(hub, "a.tar")
    r = s.get(url, headers={"Range": "bytes=100-"})
    assert r.status_code == 206
    assert r.headers["Content-Range"] == f"bytes 100-{size - 1}/{size}"
    assert r.content == data[100:]
    r = s.get(url, headers={"Range": "bytes=5-9"})
    assert r.status_code == 206 and r.content == data[5:10]
    r = s.get(url, headers={"Range": "bytes=-7"})
    assert r.status_code == 206 and r.content == data[-7:]
    r = s.get(url, headers={"Range": f"bytes={size}-"})
    assert r.status_code == 416
    assert r.headers["Content-Range"] == f"bytes */{size}"
    r = s.get(url)
    assert r.status_code == 200 and r.content == data
    assert hub.log_snapshot()[0] == ("GET", f"/datasets/{REPO}/resolve/{REV}/a.tar", "bytes=100-")


# ----- errors ------------------------------------------------------------------------------------
def test_404_kinds_map_to_client_errors(hub: HubServer) -> None:
    api = _api(hub)
    with pytest.raises(RepositoryNotFoundError):
        get_hf_file_metadata(_url(hub, "a.tar", repo_id="org/other"), token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("org/other")
    with pytest.raises(RepositoryNotFoundError):
        list(api.list_repo_tree("org/other", repo_type="dataset", revision=REV))
    with pytest.raises(RevisionNotFoundError):
        get_hf_file_metadata(_url(hub, "a.tar", revision=OTHER_REV), token=False)
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(REPO, revision=OTHER_REV)
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree(REPO, repo_type="dataset", revision="v1.0"))
    with pytest.raises(RemoteEntryNotFoundError):
        get_hf_file_metadata(_url(hub, "nope.tar"), token=False)
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=5)
    for escape in ("..%2Fa.tar", "sub/..%2F..%2Fa.tar", "%2Fetc%2Fpasswd"):  # never outside the folder
        conn.request("HEAD", f"/datasets/{REPO}/resolve/{REV}/{escape}")
        r = conn.getresponse()
        r.read()
        assert (r.status, r.getheader("X-Error-Code")) == (404, "EntryNotFound"), escape
    conn.close()
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(REPO, "nope", repo_type="dataset", revision=REV))
    r = get_session().get(_url(hub, "nope.tar"))
    assert r.status_code == 404
    assert r.headers["X-Error-Code"] == "EntryNotFound"
    assert "error" in r.json()


def test_token_enforced(upstream: Upstream) -> None:
    secret = "hf_loopbackSECRET123"
    with HubServer(upstream.folder, repo_id=REPO, revision=REV, token=secret) as server:
        assert secret not in repr(server)
        with pytest.raises(RepositoryNotFoundError):  # anonymous: the private repo "does not exist"
            _api(server, token=False).dataset_info(REPO)
        with pytest.raises(HfHubHTTPError) as ei:
            _api(server, token="hf_wrong").dataset_info(REPO)
        assert ei.value.response.status_code == 401
        with pytest.raises(RepositoryNotFoundError):
            get_hf_file_metadata(_url(server, "a.tar"), token=False)
        assert _api(server, token=secret).dataset_info(REPO).sha == REV
        meta = get_hf_file_metadata(_url(server, "a.tar"), token=secret)
        assert meta.size == len(upstream["a.tar"])
        files = list(_api(server, token=secret).list_repo_tree(REPO, repo_type="dataset", revision=REV))
        assert files


# ----- faults ------------------------------------------------------------------------------------
def test_faults(hub: HubServer, upstream: Upstream) -> None:
    data = upstream["a.tar"]
    s = get_session()
    url = _url(hub, "a.tar")

    hub.faults.fail_first["a.tar"] = 2
    assert s.get(url).status_code == 503
    assert hub.faults.fail_first == {"a.tar": 1}
    assert s.get(url).status_code == 503
    assert hub.faults.fail_first == {}
    assert s.get(url).content == data

    hub.faults.drop_after["a.tar"] = 1000
    with pytest.raises(Exception) as ei:
        s.get(url)
    assert "RemoteProtocolError" in type(ei.value).__name__ or "peer closed" in str(ei.value)
    assert hub.faults.drop_after == {}  # consumed: the next GET is served normally
    assert s.get(url).content == data

    hub.faults.corrupt.add("a.tar")
    bad = s.get(url).content
    assert len(bad) == len(data) and bad != data
    part = s.get(url, headers={"Range": "bytes=0-99"}).content
    assert part == data[:100]  # the flipped byte is in the middle
    meta = get_hf_file_metadata(url, token=False)
    assert meta.etag == hashlib.sha256(data).hexdigest()  # HEAD keeps the true sha256
    hub.faults.corrupt.clear()

    hub.faults.ignore_range = True
    r = s.get(url, headers={"Range": "bytes=100-"})
    assert r.status_code == 200 and r.content == data
    hub.faults.ignore_range = False

    hub.faults.missing.add("a.tar")
    with pytest.raises(RemoteEntryNotFoundError):
        get_hf_file_metadata(url, token=False)
    assert s.get(url).status_code == 404
    listed = [e.path for e in _api(hub).list_repo_tree(REPO, repo_type="dataset", revision=REV)]
    assert "a.tar" in listed  # the listing still lists it
    hub.faults.missing.clear()


def test_faults_at_construction_and_file_requests(upstream: Upstream) -> None:
    faults = HubFaults(fail_first={"b.tar.part-aa": 1})
    with HubServer(upstream.folder, repo_id=REPO, revision=REV, faults=faults) as server:
        s = get_session()
        assert s.get(_url(server, "b.tar.part-aa")).status_code == 503
        assert s.get(_url(server, "b.tar.part-aa"), headers={"Range": "bytes=5-"}).status_code == 206
        assert server.file_requests("b.tar.part-aa") == [("GET", None), ("GET", "bytes=5-")]
        assert server.file_requests("a.tar") == []
        server.clear_log()
        assert server.log_snapshot() == []


def test_changed_file_is_rehashed(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"one")
    with HubServer(tmp_path, repo_id=REPO, revision=REV, repo_type="model") as server:
        api = _api(server)

        def sha() -> str:
            (f,) = [e for e in api.list_repo_tree(REPO, revision=REV) if isinstance(e, RepoFile)]
            assert f.lfs is not None
            return f.lfs.sha256

        assert sha() == hashlib.sha256(b"one").hexdigest()
        (tmp_path / "x.bin").write_bytes(b"two!")
        assert sha() == hashlib.sha256(b"two!").hexdigest()
        # A model repo has no URL prefix.
        url = hf_hub_url(REPO, "x.bin", revision=REV, endpoint=server.url)
        assert f"{server.url}/{REPO}/resolve/" in url
        assert get_session().get(url).content == b"two!"


def test_a_symlinked_file_is_served_as_listed(tmp_path: Path) -> None:
    """A hub folder whose archives are symlinks (to a disk elsewhere, or a hub cache's snapshot,
    whose files link to ``../../blobs``): the listing showed the file and a download of it answered
    "does not exist", so a build failed on an archive whose pin was right. It is served as listed,
    through the real client; a dangling link is neither listed nor served."""
    folder, blobs = tmp_path / "snapshot", tmp_path / "blobs"
    folder.mkdir()
    blobs.mkdir()
    data = random.Random(3).randbytes(200_000)
    (blobs / "x").write_bytes(data)
    (folder / "a.tar").symlink_to(blobs / "x")
    (folder / "gone.tar").symlink_to(blobs / "missing")
    with HubServer(folder, repo_id=REPO, revision=REV) as server:
        listed = {e.path: e for e in _api(server).list_repo_tree(REPO, repo_type="dataset", revision=REV)}
        assert set(listed) == {"a.tar"}
        lfs = listed["a.tar"].lfs  # type: ignore[union-attr]
        assert lfs is not None and lfs.sha256 == hashlib.sha256(data).hexdigest()
        got = hf_hub_download(
            REPO, "a.tar", repo_type="dataset", revision=REV, endpoint=server.url, local_dir=tmp_path / "dl"
        )
        assert Path(got).read_bytes() == data
        with pytest.raises(RemoteEntryNotFoundError):
            get_hf_file_metadata(_url(server, "gone.tar"), token=False)


def test_bad_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="40-hex"):
        HubServer(tmp_path, repo_id=REPO, revision="main")
    with pytest.raises(ValueError):
        HubServer(tmp_path / "nope", repo_id=REPO, revision=REV)


def test_stop_closes_connections(upstream: Upstream) -> None:
    server = HubServer(upstream.folder, repo_id=REPO, revision=REV).start()
    url = server.url
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", f"/api/datasets/{REPO}")
    assert conn.getresponse().read()
    server.stop()
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", f"/api/datasets/{REPO}")
        conn.getresponse().read()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()


_HUB_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _hub_command(module: str, folder: Path, *extra: str) -> list[str]:
    """The hub server's own entry point or `stage2 serve-hub` (``module``) serving ``folder``."""
    return [sys.executable, "-m", *module.split(), str(folder), "--repo-id", REPO, "--revision", REV, *extra]


def _serve_then_stop(command: list[str], signals: list[int]) -> None:
    """Start ``command``, check it serves the repository at its printed URL, send ``signals``: it
    exits 0 within seconds."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_HUB_ENV, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:")
        info = json.loads(get_session().get(f"{line}/api/datasets/{REPO}/revision/main").content)
        assert info["sha"] == REV
        for sig in signals:
            proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "module, signals",
    [
        ("stage2_data.demo.hubserver", [signal.SIGTERM]),
        ("stage2_data.demo.hubserver", [signal.SIGTERM, signal.SIGINT] * 3),
        ("stage2_data serve-hub", [signal.SIGTERM]),
        ("stage2_data serve-hub", [signal.SIGTERM, signal.SIGINT] * 3),
    ],
    ids=["module-sigterm", "module-burst", "serve-hub-sigterm", "serve-hub-burst"],
)
def test_main_serves_until_sigterm(upstream: Upstream, module: str, signals: list[int]) -> None:
    """The hub server's own entry point and `stage2 serve-hub` serve until a signal, then exit 0
    within seconds; a burst of them too (a second one, while the first is pending, is handed by the
    kernel to any thread of the process, here the server's: the main thread must still see it)."""
    _serve_then_stop(_hub_command(module, upstream.folder), signals)


@pytest.mark.parametrize("module", ["stage2_data.demo.hubserver", "stage2_data serve-hub"])
def test_a_port_in_use_is_named_with_a_fix_that_works(upstream: Upstream, module: str) -> None:
    """A port another program listens on: exit 2, one line naming the port and another `--port`
    (it named the file system before, and the module's entry point printed a traceback); the fix,
    `--port 0`, serves."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            _hub_command(module, upstream.folder, "--port", str(port)),
            capture_output=True, text=True, env=_HUB_ENV, cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"127.0.0.1:{port}: another program listens on that port" in r.stderr, r.stderr
    assert "0 takes a free one" in r.stderr, r.stderr
    _serve_then_stop(_hub_command(module, upstream.folder, "--port", "0"), [signal.SIGTERM])


@pytest.mark.parametrize("module", ["stage2_data.demo.hubserver", "stage2_data serve-hub"])
def test_a_folder_is_served_as_what_its_marker_declares(tmp_path: Path, module: str) -> None:
    """A folder whose .stage2-hub.json declares what it mirrors is served as that without
    `--repo-id` and `--revision`; one given that differs from the declaration is refused, one line
    naming the file, what it declares and the option, exit 2 (it served the folder's files as
    another repository or commit without a word: QA). A folder declaring nothing needs a
    `--repo-id`, and says so."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a" * 100)
    (folder / ".stage2-hub.json").write_text(json.dumps({"repo_id": REPO, "revision": REV}))
    base = [sys.executable, "-m", *module.split(), str(folder)]
    _serve_then_stop(base, [signal.SIGTERM])  # as declared
    _serve_then_stop([*base, "--repo-id", REPO.upper(), "--revision", REV], [signal.SIGTERM])  # the same

    def refused(*extra: str, where: Path = folder) -> str:
        cmd = [sys.executable, "-m", *module.split(), str(where), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, env=_HUB_ENV, cwd=ROOT, timeout=60)
        assert r.returncode == 2 and not r.stdout, (r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        return r.stderr

    said = refused("--revision", OTHER_REV)
    assert f"{folder / '.stage2-hub.json'}" not in said  # the folder and the file's name, once each
    assert f"{folder} declares in its .stage2-hub.json that it mirrors {REPO} at commit {REV}" in said, said
    assert f"--revision {OTHER_REV} would serve" in said and "leave out --repo-id and --revision" in said, (
        said
    )
    said = refused("--repo-id", "other/repo")
    assert "--repo-id other/repo would serve" in said, said
    (folder / ".stage2-hub.json").unlink()
    said = refused()
    assert f"no --repo-id given, and the hub folder {folder} declares none" in said, said
    assert "Fix: pass --repo-id namespace/name" in said, said
    said = refused(where=tmp_path / "missing")  # a folder that is not there: that is said first
    assert f"the hub folder {tmp_path / 'missing'} does not exist." in said, said


def test_serves_large_body(tmp_path: Path) -> None:
    """How fast is measured in bench/ (bench_hub.hub_get_64mib_vs_http_server)."""
    data = os.urandom(64 * 1024 * 1024)
    (tmp_path / "big.bin").write_bytes(data)
    with (
        HubServer(tmp_path, repo_id=REPO, revision=REV) as server,
        get_session().stream("GET", _url(server, "big.bin")) as r,
    ):
        h = hashlib.sha256()
        n = 0
        for chunk in r.iter_bytes(8 * 1024 * 1024):
            h.update(chunk)
            n += len(chunk)
    assert n == len(data) and h.hexdigest() == hashlib.sha256(data).hexdigest()


class FakeClock:
    """The handler's ``time``: ``sleep`` only moves the clock on, so a paced download takes no time
    and the pauses it asks for add up to exactly what the rate requires."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_paced_downloads_keep_to_the_rate(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HubFaults.rate`` paces each download as a CDN paces one connection (benchmarks use it for a
    network-bound link); the bytes are unchanged. The pauses are checked on a fake clock; the wall
    time, paced against unpaced, is measured in bench/ (bench_hub.hub_unpaced_get_vs_paced)."""
    clock = FakeClock()
    monkeypatch.setattr(handler, "time", clock)
    rate = 10e6
    with HubServer(upstream.folder, repo_id=REPO, revision=REV, faults=HubFaults(rate=rate)) as server:
        s = get_session()
        body = s.get(_url(server, "a.tar")).content
        assert body == upstream["a.tar"]
        # the last pause (after the last step) may still be under way when the client has the body
        deadline = time.monotonic() + 10  # only stops a hang
        while sum(clock.slept) < len(body) / rate * (1 - 1e-9) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(clock.slept) == pytest.approx(len(body) / rate)  # on the fake clock: exactly the rate
        assert len(clock.slept) >= -(-len(body) // handler.RATE_STEP)  # a pause after every step
        server.faults.rate = None
        clock.slept.clear()
        assert s.get(_url(server, "a.tar")).content == upstream["a.tar"]
        assert clock.slept == []  # unpaced: no pause at all


def test_link_rate_is_shared_by_concurrent_downloads(upstream: Upstream) -> None:
    """``HubFaults.link_rate`` paces all downloads together, as one link does (benchmarks use it for
    a build against ``hf download`` over the same link): two concurrent GETs, one connection each,
    take at least their total bytes over the rate, where pacing each connection alone would let
    them finish in half of that; the bytes are unchanged, and ``link_free_at`` says when the last
    paced byte went. Real clock: the lower bound is exact (a paced byte is never sent before its
    turn); the upper bound only catches a hang."""
    rate = 6e6
    size = len(upstream["a.tar"])
    with HubServer(upstream.folder, repo_id=REPO, revision=REV, faults=HubFaults(link_rate=rate)) as server:
        path = urlsplit(_url(server, "a.tar")).path
        start = threading.Barrier(3)
        bodies: list[bytes] = []

        def fetch() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            start.wait()
            conn.request("GET", path)
            bodies.append(conn.getresponse().read())
            conn.close()

        threads = [threading.Thread(target=fetch) for _ in range(2)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.monotonic()
        for t in threads:
            t.join(timeout=60)
        took = time.monotonic() - t0
        assert bodies == [upstream["a.tar"]] * 2
        assert took >= 2 * size / rate * 0.999
        assert took < 2 * size / rate * 3 + 5
        assert t0 + 2 * size / rate * 0.999 <= server.link_free_at <= t0 + took
        server.faults.link_rate = None
        t1 = time.monotonic()
        assert get_session().get(_url(server, "a.tar")).content == upstream["a.tar"]
        assert server.link_free_at < t1  # unpaced: nothing booked on the link


def test_reject_with_retry_after(hub: HubServer) -> None:
    """``HubFaults.reject``: an error status on a file's GET, the repo info or the listing, with a
    ``Retry-After`` in delta-seconds or HTTP-date form; consumed as it fires."""
    from email.utils import parsedate_to_datetime

    from stage2_data.demo.hubserver import INFO, TREE, Reject

    s = get_session()
    hub.faults.reject.update(
        {
            INFO: Reject(2, 429, retry_after=30),
            TREE: Reject(1, 500),
            "a.tar": Reject(1, 503, retry_after=60, http_date=True),
        }
    )
    info_url = f"{hub.url}/api/datasets/{REPO}/revision/{REV}"
    for _ in range(2):
        r = s.get(info_url)
        assert (r.status_code, r.headers["retry-after"]) == (429, "30")
    assert s.get(info_url).status_code == 200  # consumed
    r = s.get(f"{hub.url}/api/datasets/{REPO}/tree/{REV}")
    assert r.status_code == 500 and "retry-after" not in r.headers
    url = hf_hub_url(REPO, "a.tar", repo_type="dataset", revision=REV, endpoint=hub.url)
    assert s.head(url).status_code == 200  # a file's rejection is for its GETs
    r = s.get(url)
    assert r.status_code == 503
    wait = parsedate_to_datetime(r.headers["retry-after"]).timestamp() - time.time()
    assert 50 <= wait <= 60
    assert s.get(url).status_code == 200
    assert hub.faults.reject == {}
