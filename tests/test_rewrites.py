"""The rewrite library (zoo/rewrites/): every rewrite, before and after, on its own tiny demo.

For each rewrite (CPU, always run):
- exactness: the rewritten module against the original in fp32 torch, within its exactness class;
- effect: both are converted with litert-torch and the .tflite is inspected — the original shows the
  offending op / rank (or, for the seed rows today's converter already defuses, the GPU-clean ops, so a
  converter upgrade that regresses is caught), the rewrite shows none of the known GPU traps;
- the converted rewrite, run on the CPU interpreter, matches the *original* torch module.
fp16 family: fp16 emulation in torch (decomposed modules in torch.float16, pairwise fp16 sums).
GPU (marked `gpu`): the WebGPU delegate on software Vulkan rejects or miscomputes the original and
accepts the rewrite with matching numbers. Skipped without scripts/setup_vulkan.sh, failed instead
under ZOO_REQUIRE_GPU_CHECK=1.

Conversions are shared across tests (one per rewrite and side, module-scoped), tensors are tiny.
"""

from __future__ import annotations

import contextlib
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import rewrites
from zoo.rewrites import REWRITES, activations, arith, attention, fp16, norms, reshapes, resampling, slicing, spectral
from zoo.rewrites import inspect as tfl
from zoo.rewrites.evidence import collect, collect_gpu, worst

ALL = sorted(REWRITES)
NEEDED = [i for i in ALL if REWRITES[i].needed]
NOT_NEEDED = [i for i in ALL if not REWRITES[i].needed]
# Needed rewrites whose failure is visible in the converted file (an op, a rank, a broadcast shape).
VISIBLE = [i for i in NEEDED if REWRITES[i].failure in ("structural", "numeric-gpu", "device-only")]
CONVERSION = [i for i in NEEDED if REWRITES[i].failure == "conversion"]


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    """rewrite id -> Evidence, converting each demo once for the whole module.

    Conversions run one at a time: litert-torch already uses both cores (two worker processes measured
    slower, 101 s vs 69 s for all demos).
    """
    workdir = tmp_path_factory.mktemp("rewrites")
    cache: dict[str, object] = {}

    def get(rid: str):
        if rid not in cache:
            cache[rid] = collect(REWRITES[rid], workdir)
        return cache[rid]

    return get


# --- the registry ------------------------------------------------------------------------------------


def test_registry_is_self_describing():
    families = {m.__name__.rsplit(".", 1)[-1] for m in rewrites.FAMILIES}
    known_targets = {rewrites.LITERT_GPU, rewrites.LITERT, rewrites.COREAI}
    for rid, rw in REWRITES.items():
        assert rw.id == rid and rw.family in families, rid
        assert rw.fixes and rw.targets and set(rw.targets) <= known_targets, rid
        assert rw.swap is not None or rw.function is not None, rid
        if not rw.needed:
            assert rw.emits_before, f"{rid}: a not-needed rewrite must say which clean ops today's converter emits"
    # Everything the brief names is there.
    for rid in (
        "gqa_repeat_kv_slice_concat",
        "gqa_query_fold",
        "mask_pre_expand",
        "bmm_pre_expand",
        "fc_rank3_constant",
        "relu_0_to_1",
        "select_to_arith",
        "softmax_len1",
        "window_attention_rank4",
        "einops_rank4",
        "pixel_shuffle_conv_transpose",
        "zero_stuff_conv_transpose",
        "grid_sample_tent",
        "bicubic_matmul",
        "safe_layernorm",
        "safe_rmsnorm",
        "safe_instancenorm",
        "hierarchical_mean",
        "add_output_alias",
        "stft_conv",
        "istft_conv",
        "stride_slice_reshape",
        "reflect_pad_2d",
        "prelu_arith",
        "amax_maxpool",
        "maxpool_explicit_pad",
    ):
        assert rid in REWRITES, rid
    assert set(NOT_NEEDED) == {
        "stride_slice_reshape",
        "reflect_pad_2d",
        "pixel_shuffle_conv_transpose",
        "prelu_arith",
        "amax_maxpool",
        "zero_stuff_conv_transpose",
        "maxpool_explicit_pad",
    }


