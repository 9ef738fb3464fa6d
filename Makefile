# zoo — verified on-device bundles. Every target installs what it needs on first use.
PY        := .venv/bin/python
MODEL     ?= t5
TARGET    ?= all
PRECISION ?= default
COMPONENT ?= all
WEIGHTS   ?=
OUT       ?= exports
STAMP     := .venv/.zoo-installed

.PHONY: setup convert convert-all catalog demo test test-slow test-scaleout bench real-size list gpu-table clean

VULKAN    := .cache/vulkan/lvp_icd.json

setup: $(STAMP) $(VULKAN)
$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
# Software Vulkan (Mesa >= 25 lavapipe, project-local; apt state in .cache/apt, nothing written outside the
# project) for the LiteRT GPU-delegate check. Where it cannot be set up (any OS/arch but Debian 12 x86_64,
# or no network) setup still succeeds: the check reports "not run" in every LiteRT bundle (and CI, with
# ZOO_REQUIRE_GPU_CHECK=1, fails).
$(VULKAN): scripts/setup_vulkan.sh | $(STAMP)
	bash scripts/setup_vulkan.sh || { echo "[setup] WARNING: software Vulkan not installed (see above): the Python toolchain is ready, but LiteRT GPU checks will report 'not run'"; [ "$$ZOO_REQUIRE_GPU_CHECK" != 1 ]; }

## make convert MODEL=t5 [TARGET=coreai|litert|all] [PRECISION=fp32|fp16|bf16|int8] [WEIGHTS=tiny|hub|random|local:PATH]
convert: setup
	$(PY) -m zoo.convert model=$(MODEL) target=$(TARGET) precision=$(PRECISION) out_dir='$(OUT)' $(if $(WEIGHTS),weights='$(WEIGHTS)')

## the whole zoo (or MODELS=a,b TARGETS=... PRECISIONS=...) as one Hydra multirun; unchanged bundles are skipped
## (FORCE=1 rebuilds them); LAUNCHER=joblib|ray|submitit_local|submitit_slurm; WEIGHTS= as for convert; ARGS= passes more (address=HOST:PORT)
MODELS    ?= all
TARGETS   ?= all
PRECISIONS ?= all
LAUNCHER  ?= joblib
convert-all: setup
	$(PY) -m zoo.convert_all model=$(MODELS) target=$(TARGETS) precision=$(PRECISIONS) hydra/launcher=$(LAUNCHER) out_dir='$(OUT)' $(if $(WEIGHTS),weights='$(WEIGHTS)') $(if $(FORCE),--force) $(ARGS)

## docs/catalog.md + docs/catalog.json from every bundle in $(OUT)
catalog: setup
	$(PY) -m zoo.bundle_catalog --exports '$(OUT)'

## every model through both targets on its embedded default weights, ending in a gate table
demo: setup
	$(PY) -m zoo.demo out_dir='$(OUT)'

## the default (fast) suite; slow/real-size tests are marked and run by `make test-slow`
test: setup
	$(PY) -m pytest -m "not slow and not scaleout" -q

## the tiny matrix on a local Ray cluster (head + one worker node) and on submitit's local executor, vs serial
## (--basetemp: its bundles, logs and Ray state stay inside the project, and other pytest runs never rotate them away)
test-scaleout: setup
	$(PY) -m pytest -m scaleout -q --basetemp=.cache/pytest-scaleout

test-slow: setup
	$(PY) -m pytest -m slow -q

## measure conversion, runtime latency vs eager, and size; regenerates models/<model>/README.md "Measured"
## (TARGET=/PRECISION=/COMPONENT= narrow the run: only those rows are replaced, the others keep their earlier run;
## ARGS=--readme-only re-renders the block from bench.json with the config's current bench.targets)
bench: setup
	$(PY) -m zoo.bench model=$(MODEL) target=$(TARGET) precision=$(PRECISION) component=$(COMPONENT) $(ARGS)

## the model at real size (its ModelSpec.real_size rows, each in a fresh process): conversion time, peak RSS, size and
## fp32 numerics and the LiteRT GPU check; regenerates models/<model>/real_size.json and its README "Real size" block.
## ARGS= passes more (--resume, --readme-only, --only COMPONENT: re-measure one, keep the rest; --gpu-only;
## --targets litert, --layers N: a look that writes nothing)
real-size: setup
	$(PY) -m zoo.real_size $(MODEL) $(ARGS)

## regenerate docs/gpu-table.md: every rewrite before/after on the LiteRT GPU delegate (software Vulkan)
gpu-table: setup
	$(PY) scripts/gpu_table.py

## models, components, targets and default precisions
list: setup
	$(PY) -m zoo.catalog

clean:
	rm -rf exports outputs multirun .pytest_cache
