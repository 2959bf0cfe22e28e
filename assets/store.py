"""The immutable VIN offline store."""

import shlex
from pathlib import Path
from typing import Any

import dagster as dg

from stage2_data import checks as C
from stage2_data import layout, preview, steps
from stage2_data.errors import Stage2Error
from stage2_data.fsutil import python_str
from stage2_data.profile import Profile
from stage2_data.stages import VIN_STORE
from stage2_data.store import VinOfflineStoreReader
from stage2_resources import DataRootResource, ProfileResource, StoreTargetResource

from ._common import (
    check_result,
    code_version_with,
    data_root_step_lock,
    forget_on_failure,
    run_step,
    stage_asset,
    standalone_check,
)

GROUP = "store"


def published_path(prof: Any, root: Path, store_url: str | None) -> str:
    """Where readers open the published store: ``stores/<profile>/current`` under the data root, or
    ``<store_url>/<profile>/current`` on object storage (the reader resolves it once, at open)."""
    if store_url:
        return f"{store_url.rstrip('/')}/{prof.name}/{layout.CURRENT_LINK}"
    return str(layout.current_store_path(root, prof.name))


PREVIEW_KEYS = ("length_histogram", "contact_sheets", "preview")


def open_markdown_narrow(published: str, store: str, storage_options: bool = False) -> str:
    """``preview.open_markdown`` laid out for the UI's metadata table, whose value column grows to
    its widest line (a code line never wraps) until the key column scrolls out of view: the path
    on a line of its own, no line longer than the path needs. The same three statements as
    ``preview.open_snippet``."""
    now = store.rstrip("/").rsplit("/", 1)[-1]
    opts = "\n    storage_options={...}," if storage_options else ""
    return (
        f"**Published at** `{published}`\n(now `{now}`).\n\nOpen it in Python (no Dagster needed):\n\n"
        "```python\n"
        "from stage2_data.store import VinOfflineDataset\n"
        "ds = VinOfflineDataset(\n"
        f"    {python_str(published)},\n"
        f'    split="train",{opts}\n'
        ")\n"
        "sample = ds[0]  # frames, actions, task, ...\n"
        "```\n\n"
        f"See its frames: `stage2 preview {published}`"
    )


