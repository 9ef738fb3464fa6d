"""TripoSplat's image encoders (tiny, offline): the re-authored DINOv3 ViT and FLUX.2 VAE encoder against the library
classes (transformers DINOv3ViTModel, diffusers AutoencoderKLFlux2) on the same weights, the released files' key
layouts, upstream's preprocessing of an RGBA cut-out, the negative controls on saved artifacts (the fp16
conversions: slow). The encoders' fp32 conversion on both targets (with the LiteRT GPU check) and `zoo generate
--image` over all five bundles are in tests/test_triposplat.py: they share its one conversion of every component."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import background_convert
from zoo.errors import ZooError


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Both encoders, both targets, the default precision (fp16) with the LiteRT GPU check: the slow test's. fp32 on
    both targets (GPU check included) is converted and asserted in the default suite by tests/test_triposplat.py,
    whose `target=all precision=fp32` run converts every component."""
    yield from background_convert.start(tmp_path_factory.mktemp("encoders"),
                                        ["model=triposplat", "component=[image-encoder,vae-encoder]", "target=all"],
                                        "triposplat")


@pytest.fixture(scope="module")
def negative(tmp_path_factory):
    """Both negative controls in one run, fp32, on Core AI (the cheaper target; the README shows both): upstream's
    ImageNet mean/std replaced by 0.5 in the image-encoder graph; the VAE patchify's dy and dx swapped. Each must
    convert, run, and fail its gates."""
    yield from background_convert.start(tmp_path_factory.mktemp("encoders-negative"),
                                        ["model=triposplat", "component=[image-encoder,vae-encoder]", "target=coreai",
                                         "precision=fp32", "model.encoders.pixel_mean=[0.5,0.5,0.5]",
                                         "model.encoders.pixel_std=[0.5,0.5,0.5]", "model.encoders.patch_order=transposed",
                                         "model.gpu.check=false"], "triposplat")


def test_negative_conversion_started(negative):   # first: it runs while the port tests do
    assert negative[0].pid > 0


@pytest.fixture(scope="module")
def tiny():
    import models.triposplat as tripo
    from zoo import weights
    from zoo.registry import load_model_config

    torch.set_num_threads(1)
    cfg = load_model_config("triposplat")
    checkpoint = weights.resolve(cfg, "tiny", tripo.TINY_DIR, tripo.random_checkpoint)
    return {"tripo": tripo, "cfg": cfg, "checkpoint": checkpoint}


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ---------------------------------------------------------------- the port vs the library classes


def build_with_chunk(build, checkpoint, cfg, chunk: int):
    """The port built with query chunk `chunk` (the shared cfg goes back to no chunking afterwards)."""
    cfg.encoders.attention_chunk = chunk
    try:
        return build(checkpoint, cfg)
    finally:
        cfg.encoders.attention_chunk = 0


@pytest.mark.parametrize("chunk", [0, 7])
def test_image_encoder_matches_transformers_dinov3(tiny, chunk):
    """feature1 of the port (fp16-safe norms, RoPE tables, explicit attention, query chunks or not) vs
    DINOv3ViTModel + upstream's normalisation and layer norm, on the gate image: within 1e-5 relative."""
    tripo, cfg, ck = tiny["tripo"], tiny["cfg"], tiny["checkpoint"]
    port = build_with_chunk(tripo.image_encoder_build, ck, cfg, chunk)
    reference = tripo.image_encoder_reference(ck, cfg)
    image = tripo.image_encoder_inputs(ck, cfg)["image"]
    with torch.no_grad():
        ours, theirs = port(image), reference(image)
    assert ours.shape == (1, int(cfg.cond_tokens), 48)        # the tiny DiT's feature1: [1, 21, cond_channels]
    assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())


@pytest.mark.parametrize("chunk", [0, 5])
def test_vae_encoder_matches_diffusers_flux2(tiny, chunk):
    """feature2 of the port (one-hot patchify conv with the BN folded in, fp16-safe GroupNorm) vs
    AutoencoderKLFlux2's encoder + upstream's sampling / patchify / normalisation / pad: within 1e-5 relative,
    and the 5 prefix tokens exactly zero."""
    tripo, cfg, ck = tiny["tripo"], tiny["cfg"], tiny["checkpoint"]
    port = build_with_chunk(tripo.vae_encoder_build, ck, cfg, chunk)
    reference = tripo.vae_encoder_reference(ck, cfg)
    inputs = tripo.vae_encoder_inputs(ck, cfg)
    with torch.no_grad():
        ours, theirs = port(**inputs), reference(**inputs)
    assert ours.shape == (1, int(cfg.cond_tokens), 32)        # the tiny DiT's feature2: [1, 21, cond2_channels]
    assert torch.equal(ours[:, :5], torch.zeros_like(ours[:, :5]))
    assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())
    # the noise matters (a posterior sample, not the mean): another draw moves the tokens
    with torch.no_grad():
        other = port(inputs["image"], torch.zeros_like(inputs["noise"]))
    assert cosine(other[:, 5:], ours[:, 5:]) < 0.999


