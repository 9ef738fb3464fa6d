"""Which form of a modulated deformable convolution (BiRefNet's _DeformableConv2d) lowers where.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/deform_conv_lowering.py

One 3x3 DCNv2 layer (offsets and 2·sigmoid mask from plain convolutions, as upstream) on a [1, 4, 8, 8] map,
with its bilinear sampling in three forms (zoo/rewrites/deformable.py):
- gather: four corner-row index_selects;
- tent: tent-weight matmuls, no gather;
- grid_sample: torch's F.grid_sample (bilinear, zeros, align_corners=False) on the same pixel coordinates.
Each is converted with litert-torch (ops emitted, CPU interpreter vs eager, then the LiteRT GPU delegate check:
accepted or not, and its fp32 numerics vs the CPU) and with coreai-torch (converted or the error, then the
artifact on the Core AI CPU runtime vs eager). torchvision's own op cannot be tried: torchvision cannot live in
this venv (its parity with the two forms is tests/test_deform_conv.py's, on upstream's golden output).
Last, the largest buffer each form needs in the real BiRefNet (1024² input), per deformable layer size.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zoo.quiet  # noqa: E402,F401
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from zoo import gates  # noqa: E402
from zoo.rewrites import deformable  # noqa: E402


def grid_sample_deform(x, offset, weight, mask, padding):
    """The same DCNv2 with the sampling done by F.grid_sample (pixel coordinates -> [-1, 1], align_corners=False)."""
    b, c, h, w = x.shape
    cout, _, kh, kw = weight.shape
    k = kh * kw
    ho, wo = offset.shape[-2:]
    gy, gx = deformable.tap_grid((kh, kw), (ho, wo), (1, 1), (padding, padding), (1, 1))
    pairs = offset.reshape(b, k, 2, ho * wo)
    iy = pairs[:, :, 0] + torch.from_numpy(gy).float()
    ix = pairs[:, :, 1] + torch.from_numpy(gx).float()
    grid = torch.stack([(2 * ix + 1) / w - 1, (2 * iy + 1) / h - 1], -1)            # [B, K, P, 2]
    taps = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)   # [B, C, K, P]
    taps = taps * mask.reshape(b, 1, k, ho * wo)
    cols = taps.permute(0, 3, 2, 1).reshape(b, ho * wo, k * c)
    out = F.linear(cols, weight.permute(0, 2, 3, 1).reshape(cout, k * c))
    return out.transpose(1, 2).reshape(b, cout, ho, wo)


class DCN(nn.Module):
    def __init__(self, form: str, c: int = 4, k: int = 3):
        super().__init__()
        self.form, self.pad = form, k // 2
        self.offset_conv = nn.Conv2d(c, 2 * k * k, k, 1, k // 2)
        self.modulator_conv = nn.Conv2d(c, k * k, k, 1, k // 2)
        self.regular_conv = nn.Conv2d(c, c, k, 1, k // 2, bias=False)

    def forward(self, x):
        offset = self.offset_conv(x)
        mask = 2.0 * torch.sigmoid(self.modulator_conv(x))
        if self.form == "grid_sample":
            return grid_sample_deform(x, offset, self.regular_conv.weight, mask, self.pad)
        return deformable.deform_conv2d(x, offset, self.regular_conv.weight, None, padding=self.pad, mask=mask,
                                        sampler=self.form)


def litert_row(module, x, ref, folder: Path) -> str:
    from zoo.rewrites import inspect as tfl
    from zoo.targets.litert_gpu import gpu_check

    try:
        path = tfl.convert_to_tflite(module, (x,), folder / f"{module.form}.tflite")
    except Exception as exc:   # noqa: BLE001  (the refusal is the measurement)
        return f"conversion failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    ops = sorted(set(tfl.ops_in_tflite(path)))
    cpu = tfl.run_tflite_cpu(path, (x,))[0]
    check = gpu_check(path, {"serving_default": {"args_0": x.numpy()}})
    rel32 = [o.fp32_rel_err for outs in check.outputs.values() for o in outs.values()] if check.outputs else []
    rejected = sorted({f"{o['op']}: {o['reason'][:80]}" for o in (check.rejected_ops or [])})
    return (f"ops {ops}; CPU cos {gates.cosine(cpu, ref):.7f}, max-abs {np.abs(cpu - ref).max():.2e}; GPU "
            f"{check.status}" + (f", fp32 rel err vs CPU {max(rel32):.2e}" if rel32 and None not in rel32 else "")
            + (f"; rejected {rejected}" if rejected else ""))


def coreai_row(module, x, ref, folder: Path) -> str:
    from zoo.targets import Entry
    from zoo.targets.coreai import CoreAITarget, convert_programs, export_entry

    entry = Entry("main", module, {"x": x}, ["y"])
    try:
        program = convert_programs([entry], [export_entry(entry)])
    except Exception as exc:   # noqa: BLE001
        return f"conversion failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    dest = folder / f"coreai-{module.form}"
    dest.mkdir()
    target = CoreAITarget()
    path = target.save(program, dest, {})
    with target.open(path) as runner:
        out = np.asarray(runner.run("main", {"x": x.numpy()})["y"])
    return f"converted; Core AI CPU runtime cos {gates.cosine(out, ref):.7f}, max-abs {np.abs(out - ref).max():.2e}"


def main(argv: list[str]) -> int:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        for form in ("gather", "tent", "grid_sample"):
            module = DCN(form).eval()
            if form == "gather":
                reference = module
            else:
                module.load_state_dict(reference.state_dict())
            with torch.no_grad():
                ref = reference(x).numpy()
                print(f"{form}: eager vs the gather form max-abs {np.abs(module(x).numpy() - ref).max():.2e}")
                print(f"  litert: {litert_row(module, x, ref, Path(tmp))}")
                print(f"  coreai: {coreai_row(module, x, ref, Path(tmp))}")
    real_size_buffers()
    return 0


def real_size_buffers() -> None:
    """Real BiRefNet: the deformable layers take block_channels (64) channels at the decoder's levels (strides 32,
    16, 8, 4 of 1024²), kernels 1, 3, 7. tent: [C·H, taps·pixels]; gather: the sampled taps [taps·pixels, C]."""
    from models.triposplat.background import SWIN_STRIDES, BiRefNetConfig

    cfg = BiRefNetConfig()
    c = cfg.block_channels
    for stride in reversed(SWIN_STRIDES):
        side = cfg.image_size // stride
        for k in cfg.aspp_kernels:
            tent = deformable.tent_intermediate_bytes(c, side, k * k, side * side)
            gather = c * k * k * side * side * 4
            print(f"real {side}x{side}, kernel {k}: tent {tent / 2**20:,.1f} MiB, gather {gather / 2**20:,.1f} MiB (fp32)")


if __name__ == "__main__":
    from zoo.cli import run_script

    run_script(main, sys.argv[1:])
