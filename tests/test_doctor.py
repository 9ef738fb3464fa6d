"""zoo.doctor: every rule fires on third-party-style code (plain F.* calls, no zoo classes) and stays quiet
on the fixed form; the zoo's own models get no finding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_mode import require_gpu
from zoo import doctor
from zoo.errors import ZooError
from zoo.rewrites.activations import clamp01
from zoo.rewrites.arith import elementwise_rank4, softmax_safe
from zoo.rewrites.attention import repeat_kv_slice_concat
from zoo.rewrites.norms import adaptive_normalize, hierarchical_reduce
from zoo.rewrites.reshapes import permute_rank4
from zoo.rewrites.resampling import grid_sample_bilinear, resize_bicubic


class Fn(nn.Module):
    """A third-party forward: just the function."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _repeat_kv(k):
    b, n, s, d = k.shape
    return k[:, :, None].expand(b, n, 3, s, d).reshape(b, n * 3, s, d)


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope_complex(x):
    freqs = torch.polar(torch.ones(4, 4), torch.arange(16.0).reshape(4, 4))
    xc = torch.view_as_complex(x.reshape(1, 4, 4, 2))
    return torch.view_as_real(xc * freqs).flatten(-2)


def _rope_real(x):
    angle = torch.arange(16.0).reshape(4, 4).repeat_interleave(2, -1)
    x1, x2 = x.reshape(1, 4, 4, 2).unbind(-1)
    rotated = torch.stack((-x2, x1), -1).flatten(-2)
    return x * torch.cos(angle) + rotated * torch.sin(angle)


def _float_mask(idx):
    x = idx.float()
    return 1 - (x - x.clamp(3, 4)).abs().clamp(max=1)


def _causal_mask(q, k, v):
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class AngleTable(nn.Module):
    """A rotary-style angle table (position x frequency) kept as a buffer, and its cosine taken in forward."""

    def __init__(self, n=256, d=8):
        super().__init__()
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
        self.register_buffer("angle", torch.outer(torch.arange(float(n)), inv_freq).repeat(1, 2))

    def forward(self, x):
        return x * torch.cos(self.angle)


