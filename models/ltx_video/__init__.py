"""LTX-Video (Lightricks text-to-video, 0.9.x 2B family): declarations only; the pipeline does the work.

Three components, one checkpoint laid out as the Hub lays out a diffusers pipeline (model_index.json,
text_encoder/, transformer/, vae/, tokenizer/), loaded through zoo.weights' pipeline-folder path:
- `text-encoder`: the T5 v1.1 encoder port of models/t5, reused as is (bf16 on Core AI by default);
- `dit`: models/ltx_video/dit.py, gated per sampler step on the eager `LTXPipeline`'s captured inputs;
- `vae-decoder`: models/ltx_video/vae.py (rank 4), gated on the latents that pipeline decoded.
The host-side sampler that drives the three saved bundles is models/ltx_video/sampler.py (`zoo generate`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

import models.t5 as t5
from models.ltx_video import reference as upstream
from models.ltx_video.dit import DiTConfig, LTXDiT, VideoGrid, timestep_projection
from models.ltx_video.real_size import REAL_SIZE
from models.ltx_video.vae import DecoderConfig, RankFourDecoder
from zoo import gates
from zoo.errors import ZooError
from zoo.registry import Component, ModelSpec
from zoo.schema import ModelConfig
from zoo.weights import Checkpoint, load_strict

TINY_DIR = Path(__file__).parent / "tiny"
TOKENIZER_DIR = "tokenizer"
SAMPLER_FILE = "sampler.json"    # in the dit bundle: what the host-side sampler needs
DECODER_FILE = "decoder.json"    # in the vae-decoder bundle: latent statistics, decode timestep and noise


# ---------------------------------------------------------------- checkpoint parts


def part(checkpoint: Checkpoint, name: str) -> Checkpoint:
    """One part of the pipeline checkpoint (config and un-prefixed state dict), same provenance."""
    if name not in checkpoint.config:
        raise ZooError(f"The checkpoint has no '{name}' part (found: {', '.join(sorted(checkpoint.config))}).",
                       "point WEIGHTS at an LTX-Video pipeline folder (model_index.json, text_encoder/, transformer/, "
                       "vae/, tokenizer/), as the Hub lays it out.")
    return Checkpoint(checkpoint.source, dict(checkpoint.config[name]), upstream.split(checkpoint.state_dict, name + "."),
                      checkpoint.provenance)


def load_tokenizer(checkpoint: Checkpoint):
    """The checkpoint's own tokenizer/ folder; seeded random weights use the tiny in-code tokenizer."""
    from transformers import AutoTokenizer

    folder = Path(checkpoint.provenance.get("path", "")) / TOKENIZER_DIR
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    if checkpoint.source == "random":
        return upstream.tiny_tokenizer()
    raise ZooError(f"No tokenizer at {folder}.", "the pipeline folder needs its tokenizer/ (as on the Hub).")


def compression(vae_config: dict) -> tuple[int, int]:
    """(temporal, spatial) compression of the VAE, as AutoencoderKLLTXVideo computes it."""
    scalings = sum(bool(s) for s in vae_config["spatio_temporal_scaling"])
    return vae_config.get("patch_size_t", 1) * 2 ** scalings, vae_config["patch_size"] * 2 ** scalings


