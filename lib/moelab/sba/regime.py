"""Did phase (b) train the experts apart? The regime of the SBA paper's trained MoE (§III: experts specialised in
direction) measured as changes from the initialisation (notebook ``02_sba``; the targets and why: docs/sba-settings.md).

- :data:`REGIME_TARGETS` / :class:`RegimeTargets`: expert similarity falls by at least ``min_similarity_fall``,
  router top-1 agreement with the initialisation ends below ``max_top1_agreement``, and the validation MNRL ends
  below its value at the initialisation;
- :class:`RegimeProbe`: the three readings of one model against the initial one (expert similarity of the
  parameters, routing JSD across subjects, top-1 / top-k-set agreement of the routing on probe texts), cheap enough
  to run at every evaluation of a training run;
- :func:`regime_reached`: the targets applied to an init and an end reading; :func:`change_from_init`: per
  phase-(b) seed, init, end and change of every reading, and whether the targets are met.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from moelab.core.layer import moe_layers
from moelab.core.similarity import expert_similarity

from .geometry import routed_experts, routing_jsd, st_forward_fn

__all__ = ["RegimeTargets", "REGIME_TARGETS", "routing_counts", "top_agreement", "RegimeProbe", "regime_reached",
           "change_from_init", "READINGS"]

READINGS = ("expert_similarity", "routing_jsd_bits", "top1_agreement", "val_mnrl")


@dataclass(frozen=True)
class RegimeTargets:
    """Phase (b) reaches the regime when ``similarity(init) - similarity(end) >= min_similarity_fall``,
    ``top1_agreement(end vs init) < max_top1_agreement`` and (``val_below_init``) ``val_mnrl(end) < val_mnrl(init)``
    (docs/sba-settings.md; fixed before the screen)."""
    min_similarity_fall: float = 0.05
    max_top1_agreement: float = 0.80
    val_below_init: bool = True

    def __post_init__(self):
        if not 0 < self.min_similarity_fall < 2:
            raise ValueError(f"min_similarity_fall={self.min_similarity_fall!r} must be in (0, 2) (a cosine fall)")
        if not 0 < self.max_top1_agreement <= 1:
            raise ValueError(f"max_top1_agreement={self.max_top1_agreement!r} must be in (0, 1] (a share of tokens)")

    def text(self) -> str:
        return (f"expert similarity falls by >= {self.min_similarity_fall:g}, router top-1 agreement with the init "
                f"< {self.max_top1_agreement:g}" + (", validation MNRL below init" if self.val_below_init else ""))


REGIME_TARGETS = RegimeTargets()


@torch.no_grad()
def routing_counts(model, texts_by_domain: dict, max_tokens: int = 200, forward_fn=None) -> pd.DataFrame:
    """[domain, layer, expert, count] of the top-k assignments of the first ``max_tokens`` real tokens per domain
    (the counts of :func:`moelab.sba.geometry.collect_geometry` without the geometry; for :func:`routing_jsd`)."""
    if not texts_by_domain:
        raise ValueError("texts_by_domain is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    rows = []
    for dom, texts in texts_by_domain.items():
        if not texts:
            raise ValueError(f"domain {dom!r} has no texts")
        idx = routed_experts(model, forward_fn or st_forward_fn(model), list(texts))
        for layer, x in enumerate(idx):
            c = np.bincount(x[:max_tokens].reshape(-1).numpy(), minlength=len(moe_layers(model)[layer].router.weight))
            rows += [dict(domain=dom, layer=layer, expert=e, count=int(n)) for e, n in enumerate(c)]
    return pd.DataFrame(rows)


def top_agreement(idx_a: list, idx_b: list) -> dict:
    """Mean over MoE layers of the share of tokens whose top-1 expert (``top1_agreement``) and whose set of chosen
    experts (``topk_set_agreement``) are equal; ``idx_*``: per layer ``[T, k]`` in router rank order
    (:func:`moelab.sba.geometry.routed_experts` of the same texts)."""
    if not idx_a or len(idx_a) != len(idx_b):
        raise ValueError(f"{len(idx_a)} vs {len(idx_b)} MoE layers; expected the same non-empty layout")
    t1, tk = [], []
    for i, (a, b) in enumerate(zip(idx_a, idx_b)):
        if a.shape != b.shape:
            raise ValueError(f"MoE layer {i}: {tuple(a.shape)} vs {tuple(b.shape)}; the models must see the same tokens")
        t1.append(float((a[:, 0] == b[:, 0]).double().mean()))
        tk.append(float((a.sort(-1).values == b.sort(-1).values).all(-1).double().mean()))
    return dict(top1_agreement=float(np.mean(t1)), topk_set_agreement=float(np.mean(tk)))


class RegimeProbe:
    """The regime readings of a model against the initial one (notebook 02_sba phase (b); SBA paper §III).

    ``init_model``: the phase-(b) start (its routing of ``probe_texts`` is recorded once); ``subjects``: {domain:
    texts} for the routing JSD (first ``max_tokens`` real tokens per domain). ``probe(model)`` returns
    dict(expert_similarity (mean over MoE layers), routing_jsd_bits (mean over layers), top1_agreement,
    topk_set_agreement)."""

    def __init__(self, init_model, probe_texts, subjects: dict, max_tokens: int = 200):
        self.probe_texts = list(probe_texts)
        if not self.probe_texts:
            raise ValueError("RegimeProbe needs probe texts (e.g. validation anchors)")
        self.subjects, self.max_tokens = subjects, max_tokens
        self.init_idx = routed_experts(init_model, st_forward_fn(init_model), self.probe_texts)

    @torch.no_grad()
    def __call__(self, model, counts=None, routed=None) -> dict:
        """The readings of ``model``. ``counts`` (its routing counts on ``subjects``, e.g.
        :func:`moelab.sba.geometry.collect_geometry`'s, same ``max_tokens``) and ``routed`` (its
        :func:`moelab.sba.geometry.routed_experts` of the probe texts, e.g. ``init_idx`` for the initial model) are
        used instead of running those forward passes again when the caller has them."""
        was = model.training
        model.eval()
        try:
            sim = float(np.mean([expert_similarity(layer) for layer in moe_layers(model)]))
            if counts is None:
                counts = routing_counts(model, self.subjects, self.max_tokens)
            jsd = routing_jsd(counts).set_index("layer")
            if routed is None:
                routed = routed_experts(model, st_forward_fn(model), self.probe_texts)
            agree = top_agreement(self.init_idx, routed)
        finally:
            model.train(was)
        return dict(expert_similarity=sim, routing_jsd_bits=float(jsd.loc["mean", "jsd_bits"]), **agree)


def regime_reached(init: dict, end: dict, targets: RegimeTargets = REGIME_TARGETS) -> tuple[bool, list]:
    """Apply ``targets`` to two readings (dicts with ``expert_similarity``, ``val_mnrl``; ``end`` also
    ``top1_agreement`` against the init). Returns (reached, reasons: one sentence per missed target)."""
    for d, name in ((init, "init"), (end, "end")):
        missing = [k for k in ("expert_similarity", "val_mnrl") if k not in d]
        if missing:
            raise ValueError(f"the {name} reading lacks {missing}")
    if "top1_agreement" not in end:
        raise ValueError("the end reading lacks top1_agreement (against the init)")
    fall = init["expert_similarity"] - end["expert_similarity"]
    reasons = []
    if not fall >= targets.min_similarity_fall:
        reasons.append(f"expert similarity fell by {fall:.4f} ({init['expert_similarity']:.4f} -> "
                       f"{end['expert_similarity']:.4f}), target >= {targets.min_similarity_fall:g}")
    if not end["top1_agreement"] < targets.max_top1_agreement:
        reasons.append(f"router top-1 agreement with the init {end['top1_agreement']:.3f}, target "
                       f"< {targets.max_top1_agreement:g}")
    if targets.val_below_init and not end["val_mnrl"] < init["val_mnrl"]:
        reasons.append(f"validation MNRL {init['val_mnrl']:.4f} -> {end['val_mnrl']:.4f} did not fall")
    return not reasons, reasons


def change_from_init(readings: pd.DataFrame, targets: RegimeTargets = REGIME_TARGETS) -> pd.DataFrame:
    """Per phase-(b) seed: init, end and change (end - init) of every reading in :data:`READINGS` present, and
    whether ``targets`` are met. ``readings``: rows [seed, stage ('init' / 'end'), reading columns]; the init's
    ``top1_agreement`` is 1 by definition. Returns one row per seed: ``<reading>_init``, ``<reading>_end``,
    ``<reading>_change``, ``reached``, ``reasons``."""
    need = {"seed", "stage", "expert_similarity", "val_mnrl", "top1_agreement"}
    if not need <= set(readings.columns):
        raise ValueError(f"readings lack columns {sorted(need - set(readings.columns))}")
    rows = []
    for seed, d in readings.groupby("seed", sort=True):
        st = d.set_index("stage")
        if not {"init", "end"} <= set(st.index) or len(st) != len(set(st.index)):
            raise ValueError(f"seed {seed}: expected one 'init' and one 'end' row, got {list(st.index)}")
        init, end = st.loc["init"].to_dict(), st.loc["end"].to_dict()
        row = dict(seed=seed)
        for r in READINGS:
            if r in st.columns:
                row.update({f"{r}_init": init[r], f"{r}_end": end[r], f"{r}_change": end[r] - init[r]})
        ok, why = regime_reached(init, end, targets)
        rows.append(dict(row, reached=ok, reasons="; ".join(why)))
    return pd.DataFrame(rows)
