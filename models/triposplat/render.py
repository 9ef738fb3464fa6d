"""A small splat rasteriser: decoded Gaussians -> a PNG (the README's eager-vs-converted picture).

Orthographic camera, anisotropic 2-D footprints from each Gaussian's projected 3-D covariance (R·S·Sᵀ·Rᵀ, plus
3DGS's 0.3 px² low-pass so sub-pixel splats stay visible), front-to-back alpha compositing in depth order with
rgb = clip(0.5 + C0·f_dc, 0, 1) on black. Not a viewer: no spherical harmonics beyond degree 0, no tiling; a
loop over Gaussians in numpy (real size, 262,144 Gaussians at 256 px, takes on the order of a minute).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.triposplat.ply import AXIS_TRANSFORM

SH_C0 = 0.28209479177387814
LOW_PASS = 0.3          # px², as the 3DGS rasteriser adds to every projected covariance
ALPHA_MAX = 0.99
MIN_ALPHA = 1.0 / 255
TRANSMITTANCE_FLOOR = 1e-4


def rotation_matrices(q: np.ndarray) -> np.ndarray:
    """(w, x, y, z) quaternions [M, 4] (any norm) -> rotation matrices [M, 3, 3]."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    return np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=1).reshape(-1, 3, 3)


def view_matrix(azimuth_deg: float, elevation_deg: float) -> np.ndarray:
    """World (y up, the .ply frame) -> camera: turn by azimuth about y, then tilt by elevation about x."""
    a, e = np.radians(azimuth_deg), np.radians(elevation_deg)
    turn = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    tilt = np.array([[1, 0, 0], [0, np.cos(e), -np.sin(e)], [0, np.sin(e), np.cos(e)]])
    return tilt @ turn


def render(gaussians: dict[str, torch.Tensor], size: int = 256, azimuth: float = 30.0, elevation: float = 15.0,
           extent: float = 1.1) -> np.ndarray:
    """Activated Gaussians (octree.gaussian_parameters: xyz in [-0.5, 0.5]³ upstream frame) -> [size, size, 3]
    float rgb in [0, 1]. `extent`: the world width the image spans."""
    view = view_matrix(azimuth, elevation) @ AXIS_TRANSFORM.astype(np.float64)
    xyz = gaussians["xyz"].double().numpy() @ view.T
    rgb = np.clip(0.5 + SH_C0 * gaussians["f_dc"].double().numpy(), 0.0, 1.0)
    opacity = gaussians["opacity"].double().numpy().reshape(-1)
    scale = gaussians["scale"].double().numpy()
    rot = view[None] @ rotation_matrices(gaussians["rotation"].double().numpy())
    px = size / extent
    # projected covariance (orthographic: the top-left 2x2 of the camera-frame covariance), in pixels²
    m = rot * scale[:, None, :]
    cov = (m @ m.transpose(0, 2, 1))[:, :2, :2] * px * px
    cov[:, 0, 0] += LOW_PASS
    cov[:, 1, 1] += LOW_PASS
    det = cov[:, 0, 0] * cov[:, 1, 1] - cov[:, 0, 1] ** 2
    inv = np.stack([cov[:, 1, 1], -cov[:, 0, 1], cov[:, 0, 0]], axis=1) / det[:, None]
    radius = np.ceil(3.0 * np.sqrt(np.maximum(cov[:, 0, 0], cov[:, 1, 1])))
    cx = (xyz[:, 0] + extent / 2) * px - 0.5
    cy = (extent / 2 - xyz[:, 1]) * px - 0.5           # image rows grow downwards
    image = np.zeros((size, size, 3))
    transmittance = np.ones((size, size))
    for i in np.argsort(-xyz[:, 2], kind="stable"):     # nearest first (the camera looks down -z)
        x0, x1 = int(max(0, cx[i] - radius[i])), int(min(size - 1, cx[i] + radius[i]))
        y0, y1 = int(max(0, cy[i] - radius[i])), int(min(size - 1, cy[i] + radius[i]))
        if x0 > x1 or y0 > y1:
            continue
        dx = np.arange(x0, x1 + 1)[None, :] - cx[i]
        dy = np.arange(y0, y1 + 1)[:, None] - cy[i]
        power = -0.5 * (inv[i, 0] * dx * dx + 2 * inv[i, 1] * dx * dy + inv[i, 2] * dy * dy)
        alpha = np.minimum(ALPHA_MAX, opacity[i] * np.exp(power))
        alpha[alpha < MIN_ALPHA] = 0.0
        t = transmittance[y0:y1 + 1, x0:x1 + 1]
        image[y0:y1 + 1, x0:x1 + 1] += (t * alpha)[..., None] * rgb[i]
        transmittance[y0:y1 + 1, x0:x1 + 1] = t * (1 - alpha)
        if transmittance.max() < TRANSMITTANCE_FLOOR:
            break
    return np.clip(image, 0.0, 1.0)


def save_png(path: str | Path, images: list[np.ndarray], gap: int = 4) -> Path:
    """Images side by side (e.g. eager | converted) on one PNG, separated by a grey gap."""
    from PIL import Image

    h = max(im.shape[0] for im in images)
    parts = []
    for k, im in enumerate(images):
        if k:
            parts.append(np.full((h, gap, 3), 0.5))
        parts.append(im)
    strip = (np.concatenate(parts, axis=1) * 255 + 0.5).astype(np.uint8)
    Image.fromarray(strip).save(path)
    return Path(path)
