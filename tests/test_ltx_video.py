"""LTX-Video (tiny, offline): the ports against diffusers, the host sampler against LTXPipeline, the per-step gate
and its negative controls, and the CLI end to end (every component on both targets, then `zoo generate`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from test_hub import loopback  # noqa: F401  (the loopback Hub fixture: tests/hub_server.py + the real client)
import background_convert
from zoo import gates
from zoo.errors import ZooError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ltx():
    import models.ltx_video as ltx_video
    from zoo import weights
    from zoo.registry import get_spec, load_model_config

    cfg = load_model_config("ltx-video")
    spec = get_spec(cfg)
    checkpoint = weights.resolve(cfg, "tiny", spec.tiny_dir, spec.random_checkpoint)
    return {"cfg": cfg, "checkpoint": checkpoint, "run": ltx_video.eager_run(checkpoint, cfg), "module": ltx_video}


# ---------------------------------------------------------------- the whole CLI, started first (the slow part)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`zoo.convert model=ltx-video target=all` (tiny, default precisions) in a subprocess, started at once."""
    yield from background_convert.start(tmp_path_factory.mktemp("ltx-exports"), ["model=ltx-video", "target=all"],
                                        "ltx-video")


def test_conversion_started(converted):  # first in the module: conversion runs while the port tests do
    assert converted[0].pid > 0


# ---------------------------------------------------------------- ports vs diffusers


def test_timestep_projection_is_diffusers_bit_for_bit():
    from diffusers.models.embeddings import get_timestep_embedding

    from models.ltx_video.dit import timestep_projection

    t = torch.tensor([1000.0, 999.3, 562.5, 1.0, 0.0])
    assert torch.equal(timestep_projection(t), get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0))


@pytest.mark.parametrize("chunk", [0, 64])
def test_dit_port_matches_diffusers_on_every_captured_step(ltx, chunk):
    m = ltx["module"]
    port = m.dit_build(ltx["checkpoint"], ltx["cfg"]).set_attention_chunk(chunk)
    with torch.no_grad():
        for step, expected in zip(ltx["run"].steps, ltx["run"].outputs):
            got = port(*m.dit_graph_inputs(step).values())
            assert (got - expected).abs().max() < 1e-5


def tiny_vae(**overrides):
    from diffusers import AutoencoderKLLTXVideo

    config = dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                  decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                  decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
                  decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
                  upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False,
                  patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False)
    config.update(overrides)
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(**config).eval()
    with torch.no_grad():  # upstream initialises the noise scales at 0: make the noise path count
        for name, p in vae.decoder.named_parameters():
            if "per_channel_scale" in name:
                p.normal_()
    return vae


# 0.9.1 style: timestep conditioning, noise injection, residual upsamplers halving channels, 2x2 patches.
STYLE_091 = dict(decoder_block_out_channels=(8, 16, 32), decoder_layers_per_block=(1, 1, 1, 1),
                 decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(True, True, False, False),
                 upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True,
                 patch_size=2)


@pytest.mark.parametrize("style", ["0.9.0", "0.9.1"])
def test_rank4_decoder_matches_diffusers(style):
    """Same weights, same latents, same noise (upstream's torch.randn draws are handed the graph's planes)."""
    from models.ltx_video import ReferenceDecoder
    from models.ltx_video.vae import DecoderConfig, RankFourDecoder
    from zoo.weights import load_strict

    vae = tiny_vae(**(STYLE_091 if style == "0.9.1" else {}))
    port = RankFourDecoder(DecoderConfig.from_diffusers(dict(vae.config)))
    load_strict(port, {k: v for k, v in vae.state_dict().items() if k.startswith("decoder.")})
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(3, 8, 4, 5, generator=generator)]
    if vae.config.timestep_conditioning:
        inputs.append(torch.tensor([0.05]))
    inputs += [torch.randn(shape, generator=generator) for shape in port.noise_shapes(4, 5)]
    assert len(inputs) == len(port.input_names()) and (style == "0.9.0") == (len(inputs) == 1)
    with torch.no_grad():
        expected = ReferenceDecoder(vae.decoder, vae.config.timestep_conditioning)(*inputs)[0]
        got = port(*inputs)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5 * max(1.0, float(expected.abs().max()))


