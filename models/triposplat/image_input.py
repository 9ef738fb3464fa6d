"""The input image -> the RGB composite both encoders see: upstream's `preprocess_image` (triposplat.py, a78fa12).

Upstream: resize so the short side is the canvas (LANCZOS); if the image has no real alpha (not RGBA, or every
alpha 255), BiRefNet cuts the object out; erode the alpha by one pixel (3x3 minimum filter); crop a square 1.2x
the alpha's bounding box around its centre (outside the image: transparent); resize to the canvas (LANCZOS);
composite on black. The cut-out is the `background-remover` component's (models/triposplat/background.py): `prepare`
takes its matte as a callable. Without one (no background-remover bundle), an image without real alpha is refused
with the fix named — guessing a matte would condition the DiT on the background.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFilter, UnidentifiedImageError

from zoo.errors import ZooError

CROP_MARGIN = 1.2       # upstream: half = max(bbox w, h) / 2 * 1.2
ERODE_RADIUS = 1        # upstream's default


def open_image(path: Path) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        raise ZooError(f"--image {path} is not a file.", "pass the path of an RGBA cut-out (PNG or WebP with alpha).")
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ZooError(f"--image {path} could not be read as an image ({type(exc).__name__}).",
                       "pass a PNG or WebP RGBA cut-out.") from exc


def has_real_alpha(image: Image.Image) -> bool:
    """upstream's test: RGBA with at least one alpha below 255 (LA and P-with-transparency are converted first)."""
    if image.mode in ("LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
    return image.mode == "RGBA" and int(np.asarray(image.getchannel("A")).min()) < 255


def resize_short_side(image: Image.Image, size: int) -> Image.Image:
    """upstream's first step: the short side to `size`, LANCZOS (PIL returns a copy when the size is already right,
    so `composite` after this resizes nothing twice)."""
    w, h = image.size
    scale = size / min(w, h)
    return image.resize((max(1, int(round(w * scale))), max(1, int(round(h * scale)))), Image.LANCZOS)


def cut_out(image: Image.Image, size: int, matte) -> Image.Image:
    """upstream's path for an image without real alpha: resized first, then `matte(rgb) -> uint8 [H, W]` (its
    BiRefNet.remove_background) puts the alpha on that resized RGB image."""
    rgb = resize_short_side(image.convert("RGB"), size)
    alpha = np.asarray(matte(rgb), dtype=np.uint8)
    if alpha.shape != (rgb.height, rgb.width):
        raise ZooError(f"The background remover answered a {alpha.shape} matte for a {rgb.width}x{rgb.height} image.",
                       "re-convert the background-remover component.")
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(alpha, "L"))
    return rgba


def composite(image: Image.Image, size: int, source: str = "the image") -> Image.Image:
    """upstream's preprocess_image from the resize on, for an image that has real alpha: RGB [size, size]."""
    if image.mode != "RGBA":
        image = image.convert("RGBA")
    image = resize_short_side(image, size)
    if ERODE_RADIUS > 0:
        image.putalpha(image.getchannel("A").filter(ImageFilter.MinFilter(2 * ERODE_RADIUS + 1)))
    alpha = np.asarray(image.getchannel("A"))
    ys, xs = np.nonzero(alpha)
    if len(xs) == 0:
        raise ZooError(f"{source} is fully transparent (after upstream's 1-pixel alpha erosion): there is no object "
                       "to crop.", "pass a cut-out whose alpha covers the object.")
    x0, y0, x1, y1 = xs.min(), ys.min(), xs.max(), ys.max()
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    half = max(x1 - x0, y1 - y0) / 2 * CROP_MARGIN
    image = image.crop([int(cx - half), int(cy - half), int(cx + half), int(cy + half)])
    image = image.resize((size, size), Image.LANCZOS)
    background = Image.new("RGB", (size, size), (0, 0, 0))
    background.paste(image, mask=image.split()[3])
    return background


def to_tensor(image: Image.Image) -> torch.Tensor:
    """torchvision's ToTensor for an RGB image: [1, 3, H, W] float32 in [0, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array.transpose(2, 0, 1).copy()).unsqueeze(0)


def prepare(image: Image.Image, size: int, source: str = "the image", matte=None) -> torch.Tensor:
    """An image -> the encoders' `image` input [1, 3, size, size]. An RGBA cut-out keeps its alpha (as upstream);
    an image without real alpha is cut out by `matte` (the background-remover bundle), or, with none, refused
    (ZooError, exit 2)."""
    if not has_real_alpha(image):
        if matte is None:
            raise ZooError(f"{source} has no transparent pixels (mode {image.mode}): TripoSplat needs the object cut "
                           "out of its background, which upstream does with BiRefNet, and the bundle folder has no "
                           "background-remover bundle (models/triposplat/README.md, 'Background removal').",
                           "convert it (`zoo convert model=triposplat component=background-remover target=...`) into "
                           "the same folder, or remove the background first (any matting tool, e.g. `rembg i photo.jpg "
                           "cutout.png`) and pass the RGBA PNG.")
        image = cut_out(image, size, matte)   # a matte of 255 everywhere crops the whole image, as upstream
    return to_tensor(composite(image, size, source))


def load(path: Path, size: int, matte=None) -> torch.Tensor:
    return prepare(open_image(path), size, f"--image {path}", matte)
