"""Measure the Core AI graph form pass (zoo/targets/coreai_form.py) on one model component, in one run.

    .venv/bin/python scripts/coreai_form_check.py [MODEL] [COMPONENT] [key=value config overrides ...]
    .venv/bin/python scripts/coreai_form_check.py t5 encoder variant=base     # T5-v1.1-base, seeded weights

Converts the component at fp32 twice — as authored (nn.Linear: permute + matmul) and with
`pretranspose_linears` — saves both .aimodel files, and times eager torch, then each artifact on the Core AI
CPU runtime, back to back on the same inputs (median of REPEATS after one warm-up). Prints the op counts
that matter (transpose, matmul) and each latency as a ratio to eager: the machine's noise cancels in ratios.
Also checks both artifacts against eager (cosine), so a faster but wrong form cannot look good.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zoo.quiet  # noqa: E402,F401
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from zoo import gates  # noqa: E402
from zoo.bench import median_ms  # noqa: E402
from zoo.cli import run_script  # noqa: E402
from zoo.pipeline import to_numpy  # noqa: E402
from zoo.registry import get_spec, load_model_config  # noqa: E402
from zoo.targets import Entry  # noqa: E402
from zoo.targets.coreai import CoreAITarget, convert_programs, export_entry  # noqa: E402
from zoo.targets.coreai_form import op_histogram, pretranspose_linears  # noqa: E402
from zoo.weights import resolve  # noqa: E402

REPEATS = 5
SHOWN = ("transpose", "broadcasting_batch_matmul", "batch_matmul", "matmul")


def convert_and_save(module, inputs, output_names, folder: Path, name: str):
    entry = Entry("main", module, inputs, output_names)
    program = convert_programs([entry], [export_entry(entry)])
    counts = op_histogram(program)
    dest = folder / name
    dest.mkdir()
    return CoreAITarget().save(program, dest, {}), counts


def main(argv: list[str]) -> int:
    model = argv[0] if argv else "t5"
    component_name = argv[1] if len(argv) > 1 else None
    cfg = OmegaConf.merge(load_model_config(model), OmegaConf.from_dotlist([a for a in argv[2:] if a != "-v"]))
    spec = get_spec(cfg)
    component = spec.component(component_name) if component_name else spec.components[0]
    checkpoint = resolve(cfg, "random", spec.tiny_dir, spec.random_checkpoint)
    module = component.build(checkpoint, cfg).eval()
    inputs = component.example_inputs(checkpoint, cfg)
    names = list(component.output_names)
    with torch.no_grad():
        eager_out = module(*inputs.values())
        eager_out = eager_out[0] if isinstance(eager_out, tuple) else eager_out
        eager_ms = median_ms(lambda: module(*inputs.values()), REPEATS)
    form, swapped = pretranspose_linears(module)
    arrays = to_numpy(inputs)
    target = CoreAITarget()
    print(f"{model}/{component.name} {cfg.get('variant')}: {swapped} Linear layers; eager {eager_ms:.1f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        for label, candidate in (("as authored", module), ("pretransposed", form)):
            path, counts = convert_and_save(candidate, inputs, names, Path(tmp), label.replace(" ", "-"))
            with target.open(path) as runner:
                out = runner.run("main", arrays)[names[0]]
                ms = median_ms(lambda: runner.run("main", arrays), REPEATS)
            ops = ", ".join(f"{op} {counts.get(op, 0)}" for op in SHOWN)
            if "-v" in sys.argv:
                ops += f"\n    all ops: {dict(counts.most_common())}"
            print(f"  {label:<14} {ms:9.1f} ms  {ms / eager_ms:6.2f}x eager   cos {gates.cosine(out, eager_out.numpy()):.7f}   {ops}")
    return 0


if __name__ == "__main__":
    run_script(main, sys.argv[1:])
