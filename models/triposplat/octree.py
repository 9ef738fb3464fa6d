"""Host-side octree sampling and Gaussian assembly around the two decoder graphs.

Upstream (`OctreeProbabilityFixedlenDecoder.sample` and `sample_probs`, model.py at a78fa12) descends 8
levels: at level lv every occupied parent cell asks the octree decoder for its 8 children's logits, the
parent's point budget is split among the children by systematic resampling, and empty children are dropped.
At the last level each point gets a uniform jitter inside its cell. This file re-authors that loop with the
same torch ops in the same order and the same random draws, so with the same logits and the same generator
state it reproduces upstream's points bitwise (tests/test_triposplat_decoders.py replays upstream's recorded
logits). The decoder is any `logits_fn(points [B,P,3], level [B] float) -> [B,P,8]`: the eager port, or a
saved graph with a fixed query count, which `fixed_queries` pads to and slices from (the octree decoder's
blocks are cross-attention only, so padded rows do not touch the real ones).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from models.triposplat.decoders import (GaussianDecoder, RepresentationConfig, gaussian_layout, level_sinusoid,
                                        point_sinusoid)

MAX_LEVEL = 8
CHILD_OFFSETS = torch.tensor([[i, j, k] for k in (0, 1) for j in (0, 1) for i in (0, 1)], dtype=torch.long)
CDF_CAP = 1.0 - 1e-12

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fixed_queries(graph: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], queries: int) -> LogitsFn:
    """A logits function over any parent count ≤ `queries` from a graph that takes exactly `queries` rows."""

    def logits(points: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        b, p, _ = points.shape
        if p > queries:
            raise ValueError(f"{p} octree parents exceed the graph's {queries} queries")
        padded = torch.cat([points, points.new_full((b, queries - p, 3), 0.5)], dim=1) if p < queries else points
        return graph(padded, level)[:, :p]

    return logits


@torch.no_grad()
def systematic_counts(probs: torch.Tensor, counts: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Split each row's `counts` among its P categories by systematic resampling (upstream `sample_probs`).

    probs [..., P], counts [...] -> [..., P] long. One uniform offset per row, drawn per distinct count in
    the order torch.unique(sorted=False) gives them, as upstream draws them."""
    shape = counts.shape
    rows, cats = counts.numel(), probs.shape[-1]
    probs = probs.reshape(rows, cats).to(torch.float32).clamp_min(0)
    sums = probs.sum(1, keepdim=True)
    empty = sums.eq(0)
    probs = probs / sums.clamp_min(1)
    if empty.any():
        probs = torch.where(empty.expand_as(probs), torch.full_like(probs, 1.0 / cats), probs)
    counts = counts.reshape(rows).to(torch.long)
    out = torch.zeros(rows, cats, dtype=torch.long)
    cdf = probs.cumsum(dim=1).clamp(max=CDF_CAP)
    distinct, which = counts.unique(sorted=False, return_inverse=True)
    for i, n in enumerate(distinct.tolist()):
        if n == 0:
            continue
        sel = (which == i).nonzero(as_tuple=False).squeeze(1)
        start = torch.rand(sel.numel(), 1, generator=generator) / float(n)
        grid = torch.arange(n, dtype=torch.float32)[None, :] / float(n)
        positions = (start + grid).clamp(max=CDF_CAP)
        picked = torch.searchsorted(cdf.index_select(0, sel), positions).clamp_max(cats - 1)
        tally = torch.zeros(sel.numel(), cats, dtype=torch.float32)
        tally.scatter_add_(1, picked, torch.ones_like(picked, dtype=tally.dtype))
        out.index_copy_(0, sel, tally.to(torch.long))
    return out.reshape(*shape, cats)


