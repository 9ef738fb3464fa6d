"""What a model folder declares, and how the pipeline finds it.

The list of models is the list of `configs/model/*.yaml` files: one place. Each config names the Python
package (`package: models.t5`) whose `SPEC` says how to build the re-authored module, the upstream
reference, example inputs and the graph contract.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from zoo.errors import ZooError

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"


@dataclass
class Component:
    """One exportable network of a model (LTX-Video has three; T5 has one).

    build(checkpoint, cfg)          -> re-authored nn.Module, weights loaded strictly, eval mode
    reference(checkpoint, cfg)      -> upstream implementation on the same weights, returning a tuple
                                       of outputs in `output_names` order
    example_inputs(checkpoint, cfg) -> {graph input name: tensor}, in positional order, at export shape
    entries(module, inputs, target, cfg) -> optional: several graph functions (prefill/decode);
                                       default one `main` function
    verify(ctx: pipeline.VerifyContext) -> optional custom gate (e.g. token-exact generation)
    """

    name: str
    build: Callable
    reference: Callable
    example_inputs: Callable
    output_names: list[str]
    entries: Callable | None = None
    verify: Callable | None = None


@dataclass
class ModelSpec:
    name: str
    components: list[Component]
    tiny_dir: Path
    random_checkpoint: Callable  # (cfg) -> (config dict, state dict)
    summary: str = ""
    extra_files: Callable | None = None  # (checkpoint, cfg, bundle_dir) -> writes e.g. a tokenizer
    meta: dict = field(default_factory=dict)


def group_options(group: str) -> list[str]:
    """The choices of a Hydra config group are its yaml files: one place for each list."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def model_names() -> list[str]:
    return group_options("model")


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


def unknown_model_error(name: str) -> ZooError:
    return ZooError(
        f"Unknown model '{name}'. Valid models: {', '.join(model_names())}.",
        f"pick one of those, e.g. `make convert MODEL={model_names()[0]}` (`make list` shows them all).",
    )


def load_model_config(name: str):
    path = CONFIG_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        raise unknown_model_error(name)
    return OmegaConf.load(path)


def get_spec(model_cfg) -> ModelSpec:
    return importlib.import_module(model_cfg.package).SPEC

