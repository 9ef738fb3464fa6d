"""`python -m zoo.generate --bundle PATH --prompt "..."`: stream text from a converted bundle.

Runs the bundle itself (Core AI CPU runtime or LiteRT CPU interpreter, whichever its manifest names)
with greedy decoding and the tokenizer shipped inside the bundle; `--runtime NAME` runs another file of the
bundle on another runtime instead, one the component declares (`Component.runtimes`, e.g. `litert-lm`).
Which bundles can generate is read from the manifest (`session: generative`, written by the pipeline from
the component's declaration), and the session that drives it is the component's own `session` hook: no
model names here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import zoo.quiet  # noqa: F401
from zoo import integrity
from zoo.cli import returns_exit_code, run_script
from zoo.errors import ZooError

def read_manifest(bundle: Path, model: str | None = None) -> dict:
    manifest = integrity.read_manifest(bundle)  # missing, unreadable or malformed: a clear error
    if model and manifest.get("model") != model:
        raise ZooError(f"{bundle} is a '{manifest.get('model')}' bundle, not '{model}'.", f"pass a {model} bundle.")
    if manifest.get("session") != "generative":
        raise ZooError(f"{bundle} holds a '{manifest.get('model')}' {manifest.get('component')} bundle, which does "
                       "not generate text (its manifest's session is "
                       f"'{manifest.get('session', 'one_shot')}').",
                       "pass a bundle of a generative model (`zoo list` shows them), e.g. exports/gqa-llm/coreai-fp32.")
    return manifest


def load_bundle_tokenizer(bundle: Path, override: str | None):
    from transformers import AutoTokenizer

    folder = Path(override) if override else bundle / "tokenizer"
    if not (folder / "tokenizer_config.json").is_file():
        raise ZooError(f"No tokenizer at {folder}.", "pass --tokenizer PATH, or re-convert: bundles ship their tokenizer.")
    return AutoTokenizer.from_pretrained(folder)


@contextlib.contextmanager
def open_session(bundle: Path, manifest: dict):
    """The bundle's artifact on its target's runner, driven by its component's own session."""
    from zoo.registry import get_spec, load_model_config
    from zoo.targets import get_target

    component = get_spec(load_model_config(manifest["model"])).component(manifest["component"])
    target = get_target(manifest["target"])
    artifact = bundle / target.artifact
    if not artifact.exists():
        raise ZooError(f"{bundle} holds no {target.artifact}.", "pass a complete bundle folder made by `zoo convert`.")
    runner = target.open(artifact)
    try:
        with component.session(runner, target.name) as session:
            yield session
    finally:
        runner.close()


def runtime_session(bundle: Path, manifest: dict, runtime: str):
    """A session of one of the component's other runtimes (`Component.runtimes`) over this bundle."""
    from zoo.registry import get_spec, load_model_config

    component = get_spec(load_model_config(manifest["model"])).component(manifest["component"])
    if runtime not in component.runtimes:
        known = ", ".join(component.runtimes) or "none"
        raise ZooError(f"A {manifest['model']} bundle has no runtime '{runtime}' (other runtimes: {known}).",
                       "drop --runtime to use the bundle's own target runtime, or pick one of those.")
    return component.runtimes[runtime](bundle)


