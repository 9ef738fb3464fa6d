"""coreai-catalog entries for published Core AI bundles, validated with the catalog's own schemas.

coreai-catalog (pip `coreai-catalog`) is where Core AI users find models: a curated `catalog.yaml` (models),
`artifacts.yaml` (where the bytes live) and `sources.yaml` (hosts), each with a JSON schema shipped in the
package. It installs an artifact with `hf download owner/repo --revision <sha>` and checks every file's
sha256 and size against the artifact's `huggingface.files` — so the entry lists every file of the bundle,
manifest.json included, by its path in the published repo.

`zoo.publish` stages one entry set per Core AI bundle under `coreai-catalog/` in the repo; a contributor
adds the pinned `huggingface.revision` (the upload's commit, unknown before it exists) and submits them
with `coreai-catalog contribute`. Per-model facts come from the ModelSpec (pipeline_tag, license, summary)
and the bundle's own manifest and metadata.json — never from a model name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import yaml

from zoo.bundle import MANIFEST, sha256_file
from zoo.errors import ZooError

CATALOG_FOLDER = "coreai-catalog"
COREAI_TARGET = "coreai"


@dataclass(frozen=True)
class CatalogTask:
    """The catalog's vocabulary for one Hub task (`pipeline_tag`)."""

    bundle_kind: str            # the catalog's task-level kind (not Apple's runtime BundleKind)
    capabilities: list[str]
    inputs: list[str]
    outputs: list[str]
    runner: str                 # the Swift entry point that runs it ("unknown" where no stock one does)


# Keyed by Hub task, the same vocabulary ModelSpec.pipeline_tag already uses for the model card.
CATALOG_TASKS = {
    "text-generation": CatalogTask("llm", ["text-generation"], ["text"], ["text"], "CoreAIRunner"),
    "feature-extraction": CatalogTask("embedding", ["embedding"], ["text"], ["embedding"], "unknown"),
}


def catalog_task(pipeline_tag: str | None) -> CatalogTask:
    task = CATALOG_TASKS.get(pipeline_tag or "")
    if task is None:
        raise ZooError(f"No coreai-catalog vocabulary for the Hub task '{pipeline_tag}'.",
                       f"add it to zoo.catalog_entry.CATALOG_TASKS (known: {', '.join(CATALOG_TASKS)}).")
    return task


def entry_id(repo_id: str, rel: str) -> str:
    """`<repo name>-<bundle folder>`, lower-case with dashes: unique per published bundle."""
    return f"{repo_id.split('/')[-1]}-{rel.replace('/', '-')}".lower()


def artifact_files(bundle_folder: Path, rel: str, manifest: dict) -> list[dict]:
    """Every file the catalog's installer will check, by its path in the repo. The manifest's hashes were
    re-checked against the bytes just before staging; manifest.json itself is hashed here."""
    files = [{"path": f"{rel}/{path}", "sha256": entry["sha256"], "size_bytes": int(entry["bytes"])}
             for path, entry in sorted(manifest["files"].items())]
    manifest_path = bundle_folder / MANIFEST
    files.append({"path": f"{rel}/{MANIFEST}", "sha256": sha256_file(manifest_path),
                  "size_bytes": manifest_path.stat().st_size})
    return sorted(files, key=lambda f: f["path"])


def io_contract(manifest: dict, language: dict | None, stateful: bool) -> dict:
    """The catalog's typed I/O contract, from our graph contract (the manifest's verified I/O)."""
    def tensor(spec: dict) -> dict:
        return {"shape": list(spec["shape"]), "dtype": spec["dtype"]}

    io = manifest.get("io") or {}
    contract = {
        "inputs": [{"name": i["name"], "modality": "tensor", "tensor": tensor(i)} for i in io.get("inputs", [])],
        "outputs": [{"name": o["name"]} for o in io.get("outputs", [])],
        "session": {"stateful": stateful, "streaming": stateful},
    }
    if language:
        contract["files"] = {"tokenizer_ref": language["tokenizer"]}
    return {k: v for k, v in contract.items() if v}


def human_size(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.1f}MB" if num_bytes >= 2**20 else f"{num_bytes / 2**10:.0f}KB"


