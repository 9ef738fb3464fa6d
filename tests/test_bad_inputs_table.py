"""Every bad input, through the real command-line tools: exit 2, one paragraph naming the problem and
the fix, never a traceback (zoo/cli.py); every damaged bundle refused before a runtime opens it
(zoo/integrity.py).

Each row runs `python -m <module> <args>` as a subprocess. They run concurrently (4 at a time) from one
module-scoped fixture — each pays Python + torch start-up, ~2-4 s — while the tiny bundles some rows need
are converted (tests/tiny_bundles.py); the parametrized tests only read the collected results. Rows with
exit 0 are the positive controls: the same tools on the same (undamaged) inputs succeed, so a refusal
below is about the damage, not about the tool failing on everything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from tiny_bundles import ROOT, cli_env, copy_bundle, flip_byte, truncate

WORKERS = 4
TORCH_ADVICE = ("weights_only=False", "can still be loaded")  # torch's unpickling advice: never shown


@dataclass
class Case:
    id: str
    module: str
    args: Callable[["Workspace"], list[str]]
    needle: str | tuple[str, ...]     # must appear in stdout+stderr (whitespace-normalised)
    code: int = 2
    needs_bundles: bool = False
    absent: tuple[str, ...] = field(default_factory=tuple)  # must not appear


class Workspace:
    """Per-case inputs, each in its own folder: damaged copies of the session's tiny bundles, junk files."""

    def __init__(self, root: Path):
        self.root = root
        self.bundles: dict[str, Path] = {}

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def bundle(self, name: str) -> str:
        return str(self.bundles[name])

    def damaged(self, name: str, case: str, damage: Callable[[Path], None]) -> str:
        copy = copy_bundle(self.bundles[name], self.root / "damaged" / case)
        damage(copy)
        return str(copy)

    def file(self, case: str, name: str, content: bytes | str) -> str:
        path = self.folder(case) / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return str(path)

    def checkpoint(self, case: str, edit: Callable[[Path], None]) -> str:
        """A copy of the tiny T5 checkpoint folder, edited."""
        folder = self.root / "ckpt" / case
        shutil.copytree(ROOT / "models" / "t5" / "tiny", folder)
        edit(folder)
        return str(folder)

    def out(self, case: str) -> str:
        return f"out_dir={self.root / 'out' / case}"


# ---------------------------------------------------------------- damage and junk


def flip(rel: str):
    return lambda bundle: flip_byte(bundle / rel)


def cut(rel: str):
    return lambda bundle: truncate(bundle / rel)


def delete(rel: str):
    return lambda bundle: (bundle / rel).unlink()


def write(rel: str, text: str):
    return lambda bundle: (bundle / rel).write_text(text)


def edit_manifest(change: Callable[[dict], None]):
    def apply(bundle: Path):
        manifest = json.loads((bundle / "manifest.json").read_text())
        change(manifest)
        (bundle / "manifest.json").write_text(json.dumps(manifest))
    return apply


