"""TripoSplat at real size (`zoo real-size triposplat`, zoo/real_size.py does the work): all six networks at their
real architectures and input sizes, on both targets, seeded random weights (upstream's weights are not reachable
here) —
- the 370.5 M DiT over 12,294 tokens, the real octree (50.8 M) and Gaussian (237.3 M) decoders over 8192 queries;
- the image encoders at the 1024² canvas that 4101 conditioning tokens imply: DINOv3 ViT-H+/16 and the FLUX.2
  VAE encoder;
- the background remover (BiRefNet, Swin-L at 1024² and 512²), with the gather form of its deformable
  convolutions on both targets: the tent form's buffers do not fit at this size (scripts/deform_conv_lowering.py).

Numerics: one full-size LiteRT call per network where one call takes minutes, per block elsewhere — one real-size
DiT call on the Core AI CPU runtime took 34 min here (models.md: ≈ 121 + 80·N CPU-s for N blocks), so Core AI
checks the DiT with its refiners and 1 of the 24 blocks at the real token count, each decoder with 1 block at full
width over the real 8192 queries, DINOv3 with 1 of its 32 layers over 4101 tokens, the VAE encoder with 1 ResNet
layer per down block at 1024², and BiRefNet with 1 of the 18 blocks of its third Swin stage at 1024².
"""

from __future__ import annotations

import torch

from zoo.registry import RealSize, RealSizeBuild

CHUNK = 2048        # query chunk, DiT and decoders: without it Core AI exceeded 19 GB (killed) and LiteRT needed
                    # 14.8 GB for the DiT (models.md); LiteRT GPU creation would need 256 (not checked here)
QUERIES = 8192      # decoder tokens / octree queries: 262,144 Gaussians / 32
COND_TOKENS = 4101  # cls + 4 registers + 64x64 DINOv3 patches
OCTREE_LEVEL = 7.0  # the octree decoder's last level (the most parents)

VARIANT = "real"
COMPONENTS = ("dit", "octree-decoder", "gaussian-decoder", "image-encoder", "vae-encoder", "background-remover")
# Core AI fp32 and fp16 (its default), LiteRT fp32 and fp16. LiteRT fp16 last per component: litert-quantizer
# holds the fp32 flatbuffer and its fp16 copy in memory.
ROWS = [(component, VARIANT, target, precision) for component in COMPONENTS
        for target, precision in (("coreai", "fp32"), ("coreai", "fp16"), ("litert", "fp32"), ("litert", "fp16"))]
CHECKS = [("dit", VARIANT, "litert", None),                 # the one full-size verification call
          ("dit", VARIANT, "coreai", 1),
          ("octree-decoder", VARIANT, "coreai", 1), ("octree-decoder", VARIANT, "litert", 1),
          ("gaussian-decoder", VARIANT, "coreai", 1), ("gaussian-decoder", VARIANT, "litert", 1),
          ("image-encoder", VARIANT, "litert", None), ("image-encoder", VARIANT, "coreai", 1),
          ("vae-encoder", VARIANT, "litert", None), ("vae-encoder", VARIANT, "coreai", 1),
          ("background-remover", VARIANT, "litert", None), ("background-remover", VARIANT, "coreai", 1)]

# The LiteRT GPU delegate at real size (software Vulkan here): its buffers cap at 128 MiB, so GPU creation needs query
# chunk 256 (chunk 2048's DiT score buffer is 512 MiB: rejected, models.md). One block / layer of each transformer at
# the real token and query counts; the convolutional networks' 1024² activations (VAE: 128 channels · 1024² · 4 B =
# 512 MiB per tensor) are past that cap whatever the chunk.
GPU_CHUNK = 256          # the DiT's query chunk
GPU_DECODER_CHUNK = 128  # the decoders' cross-attention scores at 256 queries: 16 heads x 256 x 8192 keys x 4 B = 128 MiB
# The DiT's block is not among them yet: at 12,294 tokens one software-Vulkan check of it runs for well over the
# decoders' 7 min, and both decoder blocks already fail to run there (README "Not done yet").
GPU_CHECKS = [("octree-decoder", VARIANT, 1), ("gaussian-decoder", VARIANT, 1), ("image-encoder", VARIANT, 1)]


