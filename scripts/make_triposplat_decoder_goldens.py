"""Golden fixtures for TripoSplat's decoders and octree sampling, from upstream's own code (reference env only).

Run in the reference environment (scripts/setup_triposplat_ref.sh puts upstream's model.py / triposplat.py at
a78fa12 on its path; they import torchvision, which the main venv cannot hold):

    /work/main/.cache/triposplat-ref-venv/bin/python scripts/make_triposplat_decoder_goldens.py

Writes the seeded tiny decoder file with upstream's `octree.` / `gs.` keys and its upstream constructor
arguments as `weights=tiny`'s decoder part (models/triposplat/tiny/decoder/model.safetensors + config.json, listed
in tiny/model_index.json), and models/triposplat/golden/decoder_tiny_io.safetensors (inputs, upstream outputs):
- octree decoder logits for fixed parent centres and a float level;
- the whole 8-level octree descent: every decoder call's inputs and logits (so a test can replay them
  through our sampler), the seed, and the sampled points / log-probs;
- the Gaussian decoder's features on those points and the bytes of upstream's .ply (xyz, f_dc, opacity logit,
  log scale, rotation after its default axis transform).
No zoo import: CI never runs this; tests compare the port with what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

import model as upstream          # upstream model.py, on the reference venv's path
import triposplat as upstream_pipeline

PACKAGE = Path(__file__).resolve().parent.parent / "models" / "triposplat"
OUT = PACKAGE / "golden"
TINY_PART = PACKAGE / "tiny" / "decoder"
SEED = 0
LATENT_TOKENS = 64                   # the tiny DiT's q_token_length
NUM_POINTS = 64                      # decoder tokens (×32 Gaussians)
OCTREE_ARGS = dict(model_channels=64, cond_channels=16, num_blocks=2, num_heads=4, mlp_ratio=2, share_mod=True)
GS_ARGS = dict(upstream_pipeline.GS_DECODER_ARGS, model_channels=64, num_blocks=2, num_heads=4, mlp_ratio=2)


def seeded_decoder() -> upstream.OctreeGaussianDecoder:
    """Upstream's default init, then every parameter perturbed so that ones / zeros (norm gammas, biases)
    are not symmetric: a port that swapped two heads' gammas or dropped a bias would still match a plain init."""
    torch.manual_seed(SEED)
    decoder = upstream.OctreeGaussianDecoder(OCTREE_ARGS, GS_ARGS).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return decoder


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    TINY_PART.mkdir(parents=True, exist_ok=True)
    decoder = seeded_decoder()
    state = {k: v.contiguous() for k, v in decoder.state_dict().items()}
    save_file(state, TINY_PART / "model.safetensors")
    (TINY_PART / "config.json").write_text(json.dumps({"octree": OCTREE_ARGS, "gs": GS_ARGS}, indent=1) + "\n")
    index_path = TINY_PART.parent / "model_index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {"_class_name": "TripoSplat"}
    index["decoder"] = ["triposplat", "upstream a78fa12"]
    index_path.write_text(json.dumps(index, indent=2) + "\n")

    g = torch.Generator().manual_seed(SEED + 2)
    latent = torch.randn(1, LATENT_TOKENS, 16, generator=g)
    io = {"latent": latent}
    with torch.no_grad():
        # 1. the octree decoder on fixed inputs (level as upstream passes it: int64 resolution)
        centres = torch.rand(1, 24, 3, generator=g)
        io["octree.points"] = centres
        io["octree.level"] = torch.tensor([16.0])
        io["octree.logits"] = decoder.octree(centres, torch.tensor([16]), latent)["logits"]

        # 2. the descent, every call recorded
        calls = []
        original = decoder.octree.forward

        def recording(x, l, cond, l2=None):
            out = original(x, l, cond, l2)
            calls.append((x.clone(), l.clone(), out["logits"].clone()))
            return out

        decoder.octree.forward = recording
        torch.manual_seed(SEED + 3)
        sampled = upstream.OctreeProbabilityFixedlenDecoder.sample(
            decoder.octree, latent, num_points=NUM_POINTS, level=8, temperature=1.0, algo="systematic")
        decoder.octree.forward = original
        io["sample.seed"] = torch.tensor([SEED + 3])
        for i, (x, l, logits) in enumerate(calls):
            io[f"sample.call{i}.points"] = x
            io[f"sample.call{i}.level"] = l.to(torch.float32)
            io[f"sample.call{i}.logits"] = logits
        io["sample.points"] = sampled["points"]
        io["sample.log_probs"] = sampled["log_probs"]

        # 3. the Gaussian decoder on those points, and upstream's assembled Gaussians as its .ply writes them
        features = decoder.gs(x=sampled, cond=latent)["features"]
        io["gs.features"] = features
        gaussian = upstream_pipeline._build_gaussians(decoder.gs, sampled, {"features": features})[0]
        io["ply.bytes"] = torch.frombuffer(bytearray(gaussian.to_ply_bytes()), dtype=torch.uint8)
    save_file({k: v.contiguous() for k, v in io.items()}, OUT / "decoder_tiny_io.safetensors")
    print(f"[decoder goldens] {len(state)} keys, {len(calls)} octree calls, "
          f"{features.shape[1] * 32} Gaussians -> {OUT}")


if __name__ == "__main__":
    main()
