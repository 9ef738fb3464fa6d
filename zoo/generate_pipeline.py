"""`zoo generate MODEL --bundles DIR --prompt "..." --out FILE`: a model that chains several bundles.

A folder made by `zoo convert` for a multi-component model holds `<component>/<target>-<precision>/` bundles.
This picks one bundle per component for one target, checks each against its manifest hashes, opens each on its
runtime through its component's session, and hands them to the model's `run_pipeline` hook (ModelSpec): the
host-side loop is the model's, the bundle plumbing is shared, and no model is named here.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from zoo import integrity
from zoo.errors import ZooError


def find_bundles(folder: Path) -> list[tuple[Path, dict]]:
    """Every bundle (a folder with manifest.json) one or two levels below `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ZooError(f"{folder} is not a folder.", "pass the folder `zoo convert` wrote, e.g. --bundles exports/ltx-video.")
    found = []
    for manifest in sorted(list(folder.glob("*/manifest.json")) + list(folder.glob("*/*/manifest.json"))):
        found.append((manifest.parent, integrity.read_manifest(manifest.parent)))
    if not found:
        raise ZooError(f"{folder} holds no bundles (no */*/manifest.json).",
                       "convert first, e.g. `make convert MODEL=ltx-video`, then pass --bundles exports/ltx-video.")
    return found


def pick_bundles(found: list[tuple[Path, dict]], model: str | None, target: str | None) -> tuple[str, str, dict[str, Path]]:
    """(model, target, {component: bundle}): exactly one passed bundle per component for one target; where a
    component has several precisions, its default precision for that target. An optional component (Component.
    optional) with no bundle for the target is left out; one with several is chosen like any other."""
    from zoo.precision import default_precision
    from zoo.registry import get_spec, load_model_config

    models = sorted({m.get("model") for _, m in found})
    if model is None and len(models) > 1:
        raise ZooError(f"The folder holds bundles of several models ({', '.join(models)}).", "name one: zoo generate MODEL ...")
    model = model or models[0]
    cfg = load_model_config(model)
    spec = get_spec(cfg)
    mine = [(p, m) for p, m in found if m.get("model") == model and m.get("status") == "passed"]
    targets = sorted({m.get("target") for _, m in mine})
    if target is None:
        required = {c.name for c in spec.components if not c.optional}
        complete = [t for t in targets if required <= {m.get("component") for _, m in mine if m.get("target") == t}]
        if len(complete) != 1:
            raise ZooError(f"Bundles for {', '.join(complete) or 'no target'} have every {model} component.",
                           "pick the target with --target coreai|litert (convert all components for it first).")
        target = complete[0]
    chosen = {}
    for component in spec.components:
        options = [(p, m) for p, m in mine if m.get("component") == component.name and m.get("target") == target]
        if len(options) > 1:
            default = default_precision(cfg, target, component.name)
            options = [(p, m) for p, m in options if m.get("precision") == default]
        if not options and component.optional:
            continue
        if len(options) != 1:
            raise ZooError(f"No single passed {model} {component.name} bundle for {target} under the folder "
                           f"({len(options)} candidates).",
                           f"convert it: make convert MODEL={model} TARGET={target} (or keep one precision per component).")
        chosen[component.name] = options[0][0]
    return model, target, chosen


def check_request(model: str, takes: tuple[str, ...], prompt: str | None, image: Path | None) -> None:
    """Refuse an input the model's pipeline does not take; ask for one it needs."""
    given = {"prompt": bool(prompt and prompt.strip()), "image": image is not None}
    for name, present in given.items():
        if present and name not in takes:
            needs = " and ".join(f"--{n}" for n in takes) or "no input (its conditioning is seeded: see its README)"
            raise ZooError(f"The {model} pipeline takes no --{name}; it takes {needs}.", f"drop --{name}.")
        if not present and name in takes:
            raise ZooError(f"The {model} pipeline needs --{name}.", f"pass --{name} " +
                           ('"some text"' if name == "prompt" else "PATH") + ".")
    if image is not None and not Path(image).is_file():
        raise ZooError(f"--image {image} is not a file.", "pass the path of an image file.")


def run(folder: Path, prompt: str | None, out: Path, model: str | None = None, target: str | None = None,
        seed: int | None = None, stream=sys.stdout, image: Path | None = None) -> str:
    from zoo.generate import open_session
    from zoo.registry import get_spec, load_model_config

    model, target, bundles = pick_bundles(find_bundles(folder), model, target)
    spec = get_spec(load_model_config(model))
    if spec.run_pipeline is None:
        raise ZooError(f"Model '{model}' has no multi-bundle pipeline.", "use --bundle PATH for a single generative bundle.")
    check_request(model, tuple(spec.pipeline_inputs), prompt, image)
    for name, bundle in bundles.items():
        integrity.verify_bundle(bundle)  # every file against its sha256, before a runtime parses any of it
        stream.write(f"using {name}: {bundle}\n")
    with contextlib.ExitStack() as stack:
        sessions = {name: stack.enter_context(open_session(bundle, integrity.read_manifest(bundle)))
                    for name, bundle in bundles.items()}
        extra = {"image": Path(image)} if "image" in spec.pipeline_inputs else {}
        summary = spec.run_pipeline(sessions, bundles, prompt if "prompt" in spec.pipeline_inputs else None, Path(out),
                                    seed, **extra)
    stream.write(summary + "\n")
    return summary