def video_grid(checkpoint: Checkpoint, cfg) -> VideoGrid:
    """The latent token grid the DiT's RoPE is baked for, from the pixel video size in the config."""
    tc, sc = compression(checkpoint.config["vae"])
    v = cfg.video
    if (v.frames - 1) % tc or v.height % sc or v.width % sc:
        raise ZooError(f"video {v.frames}x{v.height}x{v.width} does not fit the VAE's compression ({tc} in time, "
                       f"{sc} in space).", f"use frames = {tc}k+1 and height/width multiples of {sc}.")
    return VideoGrid((v.frames - 1) // tc + 1, v.height // sc, v.width // sc, float(v.frame_rate), tc, sc)


def pipeline_request(cfg) -> dict:
    """The eager LTXPipeline call every gate is captured from (and the host sampler repeats)."""
    s, v = cfg.sampler, cfg.video
    return {"prompt": str(cfg.prompt), "negative_prompt": str(cfg.negative_prompt), "height": int(v.height),
            "width": int(v.width), "num_frames": int(v.frames), "frame_rate": float(v.frame_rate),
            "num_inference_steps": int(s.steps), "guidance_scale": float(s.guidance_scale),
            "decode_timestep": float(s.decode_timestep), "decode_noise_scale": float(s.decode_noise_scale),
            "max_sequence_length": int(cfg.seq_len)}


_RUNS: dict = {}


def eager_run(checkpoint: Checkpoint, cfg) -> upstream.Run:
    """The eager diffusers pipeline on this checkpoint, captured once per (checkpoint, request, seed)."""
    # keyed on what the weights are (provenance: file hashes, or variant + seed for random ones), never on an
    # object id that a later checkpoint could reuse
    key = (json.dumps(checkpoint.provenance, sort_keys=True, default=str), json.dumps(pipeline_request(cfg), sort_keys=True),
           int(cfg.seed))
    if key not in _RUNS:
        parts = {name: (checkpoint.config[name], upstream.split(checkpoint.state_dict, name + "."))
                 for name in ("text_encoder", "transformer", "vae")}
        pipe = upstream.ltx_pipeline(parts, load_tokenizer(checkpoint))
        _RUNS.clear()
        _RUNS[key] = upstream.capture_run(pipe, pipeline_request(cfg), int(cfg.seed))
    return _RUNS[key]


# ---------------------------------------------------------------- text encoder (the T5 port, reused)


def text_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    return t5.build(part(checkpoint, "text_encoder"), cfg)


def text_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    return t5.reference(part(checkpoint, "text_encoder"), cfg)


def tokenize(tokenizer, prompt: str, length: int) -> dict[str, torch.Tensor]:
    """As LTXPipeline tokenizes: padded to `length`, truncated, special tokens added; int32 at the boundary."""
    out = tokenizer([prompt], padding="max_length", max_length=length, truncation=True, add_special_tokens=True,
                    return_tensors="pt")
    return {"input_ids": out.input_ids.to(torch.int32), "attention_mask": out.attention_mask.to(torch.int32)}


def text_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    return tokenize(load_tokenizer(checkpoint), str(cfg.prompt), int(cfg.seq_len))


def text_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    load_tokenizer(checkpoint).save_pretrained(bundle_dir / TOKENIZER_DIR)


# ---------------------------------------------------------------- DiT


DIT_INPUTS = ("hidden_states", "encoder_hidden_states", "encoder_attention_mask", "timestep_projection")


def dit_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    p = part(checkpoint, "transformer")
    module = LTXDiT(DiTConfig.from_diffusers(p.config), video_grid(checkpoint, cfg), int(cfg.attention_chunk))
    return load_strict(module, p.state_dict).eval()


class ReferenceDiT(nn.Module):
    """diffusers LTXVideoTransformer3DModel called as our graph is. The timestep sinusoid arrives computed on the
    host, so the reference's own `time_proj` output is replaced by it (a forward hook); the host function itself
    equals diffusers' get_timestep_embedding bit for bit (tests), and the per-step gate feeds the pipeline's raw
    timesteps through it, so nothing escapes comparison."""

    def __init__(self, model, grid: VideoGrid):
        super().__init__()
        self.model, self.grid = model, grid
        self.projection = None
        model.time_embed.emb.time_proj.register_forward_hook(lambda _m, _a, _out: self.projection)

    def forward(self, hidden_states, encoder_hidden_states, encoder_attention_mask, timestep_projection):
        self.projection = timestep_projection
        g = self.grid
        out = self.model(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                         timestep=torch.zeros(hidden_states.shape[0]), encoder_attention_mask=encoder_attention_mask,
                         num_frames=g.frames, height=g.height, width=g.width,
                         rope_interpolation_scale=(g.temporal_compression / g.frame_rate, g.spatial_compression,
                                                   g.spatial_compression), return_dict=False)[0]
        return (out,)


def dit_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    p = part(checkpoint, "transformer")
    return ReferenceDiT(upstream.diffusers_transformer(p.config, p.state_dict), video_grid(checkpoint, cfg))


def dit_graph_inputs(step: dict) -> dict[str, torch.Tensor]:
    """The pipeline's keyword inputs of one step -> the graph's inputs (host sinusoid, float mask)."""
    return {"hidden_states": step["hidden_states"].float(), "encoder_hidden_states": step["encoder_hidden_states"].float(),
            "encoder_attention_mask": step["encoder_attention_mask"].float(),
            "timestep_projection": timestep_projection(step["timestep"])}


def dit_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The first sampler step's real inputs, captured from the eager pipeline."""
    return dit_graph_inputs(eager_run(checkpoint, cfg).steps[0])


def array_thresholds(thresholds: dict) -> dict:
    return {m: t for m, t in thresholds.items() if gates.METRICS[m].compares == "arrays"}


def dit_verify(ctx) -> tuple[list, dict]:
    """Every sampler step of the eager pipeline, fed to the saved DiT: `min_step_cosine` over all steps (each
    step's graph inputs are the pipeline's own, captured by a forward pre-hook), plus the array metrics on step 0."""
    run = eager_run(ctx.checkpoint, ctx.cfg)
    with ctx.session as session:
        candidates = [session.run({k: v.numpy() for k, v in dit_graph_inputs(step).items()})["noise_pred"]
                      for step in run.steps]
    references = [out.float().numpy() for out in run.outputs]
    results = gates.evaluate({"noise_pred": candidates[0]}, {"noise_pred": references[0]},
                             array_thresholds(ctx.thresholds))
    step_thresholds = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "sampler steps"}
    for metric, threshold in step_thresholds.items():
        value = gates.measure(metric, candidates, references)
        results.append(gates.GateResult("noise_pred (every step)", metric, value, float(threshold),
                                        gates.check_value(metric, value, threshold)))
    per_step = [gates.cosine(c, r) for c, r in zip(candidates, references)]
    details = {"outputs": [{"name": "noise_pred", "shape": list(candidates[0].shape), "dtype": str(candidates[0].dtype)}],
               "sampler_steps": {"count": len(per_step), "cosine": per_step,
                                 "timesteps": [float(s["timestep"].reshape(-1)[0]) for s in run.steps]}}
    return results, details


