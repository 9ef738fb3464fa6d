"""TripoSplat decoders, octree sampling and .ply: the port against upstream's golden fixtures (no torchvision).

The fixtures come from upstream's own model.py / triposplat.py at a78fa12 (scripts/make_triposplat_decoder_goldens.py
in the reference env): a seeded tiny decoder file with upstream's keys, the octree decoder's logits, every call of
an 8-level octree descent, the Gaussian decoder's features and upstream's .ply bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from models.triposplat import octree, ply, render
from models.triposplat.decoders import (GAUSSIAN_PREFIX, OCTREE_PREFIX, GaussianDecoder, GaussianDecoderConfig,
                                        OctreeDecoderConfig, gaussian_decoder, gaussian_layout, octree_decoder,
                                        split_decoder_file)
from zoo.errors import ZooError
from zoo.weights import load_strict

PACKAGE = Path(__file__).resolve().parent.parent / "models" / "triposplat"
GOLDEN, TINY_DECODER = PACKAGE / "golden", PACKAGE / "tiny" / "decoder"


@pytest.fixture(scope="module")
def golden():
    state = load_file(TINY_DECODER / "model.safetensors")
    config = json.loads((TINY_DECODER / "config.json").read_text())
    return state, config, load_file(GOLDEN / "decoder_tiny_io.safetensors")


def octree_port(golden, **build):
    state, config, _ = golden
    return load_strict(octree_decoder(OctreeDecoderConfig.from_dict(config["octree"]), **build),
                       split_decoder_file(state, OCTREE_PREFIX)).eval()


def gaussian_port(golden, **build) -> GaussianDecoder:
    state, config, _ = golden
    return load_strict(gaussian_decoder(GaussianDecoderConfig.from_dict(config["gs"]), **build),
                       split_decoder_file(state, GAUSSIAN_PREFIX)).eval()


def test_decoder_file_loads_strictly_in_both_parts(golden):
    """Every key of upstream's decoder file lands in exactly one of the two ports (84 keys, incl. the
    persistent offset buffers), and the offset pattern we compute equals the stored one bitwise."""
    state, _, _ = golden
    octree_keys = set(octree_port(golden).state_dict())
    gs = gaussian_port(golden)
    assert {OCTREE_PREFIX + k for k in octree_keys} | {GAUSSIAN_PREFIX + k for k in gs.state_dict()} == set(state)
    fresh = GaussianDecoder(gs.cfg)
    assert torch.equal(fresh.points_offset_perturbation, state["gs.points_offset_perturbation"])
    assert torch.equal(fresh.base_offset_scale, state["gs.base_offset_scale"])
    with pytest.raises(ZooError, match="missing"):
        load_strict(GaussianDecoder(gs.cfg), split_decoder_file(state, OCTREE_PREFIX))


@pytest.mark.parametrize("build", [{}, {"host_sinusoids": True}, {"attention_chunk": 7}])
def test_octree_decoder_matches_upstream(golden, build):
    """Measured: max-abs ≤ 2e-6 on |logits| ~1 in every graph form (float level, host sinusoids, chunks)."""
    _, _, io = golden
    model = octree_port(golden, **build)
    with torch.no_grad():
        logits = model(*model.host_inputs(io["octree.points"], io["octree.level"], io["latent"]))
    ref = io["octree.logits"]
    assert logits.shape == ref.shape == (1, 24, 8)
    assert (logits - ref).abs().max() < 1e-5 * max(1.0, ref.abs().max())


@pytest.mark.parametrize("build", [{}, {"host_sinusoids": True}, {"attention_chunk": 24}])
def test_gaussian_decoder_matches_upstream(golden, build):
    _, _, io = golden
    model = gaussian_port(golden, **build)
    with torch.no_grad():
        features = model(*model.host_inputs(io["sample.points"], io["latent"]))
    ref = io["gs.features"]
    assert features.shape == ref.shape == (1, 64, 480)
    assert (features - ref).abs().max() < 1e-5 * max(1.0, ref.abs().max())
    assert gaussian_layout(32) == {"xyz": (0, 96), "dc": (96, 192), "scale": (192, 288), "rot": (288, 416),
                                   "opacity": (416, 448), "offset_scale": (448, 480)}


def recorded_calls(io) -> list[tuple]:
    calls, i = [], 0
    while f"sample.call{i}.logits" in io:
        calls.append((io[f"sample.call{i}.points"], io[f"sample.call{i}.level"], io[f"sample.call{i}.logits"]))
        i += 1
    return calls


def test_octree_sampling_reproduces_upstream_bitwise(golden):
    """Replaying upstream's recorded logits, our descent asks for the same parents at the same levels and, from
    the same seed, samples the same points and log-probs bit for bit."""
    _, _, io = golden
    calls = recorded_calls(io)
    assert len(calls) == octree.MAX_LEVEL
    asked = []

    def replay(points, level):
        want_points, want_level, logits = calls[len(asked)]
        asked.append(len(asked))
        assert torch.equal(points, want_points) and torch.equal(level, want_level)
        return logits

    generator = torch.Generator().manual_seed(int(io["sample.seed"]))
    out = octree.sample_points(replay, batch=1, num_points=64, generator=generator)
    assert len(asked) == octree.MAX_LEVEL
    assert torch.equal(out["points"], io["sample.points"])
    assert torch.equal(out["log_probs"], io["sample.log_probs"])
    # negative control: another seed samples other points
    def recycled(points, level):   # the level's recorded logits, rows reused for however many parents
        logits = calls[int(np.log2(float(level[0]))) - 1][2]
        return logits[:, torch.arange(points.shape[1]) % logits.shape[1]]

    other = octree.sample_points(recycled, 1, 64, generator=torch.Generator().manual_seed(int(io["sample.seed"]) + 1))
    assert not torch.equal(other["points"], io["sample.points"])


def test_octree_sampling_through_our_decoder_with_fixed_queries(golden):
    """Driven by our port through a fixed 64-query graph (padded, sliced), every level's logits match upstream's
    recorded ones to fp32 noise and the descent lands on upstream's points."""
    _, _, io = golden
    model = octree_port(golden)
    calls = recorded_calls(io)
    seen = []

    def graph(points, level):
        assert points.shape == (1, 64, 3)
        with torch.no_grad():
            return model(points, level, io["latent"])

    logits_fn = octree.fixed_queries(graph, 64)

    def checking(points, level):
        logits = logits_fn(points, level)
        ref = calls[len(seen)][2]
        seen.append(float((logits - ref).abs().max()))
        return logits

    out = octree.sample_points(checking, 1, 64, generator=torch.Generator().manual_seed(int(io["sample.seed"])))
    assert max(seen) < 1e-5
    assert torch.equal(out["points"], io["sample.points"])


