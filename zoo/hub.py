"""Hugging Face Hub downloads for the zoo: pinned, verified against the Hub's metadata, self-repairing.

    python -m zoo.hub check [MODEL]     # report broken cache entries of the repos the zoo uses
    python -m zoo.hub repair [MODEL]    # repair them (re-fetching what cannot be fixed in place)
    (also `zoo cache check|repair [MODEL]`; exit 1 while something stays broken)

Everything goes through huggingface_hub into the HF cache (`HF_HUB_CACHE`), never elsewhere. What the
Core AI guide (../shared/seeds/) records about multi-GB transfers shapes this module:

- A download is one *attempt* with one transport: Xet (hf-xet is pinned, and the Hub decides per file
  that it is Xet-backed) or plain HTTP. We never flip transports between retries of the same file:
  `HF_HUB_DISABLE_XET=1` does not bypass Xet on the server anyway, and a mixed attempt is what leaves a
  snapshot symlink on a sparse, incomplete blob. Before each retry the attempt's leftovers (`*.incomplete`)
  are removed, so nothing resumes with a `Range:` request (which hangs the Xet bridge).
- Xet transfers run in high-performance mode (`HF_XET_HIGH_PERFORMANCE=1` unless the user set it): chunked
  and parallel, resumable at chunk granularity from the Xet cache.
- After every fetch, each file is checked against the Hub's metadata for that commit (the tree listing
  huggingface_hub stores under `<repo cache>/trees/<commit>.json`; the blob's own name, which is the Hub's
  etag, when no listing is stored): size, sha256 for LFS/Xet files, git blob sha1 for small files. The
  broken states are detected (`check_repo_cache`) and repaired (`repair_repo_cache`): a leftover
  `.incomplete`, a dangling or cross-linked snapshot symlink (repointed to the complete blob when there is
  one), a blob of the wrong size, a sparse blob (apparent size right, holes inside), a hash mismatch
  (the bad blob is deleted and fetched again). What a repair in place cannot fix, a clean re-download of
  that repo's cache folder does; what that cannot fix is one ZooError.
- Offline, gated (401/403), a missing repo and a missing revision each end in one ZooError with the fix.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import ZooError

# hf_xet reads this when its session starts; it changes nothing for plain-HTTP files.
os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")

WEIGHT_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json",
                   # tokenizers travel with the weights (LLM bundles ship them)
                   "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
LEGACY_WEIGHT_PATTERNS = ["config.json", "pytorch_model*.bin", "pytorch_model.bin.index.json"]
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

RETRY_ATTEMPTS = 3          # per fetch; transient errors only (timeouts, dropped connections, 429, 5xx)
RETRY_BACKOFF_S = 2.0       # doubled after each failed attempt
VERIFIED_STAMP = ".zoo-verified.json"  # blob -> (size, mtime_ns, inode) of the bytes we last hashed OK


def require_pinned(repo_id: str, revision: str | None, allow_unpinned: bool = False) -> str:
    if revision and (_FULL_SHA.match(revision) or allow_unpinned):
        return revision
    raise ZooError(
        f"Hub weights for {repo_id} need a pinned revision (a 40-hex commit sha), got {revision!r}: "
        "a branch name can change under you and silently change the bundle.",
        "set model.variants.<variant>.hub.revision=<commit sha> (see the repo's history on the Hub), "
        "or ...hub.allow_unpinned=true to accept a moving revision knowingly.",
    )


def hub_reachable(timeout_s: float = 5.0) -> bool:
    """One quick request, so an offline machine hears "unreachable" at once instead of after the
    library's retries with backoff (~23 s)."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
        return True
    except Exception:  # DNS, refused, timeout, proxy: all mean "not reachable from here"
        return False


def transport() -> str:
    """The transport this process downloads Xet-backed files with: decided once, never per retry."""
    from huggingface_hub.utils._runtime import is_xet_available

    return "xet" if is_xet_available() else "http"


# ---------------------------------------------------------------- errors users act on


def offline_error(repo_id: str, revision: str, broken: str = "") -> ZooError:
    state = f"its cached copy is broken ({broken})" if broken else "it is not in the local cache"
    return ZooError(
        f"The Hugging Face Hub is unreachable (at {_endpoint()}) and {repo_id}@{revision[:12]}: {state}.",
        "run with network (zoo repairs the cache by itself), or offline with WEIGHTS=tiny / WEIGHTS=local:PATH "
        "(a folder with config.json + *.safetensors); to prepare a machine without network, download on one with "
        "network (hf download REPO --revision SHA), copy the HF cache over and set HF_HUB_OFFLINE=1.",
    )


