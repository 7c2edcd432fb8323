"""Per-profile sizes of notebook 04 (MASS, paper 003): one frozen :class:`MassProfile` per profile (``smoke``,
``default``, ``full``, ``paper``), read by the notebook's derived-settings cell; :func:`profile_table` prints them
beside the paper's setting.  How the settings were chosen (on a validation draw only) is in docs/mass-settings.md.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from moelab.mass.experiment import SynthSetup, mass_config
from moelab.mass.method import MassConfig

__all__ = ["MassProfile", "GlueProfile", "PROFILES", "profile", "profile_table", "synth"]


@dataclass(frozen=True)
class GlueProfile:
    """The real-data part (GLUE stand-in, notebook 04 section 6): tasks (None: every usable task), methods, seeds and
    the fields of :class:`moelab.mass.GlueStandinConfig`."""
    tasks: tuple | None = None
    methods: tuple = ("cosine", "dynmoe", "mass")
    seeds: tuple = (0, 1, 2)
    steps: int = 100
    eval_every: int = 50
    batch_size: int = 16
    dyn_interval: int = 10
    max_length: int = 64

    def standin_config(self) -> dict:
        return dict(steps=self.steps, eval_every=self.eval_every, batch_size=self.batch_size,
                    dyn_interval=self.dyn_interval, max_length=self.max_length)


def synth(**kw) -> SynthSetup:
    """The synthetic setup every profile starts from (the in-context format, uniform entity switching, the 5/5/10
    family, 2 examples of 10 tokens, a dense attention block before the MoE block, d = 64, Adam 1e-2 with cosine
    decay, loss on every token), with ``kw`` changed."""
    base = dict(data_format="incontext", entity_switch="uniform", n_entities=5, n_properties=5, n_symbols=10,
                n_examples=2, example_len=10, attn_layers=2, d_model=64, n_heads=4, batch_size=32, lr=1e-2,
                lr_decay="cosine", loss_on="all", n_test=512, max_experts=8, device="auto")
    return SynthSetup(**{**base, **kw})


@dataclass(frozen=True)
class MassProfile:
    """Every size of one profile of notebook 04.  ``synth``: the :class:`SynthSetup` (data: GINC family, in-context
    format; model: ``attn_layers`` attention layers -- 1 is the paper's, L > 1 puts L - 1 dense attention blocks
    before the MoE block --, width, heads; training: ``steps`` x ``batch_size`` sequences, the training draw every
    baseline is fitted on; ``device`` "auto": CUDA with bf16 when present).  Runs: the naive grid ``counts`` x ``ks``
    x ``seeds``; MASS from each of ``starts`` with ``mass_seeds``; the top-k sweep at MASS's pool over ``sweep_ks``
    with ``sweep_seeds``; ``glue``: the real-data part (None: not in this profile)."""
    name: str
    synth: SynthSetup
    counts: tuple
    seeds: tuple
    mass_seeds: tuple
    starts: tuple
    ks: tuple = (2,)
    sweep_seeds: tuple = (0, 1, 2)
    sweep_ks: tuple = (1, 2, 4, 8)
    glue: GlueProfile | None = None
    note: str = ""

    def setup(self, seed: int = 0, eval_split: str = "test") -> SynthSetup:
        """The :class:`SynthSetup` of this profile (``seed``: the GINC family's seed, the notebook's SEED)."""
        return replace(self.synth, ginc_seed=seed, eval_split=eval_split)

    def mass_config(self, start: int) -> MassConfig:
        """The public code's MASS settings at this schedule, starting from ``start`` experts (delta scaled to W1)."""
        return mass_config(self.synth, start)

    @property
    def tokens_per_model(self) -> int:
        return self.synth.steps * self.synth.batch_size * (self.synth.input_len + 1)


PAPER_SETTING = dict(family="10/10/50", format="not stated (lost in extraction)", layers=1, d_model="not stated",
                     d_ff="- (Linear+SiLU)", router_lr="not stated (public GLUE: gate at the fine-tuning LR)",
                     steps="not stated", counts="1..16", seeds=3, mass_starts="not stated", device="GPU",
                     glue="BERT-large on GLUE")

