"""`make test-scaleout`: the tiny matrix through convert-all on real engines, against the serial run.

The matrix: t5 + gqa-llm on their tiny checkpoints, Core AI + LiteRT, fp32 + fp16 — 8 cells, of which the
models refuse 2 (T5 fp16 on Core AI, the LLM fp16 on LiteRT): 6 bundles per run. One of them fails its gate,
every time: the tiny LLM's near-tied logits flip greedy tokens in Core AI fp16 (token agreement 0.6875 on
prompts 0 and 2 against the real SmolLM2's gate of 0.75). That is the matrix's own negative control: the
other bundles still build, the run exits 1 and names the failure's report, on every engine alike. It runs
1. serially (hydra/launcher=basic, one process), the baseline;
2. on a real local Ray cluster this module starts: a head node and one extra worker node (`ray start
   --block`, each process ours to stop), 1 CPU each, all Ray state in a short folder under pytest's tmp;
3. on submitit's local executor;
and each engine's bundles must equal the serial ones: the same gate values, the same manifests apart from
the hashes of files that are not byte-reproducible even between two serial runs (timings, creation dates,
Core AI's program; see `byte_reproducible`). Then: a re-run converts nothing, and submitit_local refuses a matrix
that would not fit in memory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from background_convert import plan_outcomes

from zoo.convert_all import ray_temp_dir

pytestmark = pytest.mark.scaleout

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ["model=t5,gqa-llm", "target=coreai,litert", "precision=fp32,fp16", "weights=tiny"]
BUNDLES = ["t5/coreai-fp32", "t5/litert-fp32", "t5/litert-fp16",
           "gqa-llm/coreai-fp32", "gqa-llm/coreai-fp16", "gqa-llm/litert-fp32", "gqa-llm/litert-fp16"]
REFUSED = {"t5/coreai/fp16"}
FAILING = "gqa-llm/coreai/fp16"   # kept in <bundle>.failed/ (see the module docstring)
FAILED_BUNDLE = "gqa-llm/coreai-fp16.failed"
PASSING = ["model=t5,gqa-llm", "target=coreai,litert", "precision=fp32", "weights=tiny"]  # the matrix less fp16
RAY = str(Path(sys.executable).with_name("ray"))


def engine_env(tmp: Path) -> dict[str, str]:
    """Every process of a run (and of the Ray cluster) imports this checkout's zoo and keeps its temp files
    in the test's folder."""
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0"}


def convert_all(tmp: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "zoo.convert_all", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=engine_env(tmp / "tmp"))
    (tmp / f"convert-all-{time.monotonic_ns()}.log").write_text(proc.stdout + proc.stderr)
    return proc


def run_matrix(tmp: Path, launcher: str, *extra: str) -> Path:
    out = tmp / f"exports-{launcher}"
    proc = convert_all(tmp, *MATRIX, f"hydra/launcher={launcher}", f"out_dir={out}", f"catalog_dir={tmp / 'docs'}", *extra)
    assert proc.returncode == 1, proc.stdout[-6000:] + proc.stderr[-6000:]   # one gate failed, nothing errored
    assert "1 cell(s) failed" in proc.stdout and f"✗ {FAILING}: decoder: gate_failed" in proc.stdout
    assert str(out / FAILED_BUNDLE / "report.json") in proc.stdout.replace("\n", "")
    planned = plan_outcomes(proc.stdout)
    assert {c for c, o in planned.items() if o == "refused"} == REFUSED
    assert sum(o == "to build" for o in planned.values()) == len(BUNDLES)
    return out


def byte_reproducible(rel: str) -> bool:
    """Files that differ between two *serial* builds of the same inputs are compared by name only. Measured
    (two `zoo convert model=t5 target=all precision=fp32 weights=tiny` runs): report.json (stage timings),
    Core AI's metadata.json files (creation dates), model.aimodel/main.mlirb + main.hash (coreai-torch
    0.4.3 does not write byte-identical programs) and the LLM's model.litertlm (litert-lm-builder writes a
    creation_timestamp into it). Everything else, the .tflite files included, must match byte for byte."""
    return (rel not in ("report.json", "model.litertlm") and not rel.endswith("metadata.json")
            and not rel.startswith("model.aimodel/"))


