"""Test photographs and the preprocessing upstream applies before its network.

The photos are real ones that ship inside the scikit-image wheel (`skimage/data/*.png|jpg`, pinned in
pyproject.toml): read from the package folder with PIL, no download. Upstream `RFDETR.predict` squashes an
image to the square model resolution (torchvision `F.resize`, bilinear with antialias, no letterbox) and
scales it to [0, 1]; the ImageNet normalisation is inside our graph.
"""

from __future__ import annotations

from importlib.resources import files

import numpy as np
import torch
import torch.nn.functional as F

from zoo.errors import ZooError

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg")


def photo(name: str) -> np.ndarray:
    """An RGB uint8 [H, W, 3] photograph from scikit-image's bundled data."""
    from PIL import Image

    try:
        path = files("skimage") / "data" / name
    except ModuleNotFoundError as exc:
        raise ZooError("scikit-image is not installed (its wheel ships the test photographs).",
                       "run `make setup` (pyproject pins scikit-image).") from exc
    if not path.is_file():
        raise ZooError(f"scikit-image has no bundled photo '{name}'.", f"use one of {', '.join(PHOTOS)}.")
    with Image.open(str(path)) as image:
        return np.array(image.convert("RGB"))  # a writable copy (torch.from_numpy warns on read-only)


def to_model_input(rgb: np.ndarray, resolution: int) -> torch.Tensor:
    """uint8 [H, W, 3] → float [1, 3, R, R] in [0, 1], squashed like upstream's predict (bilinear, antialias)."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ZooError(f"expected an RGB uint8 image [H, W, 3], got {rgb.dtype} {list(rgb.shape)}.",
                       "convert the image to 8-bit RGB first (PIL: Image.convert('RGB')).")
    x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255.0
    x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=True)
    return x.clamp(0.0, 1.0)
