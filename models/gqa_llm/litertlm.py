"""The LLM's LiteRT-LM form: `model.litertlm` beside `model.tflite`, and a session on the LiteRT-LM runtime.

    zoo convert model=gqa-llm target=litert       # writes model.tflite AND model.litertlm, gates both
    with LiteRTLMSession(bundle / "model.litertlm") as lm:
        text = lm.generate_text("The capital of France is", 16)

A `.litertlm` is the magic `LITERTLM`, an LlmMetadata proto, the TFLite prefill/decode graph and the
tokenizer (toolchain.md §5). The graph needs no wrapper: `litert_entries` already exports LiteRT-LM's
names (`tokens`, `input_pos`, `k_cache_i`/`v_cache_i`, `logits`). What the metadata must say:
- start/stop tokens from the checkpoint's own tokenizer (a wrong stop token ends generation early or never);
- a Jinja chat template that reads message content as a *list of parts* — the runtime hands it that
  way, and SmolLM2's HF template (`message['content'] + ...`) fails there (measured, issue 12);
- `supports_thinking` / `supports_function_calling`: the builder refuses an LLM without them.

The runtime speaks text, not token ids: the gate feeds the prompt text with the prompt template off and
greedy sampling (top-k 1), and tokenizes the reply with the bundle's tokenizer (models/gqa_llm/spec.py).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from zoo.errors import ZooError

ARTIFACT = "model.litertlm"

# The engine's "no cache" setting (what `litert-lm run --cache no` passes as cache_dir). Its default, a
# disk cache, writes a model-sized `.xnnpack_cache` beside the model (539 MB for SmolLM2, measured):
# inside a hashed bundle that is an unlisted file, and a 2x disk bill.
NO_CACHE = ":nocache"

# Re-authored for LiteRT-LM from SmolLM2's ChatML template: content may be a string (HF) or a list of
# {"type": "text", "text": ...} parts (LiteRT-LM); the HF default system turn is kept.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
{{ START }}system
You are a helpful AI assistant named SmolLM, trained by Hugging Face{{ END }}
{% endif -%}
{{ START }}{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{{ END }}
{% endfor -%}
{%- if add_generation_prompt -%}
{{ START }}assistant
{% endif -%}
"""


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------
def chat_template(start: str, end: str) -> str:
    """The template with the tokenizer's own turn markers spelled in (Jinja sees plain text)."""
    return CHAT_TEMPLATE.replace("{{ START }}", start).replace("{{ END }}", end)


def token_id(tokenizer, text: str) -> int:
    ids = tokenizer.convert_tokens_to_ids([text])
    if not ids or ids[0] is None or ids[0] == tokenizer.unk_token_id:
        raise ZooError(f"The tokenizer has no token '{text}', which the LiteRT-LM chat template needs.",
                       "use a ChatML tokenizer (SmolLM2's, or the tiny one), or pass chat markers it has.")
    return int(ids[0])


def start_token_id(tokenizer) -> int | None:
    """The token the engine puts before every prompt: the one the tokenizer itself adds, if any.

    The engine prepends LlmMetadata.start_token even with the prompt template off. SmolLM2's tokenizer
    adds none (its ChatML template starts turns with <|im_start|> itself); with <|im_start|> as start
    token the runtime's greedy text diverged from the reference on all 3 tiny gate prompts (measured):
    the "right" start token here is none."""
    probe = tokenizer("a")["input_ids"]
    bos = tokenizer.bos_token_id
    return int(bos) if bos is not None and probe and probe[0] == bos else None