def test_for_target_defaults_leave_out_opt_in_and_not_needed():
    ids = {rw.id for rw in rewrites.for_target(rewrites.LITERT_GPU)}
    assert "relu_0_to_1" in ids and "safe_rmsnorm" in ids
    assert "add_output_alias" not in ids  # opt-in: it adds a graph input
    assert not ids & set(NOT_NEEDED)
    assert "add_output_alias" in {rw.id for rw in rewrites.for_target(rewrites.LITERT_GPU, include_opt_in=True)}


def test_apply_swaps_nested_modules_on_a_copy():
    model = nn.Sequential(
        nn.Linear(4, 4), nn.Sequential(nn.Hardtanh(0.0, 1.0), nn.LayerNorm(4)), nn.Hardtanh(-1.0, 1.0)
    )
    new, log = rewrites.apply_logged(model, ["relu_0_to_1", "safe_layernorm", "gqa_query_fold"])
    assert log == [("1.0", "relu_0_to_1"), ("1.1", "safe_layernorm")]
    assert isinstance(new[1][0], activations.Clamp01) and isinstance(new[1][1], norms.AdaptiveLayerNorm)
    assert isinstance(new[2], nn.Hardtanh)  # (-1, 1) is not the RELU_0_TO_1 pattern
    assert isinstance(model[1][0], nn.Hardtanh)  # the original is untouched
    x = torch.randn(3, 4)
    assert torch.allclose(model(x), new(x), atol=1e-6)
    with pytest.raises(KeyError, match="unknown rewrite"):
        rewrites.apply(model, ["no_such_rewrite"])


def test_apply_replaces_the_root_module():
    new = rewrites.apply(nn.Hardtanh(0.0, 1.0), ["relu_0_to_1"])
    assert isinstance(new, activations.Clamp01)


# --- before / after, per rewrite ----------------------------------------------------------------------


@pytest.mark.parametrize("rid", ALL)
def test_rewrite_is_exact_in_torch(evidence, rid):
    ev = evidence(rid)
    tol = REWRITES[rid].tolerance(ev.reference_scale)
    assert ev.torch_error <= tol, (
        f"{rid}: max |after - before| = {ev.torch_error:.3g} > {tol:.3g} ({REWRITES[rid].exactness})"
    )


@pytest.mark.parametrize("rid", VISIBLE)
def test_before_shows_the_offending_pattern(evidence, rid):
    ev = evidence(rid)
    assert ev.before.converted, ev.before.convert_error
    assert ev.before.findings, f"{rid}: the original no longer shows the pattern; ops {sorted(set(ev.before.ops))}"
    assert set(REWRITES[rid].emits_before) <= set(ev.before.ops)


@pytest.mark.parametrize("rid", CONVERSION)
def test_before_does_not_convert(evidence, rid):
    ev = evidence(rid)
    assert not ev.before.converted, f"{rid}: torch's complex ops convert now; ops {ev.before.ops}"
    assert "complex" in ev.before.convert_error


@pytest.mark.parametrize("rid", NOT_NEEDED)
def test_converter_still_defuses_the_seed_row(evidence, rid):
    """The seed's failure is gone on litert-torch 0.10 / jax 0.10.2; fail loudly if an upgrade brings it back."""
    ev = evidence(rid)
    assert ev.before.converted, ev.before.convert_error
    assert ev.before.findings == [] and ev.before.lint == [], f"{rid}: the seed's pattern is back: {ev.before.lint}"
    assert set(REWRITES[rid].emits_before) <= set(ev.before.ops), f"{rid}: emitted {sorted(set(ev.before.ops))}"
    assert ev.before.max_rank <= 4


@pytest.mark.parametrize("rid", ALL)
def test_after_is_gpu_clean(evidence, rid):
    ev = evidence(rid)
    assert ev.after.converted, ev.after.convert_error
    assert ev.after.findings == [] and ev.after.lint == [], f"{rid}: {ev.after.findings + ev.after.lint}"
    assert ev.after.max_rank <= 4


@pytest.mark.parametrize("rid", ALL)
def test_converted_rewrite_matches_the_original(evidence, rid):
    """The .tflite of the rewrite, on the CPU interpreter, against the *original* torch module."""
    ev = evidence(rid)
    scale = max(1.0, ev.reference_scale)
    tol = max(REWRITES[rid].tolerance(scale), 2e-6 * scale)  # the interpreter's own float32 rounding
    assert ev.after.cpu_error <= tol, f"{rid}: {ev.after.cpu_error:.3g} > {tol:.3g}"