def generate_on_runtime(session, prompt: str, max_new_tokens: int, tokenizer, out) -> list[int]:
    """A runtime that generates text itself (no logits reach us): print its chunks as they come."""
    text = ""
    with session:
        for chunk in session.stream_text(prompt, max_new_tokens):
            out.write(chunk)
            out.flush()
            text += chunk
    out.write("\n")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generate(bundle: Path, prompt: str, max_new_tokens: int, tokenizer_path: str | None = None,
             model: str | None = None, out=sys.stdout, runtime: str | None = None) -> list[int]:
    """Greedy tokens after the prompt, written to `out` as they come."""
    import numpy as np

    from zoo.generation import ContextOverflow

    require_prompt(prompt)
    manifest = read_manifest(bundle, model)
    integrity.verify_bundle(bundle)  # every file against its sha256, before the runtime parses any of it
    if manifest.get("status") != "passed":
        print(f"warning: this bundle did not pass its gates (status: {manifest.get('status')})", file=sys.stderr)
    tokenizer = load_bundle_tokenizer(bundle, tokenizer_path)
    if runtime:
        return generate_on_runtime(runtime_session(bundle, manifest, runtime), prompt, max_new_tokens, tokenizer, out)
    ids = tokenizer(prompt)["input_ids"]
    tokens: list[int] = []
    with open_session(bundle, manifest) as session:
        try:
            logits = session.step(ids, 0)
            if len(logits) != len(tokenizer):
                raise ZooError(
                    f"Wrong tokenizer for this bundle: it has {len(tokenizer)} tokens, the bundle predicts over {len(logits)}.",
                    "drop --tokenizer to use the one shipped in the bundle, or pass the model's own tokenizer.")
            shown = ""
            for position in range(len(ids), len(ids) + max_new_tokens):
                token = int(np.argmax(logits))
                tokens.append(token)
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                out.write(text[len(shown):])
                out.flush()
                shown = text
                if token == tokenizer.eos_token_id:
                    break
                logits = session.step([token], position)
        except ContextOverflow as exc:
            raise ZooError(f"The prompt ({len(ids)} tokens) plus {max_new_tokens} new tokens does not fit this bundle's "
                           f"exported context of {session.context_len} tokens ({exc}).",
                           "shorten the prompt or --max-new-tokens, or re-convert with model.context_len=<larger>.") from exc
    out.write("\n")
    return tokens


def require_prompt(prompt: str) -> None:
    if not prompt.strip():
        raise ZooError("The prompt is empty: there is nothing to continue from.",
                       'pass some text, e.g. --prompt "The capital of France is".')


@returns_exit_code
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.generate", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="optional: refuse a bundle of any other model")
    parser.add_argument("--bundle", type=Path, help="one generative bundle (an LLM)")
    parser.add_argument("--bundles", type=Path, help="a converted model's folder: its bundles chained by the model's "
                        "own host-side pipeline (e.g. LTX-Video: text -> frames; zoo/generate_pipeline.py)")
    parser.add_argument("--out", type=Path, help="with --bundles: the file to write (e.g. clip.gif)")
    parser.add_argument("--target", choices=["coreai", "litert"], help="with --bundles: which target's bundles")
    parser.add_argument("--seed", type=int, help="with --bundles: sampler seed (default: the bundle's)")
    parser.add_argument("--prompt", help="the text to continue (--bundle), or a text-conditioned pipeline's prompt")
    parser.add_argument("--image", type=Path, help="with --bundles: an image-conditioned pipeline's input image")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the one shipped in the bundle)")
    parser.add_argument("--runtime", help="run another file of the bundle on another runtime its model declares "
                                          "(e.g. litert-lm: an LLM bundle's model.litertlm)")
    args = parser.parse_args(argv)
    if (args.bundle is None) == (args.bundles is None):
        raise ZooError("Pass exactly one of --bundle (a generative bundle) and --bundles (a model's converted folder).",
                       "e.g. --bundle exports/gqa-llm/coreai-fp32, or --bundles exports/ltx-video --out clip.gif.")
    if args.bundles is not None:
        from zoo import generate_pipeline

        if args.out is None:
            raise ZooError("--bundles needs --out: where to write what the pipeline makes.", "add e.g. --out clip.gif.")
        generate_pipeline.run(args.bundles, args.prompt, args.out, args.model, args.target, args.seed, image=args.image)
        return 0
    if args.image is not None:
        raise ZooError("--image goes with --bundles (an image-conditioned pipeline); a --bundle LLM takes --prompt.",
                       "drop --image, or pass --bundles DIR.")
    require_prompt(args.prompt or "")
    if args.max_new_tokens < 1:
        raise ZooError(f"--max-new-tokens {args.max_new_tokens} asks for no text.", "pass a positive count, e.g. --max-new-tokens 32.")
    print(args.prompt, end="", flush=True)
    try:
        generate(args.bundle, args.prompt, args.max_new_tokens, args.tokenizer, args.model, runtime=args.runtime)
    except BaseException:  # nothing swallowed: the newline only ends the echoed prompt, then it re-raises
        print(flush=True)  # so the boundary's error (or the Ctrl-C line) starts on its own line
        raise
    return 0


if __name__ == "__main__":
    run_script(main, sys.argv[1:])
