"""zoo.rewrites.deformable: torchvision.ops.deform_conv2d (DCNv2) in both sampler forms, eager.

Held to closed-form cases and to torchvision's own output on upstream BiRefNet's golden layer
(models/triposplat/golden/background_tiny_io.safetensors `deform.*`, made in the reference venv by
scripts/make_triposplat_background_goldens.py); border-clamped sampling is the negative control. Which form lowers
where (and what the LiteRT GPU delegate accepts) is scripts/deform_conv_lowering.py's measurement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from zoo.rewrites.deformable import SAMPLERS, deform_conv2d, tap_grid

GOLDEN = Path(__file__).resolve().parent.parent / "models" / "triposplat" / "golden" / "background_tiny_io.safetensors"


def rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 1, 1, 1), (3, 2, 1, 1), (3, 1, 2, 2), (1, 1, 0, 1)])
def test_zero_offsets_and_unit_mask_are_a_plain_convolution(sampler, kernel, stride, padding, dilation):
    x, w, b = rand(1, 3, 7, 9), rand(4, 3, kernel, kernel, seed=1), rand(4, seed=2)
    ho = (7 + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    wo = (9 + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    offset = torch.zeros(1, 2 * kernel * kernel, ho, wo)
    out = deform_conv2d(x, offset, w, b, stride, padding, dilation, None, sampler)
    ref = F.conv2d(x, w, b, stride, padding, dilation)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_fractional_offsets_interpolate_and_fade_to_zero_past_the_border(sampler):
    """A 1x1 kernel of weight 1 samples x itself: at y = row + 0.5 the mean of two rows; past the last row the
    sample fades linearly (zero padding: y = 3.5 on 4 rows reads half of row 3) and is 0 from y = 4 on, and from
    y = -1 down; the mask multiplies."""
    x = rand(1, 1, 4, 5)
    w = torch.ones(1, 1, 1, 1)
    rows = torch.arange(4.0).reshape(1, 1, 4, 1)

    def at(y_abs, mask=None):
        offset = torch.zeros(1, 2, 4, 5)
        offset[:, 0:1] = y_abs - rows                     # every output row samples absolute y = y_abs
        return deform_conv2d(x, offset, w, mask=mask, sampler=sampler)[0, 0, 0]

    assert torch.allclose(at(1.5), (x[0, 0, 1] + x[0, 0, 2]) / 2, atol=1e-6)
    assert torch.allclose(at(3.5), 0.5 * x[0, 0, 3], atol=1e-6)
    assert torch.allclose(at(-0.25), 0.75 * x[0, 0, 0], atol=1e-6)
    for outside in (4.0, 5.3, -1.0, -2.5):
        assert torch.equal(at(outside), torch.zeros(5))
    half = torch.full((1, 1, 4, 5), 0.5)
    assert torch.allclose(at(2.0, half), 0.5 * x[0, 0, 2], atol=1e-6)


def test_tap_grid_is_torchvisions_undeformed_sampling_positions():
    y, x = tap_grid((3, 2), (2, 3), (2, 1), (1, 0), (1, 2))
    # tap (i, j) = (1, 1) at output (1, 2): y = 1·2 - 1 + 1·1 = 2, x = 2·1 - 0 + 1·2 = 4
    assert y[1 * 2 + 1, 1 * 3 + 2] == 2 and x[1 * 2 + 1, 1 * 3 + 2] == 4
    assert y.shape == x.shape == (6, 6)


@pytest.fixture(scope="module")
def golden_layer():
    io = load_file(str(GOLDEN))
    return {k[len("deform."):]: v for k, v in io.items() if k.startswith("deform.")}


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_both_forms_match_torchvision_on_upstreams_golden_layer(golden_layer, sampler):
    g = golden_layer
    k = g["weight"].shape[-1]
    out = deform_conv2d(g["input"], g["offset"], g["weight"], None, padding=k // 2, mask=g["mask"], sampler=sampler)
    ref = g["output"]
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_border_clamped_sampling_fails_the_golden_layer(golden_layer):
    """Negative control: the same offsets with every sample clamped into the map (border padding, as a port that
    clamped instead of zero-padding would do) moves the output far past the tolerance above."""
    g = golden_layer
    x, offset, weight = g["input"], g["offset"], g["weight"]
    k = weight.shape[-1]
    h, w = x.shape[-2:]
    gy, gx = (torch.from_numpy(a).float() for a in tap_grid((k, k), (h, w), (1, 1), (k // 2, k // 2), (1, 1)))
    pairs = offset.reshape(1, k * k, 2, h * w)
    y = (pairs[:, :, 0] + gy).clamp(0, h - 1) - gy
    xx = (pairs[:, :, 1] + gx).clamp(0, w - 1) - gx
    outside = ((pairs[:, :, 0] + gy < 0) | (pairs[:, :, 0] + gy > h - 1)).sum()
    assert outside > 0, "the golden layer samples past the border (the control needs it)"
    clamped = torch.stack([y, xx], 2).reshape(offset.shape)
    out = deform_conv2d(x, clamped, weight, None, padding=k // 2, mask=g["mask"], sampler="gather")
    assert (out - g["output"]).abs().max() > 1e-2 * g["output"].abs().max()


def test_unsupported_layouts_are_refused():
    x = rand(1, 4, 5, 5)
    with pytest.raises(ValueError, match="one offset group"):
        deform_conv2d(x, torch.zeros(1, 36, 5, 5), rand(4, 4, 3, 3), padding=1)    # two offset groups
    with pytest.raises(ValueError, match="sampler"):
        deform_conv2d(x, torch.zeros(1, 18, 5, 5), rand(4, 4, 3, 3), padding=1, sampler="nearest")
