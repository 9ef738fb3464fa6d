"""Is this bundle still the one that passed its gates? Checked before any runtime opens it.

Every bundle's manifest.json lists each of its files with its sha256 and size (zoo/bundle.py
`file_hashes`, written when the gates passed). A tool that opens a bundle (generate, bench, the runners)
re-hashes those files first and refuses a bundle that differs, because the runtimes do not: one flipped
byte in a Core AI `main.mlirb` loads and runs and prints different text, and a truncated one aborts the
whole process (SIGABRT inside the bytecode parser) before Python can say anything.

`verify_bundle(folder)` is the one check; `python -m zoo.verify` is its command line. The default hashes
every listed file. `fast=True` compares sizes of every file but hashes only the small ones (the manifest
records whole-file digests, so a sample of a large file has nothing to be compared with): it catches
missing and truncated files, not a flipped byte inside a large artifact.

A verified bundle is remembered for the life of the process by the stat of its files (size, mtime, inode),
so generate → runner → session does not hash the same unchanged files twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from zoo.bundle import MANIFEST, sha256_file
from zoo.errors import ZooError

FAST_HASH_LIMIT_BYTES = 4 << 20  # in fast mode, files up to this size are still hashed in full
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_verified: dict[Path, tuple] = {}  # bundle folder -> stat signature of the files that passed a full check


class DamagedBundle(ZooError):
    """A bundle whose files no longer match its manifest (or whose manifest is unusable)."""


@dataclass
class BundleCheck:
    """What a check found: `problems` is empty when every listed file matches."""

    folder: Path
    manifest: dict
    mode: str  # "full" | "fast"
    files: int = 0
    bytes: int = 0
    hashed: int = 0  # files whose sha256 was recomputed (all of them in full mode)
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.problems


def read_manifest(folder: Path) -> dict:
    """The bundle's manifest.json as a dict; a missing, unreadable or malformed one is a DamagedBundle."""
    folder = Path(folder)
    require_bundle_folder(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise DamagedBundle(f"{folder} has no {MANIFEST}: it is not a zoo bundle, or its manifest was lost.",
                            "pass a bundle folder made by `zoo convert` (e.g. exports/t5/litert-fp32); without its "
                            "manifest a bundle cannot be checked, so re-download or re-convert it.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise DamagedBundle(f"{path} is not valid JSON ({where}).", refetch_fix(folder)) from exc
    if not isinstance(manifest, dict):
        raise DamagedBundle(f"{path} holds a JSON {type(manifest).__name__}, not a manifest object.", refetch_fix(folder))
    return manifest


def require_bundle_folder(folder: Path) -> None:
    if not folder.exists():
        raise ZooError(f"Bundle folder {folder} does not exist.",
                       "pass the folder `zoo convert` printed in its summary table (e.g. exports/t5/litert-fp32).")
    if not folder.is_dir():
        raise ZooError(f"{folder} is a file, not a bundle folder.",
                       f"pass the folder that holds manifest.json (here perhaps {folder.parent}).")


def inspect_bundle(folder: Path, fast: bool = False, exact_contents: bool = False,
                   allow_links: bool = False) -> BundleCheck:
    """Compare every file the manifest lists with what is on disk; never raises for a file that differs
    (each difference is one line in `problems`), only for a manifest that cannot be read at all.

    `exact_contents` (publishing): also refuse files the manifest does not list (added after the gates
    passed) and symlinks, which could point outside the bundle — except with `allow_links`, for a bundle
    read back from the HF cache, whose files are links to the cache's blobs."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    signature = _stat_signature(folder.resolve())  # taken before hashing: a file changed meanwhile is re-checked
    check = BundleCheck(folder, manifest, "fast" if fast else "full")
    listed = _listed_files(manifest, check.problems)
    check.problems += _artifact_problems(manifest, listed)
    if exact_contents:
        check.problems += _unlisted_or_linked(folder, listed, allow_links)
    for rel, expected in listed.items():
        check.files += 1
        problem = _file_problem(folder, rel, expected, fast, check)
        if problem:
            check.problems.append(problem)
    if check.intact and not fast and signature is not None:
        _verified[folder.resolve()] = signature
    return check


def verify_bundle(folder: Path, fast: bool = False) -> BundleCheck:
    """Raise DamagedBundle unless every file listed in the manifest matches it (sha256 and size)."""
    folder = Path(folder)
    signature = _stat_signature(folder.resolve())
    if signature and _verified.get(folder.resolve()) == signature:
        return BundleCheck(folder, read_manifest(folder), "full (unchanged since verified)")
    check = inspect_bundle(folder, fast)
    if not check.intact:
        raise DamagedBundle(describe_damage(check), refetch_fix(folder, check.manifest))
    return check


def verify_artifact_in_bundle(artifact: Path, fast: bool = False) -> bool:
    """For runners: verify the bundle an artifact sits in, if it sits in one (a manifest next to it).

    The pipeline's own verify stage opens the artifact in a staging folder before any manifest exists:
    there is nothing to check against yet, so that is skipped (returns False)."""
    folder = Path(artifact).parent
    if not (folder / MANIFEST).is_file():
        return False
    check = verify_bundle(folder, fast)
    listed = check.manifest.get("files") or {}
    name = Path(artifact).name
    if not any(rel == name or rel.startswith(name + "/") for rel in listed):
        raise DamagedBundle(f"{artifact} is not listed in {folder / MANIFEST}, so it cannot be checked.",
                            refetch_fix(folder, check.manifest))
    return True


def describe_damage(check: BundleCheck) -> str:
    shown = "; ".join(check.problems[:4]) + (f"; and {len(check.problems) - 4} more" if len(check.problems) > 4 else "")
    return f"Bundle {check.folder} is damaged: it does not match its manifest ({shown})."


# ---------------------------------------------------------------- details


def _listed_files(manifest: dict, problems: list[str]) -> dict[str, dict]:
    """The manifest's `files` as {relative path: {sha256, bytes}}; malformed entries become problems."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        problems.append(f"{MANIFEST} lists no files (its 'files' entry is missing or empty), so nothing can be checked")
        return {}
    listed = {}
    for rel, entry in files.items():
        if not _is_inside(rel):
            problems.append(f"{MANIFEST} lists '{rel}', a path outside the bundle")
        elif not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])
                  and isinstance(entry.get("bytes"), int) and entry["bytes"] >= 0):
            problems.append(f"{MANIFEST} entry for '{rel}' has no valid sha256 and byte count")
        else:
            listed[rel] = entry
    return listed


