"""The fault matrix's rows (``FAULTS``), and their rendering as the README's Markdown table.

Each row is one test of tests/test_faults_*.py: a test named ``test_fault_<id>``, or one case (pytest
id ``<id>``) of a parametrized ``test_fault_…`` test; tests/test_faults_table.py checks both ways.
``python tests/faults_table.py`` prints the block that goes between the README's markers, and
tests/test_readme.py checks that README.md holds exactly this block, so the table cannot drift.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

BEGIN = "<!-- faults:begin -->"
END = "<!-- faults:end -->"
CATEGORIES = {
    "network": "Network and hub",
    "archive": "Archives",
    "kit": "Kit",
    "profile": "Profile",
    "store": "Store",
    "process": "Process",
    "secrets": "Secrets",
}


@dataclass(frozen=True)
class Fault:
    id: str
    category: str
    fault: str
    sees: str
    kept: str
    rerun: str


FP = "fingerprint = clean build's; no GET of a verified archive"
FAULTS: tuple[Fault, ...] = (
    # ----- network and hub ---------------------------------------------------------------------
    Fault(
        "net_drop",
        "network",
        "the connection drops mid-file",
        "nothing fails: a warning, then the download resumes with an HTTP Range request from the bytes already written (at most the client's last 10 MiB chunk is fetched again)",
        "the partial file (archives/.partial/), resumed, then verified",
        "(not needed: the run succeeds)",
    ),
    Fault(
        "net_corrupt",
        "network",
        "the server sends right-length wrong bytes",
        "check archive_sha256_matches_pin fails: sha256 mismatch for <archive>: expected, got; fix: re-run to download it again",
        "nothing: the bad download is deleted; no archive, no record",
        FP,
    ),
    Fault(
        "net_404",
        "network",
        "404 for an archive",
        "'<archive>' does not exist in <repo> at revision <commit>; fix: check the archive path; `stage2 pin <profile> --check` lists every archive missing upstream; exit 2; no check is failed (the hub's answer, not the archive's bytes)",
        "nothing (no partial file)",
        "the archive downloads; the cache key extracts",
    ),
    Fault(
        "net_bad_revision",
        "network",
        "the pinned revision does not exist on the hub",
        "revision <commit> of <repo> does not exist at <endpoint>; fix: set [source] revision to an existing commit",
        "nothing",
        "the archive downloads",
    ),
    Fault(
        "net_branch",
        "network",
        "a branch name instead of a commit in the profile",
        "`stage2 build` exits 2 before any request: key 'source.revision': 'main' is not a full 40-hex commit",
        "nothing; the data root is not even created",
        "the build starts",
    ),
    Fault(
        "net_unreachable",
        "network",
        "the hub is unreachable",
        "after 5 attempts with backoff: hub unreachable at <endpoint> (ConnectError); fix: check the network and --endpoint",
        "nothing",
        "not rerun here: nothing is kept to repair (the download itself is net_404's rerun)",
    ),
    Fault(
        "net_retry_after",
        "network",
        "the hub answers 429 (or 503) with `Retry-After`, in seconds or as an HTTP-date",
        "nothing fails: a warning 'retrying in Ns (the hub's Retry-After)', then the download goes on; a Retry-After beyond the cap (300 s, STAGE2_MAX_RETRY_AFTER) fails at once: the hub … asks to retry after N s (at <UTC time>); fix: re-run after <UTC time>",
        "nothing requested again until the wait is over; no partial file is lost",
        "the archive downloads (verified archives are not requested again)",
    ),
    Fault(
        "net_pin_transient",
        "network",
        "a transient 500 while `stage2 pin` resolves the revision and lists the repository",
        "nothing fails: `stage2 pin` retries by the same policy as the downloads (one retry policy for every command)",
        "the profile is written once, complete",
        "(not needed: the run succeeds)",
    ),
    Fault(
        "net_hf_endpoint",
        "network",
        "`HF_ENDPOINT` set and no `--endpoint` given",
        "nothing fails: `stage2 pin` talks to `HF_ENDPOINT` (an explicit --endpoint wins); an unreachable one is named in the message",
        "nothing",
        "(not needed: the run succeeds)",
    ),
    Fault(
        "net_offline",
        "network",
        "`HF_HUB_OFFLINE=1`",
        "verified archives are used without a request; a missing one: HF_HUB_OFFLINE is set and 1 archive(s) are not on disk: <path>; nothing was requested; `stage2 build` says so for every missing archive at once, in one message, before any run (exit 2); `stage2 pin`: needs the hub …, HF_HUB_OFFLINE is set",
        "nothing; no request reaches the hub",
        "unset HF_HUB_OFFLINE: the missing archive downloads",
    ),
    Fault(
        "net_lying_length",
        "network",
        "the download answer's `Content-Length` (or HEAD size) disagrees with the pin while the hub's listing agrees with it",
        "the hub at <endpoint> sent Content-Length N for <archive> …, the profile pins M bytes, and the hub's own listing at <commit> agrees with the pin: the download answer is wrong, not the pin; fix: check --endpoint / HF_ENDPOINT and any proxy; never 'run stage2 pin' (it would change nothing)",
        "nothing: no archive, no record",
        FP + " (the answer repaired)",
    ),
    Fault(
        "net_html_page",
        "network",
        "an HTML page (a login, consent or error page) served for an archive",
        "the hub at <endpoint> answered the download of <archive> with an HTML page (Content-Type text/html …), not the archive's bytes: a login, consent or error page; fix: check the token (HF_TOKEN), the endpoint and any proxy",
        "nothing: no archive, no record",
        FP + " (the answer repaired)",
    ),
    Fault(
        "net_redirect_dead",
        "network",
        "the hub redirects a download to a host that cannot be reached",
        "after 5 attempts: <host> could not be reached (ConnectError …); the hub at <endpoint> answered and redirected the request there; fix: check that this machine may reach <host> (network, firewall, proxy)",
        "nothing: no archive, no record",
        FP + " (the redirect repaired)",
    ),
    # ----- archives ----------------------------------------------------------------------------
    Fault(
        "arc_truncated",
        "archive",
        "a truncated archive (pinned as such upstream)",
        "archive <name> is truncated or corrupt: member <m> needs bytes up to N but the data ends at M; fix: it is the pinned upstream file (its sha256 matches the pin), so downloading it again gives the same bytes: list it under [[quarantined]] and report it upstream",
        "the verified download; nothing extracted",
        FP + " (the repaired archive is downloaded again)",
    ),
    Fault(
        "arc_missing_part",
        "archive",
        "a split archive missing a part (locally, or left out of the profile)",
        "split part <base>.part-ab is missing; or: truncated or corrupt, 'the split parts (…part-aa) may be incomplete, missing or out of order'",
        "the parts present; nothing extracted",
        "the part downloads; the cache key extracts",
    ),
    Fault(
        "arc_parts_order",
        "archive",
        "split parts out of order",
        "listed out of order in the profile: nothing, parts are read in name order; contents swapped upstream: truncated or corrupt, 'may be … out of order'",
        "the verified parts; nothing extracted",
        "the repaired parts download again (the verified ones are not) and extract",
    ),
    Fault(
        "arc_absolute",
        "archive",
        "a member with an absolute path",
        "unsafe archive <name>: member '/…' has an absolute path. Nothing was extracted. Fix: … if it is the pinned upstream file, list it under [[quarantined]] and report it upstream",
        "the verified download; no cache directory, no temp folder",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_dotdot",
        "archive",
        "a member with `..`",
        "unsafe archive <name>: member '<key>/../../…' has a '..' path component",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_link",
        "archive",
        "a symlink or a hard link pointing outside",
        "member '…' is a symbolic link (-> '/etc/passwd'); links are refused (hard links likewise)",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_device",
        "archive",
        "a device or FIFO member",
        "member '…' is a character device / is a FIFO",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_duplicate",
        "archive",
        "a duplicate member",
        "member '…' is a duplicate: same path as the earlier member '…'",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_extra_top",
        "archive",
        "an extra top-level folder that is not the cache key",
        "member 'other_folder/…' is outside the cache directory: top-level entry 'other_folder' is neither <key> nor processed_datasets/<key>",
        "as above",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_info_totals",
        "archive",
        "`dataset_info.json` totals disagree with the files",
        "check cache_dir_counts_consistent fails: <key>: dataset_info.json total_trajectories=N+1 but N frame files; a later run of the final stage fails extraction_report the same way",
        "the extracted folder (for inspection); no store",
        "the repaired archive (only it) downloads again; the cache key extracts",
    ),
    Fault(
        "arc_part_spelling",
        "archive",
        "split parts named `.tar.partaa`, `.tar.partab` (upstream's other spelling) instead of `.tar.part-aa`",
        "nothing fails: both spellings are split parts of one tar; mixing the two in one archive is refused by name",
        "the verified parts; the cache key extracted",
        "(not needed: the run succeeds; the extracted folder equals the one from the `.part-aa` spelling)",
    ),
    Fault(
        "arc_compressed",
        "archive",
        "a `.tar` that is gzip-compressed upstream (or zstd, bzip2, xz: the magic bytes are read), pinned as such",
        "archive <name> is not a tar: its bytes are gzip-compressed (it starts with 1f 8b …); fix: pin the upstream's uncompressed tar, or list it under [[quarantined]]; never 'download it again' (the same bytes would come)",
        "the verified download; nothing extracted",
        FP + " (the repaired archive is downloaded again)",
    ),
    Fault(
        "arc_wrong_cache_key",
        "archive",
        "a profile entry whose cache_key is not the folder its archive holds",
        "archive <name> holds the cache directory '<key>', but the profile lists it for cache_key '<other>'. Nothing was extracted; fix: set cache_key = \"<key>\" in the profile",
        "the verified download; nothing extracted",
        "the profile corrected: the cache key extracts, nothing is downloaded again",
    ),
    Fault(
        "arc_non_utf8_name_in_cache_dir",
        "archive",
        "a user's file whose name is not UTF-8 (`x\\xfe.npz`) in a cache directory",
        "nothing fails: the file is moved aside as one the extraction did not write; `moved aside:` shows the name with \\xfe, moved.json records it (was: `internal error: UnicodeEncodeError`, exit 1, the move unrecorded)",
        "the user's file, under quarantine/",
        FP,
    ),
    Fault(
        "arc_extracted_edit",
        "archive",
        "a same-size edit of an extracted file (an arrow file's task text), its mtime restored",
        "nothing fails: its ctime changed, so it is hashed again; its sha256 is not the one the extraction recorded, so the cache directory is extracted again from its verified archive (the step's extracted_because names the file)",
        "the verified archive; the edited file is replaced by the archive's",
        FP,
    ),
    Fault(
        "arc_extracted_flip_reverify",
        "archive",
        "a flipped byte of an extracted frame file with its extraction record forged to match (its stats, its sha256, the record's digests), then `build --reverify`",
        "nothing fails: --reverify trusts no record of the build's own and extracts every cache directory again from its verified archives (the extract line says so); the flipped file, not what its extraction wrote, is moved aside",
        "the verified archive; the flipped file, under quarantine/",
        FP,
    ),
    Fault(
        "arc_verified_record_forged",
        "archive",
        "a verified archive with a byte flipped and its `.verified.json` forged to match (its new stats, the pin's sha256), its cache directory's extraction record removed",
        "`sha256 mismatch for <archive>: expected <pin>, got <sha>, though its record <.verified.json> said it was verified (hashed again before extraction: no step of this build had hashed it)`: an extraction hashes again every archive no step of its build hashed; nothing is extracted from it",
        "the flipped archive and its record, under quarantine/; the cache directory as it was",
        "exit 1; the next build downloads the archive again: fingerprint = clean build's",
    ),
    Fault(
        "kit_sidecar_flip_reverify",
        "kit",
        "a flipped byte of an unpacked action sidecar with the unpack's index and record forged to match (its stats, its sha256, the content digest), then `build --reverify`",
        "nothing fails: --reverify unpacks the sidecars again from the kit's verified tar, and no record says which old files were the unpack's: the flipped file, not what the unpack writes, is moved aside",
        "the kit's tar; the flipped file, moved aside",
        FP,
    ),
    Fault(
        "arc_dup_trajectory_ids",
        "archive",
        "a new cache directory repeating the trajectory ids of another",
        "check cache_dirs_match_expected fails: <new cache dir> repeats N trajectory id(s) of <other cache dir>: <ids> (… counted twice; fix: remove one cache key from the profile …)",
        "both extractions; no store",
        "the cache key removed from the profile: its folder is moved to unused/ (arc_removed_cache_key); "
        + FP,
    ),
    Fault(
        "arc_removed_cache_key",
        "archive",
        "a cache key removed from the profile (README: a full rebuild), and a folder of one's own in processed_datasets/",
        "nothing fails for the build's own leftover: it is moved to unused/processed_datasets/<key>[.N]/ (its record to unused/reports/extraction/; never overwritten, nothing deleted; the step's moved_aside says where); a folder the build did not make fails no_stray_entries: <path>: not a cache directory of the profile, nor one this build extracted",
        "the leftover cache directory (moved aside) and the user's folder (untouched)",
        "the user's folder moved out: " + FP,
    ),
    Fault(
        "arc_pin_typo",
        "archive",
        "a typo in one pin's `sha256` or `size` in the profile, with a verified archive on disk and the hub reachable",
        'the pin <profile>: archives[i].sha256 = "…" is wrong: the verified file <path> holds N bytes with sha256 …, and the hub\'s listing at <commit> lists the same size and sha256 for it. The file was left where it is; nothing was downloaded; fix: correct the pin to the upstream value (named)',
        "the verified archive, byte-identical, and its record; nothing moved or deleted",
        "the pin corrected: " + FP,
    ),
    Fault(
        "arc_pin_typo_offline",
        "archive",
        "the same pin typo with `HF_HUB_OFFLINE=1` (the archive on disk is the only copy)",
        "HF_HUB_OFFLINE is set and <path> … disagrees with its pin …: it was moved to <data_root>/quarantine/<UTC time>/archives/<archive> (not deleted); nothing was requested; fix: if the pin is wrong, correct it and move the file back (mv …), else unset HF_HUB_OFFLINE",
        "the archive and its record, moved to the quarantine folder; nothing deleted",
        "the pin corrected and the file moved back: the offline build converges; fingerprint = clean build's",
    ),
    Fault(
        "arc_not_a_file",
        "archive",
        "a folder holding a user's note, or a FIFO, where a verified archive goes",
        "nothing fails: it is moved aside whole (the folder with what it holds), said in `moved aside:`, and the archive downloaded (was: a raw IsADirectoryError after the download; a FIFO replaced silently)",
        "the folder or FIFO, in the quarantine folder",
        FP + " but the one that was not a file",
    ),
    Fault(
        "arc_ctime_edit",
        "archive",
        "a verified archive's bytes edited in place with its size and mtime restored",
        "nothing fails: the ctime moved, so its record no longer covers it; it is re-hashed, found wrong (the hub's listing agrees with the pin), moved to the quarantine folder (a warning says where) and downloaded again",
        "the edited file, in the quarantine folder",
        "(not needed: the run succeeds) " + FP + " but the edited one",
    ),
    Fault(
        "arc_disk_full_build",
        "archive",
        "the disk fills up while `stage2 build` downloads an archive",
        "`stage2 build` exits 2: disk full while writing <partial file> (<archive>): N of M written, K still to come, F free there; fix: free disk space there (at least K) or choose another --data-root, and re-run: the download resumes",
        "the partial file (archives/.partial/)",
        "space freed: the download resumes; fingerprint = clean build's",
    ),
    Fault(
        "arc_quarantine_gc",
        "archive",
        "files in the data root's quarantine folder",
        "`stage2 list` shows each (its original path and size, text and --json `quarantine`); `stage2 gc` never touches them; `stage2 gc <data_root>/stores --quarantine [--dry-run]` removes them (or says what it would), one line per file and a total",
        "everything, until `gc --quarantine` is asked",
        "(not needed: nothing failed)",
    ),
    # ----- kit ---------------------------------------------------------------------------------
    Fault(
        "kit_sidecar_tar_sha",
        "kit",
        "the sidecar tar's sha256 does not match its .sha256",
        "check sidecar_tar_sha256_matches fails: sha256 mismatch for <tar>: expected, got; fix: re-copy it from the kit",
        "the sidecars unpacked before; nothing downstream runs",
        "every check before the store passes again",
    ),
    Fault(
        "kit_bad_json",
        "kit",
        "a malformed JSON line",
        "check join_has_no_problems fails: <pairs file>:<line>: malformed JSON (…)",
        "no store",
        FP,
    ),
    Fault(
        "kit_dup_pair",
        "kit",
        "a duplicate pair id",
        "<pairs file>:<line>: duplicate pair_id 'p…' (first on line N)",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_leak",
        "kit",
        "a trajectory used in two splits",
        "<pairs file>:<line>: leakage: trajectory <id> is used by a 'val' pair here and by a 'train' pair on line N",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_missing_sidecar",
        "kit",
        "a recovered row whose sidecar is missing",
        "<manifest>:<line>: trajectory <id> is 'recovered' but its sidecar <path> is missing",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_unknown_sidecar",
        "kit",
        "a sidecar for an unknown trajectory",
        "<path>: sidecar file for trajectory <id> that no action manifest row names",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sidecar_width",
        "kit",
        "a sidecar whose width contradicts its source",
        "<sidecar> (trajectory <id>, <manifest>:<line>): raw action width 7 contradicts source 'roboarena' width 8",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sha256sums",
        "kit",
        "a `SHA256SUMS` digest that does not match",
        "check subset_bytes_match_sha256sums fails: <frames file>: expected <digest>, actual <digest>",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sidecar_nonfinite",
        "kit",
        "a recovered sidecar whose actions hold NaN or ±inf (NaN is also the store's padding)",
        "check join_has_no_problems fails: <sidecar trajectory_<id>.npz>: aligned_actions holds 2 non-finite value(s) (NaN or inf; first at row 1, column 0): recovered actions must be finite numbers",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sidecar_alignment",
        "kit",
        "a sidecar inconsistent with itself: an alignment index outside its raw actions, an aligned row that is not the raw row it indexes",
        "check join_has_no_problems fails: <sidecar>: alignment_indices[i] = N is outside raw_actions' M rows / aligned_actions row 0 differs from raw_actions row k that alignment_indices[0] names",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_frames_npz",
        "kit",
        "a frames `.npz` with the wrong dtype or shape (in the archive, with SHA256SUMS agreeing)",
        "check store_opens_with_strict_reader fails: <frames file>: 'frames' has dtype float32; expected uint8 / has shape (T, H, W, 4); expected (T, H, W, 3)",
        "no store, no staging folder",
        FP + " (the repaired archive is downloaded again)",
    ),
    Fault(
        "kit_npz_object",
        "kit",
        "an `.npz` holding object arrays (never unpickled)",
        "<sidecar>: key(s) aligned_actions hold object (pickled) arrays; refused, not unpickled",
        "no store; the pickle's payload never ran",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sums_spellings",
        "kit",
        "the subset SHA256SUMS as `sha256sum` writes it from another folder or with other flags: `./` paths, absolute paths, paths from a parent folder or from inside processed_datasets/, `--tag`, `--binary`, `-z`, escaped lines, upper-case hex, CRLF, repeated lines",
        "nothing fails: every name is matched to its file under the data root; a name listed again with another sha256 is named with both lines",
        "nothing",
        "(not needed: the check passes)",
    ),
    Fault(
        "kit_path_newline",
        "kit",
        "a frames path in the pair manifest ending in a newline (`…trajectory_<ID>.npz\\n`)",
        "<pairs>:<line>: pair '<id>': chosen_frames_path '…npz\\n' is not processed_datasets/<cache_key>/frames/trajectory_<ID>.npz (every path pattern is anchored with \\Z)",
        "no store",
        "every check before the store passes again",
    ),
    Fault(
        "kit_sidecar_edit",
        "kit",
        "an unpacked sidecar `.npz` edited in place, its size and mtime restored",
        "nothing fails: its ctime changed, so it is hashed again; its sha256 is not the one the unpack recorded, so the sidecars are unpacked again from the kit's verified tar",
        "the kit's tar; the edited sidecar is replaced by the tar's",
        FP,
    ),
    Fault(
        "kit_not_regular",
        "kit",
        "a kit file (`SHA256SUMS`, the sidecar tar's `.sha256`) that is a FIFO, a folder or a device",
        "exit 2 at once (`stage2 build`, `stage2 verify --bytes`): profile <file>: [kit] <key>: <path> is a FIFO / a folder / a character device, not a regular file; nothing opens it (a FIFO would block)",
        "everything",
        "the kit file put back: " + FP,
    ),
    Fault(
        "kit_sums_other_release",
        "kit",
        "the kit's `SHA256SUMS` disagrees with a frame file that is exactly what its pinned, verified archive holds",
        "check subset_bytes_match_sha256sums fails: <sums>:<line>: <frames file> has sha256 <actual>, expected <digest>; the file is exactly what the pinned archive(s) <archive> hold …: the kit's SHA256SUMS <sums> and the profile's pinned archives disagree (the kit and the pins come from different releases; extracting again changes nothing) (fix: use the kit made from the pinned revision <commit>, or pin the revision the kit was made from)",
        "the extraction (not redone: it is intact); no new store",
        "the kit's SHA256SUMS put back: " + FP,
    ),
    # ----- profile -----------------------------------------------------------------------------
    Fault(
        "prof_unknown_key",
        "profile",
        "an unknown key",
        "`stage2 build` exits 2: invalid profile <file>: unknown key 'bogus'; remove it or check its spelling",
        "nothing; the data root is not created",
        "the build starts",
    ),
    Fault(
        "prof_quarantined_active",
        "profile",
        "a quarantined path also listed as active",
        "key 'quarantined[0].path' (line <n>): '<file>' is also listed under [[archives]] … remove one "
        "of the two entries",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_archive_twice",
        "profile",
        "one [[archives]] entry written twice",
        "key 'archives[1].path' (line <n>): '<file>' is listed twice (also as archives[0].path); remove "
        "one of the two entries",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_wrong_type",
        "profile",
        'a number written as `true`, text or a float (`size = true`, `cache_dirs = "13"`)',
        "`stage2 build` exits 2: key 'archives[0].size' = True (line 19): it must be a whole number "
        "(the key, its value and line named, never taken as 1 or 13)",
        "nothing; the data root is not created",
        "the build starts",
    ),
    Fault(
        "prof_dotdot",
        "profile",
        "a path with `..`",
        "key 'archives[0].path': '../…' contains '..'; use a plain relative path (kit paths likewise)",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_name_too_long",
        "profile",
        "a profile name of 300 characters",
        "key 'name' (line N): String should have at most 100 characters; fix: correct the named key (was: accepted, and the build failed at the store, after every download, with a raw [Errno 36] File name too long)",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_own_file_as_archive",
        "profile",
        "an archive's path naming a file stage2 keeps beside the archives (`X.tar.verified.json`, `.partial/…`)",
        "key 'archives[0].path' names a file stage2 keeps beside the archives … not an archive of the repository (was: the build judged its own record of a verified archive against the pin and moved it aside)",
        "nothing",
        "the build starts",
    ),
    Fault(
        "prof_totals",
        "profile",
        "expected totals that the data does not reach",
        "check trajectories_match_expected fails: trajectories is N, expected N+1 (fix the data, or the profile's [expected] table)",
        "no store",
        "fingerprint = clean build's",
    ),
    Fault(
        "prof_unknown_archive",
        "profile",
        "an `[[archives]]` entry whose upstream name is not known (`unknown = true`, as the shipped profile's 5 unconfirmed cache keys)",
        "nothing is requested under the guessed name: the download refuses (… is marked unknown = true …); `stage2 pin` names, for each, the closest archives in the hub's listing and exits 1",
        "nothing; the profile's known entries are pinned by `stage2 pin --write`",
        "with path and cache_key set to the hub's name and `unknown = true` deleted, `stage2 pin` pins it and it downloads",
    ),
    Fault(
        "prof_kit_root_missing",
        "profile",
        "`--kit-root` a folder that does not exist, or a file",
        "`stage2 build` exits 2 before any work: --kit-root <path> does not exist (or is not a folder); fix: pass an existing folder to --kit-root, or leave it out (the kit is then the profile's own folder); a relative path says the working folder it was taken from",
        "nothing; the data root is not created",
        "an existing kit root (or none: the profile's folder): the build starts",
    ),
    Fault(
        "prof_kit_path_typo",
        "profile",
        'one `[kit]` path that names no file (a typo: `pair_manifest = "manifests/nope.jsonl"`)',
        "`stage2 build` exits 2 before any download: 1 of the kit's 5 files are missing: [kit] pair_manifest = '<path>' (line <n>): <resolved path> does not exist; fix: correct the path under [kit] in <profile>, or put the kit's file there",
        "nothing; the data root is not created",
        "the path corrected: the build starts",
    ),
    Fault(
        "prof_kit_root_wrong",
        "profile",
        "`--kit-root` an existing folder that holds none of the kit's files (the wrong folder), or a profile copied away from its kit",
        "`stage2 build` exits 2 before any work: the kit root <folder> holds none of the kit's files (missing: each one, with its path); fix: pass --kit-root the folder holding the kit",
        "nothing; the data root is not created",
        "the kit's folder as --kit-root: the build starts",
    ),
    Fault(
        "prof_hub_folder_missing",
        "profile",
        "`--hub-folder` (the folder a loopback hub serves) that does not exist; `stage2 serve-hub` on one, or with a short revision or a repo id without a slash",
        "exit 2 before anything is served or downloaded, one line naming the argument and the fix (not an internal error)",
        "nothing; the data root is not created",
        "an existing folder: the build starts, the hub serves",
    ),
    Fault(
        "prof_keep_text",
        "profile",
        "`STAGE2_KEEP_STORES=abc` (the retention setting, not a number)",
        "`stage2 build` and `stage2 demo` exit 2 before any work, as `stage2 gc` does: STAGE2_KEEP_STORES='abc' is not a number of stores; fix: set STAGE2_KEEP_STORES to an integer >= 0 …, or 'all'",
        "nothing; the data root is not created",
        "a number: the build starts",
    ),
    Fault(
        "prof_keep_negative",
        "profile",
        "`STAGE2_KEEP_STORES=-1`",
        "exit 2 before any work (build, demo and gc alike): STAGE2_KEEP_STORES='-1' is not a number of stores",
        "nothing; the data root is not created",
        "a number: the build starts",
    ),
    # ----- store -------------------------------------------------------------------------------
    Fault(
        "store_out_link",
        "store",
        "`stage2 preview --out` / `stage2 export-rrd --out` a symbolic link (to a file of the user's, or to a store's manifest.json)",
        "exit 2, one line: --out <path> is a symbolic link (to <target>): writing there would replace the link, not what it points at; fix: pass --out the link's target itself, or a new file name",
        "the link and its target, untouched",
        "a new file name: the file is written",
    ),
    Fault(
        "store_out_special",
        "store",
        "`--out` of `stage2 preview` / `export-rrd` a device (/dev/null) or a FIFO",
        "exit 2 at once (the FIFO is never opened): --out <path> is a character device (a FIFO), not a file to replace; a regular file there is replaced as before",
        "the device or FIFO",
        "a regular file: the file is written",
    ),
    Fault(
        "store_out_in_store",
        "store",
        "`--out` of `stage2 preview` / `export-rrd` inside a store (its own manifest.json, a new file in it, the `current` link) or in a data root's stores/",
        "exit 2: --out <path> is inside the store <store> (the data root's stores folder <dir>): a store is immutable …; fix: pass --out a path outside <store>",
        "the store, byte for byte; it still validates",
        "a path outside the store: the file is written",
    ),
    Fault(
        "store_merge_out",
        "store",
        "`stage2 merge --out` is a symbolic link, a FIFO, or a store already there (and a reader asked for a split the store has not)",
        "exit 2 before anything is read or written: --out <path> is a symbolic link / a FIFO / a store …; fix: pass --out a new folder name; `reader.split('validation')` raises StoreError naming the splits",
        "the link, its target and the existing store, byte for byte",
        "a new folder name: the merged store is written",
    ),
    Fault(
        "store_loader_split",
        "store",
        "a trainer's `Selection(store, split=…)` with a split the store does not have",
        "LoaderError before the store is opened: split '<name>' is not a split of a store; the splits are: train, val, test (or 'all' / None: every split); fix: pass split= one of …",
        "—",
        "a valid split selects",
    ),
    Fault(
        "store_loader_state",
        "store",
        "a trainer resumes from a malformed order state (a key missing, a value not an integer, a start past the epoch, not a dict)",
        "LoaderError naming what is wrong (the saved order state has no 'epoch'; start='4' is not an integer; start N is past the end of epoch E) and what a state holds; fix: pass the dict state_dict() returned, unchanged",
        "the order where it was",
        "the state as saved: the order resumes",
    ),
    Fault(
        "store_loader_resolution",
        "store",
        "a trainer's `Selection(store, resolutions=…)` with a resolution the split does not hold, or a malformed one (`'48by64'`, `(0, 64)`)",
        "LoaderError naming the resolutions the split holds: split train has no resolution 480x640; it holds 32x32 (41 samples), 48x64 (40 samples) (or: resolution '48by64' is neither (H, W) nor 'HxW'); fix: choose resolutions= among those the split holds (as (H, W) or 'HxW')",
        "—",
        "a held resolution, as `(H, W)` or `'HxW'`, selects",
    ),
    Fault(
        "store_loader_unconsumed",
        "store",
        "a trainer saves an order's state with `state_dict()` (no `consumed=`) after a DataLoader or PoolLoader has read ahead of the training loop",
        "LoaderError: state_dict() without consumed=, but the order has handed out N batches of epoch E; fix: pass consumed= the number of batches your training loop has taken from this iteration, e.g. state_dict(consumed=step + 1)",
        "the order where it was; no state saved at the read-ahead position",
        "`state_dict(consumed=step + 1)`: the resumed order continues with the first batch not trained on",
    ),
    Fault(
        "store_loader_other_store",
        "store",
        "a trainer resumes a saved order state on another store (a rebuild moved `current`), or from a state that holds no store fingerprint",
        "LoaderError naming both: the saved order state was saved on the store of fingerprint A; this order reads <folder> of fingerprint B; fix: resume on the store the state was saved on, or start from the beginning (a state without one: add its fingerprint if it is this store's)",
        "the order where it was",
        "on the store the state was saved on: the order resumes",
    ),
    Fault(
        "store_input_edited",
        "store",
        "an extracted file edited after the extract stage checked it, its size and mtime kept (the store's job run on its own, as the UI's Launch runs it, or an edit during a build)",
        "the join (and the store writer) check what they read against its record right before: refused, cache_dir[<key>]: <file> … changed since it was checked; fix: run `stage2 build` again (it re-extracts what changed, the edited file moved aside)",
        "no store: nothing built from the edited bytes, nothing published under the clean record's name",
        "the cache dir extracted again (the edit moved aside): fingerprint = clean build's",
    ),
    Fault(
        "store_join_edited",
        "store",
        "the join's table replaced after the join wrote it (a task's text edited, its mtime set back), then the store's job run on its own (the store's name digests the records and the kit, not the table)",
        "the writer reads the table's bytes only when they have the sha256 the join wrote beside it: refused, the trajectory join table changed since the join wrote it: <table>: sha256 … not the … the join recorded; fix: run `stage2 build` again (its store stage joins again)",
        "no store: nothing built from the edited table",
        "joined again: fingerprint = clean build's",
    ),
    Fault(
        "store_max_frames",
        "store",
        "trajectories longer than the profile's frame bound `max_frames` (default 32, upstream's; here the bound is set below the demo's lengths)",
        "check store_opens_with_strict_reader fails: <frames file>: trajectory <id> has N frames, more than max_frames 3 (…): repair or drop the trajectory, or raise max_frames in the profile; refused from the npz header, before any frame is inflated",
        "no store, no staging folder",
        "fingerprint = clean build's",
    ),
    Fault(
        "store_flipped_byte",
        "store",
        "one byte of a published store's shard flipped (bit rot: same size)",
        "every read of the sample raises StoreChecksumError: VIN offline store <store>: shard <shard>, array frames, sample <i> (<id>) (row r): … fail their crc32c; fix: rebuild it: stage2 build …; plain `stage2 validate` exits 1 naming the file and the sample",
        "the damaged store (never a wrong pixel returned)",
        "`stage2 build` rebuilds it: fingerprint = clean build's",
    ),
    Fault(
        "store_rare_long",
        "store",
        "a rare long trajectory among short ones (within the frame bound)",
        "nothing fails: shards group similar lengths (a shard's Tmax exceeds its shortest row by at most max(8, T/4) frames), so the long one gets its own shard and the short ones are not padded to it",
        "the store",
        "(not needed)",
    ),
    Fault(
        "gate_current_index_edited",
        "store",
        "a same-length edit of the published store's sample_index.jsonl, its mtime kept",
        "nothing fails: the next build sees the entry's new ctime, the publication gate hashes the file against the manifest, moves the store aside and builds it again; the step's update says where it went",
        "the damaged store, byte for byte, under <data_root>/quarantine/<UTC time>/stores/<profile>/",
        "(not needed: the build publishes the clean store; fingerprint = clean build's)",
    ),
    Fault(
        "gate_store_url_outside_the_data_root",
        "store",
        "the stores in a local folder outside the data root (--store-url file://...): a same-length edit of the published store's sample_index.jsonl, its mtime kept",
        "nothing fails: the next build sees the entry's new ctime, the publication gate hashes the file against the manifest, moves the store aside and builds it again; the step's update says where it went (was: an internal error, `current` left naming the damaged store)",
        "the damaged store, byte for byte, under <data_root>/quarantine/<UTC time>/stores/<profile>/",
        "(not needed: the build publishes the clean store; fingerprint = clean build's)",
    ),
    Fault(
        "gate_store_url_shared_by_two_builds",
        "store",
        "two data roots' builds writing one local stores folder (--store-url file://...) at once",
        "the second is refused at its store step (exit 2), naming the build that writes there and the fix, and touches nothing (was: the build whose gate failed removed the store the other had just published, `current` then naming nothing)",
        "every store in the folder, untouched; what the refused build built before its store step (archives, extraction, kit)",
        "wait for the other build to end, then run it again: it resumes at the store step (or give each build a --store-url of its own)",
    ),
    Fault(
        "gate_store_forged_consistently",
        "store",
        "the published store edited with its manifest made to match (a task's text, the file's sha256, the fingerprint; mtimes kept), then `build`",
        "nothing fails: the gate passes it (every byte agrees with its manifest), but the data root's ledger (`reports/published_stores.json`) holds another fingerprint for that folder, so the edited store is moved aside (`store update: rebuilt: the store already at <store> is not the store this data root published under its name (its content gives fingerprint <forged>; this data root published <clean> …): moved to <quarantine>`) and the clean store published",
        "the edited store, byte for byte, under quarantine/",
        FP,
    ),
    Fault(
        "gate_store_forged_consistently_no_ledger",
        "store",
        "the same forgery, and `reports/published_stores.json` removed, then `build`",
        "nothing fails: a store the ledger does not name is reused only when a store written anew from the inputs (a witness, removed after) gives its fingerprint; it does not, so it is moved aside (`… is not what its inputs give (… it was never published from this data root)`) and the clean store published and recorded; a clean store with no entry is reused after the same check (`this data root has no record of publishing it: written anew from its inputs, the same fingerprint`)",
        "the edited store, byte for byte, under quarantine/",
        FP,
    ),
    Fault(
        "gate_store_forged_consistently_reverify",
        "store",
        "the same forgery, the ledger forged to match, then `build --reverify`",
        "nothing fails: --reverify trusts none of the build's records (the ledger neither) and writes a store anew from the inputs (a witness, removed after); its fingerprint differs, so the edited store is moved aside (`store update: rebuilt: the store already at <store> is not what its inputs give (its content gives fingerprint <forged>, its inputs give <clean> (checked by --reverify)): moved to <quarantine>`) and the clean store published",
        "the edited store, byte for byte, under quarantine/",
        FP,
    ),
    Fault(
        "gate_failed_store_immutable",
        "store",
        "a published store that fails the gate (a frames chunk edited) and cannot be moved aside (`chattr +i`)",
        "the build exits 2: the store at <store> failed the publication gate (<what>), and it cannot be moved aside: <why>; nothing was built or published, and what `current` names is unchanged; fix: make it writable (`chattr -R -i` …), then build again (was: a bare `PermissionError: [Errno 1]`)",
        "the store, as it is; what the build verified before the store step",
        "`chattr -i`, then build: the store is moved aside and rebuilt; " + FP,
    ),
    Fault(
        "gate_kept_store_decode_fails",
        "store",
        "a store of the same inputs that is not current: a kept one the profile returns to, or the folder a build stopped by SIGTERM right after it appeared left behind; here with a changed frames chunk, size and mtime kept",
        "nothing fails: it is never re-published as is; the gate (every file hashed, every sample decoded) fails it, moves it aside, and a clean store is built and published",
        "the damaged store, under <data_root>/quarantine/",
        "(not needed: fingerprint = clean build's)",
    ),
    Fault(
        "gate_noop_sees_ctime",
        "store",
        "a byte of a published shard changed with its size and mtime restored, then a plain `stage2 build`",
        'not "up to date": the entry\'s ctime differs from the one the last passed gate recorded, so the store stage runs its gate, moves the store aside and publishes a clean one; the next build is a no-op',
        "the damaged store, under <data_root>/quarantine/",
        "(not needed: fingerprint = clean build's)",
    ),
    Fault(
        "gate_symlink_in_store",
        "store",
        "a frames chunk of the published store replaced by a symbolic link to an identical copy outside it (every byte read through it is right), then a plain `stage2 build`",
        'nothing fails, and the store is neither "up to date" nor reused: the publication gate fails a store holding anything but regular files and folders (a link, a FIFO, a device), naming each (<store>/<chunk>: a symbolic link to <copy>, not a regular file), before reading through it; the store is moved aside and a clean one published; a later edit of the outside copy changes nothing published',
        "the store with its link, under <data_root>/quarantine/; the outside copy, untouched",
        "(not needed: fingerprint = clean build's; the next build is a no-op)",
    ),
    Fault(
        "gate_other_store_under_its_name",
        "store",
        "a valid store of other inputs (another profile's, copied or restored) in the folder of this build's store: every file matches its own manifest",
        "nothing fails, and it is never reused nor published: its manifest names other inputs, so the gate fails it before reading its data, naming each difference (<store>/manifest.json: profile not this build's (name: <theirs>, this build <ours>)); it is moved aside and a clean store is built and published",
        "the other store, byte for byte, under <data_root>/quarantine/",
        "(not needed: fingerprint = clean build's)",
    ),
    Fault(
        "gate_store_disk_full",
        "store",
        "no room on the data root's disk for the store (everything else fits)",
        '`stage2 build` exits 2 (the build could not run, not a finding about the data): not enough free disk at <stores/<profile>/.tmp-…>: need N MiB, have M KiB; fix: free the difference there or choose another --data-root (a write that still runs out names the store\'s folder and "the disk is full")',
        "no store folder, no staging folder; `current` unchanged",
        "with room again: fingerprint = clean build's",
    ),
    Fault(
        "gate_store_without_manifest",
        "store",
        "the published store's manifest.json deleted",
        "nothing fails: the folder is no longer a store and not the user's to delete: moved aside to the quarantine folder (its reason: manifest.json missing), a clean store built and published; the summary's store update says where",
        "the folder, every file, under <data_root>/quarantine/",
        "(not needed: fingerprint = clean build's)",
    ),
    Fault(
        "gate_published_store_read_only",
        "store",
        "a user's tool writes into a published store",
        "the write fails (permission denied for a non-root user): every file and folder of a published store has its write bits off; `stage2 gc` still removes old stores (it gives their folders the write bit back first)",
        "the store",
        "(not needed)",
    ),
    # ----- process -----------------------------------------------------------------------------
    Fault(
        "proc_kill_extract",
        "process",
        "`stage2 build` killed with SIGKILL during extraction, while the 3rd cache key's temp folder is being filled (sent by the process to itself from an audit hook: the demo's keys extract in milliseconds, too fast to hit from outside)",
        "the process dies (exit -9)",
        "the keys already extracted; the half-written .<key>.tmp-<owner> folder (never read, removed by the rerun); no store",
        FP + " (whole `stage2 build`)",
    ),
    Fault(
        "proc_kill_store",
        "process",
        "`stage2 build` killed with SIGKILL while it writes the store (when the staging folder appears)",
        "the process dies (exit -9)",
        "everything up to the store; the staging folder .v2-….tmp-… (removed by the rerun); no `current`",
        FP + " (whole `stage2 build`)",
    ),
    Fault(
        "proc_two_builds",
        "process",
        "two builds started at once on one data root",
        "the second exits 2 at once: data root <dir> is in use by another build: pid N …; fix: wait for it (or kill N)",
        "the first build's work, untouched",
        "the rerun of the row above completes (the second build changed nothing)",
    ),
    Fault(
        "proc_disk_full",
        "process",
        "the disk runs out during a write (a real 64 MiB tmpfs mounted for the test, filled up while the download waits to retry; needs root, else skipped)",
        "disk full while writing <partial file> (<archive>); fix: free disk space and re-run; the download resumes",
        "the partial file",
        "the download resumes (HTTP Range) and verifies",
    ),
    Fault(
        "proc_read_only",
        "process",
        "a read-only data root (a read-only mount; permission denied likewise), or a file where the data root should be",
        "`stage2 build` exits 2 with one line, no traceback: cannot lock the data root <dir>: Read-only file system; fix: remount it read-write or choose another folder (a file: move or delete it)",
        "nothing",
        "a writable data root: the build starts",
    ),
    Fault(
        "proc_cfg_hash",
        "process",
        "a data root whose path holds ` #` (`run #2/data`)",
        "nothing fails: the generated dagster.yaml is written by a YAML serializer (the path one quoted scalar); the event log and step logs are inside that data root's .dagster",
        "—",
        "(not needed)",
    ),
    Fault(
        "proc_cfg_colon",
        "process",
        "a data root whose path holds `: ` (`a: b/data`)",
        "nothing fails: the build's instance is inside that data root; nothing is written beside it",
        "—",
        "(not needed)",
    ),
    Fault(
        "proc_cfg_newline",
        "process",
        "a data root whose path holds a newline",
        "nothing fails: the build's instance is inside that data root; nothing is written beside it",
        "—",
        "(not needed)",
    ),
    Fault(
        "proc_moved_root",
        "process",
        "a data root copied, then moved, then built again",
        "nothing fails: stage2's dagster.yaml is rewritten for the data root's place, so each build records its runs into its own .dagster; a dagster.yaml of the user's own (without stage2's first line) is kept",
        "the original's instance, untouched (every file's size and mtime)",
        "(not needed)",
    ),
    Fault(
        "proc_earlier_instance",
        "process",
        "a data root whose instance an earlier stage2 wrote, its dagster.yaml naming stage2's own event log and step-log classes (removed since)",
        "nothing fails: the dagster.yaml is rewritten to Dagster's own classes on the same files",
        "the earlier runs and their events, still in the instance the UI reads",
        "(not needed)",
    ),
    Fault(
        "proc_check_failed",
        "process",
        "a blocking check of the last stage fails (a kit SHA256SUMS line changed)",
        'exit 1: failed check subset_checksums:subset_bytes_match_sha256sums: <file>: expected <the digest in the sums file> … and the fix, in the text output and as one --json `errors` entry (with its `check`); never "internal error" or "a bug"',
        "no new store",
        "the sums file restored: fingerprint = clean build's",
    ),
    # ----- secrets -----------------------------------------------------------------------------
    Fault(
        "secret_token",
        "secrets",
        "a hub token given through the environment (--token-env)",
        "never shown: not in stdout/stderr, the Dagster event log or metadata, error messages (404, 401), the lock file, the store's manifest, or any file of the data root",
        "—",
        "the builds above ran with it",
    ),
)


_PLACEHOLDER_RE = re.compile(r"<([^<>\s][^<>]*)>")


def _cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, ``<placeholder>`` shown as ``‹placeholder›`` (a
    Markdown renderer would drop it as an unknown HTML tag)."""
    return _PLACEHOLDER_RE.sub(r"‹\1›", " ".join(text.split())).replace("|", "\\|")


def render_faults_table(faults: Iterable[Fault]) -> str:
    """The Markdown block (markers included): one table, rows grouped by category in table order."""
    rows = list(faults)
    lines = [
        BEGIN,
        "| | fault | what the user sees | what is kept | after the fix, a rerun |",
        "|---|---|---|---|---|",
    ]
    for cat, title in CATEGORIES.items():
        for r in (r for r in rows if r.category == cat):
            lines.append(
                f"| {title} | {_cell(r.fault)} | {_cell(r.sees)} | {_cell(r.kept)} | {_cell(r.rerun)} |"
            )
    lines.append(END)
    return "\n".join(lines) + "\n"


def readme_block(readme: Path) -> str | None:
    """The README's block between the markers (markers included), or None when they are absent."""
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return None
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END)
    return text[start:end] + "\n"


def main() -> int:
    sys.stdout.write(render_faults_table(FAULTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