def explain_hub_error(exc: BaseException, repo_id: str, revision: str | None, action: str = "download") -> ZooError:
    """One ZooError per failure a user can act on; the library's own message stays in the chain."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    at = f"{repo_id}@{revision[:12]}" if revision else repo_id
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError) or (isinstance(exc, HfHubHTTPError) and status == 403):
        return ZooError(
            f"The Hub refused access to {at} ({status}: gated or no permission for this token).",
            f"open {_endpoint()}/{repo_id} while logged in and accept its terms, then give zoo a token with access: "
            "`hf auth login` or HF_TOKEN=hf_... (a write token to publish).",
        )
    if isinstance(exc, RevisionNotFoundError):
        return ZooError(
            f"The Hub repo {repo_id} has no revision {revision!r}.",
            "pin an existing commit sha (the repo's 'Files and versions' → history) in "
            "model.variants.<variant>.hub.revision, or pass an existing --revision branch.",
        )
    if isinstance(exc, RepositoryNotFoundError):
        token = "with the token zoo sent" if _has_token() else "without a token (none is set)"
        return ZooError(
            f"The Hub has no repo {repo_id} visible {token} ({status}).",
            "check the repo id (model.variants.<variant>.hub.repo_id or --repo); if the repo is private or "
            "gated, log in with `hf auth login` or set HF_TOKEN.",
        )
    if isinstance(exc, HfHubHTTPError) and status == 401:
        return ZooError(
            f"The Hub rejected the token for {at} (401: invalid or expired).",
            "create a new token at huggingface.co/settings/tokens and `hf auth login` with it (or set HF_TOKEN).",
        )
    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.ConnectError, httpx2.TimeoutException)):
        return offline_error(repo_id, revision or "main")
    if isinstance(exc, HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ZooError(f"The Hub answered {status} to the {action} of {at}: {first}",
                        "retry later; if it persists, check status.huggingface.co and your proxy settings.")
    retry = ("re-running resumes it (files the Hub already holds are not sent again)" if action == "upload"
             else "`zoo cache repair` fixes a broken local copy")
    return ZooError(f"The {action} of {at} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    f"check your network and retry; {retry}.")


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: the network or the server hiccupped, not the request."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, (httpx2.TimeoutException, httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HfHubHTTPError):
        return status == 429 or (status is not None and status >= 500)
    # http_get's "Consistency check failed: file should be of size X" and Xet reconstruction errors
    return type(exc).__name__ in ("XetDownloadError",) or "Consistency check failed" in str(exc)


def _has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


# ---------------------------------------------------------------- where a repo lives in the cache


def cache_root(cache_dir: str | Path | None = None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir or constants.HF_HUB_CACHE)


def repo_cache_folder(repo_id: str, cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def resolve_commit(storage: Path, revision: str) -> str | None:
    """A pinned sha is its own commit; a branch resolves through the cache's refs/ (None: never fetched)."""
    if _FULL_SHA.match(revision):
        return revision
    ref = storage / "refs" / revision
    return ref.read_text().strip() if ref.is_file() else None


@dataclass
class Expected:
    """What the Hub says one file of a commit is."""

    path: str
    size: int | None
    etag: str           # the blob's name in the cache: sha256 for LFS/Xet files, git blob sha1 otherwise

    @property
    def is_lfs(self) -> bool:
        return bool(_SHA256.match(self.etag))


def hub_metadata(storage: Path, commit: str) -> dict[str, Expected] | None:
    """The Hub's tree listing for `commit`, as huggingface_hub 2.x stores it beside the snapshot
    (`trees/<commit>.json`, format_version 1: size, blob_id, lfs_sha256). None when none is stored."""
    path = storage / "trees" / f"{commit}.json"
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return None
    return {name: Expected(name, entry.get("lfs_size") or entry.get("size"), entry.get("lfs_sha256") or entry["blob_id"])
            for name, entry in files.items()}


def matches(path: str, patterns: list[str] | None) -> bool:
    return not patterns or any(fnmatch.fnmatch(path, p) for p in patterns)


# ---------------------------------------------------------------- checks