# --- attention ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["expand", "cat_expand"])
def test_repeat_kv_idioms_emit_broadcast_to(tmp_path, form):
    """The seed's cat(expand) fix (LiteRT#9191) gets to rank 4 but still emits BROADCAST_TO."""
    m, args = attention._tiny_gqa(kv_form=form, expand_mask=True)
    path = tfl.convert_to_tflite(m, args, tmp_path / f"{form}.tflite")
    assert "BROADCAST_TO" in tfl.ops_in_tflite(path)
    assert tfl.max_tensor_rank(path) == (5 if form == "expand" else 4)


@pytest.mark.parametrize("n_heads,n_kv,seq", [(4, 4, 3), (4, 2, 1), (8, 2, 5), (6, 3, 4)])
def test_gqa_forms_agree(n_heads, n_kv, seq):
    torch.manual_seed(0)
    ref = attention.GQAAttention(8 * n_heads, n_heads, n_kv).eval()
    x, mask = torch.randn(2, seq, 8 * n_heads), attention.causal_mask(seq)
    want = ref(x, mask)
    assert torch.equal(ref.variant(kv_form="slice_concat")(x, mask), want)
    for form, expand in (("query_fold", True), ("query_fold", False), ("slice_concat", True)):
        got = ref.variant(kv_form=form, expand_mask=expand)(x, mask)
        assert (got - want).abs().max() <= 1e-6


def test_matmul_no_broadcast_any_rank():
    a, b = torch.randn(3, 1, 4, 5), torch.randn(2, 5, 6)
    assert torch.equal(attention.matmul_no_broadcast(a, b), a @ b)


# --- activations / arithmetic -------------------------------------------------------------------------


def test_clamp01_is_exact_at_every_magnitude_and_the_seed_form_is_not():
    x = torch.tensor([-1e30, -3.0, -0.0, 0.0, 1e-8, 0.3, 1.0, 1.5, 2047.0, 3000.0, 65504.0, float("inf")])
    for dtype in (torch.float32, torch.float16):
        xd = x.to(dtype)
        assert torch.equal(activations.clamp01(xd), xd.clamp(0, 1))
    # relu(x) - relu(x - 1): x - 1 rounds to x above 2048 in fp16, and the "1" becomes 0.
    x16 = torch.tensor([3000.0], dtype=torch.float16)
    assert activations.clamp01_relu_diff(x16).item() == 0.0
    assert activations.clamp01_relu_diff(torch.tensor([3.0e7])).item() == 0.0


def test_select_arith_with_inf_fill_is_nan_so_fill_finite():
    x, m = torch.ones(3), torch.tensor([0.0, 1.0, 0.0])
    assert torch.isnan(arith.select_arith(m, float("-inf"), x)).any()
    assert torch.equal(arith.select_arith(m, -1e4, x), torch.where(m > 0.5, -1e4, x))


def test_fc_rank3_constant_mul_form(tmp_path):
    """The MUL variant (no bias fold possible) is fixed by the same nn.Linear swap."""
    torch.manual_seed(0)
    before = arith.LinearPlusConstant(op="mul").eval()
    after = rewrites.apply(before, ["fc_rank3_constant"])
    x = torch.randn(1, 5, 6)
    assert (before(x) - after(x)).abs().max() <= 1e-6
    assert tfl.find_fc_rank_drop(tfl.convert_to_tflite(before, (x,), tmp_path / "b.tflite"))
    assert not tfl.find_fc_rank_drop(tfl.convert_to_tflite(after, (x,), tmp_path / "a.tflite"))


def test_add_output_alias_adds_a_runtime_one(evidence):
    ev = evidence("add_output_alias")
    assert len(tfl.read_graph(ev.after.path).graph_inputs) == len(ev.demo.args) + 1
    assert tfl.find_ops(ev.after.path, "MUL")  # outputs are MUL(result, one), not the ADD itself


def test_softmax_over_length1_axis_folds_away(evidence):
    ev = evidence("softmax_len1")
    assert "DIV" in ev.before.ops and "DIV" not in ev.after.ops and "REDUCE_MAX" not in ev.after.ops