def test_a_091_decoder_with_timestep_and_noise_inputs_converts_on_litert(tmp_path):
    """The 0.9.1 decoder takes `latents, *rest` (timestep, noise planes): the LiteRT target must call it
    positionally (it once passed keywords: "unexpected keyword argument 'timestep'", found at real size)."""
    from models.ltx_video.vae import DecoderConfig, RankFourDecoder
    from zoo.targets import Entry
    from zoo.targets.litert import LiteRTRunner, LiteRTTarget

    vae = tiny_vae(**STYLE_091)
    port = RankFourDecoder(DecoderConfig.from_diffusers(dict(vae.config))).eval()
    generator = torch.Generator().manual_seed(1)
    inputs = {"latents": torch.randn(2, 8, 2, 2, generator=generator), "timestep": torch.tensor([0.05])}
    inputs.update({n: torch.randn(s, generator=generator) for n, s in zip(port.input_names()[2:], port.noise_shapes(2, 2))})
    path = LiteRTTarget().convert([Entry("main", port, inputs, ["video"])], None, tmp_path)
    with LiteRTRunner(path) as runner, torch.no_grad():
        got = runner.run("main", {k: v.numpy() for k, v in inputs.items()})["video"]
        expected = port(*inputs.values()).numpy()
    assert np.abs(got - expected).max() < 1e-4 * max(1.0, float(np.abs(expected).max()))


def max_rank(module, inputs) -> int:
    """Highest rank of any activation (a value computed from a graph input) in the exported graph. Weights are
    left out: a conv3d weight keeps upstream's rank-5 shape for strict loading, and its per-frame slices are
    constants the converters fold (the LiteRT GPU check accepts the graph)."""
    exported = torch.export.export(module.eval(), tuple(inputs), strict=False)
    live = set(exported.graph_signature.user_inputs)
    for node in exported.graph.nodes:
        if any(getattr(a, "name", None) in live for a in node.all_input_nodes):
            live.add(node.name)
    return max(n.meta["val"].dim() for n in exported.graph.nodes
               if n.name in live and isinstance(n.meta.get("val"), torch.Tensor))


def test_graphs_stay_at_rank_4_and_the_check_can_fail(ltx):
    m = ltx["module"]
    for component in ("dit", "vae-decoder"):
        builders = {"dit": (m.dit_build, m.dit_example_inputs), "vae-decoder": (m.decoder_build, m.decoder_example_inputs)}
        build, example = builders[component]
        assert max_rank(build(ltx["checkpoint"], ltx["cfg"]), example(ltx["checkpoint"], ltx["cfg"]).values()) <= 4
    vae = tiny_vae()  # negative control: upstream's decoder is rank 5 (and rank 8 in its depth-to-space)
    assert max_rank(vae.decoder, [torch.zeros(1, 8, 2, 4, 4)]) >= 5


# ---------------------------------------------------------------- the host sampler


def test_host_sampler_reproduces_the_eager_pipeline(ltx):
    from models.ltx_video.sampler import sample

    m, ck, cfg = ltx["module"], ltx["checkpoint"], ltx["cfg"]
    sampler_facts, decoder_facts = m.bundle_facts(ck, cfg)
    tokenizer = m.load_tokenizer(ck)
    eager = ltx["run"].frames.numpy()
    upstream = sample(m.eager_networks(ck, cfg, port=False), tokenizer, sampler_facts, decoder_facts)
    assert np.array_equal(upstream, eager)  # the loop itself is LTXPipeline's, to the bit
    ported = sample(m.eager_networks(ck, cfg, port=True), tokenizer, sampler_facts, decoder_facts)
    assert np.abs(ported - eager).max() < 1e-5
    reseeded = sample(m.eager_networks(ck, cfg, port=False), tokenizer, sampler_facts, decoder_facts, seed=1)
    assert gates.cosine(reseeded, eager) < 0.99  # the seed matters: the comparison above is not vacuous


# ---------------------------------------------------------------- weights


def test_pipeline_folder_loads_strictly_and_names_a_missing_key(ltx, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from zoo.weights import load_folder

    m, cfg = ltx["module"], ltx["cfg"]
    config, state, hashes = load_folder(m.TINY_DIR)
    assert set(config) == {"text_encoder", "transformer", "vae"}
    assert any(k.startswith("transformer/") for k in hashes)
    broken = tmp_path / "ltx"
    shutil.copytree(m.TINY_DIR, broken)
    weights_file = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights_file))
    tensors.pop("transformer_blocks.0.attn1.to_q.weight")
    save_file(tensors, str(weights_file))
    config, state, _ = load_folder(broken)
    from zoo.weights import Checkpoint

    with pytest.raises(ZooError, match="1 missing"):
        m.dit_build(Checkpoint("local", config, state, {"path": str(broken)}), cfg)


# ---------------------------------------------------------------- the per-step gate and its negative controls


