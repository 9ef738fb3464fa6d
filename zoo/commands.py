"""`zoo <command> [args]`: the make targets as one console script, for use outside a checkout.

    zoo convert model=t5 target=litert precision=int8     # Hydra overrides pass straight through
    zoo convert -m model=t5 target=coreai,litert hydra/launcher=zoo_joblib
    zoo convert module=mypkg.models:build fix=true       # any nn.Module, gated against itself
    zoo convert-all [model=t5,gqa-llm] [--force] [hydra/launcher=joblib|ray|submitit_local|submitit_slurm]
    zoo catalog                                          # docs/catalog.md from every bundle in exports/
    zoo real-size ltx-video [--resume|--readme-only]
    zoo list | zoo bench model=t5 | zoo generate --bundle B --prompt P | zoo demo
    zoo publish t5 --dry-run | zoo cache check [MODEL] | zoo cache repair [MODEL]
    zoo doctor t5 | zoo doctor mypkg.models:build --target litert-gpu | zoo doctor model.tflite
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "convert": ("zoo.convert", "one model through the requested targets and precisions (make convert)"),
    "convert-all": ("zoo.convert_all", "the whole matrix as one Hydra multirun, skipping what is up to date (make convert-all)"),
    "catalog": ("zoo.bundle_catalog", "docs/catalog.md + catalog.json from every bundle on disk (make catalog)"),
    "list": ("zoo.catalog", "models, components, targets and default precisions (make list)"),
    "bench": ("zoo.bench", "conversion cost, size, gates and latency per bundle (make bench)"),
    "real-size": ("zoo.real_size", "MODEL: convert it at real size, time + peak RSS + numerics (make real-size)"),
    "generate": ("zoo.generate", "stream text from a generative bundle, or run a model's bundles (--bundles DIR)"),
    "demo": ("zoo.demo", "every model through both targets on its default weights (make demo)"),
    "verify": ("zoo.verify", "re-check a bundle: hashes, then optionally its gates"),
    "publish": ("zoo.publish", "stage verified bundles + a model card and upload them to the Hub"),
    "cache": ("zoo.hub", "check|repair [MODEL]: the HF cache entries the zoo uses"),
    "doctor": ("zoo.doctor", "MODEL|pkg.mod:factory|PATH.tflite: known traps in the exported graph, with fixes"),
}


def usage() -> str:
    lines = ["usage: zoo <command> [args]", "", "commands:"]
    lines += [f"  {name:<11} {about}" for name, (_, about) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command '{command}'. Fix: use one of {', '.join(COMMANDS)} (zoo --help).",
              file=sys.stderr)
        return 2
    module_name = COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"error: '{command}' is not available in this installation. Fix: update zoo.", file=sys.stderr)
        return 2
    sys.argv = [f"zoo {command}", *rest]  # Hydra and argparse read sys.argv
    code = module.main() if command in ("convert", "list") else module.main(rest)
    return int(code or 0)


def script() -> None:
    """The `zoo` console script (pyproject [project.scripts]): main's code through zoo.cli.end_process."""
    from zoo.cli import run_script

    run_script(main)


if __name__ == "__main__":
    script()