# --- slicing, reshapes, resampling (torch-side sweeps of the drop-in functions) ----------------------------


def test_every_nth_matches_strided_slicing():
    x = torch.randn(2, 3, 9, 8)
    for dim, step, start in [(2, 2, 0), (2, 2, 1), (3, 3, 1), (1, 2, 0), (0, 2, 1), (2, 4, 3)]:
        want = x[(slice(None),) * dim + (slice(start, None, step),)]
        assert torch.equal(slicing.every_nth(x, dim, step, start), want)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", [((1, 2, 16), (3, 2)), ((1, 2, 8, 7), (2, 1, 3, 2)), ((2, 5), (4, 4))])
def test_pad_edges_matches_f_pad(mode, shape, pad):
    x = torch.randn(*shape)
    assert torch.equal(slicing.pad_edges(x, pad, mode), F.pad(x, pad, mode=mode))


def test_replicate_pad_2d_still_gathers_and_the_rewrite_does_not(tmp_path):
    before = nn.Sequential(nn.ReplicationPad2d(2))
    x = torch.randn(1, 2, 6, 6)
    assert "GATHER_ND" in tfl.ops_in_tflite(tfl.convert_to_tflite(before, (x,), tmp_path / "b.tflite"))
    after = rewrites.apply(before, ["edge_pad"])
    assert tfl.gpu_lint(tfl.convert_to_tflite(after, (x,), tmp_path / "a.tflite")) == []


def test_permute_rank4_matches_permute_for_random_rank6():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rank = int(rng.integers(2, 7))
        shape = [int(s) for s in rng.integers(1, 4, rank)]
        perm = [int(p) for p in rng.permutation(rank)]
        x = torch.randn(math.prod(shape))
        want = x.reshape(shape).permute(perm).reshape(-1)
        assert torch.equal(reshapes.permute_rank4(x, shape, perm, (-1,)), want), (shape, perm)


def test_window_and_head_split_helpers_are_exact():
    x = torch.randn(2, 8, 12, 5)
    win = reshapes.window_partition(x, 4)
    assert torch.equal(win, reshapes._window_partition_naive(x, 4))
    assert torch.equal(reshapes.window_reverse(win, 4, 8, 12), x)
    qkv = torch.randn(3, 5, 3 * 2 * 4)
    for got, want in zip(reshapes.split_qkv_heads(qkv, 2), reshapes._split_qkv_naive(qkv, 2)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(in_channels=4, out_channels=6, kernel_size=4, stride=2, padding=1),
        dict(in_channels=4, out_channels=4, kernel_size=3, stride=2, padding=1, output_padding=1, groups=2),
        dict(in_channels=2, out_channels=3, kernel_size=(3, 5), stride=(1, 3), padding=(0, 4), dilation=(2, 1)),
        dict(in_channels=2, out_channels=2, kernel_size=2, stride=3, padding=0),
    ],
)
def test_zero_stuff_conv_transpose2d_variants(kwargs):
    torch.manual_seed(0)
    m = nn.ConvTranspose2d(**kwargs)
    x = torch.randn(1, kwargs["in_channels"], 5, 6)
    assert (resampling.ZeroStuffConvTranspose2d(m)(x) - m(x)).abs().max() <= 1e-6


def test_zero_stuff_conv_transpose1d_variants():
    torch.manual_seed(0)
    for kw in [
        dict(kernel_size=4, stride=2, padding=1),
        dict(kernel_size=16, stride=8, padding=4, groups=4),
        dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    ]:
        m = nn.ConvTranspose1d(4, 4, **kw)
        x = torch.randn(2, 4, 9)
        assert (resampling.ZeroStuffConvTranspose1d(m)(x) - m(x)).abs().max() <= 1e-6


def test_pixel_shuffle_and_maxpool_rewrites_exact():
    x = torch.randn(2, 18, 4, 5)
    assert torch.equal(resampling.pixel_shuffle_conv_transpose(x, 3), F.pixel_shuffle(x, 3))
    pool = nn.MaxPool2d(3, 2, 1)
    x = torch.randn(1, 3, 9, 9) * 100
    assert torch.equal(resampling.ExplicitPadMaxPool2d(pool)(x), pool(x))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(scale_factor=2),
        dict(size=(7, 13)),
        dict(size=(3, 4)),
        dict(scale_factor=2, align_corners=True),
        dict(scale_factor=1.5),
    ],
)
def test_bicubic_matrix_matches_interpolate(kwargs):
    x = torch.randn(1, 3, 5, 6)
    want = F.interpolate(x, mode="bicubic", **kwargs)
    got = resampling.BicubicResize(kwargs.get("size"), kwargs.get("scale_factor"), kwargs.get("align_corners", False))(
        x
    )
    assert (got - want).abs().max() <= 1e-6 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