def test_min_step_cosine_fails_on_nan_missing_or_drifting_steps():
    steps = [np.linspace(-1, 1, 48).reshape(2, 24) * (i + 1) for i in range(8)]
    assert gates.min_step_cosine([s.copy() for s in steps], steps) == pytest.approx(1.0)
    nan = [s.copy() for s in steps]
    nan[5][0, 3] = np.nan
    assert np.isnan(gates.min_step_cosine(nan, steps))
    assert np.isnan(gates.min_step_cosine(steps[:7], steps))
    drift = [s.copy() for s in steps]
    drift[7] = drift[7] + 0.01 * np.cos(np.arange(48)).reshape(2, 24)
    value = gates.min_step_cosine(drift, steps)
    assert not gates.check_value("min_step_cosine", value, 0.999999)
    assert gates.check_value("min_step_cosine", value, 0.99)


def test_per_step_gate_fails_on_a_converted_dit_baked_for_the_wrong_frame_rate(ltx, tmp_path):
    """Negative control on a saved artifact: RoPE baked for 24 fps while the pipeline ran at 25 (a real mistake:
    the tables depend on frame rate) converts and runs fine, and the per-step gate catches it."""
    from conftest import convert_with_target
    from zoo.pipeline import VerifyContext
    from zoo.sessions import OneShotSession
    from zoo.targets import Entry, get_target

    m, ck = ltx["module"], ltx["checkpoint"]
    wrong = ltx["cfg"].copy()
    wrong.video.frame_rate = 24
    module = m.dit_build(ck, wrong)
    inputs = m.dit_example_inputs(ck, ltx["cfg"])
    path = convert_with_target("coreai", [Entry("main", module, inputs, ["noise_pred"])], tmp_path)
    runner = get_target("coreai").open(path)
    try:
        ctx = VerifyContext(runner, OneShotSession(runner), "coreai", {}, {}, {"cosine": 0.999999, "min_step_cosine": 0.999999},
                            ck, ltx["cfg"], tmp_path)
        results, details = m.dit_verify(ctx)
    finally:
        runner.close()
    step_gate = next(g for g in results if g.metric == "min_step_cosine")
    assert not step_gate.passed and details["sampler_steps"]["count"] == 8
    assert 0.9 < step_gate.value < 0.999999  # close enough to fool a loose end-to-end check


# ---------------------------------------------------------------- the CLI end to end


def test_every_component_converts_on_both_targets_and_passes_every_step(converted):
    from gpu_mode import gpu_ready, gpu_required

    folder = background_convert.finished(converted)
    manifests = {p.parent.relative_to(folder).as_posix(): json.loads(p.read_text()) for p in folder.glob("*/*/manifest.json")}
    assert set(manifests) == {"text-encoder/coreai-bf16", "text-encoder/litert-fp32", "dit/coreai-fp32",
                              "dit/litert-fp32", "vae-decoder/coreai-fp32", "vae-decoder/litert-fp32"}
    assert all(m["status"] == "passed" and m["gates"] for m in manifests.values())
    for target in ("coreai", "litert"):
        report = json.loads((folder / "dit" / f"{target}-fp32" / "report.json").read_text())
        steps = report["sampler_steps"]
        assert steps["count"] == 8 and min(steps["cosine"]) >= 0.999999, steps
    if gpu_required() or gpu_ready()[0]:
        for component in ("dit", "vae-decoder"):
            gpu = json.loads((folder / component / "litert-fp32" / "report.json").read_text())["gpu"]
            assert gpu["status"] == "accepted", gpu
        # per-component GPU policy: the DiT is gated on the GPU's fp16 run, the reused T5 only in enforced fp32
        fp16_gated = {c: any(g["metric"] == "gpu_fp16_cosine" for g in manifests[f"{c}/litert-fp32"]["gates"])
                      for c in ("text-encoder", "dit", "vae-decoder")}
        assert fp16_gated == {"text-encoder": False, "dit": True, "vae-decoder": True}