def preview_of(store: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The length histogram and a contact sheet per source of the store at ``store``
    (``stage2_data.preview``: a few trajectories decoded, never the whole store); a preview that
    cannot be drawn is said in one line and fails nothing."""
    try:
        with VinOfflineStoreReader(store, storage_options) as reader:
            return preview.preview_metadata(reader)
    except (Stage2Error, OSError, ValueError) as err:
        return {"preview": f"not drawn: {err}"}


def with_preview(
    res: steps.StepResult, published: str, storage_options: dict[str, Any] | None
) -> steps.StepResult:
    """The store step's result with what people read on the materialization: where the store is
    published and the three lines that open it (``open``), then its preview (:func:`preview_of`;
    drawn by the step while it validated a new store, else here). Only for a published store."""
    if not res.ok or not res.metadata.get("store"):
        return res
    store = str(res.metadata["store"])
    drawn = {k: res.metadata.pop(k) for k in PREVIEW_KEYS if k in res.metadata}
    res.metadata["open"] = {"__markdown__": open_markdown_narrow(published, store, bool(storage_options))}
    res.metadata.update(drawn or preview_of(store, storage_options))
    return res


def store_bytes_as_built(res: steps.StepResult) -> list[C.CheckOutcome]:
    """store_bytes_match_manifest from the store step: a store is published only after the
    publication gate (``stage2_data.store.gate``) ran this check's validation on it (every file's
    sha256 against the manifest, the fingerprint, every chunk's crc32c, every sample decoded against
    its frames_sha256), so a published store's result is that check's, on what `current` names now.
    None for a store that was not published (`current` still names the one before, not re-read)."""
    if not res.ok or not res.metadata.get("store"):
        return []
    store = str(res.metadata["store"])
    what = C.CHECK_DESCRIPTIONS[C.STORE_BYTES_MATCH_MANIFEST].split(": ", 1)[1]
    return [
        C.outcome(
            C.STORE_BYTES_MATCH_MANIFEST,
            [],
            f"{store}: checked by this build's publication gate before it became current: "
            + what[0].lower()
            + what[1:],
            store=store,
            seconds=res.metadata.get("gate_seconds"),
        )
    ]


def build_store_assets(profile: Profile, kit: str) -> list[Any]:
    """The store's asset; ``kit``: :func:`steps.kit_digest`, in its code version."""

    @stage_asset(
        VIN_STORE,
        group=GROUP,
        description=(
            "stores/PROFILE/current: the immutable, versioned, sharded Zarr v3 VIN offline store. Its "
            "code version ends with a digest of what the writer reads from the profile (its name, "
            "repo, revision and max_frames) and of the kit's manifests, SHA256SUMS and the pins: an "
            "edit of those marks it stale until the next build."
        ),
        kind="zarr",
        code_version=code_version_with(
            VIN_STORE,
            {**profile.identity(), "max_frames": profile.max_frames, "kit": kit},
        ),
    )
    def vin_store(
        context: dg.AssetExecutionContext,
        profile: ProfileResource,
        data_root: DataRootResource,
        store_target: StoreTargetResource,
    ):
        prof = profile.load()
        yield from run_step(
            VIN_STORE,
            lambda: with_preview(
                steps.step_store(
                    prof,
                    data_root.root(),
                    store_url=store_target.url,
                    storage_options=store_target.storage_options,
                    # drawn while the new store is validated (the step keeps it if it publishes)
                    alongside=lambda url: preview_of(url, store_target.storage_options),
                    reverify=data_root.reverify,
                ),
                published_path(prof, data_root.root(), store_target.url),
                store_target.storage_options,
            ),
            # the store's data version: its folder name, a digest of its inputs
            lambda res: str(res.metadata.get("store") or "").rstrip("/").rsplit("/", 1)[-1] or None,
            context=context,
            standalone=store_bytes_as_built,
            data_root=data_root.root(),
        )

    return [vin_store]


def rebuild_into(instance: dg.DagsterInstance, data_root: Path) -> str:
    """What the store check's fix adds when its run's Dagster instance (the UI's, whose verify run
    shows the fix) is not the one a `stage2 build` of ``data_root`` records into by default
    (``<data_root>/.dagster``): the DAGSTER_HOME that rebuild needs for its runs, and this check's
    next result, to show in this UI. The instance's own folder, not this process's environment (a
    run may be given another instance); nothing for an ephemeral instance (no UI shows it)."""
    if instance.is_ephemeral:
        return ""
    home = Path(instance.root_directory).absolute()
    if home.resolve() == (Path(data_root) / ".dagster").resolve():
        return ""
    return (
        f" (run that `stage2 build` with DAGSTER_HOME={shlex.quote(str(home))} "
        "in front, so that its runs and this check's next result show in this UI)"
    )


def build_store_checks(vin_store: Any) -> list[Any]:
    """Checks that run on their own over the published store (the nightly verify job runs them;
    the UI's Checks tab can execute them at any time); nothing is rebuilt. The check holds the data
    root's lock as a step does (``data_root_step_lock``: shared, refused while a build writes): a
    build may be swapping `current` and removing old stores, and a failure clears the build's
    records (``verify_current_store``)."""

    @standalone_check(vin_store, C.STORE_BYTES_MATCH_MANIFEST)
    def store_bytes_match_manifest(
        context: dg.AssetCheckExecutionContext,
        profile: ProfileResource,
        data_root: DataRootResource,
        store_target: StoreTargetResource,
    ) -> dg.AssetCheckResult:
        prof = profile.load()
        with data_root_step_lock(data_root.root(), what=f"check {C.STORE_BYTES_MATCH_MANIFEST}"):
            res = steps.verify_current_store(
                prof,
                data_root.root(),
                store_url=store_target.url,
                storage_options=store_target.storage_options,
            )
            forget_on_failure(data_root.root(), [(res.name, res.passed)], VIN_STORE)
        description = res.description
        if not res.passed:
            description += rebuild_into(context.instance, data_root.root())
        return check_result(res.passed, description, res.metadata)

    return [store_bytes_match_manifest]
