"""The README picture: one latent decoded to Gaussians eagerly and through the saved decoder bundles, rendered.

    python -m zoo.convert model=triposplat 'component=[octree-decoder,gaussian-decoder]' target=litert
    python scripts/triposplat_decoder_picture.py --bundles exports/triposplat --target litert \
        --out models/triposplat/decoders.png

The latent is the eager DiT sampler's final latent on the configured weights (tiny by default: seeded random
weights, so the splats are a cloud, not an object). Both decodes use the same octree seed; the script prints the
colour statistics of each, the fraction of sampled points that are identical, and writes eager | converted side
by side. Prints one line per figure (the README quotes them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.triposplat import decoding, octree, render  # noqa: E402
from zoo import gates, integrity, weights  # noqa: E402
from zoo.generate import open_session  # noqa: E402
from zoo.registry import get_spec, load_model_config  # noqa: E402


def session_graph(session, output: str):
    def call(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.from_numpy(np.asarray(session.run({k: v.numpy() for k, v in inputs.items()})[output]))
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, default=ROOT / "exports" / "triposplat")
    parser.add_argument("--target", default="litert", choices=["litert", "coreai"])
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--weights", default="tiny")
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "triposplat" / "decoders.png")
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()

    cfg = load_model_config("triposplat")
    spec = get_spec(cfg)
    checkpoint = weights.resolve(cfg, args.weights, spec.tiny_dir, spec.random_checkpoint)
    import models.triposplat as tripo
    latent = tripo.eager_run(checkpoint, cfg).final["latent"]
    facts = decoding.decoder_facts(checkpoint, cfg)
    seed = int(cfg.seed)

    oct_model = decoding.octree_reference(checkpoint, cfg)
    gs_model = decoding.gaussian_reference(checkpoint, cfg)
    eager, eager_features, eager_points = octree.decode_latent(lambda kw: oct_model(**kw), lambda kw: gs_model(**kw), latent, facts,
                                                 torch.Generator().manual_seed(seed))
    bundles = {c: args.bundles / c / f"{args.target}-{args.precision}" for c in ("octree-decoder", "gaussian-decoder")}
    for bundle in bundles.values():
        integrity.verify_bundle(bundle)
    with open_session(bundles["octree-decoder"], integrity.read_manifest(bundles["octree-decoder"])) as oct_session, \
            open_session(bundles["gaussian-decoder"], integrity.read_manifest(bundles["gaussian-decoder"])) as gs_session:
        converted, converted_features, converted_points = octree.decode_latent(session_graph(oct_session, "logits"),
                                                             session_graph(gs_session, "features"), latent, facts,
                                                             torch.Generator().manual_seed(seed))
    same_points = float((eager_points == converted_points).all(dim=-1).float().mean())
    rgb = {name: np.clip(0.5 + decoding.SH_C0 * g["f_dc"].numpy(), 0, 1) for name, g in (("eager", eager), ("converted", converted))}
    images = [render.render(eager, size=args.size), render.render(converted, size=args.size)]
    render.save_png(args.out, images)
    print(f"bundles: {args.target}-{args.precision} ({args.weights} weights), {eager['xyz'].shape[0]} Gaussians each")
    print(f"octree points sampled identically (same seed): {same_points:.4f}")
    print(f"features cosine converted vs eager: {gates.cosine(converted_features.numpy(), eager_features.numpy()):.7f}")
    for name, values in rgb.items():
        print(f"{name}: rgb std {values.std():.4f}, mean chroma {gates.chroma(values).mean():.4f}")
    print(f"rgb_std_deviation {gates.rgb_std_deviation(rgb['converted'], rgb['eager']):.2e}, "
          f"chroma_deviation {gates.chroma_deviation(rgb['converted'], rgb['eager']):.2e}")
    print(f"image max-abs difference (0-1 scale): {np.abs(images[0] - images[1]).max():.4f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