def test_negative_controls_are_far_from_the_reference_in_eager(tiny):
    """What the artifact controls below build, in eager: wrong normalisation moves feature1 (cosine 0.986 — only
    just: the final layer norm hides part of it, which is why rel_max_abs is gated too), the transposed patch
    order scrambles feature2."""
    from models.triposplat import encoders as enc

    tripo, cfg, ck = tiny["tripo"], tiny["cfg"], tiny["checkpoint"]
    state = tripo.encoder_state(ck, tripo.IMAGE_PART)
    size = tripo.encoder_image_size(ck, cfg)
    wrong = enc.ImageEncoder(tripo.dino_config(ck, cfg), size, 0, (0.5,) * 3, (0.5,) * 3)
    wrong.load_state_dict(state)
    image = tripo.image_encoder_inputs(ck, cfg)["image"]
    inputs = tripo.vae_encoder_inputs(ck, cfg)
    swapped = enc.VaeEncoder(tripo.vae_config(ck, cfg), 0, "transposed")
    swapped.load_state_dict(tripo.encoder_state(ck, tripo.VAE_PART))
    with torch.no_grad():
        f1, ref1 = wrong(image), tripo.image_encoder_reference(ck, cfg)(image)
        f2, ref2 = swapped(**inputs), tripo.vae_encoder_reference(ck, cfg)(**inputs)
    assert cosine(f1, ref1) < 0.999 and float((f1 - ref1).abs().max()) > 0.1 * float(ref1.abs().max())
    assert cosine(f2, ref2) < 0.9


def test_patchify_kernel_is_upstreams_channel_order():
    """channel c·4 + dy·2 + dx <- (c, dy, dx), as upstream's view(B, C, H/2, 2, W/2, 2).permute(0, 1, 3, 5, 2, 4)."""
    import torch.nn.functional as F
    from models.triposplat.encoders import patchify_weight

    x = torch.randn(1, 3, 4, 6)
    ours = F.conv2d(x, patchify_weight(3), stride=2)
    upstream = x.view(1, 3, 2, 2, 3, 2).permute(0, 1, 3, 5, 2, 4).reshape(1, 12, 2, 3)
    assert torch.equal(ours, upstream)
    assert not torch.equal(F.conv2d(x, patchify_weight(3, "transposed"), stride=2), upstream)


# ---------------------------------------------------------------- weights: the released files' layouts


def test_released_key_layouts_load_strictly(tiny):
    """The library classes' full state dicts — what the released files hold: DINOv3 with its mask token (and
    transformers 5's `model.layer.N` names), the whole FLUX.2 VAE with its decoder half and BN counter — load
    strictly into the ports after only the documented unused keys are dropped."""
    from transformers import DINOv3ViTModel
    from models.triposplat import encoders as enc

    tripo, cfg, ck = tiny["tripo"], tiny["cfg"], tiny["checkpoint"]
    dino_cfg, vae_cfg = tripo.dino_config(ck, cfg), tripo.vae_config(ck, cfg)
    dino_full = DINOv3ViTModel(dino_cfg.library(64)).state_dict()
    vae_full = vae_cfg.library().state_dict()
    assert any(k.startswith("model.layer.") for k in dino_full) and "embeddings.mask_token" in dino_full
    assert any(k.startswith("decoder.") for k in vae_full) and "bn.num_batches_tracked" in vae_full
    dino = enc.ImageEncoder(dino_cfg, 64)
    dino.load_state_dict(enc.clean_state(dino_full), strict=True)
    vae = enc.VaeEncoder(vae_cfg)
    vae.load_state_dict(enc.clean_state(vae_full), strict=True)
    # released DINOv3 files name blocks `layer.N` (upstream's loader matches ^layer\.N): the committed tiny part too
    assert any(k.startswith("image_encoder.layer.0.") for k in ck.state_dict)
    # an unexpected key is still refused
    with pytest.raises(RuntimeError, match="Unexpected"):
        vae.load_state_dict({**enc.clean_state(vae_full), "encoder.extra": torch.zeros(1)}, strict=True)


