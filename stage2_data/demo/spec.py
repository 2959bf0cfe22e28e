"""What the demo contains: its cache keys, action sources, kit paths and the real profile's totals.

The spec names 8 real cache keys (AutoEval, RoboArena, RACER and the 5 LIBERO-256 success sets).
The real profile has 13; the other 5 are INVENTED here, in the same style, for sources without
action recovery. Task strings, trajectory counts per cache key and the split of action rows into
recovered / not recovered are invented too (only the ``FULL_*`` totals are real facts).
"""

from __future__ import annotations

from dataclasses import dataclass

GENERATOR_VERSION = 1
MARKER_NAME = ".demo-complete.json"
REPO_ID = "robometer/processed_datasets"
CACHE_TIMESTAMP = "2025-08-25T12:00:00"
PROFILE_NAME_SMALL = "stage2_core_v1_demo"
PROFILE_NAME_FULL = "stage2_core_v1_fullcard"

KIT_PAIR_MANIFEST = "manifests/phase2_remediation_pairs_v1.jsonl"
KIT_SUBSET_CHECKSUMS = "manifests/stage2_subset_SHA256SUMS"
KIT_ACTION_MANIFEST_DIR = "derived/action_manifests"
KIT_SIDECAR_ARCHIVE = "derived/action_sidecars_stage2_action_sidecar_v1.tar"
KIT_SIDECAR_ARCHIVE_SHA256 = KIT_SIDECAR_ARCHIVE + ".sha256"

QUARANTINED_ARCHIVE = "ykorkmaz_libero_failure_rfm_libero_goal_failure.tar"
QUARANTINE_REASON = "known-bad LIBERO Goal failure set; excluded from the active profile"
OTHER_ARCHIVE = "some_other_dataset.tar"
SPLIT_CACHE_KEY = "jesbu1_roboarena_0825_rfm_roboarena"
SPLIT_PARTS = ("part-aa", "part-ab")

# Totals of the real stage2_core_v1 profile (docs/spec/kit-format.md).
FULL_TRAJECTORIES = 53765
FULL_PAIR_ROWS = 2689
FULL_UNIQUE_FRAME_FILES = 4323
FULL_ACTION_ROWS = 23359
FULL_SIDECARS = {"autoeval": 5939, "libero_success": 1709, "roboarena": 12379, "racer": 593}

# Action-manifest row statuses.
STATUS_NO_ACTIONS = "source_has_no_actions"
STATUS_NO_CONSENSUS = "rejected_refinement_no_consensus"
STATUS_RECOVERED = "recovered"


def mode_name(full: bool) -> str:
    """The mode as the marker file and the profile description spell it."""
    return "full_cardinality" if full else "small"


@dataclass(frozen=True)
class ActionSourceSpec:
    name: str
    raw_width: int
    action_names: tuple[str, ...] | None
    convention: str
    rows_small: int
    recovered_small: int
    rows_full: int
    recovered_full: int
    pilot_task: str | None = None  # RACER: only this task was recovered (pilot)


@dataclass(frozen=True)
class CacheKeySpec:
    cache_key: str
    dataset_path: str
    subset: str
    data_source: str
    action_source: str | None
    prefixed: bool  # tar members under processed_datasets/<key>/ (True) or <key>/ (False)
    res_small: tuple[int, int]
    res_full: tuple[int, int]
    n_small: int
    n_full: int
    tasks: tuple[str, ...]
    is_robot: bool = True
    shards: int = 1


RACER_PILOT_TASK = "insert_onto_square_peg"

# fmt: off
ACTION_SOURCES: dict[str, ActionSourceSpec] = {
    "autoeval": ActionSourceSpec(
        "autoeval", 7, None,
        "autoeval_widowx_eef_delta_7d: upstream order, dimensions unnamed; do not reinterpret",
        20, 17, 6512, 5939,
    ),
    "libero_success": ActionSourceSpec(
        "libero_success", 7, None,
        "libero_osc_pose_delta_7d: upstream OSC_POSE order (6 deltas + gripper), unnamed",
        40, 34, 1762, 1709,
    ),
    "roboarena": ActionSourceSpec(
        "roboarena", 8, None,
        "droid_joint_position_7_plus_gripper_8d: upstream order, refined alignment, unnamed",
        26, 21, 14187, 12379,
    ),
    "racer": ActionSourceSpec(
        "racer", 9, ("x", "y", "z", "qx", "qy", "qz", "qw", "gripper_open", "ignore_collision"),
        "racer_keyframe_pose_9d", 12, 6, 898, 593, pilot_task=RACER_PILOT_TASK,
    ),
}
# fmt: on

