"""Scoring for Free-MoE's sweeps and tests (paper 004, Eq. 6's acc(·) and §4.1's metrics; notebook
``notebooks/05_free_moe.py``): thin wrappers that tokenise items and call ``moelab.suite.scorer``, the project's
one log-likelihood scorer; greedy/sampled HumanEval completions run in ``moelab.suite.sandbox``.

Per-item scores: multiple-choice accuracy (0/1, lm-eval's ``acc``), mean log-likelihood per token of a reference
answer (where the data has no accuracy), HumanEval pass@k (the unbiased estimator of Chen et al. 2021, not the
paper's Eq. 11). :func:`item_metrics` gives accuracy and answer likelihood of the same items from one scorer call
with, for multiple choice, the choice-normalised probability of the gold option beside 0/1 accuracy."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from moelab.suite import sandbox, scorer

__all__ = ["ScoreFn", "ITEM_METRICS", "continuation_logprobs", "choice_logprobs", "choice_accuracy", "answer_logprob",
           "item_metrics", "generate_completions", "score_items", "humaneval_score_fn"]

ScoreFn = Callable[[nn.Module, Sequence[dict]], np.ndarray]
ITEM_METRICS = ("score", "acc", "acc_norm", "p_gold", "p_gold_norm", "loglik", "pick")   # item_metrics columns

# ----------------------------------------------------------------------------------------------------------------
# scoring (batched log-likelihoods and greedy generation)
# ----------------------------------------------------------------------------------------------------------------
def _continuation_request(tok, context: str, continuation: str, max_length: int) -> tuple[list[int], list[int]]:
    """This module's tokenisation of one pair (context and continuation apart, no special tokens, the pair
    left-truncated to ``max_length`` tokens, at least one context token kept) as a scorer request."""
    ci = tok(context, add_special_tokens=False)["input_ids"]
    xi = tok(continuation, add_special_tokens=False)["input_ids"]
    if len(xi) == 0:
        raise ValueError(f"empty continuation {continuation!r}")
    ids = (ci + xi)[-max_length:]
    n = min(len(xi), len(ids) - 1)
    return ids[:-n], ids[-n:]


def continuation_logprobs(model: nn.Module, tok, contexts: Sequence[str], continuations: Sequence[str],
                          batch_size: int = 16, max_length: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Σ log p(continuation tokens | context) per pair and the continuation's token count (lm-eval's loglikelihood
    request), scored by ``moelab.suite.scorer`` (one scorer for every evaluation; batched by length,
    continuation-only logits, shared contexts run once)."""
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts vs {len(continuations)} continuations")
    reqs = [_continuation_request(tok, c, x, max_length) for c, x in zip(contexts, continuations)]
    res = scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size)
    return np.array([lp for lp, _ in res], dtype=float), np.array([len(x) for _, x in reqs])


def _choice_requests(tok, prompt: str, choices: Sequence[str], max_length: int) -> list[tuple[list[int], list[int]]]:
    """One scorer request per choice: the prompt keeps its last ``max_length - longest choice`` tokens."""
    ci = tok(prompt, add_special_tokens=False)["input_ids"]
    xs = [tok(c, add_special_tokens=False)["input_ids"] for c in choices]
    if any(len(x) == 0 for x in xs):
        raise ValueError(f"empty choice among {list(choices)!r}")
    ci = ci[-(max_length - max(map(len, xs))):]
    return [(ci, x) for x in xs]


def choice_logprobs(model: nn.Module, tok, prompt: str, choices: Sequence[str], max_length: int = 512) -> np.ndarray:
    """Σ log p(choice tokens | prompt) for each choice; the shared prompt runs once (``moelab.suite.scorer`` repeats
    its KV cache over the choices)."""
    res = scorer.loglikelihood_tokens(model, _choice_requests(tok, prompt, choices, max_length))
    return np.array([lp for lp, _ in res], dtype=float)


def choice_accuracy(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                    max_length: int = 512) -> np.ndarray:
    """Per-item accuracy (0/1) of multiple-choice items ``dict(prompt, choices: list[str], label: int)``: the choice
    with the highest summed log-likelihood wins (lm-eval's ``acc``; same prompt + " " + choice format). All items go
    to ``moelab.suite.scorer`` in one call (each prompt runs once for all its choices)."""
    reqs, spans = [], []
    for k, it in enumerate(items):
        if not it.get("choices"):
            raise ValueError(f"item {k} has no choices")
        r = _choice_requests(tok, it["prompt"], it["choices"], max_length)
        spans.append((len(reqs), len(reqs) + len(r)))
        reqs += r
    lp = np.array([x for x, _ in scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size)], dtype=float)
    return np.array([float(int(np.argmax(lp[a:b])) == int(it["label"])) for (a, b), it in zip(spans, items)])


def answer_logprob(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                   max_length: int = 512) -> np.ndarray:
    """Per-item mean log-likelihood per token of the reference answer given the prompt (``dict(prompt, answer)``):
    the selection score where the reference data has no accuracy (code without tests). Higher is better."""
    lp, n = continuation_logprobs(model, tok, [it["prompt"] for it in items], [it["answer"] for it in items],
                                  batch_size, max_length)
    return lp / np.maximum(n, 1)