PROFILES = {
    "smoke": MassProfile("smoke", synth(steps=60, n_test=64, d_model=16, n_heads=2, d_ff=8, router_lr_mult=0.1),
                         counts=(1, 2, 4), seeds=(0, 1), mass_seeds=(0, 1), starts=(3, 4), sweep_seeds=(0,), sweep_ks=(1, 2),
                         glue=GlueProfile(tasks=("intent_recognition",), seeds=(0,), steps=4, eval_every=4,
                                          batch_size=8, dyn_interval=2, max_length=32),
                         note="integration test only"),
    # default: experts with a hidden width d_ff = 16 (a stated departure: the paper's single Linear+SiLU expert
    # leaves the frontier flat at this scale) and a gate learning rate of 0.1x (the public GLUE runs train the fresh
    # gate at the fine-tuning rate 2e-5; at Adam 1e-2 the gate saturates to one expert per token); MASS from 3 and 4
    # experts (with 2 experts and p = 0.5, top-p keeps exactly one expert by arithmetic); five seeds (issue 48)
    "default": MassProfile("default", synth(steps=3000, d_ff=16, router_lr_mult=0.1), counts=(1, 2, 4, 8),
                           seeds=(0, 1, 2, 3, 4), mass_seeds=(0, 1, 2, 3, 4), starts=(3, 4),
                           note="5/5/10 family, 2 x 10-token examples, dense block + MoE block, experts with d_ff = 16, "
                                "gate LR 0.1x, 2 cores"),
    "full": MassProfile("full", synth(steps=15000, n_entities=10, n_properties=10, n_symbols=50), counts=(1, 2, 4, 8),
                        seeds=(0, 1, 2), mass_seeds=(0, 1, 2), starts=(2, 4), glue=GlueProfile(),
                        note="10/10/50 family, dense block + MoE block, ~10M tokens per model, about 2 h on 2 cores"),
    "paper": MassProfile("paper", synth(steps=13000, n_entities=10, n_properties=10, n_symbols=50, attn_layers=4,
                                        d_model=256, n_heads=8, batch_size=128, lr=1e-3, max_experts=16),
                         counts=tuple(range(1, 17)), seeds=(0, 1, 2), mass_seeds=(0, 1, 2, 3, 4), starts=(2, 4, 8),
                         ks=(1, 2, 4), note="10/10/50 at GINC scale (4 layers, ~35M tokens per model) on one GPU; untuned"),
}


def profile(name: str) -> MassProfile:
    """The :class:`MassProfile` of ``name``; ValueError naming the profiles otherwise."""
    if name not in PROFILES:
        raise ValueError(f"unknown PROFILE {name!r}: expected one of {', '.join(PROFILES)}")
    return PROFILES[name]


def profile_table(current: str | None = None) -> pd.DataFrame:
    """The paper's setting beside every profile's (notebook 04's introduction); ``current`` marks the running one."""
    rows = {"paper (MASS Sec. 4.1)": PAPER_SETTING}
    for n, p in PROFILES.items():
        x = p.synth
        rows[n + (" (this run)" if n == current else "")] = dict(
            family=f"{x.n_entities}/{x.n_properties}/{x.n_symbols}", format=f"{x.n_examples} x {x.example_len}",
            layers=x.attn_layers, d_model=x.d_model, d_ff=x.d_ff or "- (W1 d x d)", router_lr=f"{x.router_lr_mult:g}x",
            steps=x.steps, tokens_per_model=f"{p.tokens_per_model / 1e6:.1f}M",
            counts=",".join(map(str, p.counts)), seeds=len(p.seeds), mass_starts=",".join(map(str, p.starts)),
            mass_seeds=len(p.mass_seeds), device=x.device, glue="yes" if p.glue else "no")
    return pd.DataFrame(rows).T.fillna("")
