"""A bundle's content key: everything that decides what the bundle holds, hashed into one string.

    key = sha256(weights, resolved config, tool versions, code)   (+ target, precision, component)

- weights: the sha256 of every weight file the checkpoint was loaded from (`weights.resolve`'s
  provenance), or the seed and variant for random weights; never the folder path, so two checkouts (or
  two Ray nodes) holding the same files agree;
- config: the model's composed config after every override, plus the target, precision and weights source;
- tools: the target's toolchain versions (the same ones the manifest records) and Python's;
- code: the bytes of zoo/ (the shared pipeline) and of the model's own folder (architecture, config, tiny
  checkpoints, golden fixtures). Files the bench and docs write there (README.md, bench.json, images) are
  outputs, not inputs: rewriting them must not rebuild the zoo.

`convert-all` skips a bundle whose manifest carries the key it would build now, if that bundle passed
(`up_to_date`). The manifest keeps the parts next to the digest, so a rebuild can say what changed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import platform
from pathlib import Path

from omegaconf import OmegaConf

from zoo.bundle import MANIFEST, REPORT
from zoo.registry import ROOT, model_config_files

ZOO_PACKAGE = ROOT / "zoo"
# Written into a model folder by `zoo bench` and the docs, never read by a conversion.
MODEL_FOLDER_OUTPUTS = {"README.md", "bench.json", "real_size.json", "real_size.partial.json"}
OUTPUT_SUFFIXES = {".png", ".gif", ".jpg"}
SKIPPED_FOLDERS = {"__pycache__"}


def digest(data) -> str:
    """sha256 of a JSON-able value, independent of dict order."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def folder_digest(folder: Path, *, is_input=lambda path: True) -> str:
    """sha256 over the relative paths and bytes of the files under `folder` that `is_input` accepts."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if SKIPPED_FOLDERS & set(rel.parts) or not is_input(rel):
            continue
        h.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _model_folder_input(rel: Path) -> bool:
    return rel.as_posix() not in MODEL_FOLDER_OUTPUTS and rel.suffix not in OUTPUT_SUFFIXES


@functools.cache
def zoo_code_digest() -> str:
    return folder_digest(ZOO_PACKAGE, is_input=lambda rel: rel.suffix == ".py")


def model_code_digest(model_cfg) -> str:
    """The model's folder; for a user's module (`module=pkg.mod:factory`, no folder of ours) the file
    that defines it."""
    folder = model_config_files().get(str(model_cfg.name))
    if folder is not None:
        return folder_digest(folder.parent, is_input=_model_folder_input)
    factory = str(model_cfg.get("factory") or "")
    spec = importlib.util.find_spec(factory.split(":")[0]) if factory else None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return ""
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


def weights_identity(provenance: dict) -> dict:
    """What identifies the weights, without where they happen to lie on this machine."""
    return {k: v for k, v in provenance.items() if k not in ("path", "note")}


def key_parts(model_cfg, target: str, precision: str, weights_spec: str, provenance: dict,
              force_precision: bool = False) -> dict:
    """The inputs of one model × target × precision, before they are hashed (recorded in the manifest)."""
    from zoo.targets import get_target

    config = OmegaConf.to_container(model_cfg, resolve=True)
    return {
        "weights": weights_identity(provenance),
        "config": digest({"model": config, "target": target, "precision": precision, "weights": str(weights_spec),
                          "force_precision": bool(force_precision)}),
        "tools": {**get_target(target).versions(), "python": platform.python_version()},
        "code": {"zoo": zoo_code_digest(), "model": model_code_digest(model_cfg)},
    }


def bundle_key(parts: dict, component: str) -> str:
    """The content key of one component's bundle of a model × target × precision."""
    return digest({**parts, "component": component})


def recorded_key(bundle: Path) -> tuple[str | None, dict]:
    """(content key, its parts) from a bundle's manifest; (None, {}) when it has none or is unreadable."""
    try:
        manifest = json.loads((Path(bundle) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None, {}
    key = manifest.get("content_key") or {}
    return key.get("sha256"), key.get("parts") or {}


def bundle_passed(bundle: Path) -> bool:
    try:
        return json.loads((Path(bundle) / REPORT).read_text()).get("status") == "passed"
    except (OSError, ValueError):
        return False


def up_to_date(bundle: Path, key: str) -> bool:
    """A passing bundle is on disk at `bundle` and was built from exactly these inputs."""
    return recorded_key(bundle)[0] == key and bundle_passed(bundle)


def what_changed(bundle: Path, parts: dict) -> str:
    """Why a bundle must be (re)built, in a few words: 'new', 'failed before', or the parts that differ."""
    if not (Path(bundle) / MANIFEST).is_file():
        return "no bundle yet"
    old_key, old_parts = recorded_key(bundle)
    if old_key is None:
        return "its manifest has no content key"
    changed = [name for name in parts if old_parts.get(name) != parts[name]]
    if changed:
        return "changed: " + ", ".join(changed)
    return "not passing" if not bundle_passed(bundle) else "key differs"