@torch.no_grad()
def generate_completions(model: nn.Module, tok, prompts: Sequence[str], max_new_tokens: int = 128,
                         batch_size: int = 8, stop: Sequence[str] = ("\ndef ", "\nclass ", "\nif __name__",
                                                                     "\nprint(", "\n#", "\n```"),
                         do_sample: bool = False, temperature: float = 0.8) -> list[str]:
    """Greedy (or sampled) completions in left-padded batches, cut at the first stop sequence (HumanEval's stops)."""
    device = next(model.parameters()).device
    old_side = tok.padding_side
    tok.padding_side = "left"
    outs = [""] * len(prompts)
    try:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
            kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if do_sample else \
                dict(do_sample=False, temperature=None, top_p=None, top_k=None)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, **kw,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
            for r, i in enumerate(idx):
                text = tok.decode(gen[r, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                cut = min([text.find(st) for st in stop if st in text] + [len(text)])
                outs[i] = text[:cut]
    finally:
        tok.padding_side = old_side
    return outs


def item_metrics(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                 max_length: int = 512) -> np.ndarray:
    """Per-item scores from one ``moelab.suite.scorer`` call: [items, 7] with the columns :data:`ITEM_METRICS`:

    - ``score``: the accuracy-aligned continuous score Eq. 6 selects on: ``p_gold`` for multiple choice, ``loglik``
      for items with a reference answer;
    - ``acc`` / ``acc_norm``: 0/1, lm-eval's ``acc`` (highest summed log-likelihood) and ``acc_norm`` (highest
      log-likelihood per character of the option); NaN without ``choices``;
    - ``p_gold`` / ``p_gold_norm``: p(gold) / Σ p(options), plain and length-normalised
      (``moelab.suite.scorer.choice_scores``); NaN without ``choices``;
    - ``loglik``: mean log-likelihood per token (nats) of the reference ``answer``; NaN for multiple choice (the raw
      gold-option likelihood is not accuracy and is reported nowhere);
    - ``pick``: the option chosen (index; NaN without ``choices``), for the flip analysis.
    """
    reqs, spans = [], []
    for k, it in enumerate(items):
        if it.get("choices"):
            r = _choice_requests(tok, it["prompt"], it["choices"], max_length)
        elif "answer" in it:
            r = [_continuation_request(tok, it["prompt"], it["answer"], max_length)]
        else:
            raise ValueError(f"item {it.get('id', k)!r} has neither 'choices' nor 'answer'")
        spans.append((len(reqs), len(reqs) + len(r)))
        reqs += r
    lp = np.array([x for x, _ in scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size)], dtype=float)
    ntok = np.array([len(x) for _, x in reqs], dtype=float)
    out = np.full((len(items), len(ITEM_METRICS)), np.nan)
    col = {c: j for j, c in enumerate(ITEM_METRICS)}
    for k, ((a, b), it) in enumerate(zip(spans, items)):
        if it.get("choices"):
            cs = scorer.choice_scores(lp[a:b], int(it["label"]), [len(c.removeprefix(" ")) or 1 for c in it["choices"]])
            for name, v in cs.items():
                out[k, col[name]] = v
            out[k, col["pick"]] = int(np.argmax(lp[a:b]))
            out[k, col["score"]] = cs["p_gold"]
        else:
            out[k, col["loglik"]] = out[k, col["score"]] = lp[a] / max(ntok[a], 1.0)
    return out


def score_items(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16) -> np.ndarray:
    """Per-item selection score (:func:`item_metrics`' ``score``): the gold option's choice-normalised probability for
    multiple-choice items, else the reference answer's mean log-likelihood per token."""
    return item_metrics(model, tok, items, batch_size)[:, 0]


def humaneval_score_fn(tok, n: int = 1, ks: Sequence[int] = (1,), temperature: float = 0.8, max_new_tokens: int = 128,
                       batch_size: int = 8, seed: int = 0) -> ScoreFn:
    """Score function for HumanEval problems (``dict(prompt, test, entry_point)``): ``n`` completions per problem
    (greedy if n == 1, else sampled at ``temperature``), each run in ``moelab.suite.sandbox``; returns per-problem
    unbiased pass@k (Chen et al. 2021) for each k in ``ks`` as an array [problems, len(ks)]. The paper's Eq. 11,
    1 - Π_i (1 - P_i), is not this estimator; the standard one is used."""
    if n < max(ks):
        raise ValueError(f"n={n} samples cannot estimate pass@{max(ks)}")

    def fn(model, items):
        torch.manual_seed(seed)
        prompts = [it["prompt"] for it in items for _ in range(n)]
        comps = generate_completions(model, tok, prompts, max_new_tokens, batch_size,
                                     do_sample=n > 1, temperature=temperature)
        out = np.zeros((len(items), len(ks)))
        for j, it in enumerate(items):
            c = sum(sandbox.run_code(sandbox.humaneval_program(it, comp), timeout=5, memory_mb=512).passed
                    for comp in comps[j * n:(j + 1) * n])
            out[j] = [sandbox.pass_at_k(n, int(c), k) for k in ks]
        return out
    return fn

