"""gqa-llm: a re-authored Llama-family GQA decoder (SmolLM2-135M real, TINY for CI)."""

from .model import SMOLLM2_135M, TINY, GQAConfig, GQAForCausalLM, from_hf_config

from .spec import SPEC

__all__ = ["GQAConfig", "GQAForCausalLM", "SMOLLM2_135M", "TINY", "SPEC", "from_hf_config"]
