"""The README picture: one RGBA cut-out turned into Gaussians eagerly and through the five saved bundles, rendered.

    python -m zoo.convert model=triposplat target=litert        # the five components, LiteRT fp16 (tiny)
    python scripts/triposplat_picture.py --bundles exports/triposplat --target litert \
        --out models/triposplat/pipeline.png

Both runs take the same cut-out (`--image`, default the gates' test card, encoders.test_card) and the same seed:
eager = the library encoders (transformers DINOv3, diffusers FLUX.2 VAE) and the port's DiT and decoders in fp32;
converted = `zoo generate`'s own chain over the saved bundles (bundles.bundle_chain). Tiny seeded weights make a
cloud, not an object. Prints one line per figure (the README quotes them) and writes eager | converted side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.triposplat import bundles as tripo_bundles  # noqa: E402
from models.triposplat import decoding, encoders, image_input, render  # noqa: E402
from zoo import gates, integrity, weights  # noqa: E402
from zoo.generate import open_session  # noqa: E402
from zoo.registry import get_spec, load_model_config  # noqa: E402

COMPONENTS = ("image-encoder", "vae-encoder", "dit", "octree-decoder", "gaussian-decoder")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, default=ROOT / "exports" / "triposplat")
    parser.add_argument("--target", default="litert", choices=["litert", "coreai"])
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--weights", default="tiny")
    parser.add_argument("--image", type=Path, default=None, help="an RGBA cut-out (default: the test card)")
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "triposplat" / "pipeline.png")
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()

    cfg = load_model_config("triposplat")
    spec = get_spec(cfg)
    checkpoint = weights.resolve(cfg, args.weights, spec.tiny_dir, spec.random_checkpoint)
    seed = int(cfg.seed)
    cutout = image_input.open_image(args.image) if args.image else Image.fromarray(encoders.test_card(150), "RGBA")
    eager_chain = tripo_bundles.eager_chain(checkpoint, cfg)
    folders = {c: args.bundles / c / f"{args.target}-{args.precision}" for c in COMPONENTS}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for component, folder in folders.items():
            integrity.verify_bundle(folder)
            sessions[component] = stack.enter_context(open_session(folder, integrity.read_manifest(folder)))
        converted_chain, image_size = tripo_bundles.bundle_chain(sessions, folders)
        pixels = image_input.prepare(cutout, image_size, str(args.image or "the test card"))
        converted, converted_cond = tripo_bundles.chain(converted_chain, pixels, seed)
    eager, eager_cond = tripo_bundles.chain(eager_chain, pixels, seed)

    rgb = {name: np.clip(0.5 + decoding.SH_C0 * g["f_dc"].numpy(), 0, 1)
           for name, g in (("eager", eager), ("converted", converted))}
    images = [render.render(eager, size=args.size), render.render(converted, size=args.size)]
    render.save_png(args.out, images)
    print(f"bundles: {args.target}-{args.precision} ({args.weights} weights), {image_size}² composite, seed {seed}, "
          f"{eager['xyz'].shape[0]} Gaussians each")
    for name in ("feature1", "feature2"):
        print(f"{name} (encoder output) cosine converted vs eager: "
              f"{gates.cosine(converted_cond[name].numpy(), eager_cond[name].numpy()):.7f}")
    print(f"Gaussian centres cosine converted vs eager: {gates.cosine(converted['xyz'].numpy(), eager['xyz'].numpy()):.7f}")
    for name, values in rgb.items():
        print(f"{name}: rgb std {values.std():.4f}, mean chroma {gates.chroma(values).mean():.4f}")
    print(f"rgb_std_deviation {gates.rgb_std_deviation(rgb['converted'], rgb['eager']):.2e}, "
          f"chroma_deviation {gates.chroma_deviation(rgb['converted'], rgb['eager']):.2e}")
    print(f"image max-abs difference (0-1 scale): {np.abs(images[0] - images[1]).max():.4f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    with torch.no_grad():
        main()
