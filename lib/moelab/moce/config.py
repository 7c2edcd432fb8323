"""Per-profile sizes of notebook 01 (MoCE, Eo et al.): one frozen :class:`MoceConfig` per profile (``smoke``,
``default``, ``full``, ``paper``), read by the notebook's derived-settings cell through :func:`config_for`;
:func:`profile_table` prints them beside the paper's setting (§4.1, App. A) in the notebook's introduction, so the
table cannot drift from what runs.

The settings of a run are :meth:`MoceConfig.settings` (the dict every ``moelab.moce.experiment`` function takes):
sizes only, never a profile name. ``suite_profile`` names the size table of ``moelab.suite.instruct.build_balanced``,
which still decides the instruction pool's sizes by that name (docs/NOTES.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from moelab.profiles import check_profile

__all__ = ["MoceConfig", "CONFIGS", "config_for", "profile_table", "AA_ARM", "ABLATIONS", "FIG5_TASKS",
           "PAPER_SETTING", "DRY_RUN_SIZES", "paper_epoch_steps", "training_gpu_hours"]

# A/A: PESC again, on seeds SEED+3 .. SEED+5 (its difference from ``pesc`` is seed noise only)
AA_ARM = dict(label="pesc_aa", variant="pesc", seed_offset=3)
# four domains' worth of evaluation tasks, as in the paper's Fig. 5
FIG5_TASKS = ("elementary_math_qa/question_only", "gsm (held-out templates)", "code (held-out stdlib modules)",
              "date_understanding", "winowhy")
# Table 3 (experts per group), the three domain-specialised PESC models, Fig. 4 (elbow -1 / +1 clusters)
ABLATIONS = (dict(label="moce_N1", N=1, top_k=1), dict(label="moce_N2", N=2),
             dict(label="specialised_maths", variant="pesc", domain="maths"),
             dict(label="specialised_code", variant="pesc", domain="code"),
             dict(label="specialised_reasoning", variant="pesc", domain="reasoning"),
             dict(label="moce_k{k}", k_offset=-1), dict(label="moce_k{k}", k_offset=+1))


@dataclass(frozen=True)
class MoceConfig:
    """Every size notebook 01 uses. Clustering: ``n_cluster`` training instructions embedded by ``encoders``, k-means
    for k in ``ks``, ``projections`` for Fig. 2, up to ``n_fig5`` prompts of each of ``fig5_tasks`` (None: every
    task) for Fig. 5. Model: the top ``n_top`` blocks adapted ("all": every block), ``max_len`` tokens of context.
    Training: the first ``n_train`` clustering items (None: all), ``n_val`` validation items, ``variants`` with M x
    ``experts_per_group`` rank-``rank`` adapters, rounds of ``steps`` steps of ``batch`` at ``lr``, validation every
    ``eval_every`` steps, at most ``max_rounds`` rounds, ``patience`` evaluations without a new minimum
    (None: off), the best checkpoint restored with ``restore_best``; ``extra``: the A/A arm and ablations
    (:func:`moelab.moce.experiment.plan_runs`); ``seed_offsets``: the seeds are SEED + each. Evaluation:
    ``n_test_per_domain`` held-out answers per domain, lm-eval tasks up to ``lm_tasks_max`` with ``lm_limit`` items.
    Gemma-3 (full with GEMMA=True): ``gemma_variants`` on ``gemma_seed_offsets`` with ``gemma_test_per_domain``.
    ``paper_data``: the paper's model, encoder and data from local paths (the paper profile)."""
    profile: str
    suite_profile: str                 # the instruction pool's size table (moelab.suite.instruct.build_balanced)
    n_cluster: int
    n_train: int | None
    n_val: int
    n_test_per_domain: int
    steps: int
    eval_every: int
    max_rounds: int
    patience: int | None
    variants: tuple
    extra: tuple = ()
    seed_offsets: tuple = (0, 1, 2)
    rank: int = 64
    lr: float = 1e-3
    experts_per_group: int = 4
    ks: tuple = tuple(range(1, 11))
    encoders: tuple = ("minilm", "e5")
    projections: tuple = ("tsne",)
    n_fig5: int = 50
    fig5_tasks: tuple | None = FIG5_TASKS
    n_top: int | str = 2
    max_len: int = 160
    batch: int = 8
    restore_best: bool = True
    lm_limit: int | None = 10
    lm_tasks_max: int = 1
    gemma_variants: tuple = ()
    gemma_seed_offsets: tuple = ()
    gemma_test_per_domain: int = 0
    paper_data: bool = False
    budget: str = ""

    def __post_init__(self):
        check_profile(self.profile)
        check_profile(self.suite_profile)
        if self.n_train is not None and self.n_train > self.n_cluster:
            raise ValueError(f"n_train={self.n_train} > n_cluster={self.n_cluster}: the training items are a prefix "
                             "of the clustering items")
        if not self.seed_offsets or 0 not in self.seed_offsets:
            raise ValueError(f"seed_offsets={self.seed_offsets}: the first seed is the notebook's SEED (offset 0)")

    def settings(self, seed: int, gemma: bool = False) -> dict:
        """The dict of sizes the ``moelab.moce.experiment`` functions take (lists for tuples, seeds SEED +
        ``seed_offsets``); ``gemma``: the notebook's GEMMA switch (Gemma-3 runs only where ``gemma_variants``)."""
        d = dict(rank=self.rank, lr=self.lr, experts_per_group=self.experts_per_group, ks=list(self.ks),
                 encoders=list(self.encoders), projections=list(self.projections), n_fig5=self.n_fig5,
                 fig5_tasks=None if self.fig5_tasks is None else list(self.fig5_tasks), n_top=self.n_top,
                 max_len=self.max_len, batch=self.batch, seeds=[seed + o for o in self.seed_offsets],
                 restore_best=self.restore_best, lm_limit=self.lm_limit, lm_tasks_max=self.lm_tasks_max,
                 gemma_variants=list(self.gemma_variants) if gemma else [], n_cluster=self.n_cluster,
                 n_train=self.n_train, n_val=self.n_val, n_test_per_domain=self.n_test_per_domain, steps=self.steps,
                 eval_every=self.eval_every, max_rounds=self.max_rounds, patience=self.patience,
                 variants=list(self.variants), extra=[dict(e) for e in self.extra])
        if self.gemma_seed_offsets:
            d.update(gemma_seeds=[seed + o for o in self.gemma_seed_offsets],
                     gemma_test_per_domain=self.gemma_test_per_domain)
        return d