def catalog_entries(bundle, spec, repo_id: str, today: str | None = None) -> dict:
    """{"model", "artifact", "source"} entries for one published Core AI bundle (a zoo.publish.Bundle)."""
    manifest = bundle.manifest
    metadata = json.loads((bundle.folder / "metadata.json").read_text())
    language = metadata.get("language")
    task = catalog_task(spec.pipeline_tag)
    owner, repo = repo_id.split("/", 1)
    url = f"https://huggingface.co/{owner}/{repo}"
    ident = entry_id(repo_id, bundle.rel)
    source_id = f"hf-{owner}-{repo}".lower()
    weights = manifest.get("weights") or {}
    real = bool(manifest.get("real_weights"))
    model = {
        "id": ident, "name": f"{spec.name} {bundle.rel}", "family": spec.name,
        "source_group": "external", "artifact_ref": ident, "source_path": url,
        "capabilities": task.capabilities,
        "modalities": {"input": task.inputs, "output": task.outputs},
        "artifact": {"format": "aimodel", "availability": "available"},
        "size": {"parameters": "unknown", "precision": manifest["precision"],
                 "quantization": metadata.get("compression") or "none", "artifact_size": human_size(bundle.bytes)},
        "runtime": {"runtime_name": "apple-core-ai", "runner": task.runner, "stock_runtime": "unknown",
                    "custom_kernel": False, "patch_required": False, "tokenizer_required": bool(language),
                    "processor_required": False, "aot_required": False},
        "device_support": {"iphone": "unknown", "ipad": "unknown", "mac": "unknown", "mac_only": "unknown"},
        "license": {"name": spec.license or "unknown", "commercial_use": "check_license"},
        # Gated on the Linux CPU runtime only, never on an Apple device: not "confirmed" by us.
        "status": "needs_review", "maturity": "experimental",
        "confidence": "medium" if real else "low",
        "sources": [source_id], "last_verified": today or date.today().isoformat(),
        "notes": (f"Converted and gated by zoo on the Core AI Linux CPU runtime ({manifest.get('status')})."
                  + ("" if real else f" Made from {weights.get('source', 'unknown')} weights: not a usable model.")),
        "bundle_kind": task.bundle_kind,
        "io_contract": io_contract(manifest, language, stateful=bool(language)),
    }
    if language:
        model["context_window"] = str(language["max_context_length"])
    if weights.get("repo_id"):
        model["upstream_repo"] = weights["repo_id"]
    tools = manifest.get("tools") or {}
    artifact = {
        "id": ident, "group": "external",
        "huggingface": {"owner": owner, "repo": repo, "url": url, "path": bundle.rel,
                        "files": artifact_files(bundle.folder, bundle.rel, manifest)},
        "officiality": {"apple_export_recipe": False, "apple_hosted_artifact": False, "community_packaged": True},
        "provenance": {"converted_by": {"tool": "zoo", "version": _zoo_version()},
                       "recipe_source": "independent", "format_version": metadata["metadata_version"]},
        "bundle_kind": task.bundle_kind, "precision": manifest["precision"],
    }
    if tools.get("coreai-torch"):
        artifact["provenance"]["converted_by"]["version"] += f" (coreai-torch {tools['coreai-torch']})"
    source = {"id": source_id, "title": repo_id, "type": "huggingface_repository", "url": url, "owner": owner,
              "repo": repo, "trust": "artifact_host", "volatility": "medium",
              "last_checked": today or date.today().isoformat(),
              "notes": f"Hugging Face repo of the zoo bundles of {spec.name}."}
    return {"model": model, "artifact": artifact, "source": source}


def _zoo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zoo")
    except PackageNotFoundError:
        return "unknown"


def catalog_errors(entries: dict) -> list[str]:
    """Problems with one entry set, by coreai-catalog's own schema and cross-reference checks (the same
    core its `contribute --dry-run` runs), with the new artifact and source counted as present."""
    from coreai_catalog import contribute

    root = contribute.find_root()
    context = {k: set(v) for k, v in contribute.ids_context(root).items()}
    context["artifact_ids"].add(entries["artifact"]["id"])
    context["source_ids"].add(entries["source"]["id"])
    errors = []
    for kind in ("model", "artifact", "source"):
        errors += contribute.schema_errors(kind, entries[kind], root)
        errors += contribute.cross_reference_errors(kind, entries[kind], context)
    return [contribute.format_error(e) for e in errors]


def write_catalog_entries(bundles: list, spec, repo_id: str, dest: Path) -> list[Path]:
    """One `coreai-catalog/<id>.yaml` per Core AI bundle in the staged repo, each validated first."""
    written = []
    for bundle in (b for b in bundles if b.manifest.get("target") == COREAI_TARGET):
        entries = catalog_entries(bundle, spec, repo_id)
        errors = catalog_errors(entries)
        if errors:
            raise ZooError(f"The coreai-catalog entry for {bundle.rel} does not validate: " + "; ".join(errors),
                           "this is a bug in zoo.catalog_entry (the bundle itself is fine); report it.")
        path = dest / CATALOG_FOLDER / f"{entries['model']['id']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(entries, sort_keys=False))
        written.append(path)
    return written