def test_grid_sample_tent_matches_grid_sample(align_corners, padding_mode):
    x, grid = torch.randn(2, 3, 6, 7), torch.rand(2, 4, 5, 2) * 2.4 - 1.2
    want = F.grid_sample(x, grid, align_corners=align_corners, padding_mode=padding_mode)
    assert (resampling.grid_sample_bilinear(x, grid, align_corners, padding_mode) - want).abs().max() <= 1e-6


def test_grid_sample_what_cannot_be_made_gpu_resident():
    """Honest limits: other modes raise; and at RF-DETR's deformable-attention scale (300 queries x
    8 heads x 4 levels x 4 points on an 80x80, 32-channel level) the tent form's [N, P, C, H] buffer is
    far over the WebGPU adapter's 128 MiB single-buffer cap, so that op stays on the CPU."""
    x, grid = torch.randn(1, 2, 4, 4), torch.zeros(1, 2, 2, 2)
    for kw in (dict(mode="nearest"), dict(mode="bicubic"), dict(padding_mode="reflection")):
        with pytest.raises(NotImplementedError, match="no GPU-clean form"):
            resampling.grid_sample_bilinear(x, grid, **kw)
    cap = 128 * 2**20
    assert resampling.grid_sample_intermediate_bytes((8, 32, 80, 80), (8, 300, 16, 2)) > cap
    assert resampling.grid_sample_intermediate_bytes((1, 3, 6, 7), (1, 4, 5, 2)) < 1024


# --- spectral ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_fft,hop,center,window",
    [
        (32, 8, True, "hann"),
        (64, 16, True, "hann"),
        (16, 4, False, "hann"),
        (24, 6, True, None),
        (31, 8, True, "hamming"),
    ],
)
def test_stft_istft_as_convolutions_match_torch(n_fft, hop, center, window):
    win = {"hann": torch.hann_window(n_fft), "hamming": torch.hamming_window(n_fft), None: None}[window]
    x = torch.randn(2, 160)
    want = torch.view_as_real(torch.stft(x, n_fft, hop, window=win, center=center, return_complex=True))
    got = spectral.STFTConv(n_fft, hop, win, center=center)(x)
    assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())
    if center:  # without centring a Hann window's envelope is 0 at the ends: torch.istft refuses (NOLA)
        back = torch.istft(torch.view_as_complex(want.contiguous()), n_fft, hop, window=win, center=center)
        got_back = spectral.ISTFTConv(n_fft, hop, win, center=center)(want)
        assert (got_back - back).abs().max() <= 1e-5 * float(back.abs().max())


# --- the fp16 reduction family (fp16 emulation on CPU) ---------------------------------------------------