def dit_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    """What the host-side sampler needs besides the graph: scheduler, guidance, grid, text length."""
    grid = video_grid(checkpoint, cfg)
    sampler = {"scheduler": upstream.SCHEDULER_CONFIG, "request": pipeline_request(cfg), "seed": int(cfg.seed),
               "grid": grid.__dict__, "in_channels": int(checkpoint.config["transformer"]["in_channels"])}
    (bundle_dir / SAMPLER_FILE).write_text(json.dumps(sampler, indent=2) + "\n")


# ---------------------------------------------------------------- VAE decoder


def decoder_config(checkpoint: Checkpoint) -> DecoderConfig:
    return DecoderConfig.from_diffusers(checkpoint.config["vae"])


def decoder_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    module = RankFourDecoder(decoder_config(checkpoint))
    keys = {k: v for k, v in part(checkpoint, "vae").state_dict.items() if k.startswith("decoder.")}
    return load_strict(module, keys).eval()


@contextlib.contextmanager
def randn_from(planes: list[torch.Tensor]):
    """Upstream draws its noise planes with `torch.randn(shape)` inside the decoder; the graph takes them as
    inputs. To compare on the same noise, hand upstream's draws the graph's planes, in draw order."""
    original, queue = torch.randn, list(planes)

    def planned(*args, **kwargs):
        return queue.pop(0)[0, 0].to(kwargs.get("dtype") or torch.float32)

    torch.randn = planned
    try:
        yield
    finally:
        torch.randn = original


class ReferenceDecoder(nn.Module):
    """diffusers `vae.decoder` on the same inputs: [F, C, h, w] -> [1, C, F, h, w] in, [1, 3, F', H, W] -> [F', 3, H, W] out."""

    def __init__(self, decoder, timestep_conditioning: bool):
        super().__init__()
        self.decoder, self.timestep_conditioning = decoder, timestep_conditioning

    def forward(self, latents, *rest):
        temb = rest[0] if self.timestep_conditioning else None
        planes = list(rest[1:] if self.timestep_conditioning else rest)
        with randn_from(planes):
            video = self.decoder(latents.permute(1, 0, 2, 3)[None], temb)
        return (video[0].permute(1, 0, 2, 3),)


def decoder_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    p = part(checkpoint, "vae")
    vae = upstream.diffusers_vae(p.config, p.state_dict)
    return ReferenceDecoder(vae.decoder, bool(p.config.get("timestep_conditioning", False)))


def noise_planes(module: RankFourDecoder, height: int, width: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in module.noise_shapes(height, width)]


def decoder_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The latents (and decode timestep) the eager pipeline handed its VAE decoder; seeded noise planes."""
    run = eager_run(checkpoint, cfg)
    latents = run.decoder_input[0].permute(1, 0, 2, 3).contiguous()
    module = RankFourDecoder(decoder_config(checkpoint))
    inputs = {"latents": latents}
    if module.cfg.timestep_conditioning:
        inputs["timestep"] = run.decoder_timestep.reshape(1).float()
    planes = noise_planes(module, latents.shape[2], latents.shape[3], int(cfg.seed))
    inputs.update({name: plane for name, plane in zip(module.input_names()[len(inputs):], planes)})
    return inputs


def decoder_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    vae, grid = checkpoint.config["vae"], video_grid(checkpoint, cfg)
    state = part(checkpoint, "vae").state_dict
    facts = {"latents_mean": state["latents_mean"].tolist(), "latents_std": state["latents_std"].tolist(),
             "scaling_factor": float(vae.get("scaling_factor", 1.0)),
             "timestep_conditioning": bool(vae.get("timestep_conditioning", False)),
             "input_names": RankFourDecoder(decoder_config(checkpoint)).input_names(),
             "noise_shapes": RankFourDecoder(decoder_config(checkpoint)).noise_shapes(grid.height, grid.width)}
    (bundle_dir / DECODER_FILE).write_text(json.dumps(facts, indent=2) + "\n")


def eager_networks(checkpoint: Checkpoint, cfg, port: bool = False):
    """The three networks in eager torch for the host sampler: upstream's (port=False) or this folder's ports."""
    from models.ltx_video.sampler import Networks

    def call(module, names):
        def run(inputs):
            with torch.no_grad():
                out = module(*(torch.from_numpy(np.asarray(inputs[n])) for n in names))
            return (out[0] if isinstance(out, tuple) else out).numpy()
        return run

    encoder = (text_build if port else text_reference)(checkpoint, cfg)
    dit = (dit_build if port else dit_reference)(checkpoint, cfg)
    decoder = (decoder_build if port else decoder_reference)(checkpoint, cfg)
    decoder_names = RankFourDecoder(decoder_config(checkpoint)).input_names()
    return Networks(call(encoder, ["input_ids", "attention_mask"]), call(dit, list(DIT_INPUTS)), call(decoder, decoder_names))


def bundle_facts(checkpoint: Checkpoint, cfg) -> tuple[dict, dict]:
    """(sampler.json, decoder.json) as the dit and vae-decoder bundles would carry them."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        dit_extra_files(checkpoint, cfg, Path(folder))
        decoder_extra_files(checkpoint, cfg, Path(folder))
        return (json.loads((Path(folder) / SAMPLER_FILE).read_text()),
                json.loads((Path(folder) / DECODER_FILE).read_text()))


