"""Golden fixtures for RF-DETR: upstream `rfdetr` outputs on seeded weights, for CI parity without torchvision.

Runs ONLY in the reference environment (`scripts/setup_rfdetr_ref.sh` → .cache/rfdetr-ref-venv: torch 2.14.1 +
torchvision 0.29.1 + rfdetr 1.11.2). CI never imports rfdetr; it compares our port (models/rf_detr) with what
this script wrote:

    .cache/rfdetr-ref-venv/bin/python scripts/make_rfdetr_goldens.py      # rewrites models/rf_detr/golden/

Two fixtures:
- `tiny/`: the upstream Nano classes with the DINOv2 size config shrunk (hidden 64, 2 heads, 4 layers) and the
  tiny detector config from ../shared/notes/models.md. Weights are committed (`model.safetensors`, upstream key
  names, in `checkpoint/` with `config.json` in our config schema): this is also the model's `weights=tiny`.
- `nano/`: the real Nano architecture (30.5 M params). Its weights would be 120 MB, so they are NOT committed:
  both sides regenerate them bit-identically with `seeded_state_dict` (a pure function of seed, key and shape on
  torch's CPU generator), and only the input, outputs and a key→shape manifest are stored.

Weights are not upstream's own init: that init zeroes the box head, the deformable attention weights and the
sampling-offset projections, so a parity test on it would not exercise those paths. Every tensor is drawn
from a scale that keeps activations in a realistic range (see `seeded_tensor`); class biases are N(0, 1) so
the random model's scores spread over (0, 1) and the detection gate has detections to match.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "models" / "rf_detr" / "golden"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The tiny build (models.md §RF-DETR): resolution = positional_encoding_size × patch_size.
TINY_DETECTOR = dict(resolution=128, positional_encoding_size=8, num_queries=30, num_select=30, dec_layers=1,
                     hidden_dim=64, sa_nheads=2, ca_nheads=4, num_classes=5, out_feature_indexes=[1, 2, 3, 4])
TINY_DINO = dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=4)


# ---------------------------------------------------------------- seeded weights (one definition: models/rf_detr/weights.py)


def _load_seeded_weights_module():
    """models/rf_detr/weights.py holds the seeded-weight functions; it imports only torch and zlib, so it is
    loaded here by path — the reference environment cannot import the zoo package around it."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "models" / "rf_detr" / "weights.py"
    spec = importlib.util.spec_from_file_location("rf_detr_seeded_weights", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SEEDED = _load_seeded_weights_module()
seeded_tensor, seeded_state_dict = _SEEDED.seeded_tensor, _SEEDED.seeded_state_dict


# ---------------------------------------------------------------- upstream builds


def shrink_dinov2(dino: dict) -> None:
    """Patch upstream's DINOv2 size table so `dinov2_windowed_small` is the tiny ViT (no other hook exists)."""
    import rfdetr.models.backbone.dinov2 as dinov2

    original = dinov2.get_config

    def tiny_config(size: str, use_registers: bool) -> dict:
        config = original(size, use_registers)
        config.update(dino)
        return config

    dinov2.get_config = tiny_config
    dinov2.size_to_width["small"] = dino["hidden_size"]


def build_upstream(detector: dict):
    from rfdetr.config import RFDETRNanoConfig
    from rfdetr.models.lwdetr import build_model_from_config

    config = RFDETRNanoConfig(pretrain_weights=None, device="cpu", **detector)
    return build_model_from_config(config).eval(), config


def our_config(upstream_config, dino: dict) -> dict:
    """The checkpoint's config.json in our schema (models/rf_detr/model.py RFDETRConfig)."""
    return {
        "resolution": upstream_config.resolution, "patch_size": upstream_config.patch_size,
        "num_windows": upstream_config.num_windows, "out_feature_indexes": list(upstream_config.out_feature_indexes),
        "vit_hidden_size": dino["hidden_size"], "vit_heads": dino["num_attention_heads"],
        "vit_layers": dino["num_hidden_layers"],
        "vit_registers": 4 if "registers" in upstream_config.encoder else 0,
        "hidden_dim": upstream_config.hidden_dim, "sa_nheads": upstream_config.sa_nheads,
        "ca_nheads": upstream_config.ca_nheads, "dec_n_points": upstream_config.dec_n_points,
        "dec_layers": upstream_config.dec_layers, "dim_feedforward": 2048,
        "num_queries": upstream_config.num_queries, "group_detr": upstream_config.group_detr,
        "num_classes": upstream_config.num_classes + 1,  # upstream adds the background slot
        "projector_scale": list(upstream_config.projector_scale),
    }


def float_shapes(model) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items() if v.is_floating_point()}


