"""The frozen trunk, cached: run only the adapted top blocks of a decoder LM (notebook ``notebooks/01_moce.py``).

MoCE trains adapters in the top blocks of a frozen backbone (§4.1); the blocks below them are identical in every
compared variant, so their output is computed once (:func:`lower_hidden_states`, stored by
:func:`moelab.moce.build_cache`) and training runs :class:`TopStack` on it. At evaluation time the lower blocks of the
full model are memoised across variants (:func:`trunk_memo`). Both are tested against the full forward pass on tiny
Llama and Gemma-3 models.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from moelab.moce.method import decoder_layers

__all__ = ["lower_hidden_states", "TopStack", "trunk_memo"]


class _Stop(Exception):
    pass


@torch.no_grad()
def lower_hidden_states(model, input_ids: list[torch.Tensor], start: int, batch_size: int = 8) -> list[torch.Tensor]:
    """Input of decoder block ``start`` (= output of the frozen blocks 0..start-1) for each sequence, [S_i, d] fp32.

    Sequences are right-padded per batch; with a causal mask the real positions do not see the padding, so each
    result equals the unpadded forward pass. The forward stops at block ``start`` (a pre-hook raises), so the
    adapted blocks and the LM head never run here.
    """
    blocks = decoder_layers(model)
    if not 0 <= start < len(blocks):
        raise ValueError(f"start block must be in [0, {len(blocks) - 1}], got {start}")
    grabbed = {}

    def grab(mod, args, kwargs):
        grabbed["h"] = args[0] if args else kwargs["hidden_states"]
        raise _Stop

    handle = blocks[start].register_forward_pre_hook(grab, with_kwargs=True)
    out = []
    try:
        model.eval()
        order = sorted(range(len(input_ids)), key=lambda i: -len(input_ids[i]))  # similar lengths per batch
        res = [None] * len(input_ids)
        for b0 in range(0, len(order), batch_size):
            idx = order[b0:b0 + batch_size]
            S = max(len(input_ids[i]) for i in idx)
            ids = torch.zeros(len(idx), S, dtype=torch.long)
            att = torch.zeros(len(idx), S, dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(input_ids[i])] = input_ids[i]
                att[r, : len(input_ids[i])] = 1
            try:
                model(input_ids=ids.to(model.device), attention_mask=att.to(model.device), use_cache=False)
            except _Stop:
                pass
            h = grabbed.pop("h").float().cpu()
            for r, i in enumerate(idx):
                res[i] = h[r, : len(input_ids[i])].clone()
        out = res
    finally:
        handle.remove()
    return out


def _same_type(wrapper: nn.Module, block: nn.Module) -> nn.Module:
    """Models that read ``block.attention_type`` (sliding vs full attention) see the wrapped block's."""
    if hasattr(block, "attention_type"):
        wrapper.attention_type = block.attention_type
    return wrapper


