"""The README picture of models/ltx_video: the tiny pipeline's frames, eager vs each converted target.

    make convert MODEL=ltx-video OUT=exports      # tiny bundles for both targets
    .venv/bin/python scripts/ltx_video_frames.py --bundles exports/ltx-video

Rows: diffusers' eager LTXPipeline, then the host-side sampler driving the saved Core AI and LiteRT bundles
(free-running: every step feeds on the bundle's own previous output), same prompt and seed. Writes
models/ltx_video/frames.png and prints the end-to-end numbers that the README quotes (reported, not gated),
next to the spread between two eager runs that differ only in the seed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

OUT = ROOT / "models" / "ltx_video" / "frames.png"


def bundle_frames(folder: Path, target: str, cfg) -> np.ndarray:
    from models.ltx_video import DECODER_FILE, SAMPLER_FILE, TOKENIZER_DIR
    from models.ltx_video.sampler import bundle_networks, read_json, sample
    from transformers import AutoTokenizer
    from zoo import integrity
    from zoo.generate import open_session
    from zoo.generate_pipeline import find_bundles, pick_bundles

    _, _, bundles = pick_bundles(find_bundles(folder), "ltx-video", target)
    with contextlib.ExitStack() as stack:
        sessions = {n: stack.enter_context(open_session(b, integrity.read_manifest(b))) for n, b in bundles.items()}
        return sample(bundle_networks(sessions), AutoTokenizer.from_pretrained(bundles["text-encoder"] / TOKENIZER_DIR),
                      read_json(bundles["dit"], SAMPLER_FILE), read_json(bundles["vae-decoder"], DECODER_FILE))


def labelled_rows(rows: list[tuple[str, np.ndarray]], scale: int = 4):
    from PIL import Image, ImageDraw

    frames, h, w = rows[0][1].shape[0], rows[0][1].shape[1] * scale, rows[0][1].shape[2] * scale
    label_w = 150
    sheet = Image.new("RGB", (label_w + frames * (w + 2), len(rows) * (h + 2)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for r, (label, video) in enumerate(rows):
        draw.text((4, r * (h + 2) + h // 2 - 6), label, fill=(0, 0, 0))
        for f in range(frames):
            tile = Image.fromarray((video[f] * 255).round().astype(np.uint8)).resize((w, h), Image.NEAREST)
            sheet.paste(tile, (label_w + f * (w + 2), r * (h + 2)))
    return sheet


def main() -> None:
    from models.ltx_video import eager_run
    from zoo import gates, weights
    from zoo.registry import get_spec, load_model_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, default=ROOT / "exports" / "ltx-video")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cfg = load_model_config("ltx-video")
    spec = get_spec(cfg)
    checkpoint = weights.resolve(cfg, "tiny", spec.tiny_dir, spec.random_checkpoint)
    eager = eager_run(checkpoint, cfg).frames.numpy()
    rows = [("eager (diffusers)", eager)]
    for target in ("coreai", "litert"):
        rows.append((f"{target} bundles", bundle_frames(args.bundles, target, cfg)))
    other_seed = cfg.copy()
    other_seed.seed = int(cfg.seed) + 1
    reseeded = eager_run(checkpoint, other_seed).frames.numpy()
    labelled_rows(rows).save(args.out)
    print(f"wrote {args.out}  (prompt {cfg.prompt!r}, seed {cfg.seed}, {cfg.sampler.steps} steps)")
    for label, video in rows[1:]:
        print(f"{label} vs eager: cosine {gates.cosine(video, eager):.9f}, PSNR {gates.psnr(video, eager):.1f} dB, "
              f"max abs {gates.max_abs(video, eager):.2e}")
    print(f"eager seed {cfg.seed} vs seed {cfg.seed + 1} (sampler variance): cosine {gates.cosine(reseeded, eager):.4f}, "
          f"PSNR {gates.psnr(reseeded, eager):.1f} dB")


if __name__ == "__main__":
    main()
