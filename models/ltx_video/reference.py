"""The upstream side: diffusers' LTX-Video classes on our checkpoint, its `LTXPipeline`, and step capture.

Everything here runs offline: the tokenizer is a T5 Unigram tokenizer built in code from a small vocabulary
(`tiny_tokenizer`), the scheduler is diffusers' FlowMatchEulerDiscreteScheduler from a config dict.
`capture_run` runs the eager pipeline once and records the transformer's exact keyword inputs and output at
every sampler step (the pipeline calls it with keywords only, so a pre-hook needs `with_kwargs=True`), the
latents the VAE decodes, and the frames: the per-step gate feeds those to the converted DiT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from zoo.weights import load_strict

# LTX-Video's scheduler/config.json values that matter (Lightricks/LTX-Video, diffusers layout).
SCHEDULER_CONFIG = {"base_image_seq_len": 1024, "base_shift": 0.95, "max_image_seq_len": 4096, "max_shift": 2.05,
                    "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": 0.1, "use_dynamic_shifting": True,
                    "time_shift_type": "exponential"}
TINY_WORDS = ("a cat dog bird fish red blue green white black small big runs jumps walks swims in on under over the "
              "snow rain sun grass water city forest sky night day river and with slowly quickly").split()


def tiny_tokenizer():
    """A T5 (Unigram) tokenizer from a 70-piece vocabulary: whole words, then letters (no download)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("▁" + w, -1.0 - i / 100) for i, w in enumerate(TINY_WORDS)]
    pieces += [("▁", -5.0)] + [(c, -6.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def split(state_dict: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def diffusers_transformer(config: dict, state_dict: dict):
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel.from_config(config)
    return load_strict(model, state_dict).float().eval()


def diffusers_vae(config: dict, state_dict: dict):
    """AutoencoderKLLTXVideo with every key loaded (encoder too: the pipeline's VAE is the whole VAE)."""
    from diffusers import AutoencoderKLLTXVideo

    model = AutoencoderKLLTXVideo.from_config(config)
    buffers = {k: v for k, v in model.state_dict().items() if k in ("latents_mean", "latents_std")}
    return load_strict(model, {**buffers, **state_dict}).float().eval()


def hf_text_encoder(config: dict, state_dict: dict):
    from transformers import T5Config, T5EncoderModel

    model = T5EncoderModel(T5Config(**config))
    return load_strict(model, state_dict, {"encoder.embed_tokens.weight": "shared.weight"}).float().eval()


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler.from_config(SCHEDULER_CONFIG)


def ltx_pipeline(parts: dict, tokenizer):
    """diffusers LTXPipeline from {text_encoder, transformer, vae} configs + state dicts (prefix-split)."""
    from diffusers import LTXPipeline

    pipe = LTXPipeline(scheduler=scheduler(), vae=diffusers_vae(*parts["vae"]),
                       text_encoder=hf_text_encoder(*parts["text_encoder"]), tokenizer=tokenizer,
                       transformer=diffusers_transformer(*parts["transformer"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@dataclass
class Run:
    """One eager pipeline run: per step the transformer's keyword inputs and output, then the decode."""

    steps: list[dict] = field(default_factory=list)       # {hidden_states, encoder_hidden_states, timestep, ...}
    outputs: list[torch.Tensor] = field(default_factory=list)
    decoder_input: torch.Tensor | None = None               # [1, C, F, H, W], what vae.decoder got
    decoder_timestep: torch.Tensor | None = None            # its timestep (0.9.1+ decoders), else None
    decoder_output: torch.Tensor | None = None
    frames: torch.Tensor | None = None                      # [F, H, W, 3] in [0, 1]


TENSOR_KWARGS = ("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask")


def capture_run(pipe, request: dict, seed: int) -> Run:
    """Run the pipeline with hooks on the transformer and the VAE decoder; hooks removed afterwards."""
    run = Run()

    def before_dit(_module, _args, kwargs):
        run.steps.append({k: kwargs[k].detach().clone() for k in TENSOR_KWARGS})
        run.steps[-1]["grid"] = (kwargs["num_frames"], kwargs["height"], kwargs["width"],
                                 tuple(float(s) for s in kwargs["rope_interpolation_scale"]))

    def after_dit(_module, _args, _kwargs, output):
        run.outputs.append(output[0].detach().clone())

    def before_decoder(_module, args, kwargs):
        run.decoder_input = args[0].detach().clone()
        temb = args[1] if len(args) > 1 else kwargs.get("temb")
        run.decoder_timestep = None if temb is None else temb.detach().clone()

    def after_decoder(_module, _args, output):
        run.decoder_output = output.detach().clone()

    handles = [pipe.transformer.register_forward_pre_hook(before_dit, with_kwargs=True),
               pipe.transformer.register_forward_hook(after_dit, with_kwargs=True),
               pipe.vae.decoder.register_forward_pre_hook(before_decoder, with_kwargs=True),
               pipe.vae.decoder.register_forward_hook(after_decoder)]
    try:
        with torch.no_grad():
            video = pipe(**request, generator=torch.Generator().manual_seed(int(seed)), output_type="pt",
                         return_dict=False)[0]
    finally:
        for handle in handles:
            handle.remove()
    run.frames = video[0].permute(0, 2, 3, 1).float()
    return run
