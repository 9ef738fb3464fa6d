"""Silence the toolchains' import-time chatter (torchao kernels, TF oneDNN banners, absl) once; Ctrl-C in a CLI
prints one line, not a traceback. Imported first by every zoo command."""

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


def _interrupted_quietly(kind, value, tb, _default=__import__("sys").excepthook):
    """Ctrl-C is not a bug: one line instead of a traceback, exit status 130. Every `finally` (staging
    removal, the bundle lock) has already run by the time an interrupt reaches this hook."""
    if issubclass(kind, KeyboardInterrupt):
        import atexit
        import os
        import sys

        print("\ninterrupted (Ctrl-C): nothing was half-written; a previous good bundle, if any, is untouched.",
              file=sys.stderr)
        atexit._run_exitfuncs()  # temp folders registered for removal at exit
        sys.stdout.flush()
        os._exit(130)  # the shell's convention for SIGINT (Hydra's wrapper would otherwise make it 1)
    _default(kind, value, tb)
    from zoo.cli import end_process, native_runtime_loaded

    if native_runtime_loaded():  # a bug's traceback is printed; the exit must not abort on top of it
        end_process(1)


__import__("sys").excepthook = _interrupted_quietly