_LIBERO_TASKS = (
    "put the bowl on the plate",
    "open the top drawer of the cabinet",
    "put the black bowl on top of the cabinet",
    "turn on the stove",
    "pick up the alphabet soup and place it in the basket",
    "put both moka pots on the stove",
)
_BIG = (48, 64)
_SMALL = (32, 32)
_FULL_A = (4, 4)
_FULL_B = (4, 6)

# Columns: cache_key, dataset_path, subset, data_source, action source, prefixed layout,
# resolution (small), resolution (full), trajectories (small), trajectories (full), tasks.
# fmt: off
CACHE_KEYS: tuple[CacheKeySpec, ...] = (
    CacheKeySpec("jesbu1_auto_eval_rfm_auto_eval_rfm", "jesbu1/auto_eval_rfm", "auto_eval_rfm", "auto_eval",
                 "autoeval", False, _BIG, _FULL_B, 24, 7200,
                 ("open the drawer", "close the drawer", "put the eggplant in the sink", "flip the pot upright")),
    CacheKeySpec("jesbu1_roboarena_0825_rfm_roboarena", "jesbu1/roboarena_0825_rfm", "roboarena", "roboarena",
                 "roboarena", True, _BIG, _FULL_B, 30, 18000,
                 ("put the marker in the cup", "wipe the table with the towel", "stack the blocks",
                  "move the banana to the plate", "close the laptop"), shards=2),
    CacheKeySpec("jesbu1_racer_rfm_racer_train", "jesbu1/racer_rfm", "racer_train", "racer",
                 "racer", True, _SMALL, _FULL_A, 18, 2400,
                 (RACER_PILOT_TASK, "put_item_in_drawer", "stack_blocks", "close_jar")),
    CacheKeySpec("abraranwar_libero_rfm_libero256_90", "abraranwar/libero_rfm", "libero256_90", "libero_90",
                 "libero_success", True, _SMALL, _FULL_A, 20, 4000, _LIBERO_TASKS),
    CacheKeySpec("abraranwar_libero_rfm_libero256_10", "abraranwar/libero_rfm", "libero256_10", "libero_10",
                 "libero_success", False, _SMALL, _FULL_A, 12, 400, _LIBERO_TASKS[:4]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_goal", "abraranwar/libero_rfm", "libero256_goal", "libero_goal",
                 "libero_success", True, _SMALL, _FULL_A, 14, 430, _LIBERO_TASKS[1:5]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_object", "abraranwar/libero_rfm", "libero256_object",
                 "libero_object", "libero_success", False, _SMALL, _FULL_A, 14, 450, _LIBERO_TASKS[2:6]),
    CacheKeySpec("abraranwar_libero_rfm_libero256_spatial", "abraranwar/libero_rfm", "libero256_spatial",
                 "libero_spatial", "libero_success", True, _SMALL, _FULL_A, 14, 440, _LIBERO_TASKS[:3]),
    # ---- invented (the spec names only the 8 keys above) ----
    CacheKeySpec("jesbu1_toto_rfm_toto", "jesbu1/toto_rfm", "toto", "toto", None, False, _BIG, _FULL_B, 16, 2900,
                 ("pour the cup", "scoop the beans")),
    CacheKeySpec("jesbu1_soar_rfm_soar", "jesbu1/soar_rfm", "soar", "soar", None, True, _BIG, _FULL_B, 22, 8000,
                 ("put the spoon in the pot", "move the cloth to the left", "open the microwave")),
    CacheKeySpec("jesbu1_utd_so100_clean_rfm_utd_so100_clean", "jesbu1/utd_so100_clean_rfm", "utd_so100_clean",
                 "utd_so100_clean", None, False, _BIG, _FULL_B, 14, 1100,
                 ("pick up the red cube", "push the cube to the goal")),
    CacheKeySpec("aliangdw_metaworld_rfm_metaworld_train", "aliangdw/metaworld_rfm", "metaworld_train",
                 "metaworld", None, True, _SMALL, _FULL_A, 20, 2200,
                 ("button-press-v2", "drawer-open-v2", "door-open-v2", "reach-v2")),
    CacheKeySpec("jesbu1_epic_rfm_epic", "jesbu1/epic_rfm", "epic", "epic", None, False, _BIG, _FULL_B, 16, 6245,
                 ("cut the onion", "wash the plate", "open the fridge"), is_robot=False),
)

# Upstream archives outside the active profile: the quarantined failure set and a foreign dataset.
QUARANTINED_SPEC = CacheKeySpec(
    "ykorkmaz_libero_failure_rfm_libero_goal_failure", "ykorkmaz/libero_failure_rfm", "libero_goal_failure",
    "libero_goal_failure", None, True, _SMALL, _FULL_A, 6, 6, _LIBERO_TASKS[1:5],
)
OTHER_SPEC = CacheKeySpec(
    "some_other_dataset", "someone/other_dataset", "other", "other", None, False, _SMALL, _FULL_A, 3, 3,
    ("do something else",),
)
# fmt: on