def dit_build(cfg, layers: int | None, check: bool, seed: int) -> RealSizeBuild:
    """The DiT (all blocks, or the refiners and the first `layers` blocks) on seeded stand-in conditioning at the
    real token counts. A check's eager reference has upstream's Sobol positions (`model.sobol_seed` set to
    anything else is the check's negative control, as for the per-step gate)."""
    import models.triposplat as tripo
    from models.triposplat import sampler as flow
    from models.triposplat.dit import OUTPUT_NAMES, SOBOL_SEED, DiTConfig, LatentSeqMMFlowModel

    dit_cfg = DiTConfig.from_dict(tripo.architecture(cfg, "dit"))
    total = dit_cfg.num_blocks
    if layers:
        dit_cfg = DiTConfig.from_dict({**tripo.architecture(cfg, "dit"), "num_blocks": layers})
    torch.manual_seed(seed)
    module = LatentSeqMMFlowModel(dit_cfg, int(cfg.attention_chunk), int(cfg.sobol_seed)).eval()
    reference = None
    if check:
        reference = LatentSeqMMFlowModel(dit_cfg, int(cfg.attention_chunk), SOBOL_SEED).eval()
        reference.load_state_dict(module.state_dict())
    noise = flow.initial_noise(dit_cfg.q_token_length, dit_cfg.in_channels, dit_cfg.cam_channels, seed)
    conditioning = tripo.seeded_conditioning(dit_cfg, int(cfg.cond_tokens), seed)
    inputs = flow.dit_inputs(noise["latent"], noise["camera"], torch.tensor([500.0]), conditioning)
    tokens = dit_cfg.q_token_length + int(cfg.cond_tokens) + 1
    what = (f"refiners + {layers or total} of {total} blocks, {tokens:,} tokens "
            f"({dit_cfg.q_token_length} latent + {int(cfg.cond_tokens)} condition + 1 camera)")
    return RealSizeBuild(module, inputs, list(OUTPUT_NAMES), reference=reference, what=what)


def decoder_build(cfg, component: str, layers: int | None, seed: int) -> RealSizeBuild:
    """A decoder (all blocks, or the first `layers`) over `decoders.points` queries on a seeded latent and seeded
    points in the unit cube, as the zoo builds it (host sinusoids, query chunk)."""
    from models.triposplat.decoders import (GaussianDecoderConfig, OctreeDecoderConfig, gaussian_decoder,
                                            octree_decoder)
    from models.triposplat.decoding import GAUSSIAN_OUTPUTS, OCTREE_OUTPUTS, gate_latent
    from models.triposplat import architecture

    arch = architecture(cfg, "decoder")
    octree = component == "octree-decoder"
    part = dict(arch["octree" if octree else "gs"])
    total = int(part.get("num_blocks", 0))
    if layers:
        part["num_blocks"] = layers
    host, chunk = bool(cfg.decoders.host_sinusoids), int(cfg.decoders.attention_chunk)
    torch.manual_seed(seed)
    module = (octree_decoder(OctreeDecoderConfig.from_dict(part), host, chunk) if octree
              else gaussian_decoder(GaussianDecoderConfig.from_dict(part), host, chunk)).eval()
    if str(cfg.decoders.latent) != "seeded":   # the eager DiT sampler's latent would be hours of real-size DiT calls
        raise ValueError("real size runs the decoders on a seeded latent (model.decoders.latent=seeded)")
    latent = gate_latent(None, cfg)
    queries = int(cfg.decoders.points)
    points = torch.rand(1, queries, 3, generator=torch.Generator().manual_seed(seed + 3))
    args = (module.host_inputs(points, torch.tensor([OCTREE_LEVEL]), latent) if octree
            else module.host_inputs(points, latent))
    inputs = dict(zip(module.input_names(), args))
    what = f"{layers or total} of {total} blocks, {queries} queries, latent {latent.shape[1]} tokens"
    return RealSizeBuild(module, inputs, list(OCTREE_OUTPUTS if octree else GAUSSIAN_OUTPUTS), what=what)


def seeded_image(size: int, seed: int) -> torch.Tensor:
    """An RGB image in [0, 1] at the network's input size (the networks see no alpha)."""
    return torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 5))


