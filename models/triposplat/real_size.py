"""TripoSplat at real size (`zoo real-size triposplat`, zoo/real_size.py does the work): the 370.5 M DiT over
12,294 tokens and the real octree (50.8 M) and Gaussian (237.3 M) decoders over 8192 queries, on both targets,
seeded random weights of the real architectures (upstream's weights are not reachable here).

Numerics: one full-size LiteRT DiT call (135 s measured here, models.md), and per block elsewhere — one real-size
DiT call on the Core AI CPU runtime took 34 min here (models.md: ≈ 121 + 80·N CPU-s for N blocks), so Core AI
checks the DiT with its refiners and 1 of the 24 blocks at the real token count, and each decoder with 1 block at
full width over the real 8192 queries.
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
COMPONENTS = ("dit", "octree-decoder", "gaussian-decoder")
# Core AI fp32 and fp16 (its default), LiteRT fp32 and fp16. LiteRT fp16 last per component: litert-quantizer
# holds the fp32 flatbuffer and its fp16 copy in memory.
ROWS = [(component, VARIANT, target, precision) for component in COMPONENTS
        for target, precision in (("coreai", "fp32"), ("coreai", "fp16"), ("litert", "fp32"), ("litert", "fp16"))]
CHECKS = [("dit", VARIANT, "litert", None),                 # the one full-size verification call
          ("dit", VARIANT, "coreai", 1),
          ("octree-decoder", VARIANT, "coreai", 1), ("octree-decoder", VARIANT, "litert", 1),
          ("gaussian-decoder", VARIANT, "coreai", 1), ("gaussian-decoder", VARIANT, "litert", 1)]


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


def build(cfg, component: str, layers: int | None, check: bool, seed: int = 0) -> RealSizeBuild:
    if component == "dit":
        return dit_build(cfg, layers, check, seed)
    return decoder_build(cfg, component, layers, seed)


INTRO = """The 24-block DiT and both real decoders converted on this 24 GB machine by `make real-size MODEL=triposplat`
(zoo/real_size.py, each row in a fresh process; time and peak RSS are that process's). What makes them fit: query-chunked
attention (chunk 2048, `model.attention_chunk` / `model.decoders.attention_chunk`; without it Core AI exceeded 19 GB
and LiteRT needed 14.8 GB for the DiT, models.md); on Core AI the torch weights and the exported program are released
before conversion and save. LiteRT fp16 comes from litert-quantizer on the fp32 flatbuffer. Numerics (second table): one
full-size LiteRT DiT call compared with eager; the rest per block at the real token and query counts (the DiT's
refiners + 1 of its 24 blocks, 1 block of each decoder), since the Core AI CPU runtime took 34 min for one full
real-size DiT call here (models.md). Not run at real size: the LiteRT GPU check (GPU creation needs chunk 256)."""

REAL_SIZE = RealSize(
    rows=ROWS, checks=CHECKS, build=build, full_layers=24, intro=INTRO,
    overrides=[f"model.attention_chunk={CHUNK}", f"model.cond_tokens={COND_TOKENS}",
               f"model.decoders.points={QUERIES}", f"model.decoders.attention_chunk={CHUNK}",
               "model.decoders.latent=seeded"],
    conditions=(f"DiT 12,294 tokens (8192 latent + {COND_TOKENS} condition + 1 camera), decoders {QUERIES} queries "
                f"(262,144 Gaussians / 32); query chunk {CHUNK}"),
)