@dataclass
class Problem:
    kind: str          # incomplete | dangling | cross_linked | size | sparse | hash | missing
    path: Path         # the snapshot file (or the leftover)
    detail: str
    expected: Expected | None = None
    blob: Path | None = None   # the bytes the snapshot points at, when they exist

    def describe(self) -> str:
        return f"{self.kind}: {self.path.name} — {self.detail}"


@dataclass
class CacheReport:
    repo_id: str
    revision: str
    storage: Path
    commit: str | None
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def cached(self) -> bool:
        return self.commit is not None and (self.storage / "snapshots" / self.commit).is_dir()

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return "; ".join(p.describe() for p in self.problems) or "ok"


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file: how the Hub names a non-LFS file's content."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(path: Path, etag: str) -> str:
    from zoo.bundle import sha256_file

    return sha256_file(path) if _SHA256.match(etag) else git_blob_sha1(path)


def is_sparse(path: Path) -> bool:
    """Holes inside the file: fewer blocks allocated than its apparent size, confirmed with SEEK_HOLE (so
    a compressing filesystem, which also allocates fewer blocks, is not mistaken for a sparse file)."""
    stat = path.stat()
    if stat.st_size == 0 or stat.st_blocks * 512 >= stat.st_size:
        return False
    with open(path, "rb") as f:
        try:
            return os.lseek(f.fileno(), 0, os.SEEK_HOLE) < stat.st_size
        except OSError:  # filesystem without SEEK_HOLE: the block count is all we have
            return True


class _Stamps:
    """Blobs already hashed OK, keyed on (size, mtime_ns, inode): re-hashing multi-GB weights on every
    run would double the load time; any rewrite of the bytes changes the key."""

    def __init__(self, storage: Path):
        self.path = storage / VERIFIED_STAMP
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def key(blob: Path) -> list:
        stat = blob.stat()
        return [stat.st_size, stat.st_mtime_ns, stat.st_ino]

    def fresh(self, blob: Path) -> bool:
        return self.data.get(blob.name) == self.key(blob)

    def mark(self, blob: Path) -> None:
        self.data[blob.name] = self.key(blob)

    def forget(self, name: str) -> None:
        self.data.pop(name, None)

    def save(self) -> None:
        try:
            self.path.write_text(json.dumps(self.data))
        except OSError:
            pass  # a read-only cache only costs a re-hash next time


def check_repo_cache(repo_id: str, revision: str, patterns: list[str] | None = None,
                     cache_dir: str | Path | None = None, verify_hashes: bool = True) -> CacheReport:
    """Every broken state of one repo's cached snapshot at `revision`, without touching the network."""
    storage = repo_cache_folder(repo_id, cache_dir)
    commit = resolve_commit(storage, revision)
    report = CacheReport(repo_id, revision, storage, commit)
    report.problems += [Problem("incomplete", p, "left behind by an interrupted download")
                        for p in sorted((storage / "blobs").glob("*.incomplete"))]
    if not report.cached:
        return report
    snapshot = storage / "snapshots" / commit
    expected = hub_metadata(storage, commit)
    stamps = _Stamps(storage)
    present = {p.relative_to(snapshot).as_posix(): p for p in snapshot.rglob("*") if p.is_symlink() or p.is_file()}
    for rel, pointer in sorted(present.items()):
        if not matches(rel, patterns):
            continue
        report.checked += 1
        problem = check_file(pointer, storage, (expected or {}).get(rel), stamps, verify_hashes)
        if problem:
            report.problems.append(problem)
    if expected is not None:  # the Hub lists it, the patterns want it, the snapshot lacks it
        report.problems += [Problem("missing", snapshot / rel, "listed by the Hub for this commit, not in the cache", exp)
                            for rel, exp in sorted(expected.items()) if matches(rel, patterns) and rel not in present]
    stamps.save()
    return report