def junk_pickle(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(bytes(range(256)) * 4)


def rename_a_key(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.final_norm.weight"] = tensors.pop("encoder.final_layer_norm.weight")
    save_file(tensors, folder / "model.safetensors")


def generate(bundle: str, prompt: str = "The alphabet begins", *extra: str) -> list[str]:
    return ["--bundle", bundle, "--prompt", prompt, "--max-new-tokens", "4", *extra]


TINY = ["weights=tiny", "target=litert", "model.gpu.check=false"]

CASES = [
    # ---- zoo.convert: choices and Hydra overrides (refused before Hydra starts)
    Case("convert-unknown-model", "zoo.convert", lambda w: ["model=nope", w.out("a")], "Unknown model 'nope'"),
    Case("convert-unknown-target", "zoo.convert", lambda w: ["target=nope", w.out("b")], "Unknown target 'nope'"),
    Case("convert-unknown-precision", "zoo.convert", lambda w: ["precision=fp8", w.out("c")], "Unknown precision 'fp8'"),
    Case("convert-markup-in-target", "zoo.convert", lambda w: ["target=[coreai]", w.out("d")], "Unknown target '[coreai]'"),
    Case("convert-unclosed-bracket", "zoo.convert", lambda w: ["target=[coreai", w.out("e")], "Unknown target '[coreai'"),
    Case("convert-empty-model", "zoo.convert", lambda w: ["model=", w.out("f")], "'model=' needs a value. Valid: gqa-llm, ltx-video, rf-detr, t5, triposplat"),
    Case("convert-empty-precision", "zoo.convert", lambda w: ["precision=", w.out("g")], "'precision=' needs a value"),
    Case("convert-unknown-key", "zoo.convert", lambda w: ["foo=bar", w.out("h")], "Unknown config key 'foo'"),
    Case("convert-unknown-model-key", "zoo.convert", lambda w: ["model.nope=1", w.out("i")], "Unknown config key 'model.nope'"),
    Case("convert-override-without-value", "zoo.convert", lambda w: ["+x", w.out("j")], "Cannot parse the command-line override '+x'"),
    Case("convert-override-unbalanced", "zoo.convert", lambda w: ["model.seq_len=[1", w.out("k")], "Cannot parse the command-line override 'model.seq_len=[1'"),
    Case("convert-override-bare-bracket-path", "zoo.convert", lambda w: ["weights=local:/data/[v2]/ckpt", w.out("l")], "Cannot parse the command-line override 'weights=local:/data/[v2]/ckpt'"),
    Case("convert-seq-len-abc", "zoo.convert", lambda w: ["model=t5", "model.seq_len=abc", w.out("m")], "wrong type at 'model.seq_len'"),
    Case("convert-seq-len-list", "zoo.convert", lambda w: ["model.seq_len=[1,2]", w.out("n")], "wrong type at 'model.seq_len'"),
    Case("convert-bool-maybe", "zoo.convert", lambda w: ["model.gpu.check=maybe", w.out("o")], "wrong type at 'model.gpu.check'"),
    Case("convert-sweep-without-multirun", "zoo.convert", lambda w: ["model=t5,gqa-llm", w.out("p")], "Ambiguous value for argument 'model=t5,gqa-llm'"),
    Case("convert-multirun-one-bad-job", "zoo.convert", lambda w: ["-m", "model.seq_len=16,abc", w.out("q")], "wrong type at 'model.seq_len'"),
    Case("convert-unknown-variant", "zoo.convert", lambda w: ["model.variant=nope", "weights=random", w.out("r")], "variant: 'nope' is not one of"),
    Case("convert-litert-bf16", "zoo.convert", lambda w: ["target=litert", "precision=bf16", w.out("s")], "cannot honour precision 'bf16'"),
    # ---- zoo.convert: weights
    Case("convert-unknown-weights", "zoo.convert", lambda w: [*TINY, "weights=nope", w.out("t")], "Unknown weights source 'nope'"),
    Case("convert-weights-local-without-path", "zoo.convert", lambda w: [*TINY, "weights=local:", w.out("u")], "needs a path"),
    Case("convert-weights-missing-folder", "zoo.convert", lambda w: [*TINY, f"weights=local:{w.root}/nowhere", w.out("v")], "nowhere is not a checkpoint folder"),
    Case("convert-weights-markup-path", "zoo.convert", lambda w: [*TINY, f"weights='local:{w.root}/[v2]/ckpt'", w.out("w")], "[v2]/ckpt is not a checkpoint folder"),
    Case("convert-junk-pytorch-bin", "zoo.convert", lambda w: [*TINY, f"weights=local:{w.checkpoint('junk', junk_pickle)}", w.out("x")],
         "pytorch_model.bin is not a valid checkpoint", absent=TORCH_ADVICE),
    Case("convert-truncated-safetensors", "zoo.convert", lambda w: [*TINY, f"weights=local:{w.checkpoint('cut', lambda f: truncate(f / 'model.safetensors'))}", w.out("y")],
         "model.safetensors is corrupt or truncated"),
    Case("convert-config-json-malformed", "zoo.convert", lambda w: [*TINY, f"weights=local:{w.checkpoint('json', lambda f: (f / 'config.json').write_text('{oops'))}", w.out("z")],
         "config.json is not valid JSON"),
    Case("convert-other-models-checkpoint", "zoo.convert", lambda w: ["model=t5", *TINY, f"weights=local:{ROOT}/models/gqa_llm/tiny", w.out("aa")],
         "does not fit model 't5'"),
    Case("convert-t5-checkpoint-for-the-llm", "zoo.convert", lambda w: ["model=gqa-llm", *TINY, f"weights=local:{ROOT}/models/t5/tiny", w.out("ab")],
         "does not fit model 'gqa-llm'"),
    Case("convert-renamed-key", "zoo.convert", lambda w: [*TINY, f"weights=local:{w.checkpoint('keys', rename_a_key)}", w.out("ac")], "keys do not match"),
    Case("convert-out-dir-under-a-file", "zoo.convert", lambda w: [*TINY, f"out_dir={w.file('ad', 'a-file', 'x')}/exports"], "is not writable"),
    # ---- zoo.bench: the same boundary
    Case("bench-unknown-model", "zoo.bench", lambda w: ["model=nope"], "Unknown model 'nope'"),
    Case("bench-override-without-value", "zoo.bench", lambda w: ["+x"], "Cannot parse the command-line override '+x'"),
    Case("bench-seq-len-abc", "zoo.bench", lambda w: ["model.seq_len=abc"], "wrong type at 'model.seq_len'"),
    Case("bench-unknown-key", "zoo.bench", lambda w: ["foo=bar"], "Unknown config key 'foo'"),
    Case("bench-unknown-variant", "zoo.bench", lambda w: ["model.variant=nope"], "variant: 'nope' is not one of"),
    Case("demo-unknown-key", "zoo.demo", lambda w: ["foo=bar"], "Unknown config key 'foo'"),
    # ---- zoo.targets.litert_gpu
    Case("gpu-missing-file", "zoo.targets.litert_gpu", lambda w: [f"{w.root}/nowhere.tflite"], "nowhere.tflite does not exist"),
    Case("gpu-folder", "zoo.targets.litert_gpu", lambda w: [str(w.folder("gpu-folder"))], "is a folder, not a .tflite file"),
    Case("gpu-not-a-tflite", "zoo.targets.litert_gpu", lambda w: [w.file("gpu-json", "model.tflite", '{"a": 1}')], "is not a LiteRT/TensorFlow Lite model"),
    Case("gpu-empty-file", "zoo.targets.litert_gpu", lambda w: [w.file("gpu-empty", "model.tflite", b"")], "is not a LiteRT/TensorFlow Lite model"),
    Case("gpu-bundle-folder", "zoo.targets.litert_gpu", lambda w: [w.bundle("t5-litert")], "model.tflite", needs_bundles=True),
    Case("gpu-flipped-byte-in-bundle", "zoo.targets.litert_gpu", lambda w: [w.damaged("t5-litert", "gpu-flip", flip("model.tflite")) + "/model.tflite"],
         "model.tflite has sha256", needs_bundles=True),
    # ---- zoo.generate
    Case("generate-empty-prompt", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-litert"), ""), "The prompt is empty", needs_bundles=True),
    Case("generate-blank-prompt", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-litert"), "   "), "The prompt is empty", needs_bundles=True),
    Case("generate-no-new-tokens", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-litert"), "Hi", "--max-new-tokens", "0"), "asks for no text", needs_bundles=True),
    Case("generate-missing-bundle", "zoo.generate", lambda w: generate(f"{w.root}/nowhere"), "nowhere does not exist"),
    Case("generate-markup-in-path", "zoo.generate", lambda w: generate(f"{w.root}/[v2]/bundle"), "[v2]/bundle does not exist"),
    Case("generate-bundle-is-a-file", "zoo.generate", lambda w: generate(w.file("gen-file", "bundle", "x")), "is a file, not a bundle folder"),
    Case("generate-no-manifest", "zoo.generate", lambda w: generate(str(w.folder("gen-empty"))), "has no manifest.json"),
    Case("generate-corrupt-manifest", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-coreai", "gen-json", write("manifest.json", '{"model": "gqa-llm", '))),
         "manifest.json is not valid JSON", needs_bundles=True),
    Case("generate-manifest-not-an-object", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-coreai", "gen-list", write("manifest.json", "[]"))),
         "holds a JSON list", needs_bundles=True),
    Case("generate-manifest-without-files", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-litert", "gen-nofiles", edit_manifest(lambda m: m.pop("files")))),
         "lists no files", needs_bundles=True),
    Case("generate-one-shot-bundle", "zoo.generate", lambda w: generate(w.bundle("t5-litert")), "does not generate text", needs_bundles=True),
    Case("generate-flipped-byte-mlirb", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-coreai", "gen-flip", flip("model.aimodel/main.mlirb"))),
         "model.aimodel/main.mlirb has sha256", needs_bundles=True),
    Case("generate-truncated-mlirb", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-coreai", "gen-cut", cut("model.aimodel/main.mlirb"))),
         ("model.aimodel/main.mlirb is", "(truncated)"), needs_bundles=True),
    Case("generate-missing-aimodel-file", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-coreai", "gen-del", delete("model.aimodel/metadata.json"))),
         "model.aimodel/metadata.json is missing", needs_bundles=True),
    Case("generate-flipped-byte-tflite", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-litert", "gen-flip-tfl", flip("model.tflite"))),
         "model.tflite has sha256", needs_bundles=True),
    Case("generate-truncated-tflite", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-litert", "gen-cut-tfl", cut("model.tflite"))),
         ("model.tflite is", "(truncated)"), needs_bundles=True),
    Case("generate-flipped-byte-tokenizer", "zoo.generate", lambda w: generate(w.damaged("gqa-llm-litert", "gen-tok", flip("tokenizer/tokenizer.json"))),
         "tokenizer/tokenizer.json has sha256", needs_bundles=True),
    Case("generate-missing-tokenizer-override", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-litert"), "Hi", "--tokenizer", f"{w.root}/no-tok"),
         "No tokenizer at", needs_bundles=True),
    Case("generate-intact-coreai", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-coreai")), "The alphabet begins", code=0, needs_bundles=True),
    Case("generate-intact-litert", "zoo.generate", lambda w: generate(w.bundle("gqa-llm-litert")), "The alphabet begins", code=0, needs_bundles=True),
    # ---- zoo.verify
    Case("verify-intact-coreai", "zoo.verify", lambda w: [w.bundle("t5-coreai")], "match the manifest (sha256 of every file)", code=0, needs_bundles=True),
    Case("verify-intact-fast", "zoo.verify", lambda w: [w.bundle("gqa-llm-litert"), "--fast"], "match the manifest (sizes of every file", code=0, needs_bundles=True),
    Case("verify-flipped-byte", "zoo.verify", lambda w: [w.damaged("t5-coreai", "ver-flip", flip("model.aimodel/main.mlirb"))],
         "model.aimodel/main.mlirb has sha256", needs_bundles=True),
    Case("verify-truncated", "zoo.verify", lambda w: [w.damaged("t5-litert", "ver-cut", cut("model.tflite"))], ("model.tflite is", "(truncated)"), needs_bundles=True),
    Case("verify-truncated-fast", "zoo.verify", lambda w: [w.damaged("t5-litert", "ver-cut-fast", cut("model.tflite")), "--fast"], ("model.tflite is", "(truncated)"), needs_bundles=True),
    Case("verify-missing-manifest", "zoo.verify", lambda w: [w.damaged("t5-litert", "ver-noman", delete("manifest.json"))], "has no manifest.json", needs_bundles=True),
    Case("verify-corrupt-manifest", "zoo.verify", lambda w: [w.damaged("t5-litert", "ver-json", write("manifest.json", "{"))], "manifest.json is not valid JSON", needs_bundles=True),
    Case("verify-manifest-omits-artifact", "zoo.verify", lambda w: [w.damaged("t5-litert", "ver-omit", edit_manifest(lambda m: m["files"].pop("model.tflite")))],
         "does not list the artifact model.tflite", needs_bundles=True),
    Case("verify-missing-folder", "zoo.verify", lambda w: [f"{w.root}/nowhere"], "nowhere does not exist"),
]


def run_case(case: Case, workspace: Workspace) -> dict:
    args = case.args(workspace)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", case.module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=cli_env())
    return {"args": args, "code": proc.returncode, "out": proc.stdout + proc.stderr,
            "seconds": round(time.monotonic() - started, 1)}


@pytest.fixture(scope="module")
def outcomes(tiny_bundles, tmp_path_factory) -> dict[str, dict]:
    """Every case's exit code and output. Rows that need no bundle run while the bundles convert."""
    workspace = Workspace(tmp_path_factory.mktemp("bad-inputs"))
    tiny_bundles.start()
    results = {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        early = {c.id: pool.submit(run_case, c, workspace) for c in CASES if not c.needs_bundles}
        workspace.bundles = tiny_bundles.wait()
        late = {c.id: pool.submit(run_case, c, workspace) for c in CASES if c.needs_bundles}
        for case_id, future in {**early, **late}.items():
            results[case_id] = future.result()
    return results


def test_the_table_is_big_enough():
    refusals = [c for c in CASES if c.code == 2]
    assert len(refusals) >= 40 and len({c.id for c in CASES}) == len(CASES)
    assert {c.module for c in refusals} == {"zoo.convert", "zoo.bench", "zoo.demo", "zoo.generate",
                                            "zoo.targets.litert_gpu", "zoo.verify"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_paragraph(outcomes, case):
    result = outcomes[case.id]
    out = " ".join(result["out"].split())
    context = f"python -m {case.module} {' '.join(result['args'])} -> {result['code']} ({result['seconds']} s)\n{result['out'][-3000:]}"
    assert result["code"] == case.code, context
    assert "Traceback" not in out, context
    for needle in (case.needle,) if isinstance(case.needle, str) else case.needle:
        assert needle in out, context
    if case.code == 2:
        assert "error:" in out and "Fix:" in out, context
    for text in case.absent:
        assert text not in out, context
