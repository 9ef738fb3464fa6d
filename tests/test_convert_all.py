"""convert-all in the default suite: content keys, skip what is unchanged, the catalog, failures and bad input.

Cheap on purpose (the Ray and submitit runs of the tiny matrix are `-m scaleout`, tests/test_scaleout.py):
the end-to-end case runs two throwaway models (tests/extra_models, copied so the test can edit a config
on disk) serially in one process (hydra/launcher=basic), three times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from background_convert import plan_outcomes

ROOT = Path(__file__).resolve().parent.parent
EXTRA_MODELS = ROOT / "tests" / "extra_models"


def convert_all(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment.pop("ZOO_REQUIRE_GPU_CHECK", None)  # these bundles run with model.gpu.check=false
    return subprocess.run([sys.executable, "-m", "zoo.convert_all", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=environment)


# ---------------------------------------------------------------- content key (in process)


def test_content_key_changes_with_one_models_config_only(compose):
    from zoo.content_key import key_parts

    def parts(model, *overrides):
        cfg = compose([f"model={model}", *overrides]).model
        return key_parts(cfg, "litert", "fp32", "tiny", {"source": "tiny", "path": "/anywhere", "files": {"a": "1"}})

    t5, llm = parts("t5"), parts("gqa-llm")
    assert parts("t5") == t5                                    # the same inputs give the same key
    assert parts("t5", "model.seq_len=64")["config"] != t5["config"]   # negative control: a changed value shows
    assert parts("gqa-llm") == llm                                   # ...and the other model's key does not move
    assert t5["code"]["zoo"] == llm["code"]["zoo"] and t5["code"]["model"] != llm["code"]["model"]
    moved = key_parts(compose(["model=t5"]).model, "litert", "fp32", "tiny",
                      {"source": "tiny", "path": "/elsewhere", "files": {"a": "1"}})
    assert moved == t5   # where a checkout keeps its weights is not part of the key; their bytes are
    assert key_parts(compose(["model=t5"]).model, "litert", "fp32", "tiny",
                     {"source": "tiny", "files": {"a": "2"}})["weights"] != t5["weights"]


def test_model_code_digest_ignores_bench_outputs(tmp_path):
    from zoo.content_key import _model_folder_input, folder_digest

    folder = shutil.copytree(EXTRA_MODELS / "two_stage", tmp_path / "two_stage")
    before = folder_digest(folder, is_input=_model_folder_input)
    (folder / "README.md").write_text("measured table\n")
    (folder / "bench.json").write_text("{}\n")
    assert folder_digest(folder, is_input=_model_folder_input) == before
    (folder / "__init__.py").write_text((folder / "__init__.py").read_text() + "\n# an edit\n")
    assert folder_digest(folder, is_input=_model_folder_input) != before


# ---------------------------------------------------------------- end to end (one process per run)


def test_convert_all_skips_unchanged_rebuilds_the_changed_model_and_reports_failures(tmp_path, monkeypatch):
    models = tmp_path / "models"
    for name in ("two_stage", "wide_norm"):
        shutil.copytree(EXTRA_MODELS / name, models / name, ignore=shutil.ignore_patterns("__pycache__"))
    out, docs = tmp_path / "exports", tmp_path / "docs"
    args = ["model=two-stage,wide-norm", "target=litert", "precision=fp32", "model.gpu.check=false",
            f"out_dir={out}", f"catalog_dir={docs}", "hydra/launcher=basic"]
    env = {"ZOO_MODEL_PATH": str(models)}

    first = convert_all(*args, env=env)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert plan_outcomes(first.stdout) == {"two-stage/litert/fp32": "to build", "wide-norm/litert/fp32": "to build"}
    bundles = [out / "two-stage" / "encoder" / "litert-fp32", out / "two-stage" / "head" / "litert-fp32",
               out / "wide-norm" / "litert-fp32"]
    keys = {b: json.loads((b / "manifest.json").read_text())["content_key"]["sha256"] for b in bundles}
    catalog = json.loads((docs / "catalog.json").read_text())["bundles"]
    built = {(r["model"], r["component"], r["precision"]): r["status"] for r in catalog if r["component"] != "*"}
    assert built == {("two-stage", "encoder", "fp32"): "GPU not checked", ("two-stage", "head", "fp32"): "GPU not checked",
                     ("wide-norm", "norm", "fp32"): "GPU not checked"}
    # what a model refuses is a cell of the catalog too, with its reason (wide-norm's config refuses int8)
    assert {"status": "refused", "reason": "test model"}.items() <= next(
        r for r in catalog if (r["model"], r["target"], r["precision"]) == ("wide-norm", "litert", "int8")).items()
    assert sorted(r["content_key"] for r in catalog if r["content_key"]) == sorted(keys.values())
    from zoo.bundle_catalog import main as zoo_catalog   # `zoo catalog` writes the same from the same disk
    from zoo.registry import model_config_files

    monkeypatch.setenv("ZOO_MODEL_PATH", str(models))
    model_config_files.cache_clear()
    try:
        assert zoo_catalog(["--exports", str(out), "--out", str(tmp_path / "docs2")]) == 0
    finally:
        monkeypatch.delenv("ZOO_MODEL_PATH")
        model_config_files.cache_clear()
    assert json.loads((tmp_path / "docs2" / "catalog.json").read_text())["bundles"] == catalog

    # Nothing changed: nothing converts, exit 0, in seconds.
    started = time.monotonic()
    again = convert_all(*args, env=env)
    assert again.returncode == 0, again.stdout[-4000:]
    assert set(plan_outcomes(again.stdout).values()) == {"up to date"}
    assert "resolve_weights" not in again.stdout   # no job ran
    assert time.monotonic() - started < 30

    # One value in one model's config.yaml changes (here to a gate no bundle can pass): only that model's
    # bundle rebuilds; it fails, the run goes on, and exits 1 naming the failure's report.
    config = models / "wide_norm" / "config.yaml"
    config.write_text(config.read_text().replace("fp32: {cosine: 0.99999}", "fp32: {cosine: 1.1}"))
    changed = convert_all(*args, env=env)
    assert changed.returncode == 1, changed.stdout[-4000:]
    assert plan_outcomes(changed.stdout) == {"two-stage/litert/fp32": "up to date", "wide-norm/litert/fp32": "to build"}
    assert "(changed: config, code)" in changed.stdout
    failed_report = out / "wide-norm" / "litert-fp32.failed" / "report.json"
    assert failed_report.is_file() and str(failed_report) in changed.stdout.replace("\n    ", "")
    assert all(json.loads((b / "manifest.json").read_text())["content_key"]["sha256"] == keys[b] for b in bundles)
    rows = {(r["model"], r["precision"]): r for r in json.loads((docs / "catalog.json").read_text())["bundles"]
            if r["component"] != "*"}
    assert rows[("wide-norm", "fp32")]["status"] == "failed"
    assert "cosine" in rows[("wide-norm", "fp32")]["reason"] and "stays live" in rows[("wide-norm", "fp32")]["reason"]
    assert "| wide-norm | norm | litert | fp32 | failed |" in (docs / "catalog.md").read_text()


# ---------------------------------------------------------------- bad input


def test_unknown_model_exits_2_with_one_paragraph(tmp_path):
    proc = convert_all("model=nope", f"out_dir={tmp_path}", f"catalog_dir={tmp_path}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Unknown model 'nope'" in output and "Fix:" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize("args, says", [
    (["model=t5", "hydra/launcher=spark"], "Unknown launcher 'spark'"),
    (["model=t5", "hydra/launcher=ray", "address=127.0.0.1:9"], "No Ray cluster answers at 127.0.0.1:9"),
    (["model=t5", "frobnicate=1"], "convert-all does not understand 'frobnicate=1'"),
])
def test_bad_input_is_refused_before_any_work(args, says, tmp_path, capsys):
    """In process (the exit path is the one above): each is a ZooError at the boundary, exit 2."""
    from zoo.convert_all import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, f"out_dir={tmp_path}", f"catalog_dir={tmp_path}"])
    output = capsys.readouterr()
    assert exit_.value.code == 2 and says in output.out and "Fix:" in output.out
    assert "Traceback" not in output.out + output.err
    assert not (tmp_path / "catalog.md").exists()   # refused before any work


# ---------------------------------------------------------------- resource declarations


def test_each_launcher_gets_the_largest_bundles_declared_memory_and_cpus(tmp_path):
    import psutil
    from omegaconf import OmegaConf

    from zoo.convert_all import Cell, declare_memory, launcher_overrides

    settings = OmegaConf.load(ROOT / "configs" / "convert_all.yaml")
    cells = [Cell("t5", "coreai", "fp32"), Cell("gqa-llm", "litert", "fp32")]
    declare_memory(cells, settings)   # from models/<m>/bench.json peak_rss_mb × memory_margin
    bench = json.loads((ROOT / "models" / "gqa_llm" / "bench.json").read_text())["rows"]
    llm_peak = max(r["peak_rss_mb"] for r in bench if (r["target"], r["precision"]) == ("litert", "fp32"))
    assert cells[1].expected_gb == pytest.approx(llm_peak / 1024 * settings.memory_margin)
    largest = max(c.expected_gb for c in cells)

    fits = int(psutil.virtual_memory().available / (largest * 2**30))
    [n_jobs] = launcher_overrides("joblib", cells, settings, tmp_path)
    assert n_jobs == f"hydra.launcher.n_jobs={max(1, min(os.cpu_count(), fits))}"
    ray = launcher_overrides("ray", cells, OmegaConf.merge(settings, {"address": None}), tmp_path)
    assert f"+hydra.launcher.ray.remote.memory={int(largest * 2**30)}" in ray
    assert "+hydra.launcher.ray.remote.num_cpus=1" in ray and "+hydra.launcher.ray.remote.max_calls=1" in ray
    slurm = launcher_overrides("submitit_slurm", cells, OmegaConf.merge(settings, {"cpus_per_bundle": 4}), tmp_path)
    assert f"hydra.launcher.mem_gb={int(-(-largest // 1))}" in slurm and "hydra.launcher.cpus_per_task=4" in slurm

    # Negative control: bundles bigger than this machine's free RAM run one at a time, never side by side.
    huge = OmegaConf.merge(settings, {"bundle_memory_gb": psutil.virtual_memory().total / 2**30})
    declare_memory(cells, huge)
    assert launcher_overrides("joblib", cells, huge, tmp_path) == ["hydra.launcher.n_jobs=1"]


def test_a_launcher_that_stops_reports_its_jobs_lost_and_exits_2(tmp_path):
    """The engine refusing to run (here Hydra rejects a joblib setting) is not a crash of convert-all: every
    job without a result is listed as lost with where to look, the catalog is still written, exit 2."""
    proc = convert_all("model=t5", "target=litert", "precision=fp32", "weights=tiny", "hydra.launcher.n_jobs=abc",
                       f"out_dir={tmp_path / 'exports'}", f"catalog_dir={tmp_path / 'docs'}")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 lost" in proc.stdout and "✗ t5/litert/fp32: the launcher stopped before this job left a result" in proc.stdout
    assert list((tmp_path / "exports" / ".convert-all").glob("*/launcher-error.txt"))
    assert (tmp_path / "docs" / "catalog.md").is_file()


def test_ray_temp_dir_keeps_socket_paths_under_the_unix_limit():
    """CI checks the project out at /check/work/main, where a 44-byte temp dir made Ray's plasma socket path
    exceed 107 bytes (`make test-scaleout` failed). The folder leaves room for Ray's longest socket suffix,
    falls back to a shorter one, and a project too deep for either is exit 2, not Ray's traceback."""
    from zoo.convert_all import MAX_RAY_TEMP_DIR, RAY_SOCKET_SUFFIX, choose_ray_temp_dir, ray_temp_dir
    from zoo.errors import ZooError
    assert len(str(ray_temp_dir()) + RAY_SOCKET_SUFFIX) <= 107
    assert choose_ray_temp_dir(Path("/check/work/main")) == Path("/check/work/main/.cache/ray")
    fits_only_dot_ray = Path("/" + "d" * (MAX_RAY_TEMP_DIR - len("/.ray") - 1))
    assert choose_ray_temp_dir(fits_only_dot_ray) == fits_only_dot_ray / ".ray"
    with pytest.raises(ZooError, match="too deep for Ray"):
        choose_ray_temp_dir(Path("/" + "d" * 60))
