"""Greedy decoding, the generative-session interface and the token transcript, for any model and target.

Everything speaks one small interface, a *step*:

    step(token_ids: list[int], start: int) -> np.ndarray   # float32 logits [vocab] of the last token

`token_ids` are the tokens at absolute positions start .. start+len-1 (the whole prompt at start=0,
then one token per call). A call with start=0 begins a new sequence. Eager modules, a Core AI
bundle and a LiteRT bundle each provide a step; `greedy` drives any of them, and
`token_exact_gate` compares a candidate stream with the reference stream. A component whose session
has a `step` (and `context_len`) is *generative*: `zoo.generate` streams text from its bundles.

The metrics themselves (token_exact, token_agreement, min_logits_cosine) are registered in
zoo/gates.py like every other metric; this module only drives the streams and writes the transcript.

The gate (what the anchor zoo publishes): greedy tokens must be identical to the reference
(transformers fp32 on the same weights). A first divergence is tolerated only where the reference's
own top-2 logit margin is below 0.1 — a knife-edge tie that any rounding difference may flip.
Per-step logits cosine is reported for the steps whose contexts are still identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from zoo.gates import KNIFE_EDGE_MARGIN

StepFn = Callable[[Sequence[int], int], np.ndarray]

DEFAULT_PROMPT = "The alphabet begins A, B, C, D, E, F,"
# Raw text, no chat template: the instruct model continues plain prompts sensibly (the alphabet
# prompt gives " G, H, I, J, ..."), and a template would only add ~20 tokens per step of work.
DEFAULT_PROMPTS = (DEFAULT_PROMPT, "The capital of France is", "def fibonacci(n):")
DEFAULT_NEW_TOKENS = 16


class ContextOverflow(ValueError):
    """A prompt or a decode step does not fit the exported context (names the limit)."""


def check_fits(start: int, n: int, context_len: int) -> None:
    """Raise ContextOverflow unless positions start .. start+n-1 lie inside the context. Bundles
    check on the host: a compiled graph cannot raise and would silently mis-index instead."""
    if n <= 0:
        raise ValueError("a step needs at least one token")
    if start < 0 or start + n > context_len:
        raise ContextOverflow(
            f"positions {start}..{start + n - 1} do not fit the exported context of {context_len} tokens "
            f"(context_len={context_len}); re-export with a larger context_len, or shorten the prompt "
            f"or the generation")


@dataclass
class Stream:
    """A greedy generation: prompt, generated tokens, and the logits each token was chosen from."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


def greedy(step: StepFn, prompt_ids: Sequence[int], new_tokens: int = DEFAULT_NEW_TOKENS) -> Stream:
    """Greedy decoding: one prefill call, then one call per generated token (no EOS stop: the
    gate compares fixed-length streams)."""
    prompt_ids = [int(t) for t in prompt_ids]
    out = Stream(prompt_ids)
    logits = step(prompt_ids, 0)
    for i in range(new_tokens):
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        token = int(np.argmax(logits))
        out.tokens.append(token)
        out.logits.append(logits)
        if i + 1 < new_tokens:
            logits = step([token], len(prompt_ids) + i)
    return out


def full_recompute_step(forward: Callable) -> StepFn:
    """A step over any `forward(ids [1, T] int64) -> logits [1, T, V]` with no cache: it keeps the
    token history and re-runs the whole sequence. Slow but trivially correct: the oracle form."""
    import torch

    history: list[int] = []

    def step(token_ids: Sequence[int], start: int) -> np.ndarray:
        if start == 0:
            history.clear()
        if start != len(history):
            raise ValueError(f"step at start={start}, but {len(history)} tokens are in the history")
        history.extend(int(t) for t in token_ids)
        with torch.no_grad():
            logits = forward(torch.tensor([history], dtype=torch.long))
        return logits[0, -1].float().numpy()

    return step


@dataclass
class TokenGateResult:
    passed: bool
    verdict: str  # "token-exact" | "knife-edge tie" | "diverged" | "prompt mismatch" | "length mismatch" | "non-finite logits"
    first_divergence: int | None
    transcript: dict


