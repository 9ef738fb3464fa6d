"""RF-DETR (Roboflow's real-time detection transformer): declarations only; the pipeline does the work.

One component, `detector`: image [1, 3, R, R] in [0, 1] → boxes [1, Q, 4] (cxcywh, normalised) and class
logits [1, Q, C]. Host-side post-processing and the set-based detection gate are shared code
(zoo/detection.py, zoo/gates.py). The reference is this port with torch's own `F.grid_sample` in the
deformable attention (upstream's op): its parity with upstream `rfdetr` is proven against the golden
fixtures in tests/test_rf_detr.py, which CI runs without torchvision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from models.rf_detr import images
from models.rf_detr.model import RFDETR, RFDETRConfig
from models.rf_detr.weights import seeded_state_dict, without_bookkeeping
from zoo import gates
from zoo.detection import decode_detections, match_detections, merge_reports
from zoo.errors import ZooError
from zoo.registry import Component, Measure, ModelSpec
from zoo.schema import ModelConfig
from zoo.sessions import OneShotSession
from zoo.weights import Checkpoint, load_strict

GOLDEN_DIR = Path(__file__).parent / "golden"
TINY_DIR = GOLDEN_DIR / "tiny" / "checkpoint"   # the tiny golden checkpoint is the model's `weights=tiny`
OUTPUTS = ["boxes", "logits"]
# The graph forms each target gets (models/rf_detr/model.py), both exact to fp32 rounding vs upstream:
# Core AI: the deformable sampler as 4 row gathers with float masks, top-k rows picked by index_select (cheapest).
# LiteRT: the tent-matmul sampler and one-hot row picking — no GATHER/GATHER_ND, which its GPU delegate rejects.
FORMS_BY_TARGET = {"coreai": {"sampler": "gather", "selection": "index"},
                   "litert": {"sampler": "tent", "selection": "onehot"}}


def architecture(cfg) -> dict:
    return OmegaConf.to_container(cfg.variants[cfg.variant].architecture, resolve=True)


def detector_config(checkpoint: Checkpoint, cfg=None) -> RFDETRConfig:
    """The checkpoint's own config.json, or — for a bare weight file (.pth, url) — the variant's architecture with
    the class count read from the weights (fine-tuned checkpoints change only the class head)."""
    if checkpoint.config:
        return RFDETRConfig.from_dict(dict(checkpoint.config))
    config = architecture(cfg)
    head = checkpoint.state_dict.get("class_embed.weight")
    if head is not None:
        config["num_classes"] = int(head.shape[0])
    return RFDETRConfig.from_dict(config)


def architecture_signals(state_dict: dict) -> dict:
    """What the weights themselves say about the architecture: patch grid side and decoder depth."""
    signals = {}
    pos = state_dict.get("backbone.0.encoder.encoder.embeddings.position_embeddings")
    if pos is not None:
        signals["patches_per_side"] = int(round((pos.shape[1] - 1) ** 0.5))
    layers = {k.split(".")[3] for k in state_dict if k.startswith("transformer.decoder.layers.")}
    signals["dec_layers"] = len(layers)
    return signals


def check_variant(checkpoint: Checkpoint, cfg) -> None:
    """A checkpoint of another variant (Small weights with variant=nano) is named, not half-loaded."""
    if checkpoint.source in ("tiny", "random") or cfg is None:
        return
    expected = RFDETRConfig.from_dict(architecture(cfg))
    want = {"patches_per_side": expected.patches_per_side, "dec_layers": expected.dec_layers}
    got = architecture_signals(checkpoint.state_dict)
    differing = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    if differing:
        raise ZooError(f"The checkpoint does not have the '{cfg.variant}' architecture: "
                       + ", ".join(f"{k}={a} (expected {b})" for k, (a, b) in differing.items()) + ".",
                       "pick the variant the weights belong to (model.variant=nano|small|medium|large|tiny).")


def build(checkpoint: Checkpoint, cfg) -> nn.Module:
    check_variant(checkpoint, cfg)
    module = RFDETR(detector_config(checkpoint, cfg))
    return load_strict(module, without_bookkeeping(checkpoint.state_dict)).eval()


def reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    return build(checkpoint, cfg).set_sampler("grid_sample")


def entries(module: RFDETR, inputs: dict, target: str, cfg):
    from zoo.targets import Entry

    forms = FORMS_BY_TARGET[target]
    # `module` may be the precision wrapper (zoo.precision.IOCast) around the detector: set the forms inside.
    for detector in (m for m in module.modules() if isinstance(m, RFDETR)):
        detector.set_sampler(forms["sampler"]).set_selection(forms["selection"])
    return [Entry("main", module, dict(inputs), list(OUTPUTS))]


def example_photo_inputs(cfg, resolution: int) -> list[tuple[str, np.ndarray, torch.Tensor]]:
    """(name, original RGB, model input) for every gate photo in the config."""
    out = []
    for name in cfg.detection.photos:
        rgb = images.photo(name)
        out.append((name, rgb, images.to_model_input(rgb, resolution)))
    return out


def example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    """The first gate photo, squashed to the model resolution like upstream's predict()."""
    resolution = detector_config(checkpoint, cfg).resolution
    return {"image": example_photo_inputs(cfg, resolution)[0][2]}