def _unlisted_or_linked(folder: Path, listed: dict[str, dict], allow_links: bool) -> list[str]:
    problems = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink() and not allow_links:
            problems.append(f"{rel} is a symlink (a bundle holds only regular files)")
        elif path.is_file() and rel != MANIFEST and rel not in listed:
            problems.append(f"{rel} is not in the manifest (added after verification)")
    return problems


def _is_inside(rel: str) -> bool:
    path = PurePosixPath(rel)
    return bool(rel) and not path.is_absolute() and ".." not in path.parts and "\\" not in rel


def _artifact_problems(manifest: dict, listed: dict[str, dict]) -> list[str]:
    """The model itself must be among the checked files: a manifest that omits it would pass vacuously."""
    from zoo.targets import TARGET_NAMES, get_target

    target = manifest.get("target")
    if target not in TARGET_NAMES:
        return [f"{MANIFEST} names target '{target}', not one of {', '.join(TARGET_NAMES)}"]
    artifact = get_target(target).artifact
    if not any(rel == artifact or rel.startswith(artifact + "/") for rel in listed):
        return [f"{MANIFEST} does not list the artifact {artifact}"]
    return []


def _file_problem(folder: Path, rel: str, expected: dict, fast: bool, check: BundleCheck) -> str | None:
    path = folder / rel
    if not path.is_file():
        return f"{rel} is missing" if not path.exists() else f"{rel} is not a file"
    size = path.stat().st_size
    check.bytes += size
    if size != expected["bytes"]:
        kind = "truncated" if size < expected["bytes"] else "grown"
        return f"{rel} is {size} bytes, the manifest records {expected['bytes']} ({kind})"
    if fast and size > FAST_HASH_LIMIT_BYTES:
        return None
    check.hashed += 1
    actual = sha256_file(path)
    if actual != expected["sha256"]:
        return f"{rel} has sha256 {actual[:12]}…, the manifest records {expected['sha256'][:12]}… (its content changed)"
    return None


def _stat_signature(folder: Path) -> tuple | None:
    """Size, mtime and inode of the manifest and every file under the bundle: unchanged means the last
    full check still holds."""
    try:
        return tuple((p.relative_to(folder).as_posix(), s.st_size, s.st_mtime_ns, s.st_ino)
                     for p in sorted(folder.rglob("*")) if p.is_file() for s in [p.stat()])
    except OSError:
        return None


def refetch_fix(folder: Path, manifest: dict | None = None) -> str:
    """What to do about a damaged bundle: never run it; fetch or make it again."""
    manifest = manifest or {}
    remake = ""
    if manifest.get("model") and manifest.get("target") and manifest.get("precision"):
        remake = (f" or re-convert it (zoo convert model={manifest['model']} target={manifest['target']} "
                  f"precision={manifest['precision']})")
    return (f"do not run it (a damaged artifact can crash the runtime or silently compute wrong numbers): "
            f"re-download it{remake}; `python -m zoo.verify {folder}` re-checks it.")
