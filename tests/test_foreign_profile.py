"""`stage2 build` on a profile, kit and upstream folder that follow the spec but are not the demo's:
other cache keys, archive names, kit paths, repo id, revision, profile name, a kit root apart from the
profile, a three-part split tar, a `.sha256` naming `derived/<tar>`, no optional width table, and a hub
that pages its tree listing."""

from __future__ import annotations

import io
import secrets
import shutil
import tarfile
from pathlib import Path

from helpers.cli import stage2

from stage2_data.demo import DemoPaths
from stage2_data.demo.hubserver import HubServer
from stage2_data.hashing import sha256_file
from stage2_data.layout import split_base
from stage2_data.profile import ArchiveSpec, KitSpec, Profile, SourceSpec, load_profile
from stage2_data.store import VinOfflineStoreReader


def _rewrite_tar(data: bytes, renames: dict[str, str], prefix: str) -> bytes:
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data)) as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for m in src.getmembers():
            name = m.name.removeprefix("./").rstrip("/")
            if name in ("", ".", "processed_datasets"):
                continue
            name = name.removeprefix("processed_datasets/")
            key, _, rest = name.partition("/")
            m.name = f"{prefix}{renames[key]}" + (f"/{rest}" if rest else "")
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def _foreign_copy(demo: DemoPaths, out: Path) -> tuple[Path, Path, Path, Profile]:
    """Returns (upstream, kit_root, profile_path, profile)."""
    old = load_profile(demo.profile)
    renames = {k: f"lab{i:02d}_dataset_{k[-6:].strip('_')}" for i, k in enumerate(old.cache_keys())}
    upstream = out / "upstream"
    upstream.mkdir(parents=True)
    archives: list[ArchiveSpec] = []
    for i, (key, specs) in enumerate(old.archives_by_cache_key().items()):
        data = b"".join((demo.upstream / a.path).read_bytes() for a in specs)
        new = _rewrite_tar(data, renames, "processed_datasets/" if i % 2 else "")
        base = f"{renames[key]}-v2.tar"
        if len(specs) > 1:  # re-split into three parts, cut mid-member
            cuts = [0, len(new) // 3 + 77, 2 * len(new) // 3 + 5, len(new)]
            names = [f"{base}.part-a{c}" for c in "abc"]
            chunks = [new[cuts[j] : cuts[j + 1]] for j in range(3)]
        else:
            names, chunks = [base], [new]
        for n, c in zip(names, chunks, strict=True):
            (upstream / n).write_bytes(c)
            archives.append(
                ArchiveSpec(path=n, cache_key=renames[key], size=len(c), sha256=sha256_file(upstream / n))
            )
    (upstream / "UNRELATED.bin").write_bytes(b"x" * 1000)
    quarantined_name = "lab99_known_bad.tar"
    (upstream / quarantined_name).write_bytes(b"never to be read")

    kit = out / "kit"
    (kit / "meta").mkdir(parents=True)

    def rename_text(text: str) -> str:
        for k in sorted(renames, key=len, reverse=True):
            text = text.replace(k, renames[k])
        return text

    (kit / "meta" / "pairs.jsonl").write_text(rename_text(old.kit_file("pair_manifest").read_text()))
    (kit / "meta" / "sums.txt").write_text(rename_text(old.kit_file("subset_checksums").read_text()))
    shutil.copytree(old.kit_file("action_manifest_dir"), kit / "actions")
    for f in (kit / "actions").glob("*.jsonl"):
        f.write_text(rename_text(f.read_text()))
    tar = kit / "sidecars.tar"
    shutil.copy(old.kit_file("sidecar_archive"), tar)
    (kit / "sidecars.tar.sha256").write_text(f"{sha256_file(tar)}  derived/sidecars.tar\n")

    e = old.expected
    profile = Profile(
        name="someone_elses_profile",
        description="written by someone else",
        source=SourceSpec(
            repo_id="someone/other-robot-data", repo_type="dataset", revision=secrets.token_hex(20)
        ),
        kit=KitSpec(
            pair_manifest="meta/pairs.jsonl",
            subset_checksums="meta/sums.txt",
            action_manifest_dir="actions",
            sidecar_archive="sidecars.tar",
            sidecar_archive_sha256="sidecars.tar.sha256",
        ),
        archives=archives,
        quarantined=[{"path": quarantined_name, "reason": "bad"}],
        expected=e.model_copy(update={"archives": len(archives), "action_width_by_source": {}}),
    )
    prof_dir = out / "profiles"
    prof_dir.mkdir()
    profile_path = prof_dir / "other.toml"
    profile_path.write_text(profile.to_toml())
    return upstream, kit, profile_path, load_profile(profile_path, kit_root=kit)


def test_build_on_a_foreign_profile(demo: DemoPaths, tmp_path: Path, dagster_home: Path) -> None:
    upstream, kit, profile_path, prof = _foreign_copy(demo, tmp_path / "foreign")
    assert len({split_base(a.path) for a in prof.archives}) == prof.expected.cache_dirs
    assert len(prof.archives) == prof.expected.cache_dirs + 2  # one tar in three parts
    with HubServer(upstream, repo_id=prof.source.repo_id, revision=prof.source.revision) as hub:
        hub.tree_page_size = 5  # a hub that pages its listings
        out = stage2(
            "build", "--profile", str(profile_path), "--kit-root", str(kit), "--data-root", str(tmp_path / "root"),
            "--endpoint", hub.url, "--json", "--concurrency", "2",
            timeout=600,
        )  # fmt: skip
        requested = {p.rsplit("/", 1)[-1] for (m, p, _) in hub.request_log if "/resolve/" in p}
    assert out.returncode == 0, out.tail()
    summary = out.json()
    assert summary["ok"] and summary["profile"] == "someone_elses_profile"
    assert requested == set(prof.archive_paths())  # never the quarantined or unrelated files
    reader = VinOfflineStoreReader(Path(summary["store"]))
    assert reader.num_samples == prof.expected.unique_frame_files
    assert len(reader.pairs()) == prof.expected.pair_rows
    assert {row["cache_key"] for row in reader.sample_index} <= set(prof.cache_keys())
    assert reader.manifest["profile"]["repo_id"] == "someone/other-robot-data"
