"""TripoSplat's decoder components, `octree-decoder` and `gaussian-decoder`, and their gates.

Both read the checkpoint's `decoder` part (upstream's decoder file: keys `octree.*`, `gs.*`). Their gate inputs
come from one eager decode of one latent (the eager DiT sampler's final latent by default): an 8-level octree
descent through the eager octree decoder with a fixed query count and seed, then the Gaussian decoder on the
points it sampled.

- octree-decoder: every level's call (parents padded to the fixed query count) is fed to the saved graph and
  compared with the eager logits, with the sampler-step metrics taken over the 8 levels.
- gaussian-decoder: the array thresholds on the whole `[1, N, 480]` output and on each named slice of its layout
  (xyz, dc, scale, rot, opacity, offset_scale: zoo.gates.evaluate_slices), then the colour gate on the decoded
  Gaussians: rgb = clip(0.5 + C0·f_dc, 0, 1), its spread and mean chroma vs the eager decode's
  (`rgb_std_deviation`, `chroma_deviation`). Cosines cannot see a uniform desaturation (a slice scaled by 0.63
  keeps cosine 1.0), which is how the seed's int8 decoder failed (RGB std 0.275 -> 0.172) while passing
  per-net cosine. `model.decoders.dc_scale=0.63` builds a decoder whose colour output is scaled that way:
  the negative control that this gate must fail (README).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.triposplat import octree
from models.triposplat.decoders import (GAUSSIAN_PREFIX, OCTREE_PREFIX, GaussianDecoder, GaussianDecoderConfig,
                                        OctreeDecoder, OctreeDecoderConfig, gaussian_decoder, gaussian_layout,
                                        octree_decoder, split_decoder_file)
from zoo import gates
from zoo.registry import Component
from zoo.weights import Checkpoint, load_strict

PART = "decoder"
DECODER_FILE = "decoder.json"     # in each decoder bundle: what the host-side octree sampling / assembly needs
SH_C0 = 0.28209479177387814       # degree-0 spherical harmonic: rgb = 0.5 + C0·f_dc
OCTREE_OUTPUTS, GAUSSIAN_OUTPUTS = ["logits"], ["features"]


@dataclass
class DecoderSection:
    """config.yaml `decoders:`."""

    points: int = 64              # Gaussian decoder tokens = octree graph queries (real: 8192 = 262,144 / 32)
    attention_chunk: int = 0      # query chunk (0: none); real size on the LiteRT GPU needs one (models.md)
    host_sinusoids: bool = True   # point/level sinusoids computed on the host in fp32 (the graph's fp16 error)
    latent: str = "dit"           # gate latent: dit (the eager sampler's final latent) | seeded (N(0,1), no DiT run)
    dc_scale: float = 1.0         # negative control only: scales the converted decoder's colour output


def tripo():
    import models.triposplat as package   # the package imports this module; resolved at call time
    return package


def decoder_configs(checkpoint: Checkpoint, cfg) -> tuple[OctreeDecoderConfig, GaussianDecoderConfig]:
    """The checkpoint's own decoder/config.json ({octree, gs}: upstream's constructor arguments), else the
    variant's architecture (upstream's real decoder file carries no config)."""
    config = dict(checkpoint.config.get(PART) or {}) or tripo().architecture(cfg, PART)
    return OctreeDecoderConfig.from_dict(dict(config["octree"])), GaussianDecoderConfig.from_dict(dict(config["gs"]))


def decoder_state(checkpoint: Checkpoint, prefix: str) -> dict[str, torch.Tensor]:
    _, state = tripo().part(checkpoint, PART)
    return split_decoder_file(state, prefix)


# ---------------------------------------------------------------- builds


def octree_module(checkpoint: Checkpoint, cfg, chunk: int) -> OctreeDecoder:
    octree_cfg, _ = decoder_configs(checkpoint, cfg)
    module = octree_decoder(octree_cfg, bool(cfg.decoders.host_sinusoids), chunk)
    return load_strict(module, decoder_state(checkpoint, OCTREE_PREFIX)).eval()


def gaussian_module(checkpoint: Checkpoint, cfg, chunk: int) -> GaussianDecoder:
    _, gs_cfg = decoder_configs(checkpoint, cfg)
    module = gaussian_decoder(gs_cfg, bool(cfg.decoders.host_sinusoids), chunk)
    return load_strict(module, decoder_state(checkpoint, GAUSSIAN_PREFIX)).eval()


def octree_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    return octree_module(checkpoint, cfg, int(cfg.decoders.attention_chunk))


def octree_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    """The port, eager fp32: its parity with upstream, chunked or not, is tests/test_triposplat_decoders.py's.
    It takes the configured query chunk too: chunking is exact per query, and at real size an unchunked
    8192 x 8192 x 16-head score tensor is 4.3 GB per block."""
    return octree_module(checkpoint, cfg, int(cfg.decoders.attention_chunk))


def gaussian_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    module = gaussian_module(checkpoint, cfg, int(cfg.decoders.attention_chunk))
    scale = float(cfg.decoders.dc_scale)
    if scale != 1.0:   # the colour gate's negative control: f_dc (and so rgb - 0.5) shrinks by `scale`
        start, stop = module.layout["dc"]
        with torch.no_grad():
            module.out_proj.weight[start:stop] *= scale
            module.out_proj.bias[start:stop] *= scale
    return module


def gaussian_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    return gaussian_module(checkpoint, cfg, int(cfg.decoders.attention_chunk))   # as octree_reference


# ---------------------------------------------------------------- the eager decode every gate is taken from


@dataclass
class EagerDecode:
    latent: torch.Tensor
    levels: list[dict[str, torch.Tensor]]    # per octree level: the graph's padded inputs, by name
    level_logits: list[torch.Tensor]         # the eager logits of those calls [1, Q, 8]
    points: torch.Tensor                     # [1, N, 3] sampled points


_DECODES: dict = {}


def gate_latent(checkpoint: Checkpoint, cfg) -> torch.Tensor:
    """The latent the decoders are gated on: the eager DiT sampler's final latent, or (`latent: seeded`) N(0,1) of
    its shape, for real-size decoder runs where 20 eager real-size DiT steps would take hours here."""
    if str(cfg.decoders.latent) == "dit":
        return tripo().eager_run(checkpoint, cfg).final["latent"].float()
    dit = tripo().architecture(cfg, "dit")
    shape = (1, int(dit["q_token_length"]), int(dit["in_channels"]))
    return torch.randn(shape, generator=torch.Generator().manual_seed(int(cfg.seed) + 7))


def eager_decode(checkpoint: Checkpoint, cfg) -> EagerDecode:
    key = (json.dumps(checkpoint.provenance, sort_keys=True, default=str), str(cfg.variant), int(cfg.seed),
           int(cfg.decoders.points), str(cfg.decoders.latent), bool(cfg.decoders.host_sinusoids))
    if key in _DECODES:
        return _DECODES[key]
    oct_model = octree_reference(checkpoint, cfg)
    latent = gate_latent(checkpoint, cfg)
    queries = int(cfg.decoders.points)
    levels, level_logits = [], []

    def graph(points, level):
        inputs = oct_model.host_inputs(points, level, latent)
        levels.append(dict(zip(oct_model.input_names(), inputs)))
        with torch.no_grad():
            level_logits.append(oct_model(*inputs))
        return level_logits[-1]

    sampled = octree.sample_points(octree.fixed_queries(graph, queries), 1, queries,
                                   generator=torch.Generator().manual_seed(int(cfg.seed)))
    _DECODES.clear()
    _DECODES[key] = EagerDecode(latent, levels, level_logits, sampled["points"])
    return _DECODES[key]


def octree_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The last level's call (the most parents)."""
    return dict(eager_decode(checkpoint, cfg).levels[-1])