def check_file(pointer: Path, storage: Path, expected: Expected | None, stamps: _Stamps,
               verify_hashes: bool = True) -> Problem | None:
    """The first thing wrong with one snapshot file, in the order that names the cause best."""
    blobs = (storage / "blobs").resolve()
    target = Path(os.path.realpath(pointer))
    if expected is None and pointer.is_symlink():  # no listing: the link's own blob name is the Hub's etag
        expected = Expected(pointer.name, None, Path(os.readlink(pointer)).name)
    if not target.exists():
        return Problem("dangling", pointer, f"points at {os.readlink(pointer)}, which does not exist", expected)
    if pointer.is_symlink() and target.parent != blobs:
        return Problem("cross_linked", pointer, f"points outside this repo's blobs ({target})", expected, target)
    if expected is not None and pointer.is_symlink() and target.name != expected.etag:
        return Problem("cross_linked", pointer, f"points at blob {target.name[:12]}…, the Hub says {expected.etag[:12]}…",
                       expected, target)
    size = target.stat().st_size
    if expected is not None and expected.size is not None and size != expected.size:
        return Problem("size", pointer, f"{size} bytes, the Hub says {expected.size}", expected, target)
    if is_sparse(target):
        allocated = target.stat().st_blocks * 512
        return Problem("sparse", pointer, f"sparse blob: apparent size {size} bytes, only {allocated} allocated "
                       "(an interrupted transfer)", expected, target)
    if verify_hashes and expected is not None and not stamps.fresh(target):
        actual = content_hash(target, expected.etag)
        if actual != expected.etag:
            kind = "sha256" if expected.is_lfs else "git sha1"
            return Problem("hash", pointer, f"{kind} {actual[:12]}…, the Hub says {expected.etag[:12]}…", expected, target)
        stamps.mark(target)
    return None


# ---------------------------------------------------------------- repairs


def repair_in_place(report: CacheReport) -> list[str]:
    """Fix what needs no network; delete what must be fetched again. Returns one line per action."""
    actions, stamps = [], _Stamps(report.storage)
    for problem in report.problems:
        if problem.kind == "incomplete":
            problem.path.unlink(missing_ok=True)
            actions.append(f"removed leftover {problem.path.name}")
        elif problem.kind in ("dangling", "cross_linked"):
            actions.append(_repoint_or_drop(problem, report.storage, stamps))
        elif problem.kind in ("size", "sparse", "hash"):
            for path in (problem.blob, problem.path):
                if path is not None:
                    path.unlink(missing_ok=True)
            stamps.forget(problem.blob.name if problem.blob else "")
            actions.append(f"deleted the bad blob of {problem.path.name} ({problem.kind}); it will be fetched again")
        # "missing": nothing local to fix, the re-fetch brings it
    stamps.save()
    return actions


def _repoint_or_drop(problem: Problem, storage: Path, stamps: _Stamps) -> str:
    """Repoint a snapshot link to the complete blob the Hub names, if the cache already holds it."""
    pointer = problem.path
    good = storage / "blobs" / problem.expected.etag if problem.expected else None
    if good is not None and good.is_file() and not is_sparse(good) \
            and (problem.expected.size is None or good.stat().st_size == problem.expected.size) \
            and content_hash(good, problem.expected.etag) == problem.expected.etag:
        pointer.unlink(missing_ok=True)
        pointer.symlink_to(os.path.relpath(good, pointer.parent))
        stamps.mark(good)
        return f"repointed {pointer.name} to its complete blob {good.name[:12]}…"
    pointer.unlink(missing_ok=True)
    return f"removed the broken link {pointer.name}; it will be fetched again"


def refetch_corrupt_file(repo_id: str, revision: str, path: Path, patterns: list[str],
                         cache_dir: str | Path | None = None) -> Path:
    """A cached file that matched what the cache knows but does not load (e.g. a cache copied in without
    the Hub's metadata): drop its bytes and fetch it again; offline, one ZooError with the fix."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or not hub_reachable():
        raise ZooError(
            f"{path.name} of {repo_id}@{revision[:12]} in the HF cache is corrupt, and re-downloading it failed "
            "(the Hub is unreachable).",
            "run once with network (zoo repairs the cache), or `zoo cache repair` online; offline, use "
            "WEIGHTS=local:PATH / WEIGHTS=tiny.",
        )
    blob = Path(os.path.realpath(path))
    path.unlink(missing_ok=True)
    if blob != path and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)
    return fetch_verified(repo_id, revision, patterns, cache_dir)


def wipe_repo_cache(repo_id: str, cache_dir: str | Path | None = None) -> None:
    """The last resort the seed names: remove that repo's cache folder and fetch it cleanly."""
    shutil.rmtree(repo_cache_folder(repo_id, cache_dir), ignore_errors=True)


# ---------------------------------------------------------------- download