CONFIGS = {
    "smoke": MoceConfig(
        profile="smoke", suite_profile="smoke", n_cluster=36, ks=tuple(range(1, 7)), n_fig5=10, fig5_tasks=None,
        max_len=96, n_train=24, n_val=6, n_test_per_domain=3, steps=2, eval_every=1, max_rounds=2, patience=2,
        seed_offsets=(0,), variants=("pesc", "moce", "btx"), experts_per_group=2, lm_limit=3,
        extra=(AA_ARM, ABLATIONS[-2], ABLATIONS[-1]), budget="integration test only"),
    "default": MoceConfig(
        profile="default", suite_profile="default", n_cluster=300, n_train=192, n_val=30, n_test_per_domain=50,
        steps=20, eval_every=10, max_rounds=3, patience=2, variants=("pesc", "moce"), extra=(AA_ARM,),
        budget="9 runs of <= 60 steps (README timings table)"),
    "full": MoceConfig(
        profile="full", suite_profile="full", n_cluster=300, projections=("tsne", "umap"), n_train=240, n_val=24,
        n_test_per_domain=50, steps=16, eval_every=8, max_rounds=4, patience=2,
        variants=("dense", "pesc", "moce", "moce_gen", "moce_top1", "moce_soft", "seq_only", "btx"),
        extra=ABLATIONS, gemma_variants=("pesc", "moce"), gemma_seed_offsets=(0,), gemma_test_per_domain=30,
        budget="every variant x 3 seeds, <= 64 steps each (17 trainings per seed with BTX's branches)"),
    "paper": MoceConfig(
        profile="paper", suite_profile="full", n_cluster=20000, n_top="all", max_len=512, n_train=None, n_val=512,
        lr=2e-4, n_test_per_domain=200, steps=625, batch=32, eval_every=1000, max_rounds=1, patience=None,
        seed_offsets=(0, 1, 2), variants=("dense", "pesc", "moce", "moce_gen"), lm_limit=None, lm_tasks_max=20,
        paper_data=True, budget="the paper's model, encoder and data from local paths (GPU)"),
}

PAPER_SETTING = dict(backbone="Llama-2-7b-chat (also Mistral, Qwen)", encoders="e5-large-v2, instructor-xl",
                     data="SlimOrca + Magicoder + MetaMathQA (~1M)",
                     experts="M clusters x N=4, adapter width 64, top-2", training="1 epoch, lr 2e-4, batch 32",
                     variants="LLaMA(A), BTX(A), PESC, Specialized-x3, MoCE, MoCE(V)", seeds="1",
                     evaluation="lm-eval / bigcode (8 benchmarks)")


