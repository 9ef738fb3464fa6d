"""TripoSplat (VAST-AI, one image -> 3D Gaussian splats): declarations only; the pipeline does the work.

Components (in sampler order):
- `dit`: the rectified-flow DiT (models/triposplat/dit.py), gated per sampler step with teacher forcing on
  the eager host sampler's captured inputs (models/triposplat/sampler.py), plus a free-running final latent;
- the octree and Gaussian decoders are appended to COMPONENTS by models/triposplat/decoders.py (see the marked
  place below).

Weights: one checkpoint holds every part, laid out as a pipeline folder (model_index.json, one folder per part
with config.json + weights; keys prefixed `<part>.` once loaded): `dit/` (upstream LatentSeqMMFlowModel keys, as in
triposplat_fp16.safetensors) and `decoder/` (upstream OctreeGaussianDecoder keys). `weights=tiny` is the
upstream-made golden checkpoint in models/triposplat/tiny (scripts/make_triposplat_goldens.py).

Conditioning: the DiT takes upstream's conditioning tensors (DINOv3 features `feature1`, FLUX.2 VAE latent
`feature2`) as graph inputs; the `image-encoder` and `vae-encoder` components make them from an RGBA cut-out
(models/triposplat/encoders.py, checkpoint parts `image_encoder` and `vae_encoder`), and `zoo generate` chains
all five bundles. The optional `background-remover` (upstream's BiRefNet, models/triposplat/background.py, part
`background_remover`) cuts a photo without alpha out first when its bundle is in the folder. The DiT's own gates keep seeded stand-ins of the right shapes and statistics
(`seeded_conditioning`): its teacher-forced steps need no encoder run, and its gate figures stay comparable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from models.triposplat import background as bg
from models.triposplat import decoding
from models.triposplat import encoders as enc
from models.triposplat import image_input
from models.triposplat import sampler as flow
from models.triposplat.real_size import REAL_SIZE
from models.triposplat.dit import INPUT_NAMES, OUTPUT_NAMES, SOBOL_SEED, DiTConfig, LatentSeqMMFlowModel
from zoo import gates
from zoo.errors import ZooError
from zoo.registry import Component, ModelSpec
from zoo.schema import ModelConfig
from zoo.weights import Checkpoint, load_strict

PACKAGE_DIR = Path(__file__).parent
TINY_DIR = PACKAGE_DIR / "tiny"
GOLDEN_DIR = PACKAGE_DIR / "golden"
SAMPLER_FILE = "sampler.json"      # in the dit bundle: what the host-side sampler needs
DINO_REGISTER_TOKENS = 5           # feature2 (VAE latent) is zero-padded by cls + 4 registers to feature1's length


# ---------------------------------------------------------------- checkpoint parts


def part(checkpoint: Checkpoint, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, un-prefixed state dict) of one part of the checkpoint."""
    prefix = name + "."
    state = {k[len(prefix):]: v for k, v in checkpoint.state_dict.items() if k.startswith(prefix)}
    if not state:
        raise ZooError(f"The checkpoint has no '{name}' weights (keys '{prefix}*').",
                       f"point WEIGHTS at a TripoSplat checkpoint folder with a {name}/ part (see models/triposplat/README.md).")
    return dict(checkpoint.config.get(name) or {}), state


def architecture(cfg, name: str) -> dict:
    arch = cfg.variants[cfg.variant].architecture
    return OmegaConf.to_container(arch[name], resolve=True)


def dit_config(checkpoint: Checkpoint, cfg) -> DiTConfig:
    """The checkpoint's own dit/config.json; upstream's real files carry none, so the variant's architecture."""
    config = dict(checkpoint.config.get("dit") or {}) or architecture(cfg, "dit")
    return DiTConfig.from_dict(config)


# ---------------------------------------------------------------- conditioning stand-ins and the eager run


