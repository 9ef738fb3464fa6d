"""`zoo generate triposplat --bundles DIR --out splats.ply`: the three saved bundles chained on the host.

DiT bundle under the host Euler-CFG sampler (models/triposplat/sampler.py, its facts from the bundle's
sampler.json) -> final latent -> octree descent through the octree-decoder bundle -> Gaussian-decoder bundle ->
assembly -> the standard 3DGS .ply (models/triposplat/ply.py). Everything after the conditioning runs from the
saved artifacts.

Conditioning, plainly: the image encoders (DINOv3, the FLUX.2 VAE encoder, background removal) are not
components yet, so this takes no image. The DiT is conditioned on the seeded stand-ins its gates use
(`seeded_conditioning`: upstream's shapes and statistics), and the output is what those stand-ins decode to.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from models.triposplat import octree, ply
from models.triposplat import sampler as flow
from models.triposplat.decoding import DECODER_FILE
from zoo.errors import ZooError


def read_json(bundle: Path, name: str) -> dict:
    path = Path(bundle) / name
    if not path.is_file():
        raise ZooError(f"{bundle} has no {name}.", "re-convert that component with `zoo convert model=triposplat`.")
    return json.loads(path.read_text())


def session_graph(session, output: str):
    """A bundle's session as a graph called with named torch inputs (numpy across the runtime boundary)."""
    def call(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out = session.run({k: v.numpy().astype(np.float32) for k, v in inputs.items()})
        return torch.from_numpy(np.asarray(out[output]))
    return call


def run_bundles(sessions: dict, bundles: dict[str, Path], prompt: str | None, out: Path, seed: int | None = None) -> str:
    """ModelSpec.run_pipeline: seeded conditioning -> DiT sampler -> decoders -> `out` (.ply)."""
    from models.triposplat import SAMPLER_FILE, seeded_conditioning

    if Path(out).suffix.lower() != ".ply":
        raise ZooError(f"Cannot write {out}: TripoSplat writes 3D Gaussian Splatting .ply files.", "pass --out splats.ply.")
    sampling = read_json(bundles["dit"], SAMPLER_FILE)
    decoding_facts = read_json(bundles["gaussian-decoder"], DECODER_FILE)
    octree_facts = read_json(bundles["octree-decoder"], DECODER_FILE)
    if octree_facts["points"] != decoding_facts["points"]:
        raise ZooError(f"The octree bundle takes {octree_facts['points']} queries but the Gaussian bundle "
                       f"{decoding_facts['points']} points.", "convert both decoders with the same model.decoders.points.")
    seed = int(sampling["seed"] if seed is None else seed)
    channels = SimpleNamespace(cond_channels=sampling["cond_channels"], cond2_channels=sampling["cond2_channels"])
    conditioning = seeded_conditioning(channels, int(sampling["cond_tokens"]), seed)
    noise = flow.initial_noise(int(sampling["latent_tokens"]), int(sampling["latent_channels"]),
                               int(sampling["camera_channels"]), seed)
    run = flow.sample(flow.session_dit(sessions["dit"]), noise, conditioning, int(sampling["steps"]),
                      float(sampling["shift"]), float(sampling["guidance_scale"]))
    gaussians, _, _ = octree.decode_latent(session_graph(sessions["octree-decoder"], "logits"),
                                           session_graph(sessions["gaussian-decoder"], "features"),
                                           run.final["latent"], decoding_facts, torch.Generator().manual_seed(seed))
    count = ply.write_ply(out, gaussians)
    return (f"{count} Gaussians ({decoding_facts['points']} points x {decoding_facts['representation']['num_gaussians']}) "
            f"written to {out} after {sampling['steps']} sampler steps (seed {seed}). Conditioning: seeded stand-ins — "
            "the image encoders are not components yet, so no image was used.")
