"""LTX-Video at real size on this machine: convert the 28-layer 2B DiT and the real 0.9.0 / 0.9.1 VAE decoders
on both targets (seeded random weights of the real architectures: the Hub is not reachable here, and conversion
time, peak RSS and size do not depend on the weight values), and check real-size numerics per block.

    python scripts/ltx_video_real_size.py                 # the whole table (~1 h here), README block regenerated
    python scripts/ltx_video_real_size.py --only dit --targets litert --layers 2   # a quick look

Each row runs in a fresh process (its peak RSS is its own). What makes the 2B DiT fit in 24 GB (models.md):
Core AI — the torch module and the exported program are released before the program is saved (raw: ~26 GB fp32);
LiteRT — litert-torch's lightweight (lazy-constant) conversion (raw: ~24 GB), the shared target's
`litert.lightweight_conversion: auto`. Numerics at real size are checked per block, because one full DiT step
on the Core AI CPU runtime takes ~50 min here (models.md): one real-width DiT layer at the real token count and
CFG batch, and each real decoder at full channel width on a small latent, converted, run and compared with eager.
Results: models/ltx_video/real_size.json and the README block between the real-size markers.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo.cli import run_script  # noqa: E402

RESULTS = ROOT / "models" / "ltx_video" / "real_size.json"
README = ROOT / "models" / "ltx_video" / "README.md"
START, END = "<!-- real-size:start -->", "<!-- real-size:end -->"
REAL_VIDEO = {"frames": 65, "height": 512, "width": 704, "frame_rate": 25}   # 9 x 16 x 22 = 3168 latent tokens
PROMPT_TOKENS = 128
GPU_CHUNK = 256   # DiT query chunk: the real 3168-token score tensor exceeds the GPU's 128 MiB buffers (models.md)

# (component, variant, target, precision): what ships. Core AI DiT fp32 would peak ~18.6 GB even with the
# release (models.md), too close to 24 GB next to anything else; LiteRT has no bf16.
MATRIX = [
    ("dit", "0.9.0", "coreai", "bf16"), ("dit", "0.9.0", "coreai", "fp16"),
    ("dit", "0.9.0", "litert", "fp32"),
    ("vae-decoder", "0.9.0", "coreai", "fp32"), ("vae-decoder", "0.9.0", "coreai", "fp16"),
    ("vae-decoder", "0.9.0", "litert", "fp32"), ("vae-decoder", "0.9.0", "litert", "fp16"),
    ("vae-decoder", "0.9.1", "coreai", "fp16"), ("vae-decoder", "0.9.1", "litert", "fp32"),
    # last: litert-quantizer holds the whole 7.7 GB fp32 flatbuffer and its fp16 copy in memory
    ("dit", "0.9.0", "litert", "fp16"),
]
# Per-block numerics: fp32 both targets, eager port vs the saved artifact on the same seeded inputs.
BLOCKS = [("dit", "0.9.0"), ("vae-decoder", "0.9.0"), ("vae-decoder", "0.9.1")]
BLOCK_LATENT = (2, 4, 4)   # latent frames, height, width for the decoder block check (full channel width)


def model_config(variant: str, layers: int | None = None):
    """The ltx-video config at a real variant and the real video size."""
    from omegaconf import OmegaConf

    from zoo.config import compose_convert

    cfg = compose_convert(["model=ltx-video", f"model.variant={variant}"]).model
    cfg = OmegaConf.merge(cfg, {"video": REAL_VIDEO, "attention_chunk": GPU_CHUNK})
    return cfg


def architecture_configs(cfg) -> dict:
    """diffusers' full config dicts for the variant's DiT and VAE, built on the meta device (no weights)."""
    import torch
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from omegaconf import OmegaConf

    arch = OmegaConf.to_container(cfg.variants[cfg.variant].architecture, resolve=True)
    with torch.device("meta"):
        return {"transformer": dict(LTXVideoTransformer3DModel(**arch["transformer"]).config),
                "vae": dict(AutoencoderKLLTXVideo(**arch["vae"]).config)}


def build(component: str, variant: str, layers: int | None, seed: int = 0):
    """(module, example inputs, output names) at real size with seeded random weights."""
    import torch

    import models.ltx_video as ltx
    from models.ltx_video.dit import DiTConfig, LTXDiT, timestep_projection
    from models.ltx_video.vae import DecoderConfig, RankFourDecoder

    cfg = model_config(variant)
    configs = architecture_configs(cfg)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if component == "dit":
        dit_cfg = DiTConfig.from_diffusers(configs["transformer"])
        if layers:
            dit_cfg = DiTConfig(**{**dit_cfg.__dict__, "num_layers": layers})
        from zoo.weights import Checkpoint
        grid = ltx.video_grid(Checkpoint("random", {"vae": configs["vae"]}, {}, {}), cfg)
        module = LTXDiT(dit_cfg, grid, int(cfg.attention_chunk)).eval()
        tokens = grid.frames * grid.height * grid.width
        inputs = {"hidden_states": torch.randn(2, tokens, dit_cfg.in_channels, generator=generator),
                  "encoder_hidden_states": torch.randn(2, PROMPT_TOKENS, dit_cfg.caption_channels, generator=generator),
                  "encoder_attention_mask": torch.ones(2, PROMPT_TOKENS),
                  "timestep_projection": timestep_projection(torch.tensor([500.0, 500.0]))}
        return module, inputs, ["noise_pred"]
    dec_cfg = DecoderConfig.from_diffusers(configs["vae"])
    module = RankFourDecoder(dec_cfg).eval()
    tc, sc = ltx.compression(configs["vae"])
    if layers:   # the per-block check: full channel width on a small latent
        frames, height, width = BLOCK_LATENT
    else:
        frames = (REAL_VIDEO["frames"] - 1) // tc + 1
        height, width = REAL_VIDEO["height"] // sc, REAL_VIDEO["width"] // sc
    inputs = {"latents": torch.randn(frames, dec_cfg.latent_channels, height, width, generator=generator)}
    if dec_cfg.timestep_conditioning:
        inputs["timestep"] = torch.tensor([0.05])
    planes = ltx.noise_planes(module, height, width, seed)
    inputs.update({n: p for n, p in zip(module.input_names()[len(inputs):], planes)})
    return module, inputs, ["video"]


def parameter_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def convert_row(component: str, variant: str, target_name: str, precision_name: str, layers: int | None,
                out_dir: str) -> dict:
    """One bundle at real size: build, convert (memory released as it goes), save; time, peak RSS, size."""
    import torch

    from zoo.precision import PRECISIONS
    from zoo.stages import StageLog
    from zoo.targets import Entry, get_target
    from zoo.targets.litert import use_lightweight_conversion

    torch.set_grad_enabled(False)
    log, target, precision = StageLog(), get_target(target_name), PRECISIONS[precision_name]
    row = {"component": component, "variant": variant, "target": target_name, "precision": precision_name,
           "layers": layers or "all"}
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    with log.stage("build"):
        module, inputs, outputs = build(component, variant, layers)
        row["params_m"] = round(parameter_count(module) / 1e6, 1)
        weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    try:  # a converter that fails at real size is a measured result: the row says so
        if target_name == "coreai":
            with log.stage("export"):
                prepared = target.prepare(module, precision, {"fp32_linear_accumulation": False})
                entries = [Entry("main", prepared, inputs, outputs)]
                exported = target.export(entries)
            # The exported program shares the module's tensors; once converted, the program holds its own copy.
            # Release both before saving (models.md: the raw order peaks ~26 GB fp32 for the 2B DiT, ~18.6 GB
            # with the release).
            for entry in entries:
                entry.module = None
            del module, prepared
            with log.stage("convert"):
                program = target.convert(entries, exported, dest)
            del exported
            gc.collect()
            with log.stage("save"):
                path = target.save(program, dest, {"description": f"ltx-video {component} real size"})
            del program
        else:
            options = model_config(variant).litert
            lightweight = use_lightweight_conversion(options.lightweight_conversion, weight_bytes,
                                                     options.lightweight_above_gb)
            with log.stage("convert") as record:
                entries = [Entry("main", module, inputs, outputs)]
                fp32_path = target.convert(entries, None, dest, lightweight_conversion=str(lightweight))
                record.note = "lightweight" if lightweight else "default"
            del module, entries
            gc.collect()
            row["lightweight_conversion"] = lightweight
            with log.stage("optimize"):
                path, _ = target.compress(fp32_path, precision, dest)
            if path != fp32_path:
                Path(fp32_path).unlink()
        row.update(status="converted", size_mb=round(sum(f.stat().st_size for f in Path(path).parent.rglob("*")
                                                          if f.is_file()) / 1e6, 1))
    except Exception as exc:
        row.update(status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    stages = log.as_dicts()
    row["stage_s"] = {s["name"]: round(float(s["seconds"]), 1) for s in stages}
    row["convert_s"] = round(sum(row["stage_s"].get(n, 0.0) for n in ("export", "convert", "optimize", "save")), 1)
    row["peak_rss_mb"] = round(max(float(s["peak_rss_mb"]) for s in stages), 0) if stages else None
    return row


def block_row(component: str, variant: str, target_name: str, out_dir: str) -> dict:
    """Real-width numerics: one DiT layer at the real token count (CFG batch 2), or a decoder at full channel
    width on a small latent; fp32; the saved artifact vs the eager port on the same inputs."""
    import numpy as np
    import torch

    from zoo import gates
    from zoo.precision import PRECISIONS
    from zoo.targets import Entry, get_target

    torch.set_grad_enabled(False)
    target, fp32 = get_target(target_name), PRECISIONS["fp32"]
    module, inputs, outputs = build(component, variant, layers=1)
    out = module(*inputs.values())
    expected = (out[0] if isinstance(out, (tuple, list)) else out).float().numpy()
    entries = [Entry("main", target.prepare(module, fp32, {}), inputs, outputs)]
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    options = model_config(variant).litert
    artifact = target.convert(entries, target.export(entries), dest,
                              lightweight_conversion=str(options.lightweight_conversion))
    path = target.save(artifact, dest, {"description": f"ltx-video {component} block"})
    convert_s = time.perf_counter() - started
    del artifact, entries
    runner = target.open(path)
    try:
        started = time.perf_counter()
        got = runner.run("main", {k: v.numpy() for k, v in inputs.items()})[outputs[0]]
        run_s = time.perf_counter() - started
    finally:
        runner.close()
    cosine = gates.cosine(np.asarray(got), expected)
    floor = float(model_config(variant).gates.fp32.cosine)
    what = ("1 of 28 layers, 3168 tokens, CFG batch 2" if component == "dit"
            else f"full width, latent {'x'.join(map(str, BLOCK_LATENT))}")
    return {"component": component, "variant": variant, "target": target_name, "block": what,
            "params_m": round(parameter_count(module) / 1e6, 1), "cosine": cosine, "floor": floor,
            "passed": bool(cosine >= floor),  # NaN fails
            "rel_max_abs": gates.measure("rel_max_abs", np.asarray(got), expected),
            "convert_s": round(convert_s, 1), "run_s": round(run_s, 1)}


def in_fresh_process(fn, *args):
    """fn in a fresh process; a process the kernel killed (out of memory at real size) is a result, not a crash."""
    from concurrent.futures.process import BrokenProcessPool

    from zoo.bench import in_fresh_process as fresh

    try:
        return fresh(fn, *args)
    except BrokenProcessPool:
        return {"status": "failed", "error": "the conversion process was killed (the kernel's OOM killer: out of "
                                             "memory on this 24 GB machine)", "convert_s": "—"}


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("component", "variant", "target", "precision", "block"))


def table(results: dict) -> str:
    lines = [f"Generated by `python scripts/ltx_video_real_size.py` on {results['date']} ({results['machine']}); "
             f"seeded random weights of the real architectures (the Hub is not reachable here; time, memory and size "
             f"do not depend on the values); video {REAL_VIDEO['frames']}x{REAL_VIDEO['height']}x{REAL_VIDEO['width']} "
             f"-> 3168 DiT tokens; DiT query chunk {GPU_CHUNK}; wall time of the last run {results['wall_min']:.0f} min "
             f"(`--resume` keeps the rows an interrupted run had converted, with their own figures).", "",
             "| component | variant | target | precision | params M | convert s | peak RSS GB | size GB | how |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        how = (r.get("error") if r["status"] == "failed"
               else ("lightweight conversion" if r.get("lightweight_conversion") else
                     ("torch weights released before convert/save" if r["target"] == "coreai" else "default conversion")))
        peak = f"{r['peak_rss_mb'] / 1024:.1f}" if r.get("peak_rss_mb") else "—"
        size = f"{r['size_mb'] / 1000:.2f}" if r.get("size_mb") else "—"
        lines.append(f"| {r['component']} | {r['variant']} | {r['target']} | {r['precision']} | {r.get('params_m', '—')} "
                     f"| {r['convert_s']} | {peak} | {size} | {r['status']}: {how} |")
    if results.get("blocks"):
        lines += ["", "Real-size numerics per block (fp32, saved artifact vs the eager port, same seeded inputs):", "",
                  "| component | variant | target | block | params M | cosine (fp32 gate) | max-abs / max-abs(ref) | convert s | one call s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for b in results["blocks"]:
            if "error" in b:
                lines.append(f"| {b['component']} | {b['variant']} | {b['target']} | — | — | not run: {b['error']} | | | |")
                continue
            lines.append(f"| {b['component']} | {b['variant']} | {b['target']} | {b['block']} | {b['params_m']} | "
                         f"{b['cosine']:.9f} ({'passed' if b['passed'] else 'FAILED'} ≥ {b['floor']}) | {b['rel_max_abs']:.2e} | {b['convert_s']} | {b['run_s']} |")
    return "\n".join(lines)


INTRO = """The 28-layer DiT and the real 0.9.0 / 0.9.1 decoders converted on this 24 GB machine by
`python scripts/ltx_video_real_size.py` (each row in a fresh process). What makes the 2B DiT fit: on Core AI the torch
weights and the exported program are released before conversion and save; on LiteRT litert-torch's lightweight
(lazy-constant) conversion (`litert.lightweight_conversion`, on for this model: with the default path's constant
folding the real decoder's conversion had not finished when stopped; its row below is the lightweight time). LiteRT
fp16 comes from litert-quantizer on the fp32 flatbuffer, which holds both copies in memory: the peak of that row. Numerics at real size are checked per block (second table)."""


def write_readme(results: dict) -> None:
    text = README.read_text()
    block = f"{START}\n{table(results)}\n{END}"
    if START in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        anchor = "## Not done yet" if "## Not done yet" in text else "## Measured"
        text = text.replace(anchor, f"## Real size\n\n{INTRO}\n\n{block}\n\n{anchor}", 1)
    README.write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["dit", "vae-decoder"], help="one component")
    parser.add_argument("--targets", default="coreai,litert")
    parser.add_argument("--layers", type=int, help="DiT layers (a quick look; the table needs all 28)")
    parser.add_argument("--no-blocks", action="store_true", help="skip the per-block numerics")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--resume", action="store_true",
                        help="keep the converted rows of an interrupted run (models/ltx_video/real_size.partial.json)")
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    started = time.perf_counter()
    rows, blocks = [], []
    partial = RESULTS.with_suffix(".partial.json")
    done = ({row_key(r): r for r in json.loads(partial.read_text())["rows"] if r.get("status") == "converted"}
            if args.resume and partial.is_file() else {})
    with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as scratch:
        for i, (component, variant, target, precision) in enumerate(MATRIX):
            if (args.only and component != args.only) or target not in targets:
                continue
            print(f"[real-size] {component} {variant} {target} {precision} ...", flush=True)
            key = (component, variant, target, precision, None)
            row = done.get(key) or {"component": component, "variant": variant, "target": target,
                                    "precision": precision, **in_fresh_process(convert_row, component, variant, target,
                                                                               precision, args.layers, f"{scratch}/{i}")}
            print(f"[real-size]   {json.dumps(row)}", flush=True)
            rows.append(row)
            if not args.layers:
                partial.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
            for leftover in Path(scratch, str(i)).glob("*"):
                leftover.unlink() if leftover.is_file() else None
        if not args.no_blocks:
            for i, (component, variant) in enumerate(BLOCKS):
                for target in targets:
                    if args.only and component != args.only:
                        continue
                    print(f"[real-size] block {component} {variant} {target} ...", flush=True)
                    try:
                        block = in_fresh_process(block_row, component, variant, target, f"{scratch}/b{i}{target}")
                    except Exception as exc:
                        block = {"component": component, "variant": variant, "target": target,
                                 "error": f"{type(exc).__name__}: {exc}"[:200]}
                    print(f"[real-size]   {json.dumps(block)}", flush=True)
                    blocks.append(block)
    results = {"date": time.strftime("%Y-%m-%d"), "wall_min": (time.perf_counter() - started) / 60,
               "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}",
               "layers": args.layers or 28, "rows": rows, "blocks": blocks}
    if args.layers or args.only or len(targets) < 2:
        print(table(results))
        return 0   # a partial look never overwrites the table
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    if not args.no_readme:
        write_readme(results)
    print(table(results))
    failed = [r for r in rows if r["status"] != "converted"] + [b for b in blocks if not b.get("passed")]
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
