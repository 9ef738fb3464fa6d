"""`zoo generate triposplat --bundles DIR --image cutout.png --out splats.ply`: the saved bundles chained on the host.

An image without alpha -> the background-remover bundle's matte (upstream's BiRefNet step; optional: without that
bundle only RGBA cut-outs are taken) -> RGBA cut-out -> upstream's crop / resize / composite on black
(models/triposplat/image_input.py) -> image-encoder
bundle (feature1) and vae-encoder bundle (feature2, with the posterior noise upstream's seeded generator draws
first) -> the DiT bundle under the host Euler-CFG sampler (models/triposplat/sampler.py; its latent and camera noise
from the same generator, next, as upstream) -> octree descent through the octree-decoder bundle -> Gaussian-decoder
bundle -> assembly -> the standard 3DGS .ply (models/triposplat/ply.py). Every network runs from a saved artifact;
`chain` is the same loop over eager modules (the tests' and the README's reference).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from models.triposplat import background as bg
from models.triposplat import encoders as enc
from models.triposplat import image_input, octree, ply
from models.triposplat import sampler as flow
from models.triposplat.decoding import DECODER_FILE
from zoo.errors import ZooError

Graph = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def read_json(bundle: Path, name: str) -> dict:
    path = Path(bundle) / name
    if not path.is_file():
        raise ZooError(f"{bundle} has no {name}.", "re-convert that component with `zoo convert model=triposplat`.")
    return json.loads(path.read_text())


def session_graph(session, output: str) -> Graph:
    """A bundle's session as a graph called with named torch inputs (numpy across the runtime boundary)."""
    def call(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out = session.run({k: v.numpy().astype(np.float32) for k, v in inputs.items()})
        return torch.from_numpy(np.asarray(out[output]))
    return call


@dataclass
class Chain:
    """The five networks as callables (saved bundles or eager modules) and the facts that drive them."""

    image_encoder: Graph        # {image} -> feature1
    vae_encoder: Graph          # {image, noise} -> feature2
    dit: flow.DiT
    octree_decoder: Graph
    gaussian_decoder: Graph
    sampling: dict              # the dit bundle's sampler.json
    decoding: dict              # the decoder bundles' decoder.json
    vae_noise_shape: tuple
    matte: Callable | None = None   # RGB PIL image -> uint8 alpha (the background remover); None: cut-outs only


def matte_from(graph: Graph, size: int) -> Callable:
    """upstream's remove_background around a background-remover graph: resize to its input, run, the matte back at
    the image's size as uint8 (models/triposplat/background.py)."""
    def matte(rgb) -> np.ndarray:
        alpha = graph({"image": bg.resize_for_matting(image_input.to_tensor(rgb), size)})
        return bg.alpha_to_image_size(alpha, rgb.height, rgb.width)
    return matte


@torch.no_grad()
def chain(c: Chain, image: torch.Tensor, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """image [1, 3, S, S] -> (Gaussians, conditioning): upstream's TripoSplatPipeline.run after preprocessing."""
    s = c.sampling
    vae_noise, noise = enc.pipeline_noise(seed, tuple(c.vae_noise_shape), int(s["latent_tokens"]),
                                          int(s["latent_channels"]), int(s["camera_channels"]))
    conditioning = {"feature1": c.image_encoder({"image": image}).float(),
                    "feature2": c.vae_encoder({"image": image, "noise": vae_noise}).float()}
    expected = {"feature1": [1, int(s["cond_tokens"]), int(s["cond_channels"])],
                "feature2": [1, int(s["cond_tokens"]), int(s["cond2_channels"])]}
    for name, shape in expected.items():
        if list(conditioning[name].shape) != shape:
            raise ZooError(f"The encoder bundles give {name} {list(conditioning[name].shape)} but the DiT bundle takes "
                           f"{shape}.", "convert the encoders and the DiT from the same checkpoint and model.cond_tokens.")
    run = flow.sample(c.dit, noise, conditioning, int(s["steps"]), float(s["shift"]), float(s["guidance_scale"]))
    gaussians, _, _ = octree.decode_latent(c.octree_decoder, c.gaussian_decoder, run.final["latent"], c.decoding,
                                           torch.Generator().manual_seed(int(seed)))
    return gaussians, conditioning


def run_bundles(sessions: dict, bundles: dict[str, Path], prompt: str | None, out: Path, seed: int | None = None,
                image: Path | None = None) -> str:
    """ModelSpec.run_pipeline: cut-out -> encoders -> DiT sampler -> decoders -> `out` (.ply)."""

    if Path(out).suffix.lower() != ".ply":
        raise ZooError(f"Cannot write {out}: TripoSplat writes 3D Gaussian Splatting .ply files.", "pass --out splats.ply.")
    if image is None:
        raise ZooError("The triposplat pipeline needs --image.", "pass --image cutout.png (an RGBA cut-out).")
    c, image_size = bundle_chain(sessions, bundles)
    picture = image_input.open_image(Path(image))
    cut = "" if image_input.has_real_alpha(picture) else ", cut out by the background-remover bundle"
    pixels = image_input.prepare(picture, image_size, f"--image {image}", c.matte)   # bad input: ZooError first
    seed = int(c.sampling["seed"] if seed is None else seed)
    gaussians, _ = chain(c, pixels, seed)
    count = ply.write_ply(out, gaussians)
    return (f"{count} Gaussians ({c.decoding['points']} points x {c.decoding['representation']['num_gaussians']}) "
            f"written to {out} from {image} ({image_size}² composite{cut}) after {c.sampling['steps']} "
            f"sampler steps (seed {seed}).")


def bundle_chain(sessions: dict, bundles: dict[str, Path]) -> tuple[Chain, int]:
    """The chain over the five saved bundles' sessions, and the image size its encoders take; bundles converted
    with different settings are refused before any run."""
    from models.triposplat import ENCODER_FILE, SAMPLER_FILE

    sampling = read_json(bundles["dit"], SAMPLER_FILE)
    decoding_facts = read_json(bundles["gaussian-decoder"], DECODER_FILE)
    octree_facts = read_json(bundles["octree-decoder"], DECODER_FILE)
    image_facts = read_json(bundles["image-encoder"], ENCODER_FILE)
    vae_facts = read_json(bundles["vae-encoder"], ENCODER_FILE)
    if octree_facts["points"] != decoding_facts["points"]:
        raise ZooError(f"The octree bundle takes {octree_facts['points']} queries but the Gaussian bundle "
                       f"{decoding_facts['points']} points.", "convert both decoders with the same model.decoders.points.")
    if image_facts["image_size"] != vae_facts["image_size"]:
        raise ZooError(f"The image-encoder bundle takes {image_facts['image_size']}² images but the vae-encoder "
                       f"bundle {vae_facts['image_size']}².", "convert both encoders with the same model.cond_tokens.")
    matte = None
    if "background-remover" in sessions:   # optional (Component.optional): only images without alpha need it
        from models.triposplat import BACKGROUND_FILE

        matting_size = int(read_json(bundles["background-remover"], BACKGROUND_FILE)["image_size"])
        matte = matte_from(session_graph(sessions["background-remover"], "alpha"), matting_size)
    c = Chain(session_graph(sessions["image-encoder"], "feature1"), session_graph(sessions["vae-encoder"], "feature2"),
              flow.session_dit(sessions["dit"]), session_graph(sessions["octree-decoder"], "logits"),
              session_graph(sessions["gaussian-decoder"], "features"), sampling, decoding_facts,
              tuple(vae_facts["vae_noise_shape"]), matte)
    return c, int(image_facts["image_size"])


def eager_chain(checkpoint, cfg) -> Chain:
    """The same chain over the eager references (library encoders, the port's DiT, decoders and background remover
    in fp32; the last only when the checkpoint has that part)."""
    import models.triposplat as tripo
    from models.triposplat import decoding

    image_ref, vae_ref = tripo.image_encoder_reference(checkpoint, cfg), tripo.vae_encoder_reference(checkpoint, cfg)
    oct_model, gs_model = decoding.octree_reference(checkpoint, cfg), decoding.gaussian_reference(checkpoint, cfg)
    dit_cfg = tripo.dit_config(checkpoint, cfg)
    sampling = {**tripo.sampler_request(cfg), "latent_tokens": dit_cfg.q_token_length,
                "latent_channels": dit_cfg.in_channels, "camera_channels": dit_cfg.cam_channels,
                "cond_channels": dit_cfg.cond_channels, "cond2_channels": dit_cfg.cond2_channels}
    size = tripo.encoder_image_size(checkpoint, cfg)
    matte = None
    if any(k.startswith(tripo.BACKGROUND_PART + ".") for k in checkpoint.state_dict):
        remover = tripo.background_reference(checkpoint, cfg)
        matte = matte_from(lambda kw: remover(kw["image"]), tripo.background_config(checkpoint, cfg).image_size)
    return Chain(lambda kw: image_ref(kw["image"]), lambda kw: vae_ref(kw["image"], kw["noise"]),
                 flow.eager_dit(tripo.dit_reference(checkpoint, cfg)), lambda kw: oct_model(**kw),
                 lambda kw: gs_model(**kw), sampling, decoding.decoder_facts(checkpoint, cfg),
                 enc.vae_noise_shape(tripo.vae_config(checkpoint, cfg), size), matte)