def random_checkpoint(cfg) -> tuple[dict, dict[str, torch.Tensor]]:
    """The variant's architecture with the golden fixtures' seeded weights (for benchmarks, not for use)."""
    config = architecture(cfg)
    shapes = {k: tuple(v.shape) for k, v in RFDETR(RFDETRConfig.from_dict(config)).state_dict().items()}
    return config, seeded_state_dict(shapes, int(cfg.seed))


# ---------------------------------------------------------------- the bundle's session


class DetectorSession(OneShotSession):
    """One call per image. On top of the shared shape/dtype check (zoo.sessions.check_inputs), an image must be in
    [0, 1] (the graph normalises with ImageNet statistics itself; a 0-255 image would silently detect nothing)."""

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        image = np.asarray(inputs.get("image", np.zeros(0)))
        if image.size and image.dtype.kind == "f" and (np.nanmin(image) < 0.0 or np.nanmax(image) > 1.0):
            raise ZooError(f"The image has values in [{np.nanmin(image):g}, {np.nanmax(image):g}]; the bundle "
                           "expects [0, 1].", "divide 8-bit pixels by 255 (models/rf_detr/images.to_model_input).")
        return super().run(inputs)

    def detect(self, rgb: np.ndarray, resolution: int, num_select: int = 300):
        """An RGB uint8 photo → detections in its own pixel coordinates (shared host-side decode)."""
        out = self.run({"image": images.to_model_input(rgb, resolution).numpy()})
        return decode_detections(out["boxes"], out["logits"], rgb.shape[:2], num_select)


def detector_session(runner, target: str) -> DetectorSession:
    return DetectorSession(runner)


# ---------------------------------------------------------------- verify: arrays + detection sets


PICTURE = "detections.png"


def side_by_side(rgb: np.ndarray, reference_dets, artifact_dets, threshold: float, title: str):
    """The photo twice: the reference's detections above the threshold on the left, the artifact's on the right."""
    from PIL import Image, ImageDraw

    panels = []
    for label, dets in ((f"reference (eager torch)", reference_dets), (f"artifact: {title}", artifact_dets)):
        panel = Image.fromarray(rgb).convert("RGB")
        draw = ImageDraw.Draw(panel)
        kept = dets.above(threshold)
        for box, score, cls in zip(kept.boxes, kept.scores, kept.labels):
            hue = (int(cls) * 67) % 256
            colour = (255, hue, 255 - hue)
            draw.rectangle([float(v) for v in box], outline=colour, width=2)
            draw.text((float(box[0]) + 3, float(box[1]) + 2), f"{int(cls)}:{score:.2f}", fill=colour)
        draw.rectangle([0, 0, panel.width, 16], fill=(0, 0, 0))
        draw.text((4, 2), f"{label}: {len(kept)} above {threshold:g}", fill=(255, 255, 255))
        panels.append(panel)
    out = Image.new("RGB", (panels[0].width * 2 + 8, panels[0].height), (255, 255, 255))
    out.paste(panels[0], (0, 0))
    out.paste(panels[1], (panels[0].width + 8, 0))
    return out