def download(repo_id: str, revision: str, patterns: list[str] | None = None, cache_dir: str | None = None) -> Path:
    """A verified snapshot of the matching files at `revision` (every `weights=hub` path comes here).

    A cached, healthy snapshot needs no network. A broken one is repaired: in place where the cache holds
    the right bytes, else by fetching again (one transport per attempt), else by re-downloading the repo's
    cache folder cleanly."""
    from huggingface_hub import constants

    patterns = patterns or WEIGHT_PATTERNS
    report = check_repo_cache(repo_id, revision, patterns, cache_dir)
    if report.cached and report.ok and report.checked:  # checked == 0: none of these files fetched yet
        return report.storage / "snapshots" / report.commit
    if constants.HF_HUB_OFFLINE or not hub_reachable():
        raise offline_error(repo_id, revision, report.summary() if report.cached and not report.ok else "")
    if not report.ok:
        repair_in_place(report)
    return fetch_verified(repo_id, revision, patterns, cache_dir)


def fetch_verified(repo_id: str, revision: str, patterns: list[str], cache_dir: str | None = None) -> Path:
    """Fetch, check against the Hub's metadata, repair; a clean re-download of the repo as the last step."""
    for step in ("fetch", "re-fetch after repair", "clean re-download"):
        if step == "clean re-download":
            wipe_repo_cache(repo_id, cache_dir)
        folder = fetch_with_retries(repo_id, revision, patterns, cache_dir)
        report = check_repo_cache(repo_id, revision, patterns, cache_dir)
        if report.ok:
            return folder
        print(f"[zoo.hub] {repo_id}@{revision[:12]} after {step}: {report.summary()} — repairing", file=sys.stderr)
        repair_in_place(report)
    raise ZooError(
        f"{repo_id}@{revision[:12]} still does not match the Hub's metadata after a clean re-download: {report.summary()}.",
        "the copy on the Hub or the local disk is damaged: check `dmesg`/disk space, retry later, or use "
        "WEIGHTS=local:PATH with a checkpoint you trust.",
    )


def fetch_with_retries(repo_id: str, revision: str, patterns: list[str], cache_dir: str | None = None,
                       attempts: int = RETRY_ATTEMPTS, backoff_s: float = RETRY_BACKOFF_S) -> Path:
    """Bounded retries with backoff, transient failures only. Each attempt starts from a clean slate (no
    `.incomplete` to resume from), so no attempt continues another's bytes or transport."""
    from huggingface_hub import snapshot_download

    for attempt in range(1, attempts + 1):
        _remove_leftovers(repo_id, cache_dir)
        try:
            return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=cache_dir))
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise explain_hub_error(exc, repo_id, revision) from exc
            wait = backoff_s * 2 ** (attempt - 1)
            print(f"[zoo.hub] {repo_id}: attempt {attempt}/{attempts} over {transport()} failed "
                  f"({type(exc).__name__}); retrying in {wait:.0f} s", file=sys.stderr)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _remove_leftovers(repo_id: str, cache_dir: str | None) -> None:
    for leftover in (repo_cache_folder(repo_id, cache_dir) / "blobs").glob("*.incomplete"):
        leftover.unlink(missing_ok=True)


# ---------------------------------------------------------------- the cache entries the zoo uses


@dataclass
class ZooRepo:
    model: str
    variant: str
    repo_id: str
    revision: str | None


def zoo_repos(model: str | None = None) -> list[ZooRepo]:
    """Every Hub checkpoint a model config names (model.variants.<v>.hub), for one model or all."""
    from zoo.registry import load_model_config, model_names

    names = [model] if model else model_names()
    repos = []
    for name in names:
        cfg = load_model_config(name)
        for variant, spec in (cfg.get("variants") or {}).items():
            hub = spec.get("hub") if hasattr(spec, "get") else None
            if hub and hub.get("repo_id"):
                repos.append(ZooRepo(name, variant, str(hub.repo_id), hub.get("revision")))
    return repos


def patterns_in_use(repo_id: str, revision: str, cache_dir: str | Path | None = None) -> list[str]:
    """The file set the weights path fetched for this repo: safetensors (the default), or the legacy
    pickles for a repo that has none (so a .bin the zoo never wanted is not reported missing)."""
    storage = repo_cache_folder(repo_id, cache_dir)
    commit = resolve_commit(storage, revision)
    snapshot = storage / "snapshots" / (commit or "-")
    legacy = not any(snapshot.glob("*.safetensors")) and any(snapshot.glob("pytorch_model*.bin"))
    return LEGACY_WEIGHT_PATTERNS if legacy else WEIGHT_PATTERNS


