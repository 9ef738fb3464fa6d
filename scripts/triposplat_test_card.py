"""Write the RGBA test card the TripoSplat encoder gates use (models/triposplat/encoders.py `test_card`) as a PNG
cut-out, for `zoo generate triposplat --image` on the tiny bundles (README "Image encoders").

    python scripts/triposplat_test_card.py cutout.png [--size 256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from models.triposplat.encoders import test_card

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    Image.fromarray(test_card(args.size), "RGBA").save(args.out)
    print(f"wrote {args.out} ({args.size}x{args.size} RGBA)")


if __name__ == "__main__":
    main()
