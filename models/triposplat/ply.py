"""The standard 3D Gaussian Splatting .ply (Inria 3DGS layout), written and read back.

Binary little-endian, one `vertex` element, float32 properties in this order:
x y z, nx ny nz (zeros), f_dc_0..2 (SH degree-0 coefficients), opacity (pre-sigmoid logit), scale_0..2
(log of the activated scales), rot_0..3 (quaternion w x y z). That is what the Inria `save_ply`, common splat
viewers and upstream TripoSplat's own `Gaussian.to_ply_bytes` write; as upstream does, points are turned by
its default axis transform (x, y, z) -> (x, -z, y) and the rotations with them, so viewers show the object
upright. tests/test_triposplat_decoders.py compares these bytes with upstream's own file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from zoo.errors import ZooError

PROPERTIES = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
              + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)])
# upstream's default export transform: a +90° turn about x, as a matrix and as the unit quaternion (w, x, y, z)
AXIS_TRANSFORM = np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]], dtype=np.float32)
AXIS_QUATERNION = np.array([np.sqrt(0.5), np.sqrt(0.5), 0.0, 0.0])


def quaternion_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of (w, x, y, z) quaternions [..., 4]; a ⊗ b rotates by b, then by a."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], axis=-1)


def ply_arrays(gaussians: dict[str, torch.Tensor]) -> np.ndarray:
    """Activated Gaussians (octree.gaussian_parameters) -> [M, 17] float32 rows in PROPERTIES order."""
    xyz = gaussians["xyz"].double().numpy() @ AXIS_TRANSFORM.T.astype(np.float64)
    rotation = gaussians["rotation"].double().numpy()
    rotation = rotation / np.linalg.norm(rotation, axis=-1, keepdims=True)
    rotation = quaternion_product(AXIS_QUATERNION, rotation)
    rotation = rotation * np.where(rotation[:, :1] < 0, -1.0, 1.0)   # one sign per rotation: w ≥ 0, as upstream
    opacity = gaussians["opacity"].double().numpy()
    columns = [xyz, np.zeros_like(xyz), gaussians["f_dc"].double().numpy(), np.log(opacity / (1 - opacity)),
               np.log(gaussians["scale"].double().numpy()), rotation]
    return np.concatenate(columns, axis=1).astype(np.float32)


def ply_bytes(rows: np.ndarray) -> bytes:
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if rows.ndim != 2 or rows.shape[1] != len(PROPERTIES):
        raise ValueError(f"expected [M, {len(PROPERTIES)}] rows, got {rows.shape}")
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {rows.shape[0]}"]
    header += [f"property float {name}" for name in PROPERTIES] + ["end_header"]
    return ("\n".join(header) + "\n").encode("ascii") + rows.tobytes()


def write_ply(path: str | Path, gaussians: dict[str, torch.Tensor]) -> int:
    """Write the splat file; returns the Gaussian count."""
    rows = ply_arrays(gaussians)
    Path(path).write_bytes(ply_bytes(rows))
    return rows.shape[0]


def read_ply(data: bytes | str | Path) -> dict[str, np.ndarray]:
    """A binary little-endian PLY's single vertex element -> {property: float32 array} (the 3DGS files this
    writes, or upstream's). Anything else is refused with a ZooError naming what it found."""
    if not isinstance(data, (bytes, bytearray)):
        data = Path(data).read_bytes()
    end = data.find(b"end_header\n")
    if not data.startswith(b"ply\n") or end < 0:
        raise ZooError("Not a PLY file (no 'ply' magic or no end_header).", "pass a .ply written by `zoo generate`.")
    lines = data[:end].decode("ascii").splitlines()
    if "format binary_little_endian 1.0" not in lines:
        raise ZooError("Only binary little-endian PLY files are read.", "write the file as binary_little_endian.")
    count, names = None, []
    for line in lines:
        words = line.split()
        if words[:2] == ["element", "vertex"]:
            count = int(words[2])
        elif words[:1] == ["element"]:
            raise ZooError(f"Unexpected PLY element '{words[1]}'.", "a 3DGS file holds only vertices.")
        elif words[:1] == ["property"]:
            if words[1] != "float":
                raise ZooError(f"PLY property '{words[-1]}' is {words[1]}, not float.", "a 3DGS file is all float32.")
            names.append(words[2])
    body = np.frombuffer(data, dtype="<f4", offset=end + len(b"end_header\n"))
    if count is None or body.size != count * len(names):
        raise ZooError(f"PLY body holds {body.size} floats, not {count} vertices × {len(names)} properties.",
                       "the file is truncated or not a 3DGS splat file.")
    rows = body.reshape(count, len(names))
    return {name: rows[:, i].copy() for i, name in enumerate(names)}
