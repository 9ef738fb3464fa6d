"""Golden fixtures for TripoSplat: upstream's own classes on seeded tiny configs, for CI parity without torchvision.

Runs ONLY in the reference environment (`scripts/setup_triposplat_ref.sh` -> .cache/triposplat-ref-venv: torch
2.14.1 + torchvision 0.29.1, upstream model.py / triposplat.py read from the mirror at commit a78fa12 onto its
path). CI never imports upstream; tests/test_triposplat.py compares our port with what this script wrote:

    .cache/triposplat-ref-venv/bin/python scripts/make_triposplat_goldens.py [--parts dit dit_wide]

Each part has its own function (`PARTS`); a part writes its weights into the tiny checkpoint folder
models/triposplat/tiny/<part>/ (config.json in upstream's constructor arguments + model.safetensors with
upstream's keys: this is the model's `weights=tiny`) and its inputs/outputs under models/triposplat/golden/<part>/.

DiT (`dit_goldens`): upstream `LatentSeqMMFlowModel` at the tiny config of ../shared/notes/models.md (0.37 M params)
with upstream's own init under torch.manual_seed(0):
- io.safetensors: one batch-2 forward (two timesteps, seeded latent/camera/conditioning) and its outputs;
- sampler.safetensors: upstream's `sample_latent` (FlowEulerCfgSampler: 20 steps, CFG 3.0, shift 3.0, noise from
  a torch.Generator seeded 0) on seeded conditioning: every DiT call it made (inputs, 1000*t, outputs; a forward
  hook; step 0's inputs are the noise it drew) and the final latent and camera.
Wide DiT (`wide_dit_goldens`): real head width (64) and a point embedding with the exponent ramp, seeded weights
regenerated on both sides (models/triposplat/seeded.py); only inputs, outputs and the key -> shape manifest stored.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "triposplat" / "tiny"
GOLDEN = ROOT / "models" / "triposplat" / "golden"
UPSTREAM_COMMIT = "a78fa12"

TINY_DIT = dict(q_token_length=64, in_channels=16, cam_channels=5, out_channels=16, model_channels=64,
                cond_channels=48, cond2_channels=32, num_refiner_blocks=2, num_blocks=2, num_heads=4,
                num_head_channels=16, mlp_ratio=4, qk_rms_norm=True, share_mod=True, use_shift_table=True)
COND_TOKENS = 21          # 5 zero register tokens in feature2, like upstream's padding of the VAE latent
SAMPLER = dict(steps=20, guidance_scale=3.0, shift=3.0, seed=0)


def conditioning(batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    feature1 = torch.randn(batch, COND_TOKENS, TINY_DIT["cond_channels"], generator=generator)
    feature1 = F.layer_norm(feature1, feature1.shape[-1:])          # as upstream's encode_image does
    feature2 = torch.randn(batch, COND_TOKENS, TINY_DIT["cond2_channels"], generator=generator)
    feature2[:, :5] = 0
    return {"feature1": feature1, "feature2": feature2}


def write_part(name: str, config: dict, state: dict[str, torch.Tensor]) -> None:
    folder = TINY / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(folder / "model.safetensors"))
    index_path = TINY / "model_index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {"_class_name": "TripoSplat"}
    index[name] = ["triposplat", "upstream " + UPSTREAM_COMMIT]
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")


@torch.no_grad()
def dit_goldens() -> dict:
    import model as upstream            # upstream model.py, from the mirror (setup_triposplat_ref.sh)
    import triposplat as pipeline       # upstream triposplat.py

    torch.manual_seed(0)
    dit = upstream.LatentSeqMMFlowModel(**TINY_DIT).eval()
    write_part("dit", TINY_DIT, dit.state_dict())
    out = GOLDEN / "dit"
    out.mkdir(parents=True, exist_ok=True)

    # one batch-2 forward at two timesteps
    generator = torch.Generator().manual_seed(1)
    latent = torch.randn(2, TINY_DIT["q_token_length"], TINY_DIT["in_channels"], generator=generator)
    camera = torch.randn(2, 1, TINY_DIT["cam_channels"], generator=generator)
    cond = conditioning(2, generator)
    t = torch.tensor([1000.0 * 0.9, 1000.0 * 0.25])
    y = dit({"latent": latent, "camera": camera}, t, dict(cond))
    save_file({"latent": latent, "camera": camera, "t": t, **cond,
               "out_latent": y["latent"].contiguous(), "out_camera": y["camera"].contiguous()}, str(out / "io.safetensors"))

    # upstream's sampler, every DiT call recorded
    calls = []

    def record(_module, args, output):
        x_t, t_scaled, c = args
        calls.append({"latent": x_t["latent"].clone(), "camera": x_t["camera"].clone(), "t": t_scaled.clone(),
                      "conditional": float(c["feature1"].abs().sum()) > 0,
                      "out_latent": output["latent"].clone(), "out_camera": output["camera"].clone()})

    handle = dit.register_forward_hook(record)
    sample_cond = conditioning(1, torch.Generator().manual_seed(2))
    final = pipeline.sample_latent(dit, dict(sample_cond), steps=SAMPLER["steps"],
                                   guidance_scale=SAMPLER["guidance_scale"], shift=SAMPLER["shift"],
                                   generator=torch.Generator().manual_seed(SAMPLER["seed"]))
    handle.remove()
    tensors = {**{f"cond_{k}": v for k, v in sample_cond.items()},
               "final_latent": final["latent"].contiguous(), "final_camera": final["camera"].contiguous()}
    for i, call in enumerate(calls):
        branch = "cond" if call["conditional"] else "uncond"
        step = i // 2
        if (branch == "cond") != (i % 2 == 0):
            raise RuntimeError("upstream's CFG call order changed: conditional first, then unconditional")
        if branch == "cond":
            tensors.update({f"step{step}_latent": call["latent"], f"step{step}_camera": call["camera"],
                            f"step{step}_t": call["t"]})
        tensors.update({f"step{step}_{branch}_latent": call["out_latent"].contiguous(),
                        f"step{step}_{branch}_camera": call["out_camera"].contiguous()})
    save_file(tensors, str(out / "sampler.safetensors"))
    return {"dit": {"config": TINY_DIT, "params": sum(p.numel() for p in dit.parameters()),
                    "keys": len(dit.state_dict()), "cond_tokens": COND_TOKENS, "sampler": SAMPLER,
                    "forward_timesteps": t.tolist(), "sampler_calls": len(calls),
                    "io_seed": 1, "sampler_cond_seed": 2}}


# A wider DiT than the tiny one, at real head width: head_dim 64 (RePo RoPE split 20/20/24, as at real size) and
# 192 channels (point-embedding frequency count 32 > 16, so the ramp of exponents the real 1024 channels use is
# exercised; the tiny 64 channels stop at 10). Its 2.9 M weights are not committed: both sides draw them from
# models/triposplat/seeded.py by key and shape.
WIDE_DIT = dict(TINY_DIT, model_channels=192, num_heads=3, num_head_channels=64, num_blocks=1)
WIDE_SEED = 5


def _seeded_module():
    """models/triposplat/seeded.py by path: the zoo package does not import here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("triposplat_seeded", ROOT / "models" / "triposplat" / "seeded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def wide_dit_goldens() -> dict:
    import model as upstream

    dit = upstream.LatentSeqMMFlowModel(**WIDE_DIT).eval()
    shapes = {k: tuple(v.shape) for k, v in dit.state_dict().items()}
    dit.load_state_dict(_seeded_module().seeded_state_dict(shapes, WIDE_SEED), strict=True)
    generator = torch.Generator().manual_seed(3)
    latent = torch.randn(1, WIDE_DIT["q_token_length"], WIDE_DIT["in_channels"], generator=generator)
    camera = torch.randn(1, 1, WIDE_DIT["cam_channels"], generator=generator)
    cond = conditioning(1, generator)
    t = torch.tensor([1000.0 * 0.6])
    y = dit({"latent": latent, "camera": camera}, t, dict(cond))
    out = GOLDEN / "dit_wide"
    out.mkdir(parents=True, exist_ok=True)
    save_file({"latent": latent, "camera": camera, "t": t, **cond,
               "out_latent": y["latent"].contiguous(), "out_camera": y["camera"].contiguous()}, str(out / "io.safetensors"))
    (out / "shapes.json").write_text(json.dumps({k: list(v) for k, v in sorted(shapes.items())}, indent=1) + "\n")
    return {"dit_wide": {"config": WIDE_DIT, "seed": WIDE_SEED, "params": sum(p.numel() for p in dit.parameters()),
                         "forward_timesteps": t.tolist(), "io_seed": 3}}


PARTS = {"dit": dit_goldens, "dit_wide": wide_dit_goldens}   # the decoder goldens register here as "decoder"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=list(PARTS))
    args = parser.parse_args()
    provenance_path = GOLDEN / "provenance.json"
    provenance = json.loads(provenance_path.read_text()) if provenance_path.is_file() else {}
    for name in args.parts:
        provenance.update(PARTS[name]())
    mirror = "/work/.mirror/wiretronic+TripoSplat/repo"
    commit = subprocess.run(["git", "-C", mirror, "rev-parse", UPSTREAM_COMMIT], capture_output=True, text=True).stdout.strip()
    provenance["upstream"] = {"repo": "VAST-AI-Research/TripoSplat (mirror wiretronic/TripoSplat)",
                              "commit": commit or UPSTREAM_COMMIT, "torch": torch.__version__}
    GOLDEN.mkdir(parents=True, exist_ok=True)
    provenance_path.write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    print(json.dumps(provenance, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
