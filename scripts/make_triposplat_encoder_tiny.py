"""Write the tiny image-encoder and VAE-encoder weights into models/triposplat/tiny/ (part folders
`image_encoder/`, `vae_encoder/`: config.json + model.safetensors, the released files' keys).

The weights are the library classes' own init under a seed (transformers DINOv3ViTModel, diffusers
AutoencoderKLFlux2's encoder half) with norm affines, layer scales, tokens and batch-norm statistics perturbed
(models/triposplat/encoders.py seeded_*_state), at the tiny architecture of models/triposplat/config.yaml.
tests/test_triposplat_encoders.py checks the committed files equal what this writes.

    .venv/bin/python scripts/make_triposplat_encoder_tiny.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED = 0


def tiny_parts() -> dict[str, tuple[dict, dict]]:
    from models.triposplat import encoders as enc

    arch = OmegaConf.to_container(OmegaConf.load(ROOT / "models/triposplat/config.yaml").variants.tiny.architecture)
    return {"image_encoder": (arch["image_encoder"], enc.seeded_dino_state(enc.DinoConfig.from_dict(arch["image_encoder"]), SEED)),
            "vae_encoder": (arch["vae_encoder"], enc.seeded_vae_state(enc.VaeConfig.from_dict(arch["vae_encoder"]), SEED))}


def main() -> None:
    tiny = ROOT / "models/triposplat/tiny"
    index = json.loads((tiny / "model_index.json").read_text())
    for name, (config, state) in tiny_parts().items():
        (tiny / name).mkdir(exist_ok=True)
        (tiny / name / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(state, str(tiny / name / "model.safetensors"))
        index[name] = ["triposplat", f"seeded {SEED} (scripts/make_triposplat_encoder_tiny.py)"]
        print(f"{name}: {len(state)} tensors, {sum(v.numel() for v in state.values())} parameters")
    (tiny / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