# ---------------------------------------------------------------- weights


def tiny_diffusers_parts(cfg) -> dict[str, nn.Module]:
    """The tiny DiT and VAE with diffusers' own seeded initialisation (scripts/make_tiny_checkpoints.py)."""
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel

    arch = OmegaConf.to_container(cfg.variants["tiny"].architecture, resolve=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.seed))
        transformer = LTXVideoTransformer3DModel(**arch["transformer"])
        vae = AutoencoderKLLTXVideo(**arch["vae"])
    return {"transformer": transformer, "vae": vae}


def random_checkpoint(cfg) -> tuple[dict, dict[str, torch.Tensor]]:
    """The variant's DiT and VAE with diffusers' seeded init, and a seeded T5 of the variant's text encoder."""
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    arch = OmegaConf.to_container(cfg.variants[cfg.variant].architecture, resolve=True)
    config, state = {}, {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.seed))
        parts = {"text_encoder": T5EncoderModel(T5Config(**arch["text_encoder"], feed_forward_proj="gated-gelu",
                                                         dropout_rate=0.0, tie_word_embeddings=False)),
                 "transformer": LTXVideoTransformer3DModel(**arch["transformer"]),
                 "vae": AutoencoderKLLTXVideo(**arch["vae"])}
    for name, module in parts.items():
        config[name] = module.config.to_dict() if hasattr(module.config, "to_dict") else dict(module.config)
        state.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
    return config, state


# ---------------------------------------------------------------- config


@dataclass
class VideoSection:
    frames: int = 9          # pixel frames (temporal compression k + 1)
    height: int = 32
    width: int = 32
    frame_rate: float = 25.0


@dataclass
class SamplerSection:
    steps: int = 8
    guidance_scale: float = 3.0
    decode_timestep: float = 0.05
    decode_noise_scale: float = 0.025


@dataclass
class LTXModelConfig(ModelConfig):
    """config.yaml keys only LTX-Video has."""

    seq_len: int = 128                         # T5 prompt length (LTX-Video encodes at 128)
    prompt: str = "a red cat runs in the snow"
    negative_prompt: str = ""
    video: VideoSection = field(default_factory=VideoSection)
    sampler: SamplerSection = field(default_factory=SamplerSection)
    attention_chunk: int = 0                   # DiT query chunk (0: none); for GPU buffer limits


def run_pipeline(*args, **kwargs):
    from models.ltx_video.sampler import run_bundles

    return run_bundles(*args, **kwargs)


SPEC = ModelSpec(
    name="ltx-video",
    summary="LTX-Video 0.9.x text-to-video: T5 text encoder, 2B DiT, rank-4 VAE decoder",
    components=[
        Component(name="text-encoder", build=text_build, reference=text_reference,
                  example_inputs=text_example_inputs, output_names=["last_hidden_state"],
                  extra_files=text_extra_files),
        Component(name="dit", build=dit_build, reference=dit_reference, example_inputs=dit_example_inputs,
                  output_names=["noise_pred"], verify=dit_verify, extra_files=dit_extra_files),
        Component(name="vae-decoder", build=decoder_build, reference=decoder_reference,
                  example_inputs=decoder_example_inputs, output_names=["video"], extra_files=decoder_extra_files),
    ],
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    config_schema=LTXModelConfig,
    pipeline_tag="text-to-video",
    license="other",          # LTX-Video weights: Lightricks' own licence per checkpoint (code Apache-2.0)
    run_pipeline=run_pipeline,
    real_size=REAL_SIZE,
)