def seeded_conditioning(dit_cfg: DiTConfig, tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """Stand-ins for the image encoders' outputs with upstream's shapes and statistics: feature1 is layer-normed
    DINOv3 features (so unit-variance per token), feature2 the VAE latent behind DINO_REGISTER_TOKENS zero tokens."""
    generator = torch.Generator().manual_seed(int(seed) + 1)   # not the sampler noise's stream
    feature1 = torch.randn(1, tokens, dit_cfg.cond_channels, generator=generator)
    feature1 = F.layer_norm(feature1, feature1.shape[-1:])
    feature2 = torch.randn(1, tokens, dit_cfg.cond2_channels, generator=generator)
    feature2[:, :min(DINO_REGISTER_TOKENS, tokens)] = 0
    return {"feature1": feature1, "feature2": feature2}


def sampler_request(cfg) -> dict:
    s = cfg.sampler
    return {"steps": int(s.steps), "shift": float(s.shift), "guidance_scale": float(s.guidance_scale),
            "seed": int(cfg.seed), "cond_tokens": int(cfg.cond_tokens)}


_RUNS: dict = {}


def eager_run(checkpoint: Checkpoint, cfg) -> flow.Run:
    """The host sampler over the eager DiT (upstream's numerics: tests hold it to upstream's goldens), every step
    recorded; once per (weights, request)."""
    key = (json.dumps(checkpoint.provenance, sort_keys=True, default=str), json.dumps(sampler_request(cfg), sort_keys=True))
    if key not in _RUNS:
        dit_cfg = dit_config(checkpoint, cfg)
        module = dit_reference(checkpoint, cfg)
        noise = flow.initial_noise(dit_cfg.q_token_length, dit_cfg.in_channels, dit_cfg.cam_channels, int(cfg.seed))
        conditioning = seeded_conditioning(dit_cfg, int(cfg.cond_tokens), int(cfg.seed))
        s = cfg.sampler
        _RUNS.clear()
        _RUNS[key] = flow.sample(flow.eager_dit(module), noise, conditioning, int(s.steps), float(s.shift),
                                 float(s.guidance_scale), record=True)
    return _RUNS[key]


# ---------------------------------------------------------------- DiT


def dit_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    _, state = part(checkpoint, "dit")
    module = LatentSeqMMFlowModel(dit_config(checkpoint, cfg), int(cfg.attention_chunk), int(cfg.sobol_seed))
    return load_strict(module, state).eval()


def dit_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    """The port in eager fp32 with upstream's Sobol seed and no query chunking. Its parity with upstream's own
    LatentSeqMMFlowModel is proven on the golden fixtures (tests/test_triposplat.py); upstream cannot be imported
    here (it needs torchvision)."""
    _, state = part(checkpoint, "dit")
    return load_strict(LatentSeqMMFlowModel(dit_config(checkpoint, cfg), 0, SOBOL_SEED), state).eval()


def step_inputs(step: flow.StepRecord, conditioning: dict[str, torch.Tensor], branch: str) -> dict[str, torch.Tensor]:
    if branch == "uncond":
        conditioning = {k: torch.zeros_like(v) for k, v in conditioning.items()}
    return flow.dit_inputs(step.latent, step.camera, step.timestep, conditioning)


def dit_example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The first sampler step's conditional call, as the eager run made it."""
    run = eager_run(checkpoint, cfg)
    return step_inputs(run.steps[0], run.conditioning, "cond")


def gate_steps(cfg, target: str, count: int) -> list[int]:
    """Every step on LiteRT; the configured subset on Core AI (its CPU runtime is slow at real size)."""
    subset = (cfg.per_step_gate.steps or {}).get(target)
    if subset is None:
        return list(range(count))
    outside = [int(i) for i in subset if not -count <= int(i) < count]
    if outside or not subset:
        raise ZooError(f"per_step_gate.steps.{target} = {list(subset)}: the sampler runs {count} steps, so a step is "
                       f"an index in [{-count}, {count - 1}] and at least one is needed.",
                       f"fix model.per_step_gate.steps.{target} (null gates every step).")
    return sorted({int(i) % count for i in subset})


def dit_verify(ctx) -> tuple[list, dict]:
    """Teacher forcing: each chosen step's recorded inputs (x_t, 1000·t, both CFG branches) fed to the saved DiT,
    compared with what the eager DiT answered there; then a free-running sampler over the saved DiT, compared on
    the final latent. Array metrics on the example (step 0, conditional) as for any component."""
    run = eager_run(ctx.checkpoint, ctx.cfg)
    steps = gate_steps(ctx.cfg, ctx.target, len(run.steps))
    candidates = {name: [] for name in OUTPUT_NAMES}
    references = {name: [] for name in OUTPUT_NAMES}
    calls = []
    with ctx.session as session:
        for i in steps:
            step = run.steps[i]
            for branch, answer in (("cond", step.cond), ("uncond", step.uncond)):
                if answer is None:
                    continue
                out = session.run({k: v.numpy() for k, v in step_inputs(step, run.conditioning, branch).items()})
                for name, ref in zip(OUTPUT_NAMES, answer):
                    candidates[name].append(np.asarray(out[name]))
                    references[name].append(ref.numpy())
                calls.append({"step": i, "branch": branch, "timestep": float(step.timestep[0])})
        free = None
        if ctx.target in (ctx.cfg.per_step_gate.free_run_targets or []):
            s = ctx.cfg.sampler
            free = flow.sample(flow.session_dit(session), run.noise, run.conditioning, int(s.steps), float(s.shift),
                               float(s.guidance_scale))
    array_thresholds = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "arrays"}
    results = gates.evaluate({name: candidates[name][0] for name in OUTPUT_NAMES},
                             {name: references[name][0] for name in OUTPUT_NAMES}, array_thresholds)
    for metric, threshold in ctx.thresholds.items():
        if gates.METRICS[metric].compares != "sampler steps":
            continue
        for name in OUTPUT_NAMES:
            if metric == "min_step_channel_cosine" and name != "latent_velocity":
                continue   # the camera velocity is one token: a per-channel cosine of one number is only its sign
            value = gates.measure(metric, candidates[name], references[name])
            results.append(gates.GateResult(f"{name} ({len(calls)} calls, steps {steps[0]}..{steps[-1]})", metric,
                                            value, float(threshold), gates.check_value(metric, value, threshold)))
    details = {"outputs": [{"name": n, "shape": list(candidates[n][0].shape), "dtype": str(candidates[n][0].dtype)}
                           for n in OUTPUT_NAMES],
               "sampler_steps": {"calls": calls,
                                 "cosine": [gates.cosine(c, r) for c, r in zip(candidates["latent_velocity"],
                                                                              references["latent_velocity"])],
                                 "min_channel_cosine": [gates.min_channel_cosine(c, r) for c, r in
                                                        zip(candidates["latent_velocity"], references["latent_velocity"])],
                                 "rel_max_abs": [gates.rel_max_abs(c, r) for c, r in
                                                 zip(candidates["latent_velocity"], references["latent_velocity"])]}}
    if free is not None:
        for metric, threshold in ctx.thresholds.items():
            if gates.METRICS[metric].compares != "sampler runs":
                continue
            value = gates.measure(metric, free.final["latent"].numpy(), run.final["latent"].numpy())
            results.append(gates.GateResult(f"final latent (free-running, {len(run.steps)} steps)", metric, value,
                                            float(threshold), gates.check_value(metric, value, threshold)))
        details["free_run"] = {"cosine": gates.cosine(free.final["latent"].numpy(), run.final["latent"].numpy()),
                               "rel_max_abs": gates.rel_max_abs(free.final["latent"].numpy(), run.final["latent"].numpy())}
    else:
        details["free_run"] = f"not run on {ctx.target} (per_step_gate.free_run_targets)"
    return results, details