def _reference_norm(kind: str, x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    if kind == "layer":
        return F.layer_norm(x, x.shape[-1:], eps=1e-5)
    if kind == "rms":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return F.instance_norm(x, eps=1e-5)


def _naive(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "layer":
        return norms.decomposed_layer_norm(x, [-1], 1e-5)
    if kind == "rms":
        return norms.decomposed_rms_norm(x, [-1], 1e-6)
    return norms.decomposed_layer_norm(x, [-2, -1], 1e-5)


def _adaptive(kind: str) -> nn.Module:
    if kind == "layer":
        return norms.AdaptiveLayerNorm(nn.LayerNorm(64))
    if kind == "rms":
        return norms.AdaptiveRMSNorm(nn.RMSNorm(64, eps=1e-6))
    return norms.AdaptiveInstanceNorm(nn.InstanceNorm2d(4))


STRESS_SHAPES = {"layer": (1, 4, 64), "rms": (1, 4, 64), "instance": (1, 4, 8, 8)}


def _row_errors(y: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """Max abs error per row kind (axis 1: ordinary, constant 500, zeros, ±1000); NaN stays NaN."""
    err = (y.double() - ref).abs()
    return [float(err[:, i].max()) if torch.isfinite(err[:, i]).all() else math.nan for i in range(y.shape[1])]


@pytest.mark.parametrize("accumulator", [False, True], ids=["fp16-math", "fp16-math+fp16-accumulator"])
@pytest.mark.parametrize("kind", ["layer", "rms", "instance"])
def test_fp16_naive_norm_fails_and_adaptive_stays_close(kind, accumulator):
    x = norms.fp16_stress_rows(STRESS_SHAPES[kind])
    ref = _reference_norm(kind, x)
    emulation = fp16.emulate_fp16_accumulator() if accumulator else contextlib.nullcontext()
    with emulation, torch.no_grad():
        naive = _naive(kind, x.half())
        adaptive = _adaptive(kind).half()(x.half())
    naive_err, adaptive_err = _row_errors(naive, ref), _row_errors(adaptive, ref)
    # The ±1000 rows (x² > 65504) come back all-zero from the naive form: error ~ |ref| ~ 1.7.
    assert not naive_err[3] < 0.5, naive_err
    assert (naive[:, 3] == 0).all()
    # The adaptive form is within fp16 resolution on every kind of row, zeros and constants included.
    assert all(e <= 5e-3 for e in adaptive_err), adaptive_err


def test_fp16_fixed_scale_norm_is_nan_on_constant_and_zero_rows():
    x = norms.fp16_stress_rows((1, 4, 64)).half()
    y = norms.fixed_scale_layer_norm(x, [-1], 1e-5)
    assert torch.isnan(y[:, 1]).all() and torch.isnan(y[:, 2]).all()  # eps/S² underflowed: 0/0


@pytest.mark.parametrize("length", [4096, 2000, 33, 3])
def test_hierarchical_mean_exact_in_fp32_for_any_length(length):
    x = 100.0 + torch.randn(3, length, dtype=torch.float64)
    got = norms.hierarchical_mean(x, [-1])
    assert (got - x.mean(-1, keepdim=True)).abs().max() <= 1e-12 * 100


def test_fp16_accumulator_overflow_and_hierarchical_mean():
    x = (100.0 + torch.randn(1, 4, 2000)).half()
    with fp16.emulate_fp16_accumulator():
        naive = fp16.mean(x, [-1])  # a pairwise fp16 sum of 2000 x 100 passes 65504
        hier = norms.hierarchical_mean(x, [-1])
    assert torch.isinf(naive).all()
    ref = x.double().mean(-1, keepdim=True)
    assert ((hier.double() - ref).abs() / ref).max() <= 1e-3


def test_fp16_long_rows_use_the_hierarchical_mean_inside_the_norms():
    """96x96 = 9216 positions: the naive instance norm's accumulator overflows, the adaptive one's not."""
    torch.manual_seed(0)
    x = 100.0 + 20.0 * torch.randn(1, 2, 96, 96)
    ref = F.instance_norm(x.double(), eps=1e-5)
    with fp16.emulate_fp16_accumulator(), torch.no_grad():
        naive = norms.decomposed_layer_norm(x.half(), [-2, -1], 1e-5)
        adaptive = norms.AdaptiveInstanceNorm(nn.InstanceNorm2d(2)).half()(x.half())
    assert not torch.isfinite(naive).all()
    assert (adaptive.double() - ref).abs().max() <= 1e-2


# --- on the GPU delegate (WebGPU on software Vulkan) -----------------------------------------------------

FP32_REL_TOL = 1e-5  # GPU fp32 vs CPU interpreter, relative to max |output|
FP16_REL_TOL = 1e-2  # GPU fp16 vs CPU interpreter fp32
# Failures this checker cannot show (each rewrite says why in `reproduces_on_checker`'s notes).
NOT_REPRODUCIBLE_HERE = [i for i in NEEDED if not REWRITES[i].reproduces_on_checker]


@pytest.fixture(scope="module")
def gpu_ready():
    from zoo.targets.litert_gpu import gpu_available

    ok, why = gpu_available()
    if ok:
        return why
    if os.environ.get("ZOO_REQUIRE_GPU_CHECK") == "1":
        pytest.fail(
            f"ZOO_REQUIRE_GPU_CHECK=1 but the LiteRT GPU check cannot run: {why}. Run scripts/setup_vulkan.sh.",
            pytrace=False,
        )
    pytest.skip(f"LiteRT GPU check unavailable ({why}); run scripts/setup_vulkan.sh")


@pytest.fixture(scope="module")
def gpu_evidence(gpu_ready, evidence):
    """rewrite id -> GpuEvidence for every rewrite, checked two at a time (each check is a subprocess)."""
    converted = [evidence(rid) for rid in ALL]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(ALL, pool.map(collect_gpu, converted)))


def _describe(check) -> str:
    return f"{check.status}: {check.reason} fp32={worst(check, 'fp32_rel_err')} fp16={worst(check, 'fp16_rel_err')}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rid", [i for i in NEEDED if REWRITES[i].failure == "structural" and REWRITES[i].reproduces_on_checker]
)
def test_gpu_rejects_the_original(gpu_evidence, rid):
    check = gpu_evidence[rid].before
    assert check.status == "rejected", _describe(check)
    assert check.rejected_ops


@pytest.mark.gpu
@pytest.mark.parametrize("rid", ["bmm_pre_expand", "fc_rank3_constant"])
def test_gpu_accepts_the_original_but_computes_it_wrong(gpu_evidence, rid):
    check = gpu_evidence[rid].before
    assert check.status == "accepted" and worst(check, "fp32_rel_err") > 0.1, _describe(check)


@pytest.mark.gpu
@pytest.mark.parametrize("rid", ["safe_layernorm", "safe_rmsnorm", "safe_instancenorm"])
def test_gpu_fp16_breaks_the_original_norm(gpu_evidence, rid):
    check = gpu_evidence[rid].before
    assert gpu_evidence[rid].stressed
    err = worst(check, "fp16_rel_err")
    assert check.status == "accepted" and (err != err or err > 0.1), _describe(check)


@pytest.mark.gpu
@pytest.mark.parametrize("rid", NOT_REPRODUCIBLE_HERE)
def test_gpu_failures_this_checker_cannot_show(gpu_evidence, rid):
    """Documented, not hidden: the original passes here. If this starts failing, the checker learned to see it."""
    check = gpu_evidence[rid].before
    assert check.status == "accepted" and check.passes(FP32_REL_TOL), _describe(check)
    assert worst(check, "fp16_rel_err") <= FP16_REL_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("rid", NOT_NEEDED)
def test_gpu_accepts_what_the_converter_emits_for_defused_rows(gpu_evidence, rid):
    check = gpu_evidence[rid].before
    assert check.status == "accepted" and check.passes(FP32_REL_TOL), _describe(check)


@pytest.mark.gpu
@pytest.mark.parametrize("rid", ALL)
def test_gpu_accepts_the_rewrite_and_matches(gpu_evidence, rid):
    check = gpu_evidence[rid].after
    assert check.status == "accepted", _describe(check)
    assert check.passes(FP32_REL_TOL), _describe(check)
    assert worst(check, "fp16_rel_err") <= FP16_REL_TOL, _describe(check)


@pytest.mark.gpu
def test_gpu_neg_inf_pad_into_maxpool_is_wrong(gpu_ready, tmp_path):
    """Why ExplicitPadMaxPool2d pads with -65504, not -inf: PADV2(-inf) -> TRANSPOSE -> MAX_POOL_2D comes back
    wrong from the WebGPU delegate; the same graph with a finite pad value is exact."""
    from zoo.rewrites.evidence import gpu_inputs
    from zoo.targets.litert_gpu import gpu_check

    x = torch.randn(1, 4, 8, 8)
    results = {}
    for name, value in (("neg_inf", float("-inf")), ("finite", resampling.POOL_PAD_VALUE)):
        module = rewrites.base.Lambda(lambda t, v=value: F.max_pool2d(F.pad(t, (1, 1, 1, 1), value=v), 3, 2))
        path = tfl.convert_to_tflite(module, (x,), tmp_path / f"{name}.tflite")
        results[name] = gpu_check(path, gpu_inputs((x,)))
    assert results["neg_inf"].status == "accepted" and worst(results["neg_inf"], "fp32_rel_err") > 0.1
    assert results["finite"].passes(FP32_REL_TOL)