class CosTable(nn.Module):
    """The fixed form: the cosine table itself is the buffer (values in [-1, 1])."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.cos(AngleTable().angle))

    def forward(self, x):
        return x * self.table


class ConstAdd(nn.Module):
    """A runtime [8, 16] plus a learned table of the same shape (e.g. a fixed positional embedding)."""

    def __init__(self, lifted=False):
        super().__init__()
        self.lifted = lifted
        self.register_buffer("table", _x(8, 16, seed=5))

    def forward(self, x):
        return elementwise_rank4("add", x, self.table) if self.lifted else x + self.table


IMG, GRID = _x(1, 3, 8, 8), torch.rand(1, 4, 4, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
QKV = (_x(1, 2, 1, 8), _x(1, 2, 4, 8, seed=1), _x(1, 2, 4, 8, seed=2))

# rule id: (bad fn, fixed fn, args, target, precision)
CASES = {
    "grid-sample": (lambda x, g: F.grid_sample(x, g, align_corners=False),
                    lambda x, g: grid_sample_bilinear(x, g, align_corners=False), (IMG, GRID), "coreai", "fp32"),
    "bicubic-upsample": (lambda x: F.interpolate(x, size=(16, 16), mode="bicubic"),
                         lambda x: resize_bicubic(x, (16, 16)), (IMG,), "litert-gpu", "fp32"),
    "repeat-kv-expand": (_repeat_kv, lambda k: repeat_kv_slice_concat(k, 3), (_x(1, 2, 4, 8),), "litert-gpu", "fp32"),
    "rank-above-4": (lambda x: x.reshape(1, 2, 2, 4, 16).permute(0, 2, 1, 3, 4).reshape(1, 4, 4, 16),
                     lambda x: permute_rank4(x, (1, 2, 2, 4, 16), (0, 2, 1, 3, 4), (1, 4, 4, 16)),
                     (_x(1, 4, 4, 16),), "litert-gpu", "fp32"),
    "clamp-0-1": (lambda x: F.hardtanh(x, 0.0, 1.0), clamp01, (_x(2, 8),), "litert-gpu", "fp32"),
    "half-rms-norm": (_rms, lambda x: adaptive_normalize(x, (-1,), 1e-6, center=False), (_x(2, 64),),
                      "litert-gpu", "fp16"),
    "half-layer-norm": (lambda x: F.layer_norm(x, (64,)), lambda x: adaptive_normalize(x, (-1,), 1e-5, center=True),
                        (_x(2, 64),), "coreai", "fp16"),
    "int64-compare-chain": (lambda i: ((i > 2) & (i < 5)).float(), _float_mask, (torch.arange(8),), "coreai", "fp32"),
    "floor-on-gpu": (torch.floor, lambda x: torch.div(x * 2.0, 2.0, rounding_mode="floor"), (_x(8),), "coreai", "fp32"),
    "remainder-scalar": (lambda x: torch.remainder(x, 3.0),
                         lambda x: x - torch.div(x, 3.0, rounding_mode="floor") * 3.0, (_x(8),), "coreai", "fp32"),
    "complex-ops": (_rope_complex, _rope_real, (_x(1, 4, 8),), "litert", "fp32"),
    "softmax-len1": (lambda x: x.softmax(-1), lambda x: softmax_safe(x, -1), (_x(2, 3, 1),), "litert-gpu", "fp32"),
    "coreai-unsupported-op": (lambda x: x.sort(-1).values, lambda x: x.topk(8, -1, largest=False).values,
                              (_x(2, 8),), "coreai", "fp32"),
    "long-half-reduction": (lambda x: x.mean(-1), lambda x: hierarchical_reduce(x, (-1,)), (_x(2, 4096),),
                            "litert-gpu", "fp16"),
    "half-trig-large-arg": (AngleTable(), CosTable(), (_x(256, 8),), "coreai", "fp16"),
    "const-batch-elementwise": (ConstAdd(), ConstAdd(lifted=True), (_x(8, 16),), "litert-gpu", "fp32"),
    "causal-mask-qlen": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _causal_mask,
                         QKV, "coreai", "fp32"),
}


def _rules(fn, args, target, precision):
    return [f.rule for f in doctor.diagnose(Fn(fn), args, (target,), precision=precision)]


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_on_the_idiom_and_not_on_the_fix(rule_id):
    bad, fixed, args, target, precision = CASES[rule_id]
    found = doctor.diagnose(Fn(bad), args, (target,), precision=precision)
    assert [f.rule for f in found] == [rule_id], [f.format() for f in found]
    assert "test_doctor.py" in found[0].source, found[0].source  # the user's line, not torch's
    assert _rules(fixed, args, target, precision) == []


def test_long_k_matmul_fires_only_under_half_precision():
    w = _x(8, 4096)
    module, args = Fn(lambda x: F.linear(x, w.to(x.dtype))), (_x(2, 4096),)
    assert _rules(module.fn, args, "litert-gpu", "fp16") == ["long-k-half-matmul"]
    assert _rules(module.fn, args, "litert-gpu", "fp32") == []
    assert _rules(lambda x: F.linear(x, w[:, :1024].to(x.dtype)), (_x(2, 1024),), "litert-gpu", "fp16") == []


def test_every_rule_has_a_case():
    assert set(CASES) | {"long-k-half-matmul"} == set(doctor.RULES_BY_ID)


def test_each_trap_is_reported_once_across_targets():
    found = doctor.diagnose(Fn(CASES["grid-sample"][0]), (IMG, GRID), ("litert-gpu", "coreai"))
    assert len(found) == 1 and found[0].targets == ("litert-gpu", "coreai")


def test_repeat_kv_is_not_also_reported_as_rank_5():
    assert _rules(_repeat_kv, (_x(1, 2, 4, 8),), "litert-gpu", "fp32") == ["repeat-kv-expand"]


def test_ignore_takes_known_ids_only():
    assert doctor.diagnose(Fn(torch.floor), (_x(8),), ("coreai",), ignore=["floor-on-gpu"]) == []
    with pytest.raises(ZooError, match="Unknown rule id"):
        doctor.diagnose(Fn(torch.floor), (_x(8),), ("coreai",), ignore=["no-such-rule"])


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: export cannot trace it
            return x
        return -x


def test_export_failure_is_a_finding_with_the_source_line():
    (finding,) = doctor.diagnose(DataDependent(), (_x(4),), ("coreai",))
    assert finding.rule == "export-failed" and finding.severity == "fatal"
    assert "test_doctor.py" in finding.source, finding.source


@pytest.mark.parametrize("name", ["t5", "gqa-llm"])
def test_zoo_models_are_clean(name):
    assert [f.format() for f in doctor.diagnose_model(name)] == []


def test_t5_is_clean_under_fp16():
    # T5 upcasts its norms to fp32 itself: the half-precision norm rule must see that
    assert [f.format() for f in doctor.diagnose_model("t5", ("coreai",), precision="fp16")] == []


# ---------------------------------------------------------------- the CLI


def test_cli_lints_a_factory_and_points_at_its_lines(capsys):
    assert doctor.main(["doctor_modules:warp", "--target", "litert-gpu"]) == 1
    out = capsys.readouterr().out
    for rule in ("grid-sample", "bicubic-upsample", "clamp-0-1"):
        assert rule in out
    assert "doctor_modules.py:22" in out and "3 fatal" in out


def test_cli_clean_factory_exits_0(capsys):
    assert doctor.main(["doctor_modules:clean"]) == 0
    assert "no findings" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["no_such_pkg.mod:build"], "Cannot import 'no_such_pkg.mod'"),
    (["doctor_modules:missing"], "has no callable 'missing'"),
    (["doctor_modules:not_a_pair"], "not (module, example_inputs)"),
    (["pyproject.toml"], "is not a model the doctor can read"),
    (["nothing-like-a-model"], "neither a zoo model"),
    (["doctor_modules:clean", "--ignore", "no-such-rule"], "Unknown rule id"),
])
def test_cli_bad_input_exits_2_with_one_message(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).parents[1])
    assert doctor.main(argv) == 2
    out = capsys.readouterr()
    assert message in out.out + out.err and "Traceback" not in out.out + out.err


def test_cli_not_a_tflite_exits_2(tmp_path, capsys):
    bogus = tmp_path / "model.tflite"
    bogus.write_bytes(b"\x00" * 64)
    assert doctor.main([str(bogus)]) == 2
    assert "not a LiteRT" in capsys.readouterr().out


def test_zoo_console_script_knows_doctor(capsys):
    from zoo import commands

    assert commands.main(["doctor", "--rules-markdown"]) == 0
    assert "`grid-sample`" in capsys.readouterr().out


def test_readme_rule_table_is_generated_from_the_registry():
    readme = (__import__("pathlib").Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split(doctor.README_BEGIN)[1].split(doctor.README_END)[0]
    assert section.strip() == doctor.rules_markdown().strip(), "run scripts/doctor_rules_readme.py"


def test_cli_reads_a_converted_tflite(tmp_path, capsys):
    from zoo.rewrites import inspect as tfl

    path = tfl.convert_to_tflite(Fn(lambda x: F.hardtanh(x, 0.0, 1.0)), (_x(2, 8),), tmp_path / "m.tflite")
    assert doctor.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "RELU_0_TO_1 is rejected" in out and "fix: relu_0_to_1" in out


# ---------------------------------------------------------------- graph-level fixes

# The exactness each fix promises (the rewrite's class where the fix is a library rewrite).
FIX_TOLERANCE = {"clamp-0-1": 0.0, "repeat-kv-expand": 0.0, "floor-on-gpu": 0.0, "softmax-len1": 0.0,
                 "int64-compare-chain": 0.0, "rank-above-4": 0.0, "grid-sample": 1e-6, "bicubic-upsample": 1e-6,
                 "remainder-scalar": 1e-6, "half-rms-norm": 1e-6, "half-layer-norm": 1e-6, "long-k-half-matmul": 1e-6,
                 "long-half-reduction": 1e-6, "half-trig-large-arg": 0.0, "complex-ops": 1e-6,
                 "const-batch-elementwise": 0.0}
W_LONG = _x(8, 4096, seed=3)
CASES_FIX_ONLY = {"long-k-half-matmul": (lambda x: F.linear(x, W_LONG), None, (_x(2, 4096),), "litert-gpu", "fp16")}


@pytest.mark.parametrize("rule_id", sorted(doctor.FIXABLE))
def test_fix_removes_the_finding_and_keeps_the_outputs(rule_id):
    bad, _, args, target, precision = {**CASES, **CASES_FIX_ONLY}[rule_id]
    original = Fn(bad)
    result = doctor.fix(original, args, (target,), precision=precision)
    assert result.applied == {rule_id: 1} and result.after == [], [f.format() for f in result.after]
    with torch.no_grad():
        want, got = original(*args), result.module(*args)
    scale = max(1.0, float(want.abs().max()))
    assert doctor.max_abs_difference(want, got) <= FIX_TOLERANCE[rule_id] * scale


def test_fix_reaches_third_party_modules_without_editing_them():
    import doctor_modules

    for factory in (doctor_modules.warp, doctor_modules.gqa):
        module, args = factory()
        result = doctor.fix(module, args, ("litert-gpu", "coreai"))
        assert result.before and result.after == []
        with torch.no_grad():
            assert doctor.max_abs_difference(module(*args), result.module(*args)) <= 1e-6


def test_fixed_rms_norm_survives_fp16_where_the_original_overflows():
    from zoo.precision import cast_for_export

    x = _x(2, 64) * 1000  # mean(x²) ~ 1e6: past fp16's 65504
    result = doctor.fix(Fn(_rms), (x,), ("litert-gpu",), precision="fp16")
    want = _rms(x)
    with torch.no_grad():
        broken = cast_for_export(Fn(_rms), torch.float16)(x)
        fixed = cast_for_export(result.module, torch.float16)(x)
    assert not torch.isfinite(broken).all() or (broken - want).abs().max() > 0.1  # the trap is real
    assert (fixed - want).abs().max() < 1e-2


class WithWeight(nn.Module):
    """fn(x, w) with w a parameter: cast to half with the module, as a real layer's weight is."""

    def __init__(self, fn, w):
        super().__init__()
        self.fn, self.w = fn, nn.Parameter(w)

    def forward(self, x):
        return self.fn(x, self.w)