def dit_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    """What the host-side sampler needs besides the graph."""
    dit_cfg = dit_config(checkpoint, cfg)
    facts = {**sampler_request(cfg), "latent_tokens": dit_cfg.q_token_length, "latent_channels": dit_cfg.in_channels,
             "camera_channels": dit_cfg.cam_channels, "cond_channels": dit_cfg.cond_channels,
             "cond2_channels": dit_cfg.cond2_channels, "input_names": list(INPUT_NAMES),
             "output_names": list(OUTPUT_NAMES)}
    (bundle_dir / SAMPLER_FILE).write_text(json.dumps(facts, indent=2) + "\n")


def seeded_dit_state(dit_cfg: DiTConfig, seed: int) -> dict[str, torch.Tensor]:
    """A LatentSeqMMFlowModel state dict with torch's default init, seeded (upstream-keyed, upstream order)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return {k: v.clone() for k, v in LatentSeqMMFlowModel(dit_cfg).state_dict().items()}


# ---------------------------------------------------------------- image encoders (models/triposplat/encoders.py)

IMAGE_PART, VAE_PART = "image_encoder", "vae_encoder"


def dino_config(checkpoint: Checkpoint, cfg) -> enc.DinoConfig:
    """The part's own config.json (tiny), else the variant's architecture (upstream's file carries none)."""
    return enc.DinoConfig.from_dict(dict(checkpoint.config.get(IMAGE_PART) or {}) or architecture(cfg, IMAGE_PART))


def vae_config(checkpoint: Checkpoint, cfg) -> enc.VaeConfig:
    return enc.VaeConfig.from_dict(dict(checkpoint.config.get(VAE_PART) or {}) or architecture(cfg, VAE_PART))


def encoder_image_size(checkpoint: Checkpoint, cfg) -> int:
    """The square canvas the conditioning token count implies (4101 -> 1024², 21 -> 64²); the VAE's 16x
    reduction (8x encoder, 2x2 patchify) must land on the same token grid."""
    return enc.image_size_for(int(cfg.cond_tokens), dino_config(checkpoint, cfg).patch_size)


def encoder_state(checkpoint: Checkpoint, name: str) -> dict[str, torch.Tensor]:
    return enc.clean_state(part(checkpoint, name)[1])


def image_encoder_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    e = cfg.encoders
    module = enc.ImageEncoder(dino_config(checkpoint, cfg), encoder_image_size(checkpoint, cfg), int(e.attention_chunk),
                              tuple(float(v) for v in e.pixel_mean), tuple(float(v) for v in e.pixel_std))
    return load_strict(module, encoder_state(checkpoint, IMAGE_PART)).eval()


def image_encoder_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    """transformers DINOv3ViTModel on the same weights, with upstream's ImageNet constants (never the config's)."""
    return enc.ReferenceImageEncoder(dino_config(checkpoint, cfg), encoder_image_size(checkpoint, cfg),
                                     encoder_state(checkpoint, IMAGE_PART)).eval()


def vae_encoder_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    module = enc.VaeEncoder(vae_config(checkpoint, cfg), int(cfg.encoders.attention_chunk), str(cfg.encoders.patch_order))
    return load_strict(module, encoder_state(checkpoint, VAE_PART)).eval()


def vae_encoder_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    """diffusers AutoencoderKLFlux2 on the same weights, upstream's sampling / patchify / normalisation around it."""
    return enc.ReferenceVaeEncoder(vae_config(checkpoint, cfg), encoder_state(checkpoint, VAE_PART)).eval()


def gate_image(checkpoint: Checkpoint, cfg) -> torch.Tensor:
    """The encoders' gate input: the fixed RGBA test card (encoders.test_card, drawn at twice the canvas so the
    resize does work) through upstream's preprocessing (image_input.prepare)."""
    from PIL import Image

    size = encoder_image_size(checkpoint, cfg)
    return image_input.prepare(Image.fromarray(enc.test_card(2 * size), "RGBA"), size, "the gate's test card")


def image_encoder_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    return {"image": gate_image(checkpoint, cfg)}


def vae_encoder_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The test card and the posterior noise upstream's seeded generator draws first (encoders.pipeline_noise)."""
    size = encoder_image_size(checkpoint, cfg)
    generator = torch.Generator().manual_seed(int(cfg.seed))
    return {"image": gate_image(checkpoint, cfg),
            "noise": torch.randn(enc.vae_noise_shape(vae_config(checkpoint, cfg), size), generator=generator)}


def encoder_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    """What the host needs to feed the encoder bundles: the canvas size, the VAE noise shape."""
    size = encoder_image_size(checkpoint, cfg)
    facts = {"image_size": size, "cond_tokens": int(cfg.cond_tokens),
             "vae_noise_shape": list(enc.vae_noise_shape(vae_config(checkpoint, cfg), size))}
    (bundle_dir / ENCODER_FILE).write_text(json.dumps(facts, indent=2) + "\n")


ENCODER_FILE = "encoder.json"


@dataclass
class EncoderSection:
    """config.yaml `encoders:`."""

    attention_chunk: int = 0    # query chunk of DINOv3's and the VAE's attention (0: none); real size needs one
    # upstream's ImageNet constants; anything else is the image-encoder gate's negative control (README)
    pixel_mean: list = field(default_factory=lambda: list(enc.IMAGENET_MEAN))
    pixel_std: list = field(default_factory=lambda: list(enc.IMAGENET_STD))
    patch_order: str = "upstream"   # transposed: the vae-encoder gate's negative control (dy and dx swapped)


def seeded_image_encoder_part(cfg, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    config = architecture(cfg, IMAGE_PART)
    return config, enc.seeded_dino_state(enc.DinoConfig.from_dict(config), seed)


def seeded_vae_encoder_part(cfg, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    config = architecture(cfg, VAE_PART)
    return config, enc.seeded_vae_state(enc.VaeConfig.from_dict(config), seed)


ENCODER_COMPONENTS = [
    Component(name="image-encoder", build=image_encoder_build, reference=image_encoder_reference,
              example_inputs=image_encoder_inputs, output_names=["feature1"], extra_files=encoder_extra_files),
    Component(name="vae-encoder", build=vae_encoder_build, reference=vae_encoder_reference,
              example_inputs=vae_encoder_inputs, output_names=["feature2"], extra_files=encoder_extra_files),
]


# ---------------------------------------------------------------- background remover (models/triposplat/background.py)

BACKGROUND_PART = "background_remover"
BACKGROUND_FILE = "background.json"


def background_config(checkpoint: Checkpoint, cfg) -> bg.BiRefNetConfig:
    """The part's own config.json (tiny), else the variant's architecture (upstream's birefnet.safetensors carries
    none)."""
    return bg.BiRefNetConfig.from_dict(dict(checkpoint.config.get(BACKGROUND_PART) or {})
                                       or architecture(cfg, BACKGROUND_PART))


def background_build(checkpoint: Checkpoint, cfg) -> nn.Module:
    b = cfg.background
    module = bg.BiRefNet(background_config(checkpoint, cfg), "gather", tuple(float(v) for v in b.pixel_mean),
                         tuple(float(v) for v in b.pixel_std))
    return load_strict(module, part(checkpoint, BACKGROUND_PART)[1]).eval()


def background_reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    """The port in eager fp32 with upstream's ImageNet constants (never the config's) and the gather sampler. Its
    parity with upstream's own BiRefNet (torchvision's deform_conv2d) is proven on the golden fixtures
    (tests/test_triposplat_background.py); upstream cannot be imported here (it needs torchvision)."""
    module = bg.BiRefNet(background_config(checkpoint, cfg), "gather")
    return load_strict(module, part(checkpoint, BACKGROUND_PART)[1]).eval()


def background_entries(module: nn.Module, inputs: dict, target: str, cfg):
    """One `main` graph with the deformable sampler form of the target (background.FORMS_BY_TARGET), or the one
    `model.background.sampler` names (real size on LiteRT: gather; the tent form's buffers do not fit, README)."""
    from zoo.targets import Entry

    chosen = str(cfg.background.sampler)
    if chosen != "auto" and chosen not in bg.SAMPLERS:
        raise ZooError(f"model.background.sampler = {chosen!r}.", f"use auto or one of {', '.join(bg.SAMPLERS)}.")
    form = bg.FORMS_BY_TARGET[target] if chosen == "auto" else chosen
    for net in (m for m in module.modules() if isinstance(m, bg.BiRefNet)):   # inside a precision wrapper too
        net.set_sampler(form)
    return [Entry("main", module, dict(inputs), ["alpha"])]


def background_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The gate photo (background.gate_photo: the encoders' test card composited on a textured background, no
    alpha) resized to the network's input as upstream's remove_background does."""
    size = background_config(checkpoint, cfg).image_size
    from PIL import Image

    photo = Image.fromarray(bg.gate_photo(2 * size), "RGB")
    return {"image": bg.resize_for_matting(image_input.to_tensor(photo), size)}


def background_extra_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    """What the host needs to feed the bundle: its input size."""
    facts = {"image_size": background_config(checkpoint, cfg).image_size}
    (bundle_dir / BACKGROUND_FILE).write_text(json.dumps(facts, indent=2) + "\n")


@dataclass
class BackgroundSection:
    """config.yaml `background:`."""

    # upstream's ImageNet constants; anything else is the background-remover gate's negative control (README)
    pixel_mean: list = field(default_factory=lambda: list(bg.IMAGENET_MEAN))
    pixel_std: list = field(default_factory=lambda: list(bg.IMAGENET_STD))
    # the deformable convolutions' sampling form: auto = background.FORMS_BY_TARGET (LiteRT tent, Core AI gather);
    # gather | tent force one (scripts/deform_conv_lowering.py: the tent form's buffer at real size)
    sampler: str = "auto"


def seeded_background_part(cfg, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    config = architecture(cfg, BACKGROUND_PART)
    return config, bg.seeded_state(bg.BiRefNetConfig.from_dict(config), seed)


BACKGROUND_COMPONENT = Component(name="background-remover", build=background_build, reference=background_reference,
                                 example_inputs=background_inputs, output_names=["alpha"],
                                 entries=background_entries, extra_files=background_extra_files, optional=True)


# ---------------------------------------------------------------- weights


# part name -> (cfg, seed) -> (config, un-prefixed state dict) for weights=random. The decoder module registers
# its part here (RANDOM_PARTS["decoder"] = ...) when it appends its components.
RANDOM_PARTS = {"dit": lambda cfg, seed: (architecture(cfg, "dit"),
                                          seeded_dit_state(DiTConfig.from_dict(architecture(cfg, "dit")), seed))}
RANDOM_PARTS["decoder"] = decoding.random_decoder_part
RANDOM_PARTS[IMAGE_PART] = seeded_image_encoder_part
RANDOM_PARTS[VAE_PART] = seeded_vae_encoder_part
RANDOM_PARTS[BACKGROUND_PART] = seeded_background_part


def random_checkpoint(cfg) -> tuple[dict, dict[str, torch.Tensor]]:
    """Every part (or `model.random_parts`) at the variant's architecture with seeded default-init weights (for
    benchmarks, not for use). At real size the DINOv3 ViT-H+ part alone is ~0.84 G parameters (3.4 GB in fp32), so
    a DiT- or decoder-only run can leave the encoders out: `model.random_parts=[dit,decoder]`."""
    chosen = list(cfg.random_parts or RANDOM_PARTS)
    unknown = sorted(set(chosen) - set(RANDOM_PARTS))
    if unknown:
        raise ZooError(f"model.random_parts names {', '.join(unknown)}: the parts are {', '.join(RANDOM_PARTS)}.",
                       "name parts from that list (or leave it empty for all).")
    config, state = {}, {}
    for name, make in RANDOM_PARTS.items():
        if name not in chosen:
            continue
        part_config, part_state = make(cfg, int(cfg.seed))
        config[name] = part_config
        state.update({f"{name}.{k}": v for k, v in part_state.items()})
    return config, state


# ---------------------------------------------------------------- config


@dataclass
class SamplerSection:
    steps: int = 20              # upstream's default (TripoSplat.run)
    guidance_scale: float = 3.0
    shift: float = 3.0


@dataclass
class PerStepGateSection:
    # target -> sampler steps to gate (null or absent: every step); negative indices count from the end
    steps: dict = field(default_factory=dict)
    free_run_targets: list = field(default_factory=lambda: ["litert", "coreai"])


@dataclass
class TripoSplatModelConfig(ModelConfig):
    """config.yaml keys only TripoSplat has."""

    sampler: SamplerSection = field(default_factory=SamplerSection)
    cond_tokens: int = 21              # conditioning tokens (real: 4101 = cls + 4 registers + 64x64 patches)
    attention_chunk: int = 0           # DiT query chunk (0: none); for GPU buffer limits and memory at real size
    # upstream's Sobol seed; another value builds a DiT with wrong token positions (the per-step gate's negative
    # control: `zoo convert model=triposplat component=dit target=litert model.sobol_seed=7` must fail)
    sobol_seed: int = SOBOL_SEED
    per_step_gate: PerStepGateSection = field(default_factory=PerStepGateSection)
    # ---- decoder keys (models/triposplat/decoders.py) go below this line ----
    decoders: decoding.DecoderSection = field(default_factory=decoding.DecoderSection)
    encoders: EncoderSection = field(default_factory=EncoderSection)
    background: BackgroundSection = field(default_factory=BackgroundSection)
    random_parts: list = field(default_factory=list)   # weights=random: the parts to make (empty: all)


COMPONENTS = [
    BACKGROUND_COMPONENT,  # background-remover: a photo without alpha -> the matte (upstream's BiRefNet)
    *ENCODER_COMPONENTS,   # image-encoder, vae-encoder: an RGBA cut-out -> feature1, feature2
    Component(name="dit", build=dit_build, reference=dit_reference, example_inputs=dit_example_inputs,
              output_names=list(OUTPUT_NAMES), verify=dit_verify, extra_files=dit_extra_files),
    # ---- decoder components are appended here (octree-decoder, gaussian-decoder) ----
    *decoding.COMPONENTS,
]

def run_pipeline(*args, **kwargs) -> str:
    """`zoo generate triposplat --bundles DIR --image photo.png --out splats.ply` (models/triposplat/bundles.py)."""
    from models.triposplat.bundles import run_bundles

    return run_bundles(*args, **kwargs)


SPEC = ModelSpec(
    name="triposplat",
    summary="TripoSplat image-to-3D Gaussians: DINOv3 + FLUX.2 VAE encoders, 370 M rectified-flow DiT, decoders",
    components=COMPONENTS,
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    config_schema=TripoSplatModelConfig,
    pipeline_tag="image-to-3d",
    license="mit",
    run_pipeline=run_pipeline,
    pipeline_inputs=("image",),   # an RGBA cut-out, or a photo with the background-remover bundle (image_input.py)
    real_size=REAL_SIZE,   # `make real-size MODEL=triposplat` (models/triposplat/real_size.py)
)
