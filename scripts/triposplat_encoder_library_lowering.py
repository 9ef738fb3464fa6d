"""Why the TripoSplat encoders are re-authored: the library classes themselves (transformers DINOv3ViTModel,
diffusers AutoencoderKLFlux2's encoder, with upstream's pre/post-processing around them: the components'
`reference` modules) converted through the same pipeline, gates and LiteRT GPU check as the ports. Prints each
bundle's status, the `zoo doctor` note and the gate / GPU results (the README's "Image encoders" cites this).

    python scripts/triposplat_encoder_library_lowering.py [precision=fp16] [target=all] [out_dir=/tmp/...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import json

    import models.triposplat as tripo
    from zoo.pipeline import convert_model
    from zoo.registry import get_spec, load_model_config

    args = dict(a.split("=", 1) for a in sys.argv[1:])
    cfg = load_model_config("triposplat")
    spec = get_spec(cfg)
    for name, reference in (("image-encoder", tripo.image_encoder_reference), ("vae-encoder", tripo.vae_encoder_reference)):
        spec.component(name).build = reference        # the library module is what gets converted
    targets = ["coreai", "litert"] if args.get("target", "all") == "all" else [args["target"]]
    out = Path(args.get("out_dir") or tempfile.mkdtemp(prefix="tripo-library-"))
    results = convert_model(cfg, targets, args.get("precision", "fp16"), out_dir=out,
                            components=["image-encoder", "vae-encoder"])
    for r in results:
        stages = {s["name"]: s for s in (r.stages or [])}
        print(f"{r.component} {r.target} {r.precision}: {r.status}" + (f" — {r.error}" if r.error else ""))
        print(f"  doctor: {(stages.get('doctor') or {}).get('note', 'not run')}")
        for g in r.gates or []:
            print(f"  {g.describe()}")
        report = r.path / "report.json" if r.path else None
        gpu = json.loads(report.read_text()).get("gpu") if report and report.is_file() else None
        if gpu:
            print(f"  LiteRT GPU: {gpu.get('status')}; partitions {gpu.get('partitions')}; "
                  f"rejected: {sorted({o['op'] + ': ' + o['reason'][:60] for o in gpu.get('rejected_ops') or []})}")


if __name__ == "__main__":
    main()
