"""Silence the toolchains' import-time chatter (torchao kernels, TF oneDNN banners, absl) once."""

import logging
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# litert-torch prints a nested [START]/[DONE] tree per conversion; our stage lines say the same once.
os.environ.setdefault("LITERT_TORCH_SHOW_PROGRESS", "n")
warnings.filterwarnings("ignore", message=".*validated with torch.*")
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
for name in ("torchao", "torch._export", "torch.utils._pytree", "absl", "jax"):
    logging.getLogger(name).setLevel(logging.ERROR)