@torch.no_grad()
def sample_points(logits_fn: LogitsFn, batch: int, num_points: int, levels: int = MAX_LEVEL,
                  temperature: float = 1.0, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Upstream's octree descent: -> {"points": [B, num_points, 3] in [0,1]³, "log_probs": [B, num_points]}."""
    coords = torch.zeros(batch, 1, 3, dtype=torch.long)
    budget = torch.full((batch, 1), num_points, dtype=torch.long)
    log_probs = torch.zeros(batch, 1, dtype=torch.float32)
    rows = torch.arange(batch).unsqueeze(1)
    for lv in range(1, levels + 1):
        centres = (coords.to(torch.float32) + 0.5) / (1 << (lv - 1))
        level = torch.full((batch,), float(1 << lv))
        logits = logits_fn(centres, level).float() / temperature
        child_counts = systematic_counts(torch.softmax(logits, dim=-1), budget, generator).flatten(1, 2)
        child_log_probs = torch.log_softmax(logits, dim=-1).flatten(1, 2)
        child_coords = (coords[:, :, None, :] * 2 + CHILD_OFFSETS[None, None]).flatten(1, 2)
        keep = child_counts > 0
        width = int(keep.sum(dim=1).max().item())
        slot = (keep.cumsum(dim=1) - 1)[keep]
        row = rows.expand_as(keep)[keep]
        coords = torch.zeros(batch, width, 3, dtype=torch.long)
        coords[row, slot] = child_coords[keep]
        new_budget = torch.zeros(batch, width, dtype=torch.long)
        new_budget[row, slot] = child_counts[keep]
        new_log_probs = torch.zeros(batch, width, dtype=torch.float32)
        new_log_probs[row, slot] = (log_probs.repeat_interleave(8, dim=1) + child_log_probs)[keep]
        budget, log_probs = new_budget, new_log_probs
    repeats = budget.flatten(0, 1)
    log_probs = torch.repeat_interleave(log_probs.flatten(0, 1), repeats, dim=0).reshape(batch, num_points)
    cells = torch.repeat_interleave(coords.flatten(0, 1), repeats, dim=0).reshape(batch, num_points, 3)
    jitter = torch.rand(cells.shape, dtype=torch.float32, generator=generator)
    return {"points": (cells.to(torch.float32) + jitter) / (1 << levels), "log_probs": log_probs}


# ---------------------------------------------------------------- decoder output -> Gaussians (upstream _build_gaussians)


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


@torch.no_grad()
def gaussian_parameters(features: torch.Tensor, points: torch.Tensor, rep: RepresentationConfig,
                        perturbation: torch.Tensor, base_offset_scale: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """One batch row's decoder output [N, 480] and points [N, 3] -> activated Gaussians (N·32 each), as
    upstream's `_build_gaussians` + `Gaussian` setters with the production representation config (softplus
    scales, aabb [-0.5]³ + 1). `perturbation` [32, 3] and `base_offset_scale` are the decoder file's buffers.
    -> xyz [M,3], f_dc [M,3], opacity [M,1] in (0,1), scale [M,3] > 0, rotation [M,4] (w,x,y,z, unnormalised)."""
    if rep.scaling_activation != "softplus":
        raise ValueError("only the production softplus scaling is supported")
    layout, ng = gaussian_layout(rep.num_gaussians), rep.num_gaussians
    n = features.shape[0]

    def part(name: str, width: int) -> torch.Tensor:
        a, b = layout[name]
        return features[:, a:b].reshape(n, ng, width)

    offset_scale = F.softplus(part("offset_scale", 1) + torch.as_tensor(base_offset_scale, dtype=torch.float32))
    offset = part("xyz", 3) * rep.lr["_xyz"]
    if rep.perturb_offset:
        offset = offset + perturbation
    offset = torch.tanh(offset) * 0.5 * rep.perturbe_size * offset_scale
    xyz = (offset + points[:, None, :]).flatten(0, 1) - 0.5
    lr = rep.lr
    scale = F.softplus(part("scale", 3).flatten(0, 1) * lr["_scaling"] + inverse_softplus(torch.tensor(rep.scaling_bias)))
    scale = torch.sqrt(torch.square(scale) + rep.filter_kernel_size_3d ** 2)
    opacity_bias = torch.log(torch.tensor(rep.opacity_bias) / (1 - torch.tensor(rep.opacity_bias)))
    opacity = torch.sigmoid(part("opacity", 1).flatten(0, 1) * lr["_opacity"] + opacity_bias)
    rotation = part("rot", 4).flatten(0, 1) * lr["_rotation"] + torch.tensor([1.0, 0.0, 0.0, 0.0])
    return {"xyz": xyz, "f_dc": part("dc", 3).flatten(0, 1) * lr["_features_dc"], "opacity": opacity,
            "scale": scale, "rotation": rotation}


def decoder_gaussians(features: torch.Tensor, points: torch.Tensor, decoder: GaussianDecoder) -> dict[str, torch.Tensor]:
    """gaussian_parameters with an eager decoder's config and buffers."""
    return gaussian_parameters(features, points, decoder.cfg.representation_config,
                               decoder.points_offset_perturbation, decoder.base_offset_scale)


# ---------------------------------------------------------------- latent -> Gaussians through any two graphs

GraphFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]


@torch.no_grad()
def decode_latent(octree_graph: GraphFn, gaussian_graph: GraphFn, latent: torch.Tensor, facts: dict,
                  generator: torch.Generator | None) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The decode upstream's `OctreeGaussianDecoder.decode` does, through two graphs called with named inputs
    (an eager module or a saved bundle): the octree descent (fixed query count `facts["points"]`, host-side
    sinusoids when `facts["host_sinusoids"]`), then the Gaussian decoder on the sampled points, then the
    assembly. `facts`: the bundles' decoder.json (decoding.decoder_facts).
    -> (Gaussians, features [1,N,480], sampled points [1,N,3])."""
    latent = latent.float()
    host = bool(facts["host_sinusoids"])

    def octree_inputs(points, level):
        if host:
            return {"points": points, "point_sinusoid": point_sinusoid(points, int(facts["octree_channels"])),
                    "level_sinusoid": level_sinusoid(level), "latent": latent}
        return {"points": points, "level": level, "latent": latent}

    queries = int(facts["points"])
    sampled = sample_points(fixed_queries(lambda p, l: octree_graph(octree_inputs(p, l)), queries), 1, queries,
                            levels=int(facts.get("levels", MAX_LEVEL)), generator=generator)
    points = sampled["points"]
    inputs = {"points": points, "latent": latent}
    if host:
        inputs = {"points": points, "point_sinusoid": point_sinusoid(points, int(facts["gaussian_channels"])),
                  "latent": latent}
    features = gaussian_graph(inputs)
    rep = RepresentationConfig(**facts["representation"])
    gaussians = gaussian_parameters(features[0], points[0], rep, torch.tensor(facts["points_offset_perturbation"]),
                                    facts["base_offset_scale"])
    return gaussians, features, points