def test_long_k_fix_reaches_matmul_mm_bmm_and_addmm():
    w = _x(4096, 8, seed=4)
    for fn, x in ((torch.matmul, _x(1, 2, 4096)), (lambda x, w: x @ w, _x(2, 4096)),
                  (lambda x, w: torch.bmm(x, w.expand(2, 4096, 8)), _x(2, 3, 4096)),
                  (lambda x, w: torch.addmm(w[0], x, w), _x(2, 4096))):
        module = WithWeight(fn, w)
        result = doctor.fix(module, (x,), ("litert-gpu",), precision="fp16")
        assert result.applied == {"long-k-half-matmul": 1} and result.after == [], [f.format() for f in result.after]
        with torch.no_grad():
            want = module(x)
            assert doctor.max_abs_difference(want, result.module(x)) <= 1e-5 * float(want.abs().max())
    # negative control: short contractions are left alone
    short = WithWeight(lambda x, w: x @ w, w[:1024])
    assert doctor.fix(short, (_x(2, 1024),), ("litert-gpu",), precision="fp16").applied == {}


def test_hierarchical_reduction_survives_an_fp16_accumulator_where_the_plain_sum_overflows():
    from zoo.rewrites.fp16 import emulate_fp16_accumulator, tree_sum_fp16

    x = torch.full((2, 4096), 200.0, dtype=torch.float16)  # the seed's case: 4096 x 200 = 819200 > 65504
    assert torch.isinf(tree_sum_fp16(x, -1)).all()  # the trap: an fp16 accumulator overflows
    with emulate_fp16_accumulator():
        mean, total = hierarchical_reduce(x, (-1,)), hierarchical_reduce(x.float(), (-1,), kind="sum")
    assert torch.isfinite(mean).all() and float((mean.float() - 200).abs().max()) == 0.0
    assert float(total.max()) == 819200.0
    y = _x(3, 5, 7, 2)  # any axes, any rank, keepdim: same as torch
    for dims, keep in (((1, 2), True), ((0, 3), False), (None, False)):
        want = y.mean(dims, keepdim=keep) if dims else y.mean()
        assert torch.allclose(hierarchical_reduce(y, dims, keep), want, atol=1e-6)