def repair_repo_cache(repo_id: str, revision: str, patterns: list[str] | None = None,
                      cache_dir: str | Path | None = None) -> tuple[CacheReport, list[str], CacheReport]:
    """(before, actions, after): repair in place, then re-fetch what is still missing when the Hub is
    reachable (a clean re-download if that is not enough)."""
    from huggingface_hub import constants

    before = check_repo_cache(repo_id, revision, patterns, cache_dir)
    if before.ok:
        return before, [], before
    actions = repair_in_place(before)
    needs_fetch = any("fetched again" in a for a in actions) or any(p.kind == "missing" for p in before.problems)
    if not needs_fetch:
        return before, actions, check_repo_cache(repo_id, revision, patterns, cache_dir)
    if constants.HF_HUB_OFFLINE or not hub_reachable():
        actions.append("the Hub is unreachable: what was deleted is fetched again on the next online run")
        return before, actions, check_repo_cache(repo_id, revision, patterns, cache_dir)
    try:
        fetch_verified(repo_id, revision, patterns or WEIGHT_PATTERNS, cache_dir)
        actions.append("fetched the missing files again and verified them")
    except ZooError as exc:
        actions.append(f"re-fetch failed: {exc.problem}")
    return before, actions, check_repo_cache(repo_id, revision, patterns, cache_dir)


def parse_repo_at(spec: str) -> ZooRepo:
    repo_id, _, revision = spec.partition("@")
    if "/" not in repo_id or not revision:
        raise ZooError(f"--repo {spec!r} is not ORG/NAME@REVISION.", "e.g. --repo google/t5-v1_1-base@<commit sha>.")
    return ZooRepo("--repo", "-", repo_id, revision)


def cache_command(action: str, model: str | None = None, out=print, repo: str | None = None) -> int:
    """`zoo cache check|repair [MODEL]`. 0: every cached entry is sound (or was repaired); 1: broken."""
    if action not in ("check", "repair"):
        raise ZooError(f"Unknown cache action '{action}'.", "use `zoo cache check [MODEL]` or `zoo cache repair [MODEL]`.")
    broken = 0
    repos = [parse_repo_at(repo)] if repo else zoo_repos(model)
    out(f"HF cache: {cache_root()}")
    for repo in repos:
        label = f"{repo.model}/{repo.variant}: {repo.repo_id}"
        if not repo.revision:
            out(f"  – {label}: no pinned revision in the config; nothing to check")
            continue
        patterns = patterns_in_use(repo.repo_id, repo.revision)
        report = check_repo_cache(repo.repo_id, repo.revision, patterns)
        if not report.cached and report.ok:
            out(f"  – {label}@{repo.revision[:12]}: not cached")
            continue
        if report.ok:
            out(f"  ✓ {label}@{repo.revision[:12]}: {report.checked} file(s) match the Hub's metadata")
            continue
        for problem in report.problems:
            out(f"  ✗ {label}@{repo.revision[:12]}: {problem.describe()}")
        if action == "check":
            broken += 1
            continue
        _, actions, after = repair_repo_cache(repo.repo_id, repo.revision, patterns)
        for line in actions:
            out(f"    → {line}")
        if after.ok:
            out(f"  ✓ {label}@{repo.revision[:12]}: repaired")
        else:
            broken += 1
            out(f"  ✗ {label}@{repo.revision[:12]}: still broken: {after.summary()}")
    if broken:
        fix = "run `zoo cache repair` (with network for files that must be fetched again)" if action == "check" \
            else "run `zoo cache repair` again with network, or delete the repo's folder from the HF cache"
        out(f"{broken} cache entr{'y is' if broken == 1 else 'ies are'} broken. Fix: {fix}.")
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="zoo cache", description="Check or repair the HF cache entries the zoo uses.")
    parser.add_argument("action", choices=["check", "repair"])
    parser.add_argument("model", nargs="?", help="one model (default: every model)")
    parser.add_argument("--repo", metavar="ORG/NAME@SHA", help="one Hub checkpoint instead of the models' configs")
    args = parser.parse_args(argv)
    from zoo.cli import returns_exit_code  # the one error boundary every CLI uses

    return returns_exit_code(cache_command)(args.action, args.model, repo=args.repo)


if __name__ == "__main__":
    from zoo.cli import run_script

    run_script(main)