def stop_token_ids(tokenizer) -> list[int]:
    """Every token that ends a reply: the tokenizer's EOS and the ChatML turn end (SmolLM2-Instruct
    ends an assistant turn with <|im_end|>, its EOS; the base vocabulary's <|endoftext|> ends text)."""
    found = []
    for text in (tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"):
        if text and text in tokenizer.get_vocab():
            found.append(int(tokenizer.convert_tokens_to_ids(text)))
    return sorted(set(found))


def llm_metadata(tokenizer, context_len: int):
    """LlmMetadata for a ChatML decoder: start token (none unless the tokenizer adds one), stop tokens,
    context, template, capabilities."""
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    for marker in ("<|im_start|>", "<|im_end|>"):  # the template's turn markers must be single tokens
        token_id(tokenizer, marker)
    meta = llm_metadata_pb2.LlmMetadata()
    start = start_token_id(tokenizer)
    if start is not None:
        meta.start_token.token_ids.ids.append(start)
    for stop in stop_token_ids(tokenizer):
        meta.stop_tokens.add().token_ids.ids.append(stop)
    meta.max_num_tokens = int(context_len)
    meta.llm_model_type.generic_model.SetInParent()
    meta.jinja_prompt_template = chat_template("<|im_start|>", "<|im_end|>")
    meta.supports_thinking = False
    meta.supports_function_calling = False
    return meta


def write_litertlm(tflite: Path, tokenizer_json: Path, metadata, out: Path) -> Path:
    """Pack graph + tokenizer + metadata into `out` with litert-lm-builder (validated: the builder
    refuses an LLM without its mandatory capability flags)."""
    from litert_lm_builder import litertlm_builder as lb

    if not Path(tokenizer_json).is_file():
        raise ZooError(f"No tokenizer.json at {tokenizer_json}: LiteRT-LM packs the HF fast tokenizer file.",
                       "use a checkpoint whose tokenizer was saved by a fast (tokenizers) backend.")
    with tempfile.TemporaryDirectory(prefix="zoo-litertlm-") as scratch:
        meta_path = Path(scratch) / "llm_metadata.pb"
        meta_path.write_bytes(metadata.SerializeToString())
        builder = lb.LitertLmFileBuilder()
        builder.add_system_metadata(lb.Metadata(key="Authors", value="zoo", dtype=lb.DType.STRING))
        builder.add_tflite_model(str(tflite), lb.TfLiteModelType.PREFILL_DECODE)
        builder.add_hf_tokenizer(str(tokenizer_json))
        builder.add_llm_metadata(str(meta_path))
        with open(out, "wb") as f:
            builder.build(f, validate_metadata=True)
    return out


# --------------------------------------------------------------------------------------------
# Runtime
# --------------------------------------------------------------------------------------------
class LiteRTLMSession:
    """The LiteRT-LM engine (CPU backend) over a .litertlm, greedy, with the weight cache off (NO_CACHE)."""

    def __init__(self, path: Path, num_threads: int | None = None, benchmark: bool = False):
        self.path = Path(path)
        self.num_threads = num_threads or os.cpu_count()
        self.benchmark = benchmark  # the engine keeps its own prefill/decode counters (timed())
        self.load_s = None

    def __enter__(self) -> "LiteRTLMSession":
        import litert_lm

        from zoo.integrity import verify_artifact_in_bundle

        if not self.path.is_file():
            raise ZooError(f"{self.path} does not exist.", "convert with target=litert: it writes model.litertlm.")
        verify_artifact_in_bundle(self.path)  # in a bundle: its manifest hashes first, like every runner
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
        t0 = time.perf_counter()
        try:
            self.engine = litert_lm.Engine(str(self.path), backend=litert_lm.Backend.CPU(thread_count=self.num_threads),
                                           cache_dir=NO_CACHE, enable_benchmark=self.benchmark)
        except RuntimeError as exc:  # the engine's reasons go to stderr; its exception only says it failed
            raise ZooError(f"LiteRT-LM could not load {self.path} ({exc}).",
                           "re-convert with target=litert; the engine's stderr above names the missing piece.") from exc
        self.load_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()

    def _session(self, new_tokens: int):
        import litert_lm

        # Greedy: top-k 1. The prompt template stays off so the engine sees exactly the gate's raw prompt.
        return self.engine.create_session(apply_prompt_template=False, max_output_tokens=int(new_tokens),
                                          sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0))

    def generate_text(self, prompt: str, new_tokens: int) -> str:
        """Greedy continuation of raw `prompt` (no chat template), at most `new_tokens` tokens."""
        return "".join(self.stream_text(prompt, new_tokens))

    def stream_text(self, prompt: str, new_tokens: int):
        """The same, chunk by chunk as the engine detokenizes (zoo generate prints these)."""
        with self._session(new_tokens) as session:
            try:
                session.run_prefill([prompt])
                for responses in session.run_decode_async():
                    yield "".join(responses.texts)
            except RuntimeError as exc:  # the engine's reason is on stderr; its exception only names the call
                raise ZooError(f"LiteRT-LM failed on this prompt ({exc}); the prompt plus {new_tokens} new tokens "
                               "may not fit the bundle's exported context.",
                               "shorten the prompt or --max-new-tokens, or re-convert with "
                               "model.context_len=<larger>.") from exc

    def timed(self, prompt: str, new_tokens: int) -> dict:
        """One greedy generation, timed by the engine's own counters (needs benchmark=True)."""
        with self._session(new_tokens) as session:
            session.run_prefill([prompt])
            session.run_decode()
            info = session.get_benchmark_info()
        return {"prefill_tokens": info.last_prefill_token_count, "prefill_tok_s": info.last_prefill_tokens_per_second,
                "decode_tokens": info.last_decode_token_count, "decode_tok_s": info.last_decode_tokens_per_second}
