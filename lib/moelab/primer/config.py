"""Per-profile sizes of notebook 00 (the MoE primer, ``notebooks/00_moe_primer.py``): one frozen
:class:`PrimerProfile` per profile (``smoke``, ``default``, ``full``, ``paper``), read by the notebook's
derived-settings cell; :func:`profile_table` prints them beside the reference setting (nomic-embed-v2-moe's MoE
layout, Switch Transformer's balancing coefficient) in the notebook's introduction.

A module beside :mod:`moelab.primer` rather than a class inside it: the primer's helpers are the method (embedding,
routing statistics, aggregation, dispatch timing) and stay free of per-profile numbers, as a paper package keeps its
sizes in ``<paper>/config.py``; a reader who wants "how big is smoke" opens this one short file.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import pandas as pd

from moelab.profiles import check_profile

__all__ = ["PrimerProfile", "PROFILES", "profile", "profile_table", "REFERENCE"]


@dataclass(frozen=True)
class PrimerProfile:
    """Every size notebook 00 uses. Model: all-MiniLM-L6-v2 with ``num_experts`` experts and top-``top_k`` routing in
    ``layers`` ("every_other": 1, 3, 5). Data: ``n_train`` WordNet (lemma, gloss) training pairs and ``n_eval``
    held-out ones (the first ``n_eval_loss`` of them for the held-out contrastive loss). Training: ``steps`` steps of
    ``batch`` pairs, routers at ``router_lr``, experts at ``expert_lr``, ``warmup_frac`` warm-up, the balancing run
    with ``aux_coef``, evaluated every ``eval_every`` steps; both arms are trained for each of ``seeds`` training
    seeds (the seed draws the routers, the batch order and dropout; the balancing comparison is paired by seed and
    needs 3 to be decided). Top-p thresholds ``top_p``; dispatch timing at ``timing_tokens`` tokens,
    ``timing_repeats`` repeats each."""
    name: str
    n_train: int
    steps: int
    num_experts: int = 8
    top_k: int = 2
    layers: str = "every_other"
    router_lr: float = 1e-3
    expert_lr: float = 3e-5
    batch: int = 16
    aux_coef: float = 0.05
    warmup_frac: float = 0.1
    top_p: tuple = (0.3, 0.5, 0.7)
    n_eval: int = 256
    n_eval_loss: int = 64
    eval_every: int = 20
    timing_tokens: tuple = (64, 256)
    timing_repeats: int = 3
    seeds: int = 3

    def __post_init__(self):
        check_profile(self.name)
        if self.n_eval_loss > self.n_eval:
            raise ValueError(f"n_eval_loss={self.n_eval_loss} > n_eval={self.n_eval}: the held-out loss pairs are "
                             "the first n_eval_loss held-out pairs")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} > num_experts={self.num_experts}")
        if self.seeds < 1:
            raise ValueError(f"seeds={self.seeds}: train at least one seed per arm")

    def settings(self) -> dict:
        """The settings as the notebook saves them (``config.json``: the same keys, in the same order, as before the
        configuration moved here; lists for the tuples)."""
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
             if k not in ("name", "seeds", "n_train", "steps")}
        return {**d, "n_train": self.n_train, "steps": self.steps}


_FULL = dict(n_train=6400, steps=200, batch=32, eval_every=25, timing_tokens=(64, 256, 1024))

PROFILES = {
    "smoke": PrimerProfile("smoke", n_train=64, steps=4, batch=8, n_eval=64, n_eval_loss=32, eval_every=2,
                           timing_tokens=(32, 64), timing_repeats=1, seeds=1),
    "default": PrimerProfile("default", n_train=1280, steps=40),
    "full": PrimerProfile("full", **_FULL),
    "paper": PrimerProfile("paper", **_FULL),
}

# the reference setting the primer's layout follows (there is no paper to reproduce: nomic-embed-v2-moe for the MoE
# layout, Switch Transformer for the balancing loss)
REFERENCE = dict(model="all-MiniLM-L6-v2 (6 BERT layers, d=384, FFN 1536)",
                 moe_layers="nomic-embed-v2-moe: every other layer, 8 experts, top-2",
                 data="sentence pairs (MiniLM's own objective)", training="Switch: balancing coefficient 0.01")


def profile(name: str, dry_run: bool = False) -> PrimerProfile:
    """The :class:`PrimerProfile` of ``name``; ValueError naming the value and the profiles otherwise. ``dry_run``
    (paper profile only, issue 51): the paper profile at smoke sizes (the primer reads no local paths, so its dry run
    only rehearses the code)."""
    check_profile(name)
    if dry_run:
        if name != "paper":
            raise ValueError(f"DRY_RUN=True is for PROFILE='paper', got {name!r}")
        return replace(PROFILES["smoke"], name="paper")
    return PROFILES[name]


def profile_table(current: str | None = None) -> pd.DataFrame:
    """The reference setting beside every profile's (notebook 00's introduction): one row per setting, one column
    per profile; ``current`` marks the running profile."""
    cols = {"reference": REFERENCE}
    for n, p in PROFILES.items():
        cols[n + (" (this run)" if n == current else "")] = dict(
            model="all-MiniLM-L6-v2", moe_layers=f"layers 1, 3, 5; {p.num_experts} experts, top-{p.top_k}",
            data=f"WordNet noun (lemma, gloss) pairs: {p.n_train} train, {p.n_eval} held-out",
            training=f"{p.steps} steps of {p.batch} pairs x 2 arms x {p.seeds} seed(s) (balancing coefficient "
                     f"{p.aux_coef:g})",
            seeds=str(p.seeds), timing_tokens=", ".join(map(str, p.timing_tokens)))
    return pd.DataFrame(cols).fillna("-").rename_axis("setting").reset_index()
