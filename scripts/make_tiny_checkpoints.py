"""Write the project's tiny checkpoints in the real on-disk format (save_pretrained → safetensors).

    python scripts/make_tiny_checkpoints.py

Deterministic (seeded); the committed folders under models/*/tiny are its output.
"""

from __future__ import annotations

import torch

from zoo.registry import get_spec, load_model_config


def write_t5_tiny() -> None:
    from transformers import T5EncoderModel

    from models.t5 import hf_config

    cfg = load_model_config("t5")
    cfg.variant = "tiny"
    spec = get_spec(cfg)
    torch.manual_seed(0)
    T5EncoderModel(hf_config(cfg)).save_pretrained(spec.tiny_dir, safe_serialization=True)
    print(f"wrote {spec.tiny_dir}")


if __name__ == "__main__":
    write_t5_tiny()
