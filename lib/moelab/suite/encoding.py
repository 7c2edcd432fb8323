"""One tokenisation of a (context, answer) pair, shared by training and scoring.

Training on answer tokens (``moelab.moce.tokenize_example``, notebook 01) and scoring reference answers
(``moelab.suite.lmeval.domain_nll``) must feed the model the same tokens, special tokens included: a model trained
without its ``<bos>`` and scored with it (Gemma-3 adds ``<bos>``; Llama-2 ``<s>``; SmolLM2 adds nothing) is scored on
inputs it never saw. The rule, lm-eval's for a loglikelihood request:

- the context is tokenised with the tokenizer's special tokens (``add_special_tokens=True``: the model's own BOS);
- the answer is tokenised apart, without special tokens, after a single leading space (kept as is when it already
  starts with a space or a newline), so the context's last token never merges with the answer's first.

:func:`encode_pair` returns ``(context_ids, answer_ids)``; training appends EOS to the answer and labels the answer
only; scoring sums log p(answer_ids | context_ids).
"""
from __future__ import annotations

__all__ = ["answer_text", "encode_pair", "special_prefix_length"]


def answer_text(answer: str) -> str:
    """The answer as it follows the context: one leading space unless it starts with a space or newline."""
    if not isinstance(answer, str):
        raise ValueError(f"answer must be a string, got {type(answer).__name__}: {answer!r}")
    return answer if answer.startswith((" ", "\n")) else " " + answer.lstrip()


def encode_pair(tok, context: str, answer: str) -> tuple[list[int], list[int]]:
    """``(context_ids, answer_ids)``: the context with the tokenizer's special tokens, the answer (see
    :func:`answer_text`) without. Empty answer tokens or an empty context -> ``ValueError`` naming the text."""
    if not isinstance(context, str):
        raise ValueError(f"context must be a string, got {type(context).__name__}: {context!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"empty reference answer {answer!r} for context {context[:60]!r}: nothing to score")
    ctx = list(tok(context, add_special_tokens=True)["input_ids"])
    ans = list(tok(answer_text(answer), add_special_tokens=False)["input_ids"])
    if not ans:
        raise ValueError(f"empty reference answer {answer!r} for context {context[:60]!r}")
    if not ctx:
        raise ValueError(f"context {context[:60]!r} has no tokens and the tokenizer adds no BOS: nothing to condition "
                         "on (give a non-empty context)")
    return ctx, ans


def special_prefix_length(tok, ids) -> int:
    """How many leading tokens of ``ids`` the tokenizer itself adds in front of any text (its special prefix, e.g.
    ``<bos>``; what it returns for the empty string): kept when a long context is cut from the left, so truncation
    never drops the BOS. 0 when ``ids`` does not start with that prefix."""
    prefix = list(tok("", add_special_tokens=True)["input_ids"])
    return len(prefix) if prefix and list(ids[:len(prefix)]) == prefix else 0
