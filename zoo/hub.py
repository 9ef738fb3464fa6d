"""Hugging Face Hub: revision-pinned downloads into the HF cache, with cache repair.

Everything goes through huggingface_hub (hf-xet is used automatically for Xet-backed repos). Downloads
land only in the HF cache (`HF_HUB_CACHE`), never elsewhere; with `HF_HUB_OFFLINE=1` a populated cache
is used as is.
"""

from __future__ import annotations

import re
from pathlib import Path

from zoo.errors import ZooError

WEIGHT_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json",
                   # tokenizers travel with the weights (LLM bundles ship them)
                   "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
LEGACY_WEIGHT_PATTERNS = ["config.json", "pytorch_model*.bin", "pytorch_model.bin.index.json"]
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


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
    library's five retries with backoff (~23 s)."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
        return True
    except Exception:  # DNS, refused, timeout, proxy: all mean "not reachable from here"
        return False


def download(repo_id: str, revision: str, patterns: list[str] | None = None, cache_dir: str | None = None) -> Path:
    """Snapshot of the matching files at `revision`; a pinned sha already in the cache needs no network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    patterns = patterns or WEIGHT_PATTERNS
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=cache_dir,
                                      local_files_only=True))
    except LocalEntryNotFoundError:
        pass  # not cached yet: go online
    try:
        if constants.HF_HUB_OFFLINE or not hub_reachable():
            raise LocalEntryNotFoundError("offline")
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=cache_dir))
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ZooError(
            f"The Hub has no {repo_id} at revision {revision} ({type(exc).__name__}).",
            "check model.hub.repo_id / model.hub.revision, and HF_TOKEN if the repo is gated.",
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise ZooError(
            f"The Hugging Face Hub is unreachable and {repo_id}@{revision[:12]} is not in the local cache.",
            "run offline with WEIGHTS=tiny (the project's own tiny checkpoint) or WEIGHTS=local:PATH "
            "(a folder with config.json + *.safetensors), or populate the HF cache on a machine with "
            "network (huggingface-cli download ... --revision ...) and set HF_HUB_OFFLINE=1.",
        ) from exc
    except HfHubHTTPError as exc:
        raise ZooError(
            f"Downloading {repo_id}@{revision[:12]} from the Hub failed: {str(exc).splitlines()[0]}",
            "check your network and HF_TOKEN (if the repo is gated), then re-run.",
        ) from exc


def repair(repo_id: str, revision: str, filename: str, cache_dir: str | None = None) -> Path:
    """Re-download one corrupt file from the cache (force_download replaces the blob)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir, force_download=True))
    except Exception as exc:  # offline, auth, HTTP: all mean "could not repair"; say so with the fix
        raise ZooError(
            f"{filename} of {repo_id}@{revision[:12]} in the HF cache is corrupt, and re-downloading it failed "
            f"({type(exc).__name__}).",
            "delete that snapshot from the cache (huggingface-cli delete-cache) and re-run with network, "
            "or use WEIGHTS=local:PATH / WEIGHTS=tiny.",
        ) from exc
