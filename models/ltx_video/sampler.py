"""The host-side LTX-Video sampler: text -> frames through three networks, each a plain callable.

`sample` repeats diffusers' LTXPipeline step for step (tokenize, T5, classifier-free guidance, seeded packed
latents, FlowMatchEulerDiscreteScheduler with the sequence-length shift, unpack, de-normalise, optional decode
noise, decode, [-1, 1] -> [0, 1]); tests hold it to the eager pipeline's frames with the eager networks plugged
in. `run_bundles` plugs in the three saved bundles (`zoo generate ltx-video --bundles DIR`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from zoo.errors import ZooError

Network = Callable[[dict[str, np.ndarray]], np.ndarray]


@dataclass
class Networks:
    encode: Network    # {input_ids, attention_mask} int32 [1, L] -> last_hidden_state [1, L, D]
    denoise: Network   # DiT graph inputs (models/ltx_video/__init__.dit_graph_inputs) -> noise_pred [B, S, C]
    decode: Network    # {latents [F, C, h, w], (timestep [1]), noise_i} -> video [F', 3, H, W] in [-1, 1]


def calculate_shift(seq_len: int, scheduler: dict) -> float:
    """LTXPipeline's mu: linear in the latent sequence length between (base_len, base_shift) and (max_len, max_shift)."""
    base_len, max_len = scheduler.get("base_image_seq_len", 256), scheduler.get("max_image_seq_len", 4096)
    base, top = scheduler.get("base_shift", 0.5), scheduler.get("max_shift", 1.15)
    slope = (top - base) / (max_len - base_len)
    return seq_len * slope + base - slope * base_len


def encode_prompts(networks: Networks, tokenizer, request: dict) -> tuple[np.ndarray, np.ndarray]:
    """[negative; prompt] embeddings and masks (CFG batch order). LTXPipeline never passes the mask to T5, so
    the encoder sees an all-ones mask; the DiT gets the real one."""
    from models.ltx_video import tokenize

    embeds, masks = [], []
    for text in (request["negative_prompt"], request["prompt"]):
        tokens = tokenize(tokenizer, text, request["max_sequence_length"])
        ones = np.ones_like(tokens["attention_mask"].numpy())
        embeds.append(networks.encode({"input_ids": tokens["input_ids"].numpy(), "attention_mask": ones}))
        masks.append(tokens["attention_mask"].numpy())
    return np.concatenate(embeds), np.concatenate(masks)