@pytest.mark.parametrize("target", ["coreai", "litert"])
def test_generate_drives_the_three_bundles(converted, target, tmp_path, run_cli):
    folder = background_convert.finished(converted)
    out = tmp_path / f"clip-{target}.gif"
    result = run_cli("zoo.generate", "ltx-video", "--bundles", str(folder), "--target", target,
                     "--prompt", "a blue fish swims in the river", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    for component in ("text-encoder", "dit", "vae-decoder"):
        assert f"using {component}: {folder / component}/{target}-" in result.stdout
    from PIL import Image

    with Image.open(out) as gif:
        assert gif.n_frames == 9


def refused(result, text: str) -> None:
    said = result.stdout + result.stderr
    assert result.returncode == 2, said
    assert text in " ".join(said.split()) and "Traceback" not in said


def test_generate_refuses_bad_bundle_requests(converted, tmp_path, run_cli):
    folder = background_convert.finished(converted)
    prompt = ["--prompt", "a cat"]
    refused(run_cli("zoo.generate", "--bundles", str(tmp_path), *prompt, "--out", str(tmp_path / "a.gif")),
            "holds no bundles")
    refused(run_cli("zoo.generate", "--bundles", str(folder), *prompt), "--bundles needs --out")
    refused(run_cli("zoo.generate", *prompt), "Pass exactly one of --bundle")
    refused(run_cli("zoo.generate", "--bundles", str(folder), *prompt, "--out", str(tmp_path / "a.gif")),
            "pick the target with --target")
    from models.ltx_video.sampler import run_bundles

    with pytest.raises(ZooError, match="written as .gif"):  # checked before any session is used
        run_bundles({}, {}, "a cat", tmp_path / "a.mp4")


# ---------------------------------------------------------------- weights=hub, on a checkpoint laid out as the Hub lays it out


def test_hub_weights_fetch_only_the_pipeline_parts_at_the_pinned_revision(ltx, loopback):
    """The Lightricks repo layout (diffusers parts in sub-folders, original-format single files at the root) on the
    loopback Hub, through the real client: only the parts are fetched, every file is hashed, the parts load
    strictly, and an unpinned revision is refused before any download."""
    from zoo.registry import get_spec
    from zoo.weights import resolve

    m = ltx["module"]
    files = {p.relative_to(m.TINY_DIR).as_posix(): p.read_bytes() for p in m.TINY_DIR.rglob("*") if p.is_file()}
    files["ltx-video-2b-v0.9.safetensors"] = b"original-format single file: must not be fetched"
    sha = loopback.seed_repo("zoo-test/ltx-video-tiny", files)
    cfg = ltx["cfg"].copy()
    cfg.variants.tiny.hub = {"repo_id": "zoo-test/ltx-video-tiny", "revision": None,
                             "patterns": list(ltx["cfg"].variants["0.9.0"].hub.patterns)}
    spec = get_spec(cfg)
    with pytest.raises(ZooError, match="revision"):
        resolve(cfg, "hub", spec.tiny_dir, spec.random_checkpoint)
    cfg.variants.tiny.hub.revision = sha
    checkpoint = resolve(cfg, "hub", spec.tiny_dir, spec.random_checkpoint)
    assert checkpoint.provenance["revision"] == sha and checkpoint.is_real
    assert set(checkpoint.config) == {"text_encoder", "transformer", "vae"}
    assert not (Path(checkpoint.provenance["path"]) / "ltx-video-2b-v0.9.safetensors").exists()
    assert set(checkpoint.provenance["files"]) == {"text_encoder/model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                                                   "transformer/diffusion_pytorch_model.safetensors"}
    for name in ("text-encoder", "dit", "vae-decoder"):
        spec.component(name).build(checkpoint, cfg)   # strict loads (a missing key is named: test above)
    assert m.load_tokenizer(checkpoint)("a cat").input_ids == m.load_tokenizer(ltx["checkpoint"])("a cat").input_ids


def test_gpu_policy_of_a_component_overrides_only_what_it_names(ltx):
    from zoo.targets.litert import gpu_policy

    text, dit = gpu_policy(ltx["cfg"], "fp32", "text-encoder"), gpu_policy(ltx["cfg"], "fp32", "dit")
    assert text.fp32_only and dit.fp32_only is None
    assert text.require_resident and dit.require_resident and text.fp32_rel_tol == dit.fp32_rel_tol
    assert gpu_policy(ltx["cfg"], "fp32") == dit  # no component: the model's block


def test_component_default_precision_is_typed_and_checked(ltx):
    from zoo.precision import resolve_precision
    from zoo.schema import check_semantics
    from zoo.targets import TARGET_PRECISIONS

    cfg = ltx["cfg"].copy()
    assert resolve_precision("default", "coreai", cfg, component="text-encoder").name == "bf16"
    assert resolve_precision("default", "coreai", cfg, component="dit").name == "fp32"
    assert resolve_precision("fp16", "coreai", cfg, component="text-encoder").name == "fp16"  # asked for: honoured
    assert check_semantics(cfg, TARGET_PRECISIONS) == []
    cfg.component_precision = {"text-encoder": {"litert": "bf16"}}   # LiteRT has no bf16
    assert any("component_precision.text-encoder.litert" in p for p in check_semantics(cfg, TARGET_PRECISIONS))
