#!/usr/bin/env bash
# Build the RF-DETR *reference* environment: upstream rfdetr needs torchvision, which cannot live next to
# the main venv's torch 2.13.0 CPU wheel (`operator torchvision::nms does not exist`). The only pair that
# resolves from local disk here is torch==2.14.1 + torchvision==0.29.1 (a CUDA build, ~6 GB, ~2 min), so it
# gets its own venv under .cache/ (gitignored). Only scripts/make_rfdetr_goldens.py runs in it; CI never does.
# Idempotent: re-running with the stamp present does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RFDETR_REF_VENV:-.cache/rfdetr-ref-venv}
PYTHON=${PYTHON:-python3.11}
STAMP="$VENV/.rfdetr-ref-installed"
if [ -f "$STAMP" ]; then echo "[rfdetr-ref] ready: $VENV"; exit 0; fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# torch + torchvision first and pinned, so that rfdetr's own `torch>=...` requirement is already met and
# pip never reaches for another torch.
"$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
"$VENV/bin/pip" install -q rfdetr==1.11.2 safetensors
"$VENV/bin/python" - <<'PY'
import torch, torchvision, rfdetr  # noqa: F401  (fails loudly if the pair does not import together)
assert torch.__version__.startswith("2.14.1"), torch.__version__
print("[rfdetr-ref] torch", torch.__version__, "torchvision", torchvision.__version__)
PY
touch "$STAMP"
echo "[rfdetr-ref] ready: $VENV"
