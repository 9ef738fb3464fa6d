"""Regenerate docs/gpu-table.md: every rewrite, before and after, converted and run on the GPU delegate.

    python scripts/gpu_table.py                 # all rewrites -> docs/gpu-table.md
    python scripts/gpu_table.py --only relu_0_to_1 edge_pad --out /tmp/t.md

For each rewrite in zoo.rewrites.REWRITES: its demo's original and rewritten module are converted with
litert-torch, the .tflite op list and max rank are read back, and the LiteRT GPU delegate (WebGPU on
software Vulkan, zoo.targets.litert_gpu) creates and runs both — fp32 and fp16 compute — against the CPU
interpreter. The measuring code is zoo.rewrites.evidence, the same the tests assert on.

Refuses to write a table without a working GPU check (run scripts/setup_vulkan.sh): the committed table
must come from a real run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from zoo.rewrites import REWRITES, attention, resampling  # noqa: E402
from zoo.rewrites import inspect as tfl  # noqa: E402
from zoo.rewrites.base import Lambda  # noqa: E402
from zoo.rewrites.evidence import Evidence, GpuEvidence, collect, collect_gpu, gpu_inputs, worst  # noqa: E402

DEFAULT_OUT = REPO / "docs" / "gpu-table.md"


# --- formatting ----------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if x != x:
        return "NaN"
    return "0" if x == 0 else f"{x:.1e}"


def _ops(ops: list[str], flagged: set[str]) -> str:
    """Distinct ops in first-seen order; the ones a detector flagged in bold."""
    seen = list(dict.fromkeys(ops))
    return ", ".join(f"**{o}**" if o in flagged else o for o in seen) or "–"


def _flagged_ops(findings: list[str]) -> set[str]:
    return {f.split("[", 1)[0].split(" ")[-1] for f in findings} | {f.split(" with ")[0] for f in findings}


def _verdict(check) -> str:
    if check is None:
        return "not converted"
    if check.status == "rejected":
        ops = sorted({o["op"] for o in check.rejected_ops})
        return "**rejected**" + (f" ({', '.join(ops)})" if ops else "")
    if check.status == "not_run":
        return f"not run ({check.reason})"
    fp32 = worst(check, "fp32_rel_err")
    wrong = fp32 is None or fp32 != fp32 or fp32 > 1e-5
    return "accepted, **wrong**" if wrong else "accepted"


def _errors(check) -> str:
    if check is None or check.status != "accepted":
        return "–"
    return f"{_num(worst(check, 'fp32_rel_err'))} / {_num(worst(check, 'fp16_rel_err'))}"


def _side_ops(side) -> str:
    if not side.converted:
        return f"conversion fails: `{side.convert_error[:90]}`"
    return _ops(side.ops, _flagged_ops(side.findings + side.lint))


def summary_row(ev: Evidence, gpu: GpuEvidence) -> str:
    rw = ev.rewrite
    status = "needed" if rw.needed else "not needed"
    if not rw.reproduces_on_checker:
        status += " (not reproducible here)"
    cells = [
        f"`{rw.id}`",
        status,
        f"{rw.exactness} ({_num(ev.torch_error / max(1.0, ev.reference_scale))})",
        _side_ops(ev.before),
        str(ev.before.max_rank) if ev.before.converted else "–",
        _verdict(gpu.before),
        _errors(gpu.before),
        _side_ops(ev.after),
        str(ev.after.max_rank),
        _verdict(gpu.after),
        _errors(gpu.after),
    ]
    return "| " + " | ".join(cells) + " |"


def detail(ev: Evidence, gpu: GpuEvidence) -> list[str]:
    rw = ev.rewrite
    lines = [f"### `{rw.id}` ({rw.family})", "", f"- fixes: {rw.fixes}", f"- targets: {', '.join(rw.targets)}"]
    if rw.upstream:
        lines.append(f"- upstream: {rw.upstream}")
    if rw.notes:
        lines.append(f"- notes: {rw.notes}")
    if gpu.stressed:
        lines.append(
            "- GPU inputs: the demo's fp16 stress inputs (`Demo.stress_args`), chosen to break the original in fp16"
        )
    for name, side, check in (("before", ev.before, gpu.before), ("after", ev.after, gpu.after)):
        found = side.findings + [f for f in side.lint if f not in side.findings]
        lines.append(
            f"- {name}: {'; '.join(found[:3]) + (' …' if len(found) > 3 else '') if found else 'no known GPU trap in the file'}"
        )
        if check is not None and check.rejected_ops:
            reasons = "; ".join(f"{o['op']}: {o['reason']}" for o in check.rejected_ops[:4])
            lines.append(f"  - delegate: {reasons}")
    return lines + [""]


# --- extra probes: facts the tests rely on that are not a rewrite's own demo ---------------------------


def probes() -> list[tuple[str, torch.nn.Module, tuple]]:
    gqa, gqa_args = attention._tiny_gqa(kv_form="cat_expand", expand_mask=True)
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    neg_inf_pool = Lambda(
        lambda t: F.max_pool2d(F.pad(t, (1, 1, 1, 1), value=float("-inf")), 3, 2), "pad(-inf) + max_pool2d"
    )
    finite_pool = Lambda(
        lambda t: F.max_pool2d(F.pad(t, (1, 1, 1, 1), value=resampling.POOL_PAD_VALUE), 3, 2),
        "pad(-65504) + max_pool2d",
    )
    repl = torch.nn.Sequential(torch.nn.ReplicationPad2d(2))
    return [
        ("seed's repeat_kv fix `cat([x[:, i:i+1].expand(...)])`", gqa, gqa_args),
        ("`F.pad(value=-inf)` then `max_pool2d` (NCHW)", neg_inf_pool, (x,)),
        ("`F.pad(value=-65504)` then `max_pool2d` (NCHW)", finite_pool, (x,)),
        ("`nn.ReplicationPad2d` (rank 4)", repl, (x,)),
    ]


def probe_row(name: str, module: torch.nn.Module, args: tuple, workdir: Path) -> str:
    from zoo.targets.litert_gpu import gpu_check

    path = tfl.convert_to_tflite(module, args, workdir / f"probe{abs(hash(name))}.tflite")
    check = gpu_check(path, gpu_inputs(args))
    lint = tfl.gpu_lint(path)
    return f"| {name} | {_ops(tfl.ops_in_tflite(path), _flagged_ops(lint))} | {tfl.max_tensor_rank(path)} | {_verdict(check)} | {_errors(check)} |"


# --- the page ----------------------------------------------------------------------------------------


def header(argv: list[str], adapter: str, seconds: float) -> list[str]:
    mesa = "unknown"
    manifest = Path(os.environ.get("ZOO_VULKAN_DIR", REPO / ".cache" / "vulkan")) / "MANIFEST"
    if manifest.is_file():
        mesa = next(
            (line.split()[1] for line in manifest.read_text().splitlines() if line.startswith("mesa-vulkan-drivers")),
            mesa,
        )
    tools = ", ".join(f"{p} {version(p)}" for p in ("torch", "litert-torch", "ai-edge-litert", "jax", "jaxlib"))
    return [
        "# LiteRT GPU table: every rewrite, before and after",
        "",
        "<!-- generated by scripts/gpu_table.py — do not edit by hand -->",
        "",
        f"- generated: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, in {seconds:.0f} s, on {platform.machine()} Linux "
        f"({os.cpu_count()} cores)",
        f"- command: `{' '.join(['python', 'scripts/gpu_table.py'] + argv)}`",
        f"- tools: {tools}, Python {platform.python_version()}",
        f"- GPU check: `zoo.targets.litert_gpu.gpu_check` — LiteRT WebGPU accelerator, GPU-only (no CPU fallback), "
        f"on {adapter}, Mesa {mesa} (lavapipe); each model run with fp32 and with fp16 compute and compared with the "
        "CPU interpreter on the same inputs",
        "",
        "How to read it. *before* is the original pattern (the rewrite's `demo().before`), *after* the rewrite "
        "applied; both converted with `litert_torch.convert(module, args).export(path)`. Ops are the distinct "
        "builtin ops of the .tflite in first-seen order, in **bold** where a detector in `zoo.rewrites.inspect` "
        "flags them. Errors are max |GPU − CPU| / max |CPU| over all outputs, fp32 / fp16 compute. "
        '"accepted, **wrong**" means the delegate took every op and returned numbers off by more than 1e-5 in fp32. '
        "Exactness is the rewrite's class, with the measured max |after − before| / max(1, max |before|) in fp32 torch. "
        '"not reproducible here": the failure is real elsewhere (older runtime, phone delegate, device-only '
        "bug) but this checker passes the original; see the details.",
        "",
        "This is the WebGPU backend on a CPU, not a phone's OpenCL delegate: a pass is necessary, not sufficient.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", help="rewrite ids (default: all)")
    args = parser.parse_args(argv)

    from zoo.targets.litert_gpu import gpu_available

    ok, adapter = gpu_available()
    if not ok:
        print(f"gpu_table: the GPU check cannot run ({adapter}); run scripts/setup_vulkan.sh", file=sys.stderr)
        return 2
    ids = args.only or sorted(REWRITES, key=lambda i: (REWRITES[i].family, i))
    start = time.monotonic()
    rows, details = [], []
    with tempfile.TemporaryDirectory(prefix="zoo-gpu-table-") as tmp:
        workdir = Path(tmp)
        for rid in ids:
            print(f"[gpu_table] {rid}", file=sys.stderr, flush=True)
            ev = collect(REWRITES[rid], workdir)
            gpu = collect_gpu(ev)
            rows.append(summary_row(ev, gpu))
            details += detail(ev, gpu)
        probe_rows = [probe_row(name, m, a, workdir) for name, m, a in probes()] if not args.only else []

    lines = header(argv, adapter.removeprefix("adapter: "), time.monotonic() - start)
    lines += [
        "## Rewrites",
        "",
        "| rewrite | status | exactness (torch err) | before: ops emitted | rank | GPU verdict | fp32 / fp16 err "
        "| after: ops emitted | rank | GPU verdict | fp32 / fp16 err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if probe_rows:
        lines += [
            "## Probes",
            "",
            "| pattern | ops emitted | rank | GPU verdict | fp32 / fp16 err |",
            "|---|---|---|---|---|",
            *probe_rows,
            "",
        ]
    lines += ["## Details", "", *details]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    print(f"[gpu_table] wrote {args.out} ({len(rows)} rewrites) in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
