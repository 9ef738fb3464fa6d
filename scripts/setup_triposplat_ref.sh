#!/usr/bin/env bash
# Build the TripoSplat *reference* environment: upstream model.py (VAST-AI-Research/TripoSplat, read through the
# wiretronic/TripoSplat mirror) imports torchvision at top level (for BiRefNet's deform_conv2d), which cannot live
# next to the main venv's torch 2.13.0 CPU wheel. torch==2.14.1 + torchvision==0.29.1 is the pair known to resolve
# here (~6 GB, ~2 min), so it gets its own venv under .cache/ (gitignored). Upstream's model.py and triposplat.py
# are read from the mirror at the pinned commit into the venv (never into our repo) and put on its path with a
# .pth file. Only scripts/make_triposplat_goldens.py runs in it; CI never does.
# Idempotent: re-running with the stamp present does nothing.
#   TRIPOSPLAT_REF_VENV  venv folder (default .cache/triposplat-ref-venv)
#   TRIPOSPLAT_MIRROR    git directory of the upstream mirror (default /work/.mirror/wiretronic+TripoSplat/repo)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRIPOSPLAT_REF_VENV:-.cache/triposplat-ref-venv}
MIRROR=${TRIPOSPLAT_MIRROR:-/work/.mirror/wiretronic+TripoSplat/repo}
COMMIT=a78fa12    # upstream commit the goldens are made from (models/triposplat/golden/README.md)
PYTHON=${PYTHON:-python3.11}
STAMP="$VENV/.triposplat-ref-installed"
if [ -f "$STAMP" ]; then echo "[triposplat-ref] ready: $VENV"; exit 0; fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 safetensors numpy
# triposplat.py (the sampler, Gaussian building) imports tqdm and PIL (PIL comes with torchvision)
"$VENV/bin/pip" install -q tqdm
UPSTREAM="$VENV/upstream-$COMMIT"
mkdir -p "$UPSTREAM"
for file in model.py triposplat.py; do
  git -C "$MIRROR" show "$COMMIT:$file" > "$UPSTREAM/$file"
done
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(cd "$UPSTREAM" && pwd)" > "$SITE/triposplat_upstream.pth"
"$VENV/bin/python" - <<'PY'
import torch, torchvision  # noqa: F401  (fails loudly if the pair does not import together)
import model, triposplat  # noqa: F401  upstream, from the mirror
assert torch.__version__.startswith("2.14.1"), torch.__version__
print("[triposplat-ref] torch", torch.__version__, "torchvision", torchvision.__version__, "upstream", model.__file__)
PY
touch "$STAMP"
echo "[triposplat-ref] ready: $VENV"