def gaussian_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The points the eager descent sampled, with the latent it descended on."""
    run = eager_decode(checkpoint, cfg)
    module = gaussian_reference(checkpoint, cfg)
    return dict(zip(module.input_names(), module.host_inputs(run.points, run.latent)))


# ---------------------------------------------------------------- gates


def octree_verify(ctx) -> tuple[list, dict]:
    """Every level's recorded call through the saved graph; step metrics over the levels, array metrics on the
    example (the last level)."""
    run = eager_decode(ctx.checkpoint, ctx.cfg)
    candidates, references = [], []
    with ctx.session as session:
        for inputs, logits in zip(run.levels, run.level_logits):
            out = session.run({k: v.numpy() for k, v in inputs.items()})
            candidates.append(np.asarray(out["logits"]))
            references.append(logits.numpy())
    arrays = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "arrays"}
    results = gates.evaluate({"logits": candidates[-1]}, {"logits": references[-1]}, arrays)
    for metric, threshold in ctx.thresholds.items():
        if gates.METRICS[metric].compares == "sampler steps":
            value = gates.measure(metric, candidates, references)
            results.append(gates.GateResult(f"logits ({len(references)} octree levels)", metric, value,
                                            float(threshold), gates.check_value(metric, value, threshold)))
    details = {"outputs": [{"name": "logits", "shape": list(candidates[-1].shape), "dtype": str(candidates[-1].dtype)}],
               "octree_levels": {"cosine": [gates.cosine(c, r) for c, r in zip(candidates, references)],
                                 "rel_max_abs": [gates.rel_max_abs(c, r) for c, r in zip(candidates, references)]}}
    return results, details


def rgb_from_features(features: np.ndarray, dc: tuple[int, int]) -> np.ndarray:
    """[..., 480] decoder output -> [M, 3] rgb of every Gaussian (the dc slice, production lr 1.0)."""
    f_dc = np.asarray(features, dtype=np.float64)[..., dc[0]:dc[1]].reshape(-1, 3)
    return np.clip(0.5 + SH_C0 * f_dc, 0.0, 1.0)


def colour_statistics(rgb: np.ndarray) -> dict[str, float]:
    return {"rgb_std": float(np.std(rgb)), "mean_chroma": float(gates.chroma(rgb).mean())}


def gaussian_verify(ctx) -> tuple[list, dict]:
    with ctx.session as session:
        out = session.run(ctx.inputs)
    # the eager reference's answer on the same inputs: the descent's sampled points (gaussian_example_inputs)
    candidate, reference = np.asarray(out["features"]), np.asarray(ctx.reference_outputs["features"])
    arrays = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "arrays"}
    _, gs_cfg = decoder_configs(ctx.checkpoint, ctx.cfg)
    layout = gaussian_layout(gs_cfg.representation_config.num_gaussians)
    results = gates.evaluate({"features": candidate}, {"features": reference}, arrays)
    results += gates.evaluate_slices({"features": candidate}, {"features": reference}, {"features": layout}, arrays)
    rgb_c, rgb_r = rgb_from_features(candidate, layout["dc"]), rgb_from_features(reference, layout["dc"])
    for metric, threshold in ctx.thresholds.items():
        if gates.METRICS[metric].compares == "colours":
            value = gates.measure(metric, rgb_c, rgb_r)
            results.append(gates.GateResult(f"rgb ({rgb_r.shape[0]} Gaussians)", metric, value, float(threshold),
                                            gates.check_value(metric, value, threshold)))
    details = {"outputs": [{"name": "features", "shape": list(candidate.shape), "dtype": str(candidate.dtype)}],
               "colour": {"converted": colour_statistics(rgb_c), "eager": colour_statistics(rgb_r)},
               "slices": {name: {"cosine": gates.cosine(candidate[..., a:b], reference[..., a:b]),
                                 "rel_max_abs": gates.rel_max_abs(candidate[..., a:b], reference[..., a:b])}
                          for name, (a, b) in layout.items()}}
    return results, details


# ---------------------------------------------------------------- bundle facts for the host side


def decoder_facts(checkpoint: Checkpoint, cfg) -> dict:
    octree_cfg, gs_cfg = decoder_configs(checkpoint, cfg)
    gs_state = decoder_state(checkpoint, GAUSSIAN_PREFIX)
    rep = gs_cfg.representation_config
    return {"points": int(cfg.decoders.points), "levels": octree.MAX_LEVEL,
            "host_sinusoids": bool(cfg.decoders.host_sinusoids),
            "octree_channels": octree_cfg.model_channels, "gaussian_channels": gs_cfg.model_channels,
            "representation": {k: getattr(rep, k) for k in rep.__dataclass_fields__},
            "points_offset_perturbation": gs_state["points_offset_perturbation"].tolist(),
            "base_offset_scale": float(gs_state["base_offset_scale"])}


def decoder_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    (Path(bundle_dir) / DECODER_FILE).write_text(json.dumps(decoder_facts(checkpoint, cfg), indent=1) + "\n")


COMPONENTS = [
    Component(name="octree-decoder", build=octree_build, reference=octree_reference,
              example_inputs=octree_example_inputs, output_names=OCTREE_OUTPUTS, verify=octree_verify,
              extra_files=decoder_extra_files),
    Component(name="gaussian-decoder", build=gaussian_build, reference=gaussian_reference,
              example_inputs=gaussian_example_inputs, output_names=GAUSSIAN_OUTPUTS, verify=gaussian_verify,
              extra_files=decoder_extra_files),
]


def random_decoder_part(cfg, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """The variant's decoder architecture with seeded default-init weights, upstream-keyed (octree. / gs.)."""
    config = tripo().architecture(cfg, PART)
    octree_cfg = OctreeDecoderConfig.from_dict(dict(config["octree"]))
    gs_cfg = GaussianDecoderConfig.from_dict(dict(config["gs"]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        state = {OCTREE_PREFIX + k: v.clone() for k, v in OctreeDecoder(octree_cfg).state_dict().items()}
        state.update({GAUSSIAN_PREFIX + k: v.clone() for k, v in GaussianDecoder(gs_cfg).state_dict().items()})
    return config, state
