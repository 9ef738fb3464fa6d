"""LTX-Video at real size (`zoo real-size ltx-video`, zoo/real_size.py does the work): the 28-layer 2B DiT and
the real 0.9.0 / 0.9.1 VAE decoders on both targets, seeded random weights of the real architectures, and
real-width numerics per block — one full DiT step on the Core AI CPU runtime takes ~50 min here (models.md), so
one DiT layer at the real token count and CFG batch, and each decoder at full channel width on a small latent.
"""

from __future__ import annotations

from zoo.registry import RealSize, RealSizeBuild

REAL_VIDEO = {"frames": 65, "height": 512, "width": 704, "frame_rate": 25}   # 9 x 16 x 22 = 3168 latent tokens
PROMPT_TOKENS = 128
GPU_CHUNK = 256   # DiT query chunk: the real 3168-token score tensor exceeds the GPU's 128 MiB buffers (models.md)
DIT_LAYERS = 28
BLOCK_LATENT = (2, 4, 4)   # latent frames, height, width for the decoder block check (full channel width)

# (component, variant, target, precision): what ships. Core AI DiT fp32 would peak ~18.6 GB even with the
# release (models.md), too close to 24 GB next to anything else; LiteRT has no bf16.
ROWS = [
    ("dit", "0.9.0", "coreai", "bf16"), ("dit", "0.9.0", "coreai", "fp16"),
    ("dit", "0.9.0", "litert", "fp32"),
    ("vae-decoder", "0.9.0", "coreai", "fp32"), ("vae-decoder", "0.9.0", "coreai", "fp16"),
    ("vae-decoder", "0.9.0", "litert", "fp32"), ("vae-decoder", "0.9.0", "litert", "fp16"),
    ("vae-decoder", "0.9.1", "coreai", "fp16"), ("vae-decoder", "0.9.1", "litert", "fp32"),
    # last: litert-quantizer holds the whole 7.7 GB fp32 flatbuffer and its fp16 copy in memory
    ("dit", "0.9.0", "litert", "fp16"),
]
# Per-block numerics, fp32 on both targets: one DiT layer; each decoder at full width on BLOCK_LATENT.
CHECKS = [(component, variant, target, 1) for component, variant in
          [("dit", "0.9.0"), ("vae-decoder", "0.9.0"), ("vae-decoder", "0.9.1")] for target in ("coreai", "litert")]


def architecture_configs(cfg) -> dict:
    """diffusers' full config dicts for the variant's DiT and VAE, built on the meta device (no weights)."""
    import torch
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from omegaconf import OmegaConf

    arch = OmegaConf.to_container(cfg.variants[cfg.variant].architecture, resolve=True)
    with torch.device("meta"):
        return {"transformer": dict(LTXVideoTransformer3DModel(**arch["transformer"]).config),
                "vae": dict(AutoencoderKLLTXVideo(**arch["vae"]).config)}


def build(cfg, component: str, layers: int | None, check: bool, seed: int = 0) -> RealSizeBuild:
    """The DiT (all layers, or the first `layers`) at the real token count, or a real decoder (on the real
    latent, or at full width on BLOCK_LATENT when `layers` is set), seeded random weights."""
    import torch

    import models.ltx_video as ltx
    from models.ltx_video.dit import DiTConfig, LTXDiT, timestep_projection
    from models.ltx_video.vae import DecoderConfig, RankFourDecoder
    from zoo.weights import Checkpoint

    configs = architecture_configs(cfg)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if component == "dit":
        dit_cfg = DiTConfig.from_diffusers(configs["transformer"])
        if layers:
            dit_cfg = DiTConfig(**{**dit_cfg.__dict__, "num_layers": layers})
        grid = ltx.video_grid(Checkpoint("random", {"vae": configs["vae"]}, {}, {}), cfg)
        module = LTXDiT(dit_cfg, grid, int(cfg.attention_chunk)).eval()
        tokens = grid.frames * grid.height * grid.width
        inputs = {"hidden_states": torch.randn(2, tokens, dit_cfg.in_channels, generator=generator),
                  "encoder_hidden_states": torch.randn(2, PROMPT_TOKENS, dit_cfg.caption_channels, generator=generator),
                  "encoder_attention_mask": torch.ones(2, PROMPT_TOKENS),
                  "timestep_projection": timestep_projection(torch.tensor([500.0, 500.0]))}
        what = f"{layers or DIT_LAYERS} of {DIT_LAYERS} layers, {tokens} tokens, CFG batch 2"
        return RealSizeBuild(module, inputs, ["noise_pred"], what=what)
    dec_cfg = DecoderConfig.from_diffusers(configs["vae"])
    module = RankFourDecoder(dec_cfg).eval()
    tc, sc = ltx.compression(configs["vae"])
    if layers:   # the per-block check: full channel width on a small latent
        frames, height, width = BLOCK_LATENT
    else:
        frames = (cfg.video.frames - 1) // tc + 1
        height, width = cfg.video.height // sc, cfg.video.width // sc
    inputs = {"latents": torch.randn(frames, dec_cfg.latent_channels, height, width, generator=generator)}
    if dec_cfg.timestep_conditioning:
        inputs["timestep"] = torch.tensor([0.05])
    planes = ltx.noise_planes(module, height, width, seed)
    inputs.update({n: p for n, p in zip(module.input_names()[len(inputs):], planes)})
    return RealSizeBuild(module, inputs, ["video"], what=f"full width, latent {'x'.join(map(str, (frames, height, width)))}")


INTRO = """The 28-layer DiT and the real 0.9.0 / 0.9.1 decoders converted on this 24 GB machine by
`make real-size MODEL=ltx-video` (zoo/real_size.py, each row in a fresh process). What makes the 2B DiT fit: on Core AI the torch
weights and the exported program are released before conversion and save; on LiteRT litert-torch's lightweight
(lazy-constant) conversion (`litert.lightweight_conversion`, on for this model: with the default path's constant
folding the real decoder's conversion had not finished when stopped; its row below is the lightweight time). LiteRT
fp16 comes from litert-quantizer on the fp32 flatbuffer, which holds both copies in memory: the peak of that row. Numerics at real size are checked per block (second table)."""

REAL_SIZE = RealSize(
    rows=ROWS, checks=CHECKS, build=build, full_layers=DIT_LAYERS, intro=INTRO,
    overrides=[f"model.video.{key}={value}" for key, value in REAL_VIDEO.items()] + [f"model.attention_chunk={GPU_CHUNK}"],
    conditions=(f"video {REAL_VIDEO['frames']}x{REAL_VIDEO['height']}x{REAL_VIDEO['width']} -> 3168 DiT tokens; "
                f"DiT query chunk {GPU_CHUNK}"),
)