def test_folded_trig_table_is_closer_in_fp16():
    from zoo.precision import cast_for_export

    class Rotary(AngleTable):
        def forward(self, x):
            return x * torch.cos(self.angle) + x.flip(-1) * torch.sin(self.angle)

    x = _x(256, 8)
    result = doctor.fix(Rotary(), (x,), ("litert-gpu",), precision="fp16")
    # x [256, 8] times a same-shape constant table: const-batch-elementwise is fixed alongside
    assert result.applied == {"half-trig-large-arg": 2, "const-batch-elementwise": 2} and result.after == []
    with torch.no_grad():
        want = Rotary()(x)
        before = float((cast_for_export(Rotary(), torch.float16)(x) - want).abs().max())
        after = float((cast_for_export(result.module, torch.float16)(x) - want).abs().max())
    # measured: 0.040 -> 0.0027 at 512 positions; 256 here
    assert after * 4 < before, (before, after)


def test_runtime_angles_are_measured_not_guessed():
    # a small table (|angle| < 64) stays quiet at fp16: the rule reads the values, not only the op
    small = AngleTable(n=32)
    assert _rules(small.forward, (_x(32, 8),), "coreai", "fp16") == []


class LlamaRope(nn.Module):
    """Meta's reference RoPE: a complex freqs_cis buffer, view_as_complex on the pairs of x [B, S, H, D]."""

    def __init__(self, seq=6, dim=8):
        super().__init__()
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(float(seq)), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * self.freqs_cis.view(1, x.shape[1], 1, xc.shape[-1])).flatten(3).type_as(x)