class _Skip(nn.Module):
    """A decoder block that passes its input through (stands for a frozen block whose output is cached)."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@contextlib.contextmanager
def _skipping_lower_blocks(model, start: int):
    """Blocks 0..start-1 replaced by :class:`_Skip` (block indices, and so each block's attention type, unchanged)."""
    base = model.model
    layers = base.layers
    base.layers = nn.ModuleList([_same_type(_Skip(), layers[i]) for i in range(start)] + list(layers[start:]))
    try:
        yield
    finally:
        base.layers = layers


class TopStack(nn.Module):
    """The adapted top blocks + final norm + LM head of a decoder-only Hugging Face LM, run on cached hidden states.

    ``forward(h [B,S,d], labels [B,S]) -> per-token NLL [B,S]`` (0 where labels == -100); logits are computed only
    at the positions that carry a label (the LM head is the largest matmul of a 135M model). The cached states enter
    the model's own forward as ``inputs_embeds`` with the lower blocks skipped, so the model builds its own masks and
    rotary tables per block (Llama: one kind; Gemma-3: sliding-window and global blocks with two rotary bases). This
    needs a model whose forward does not rescale ``inputs_embeds`` (Llama, Mistral, Qwen2, Gemma-3 scale inside the
    embedding module); right padding with a causal mask makes every real position equal to the full model's (tested
    against the full forward pass for Llama and Gemma-3).
    """

    def __init__(self, model, start: int):
        super().__init__()
        if getattr(getattr(model, "config", None), "final_logit_softcapping", None):
            raise ValueError(f"{type(model).__name__} soft-caps its logits (Gemma-2 style) and rescales inputs_embeds "
                             "in its forward: TopStack supports Llama, Mistral, Qwen2 and Gemma-3 layouts only")
        self.model = model
        self.start = start

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        with _skipping_lower_blocks(self.model, self.start):
            return self.model.model(inputs_embeds=h, use_cache=False).last_hidden_state   # final norm applied

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hid = self.hidden(h)                                            # [B,S,d]
        tgt = labels[:, 1:]                                             # next-token targets
        sel = tgt != -100                                               # [B,S-1]
        logits = self.model.lm_head(hid[:, :-1][sel])                   # only labelled positions   [n,V]
        nll = torch.zeros(tgt.shape, dtype=torch.float32, device=h.device)
        nll[sel] = F.cross_entropy(logits.float(), tgt[sel], reduction="none")
        return nll


class _TrunkMemo:
    """The output of blocks 0..start-1 memoised by the content of block 0's inputs.

    The frozen lower blocks are identical in every compared variant, so each evaluation request's trunk output is
    computed once (for the first model evaluated) and reused (written here because no library memoises a sub-stack;
    valid because ``use_cache`` is off, so a forward pass is a pure function of its inputs). Each lower block is
    wrapped in place (:class:`_MemoBlock`), so every block still receives its own mask and rotary table.
    """

    def __init__(self, max_entries: int = 20000):
        self.memo: dict[str, torch.Tensor] = {}
        self.max_entries = max_entries
        self.hits = self.misses = 0
        self.key = None      # key of the forward pass in progress (None: not memoised)
        self.hit = False

    @staticmethod
    def _key(*tensors) -> str:
        h = hashlib.sha1()
        for t in tensors:
            if t is None:
                h.update(b"none")
            elif isinstance(t, torch.Tensor):
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


class _MemoBlock(nn.Module):
    """Block ``i`` of the memoised trunk (``last``: block start-1, whose output is stored)."""

    def __init__(self, block: nn.Module, tm: _TrunkMemo, first: bool, last: bool):
        super().__init__()
        self.block, self.tm, self.first, self.last = block, tm, first, last

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, **kw):
        tm = self.tm
        if self.first:
            bypass = past_key_values is not None or torch.is_grad_enabled()
            tm.key = None if bypass else tm._key(hidden_states, attention_mask, position_ids)
            tm.hit = tm.key is not None and tm.key in tm.memo
            if tm.hit:
                tm.hits += 1
        if tm.hit:  # the remaining lower blocks are skipped; the last one hands over the memoised output
            return tm.memo[tm.key].to(hidden_states.device) if self.last else hidden_states
        h = self.block(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=past_key_values, **kw)
        if self.last and tm.key is not None and len(tm.memo) < tm.max_entries:
            tm.misses += 1
            tm.memo[tm.key] = h.detach()
        return h


@contextlib.contextmanager
def trunk_memo(model, start: int, memo: _TrunkMemo | None = None):
    """Within the block, blocks 0..start-1 are memoised as one trunk (``use_cache`` off). Pass the memo object
    returned by an earlier call (``with trunk_memo(m, s) as tm``) to share it across variants."""
    base = model.model
    layers = base.layers
    tm = memo if memo is not None else _TrunkMemo()
    old_cache = model.config.use_cache
    base.layers = nn.ModuleList([_same_type(_MemoBlock(layers[i], tm, i == 0, i == start - 1), layers[i])
                                 for i in range(start)]
                                + list(layers[start:]))
    model.config.use_cache = False
    try:
        yield tm
    finally:
        base.layers = layers
        model.config.use_cache = old_cache