def test_real_architectures_have_the_library_keys_and_sizes(tiny):
    """variants.real on the meta device (no memory): the ports' keys and shapes are exactly the library classes'
    at DINOv3 ViT-H+/16 and FLUX.2's VAE — what the released files hold — and their sizes are the known ones
    (ViT-H+ 840.6 M parameters; the VAE encoder half 34.4 M)."""
    from omegaconf import OmegaConf
    from transformers import DINOv3ViTModel

    from models.triposplat import encoders as enc

    arch = OmegaConf.to_container(tiny["cfg"].variants.real.architecture)
    dino_cfg, vae_cfg = enc.DinoConfig.from_dict(arch["image_encoder"]), enc.VaeConfig.from_dict(arch["vae_encoder"])
    with torch.device("meta"):
        pairs = ((DINOv3ViTModel(dino_cfg.library(1024)), enc.ImageEncoder(dino_cfg, 1024, 256), 840.6),
                 (vae_cfg.library(), enc.VaeEncoder(vae_cfg, 1024), 34.4))
    for library, port, millions in pairs:
        theirs = {k: tuple(v.shape) for k, v in enc.clean_state(library.state_dict()).items()}
        assert {k: tuple(v.shape) for k, v in port.state_dict().items()} == theirs
        assert round(sum(p.numel() for p in port.parameters()) / 1e6, 1) == millions