def test_complex_rope_becomes_real_and_converts_to_litert(tmp_path):
    from zoo.rewrites import inspect as tfl

    module, x = LlamaRope(), _x(1, 6, 2, 8)
    with pytest.raises(Exception):  # the trap: litert-torch has no complex<f32> lowering
        tfl.convert_to_tflite(module, (x,), tmp_path / "complex.tflite")
    result = doctor.fix(module, (x,), ("litert", "coreai"))
    assert result.applied == {"complex-ops": 1} and result.after == []
    path = tfl.convert_to_tflite(result.module, (x,), tmp_path / "real.tflite")
    (got,) = tfl.run_tflite_cpu(path, (x,))
    assert float(abs(got - module(x).numpy()).max()) <= 1e-6


def test_cli_fix_reports_what_changed(capsys):
    assert doctor.main(["doctor_modules:gqa", "--fix", "--target", "litert-gpu"]) == 0
    out = capsys.readouterr().out
    assert "fixed  repeat-kv-expand: 2 place(s)" in out and "max |diff| 0" in out and "no findings" in out


def test_unfixable_grid_sample_mode_stays_reported():
    module = Fn(lambda x, g: F.grid_sample(x, g, mode="nearest", align_corners=False))
    result = doctor.fix(module, (IMG, GRID), ("coreai",))
    assert [f.rule for f in result.after] == ["grid-sample"]


@pytest.mark.gpu
def test_cli_prove_converts_the_fixed_graph_and_passes_the_gpu_check(tmp_path, capsys):
    require_gpu()
    argv = ["doctor_modules:gqa", "--prove", "--workdir", str(tmp_path)]
    assert doctor.main(argv) == 0
    out = capsys.readouterr().out
    assert "prove  litert-gpu: max |artifact - original|" in out and "GPU accepted (before: rejected" in out
    assert "prove  coreai: max |artifact - original|" in out


@pytest.mark.gpu
@pytest.mark.slow
def test_prove_fixes_grid_sample_bicubic_and_hardtanh_on_both_targets(tmp_path):
    require_gpu()
    import doctor_modules

    module, args = doctor_modules.warp()
    result = doctor.fix(module, args)
    proofs = {p.target: p for p in doctor.prove(module, result.module, args, ("litert-gpu", "coreai"), tmp_path)}
    assert proofs["litert-gpu"].ok(1e-4) and proofs["coreai"].ok(1e-4), [p.format() for p in proofs.values()]
    assert proofs["litert-gpu"].before_gpu.startswith("rejected")


def test_cli_describes_a_saved_aimodel_and_refuses_an_empty_folder(tmp_path, capsys):
    module, args = Fn(lambda x: x * 2.0), (_x(2, 4),)
    (proof,) = doctor.prove(module, module, args, ("coreai",), tmp_path)
    assert proof.ok(0.0)
    assert doctor.main([str(tmp_path / "fixed.aimodel")]) == 0
    assert "main" in capsys.readouterr().out
    (tmp_path / "empty.aimodel").mkdir()
    assert doctor.main([str(tmp_path / "empty.aimodel")]) == 2
    assert "not a Core AI asset" in capsys.readouterr().out


def test_pipeline_doctor_stage_notes_findings_with_their_lines():
    from omegaconf import OmegaConf

    from zoo.pipeline import _doctor_note
    from zoo.targets import Entry

    class HardSigmoidGate(nn.Module):  # keyword inputs, as the pipeline's entries are called
        def forward(self, x):
            return F.hardtanh(x, 0.0, 1.0)

    entry = Entry("main", HardSigmoidGate(), {"x": _x(2, 8)}, ["y"])
    note = _doctor_note("litert", OmegaConf.create({"gpu": {"check": True}}), [entry])
    assert note.startswith("1 finding(s): clamp-0-1 (fatal, test_doctor.py:") and "zoo doctor" in note
    assert _doctor_note("litert", OmegaConf.create({"gpu": {"check": False}}), [entry]) == "no findings"