def token_exact_gate(reference: Stream, candidate: Stream, knife_edge: float = KNIFE_EDGE_MARGIN,
                     decode: Callable[[list[int]], str] | None = None, prompt_text: str | None = None
                     ) -> TokenGateResult:
    """Compare two greedy streams with the registered token metrics; returns verdict + a JSON-able
    transcript. Pass: identical tokens, or a first divergence at a step where the reference's top-2
    margin is < knife_edge. Fail: a different prompt, a different length, non-finite logits anywhere
    in the candidate, or a decisive divergence."""
    from zoo import gates

    margins = [gates.top2_margin(lg) for lg in reference.logits]
    first = gates.first_divergence(candidate, reference)
    cosines = gates.logits_cosines(candidate, reference)
    exact = gates.token_exact(candidate, reference, knife_edge)
    if candidate.prompt_ids != reference.prompt_ids:
        verdict = "prompt mismatch"
    elif len(candidate.tokens) != len(reference.tokens):
        verdict = "length mismatch"
    elif not gates.stream_is_finite(candidate):
        verdict = "non-finite logits"
    elif first is None:
        verdict = "token-exact"
    else:
        verdict = "knife-edge tie" if exact == 1.0 else "diverged"
    passed = exact == 1.0
    min_cos = gates.min_logits_cosine(candidate, reference)
    transcript = {
        "gate": "greedy_token_exact",
        "rule": f"identical greedy tokens; a first divergence passes only where the reference top-2 "
                f"logit margin < {knife_edge} (knife-edge tie)",
        "knife_edge_margin": knife_edge,
        "prompt_text": prompt_text,
        "prompt_ids": reference.prompt_ids,
        "candidate_prompt_ids": None if candidate.prompt_ids == reference.prompt_ids else candidate.prompt_ids,
        "reference_tokens": reference.tokens,
        "candidate_tokens": candidate.tokens,
        "reference_text": decode(reference.tokens) if decode else None,
        "candidate_text": decode(candidate.tokens) if decode else None,
        "reference_top2_margins": [round(m, 6) for m in margins],
        "logits_cosine": [round(c, 9) if c == c else "nan" for c in cosines],
        "min_logits_cosine": round(min_cos, 9) if min_cos == min_cos else "nan",  # NaN is shown, never skipped
        "token_agreement": gates.token_agreement(candidate, reference),
        "first_divergence": first,
        "margin_at_divergence": None if first is None or first >= len(margins) else round(margins[first], 6),
        "verdict": verdict,
        "passed": passed,
    }
    return TokenGateResult(passed, verdict, first, transcript)


def greedy_driver(runner, payload: dict) -> dict[str, np.ndarray]:
    """Greedy generation through a component's own session on any runner — used in the LiteRT GPU child
    (zoo.targets.litert_gpu.gpu_session_run) to judge the GPU's fp16 path by the model's token gate.

    payload: {"model", "component", "target", "new_tokens", "prompts": {label: [token ids]}}.
    Returns {"<label>/tokens": int array, "<label>/logits": [steps, vocab] float32}.
    """
    from zoo.registry import get_spec, load_model_config

    component = get_spec(load_model_config(payload["model"])).component(payload["component"])
    out = {}
    with component.session(runner, payload["target"]) as session:
        for label, prompt_ids in payload["prompts"].items():
            stream = greedy(session.step, prompt_ids, int(payload["new_tokens"]))
            out[f"{label}/tokens"] = np.asarray(stream.tokens, dtype=np.int64)
            out[f"{label}/logits"] = np.stack(stream.logits).astype(np.float32)
    return out


def streams_from_arrays(arrays: dict[str, np.ndarray], references: dict[str, Stream]) -> dict[str, Stream]:
    """greedy_driver's arrays back into Streams (a label the driver did not return is left out: a
    missing output, which fails its gate)."""
    found = {}
    for label, reference in references.items():
        if f"{label}/tokens" in arrays:
            found[label] = Stream(list(reference.prompt_ids), [int(t) for t in arrays[f"{label}/tokens"]],
                                  list(arrays[f"{label}/logits"]))
    return found
