"""zoo: verified on-device bundles (Core AI .aimodel, LiteRT .tflite) from re-authored PyTorch models."""

__version__ = "0.1.0"