def image_encoder_build(cfg, layers: int | None, seed: int) -> RealSizeBuild:
    """DINOv3 (all 32 layers, or the first `layers`) on a seeded 1024² image, query-chunked attention."""
    from models.triposplat import architecture
    from models.triposplat import encoders as enc

    arch = dict(architecture(cfg, "image_encoder"))
    total = int(arch["num_hidden_layers"])
    dino = enc.DinoConfig.from_dict({**arch, "num_hidden_layers": layers or total})
    size = enc.image_size_for(int(cfg.cond_tokens), dino.patch_size)
    module = enc.ImageEncoder(dino, size, int(cfg.encoders.attention_chunk))
    module.load_state_dict(enc.seeded_dino_state(dino, seed), strict=True)
    tokens = (size // dino.patch_size) ** 2 + enc.PREFIX_TOKENS
    what = f"{layers or total} of {total} layers, {size}² image, {tokens:,} tokens"
    return RealSizeBuild(module.eval(), {"image": seeded_image(size, seed)}, ["feature1"], what=what)


def vae_encoder_build(cfg, layers: int | None, seed: int) -> RealSizeBuild:
    """The FLUX.2 VAE encoder (2 ResNet layers per down block, or `layers`) on a seeded 1024² image and posterior
    noise, query-chunked mid attention (one head over 16,384 tokens at 1024²)."""
    from models.triposplat import architecture
    from models.triposplat import encoders as enc

    arch = dict(architecture(cfg, "vae_encoder"))
    total = int(arch["layers_per_block"])
    vae = enc.VaeConfig.from_dict({**arch, "layers_per_block": layers or total})
    size = enc.image_size_for(int(cfg.cond_tokens), int(architecture(cfg, "image_encoder")["patch_size"]))
    module = enc.VaeEncoder(vae, int(cfg.encoders.attention_chunk))
    module.load_state_dict(enc.seeded_vae_state(vae, seed), strict=True)
    noise = torch.randn(enc.vae_noise_shape(vae, size), generator=torch.Generator().manual_seed(seed + 7))
    what = f"{layers or total} of {total} ResNet layers per down block, {size}² image"
    return RealSizeBuild(module.eval(), {"image": seeded_image(size, seed), "noise": noise}, ["feature2"], what=what)


def background_build(cfg, layers: int | None, seed: int) -> RealSizeBuild:
    """BiRefNet (Swin-L at 1024² and 512²; the third stage's 18 blocks, or the first `layers`) on a seeded 1024²
    image, with the gather form of the deformable convolutions on both targets (the tent form's buffers do not fit
    at this size: scripts/deform_conv_lowering.py)."""
    from models.triposplat import architecture
    from models.triposplat import background as bg

    arch = dict(architecture(cfg, "background_remover"))
    depths = [int(d) for d in arch["depths"]]
    total = depths[2]
    net = bg.BiRefNetConfig.from_dict({**arch, "depths": [*depths[:2], layers or total, *depths[3:]]})
    module = bg.BiRefNet(net, "gather")
    module.load_state_dict(bg.seeded_state(net, seed), strict=True)
    what = (f"{layers or total} of {total} third-stage Swin blocks (depths {list(net.depths)}), "
            f"{net.image_size}² image")
    return RealSizeBuild(module.eval(), {"image": seeded_image(net.image_size, seed)}, ["alpha"], what=what)


def build(cfg, component: str, layers: int | None, check: bool, seed: int = 0) -> RealSizeBuild:
    if component == "dit":
        return dit_build(cfg, layers, check, seed)
    if component == "image-encoder":
        return image_encoder_build(cfg, layers, seed)
    if component == "vae-encoder":
        return vae_encoder_build(cfg, layers, seed)
    if component == "background-remover":
        return background_build(cfg, layers, seed)
    return decoder_build(cfg, component, layers, seed)


INTRO = """All six networks at their real architectures and input sizes, converted on this 24 GB machine by
`make real-size MODEL=triposplat` (zoo/real_size.py, each row in a fresh process; time and peak RSS are that
process's): the 24-block DiT over 12,294 tokens, both decoders over 8192 queries, DINOv3 ViT-H+/16 and the FLUX.2 VAE
encoder on the 1024² canvas that 4101 conditioning tokens imply, and BiRefNet (Swin-L at 1024² and 512²). What makes
them fit: query-chunked attention (chunk 2048, `model.attention_chunk` / `model.decoders.attention_chunk` /
`model.encoders.attention_chunk`; without it Core AI exceeded 19 GB and LiteRT needed 14.8 GB for the DiT, models.md);
on Core AI the torch weights and the exported program are released before conversion and save; on LiteRT a network
above the configured weight size converts lazily (litert-torch's lightweight conversion). LiteRT fp16 comes from
litert-quantizer on the fp32 flatbuffer. BiRefNet uses the gather form of its deformable convolutions on both targets
here: the tent form's buffers do not fit at 1024² ("Background removal").

Numerics (second table): one full-size LiteRT call per network compared with eager, where one takes minutes; per
block on Core AI (the DiT's refiners + 1 of its 24 blocks, 1 block of each decoder, 1 of DINOv3's 32 layers, 1 ResNet
layer per VAE down block, 1 of BiRefNet's 18 third-stage blocks), since the Core AI CPU runtime took 34 min for one
full real-size DiT call here (models.md). The third table is the LiteRT GPU-delegate check at real size (software
Vulkan), one block or layer per network: the delegate's buffers cap at 128 MiB, so those graphs are converted with
query chunk 256 for DINOv3 and 128 for the decoders (`make real-size` does it; chunk 2048's DiT score buffer is
512 MiB and was rejected, models.md)."""

REAL_SIZE = RealSize(
    rows=ROWS, checks=CHECKS, build=build, full_layers=24, intro=INTRO, gpu_checks=GPU_CHECKS,
    gpu_overrides=[f"model.attention_chunk={GPU_CHUNK}", f"model.decoders.attention_chunk={GPU_DECODER_CHUNK}",
                   f"model.encoders.attention_chunk={GPU_CHUNK}", "model.gpu.timeout_s=3600"],
    overrides=[f"model.attention_chunk={CHUNK}", f"model.cond_tokens={COND_TOKENS}",
               f"model.decoders.points={QUERIES}", f"model.decoders.attention_chunk={CHUNK}",
               "model.decoders.latent=seeded", f"model.encoders.attention_chunk={CHUNK}"],
    conditions=(f"DiT 12,294 tokens (8192 latent + {COND_TOKENS} condition + 1 camera), decoders {QUERIES} queries "
                f"(262,144 Gaussians / 32), encoders and background remover at 1024²; query chunk {CHUNK}"),
)
