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


def write_ltx_video_tiny() -> None:
    """A diffusers pipeline folder as the Hub lays it out (model_index.json, text_encoder/, tokenizer/,
    transformer/, vae/): the tiny T5 above as text encoder, the in-code Unigram tokenizer, and diffusers' own
    seeded init for the DiT and the VAE."""
    import json

    from transformers import T5EncoderModel

    from models.ltx_video import TINY_DIR, tiny_diffusers_parts
    from models.ltx_video.reference import tiny_tokenizer

    cfg = load_model_config("ltx-video")
    T5EncoderModel.from_pretrained(get_spec(load_model_config("t5")).tiny_dir).save_pretrained(
        TINY_DIR / "text_encoder", safe_serialization=True)
    tiny_tokenizer().save_pretrained(TINY_DIR / "tokenizer")
    for part, module in tiny_diffusers_parts(cfg).items():
        module.save_pretrained(TINY_DIR / part, safe_serialization=True)
    index = {"_class_name": "LTXPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", "LTXVideoTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLLTXVideo"]}
    (TINY_DIR / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {TINY_DIR}")


if __name__ == "__main__":
    import sys

    which = sys.argv[1:] or ["t5", "ltx-video"]
    if "t5" in which:
        write_t5_tiny()
    if "ltx-video" in which:
        write_ltx_video_tiny()  # its text encoder is the t5 tiny checkpoint
