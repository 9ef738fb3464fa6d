"""two-stage: an encoder (Linear → GELU → LayerNorm) and a classification head, as two components.

Declarations only, like every model folder: the shared pipeline, bench and gates do the work.
The reference is the same math written independently (functional ops), so the port-vs-reference
cosine means something.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.registry import Component, ModelSpec
from zoo.schema import ModelConfig
from zoo.weights import Checkpoint, load_strict


def arch(cfg) -> dict:
    return dict(cfg.variants[cfg.variant].architecture)


class Encoder(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(width, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.norm(F.gelu(self.proj(x)))


class Head(nn.Module):
    def __init__(self, hidden: int, classes: int):
        super().__init__()
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, h):
        return self.classifier(h)


def prefixed(state_dict: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def build_encoder(checkpoint: Checkpoint, cfg) -> nn.Module:
    a = checkpoint.config
    return load_strict(Encoder(a["width"], a["hidden"]), prefixed(checkpoint.state_dict, "encoder.")).eval()


def build_head(checkpoint: Checkpoint, cfg) -> nn.Module:
    a = checkpoint.config
    return load_strict(Head(a["hidden"], a["classes"]), prefixed(checkpoint.state_dict, "head.")).eval()


class ReferenceEncoder(nn.Module):
    def __init__(self, sd: dict):
        super().__init__()
        self.sd = sd

    def forward(self, x):
        h = x @ self.sd["encoder.proj.weight"].T + self.sd["encoder.proj.bias"]
        h = 0.5 * h * (1.0 + torch.erf(h / 2**0.5))
        mean, var = h.mean(-1, keepdim=True), h.var(-1, keepdim=True, unbiased=False)
        return ((h - mean) / torch.sqrt(var + 1e-5) * self.sd["encoder.norm.weight"] + self.sd["encoder.norm.bias"],)


class ReferenceHead(nn.Module):
    def __init__(self, sd: dict):
        super().__init__()
        self.sd = sd

    def forward(self, h):
        return (h @ self.sd["head.classifier.weight"].T + self.sd["head.classifier.bias"],)


def example(shape_key: str):
    def inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
        a = checkpoint.config
        generator = torch.Generator().manual_seed(int(cfg.seed))
        return {shape_key: torch.randn(1, a["tokens"], a["width" if shape_key == "x" else "hidden"], generator=generator)}

    return inputs


def random_checkpoint(cfg):
    a = arch(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.seed))
        encoder, head = Encoder(a["width"], a["hidden"]), Head(a["hidden"], a["classes"])
    state = {**{f"encoder.{k}": v for k, v in encoder.state_dict().items()},
             **{f"head.{k}": v for k, v in head.state_dict().items()}}
    return a, state


SPEC = ModelSpec(
    name="two-stage",
    summary="test-only: encoder + head, two components",
    components=[
        Component("encoder", build_encoder, lambda c, cfg: ReferenceEncoder(c.state_dict), example("x"), ["hidden"]),
        Component("head", build_head, lambda c, cfg: ReferenceHead(c.state_dict), example("h"), ["logits"]),
    ],
    tiny_dir=Path(__file__).parent / "tiny",
    random_checkpoint=random_checkpoint,
    config_schema=ModelConfig,
)