def comparable(bundle: Path) -> tuple[list, dict]:
    """(gates, manifest less what is not byte-reproducible): what must not depend on where or how a bundle
    was built — gate values, content key, weights, tools, I/O contract, status, every file's name."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"] = {k: (v if byte_reproducible(k) else "not byte-reproducible") for k, v in manifest["files"].items()}
    return json.loads((bundle / "report.json").read_text())["gates"], manifest


def assert_same_bundles(baseline: Path, other: Path) -> None:
    for rel in [b for b in BUNDLES if b != FAILED_BUNDLE.removesuffix(".failed")] + [FAILED_BUNDLE]:
        gates, manifest = comparable(baseline / rel)
        status = json.loads((baseline / rel / "report.json").read_text())["status"]
        assert status == ("gate_failed" if rel == FAILED_BUNDLE else "passed"), rel
        assert comparable(other / rel) == (gates, manifest), rel


def job_results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob(".convert-all/*/results/*.json")]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scaleout")


@pytest.fixture(scope="module")
def serial(tmp) -> Path:
    return run_matrix(tmp, "basic")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nodes_alive(address: str, env: dict) -> int:
    status = subprocess.run([RAY, "status", f"--address={address}"], capture_output=True, text=True, env=env, timeout=60)
    active = status.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return active.count(" node_") if status.returncode == 0 else 0


@pytest.fixture
def ray_cluster(tmp):  # only for the Ray test: stopped before the submitit one starts
    """A real two-node Ray cluster on 127.0.0.1: `ray start --head` plus one worker node process, 1 CPU each.
    --block keeps each `ray start` in the foreground, so this test holds their PIDs and stops exactly them
    (SIGTERM: each stops the Ray processes it started), never `ray stop` (which stops every Ray on the machine)."""
    port, temp_dir = free_port(), ray_temp_dir()
    address = f"127.0.0.1:{port}"
    env = engine_env(tmp / "ray-tmp")
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", f"--temp-dir={temp_dir}",
              "--disable-usage-stats"]
    logs = tmp / "ray-logs"
    logs.mkdir(exist_ok=True)
    head = subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", *common],
                            env=env, stdout=open(logs / "head.log", "w"), stderr=subprocess.STDOUT)
    processes = [head]
    try:
        deadline = time.monotonic() + 120
        while nodes_alive(address, env) < 1:
            assert head.poll() is None and time.monotonic() < deadline, (logs / "head.log").read_text()[-3000:]
            time.sleep(2)
        worker = subprocess.Popen([RAY, "start", f"--address={address}", *common], env=env,
                                  stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT)
        processes.append(worker)
        while nodes_alive(address, env) < 2:
            assert worker.poll() is None and time.monotonic() < deadline, (logs / "worker.log").read_text()[-3000:]
            time.sleep(2)
        yield address
    finally:
        for proc in reversed(processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_ray_cluster_builds_the_same_bundles_as_the_serial_run(tmp, serial, ray_cluster):
    out = run_matrix(tmp, "ray", f"address={ray_cluster}")
    assert_same_bundles(serial, out)
    nodes = {r["ray_node"] for r in job_results(out)}
    assert len(nodes) == 2 and "" not in nodes   # both nodes of the cluster converted bundles

    # Nothing changed: nothing is launched, exit 0, in seconds (the passing part of the matrix: a failed
    # bundle is never up to date, it is tried again); --force sends one cell back to the cluster.
    started = time.monotonic()
    again = convert_all(tmp, *PASSING, "hydra/launcher=ray", f"address={ray_cluster}", f"out_dir={out}",
                        f"catalog_dir={tmp / 'docs'}")
    assert again.returncode == 0, again.stdout[-4000:]
    assert set(plan_outcomes(again.stdout).values()) == {"up to date"}
    assert "resolve_weights" not in again.stdout and time.monotonic() - started < 60
    forced = convert_all(tmp, "model=t5", "target=litert", "precision=fp32", "weights=tiny", "--force",
                         "hydra/launcher=ray", f"address={ray_cluster}", f"out_dir={out}", f"catalog_dir={tmp / 'docs'}")
    assert forced.returncode == 0 and plan_outcomes(forced.stdout) == {"t5/litert/fp32": "to build"}, forced.stdout[-4000:]
    assert_same_bundles(serial, out)


def test_submitit_local_builds_the_same_bundles_as_the_serial_run(tmp, serial):
    # submitit's local executor starts every job at once, so each bundle declares a measured peak: twice the
    # largest peak RSS the serial run's reports recorded for these tiny bundles.
    peaks = [s["peak_rss_mb"] for rel in [*BUNDLES, FAILED_BUNDLE] if (serial / rel).is_dir()
             for s in json.loads((serial / rel / "report.json").read_text())["stages"] if "peak_rss_mb" in s]
    declared_gb = round(2 * max(peaks) / 1024, 2)
    out = run_matrix(tmp, "submitit_local", f"bundle_memory_gb={declared_gb}")
    assert_same_bundles(serial, out)
    assert len({r["pid"] for r in job_results(out)}) == len(BUNDLES)   # one process per bundle

    # Negative control: a matrix whose declared memory does not fit this machine is refused before any work.
    refused = convert_all(tmp, *MATRIX, "hydra/launcher=submitit_local", "bundle_memory_gb=100000",
                          f"out_dir={tmp / 'never'}", f"catalog_dir={tmp / 'never'}", "--force")
    assert refused.returncode == 2 and "submitit_local would start" in refused.stdout, refused.stdout[-3000:]
    assert "Traceback" not in refused.stdout + refused.stderr and not (tmp / "never" / "t5").exists()