def test_committed_tiny_encoder_weights_are_what_the_script_writes(tiny):
    """models/triposplat/tiny/{image,vae}_encoder = scripts/make_triposplat_encoder_tiny.py's seeded output."""
    import importlib.util

    from zoo.registry import ROOT

    spec = importlib.util.spec_from_file_location("make_tiny", ROOT / "scripts/make_triposplat_encoder_tiny.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ck = tiny["checkpoint"]
    for name, (config, state) in script.tiny_parts().items():
        assert ck.config[name] == config
        committed = {k[len(name) + 1:]: v for k, v in ck.state_dict.items() if k.startswith(name + ".")}
        assert set(committed) == set(state) and all(torch.equal(committed[k], state[k]) for k in state), name
    # the batch-norm statistics are not the identity: the normalisation is visible to the gates
    assert float(ck.state_dict["vae_encoder.bn.running_var"].std()) > 0.1


def test_tiny_encoders_fit_the_tiny_dit(tiny):
    """hidden 48 = cond_channels, 4·latent 32 = cond2_channels, 64² canvas -> 16 + 5 = cond_tokens 21; real:
    1280 / 128 / 1024² -> 4101."""
    from models.triposplat import encoders as enc

    tripo, cfg, ck = tiny["tripo"], tiny["cfg"], tiny["checkpoint"]
    dit = tripo.dit_config(ck, cfg)
    assert tripo.dino_config(ck, cfg).hidden_size == dit.cond_channels
    assert 4 * tripo.vae_config(ck, cfg).latent_channels == dit.cond2_channels
    assert tripo.encoder_image_size(ck, cfg) == 64
    real = cfg.variants.real.architecture
    assert real.image_encoder.hidden_size == real.dit.cond_channels == 1280
    assert 4 * real.vae_encoder.latent_channels == real.dit.cond2_channels == 128
    assert enc.image_size_for(4101, 16) == 1024
    with pytest.raises(ZooError, match="square number"):
        enc.image_size_for(22, 16)


def test_pipeline_noise_is_upstreams_draw_order():
    """One generator: the VAE posterior noise first (encode_image), then latent and camera (sample_latent)."""
    from models.triposplat import encoders as enc

    vae, noise = enc.pipeline_noise(42, (1, 8, 8, 8), 64, 16, 5)
    g = torch.Generator().manual_seed(42)
    assert torch.equal(vae, torch.randn(1, 8, 8, 8, generator=g))
    assert torch.equal(noise["latent"], torch.randn(1, 64, 16, generator=g))
    assert torch.equal(noise["camera"], torch.randn(1, 1, 5, generator=g))


# ---------------------------------------------------------------- the input image


def card(size=120, alpha=True) -> Image.Image:
    from models.triposplat.encoders import test_card

    array = test_card(size)
    return Image.fromarray(array if alpha else array[..., :3], "RGBA" if alpha else "RGB")


def test_cutout_is_cropped_and_composited_on_black():
    """upstream's preprocessing: the object's 1.2x square crop fills the canvas, transparent pixels become black."""
    from models.triposplat import image_input

    image = image_input.prepare(card(), 64)
    assert image.shape == (1, 3, 64, 64) and image.dtype == torch.float32
    assert float(image.min()) >= 0 and float(image.max()) <= 1
    corners = image[..., [0, 0, -1, -1], [0, -1, 0, -1]]
    assert float(corners.abs().max()) == 0.0            # the margin outside the disc: black
    lit = image.sum(1)[0] > 0.1                          # above LANCZOS ringing at the soft edge
    rows, cols = lit.any(-1).nonzero()[:, 0], lit.any(-2).nonzero()[:, 0]
    # the disc spans 1/1.2 of the canvas (64 / 1.2 = 53.3 px), centred (upstream's int() crop box: within 2 px)
    for span in (int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1):
        assert 50 <= span <= 57, span
    assert abs(float(rows.float().mean()) - 32) < 2 and abs(float(cols.float().mean()) - 32) < 2


def test_bad_images_are_refused_with_the_fix(tmp_path):
    from models.triposplat import image_input

    card(alpha=False).save(tmp_path / "rgb.png")
    opaque = card()
    opaque.putalpha(255)
    opaque.save(tmp_path / "opaque.png")
    clear = card()
    clear.putalpha(0)
    clear.save(tmp_path / "clear.png")
    (tmp_path / "text.png").write_text("not an image")
    for name, match in (("rgb.png", "no transparent pixels.*BiRefNet"), ("opaque.png", "no transparent pixels"),
                        ("clear.png", "fully transparent"), ("text.png", "could not be read as an image"),
                        ("missing.png", "is not a file")):
        with pytest.raises(ZooError, match=match):
            image_input.load(tmp_path / name, 64)
    card().convert("LA").save(tmp_path / "grey.png")          # grey + alpha is a cut-out too
    assert image_input.load(tmp_path / "grey.png", 64).shape == (1, 3, 64, 64)


# ---------------------------------------------------------------- the saved artifacts


def reports(folder) -> dict[tuple[str, str, str], dict]:
    found = {}
    for path in folder.glob("*/*/report.json"):
        report = json.loads(path.read_text())
        found[(report["component"], report["target"], report["precision"])] = report
    return found


@pytest.mark.slow
def test_encoders_convert_and_pass_their_gates_on_both_targets_at_fp16(converted):
    """fp16 on Core AI and LiteRT: feature1 / feature2 of each saved artifact vs the library reference, cosine and
    rel_max_abs (component_gates); the LiteRT graphs GPU-resident with fp32 GPU numerics matching CPU."""
    got = reports(background_convert.finished(converted))
    for component in ("image-encoder", "vae-encoder"):
        for target in ("coreai", "litert"):
            report = got[(component, target, "fp16")]
            assert report["status"] == "passed", report.get("error") or report["gates"]
            metrics = {g["metric"]: g for g in report["gates"]}
            assert metrics["cosine"]["value"] >= 0.9999 and metrics["rel_max_abs"]["value"] <= 2e-2
            if target == "litert":
                assert metrics["gpu_resident"]["value"] == 1 and metrics["gpu_fp32_rel_err"]["value"] <= 1e-4
            assert (converted[1] / component / f"{target}-fp16" / "encoder.json").is_file()


def test_negative_controls_fail_on_the_saved_artifacts(negative):
    """Wrong normalisation in the image-encoder graph and a transposed patchify in the vae-encoder graph convert,
    run, and fail both gates (kept as .failed, never published)."""
    proc, folder = negative
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode != 0, output[-3000:]        # a gate failure is a non-zero exit
    failed = {}
    for path in folder.glob("*/*.failed/report.json"):
        report = json.loads(path.read_text())
        failed[(report["component"], report["target"])] = {g["metric"]: g for g in report["gates"]}
    assert set(failed) == {("image-encoder", "coreai"), ("vae-encoder", "coreai")}, output[-3000:]
    for (component, target), metrics in failed.items():
        assert not metrics["cosine"]["passed"] and not metrics["rel_max_abs"]["passed"], (component, target)