# the paper profile's dry run (issue 51): sizes only, cut to the least that runs every paper-path cell in ~1 minute
# on a CPU; the model, encoder, data, variants, rank, lr and code-path switches stay the paper's
DRY_RUN_SIZES = dict(n_cluster=60, n_val=6, n_test_per_domain=3, steps=2, eval_every=1, batch=4, max_len=64,
                     ks=tuple(range(1, 5)), n_fig5=6, lm_limit=2, lm_tasks_max=1, seed_offsets=(0,),
                     budget="dry run: sizes cut")
# (the paper profile runs 3 seeds: the claims' t-interval over seeds needs 3; the dry run exercises one)


def config_for(profile: str, dry_run: bool = False, **overrides) -> MoceConfig:
    """The frozen configuration of ``profile`` (``overrides`` replace fields, e.g. in tests); ValueError naming the
    value and the profiles for an unknown one. ``dry_run`` (paper profile only): the paper configuration with only
    the sizes in ``DRY_RUN_SIZES`` cut."""
    check_profile(profile)
    if dry_run:
        if profile != "paper":
            raise ValueError(f"dry_run=True with profile={profile!r}: only the paper profile has a dry run "
                             "(run --profile paper --dry-run)")
        overrides = {**DRY_RUN_SIZES, **overrides}
    return replace(CONFIGS[profile], **overrides) if overrides else CONFIGS[profile]


def paper_epoch_steps(c: MoceConfig) -> int:
    """Optimiser steps of one epoch over the training items (MoCE §4.1 trains 1 epoch): ceil(n_train / batch)."""
    return -(-(c.n_train or c.n_cluster) // c.batch)


# the cost estimate of a paper-scale run (no GPU measured here): Llama-2-7b's parameters, 6 FLOPs per parameter and
# token (forward + backward, an upper bound with frozen weights), sequences of max_len tokens, an H100's dense bf16
# peak at 40 % utilisation
PAPER_PARAMS, H100_BF16_FLOPS, UTILISATION = 6.74e9, 989e12, 0.4


def training_gpu_hours(c: MoceConfig, n_params: float = PAPER_PARAMS) -> tuple[int, float]:
    """``(trainings, H100-hours)`` of the training runs of ``c`` for a model of ``n_params`` parameters: every seed x
    (variants + extra runs), ``steps x max_rounds`` steps of ``batch x max_len`` tokens each, at 6 FLOPs per parameter
    and token and :data:`UTILISATION` of :data:`H100_BF16_FLOPS` (an estimate from FLOPs, not a measurement)."""
    trainings = len(c.seed_offsets) * (len(c.variants) + len(c.extra))
    flops = 6 * n_params * c.batch * c.max_len * c.steps * c.max_rounds * trainings
    return trainings, flops / (H100_BF16_FLOPS * UTILISATION) / 3600


def profile_table(current: str | None = None) -> pd.DataFrame:
    """The paper's setting beside every profile's (notebook 01's introduction): one row per setting, one column per
    profile (``current`` marked "this run")."""
    cols = {"paper (MoCE §4.1)": PAPER_SETTING}
    for n, c in CONFIGS.items():
        train = (f"1 epoch ({c.steps} steps x batch {c.batch} = {c.n_cluster} items)" if c.paper_data else f"rounds of {c.steps} steps, at most {c.max_rounds}, early-stopped")
        cols[n + (" (this run)" if n == current else "")] = dict(
            backbone="Llama-2-7b-chat from MODEL_PATH" if c.paper_data else
            f"SmolLM2-135M-Instruct, top {c.n_top} blocks adapted" + (" (+ Gemma-3-270M with GEMMA=True)"
                                                                      if c.gemma_variants else ""),
            encoders="e5-large-v2 from ENCODER_PATH" if c.paper_data else ", ".join(c.encoders),
            data=("the three sets from DATA_PATHS" if c.paper_data else "suite instruction mix, equal per domain")
            + f"; {c.n_cluster} clustered, {c.n_train or 'all'} train, {c.n_val} validation",
            experts=f"M x {c.experts_per_group}, adapter width {c.rank}, top-2",
            training=f"{train}; batch {c.batch}, lr {c.lr:g}",
            variants=", ".join(c.variants) + "".join(f", {e['label']}" for e in c.extra),
            seeds=str(len(c.seed_offsets)) + (
                " (the claims' t-interval over seeds needs 3): {} trainings, ~{:.1f} H100-hours for Llama-2-7b "
                "(FLOPs estimate, docs/paper-scale.md)".format(*training_gpu_hours(c)) if c.paper_data else ""),
            evaluation=f"held-out answer bits per byte, {c.n_test_per_domain} items per domain" + (
                "; every multiple-choice lm-eval task, the usable ones chosen by the run's own scorecard"
                if c.paper_data else ""))
    return pd.DataFrame(cols).fillna("-").rename_axis("setting").reset_index()