def load_seeded(model, seed: int) -> dict[str, torch.Tensor]:
    weights = seeded_state_dict(float_shapes(model), seed)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    non_float = [k for k in missing if model.state_dict()[k].is_floating_point()]
    assert not non_float, non_float
    return weights


def example_images(resolution: int, seed: int) -> torch.Tensor:
    """Two [0,1] images: seeded noise and a smooth gradient with blobs (some structure for the backbone)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(1, 3, resolution, resolution, generator=generator)
    ys, xs = torch.meshgrid(torch.linspace(0, 1, resolution), torch.linspace(0, 1, resolution), indexing="ij")
    smooth = torch.stack([xs, ys, 0.5 + 0.5 * torch.sin(12 * xs * ys)])[None]
    return torch.cat([noise, smooth]).clamp(0, 1)


@torch.no_grad()
def upstream_outputs(model, images: torch.Tensor) -> dict[str, torch.Tensor]:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    boxes, logits = [], []
    for image in images:  # one at a time: the bundle's batch is 1
        out = model(((image[None] - mean) / std))
        boxes.append(out["pred_boxes"])
        logits.append(out["pred_logits"])
    return {"boxes": torch.cat(boxes), "logits": torch.cat(logits)}


def write_fixture(name: str, detector: dict, dino: dict, seed: int, commit_weights: bool) -> None:
    from safetensors.torch import save_file

    import rfdetr

    shrink_dinov2(dino)
    model, upstream_config = build_upstream(detector)
    weights = load_seeded(model, seed)
    images = example_images(upstream_config.resolution, seed)
    outputs = upstream_outputs(model, images)
    folder = GOLDEN / name
    folder.mkdir(parents=True, exist_ok=True)
    # Nano's images (3.5 MB) are regenerated by `example_images` on our side too; their sum pins them.
    stored = {"images": images.contiguous()} if commit_weights else {"images_sum": images.sum().reshape(1)}
    save_file({**stored, **{k: v.contiguous() for k, v in outputs.items()}}, str(folder / "io.safetensors"))
    config = our_config(upstream_config, dino)
    provenance = {"rfdetr": rfdetr.__version__ if hasattr(rfdetr, "__version__") else "1.11.2",
                  "torch": torch.__version__, "seed": seed, "upstream_class": "RFDETRNanoConfig",
                  "upstream_overrides": detector, "dinov2_overrides": dino,
                  "weights": "committed" if commit_weights else "regenerate with seeded_state_dict(shapes, seed)"}
    (folder / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    if commit_weights:
        # The tiny checkpoint in the on-disk form the pipeline loads (a folder of config.json + *.safetensors,
        # upstream keys), apart from io.safetensors, which is not a weight file.
        checkpoint = folder / "checkpoint"
        checkpoint.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if v.is_floating_point()},
                  str(checkpoint / "model.safetensors"))
        (checkpoint / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    else:
        (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        (folder / "shapes.json").write_text(json.dumps(float_shapes(model), indent=0) + "\n")
    n_params = sum(v.numel() for v in weights.values())
    print(f"[goldens] {name}: {n_params / 1e6:.2f} M params, boxes {tuple(outputs['boxes'].shape)}, "
          f"logits {tuple(outputs['logits'].shape)}, max score "
          f"{outputs['logits'].sigmoid().max():.3f} -> {folder.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-nano", action="store_true", help="only the tiny fixture")
    args = parser.parse_args()
    write_fixture("tiny", TINY_DETECTOR, TINY_DINO, args.seed, commit_weights=True)
    if not args.skip_nano:
        # Re-patching with the real ViT-S sizes restores upstream's own table (the patch is an idempotent update).
        real = {"hidden_size": 384, "num_attention_heads": 6, "num_hidden_layers": 12}
        write_fixture("nano", {}, real, args.seed, commit_weights=False)

if __name__ == "__main__":
    main()
