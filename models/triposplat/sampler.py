"""TripoSplat's host-side rectified-flow sampler: Euler steps with classifier-free guidance over the DiT.

Repeats upstream's `FlowEulerCfgSampler.sample` + `sample_latent` (triposplat.py, commit a78fa12) op for op, in
torch on the host, so that with the eager DiT plugged in the final latent is bitwise upstream's
(tests/test_triposplat.py against models/triposplat/golden/dit/sampler.safetensors):
- schedule t_k = shift·s / (1 + (shift − 1)·s), s = linspace(1, 0, steps + 1) in float64 (numpy);
- the DiT sees 1000·t as float32 (here through the host sinusoid `timestep_frequencies`);
- CFG: v = g·v_cond − (g − 1)·v_uncond for g > 1, the unconditional branch with zeroed conditioning;
- x ← x − v·(t_k − t_{k+1}) for the latent and the camera token alike;
- noise: latent [1, N, 16] then camera [1, 1, 5] from one seeded torch.Generator (upstream's draw order).

The DiT is any callable (latent, camera, t_freq, feature1, feature2) -> (latent velocity, camera velocity), torch
in and out: the eager port, or a saved bundle's session (`bundle_dit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from models.triposplat.dit import timestep_frequencies

DiT = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def schedule(steps: int, shift: float) -> np.ndarray:
    """Upstream's shifted time grid from 1 to 0 (float64), steps + 1 points."""
    s = np.linspace(1, 0, steps + 1)
    return shift * s / (1 + (shift - 1) * s)


def initial_noise(tokens: int, channels: int, camera_channels: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(int(seed))
    latent = torch.randn(1, tokens, channels, generator=generator)
    camera = torch.randn(1, 1, camera_channels, generator=generator)
    return {"latent": latent, "camera": camera}


@dataclass
class StepRecord:
    """One sampler step as the DiT saw it (teacher-forcing inputs) and what it answered, per CFG branch."""

    latent: torch.Tensor            # x_t
    camera: torch.Tensor
    timestep: torch.Tensor          # 1000·t, float32 [1]
    cond: tuple[torch.Tensor, torch.Tensor]      # (latent, camera) velocity, conditional branch
    uncond: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class Run:
    noise: dict[str, torch.Tensor]
    conditioning: dict[str, torch.Tensor]
    final: dict[str, torch.Tensor]
    steps: list[StepRecord] = field(default_factory=list)


def dit_inputs(latent, camera, timestep, conditioning: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The graph's named inputs for one DiT call (models/triposplat/dit.py INPUT_NAMES order)."""
    return {"latent": latent, "camera": camera, "t_freq": timestep_frequencies(timestep),
            "feature1": conditioning["feature1"], "feature2": conditioning["feature2"]}


@torch.no_grad()
def sample(dit: DiT, noise: dict[str, torch.Tensor], conditioning: dict[str, torch.Tensor], steps: int,
           shift: float, guidance_scale: float, record: bool = False) -> Run:
    """Upstream's Euler-CFG loop. `conditioning`: {feature1, feature2}; the unconditional branch zeroes both."""
    unconditional = {k: torch.zeros_like(v) for k, v in conditioning.items()}
    sample_state = {k: v.clone() for k, v in noise.items()}
    run = Run(noise=noise, conditioning=conditioning, final=sample_state)
    grid = schedule(steps, shift)
    for t, t_next in zip(grid[:-1], grid[1:]):
        x_t = {k: v.clone() for k, v in sample_state.items()}
        timestep = torch.tensor([1000 * t], dtype=torch.float32)
        cond = dit(**dit_inputs(x_t["latent"], x_t["camera"], timestep, conditioning))
        velocity = dict(zip(("latent", "camera"), cond))
        uncond = None
        if guidance_scale is not None and guidance_scale > 1:
            uncond = dit(**dit_inputs(x_t["latent"], x_t["camera"], timestep, unconditional))
            velocity = {key: guidance_scale * velocity[key] - (guidance_scale - 1) * u
                        for key, u in zip(("latent", "camera"), uncond)}
        if record:
            run.steps.append(StepRecord(x_t["latent"], x_t["camera"], timestep, tuple(cond),
                                        tuple(uncond) if uncond is not None else None))
        dt = t - t_next
        for key in sample_state:
            sample_state[key] = sample_state[key] - velocity[key] * dt
    run.final = sample_state
    return run


def eager_dit(module: torch.nn.Module) -> DiT:
    def call(**inputs):
        return module(*(inputs[name] for name in ("latent", "camera", "t_freq", "feature1", "feature2")))
    return call


def session_dit(session) -> DiT:
    """A saved DiT bundle's session as the sampler's callable (numpy across the runtime boundary)."""
    def call(**inputs):
        out = session.run({k: v.numpy().astype(np.float32) for k, v in inputs.items()})
        return torch.from_numpy(np.asarray(out["latent_velocity"])), torch.from_numpy(np.asarray(out["camera_velocity"]))
    return call