def sample(networks: Networks, tokenizer, sampler: dict, decoder: dict, prompt: str | None = None,
           seed: int | None = None, noise_planes: list[np.ndarray] | None = None) -> np.ndarray:
    """Frames [F, H, W, 3] in [0, 1]. `sampler` / `decoder`: the dit and vae-decoder bundles' sampler.json and
    decoder.json. Guidance is on when guidance_scale > 1, as in the pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from models.ltx_video.dit import timestep_projection

    request = dict(sampler["request"], **({"prompt": prompt} if prompt is not None else {}))
    grid, channels = sampler["grid"], sampler["in_channels"]
    generator = torch.Generator().manual_seed(int(sampler["seed"] if seed is None else seed))
    embeds, masks = encode_prompts(networks, tokenizer, request)
    guided = request["guidance_scale"] > 1.0
    if not guided:
        embeds, masks = embeds[1:], masks[1:]
    latents = torch.randn((1, channels, grid["frames"], grid["height"], grid["width"]), generator=generator)
    latents = latents.permute(0, 2, 3, 4, 1).reshape(1, -1, channels)          # pack (patch size 1)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(sampler["scheduler"])
    steps = request["num_inference_steps"]
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps),
                            mu=calculate_shift(latents.shape[1], sampler["scheduler"]))
    for t in scheduler.timesteps:
        batch = torch.cat([latents] * 2) if guided else latents
        timestep = t.expand(batch.shape[0])
        noise_pred = torch.from_numpy(np.asarray(networks.denoise({
            "hidden_states": batch.numpy(), "encoder_hidden_states": embeds, "encoder_attention_mask": masks.astype(np.float32),
            "timestep_projection": timestep_projection(timestep).numpy()}))).float()
        if guided:
            uncond, text = noise_pred.chunk(2)
            noise_pred = uncond + request["guidance_scale"] * (text - uncond)
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
    video = latents.reshape(1, grid["frames"], grid["height"], grid["width"], channels).permute(0, 4, 1, 2, 3)
    mean = torch.tensor(decoder["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(decoder["latents_std"]).view(1, -1, 1, 1, 1)
    video = video * std / decoder["scaling_factor"] + mean
    inputs = {}
    if decoder["timestep_conditioning"]:
        noise = torch.randn(video.shape, generator=generator)
        scale = request["decode_noise_scale"]
        video = (1 - scale) * video + scale * noise
        inputs["timestep"] = np.array([request["decode_timestep"]], dtype=np.float32)
    inputs = {"latents": video[0].permute(1, 0, 2, 3).contiguous().numpy(), **inputs}
    names = [n for n in decoder["input_names"] if n.startswith("noise_")]
    planes = noise_planes if noise_planes is not None else [
        torch.randn(shape, generator=generator).numpy() for shape in decoder.get("noise_shapes", [])]
    inputs.update(dict(zip(names, planes)))
    frames = np.asarray(networks.decode(inputs))                               # [F, 3, H, W] in [-1, 1]
    return np.clip(frames / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)


# ---------------------------------------------------------------- the saved bundles


def read_json(folder: Path, name: str) -> dict:
    path = Path(folder) / name
    if not path.is_file():
        raise ZooError(f"{folder} has no {name}.", "re-convert it: `make convert MODEL=ltx-video` writes it into the bundle.")
    return json.loads(path.read_text())


def bundle_networks(sessions: dict) -> Networks:
    return Networks(encode=lambda x: sessions["text-encoder"].run(x)["last_hidden_state"],
                    denoise=lambda x: sessions["dit"].run(x)["noise_pred"],
                    decode=lambda x: sessions["vae-decoder"].run(x)["video"])


def save_frames(frames: np.ndarray, out: Path, scale: int = 1) -> None:
    """[F, H, W, 3] in [0, 1] -> an animated GIF (8 fps) or, for .png, one strip of frames side by side."""
    from PIL import Image

    images = [Image.fromarray((f * 255).round().astype(np.uint8)) for f in frames]
    if scale > 1:
        images = [im.resize((im.width * scale, im.height * scale), Image.NEAREST) for im in images]
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".png":
        strip = Image.new("RGB", (sum(im.width for im in images), images[0].height))
        for i, im in enumerate(images):
            strip.paste(im, (i * im.width, 0))
        strip.save(out)
    else:
        images[0].save(out, save_all=True, append_images=images[1:], duration=125, loop=0)


def run_bundles(sessions: dict, bundles: dict[str, Path], prompt: str, out: Path, seed: int | None = None) -> str:
    """ModelSpec.run_pipeline: the three bundles' sessions, text -> frames -> `out` (.gif or .png strip)."""
    from transformers import AutoTokenizer

    from models.ltx_video import DECODER_FILE, SAMPLER_FILE, TOKENIZER_DIR

    if Path(out).suffix.lower() not in (".gif", ".png"):
        raise ZooError(f"Cannot write {out}: LTX-Video frames are written as .gif (animated) or .png (a strip).",
                       "pass --out clip.gif or --out frames.png.")
    tokenizer_dir = Path(bundles["text-encoder"]) / TOKENIZER_DIR
    if not (tokenizer_dir / "tokenizer_config.json").is_file():
        raise ZooError(f"No tokenizer in {bundles['text-encoder']}.", "re-convert the text-encoder bundle.")
    frames = sample(bundle_networks(sessions), AutoTokenizer.from_pretrained(tokenizer_dir),
                    read_json(bundles["dit"], SAMPLER_FILE), read_json(bundles["vae-decoder"], DECODER_FILE),
                    prompt, seed)
    save_frames(frames, Path(out), scale=4 if frames.shape[1] < 128 else 1)
    return f"{frames.shape[0]} frames of {frames.shape[2]}x{frames.shape[1]} written to {out}"