def test_ply_matches_upstream_export_and_parses_back(golden, tmp_path):
    """Our Gaussian assembly + writer against upstream's own .ply bytes: same header, properties and count;
    values equal to fp32 rounding (rotation through a quaternion product where upstream goes via matrices)."""
    _, _, io = golden
    gs = gaussian_port(golden)
    params = octree.gaussian_parameters(io["gs.features"][0], io["sample.points"][0], gs)
    path = tmp_path / "splats.ply"
    count = ply.write_ply(path, params)
    ours, theirs = ply.read_ply(path), ply.read_ply(bytes(io["ply.bytes"].numpy()))
    assert count == 64 * 32 and list(ours) == list(theirs) == ply.PROPERTIES
    assert path.read_bytes()[:200].split(b"end_header")[0] == bytes(io["ply.bytes"].numpy())[:200].split(b"end_header")[0]
    for name in ply.PROPERTIES:
        assert ours[name].shape == (count,)
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=2e-6, err_msg=name)


def test_ply_reader_refuses_what_is_not_a_splat_file(tmp_path):
    with pytest.raises(ZooError, match="Not a PLY"):
        ply.read_ply(b"solid ascii stl\n")
    good = ply.ply_bytes(np.zeros((3, len(ply.PROPERTIES)), np.float32))
    with pytest.raises(ZooError, match="truncated"):
        ply.read_ply(good[:-4])
    with pytest.raises(ZooError, match="little-endian"):
        ply.read_ply(good.replace(b"binary_little_endian", b"ascii"))


# ---------------------------------------------------------------- the splat rasteriser


def splats(xyz, f_dc, scale=0.05, opacity=0.999) -> dict[str, torch.Tensor]:
    n = len(xyz)
    return {"xyz": torch.tensor(xyz, dtype=torch.float32), "f_dc": torch.tensor(f_dc, dtype=torch.float32),
            "opacity": torch.full((n, 1), opacity), "scale": torch.full((n, 3), scale),
            "rotation": torch.tensor([[1.0, 0, 0, 0]] * n)}


RED, GREEN = [1.7725, -1.7725, -1.7725], [-1.7725, 1.7725, -1.7725]   # rgb = 0.5 ± C0·1.7725 = 1 / 0


def test_render_places_and_orders_splats():
    """A centred splat lands in the centre, its colour from f_dc; of two splats on one line of sight the nearer
    (larger upstream y: the camera looks along -y of upstream's frame at azimuth 0) hides the farther, and
    swapping their depths swaps the colour seen."""
    image = render.render(splats([[0, 0, 0]], [RED]), size=64, azimuth=0, elevation=0)
    assert image.shape == (64, 64, 3)
    np.testing.assert_allclose(image[31:33, 31:33].mean(axis=(0, 1)), [0.99, 0, 0], atol=0.02)
    assert image[0, 0].max() == 0 and image[:, :16].max() < 0.01
    front_green = render.render(splats([[0, 0.2, 0], [0, -0.2, 0]], [GREEN, RED]), size=64, azimuth=0, elevation=0)
    front_red = render.render(splats([[0, -0.2, 0], [0, 0.2, 0]], [GREEN, RED]), size=64, azimuth=0, elevation=0)
    assert front_green[32, 32, 1] > 0.9 and front_green[32, 32, 0] < 0.05
    assert front_red[32, 32, 0] > 0.9 and front_red[32, 32, 1] < 0.05


def test_render_golden_decode_to_png(golden, tmp_path):
    _, _, io = golden
    params = octree.gaussian_parameters(io["gs.features"][0], io["sample.points"][0], gaussian_port(golden))
    image = render.render(params, size=48)
    assert np.isfinite(image).all() and image.max() > 0.1
    path = render.save_png(tmp_path / "pair.png", [image, image])
    from PIL import Image
    assert Image.open(path).size == (48 * 2 + 4, 48)
