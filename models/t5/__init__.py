"""T5 v1.1 encoder (the text encoder of LTX-Video): declarations only; the pipeline does the work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from models.t5.model import T5Encoder, T5EncoderConfig
from zoo.registry import Component, ModelSpec
from zoo.schema import ModelConfig
from zoo.weights import Checkpoint, load_strict

TINY_DIR = Path(__file__).parent / "tiny"
TIED = {"encoder.embed_tokens.weight": "shared.weight"}


def hf_config(cfg) -> "transformers.T5Config":  # noqa: F821
    from transformers import T5Config

    architecture = OmegaConf.to_container(cfg.variants[cfg.variant].architecture)
    return T5Config(**architecture, feed_forward_proj="gated-gelu", dropout_rate=0.0, tie_word_embeddings=False)


def build(checkpoint: Checkpoint, cfg) -> nn.Module:
    module = T5Encoder(T5EncoderConfig.from_hf(checkpoint.config), seq_len=int(cfg.seq_len))
    return load_strict(module, checkpoint.state_dict, TIED).eval()


class ReferenceEncoder(nn.Module):
    """transformers' T5EncoderModel, called the way our graph is (int ids, int mask) → last_hidden_state."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids, attention_mask):
        return (self.hf(input_ids=input_ids.long(), attention_mask=attention_mask.long()).last_hidden_state,)


def reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    from transformers import T5Config, T5EncoderModel

    hf = T5EncoderModel(T5Config(**checkpoint.config))
    load_strict(hf, checkpoint.state_dict, TIED)
    return ReferenceEncoder(hf.float().eval())


def example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """Seeded ids with the last quarter padded, so the mask path is exercised by every gate."""
    length, vocab = int(cfg.seq_len), int(checkpoint.config["vocab_size"])
    generator = torch.Generator().manual_seed(int(cfg.seed))
    ids = torch.randint(1, vocab, (1, length), generator=generator, dtype=torch.int32)
    mask = torch.ones(1, length, dtype=torch.int32)
    mask[:, length - length // 4 :] = 0
    ids[mask == 0] = 0  # T5's pad id
    return {"input_ids": ids, "attention_mask": mask}


def random_checkpoint(cfg) -> tuple[dict, dict[str, torch.Tensor]]:
    """The real architecture with transformers' own seeded initialisation (for benchmarks only)."""
    from transformers import T5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.seed))
        hf = T5EncoderModel(hf_config(cfg))
    return hf.config.to_dict(), hf.state_dict()


@dataclass
class T5ModelConfig(ModelConfig):
    """config.yaml keys only T5 has."""

    seq_len: int = 128   # LTX-Video encodes prompts at 128 tokens


SPEC = ModelSpec(
    name="t5",
    summary="T5 v1.1 encoder (gated-GELU), LTX-Video's text encoder",
    components=[
        Component(
            name="encoder",
            build=build,
            reference=reference,
            example_inputs=example_inputs,
            output_names=["last_hidden_state"],
        )
    ],
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    config_schema=T5ModelConfig,
    pipeline_tag="feature-extraction",   # an encoder: token ids -> hidden states
    license="apache-2.0",                # google/t5-v1_1-*'s license
)