def detections_on_photos(session, reference_module, cfg, resolution: int, picture=None) -> tuple[dict, list[dict]]:
    """Run artifact and reference on every gate photo; decode both the same way; match as sets. `picture`:
    (path, title) — the first photo's detections side by side are saved there."""
    d = cfg.detection
    reports, per_photo = [], []
    for name, rgb, x in example_photo_inputs(cfg, resolution):
        got = session.run({"image": x.numpy()})
        with torch.no_grad():
            ref_boxes, ref_logits = reference_module(x)
        hw = rgb.shape[:2]
        candidate = decode_detections(got["boxes"], got["logits"], hw, int(d.num_select))
        expected = decode_detections(ref_boxes.numpy(), ref_logits.numpy(), hw, int(d.num_select))
        report = match_detections(candidate, expected, float(d.score_threshold), float(d.iou_min), float(d.score_tol),
                                  int(d.num_select))
        reports.append(report)
        per_photo.append({"photo": name, **{k: v for k, v in report.items() if k != "pairs"}})
        if picture is not None and len(reports) == 1:
            side_by_side(rgb, expected, candidate, float(d.score_threshold), picture[1]).save(picture[0])
    return merge_reports(reports), per_photo


def verify(ctx) -> tuple[list, dict]:
    """Cosine-style gates on boxes/logits of the example photo, then the detection-set gates on every photo."""
    array_thresholds = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "arrays"}
    detection_thresholds = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "detection sets"}
    with ctx.session as session:
        outputs = session.run(ctx.inputs)
        results = gates.evaluate(outputs, ctx.reference_outputs, array_thresholds) if array_thresholds else []
        details = {"outputs": [{"name": k, "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)}
                               for k, v in outputs.items()]}
        if detection_thresholds:
            resolution = detector_config(ctx.checkpoint, ctx.cfg).resolution
            title = f"{ctx.target} bundle"
            merged, per_photo = detections_on_photos(session, reference(ctx.checkpoint, ctx.cfg), ctx.cfg, resolution,
                                                     picture=(ctx.bundle_dir / PICTURE, title))
            for metric, threshold in detection_thresholds.items():
                value = float(gates.METRICS[metric].fn(merged))
                results.append(gates.GateResult("detections", metric, value, float(threshold),
                                                gates.check_value(metric, value, threshold)))
            details["detections"] = {"settings": OmegaConf.to_container(ctx.cfg.detection), "merged": merged,
                                     "photos": per_photo}
    return results, details


# ---------------------------------------------------------------- bench


def measure_detector(ctx) -> dict:
    """The shared latency measure, plus the bundle's side-by-side picture copied beside the model README
    (`detections-<target>.png`, from the bench's own gated run)."""
    import shutil

    from zoo.bench import measure_latency

    row = measure_latency(ctx)
    picture = ctx.bundle / PICTURE
    if picture.is_file():
        shutil.copyfile(picture, Path(__file__).parent / f"detections-{ctx.target}.png")
    return row


def picture_lines(rows: list[dict], header: dict) -> list[str]:
    targets = sorted({r.get("target") for r in rows if r.get("target")})
    return ["", "Side by side on the first gate photo (reference left, bundle right; from this bench run):", ""] + \
        [f"![{t}](detections-{t}.png)" for t in targets]


MEASURE = Measure(
    run=measure_detector,
    columns=[("latency_ms", "latency ms"), ("eager_ms", "eager ms"), ("latency_vs_eager", "vs eager")],
    describe="latency = median of the configured repeats after one warm-up, one call of the saved artifact on this "
             "machine's runtime; eager = the reference module in fp32 on the same image, timed right before it",
    details=picture_lines,
)


@dataclass
class DetectionSection:
    """The detection gate: which photos, and what counts as the same detection."""

    photos: list[str] = field(default_factory=lambda: list(images.PHOTOS[:2]))
    num_select: int = 300
    score_threshold: float = 0.5
    iou_min: float = 0.75
    score_tol: float = 0.02


@dataclass
class RFDETRModelConfig(ModelConfig):
    """config.yaml keys only RF-DETR has."""

    detection: DetectionSection = field(default_factory=DetectionSection)


SPEC = ModelSpec(
    name="rf-detr",
    summary="RF-DETR detection transformer (windowed DINOv2 + deformable decoder), Roboflow",
    components=[
        Component(
            name="detector",
            build=build,
            reference=reference,
            example_inputs=example_inputs,
            output_names=list(OUTPUTS),
            entries=entries,
            session=detector_session,
            verify=verify,
            measure=MEASURE,
        )
    ],
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    config_schema=RFDETRModelConfig,
)


def golden(name: str) -> dict:
    """A golden fixture folder's config and stored arrays (tests and README)."""
    from safetensors.torch import load_file

    folder = GOLDEN_DIR / name
    config = folder / "checkpoint" / "config.json" if (folder / "checkpoint").is_dir() else folder / "config.json"
    return {"config": json.loads(config.read_text()),
            "io": load_file(str(folder / "io.safetensors")), "folder": folder}
