"""One log-likelihood scorer for every language-model evaluation in moelab.

A request is a tokenised ``(context, continuation)`` pair; the answer is lm-eval's: ``(Σ_t log p(x_t | x_<t), is_greedy)``
over the continuation's tokens, where ``is_greedy`` says that every continuation token is the argmax of its position.
The numbers equal lm-eval's ``HFLM._loglikelihood_tokens`` on the same tokens (same left truncation to
``max_length + 1`` tokens, float32 log-softmax); what changes is the work done to get them:

- **continuation-only logits**: the model's body runs on the whole input, but the LM head and the float32 log-softmax
  run only at the positions that predict a continuation token (HFLM computes ``[B, S, V]`` logits; the head is the
  largest matmul of a small model, Gemma-3's has 262k rows);
- **shared context**: requests with the same context tokens (the options of a multiple-choice item) run the context
  once (lm-eval shares the context only for single-token options). Hugging Face models pack the context and all its
  options into one row under a mask that lets each option see only the context and itself (with the options'
  position ids continuing the context's), several items per forward pass; other models with a KV cache run the
  context once and repeat its cache over the options;
- **batched by length**: the remaining sequences run in right-padded batches of similar length (causal attention:
  right padding never reaches a real position).

Models (:func:`as_scoring_model`): a Hugging Face causal LM (body ``get_decoder()``, head ``get_output_embeddings()``,
Gemma-2-style final soft-capping when the config sets it), MoCE's cached-trunk :class:`moelab.moce.TopStack`
(inputs are the trunk's hidden states, so requests carry embeddings and no KV cache: scored with the no-cache path),
or any callable ``f(input_ids, attention_mask=None, past_key_values=None, use_cache=False)`` returning logits or an
output with ``.logits`` (:class:`LogitsModel`: no head split, so no continuation-only saving).

``batch_context(rows, attention_mask)``, optional, returns a context manager entered around every forward pass; ``rows``
are the request indices of the batch rows (repeated for the options of a shared context). Callers set per-request
model state with it (MoCE's sequence cluster ids); free_moe's purification masks are applied to the weights before the
call and need nothing here.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

HEAD_CHUNK = 256          # positions per LM-head matmul + log-softmax (bounds the float32 [chunk, V] buffer)
DEFAULT_BATCH_SIZE = 16


# ----------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------
class ScoringModel:
    """What the scorer needs from a model: ``body`` (inputs -> last hidden states, and the KV cache when asked) and
    ``head`` (hidden states at the kept positions -> logits). ``takes_embeddings``: requests carry input vectors."""

    supports_cache = False
    takes_embeddings = False

    def __init__(self, module: nn.Module):
        self.module = module

    @property
    def device(self) -> torch.device:
        p = next(self.module.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def body(self, inputs: torch.Tensor, attention_mask=None, past_key_values=None, use_cache: bool = False):
        raise NotImplementedError

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _softcap(model: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class HFCausalLM(ScoringModel):
    """A Hugging Face ``*ForCausalLM``: body = ``get_decoder()`` (final norm applied), head = ``lm_head`` (+ soft-cap).

    Packing (:func:`_run_packed`) passes a custom 4-D additive mask and explicit position ids: transformers returns a
    4-D mask unchanged (``masking_utils``) for the ``eager`` and ``sdpa`` attention kernels. Models with sliding-window
    layers (Gemma-3) take a ``{layer type: mask}`` mapping when their decoder reads one; otherwise a packed row must fit
    in the window (else the item runs on the KV-cache path)."""

    supports_cache = True

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        if self.decoder is None or self.lm_head is None:
            raise ValueError(f"{type(model).__name__} has no decoder/LM-head split: wrap it in scorer.LogitsModel")
        cfg = getattr(model, "config", None)
        self.supports_packing = getattr(cfg, "_attn_implementation", None) in ("eager", "sdpa")
        types = getattr(cfg, "layer_types", None) or []
        self.sliding_window = getattr(cfg, "sliding_window", None) if "sliding_attention" in types else None
        self.layer_types = sorted(set(types))
        try:   # decoders written as Gemma-3's read a {layer type: 4-D mask} mapping
            self.takes_mask_mapping = "causal_mask_mapping := attention_mask, dict" in inspect.getsource(
                type(self.decoder).forward)
        except (OSError, TypeError):
            self.takes_mask_mapping = False

    def fits_packing(self, max_position: int) -> bool:
        return self.supports_packing and (self.sliding_window is None or self.takes_mask_mapping
                                          or max_position < self.sliding_window)

    def body(self, inputs, attention_mask=None, past_key_values=None, use_cache=False, position_ids=None):
        out = self.decoder(input_ids=inputs, attention_mask=attention_mask, past_key_values=past_key_values,
                           use_cache=use_cache, position_ids=position_ids)
        return out.last_hidden_state, (out.past_key_values if use_cache else None)

    def head(self, hidden):
        return _softcap(self.module, self.lm_head(hidden))


class TopStackModel(ScoringModel):
    """MoCE's :class:`moelab.moce.TopStack`: inputs are the frozen trunk's hidden states ``[B, S, d]``; no KV cache
    (``TopStack.hidden`` runs the model with ``use_cache=False``), so shared contexts are not shared here."""

    takes_embeddings = True

    def __init__(self, stack: nn.Module):
        super().__init__(stack)
        self.stack = stack

    def body(self, inputs, attention_mask=None, past_key_values=None, use_cache=False):
        return self.stack.hidden(inputs), None

    def head(self, hidden):
        return _softcap(self.stack.model, self.stack.model.lm_head(hidden))


class LogitsModel(ScoringModel):
    """Any forward ``f(input_ids, attention_mask=None, past_key_values=None, use_cache=False)`` that returns logits
    (a tensor or an output with ``.logits``): the "hidden state" is the logits, the head is the identity.
    ``supports_cache``: the forward accepts ``past_key_values`` and returns them (``.past_key_values``)."""

    def __init__(self, forward: Callable, module: nn.Module | None = None, supports_cache: bool = False):
        super().__init__(module if module is not None else (forward if isinstance(forward, nn.Module) else nn.Module()))
        self.forward = forward
        self.supports_cache = supports_cache

    def body(self, inputs, attention_mask=None, past_key_values=None, use_cache=False):
        kw = dict(past_key_values=past_key_values, use_cache=use_cache) if self.supports_cache else {}
        out = self.forward(inputs, attention_mask=attention_mask, **kw)
        logits = out if torch.is_tensor(out) else out.logits
        return logits, (out.past_key_values if use_cache and not torch.is_tensor(out) else None)

    def head(self, hidden):
        return hidden


def as_scoring_model(model) -> ScoringModel:
    """The :class:`ScoringModel` for ``model`` (see the module docstring for what is accepted)."""
    if isinstance(model, ScoringModel):
        return model
    moce = sys.modules.get("moelab.moce")              # a TopStack exists only once moelab.moce is imported
    if moce is not None and isinstance(model, moce.TopStack):
        return TopStackModel(model)
    if isinstance(model, nn.Module) and hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings"):
        if model.get_decoder() is not None and model.get_output_embeddings() is not None:
            return HFCausalLM(model)
    if callable(model):
        return LogitsModel(model)
    raise ValueError(f"cannot score with a {type(model).__name__}: pass a Hugging Face causal LM, a moce.TopStack, "
                     "a callable returning logits, or a scorer.ScoringModel")


# ----------------------------------------------------------------------------------------------------------------
# the head on kept positions
# ----------------------------------------------------------------------------------------------------------------
def _head_scores(sm: ScoringModel, hidden: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor):
    """log p(tok_j) and [argmax == tok_j] at hidden row ``pos[j]``: ``hidden [P, d]`` (the kept positions only),
    head + float32 log-softmax in chunks of ``HEAD_CHUNK`` positions."""
    lp = torch.empty(len(pos), dtype=torch.float64)
    greedy = torch.empty(len(pos), dtype=torch.bool)
    pos, tok = pos.to(hidden.device), tok.to(hidden.device)
    for a in range(0, hidden.shape[0], HEAD_CHUNK):
        b = min(a + HEAD_CHUNK, hidden.shape[0])
        logits = sm.head(hidden[a:b]).float()                              # [c, V]
        lsm = F.log_softmax(logits, dim=-1)
        top = logits.argmax(-1)
        sel = ((pos >= a) & (pos < b)).nonzero().view(-1)
        if len(sel):
            p, t = pos[sel] - a, tok[sel]
            lp[sel.cpu()] = lsm[p, t].double().cpu()
            greedy[sel.cpu()] = (top[p] == t).cpu()
    return lp, greedy


def _collect(parts, lp, greedy, out):
    """Sum per request: ``parts`` is a list of (request index, slice into the flat target arrays)."""
    for r, sl in parts:
        out[r] = (float(lp[sl].sum()), bool(greedy[sl].all()))


# ----------------------------------------------------------------------------------------------------------------
# the two paths
# ----------------------------------------------------------------------------------------------------------------
def _run_plain(sm, items, batch_size, batch_context, out):
    """``items``: (inputs [L] ids or [L, d], n kept positions at the end, [(request, targets[n])...]); sorted by length
    (longest first, as lm-eval), right-padded batches, no KV cache."""
    items = sorted(items, key=lambda it: -len(it[0]))
    device = sm.device
    for s in range(0, len(items), batch_size):
        chunk = items[s:s + batch_size]
        L = len(chunk[0][0])
        if sm.takes_embeddings:
            d = chunk[0][0].shape[-1]
            x = torch.zeros(len(chunk), L, d, dtype=chunk[0][0].dtype)
        else:
            x = torch.zeros(len(chunk), L, dtype=torch.long)
        mask = torch.zeros(len(chunk), L, dtype=torch.long)
        rows, cols, pos, tok, parts = [], [], [], [], []
        for b, (inp, n, sets) in enumerate(chunk):
            x[b, :len(inp)] = inp if torch.is_tensor(inp) else torch.as_tensor(inp)
            mask[b, :len(inp)] = 1
            base = len(rows)
            rows += [b] * n
            cols += list(range(len(inp) - n, len(inp)))
            for r, tg in sets:
                parts.append((r, slice(len(pos), len(pos) + n)))
                pos += range(base, base + n)
                tok += list(tg)
        with batch_context([sets[0][0] for _, _, sets in chunk], mask):
            hidden, _ = sm.body(x.to(device))                             # no mask: right padding is causal-safe
        kept = hidden[torch.tensor(rows, device=hidden.device), torch.tensor(cols, device=hidden.device)]
        lp, greedy = _head_scores(sm, kept, torch.tensor(pos), torch.tensor(tok))
        _collect(parts, lp, greedy, out)


def _run_shared(sm, ctx, options, batch_context, out):
    """One context, several options (some longer than one token): the context runs once with the KV cache, the
    cache is repeated over the options, which run their own tokens (right-padded, all attended: causal)."""
    device = sm.device
    r0 = options[0][0]
    with batch_context([r0], torch.ones(1, len(ctx), dtype=torch.long)):
        hidden, past = sm.body(torch.tensor([ctx], device=device), use_cache=True)
    first = hidden[0, -1:]                                                 # predicts every option's first token
    multi = [(r, tg) for r, tg in options if len(tg) > 1]
    pos, tok, parts = [], [], []
    for r, tg in options:
        parts.append((r, slice(len(pos), len(pos) + len(tg))))
        pos.append(0)
        tok.append(tg[0])
        pos += [None] * (len(tg) - 1)                                     # filled below (rows of the option pass)
        tok += list(tg[1:])
    kept = [first]
    if multi:
        Lo = max(len(tg) for _, tg in multi) - 1
        ids = torch.zeros(len(multi), Lo, dtype=torch.long)
        for b, (_, tg) in enumerate(multi):
            ids[b, :len(tg) - 1] = torch.tensor(tg[:-1])
        past.batch_repeat_interleave(len(multi))
        am = torch.ones(len(multi), len(ctx) + Lo, dtype=torch.long)
        with batch_context([r for r, _ in multi], am):
            h2, _ = sm.body(ids.to(device), attention_mask=am.to(device), past_key_values=past)
        rows = torch.cat([torch.full((len(tg) - 1,), b) for b, (_, tg) in enumerate(multi)])
        cols = torch.cat([torch.arange(len(tg) - 1) for _, tg in multi])
        kept.append(h2[rows.to(h2.device), cols.to(h2.device)])
        nxt = iter(range(1, 1 + len(rows)))
        pos = [p if p is not None else next(nxt) for p in pos]
    lp, greedy = _head_scores(sm, torch.cat(kept), torch.tensor(pos), torch.tensor(tok))
    _collect(parts, lp, greedy, out)


def _pack(ctx, options):
    """One row holding a context and all its options: ids ``ctx + opt_1[:-1] + opt_2[:-1] + ...``, the position id of
    every token (each option continues the context at position ``len(ctx)``), its segment (-1 = context, j = option
    j), and per option the row indices whose hidden states predict its tokens (the context's last, then its own)."""
    C = len(ctx)
    ids, pos, seg, kept = list(ctx), list(range(C)), [-1] * C, []
    for j, (_, tg) in enumerate(options):
        start = len(ids)
        ids += tg[:-1]
        pos += range(C, C + len(tg) - 1)
        seg += [j] * (len(tg) - 1)
        kept.append([C - 1] + list(range(start, start + len(tg) - 1)))
    return ids, pos, seg, kept


def _packed_mask(pos, seg, valid, window, dtype):
    """Additive ``[B, 1, L, L]`` mask: query ``q`` sees key ``k <= q`` of the context or of its own option (and, for a
    sliding-window layer, only keys with ``pos_q - pos_k < window``); padding rows see themselves (no all-masked
    softmax). ``pos``, ``seg``: ``[B, L]``; ``valid``: ``[B, L]`` bool."""
    L = pos.shape[1]
    idx = torch.arange(L)
    see = (idx[None, None, :] <= idx[None, :, None]) & valid[:, None, :] & valid[:, :, None]
    see &= (seg[:, None, :] == -1) | (seg[:, None, :] == seg[:, :, None])
    if window is not None:
        see &= (pos[:, :, None] - pos[:, None, :]) < window
    see |= torch.eye(L, dtype=torch.bool)[None]
    mask = torch.zeros(see.shape, dtype=dtype)
    return mask.masked_fill_(~see, torch.finfo(dtype).min)[:, None]


def _run_packed(sm, items, batch_size, batch_context, out):
    """Multiple-choice items with multi-token options, several items per forward pass: each item is one row (its
    context once, then every option's tokens, :func:`_pack`) under a mask that lets an option see the context and
    itself only, so each option's log-probabilities are those of ``context + option`` alone. One forward pass per
    ``batch_size`` items, instead of a context pass and an option pass per item (:func:`_run_shared`)."""
    if not items:
        return
    packed = sorted(((_pack(ctx, opts), opts) for ctx, opts in items), key=lambda it: -len(it[0][0]))
    device = sm.device
    dtype = next(sm.module.parameters()).dtype
    for s in range(0, len(packed), batch_size):
        chunk = packed[s:s + batch_size]
        B, L = len(chunk), len(chunk[0][0][0])
        ids = torch.zeros(B, L, dtype=torch.long)
        pos = torch.zeros(B, L, dtype=torch.long)
        seg = torch.full((B, L), -2, dtype=torch.long)
        valid = torch.zeros(B, L, dtype=torch.bool)
        rows, cols, tok, parts = [], [], [], []
        for b, ((i, p, g, kept), opts) in enumerate(chunk):
            n = len(i)
            ids[b, :n], pos[b, :n], seg[b, :n], valid[b, :n] = torch.tensor(i), torch.tensor(p), torch.tensor(g), True
            for (r, tg), kp in zip(opts, kept):
                parts.append((r, slice(len(tok), len(tok) + len(tg))))
                rows += [b] * len(kp)
                cols += kp
                tok += tg
        full = _packed_mask(pos, seg, valid, None, dtype)
        if sm.sliding_window is not None and sm.takes_mask_mapping:
            sliding = _packed_mask(pos, seg, valid, sm.sliding_window, dtype)
            mask = {t: (sliding if t == "sliding_attention" else full).to(device) for t in sm.layer_types}
        else:
            mask = full.to(device)
        with batch_context([opts[0][0] for _, opts in chunk], valid.long()):
            hidden, _ = sm.body(ids.to(device), attention_mask=mask, position_ids=pos.to(device))
        kept_h = hidden[torch.tensor(rows, device=hidden.device), torch.tensor(cols, device=hidden.device)]
        lp, greedy = _head_scores(sm, kept_h, torch.arange(len(tok)), torch.tensor(tok))
        _collect(parts, lp, greedy, out)


# ----------------------------------------------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------------------------------------------
def _no_context(rows, mask):
    return contextlib.nullcontext()


def _check_batch(batch_size):
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


@torch.no_grad()
def loglikelihood_tokens(model, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                         batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                         share_context: bool = True, batch_context=None) -> list[tuple[float, bool]]:
    """``(Σ log p(continuation | context), is_greedy)`` per ``(context_ids, continuation_ids)`` request, in order.

    ``max_length``: lm-eval's left truncation (the input ``(context + continuation)[-(max_length + 1):][:-1]``);
    None = no truncation. ``share_context``: run a context shared by several requests once (KV cache over the
    options). ``batch_context(rows, attention_mask)``: see the module docstring.
    """
    _check_batch(batch_size)
    sm = as_scoring_model(model)
    if sm.takes_embeddings:
        raise ValueError(f"{type(sm).__name__} takes hidden states: use scorer.loglikelihood_embeddings")
    batch_context = batch_context or _no_context
    groups: dict[tuple, list] = {}
    for i, (ctx, cont) in enumerate(requests):
        ctx, cont = [int(t) for t in ctx], [int(t) for t in cont]
        if not cont:
            raise ValueError(f"request {i} has an empty continuation: every request needs at least one token to score")
        if max_length is not None:
            if len(cont) > max_length:
                raise ValueError(f"request {i}: continuation of {len(cont)} tokens exceeds max_length={max_length}")
            ctx = (ctx + cont)[-(max_length + 1):][:-len(cont)]
        if not ctx:
            raise ValueError(f"request {i} has an empty context: prepend a BOS/EOS token (lm-eval's prefix token)")
        groups.setdefault(tuple(ctx), []).append((i, cont))
    out: list = [None] * len(requests)
    plain, packed = [], []
    was_training = sm.module.training
    sm.module.eval()
    try:
        for ctx, opts in groups.items():
            ctx = list(ctx)
            if share_context and len(opts) > 1 and all(len(c) == 1 for _, c in opts):
                plain.append((ctx, 1, opts))                               # one forward of the context serves all
            elif (share_context and len(opts) > 1 and getattr(sm, "fits_packing", None) is not None
                  and sm.fits_packing(len(ctx) + max(len(c) for _, c in opts) - 2)):
                packed.append((ctx, opts))                                 # context once, options in the same row
            elif share_context and len(opts) > 1 and sm.supports_cache:
                _run_shared(sm, ctx, opts, batch_context, out)
            else:
                plain += [((ctx + c)[:-1], len(c), [(r, c)]) for r, c in opts]
        _run_packed(sm, packed, batch_size, batch_context, out)
        _run_plain(sm, plain, batch_size, batch_context, out)
    finally:
        sm.module.train(was_training)
    return out


@torch.no_grad()
def loglikelihood_embeddings(model, requests: Sequence[tuple[torch.Tensor, Sequence[int]]], *,
                             batch_size: int = DEFAULT_BATCH_SIZE, batch_context=None) -> list[tuple[float, bool]]:
    """The same for models that take input vectors (MoCE's :class:`TopStack`): a request is ``(inputs [S, d],
    targets [n])``, the last ``n`` of the ``S`` positions being the continuation whose token ids are ``targets``
    (position ``S - n - 1 + j`` predicts ``targets[j]``). No KV cache."""
    _check_batch(batch_size)
    sm = as_scoring_model(model)
    items = []
    for i, (x, tg) in enumerate(requests):
        tg = [int(t) for t in tg]
        if x.dim() != 2:
            raise ValueError(f"request {i}: inputs must be [S, d], got shape {tuple(x.shape)}")
        if not tg or len(tg) >= x.shape[0]:
            raise ValueError(f"request {i}: need 1 <= len(targets) < S, got {len(tg)} targets for S={x.shape[0]}")
        items.append((x[:-1], len(tg), [(i, tg)]))
    out: list = [None] * len(requests)
    was_training = sm.module.training
    sm.module.eval()
    try:
        _run_plain(sm, items, batch_size, batch_context or _no_context, out)
    finally:
        sm.module.train(was_training)
    return out


def bits_per_byte(loglikelihood: float, text: str) -> float:
    """``-loglikelihood / ln 2 / bytes(text)`` (at least one byte): the suite's answer-likelihood metric."""
    return float(-loglikelihood / math.log(2) / max(1, len(text.encode("utf-8"))))


# ----------------------------------------------------------------------------------------------------------------
# multiple choice: 0/1 accuracy and the accuracy-aligned continuous score from the options' log-likelihoods
# ----------------------------------------------------------------------------------------------------------------
def choice_scores(logliks: Sequence[float], gold: int, lengths: Sequence[float] | None = None) -> dict:
    """One multiple-choice item from its options' summed log-likelihoods ``ℓ_i`` (this scorer's output):

    - ``acc``: 1 if argmax_i ℓ_i is the gold option (lm-eval's ``acc``; ties -> the first option, numpy's argmax);
    - ``p_gold``: the choice-normalised probability of the gold option, p(gold) / Σ_i p(option i) = softmax(ℓ)_gold,
      the continuous score whose argmax is ``acc`` (moves only where accuracy can);
    - with ``lengths`` (lm-eval's ``acc_norm`` normaliser: the options' character lengths), ``acc_norm`` = 1 if
      argmax_i ℓ_i / len_i is gold, and ``p_gold_norm`` = softmax(ℓ / len)_gold, its continuous counterpart.

    The raw gold log-likelihood ℓ_gold is not returned: it moves with every option alike and is not accuracy.
    Used by notebook 05 (Free-MoE) through ``moelab.free_moe.scoring.item_metrics``."""
    lp = torch.as_tensor(list(logliks), dtype=torch.float64)
    if lp.dim() != 1 or len(lp) < 2:
        raise ValueError(f"choice_scores: need the log-likelihoods of at least two options, got {list(logliks)!r}")
    if not 0 <= int(gold) < len(lp):
        raise ValueError(f"choice_scores: gold={gold} is not an option index (0..{len(lp) - 1})")
    out = dict(acc=float(int(torch.argmax(lp)) == int(gold)), p_gold=float(torch.softmax(lp, 0)[int(gold)]))
    if lengths is not None:
        ln = torch.as_tensor(list(lengths), dtype=torch.float64)
        if ln.shape != lp.shape or bool((ln <= 0).any()):
            raise ValueError(f"choice_scores: lengths {list(lengths)!r} must be positive, one per option")
        z = lp / ln                                                            # ℓ_i / len_i   (acc_norm)
        out.update(acc_norm=float(int(torch.argmax(z)) == int(gold)), p_gold_norm=float(torch.softmax(z, 0)[int(gold)]))
    return out
