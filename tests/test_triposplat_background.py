"""TripoSplat's background remover (upstream BiRefNet, tiny, offline): the port against upstream's golden fixtures
(scripts/make_triposplat_background_goldens.py, upstream a78fa12's classes with torchvision's deform_conv2d, in the
reference venv), the released file's key layout at real size, the host-side steps around the graph. The conversions
on both targets with their gates and the LiteRT GPU check, and the gate's negative control, are slow (minutes here:
`pytest -m slow tests/test_triposplat_background.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import background_convert
from models.triposplat import background as bg
from zoo.errors import ZooError
from zoo.weights import load_strict

PACKAGE = Path(__file__).resolve().parent.parent / "models" / "triposplat"
TINY_PART = PACKAGE / "tiny" / "background_remover"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py: tiny graphs, one thread


@pytest.fixture(scope="module")
def golden():
    config = bg.BiRefNetConfig.from_dict(json.loads((TINY_PART / "config.json").read_text()))
    state = load_file(str(TINY_PART / "model.safetensors"))
    io = load_file(str(PACKAGE / "golden" / "background_tiny_io.safetensors"))
    return config, state, io


def port(golden, sampler="gather", **kwargs) -> bg.BiRefNet:
    config, state, _ = golden
    return load_strict(bg.BiRefNet(config, sampler, **kwargs), state).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_upstream_file_loads_strictly_and_saves_back_its_keys(golden):
    """Upstream's own state dict (530 keys at the tiny widths, incl. Swin's relative_position_index buffers and
    the training-only heads) is exactly the port's; the half-resolution pass adds no weights."""
    _, state, _ = golden
    net = port(golden)
    saved = net.state_dict()
    assert set(saved) == set(state) and len(state) == 530
    for key, value in state.items():
        assert torch.equal(saved[key].to(value.dtype), value), key


@pytest.mark.parametrize("sampler", bg.SAMPLERS)
def test_port_matches_upstream_birefnet(golden, sampler):
    """Backbone features after the multi-scale concat, the logits and the matte, against upstream's forward on the
    same ImageNet-normalised image (both deformable-sampler forms)."""
    _, _, io = golden
    net = port(golden, sampler)
    with torch.no_grad():
        x = (io["image"] - net.pixel_mean) / net.pixel_std
        for name, feature in zip(("x1", "x2", "x3", "x4"), net.encode(x)):
            assert rel(feature, io[name]) < 1e-5, name
        assert rel(net.logits(x), io["logits"]) < 1e-5
        alpha = net(io["image"])
    assert alpha.shape == (1, 1, 64, 64)
    assert float((alpha - io["alpha"]).abs().max()) < 1e-5
    assert float(io["alpha"].std()) > 0.2, "the golden matte is not flat (the comparison means something)"


def test_wrong_window_shift_or_normalisation_misses_upstream(golden):
    """Negative controls at the same tolerance: the shifted-window masks dropped (every window attends across
    the roll's seam), and the image normalised with 0.5 instead of upstream's ImageNet constants."""
    _, _, io = golden
    net = port(golden)
    for layer in net.bb.layers:
        for scale in bg.SCALES:
            getattr(layer, f"attn_mask_{scale}").zero_()
    with torch.no_grad():
        assert rel(net.logits((io["image"] - net.pixel_mean) / net.pixel_std), io["logits"]) > 1e-3
        half = port(golden, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        assert float((half(io["image"]) - io["alpha"]).abs().max()) > 1e-2


def test_real_architecture_has_upstreams_754_keys_and_220_m_params():
    """The defaults are upstream's Swin-L BiRefNet: 754 keys and 220,176,498 parameters, as upstream's BiRefNet()
    in the reference venv counts them (built on the meta device: no memory)."""
    with torch.device("meta"):
        net = bg.BiRefNet(bg.BiRefNetConfig())
    assert len(net.state_dict()) == 754
    assert sum(p.numel() for p in net.parameters()) == 220_176_498
    for name, buffer in net.named_buffers():
        assert not name.startswith("half"), name


def test_image_size_must_allow_the_half_resolution_pass():
    with pytest.raises(ZooError, match="multiple of 64"):
        bg.BiRefNetConfig.from_dict({"image_size": 96})


def test_host_side_resizes_are_upstreams():
    """remove_background's resizes: bilinear with align_corners both ways (corners kept exactly), and the matte
    truncated to uint8 as `(alpha.clamp(0, 1) * 255).to(torch.uint8)` does."""
    image = torch.rand(1, 3, 37, 53, generator=torch.Generator().manual_seed(3))
    resized = bg.resize_for_matting(image, 64)
    assert resized.shape == (1, 3, 64, 64)
    assert torch.equal(resized[..., 0, 0], image[..., 0, 0]) and torch.equal(resized[..., -1, -1], image[..., -1, -1])
    alpha = torch.tensor([[[[0.999, -0.2], [1.3, 0.5]]]])
    out = bg.alpha_to_image_size(alpha, 2, 2)
    assert out.dtype == np.uint8 and out.tolist() == [[254, 0], [255, 127]]


def test_component_builds_from_the_tiny_checkpoint_with_the_gate_photo():
    import models.triposplat as tripo
    from zoo import weights
    from zoo.registry import load_model_config

    cfg = load_model_config("triposplat")
    checkpoint = weights.resolve(cfg, "tiny", tripo.TINY_DIR, tripo.random_checkpoint)
    inputs = tripo.background_inputs(checkpoint, cfg)
    assert list(inputs) == ["image"] and inputs["image"].shape == (1, 3, 64, 64)
    photo = bg.gate_photo(128)
    assert photo.shape == (128, 128, 3) and photo.dtype == np.uint8
    with torch.no_grad():
        alpha = tripo.background_build(checkpoint, cfg)(inputs["image"])
    assert alpha.shape == (1, 1, 64, 64) and float(alpha.min()) >= 0 and float(alpha.max()) <= 1


def test_each_target_gets_its_sampler_form_unless_the_config_names_one(golden):
    """LiteRT: the tent form (no GATHER, which its GPU delegate rejects); Core AI: the gather form;
    model.background.sampler overrides (real size on LiteRT needs gather), and anything else is refused."""
    import models.triposplat as tripo
    from zoo.registry import load_model_config

    cfg = load_model_config("triposplat")
    net = port(golden)

    def forms():
        return {m.sampler for m in net.modules() if isinstance(m, bg.DeformableConv2d)}

    for target, form in (("litert", "tent"), ("coreai", "gather")):
        (entry,) = tripo.background_entries(net, {"image": torch.zeros(1, 3, 64, 64)}, target, cfg)
        assert forms() == {form} and entry.output_names == ["alpha"]
    cfg.background.sampler = "gather"
    tripo.background_entries(net, {}, "litert", cfg)
    assert forms() == {"gather"}
    cfg.background.sampler = "nearest"
    with pytest.raises(ZooError, match="model.background.sampler"):
        tripo.background_entries(net, {}, "litert", cfg)


# ---------------------------------------------------------------- a photo without alpha in the pipeline


def test_photo_without_alpha_is_cut_out_by_the_matte_and_refused_without_one():
    """image_input.prepare on the gate photo (the test card's disc over a striped backdrop, no alpha): with no
    matte it is refused naming the component; with the card's own alpha as the matte it composites like the RGBA
    card (black backdrop); with an all-opaque matte the backdrop shows (the control: far from the card's composite)."""
    from PIL import Image

    from models.triposplat import encoders, image_input

    card = encoders.test_card(128)
    photo = Image.fromarray(bg.gate_photo(128), "RGB")
    with pytest.raises(ZooError, match="no background-remover bundle"):
        image_input.prepare(photo, 64)

    def oracle(rgb):
        return np.asarray(Image.fromarray(card[..., 3], "L").resize(rgb.size, Image.LANCZOS))

    cut = image_input.prepare(photo, 64, matte=oracle)
    reference = image_input.prepare(Image.fromarray(card, "RGBA"), 64)
    corners = cut[..., [0, 0, -1, -1], [0, -1, 0, -1]]
    assert float(corners.abs().max()) == 0.0
    assert float((cut - reference).abs().mean()) < 0.02
    opaque = image_input.prepare(photo, 64, matte=lambda rgb: np.full((rgb.height, rgb.width), 255, np.uint8))
    assert float((opaque - reference).abs().mean()) > 0.1
    with pytest.raises(ZooError, match="matte"):
        image_input.prepare(photo, 64, matte=lambda rgb: np.zeros((3, 3), np.uint8))


def test_generate_picks_the_background_remover_only_when_its_bundle_is_there():
    """Component.optional: `zoo generate` needs the five networks; the background remover joins when converted."""
    from zoo.generate_pipeline import pick_bundles

    five = ["image-encoder", "vae-encoder", "dit", "octree-decoder", "gaussian-decoder"]

    def found(components):
        return [(Path(f"/bundles/{c}"), {"model": "triposplat", "component": c, "target": "litert",
                                         "precision": "fp32", "status": "passed"}) for c in components]

    _, target, chosen = pick_bundles(found(five), "triposplat", None)
    assert target == "litert" and sorted(chosen) == sorted(five)
    _, _, chosen = pick_bundles(found([*five, "background-remover"]), "triposplat", None)
    assert chosen["background-remover"] == Path("/bundles/background-remover")
    with pytest.raises(ZooError):
        pick_bundles(found([c for c in five if c != "dit"] + ["background-remover"]), "triposplat", "litert")


def test_optional_checkpoint_file_loads_when_present(tmp_path):
    """optional_checkpoint_files (upstream's background_removal/birefnet.safetensors): loaded with its part prefix
    when the folder has it, skipped when not; a required file stays required."""
    from safetensors.torch import save_file

    from zoo.weights import load_named_files

    (tmp_path / "vae").mkdir()
    save_file({"w": torch.ones(2)}, str(tmp_path / "vae" / "a.safetensors"))
    files, optional = {"vae_encoder": "vae/a.safetensors"}, {"background_remover": "background_removal/b.safetensors"}
    _, state, hashes = load_named_files(tmp_path, files, optional)
    assert list(state) == ["vae_encoder.w"] and list(hashes) == ["vae/a.safetensors"]
    (tmp_path / "background_removal").mkdir()
    save_file({"bb.x": torch.zeros(3)}, str(tmp_path / "background_removal" / "b.safetensors"))
    _, state, _ = load_named_files(tmp_path, files, optional)
    assert sorted(state) == ["background_remover.bb.x", "vae_encoder.w"]
    with pytest.raises(ZooError, match="has no vae/c.safetensors"):
        load_named_files(tmp_path, {"vae_encoder": "vae/c.safetensors"}, optional)


# ---------------------------------------------------------------- the saved artifacts (slow: minutes here)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """fp32 on both targets with the LiteRT GPU check (minutes here: the README's table has the seconds)."""
    yield from background_convert.start(tmp_path_factory.mktemp("background"),
                                        ["model=triposplat", "component=background-remover", "target=all",
                                         "precision=fp32"], "triposplat")


@pytest.fixture(scope="module")
def negative(tmp_path_factory):
    """The gate's negative control: upstream's ImageNet mean/std replaced by 0.5 in the graph (Core AI, fp32)."""
    yield from background_convert.start(tmp_path_factory.mktemp("background-negative"),
                                        ["model=triposplat", "component=background-remover", "target=coreai",
                                         "precision=fp32", "model.background.pixel_mean=[0.5,0.5,0.5]",
                                         "model.background.pixel_std=[0.5,0.5,0.5]"], "triposplat")


@pytest.mark.slow
def test_converts_on_both_targets_gpu_resident_and_passes_its_gates(converted):
    folder = background_convert.finished(converted)
    for target in ("coreai", "litert"):
        report = json.loads((folder / "background-remover" / f"{target}-fp32" / "report.json").read_text())
        assert report["status"] == "passed", report.get("error") or report["gates"]
        metrics = {g["metric"]: g["value"] for g in report["gates"]}
        assert metrics["cosine"] >= 0.999999 and metrics["rel_max_abs"] <= 1e-4
        if target == "litert":
            assert metrics["gpu_resident"] == 1 and metrics["gpu_fp32_rel_err"] <= 1e-4
        assert json.loads((folder / "background-remover" / f"{target}-fp32" / "background.json").read_text()) == {
            "image_size": 64}


@pytest.mark.slow
def test_wrong_normalisation_in_the_graph_fails_the_gate(negative):
    proc, folder = negative
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode != 0, output[-2000:]
    report = json.loads((folder / "background-remover" / "coreai-fp32.failed" / "report.json").read_text())
    assert report["status"] == "gate_failed"
    failed = {g["metric"] for g in report["gates"] if not g["passed"]}
    assert {"cosine", "rel_max_abs"} <= failed


@pytest.fixture(scope="module")
def six_bundles(tmp_path_factory):
    """Every component on LiteRT at fp32 (GPU check off: the fp32 conversion above has it) for `zoo generate`."""
    yield from background_convert.start(tmp_path_factory.mktemp("six"),
                                        ["model=triposplat", "target=litert", "precision=fp32", "model.gpu.check=false"],
                                        "triposplat")


@pytest.mark.slow
def test_generate_cuts_a_photo_out_through_the_six_bundles(six_bundles, tmp_path, run_cli):
    """`zoo generate triposplat --image photo.png` on an RGB photo: the background-remover bundle's matte, then the
    five networks; the .ply matches the same chain over the eager references (the port's BiRefNet among them)."""
    from PIL import Image

    import models.triposplat as tripo
    from models.triposplat import bundles, image_input, ply
    from zoo import weights
    from zoo.registry import load_model_config

    folder = background_convert.finished(six_bundles)
    Image.fromarray(bg.gate_photo(150), "RGB").save(tmp_path / "photo.png")
    out = tmp_path / "splats.ply"
    result = run_cli("zoo.generate", "triposplat", "--bundles", str(folder), "--target", "litert",
                     "--image", str(tmp_path / "photo.png"), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cut out by the background-remover bundle" in result.stdout and "2048 Gaussians" in result.stdout
    cfg = load_model_config("triposplat")
    checkpoint = weights.resolve(cfg, "tiny", tripo.TINY_DIR, tripo.random_checkpoint)
    chain = bundles.eager_chain(checkpoint, cfg)
    image = image_input.load(tmp_path / "photo.png", tripo.encoder_image_size(checkpoint, cfg), chain.matte)
    gaussians, _ = bundles.chain(chain, image, int(cfg.seed))
    eager = ply.read_ply(ply.ply_bytes(ply.ply_arrays(gaussians)))
    splats = ply.read_ply(out)
    for name in ("x", "y", "z", "f_dc_0", "opacity", "scale_0", "rot_0"):
        np.testing.assert_allclose(splats[name], eager[name], atol=2e-3, err_msg=name)
