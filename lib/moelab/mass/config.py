"""Per-profile sizes of notebook 04 (MASS, paper 003): one frozen :class:`MassProfile` per profile (``smoke``,
``default``, ``full``, ``paper``), read by the notebook's derived-settings cell; :func:`profile_table` prints them
beside the paper's setting.  How the settings were chosen (on a validation draw only) is in docs/mass-settings.md.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import pandas as pd

from moelab.mass.data import check_paper_inputs
from moelab.mass.experiment import GlueStandinConfig, SynthSetup, mass_config
from moelab.mass.method import MassConfig
from moelab.profiles import dry_run_table as dry_run_table_of

__all__ = ["MassProfile", "GlueProfile", "PROFILES", "PAPER_GLUE", "profile", "profile_table", "synth",
           "dry_run_profile", "dry_run_table", "glue_gpu_hours"]


@dataclass(frozen=True)
class GlueProfile:
    """The real-data part (notebook 04 section 6): tasks (None: every usable task), methods, seeds and the fields of
    :class:`moelab.mass.GlueStandinConfig`.

    ``source`` "standin": all-MiniLM-L6-v2 on the suite's BIG-bench text classification tasks, ``steps`` per run
    (``smoke``, ``full``).  "glue" (``paper``): the user's BERT (``MODEL_PATH``) on the official GLUE files
    (``GLUE_DIR``), the public scripts' schedule: ``epochs`` passes over each task's training split in batches of
    ``batch_size`` (so ``steps`` = ceil(epochs n_train / batch_size) per task) with an evaluation every epoch; early
    selection on ``val_items`` items held out of train (at most 10%), the dev file reported; ``max_train`` /
    ``max_eval`` cut the splits (the dry run only).  The other fields are :class:`moelab.mass.GlueStandinConfig`'s,
    with its defaults."""
    tasks: tuple | None = None
    methods: tuple = ("cosine", "dynmoe", "mass")
    seeds: tuple = (0, 1, 2)
    steps: int = 100
    eval_every: int = 50
    batch_size: int = 16
    dyn_interval: int = 10
    max_length: int = 64
    source: str = "standin"
    epochs: int | None = None
    val_items: int = 1000
    max_train: int | None = None
    max_eval: int | None = None
    # the trainer's own settings, defaults taken from GlueStandinConfig (one place says what the stand-in uses)
    lr: float = GlueStandinConfig.lr
    lr_new: float = GlueStandinConfig.lr_new
    warmup_frac: float = GlueStandinConfig.warmup_frac
    layer: int = GlueStandinConfig.layer
    cosine_experts: int = GlueStandinConfig.cosine_experts
    cosine_top_k: int = GlueStandinConfig.cosine_top_k
    init_experts: int = GlueStandinConfig.init_experts
    max_experts: int = GlueStandinConfig.max_experts
    cpd_warmup_frac: float = GlueStandinConfig.cpd_warmup_frac
    cpd_window_frac: float = GlueStandinConfig.cpd_window_frac
    cpd_min_warmup: int = GlueStandinConfig.cpd_min_warmup
    cpd_min_window: int = GlueStandinConfig.cpd_min_window

    def __post_init__(self):
        if self.source not in ("standin", "glue"):
            raise ValueError(f"GlueProfile.source={self.source!r} must be 'standin' or 'glue'")
        if self.source == "glue" and (not self.tasks or not self.epochs):
            raise ValueError("GlueProfile(source='glue') needs tasks (GLUE task names) and epochs")

    def standin_config(self) -> dict:
        """The :class:`moelab.mass.GlueStandinConfig` fields of the stand-in (``source`` "standin")."""
        return dict(steps=self.steps, eval_every=self.eval_every, batch_size=self.batch_size,
                    dyn_interval=self.dyn_interval, max_length=self.max_length)

    def task_config(self, n_train: int) -> dict:
        """The :class:`moelab.mass.GlueStandinConfig` fields of one GLUE task with ``n_train`` training items
        (``source`` "glue"): ``epochs`` x ceil(n_train / batch_size) steps, an evaluation every epoch, and every
        other setting of this profile."""
        per_epoch = max(1, math.ceil(n_train / self.batch_size))
        keep = ("batch_size", "dyn_interval", "max_length", "lr", "lr_new", "warmup_frac", "layer", "cosine_experts",
                "cosine_top_k", "init_experts", "max_experts", "cpd_warmup_frac", "cpd_window_frac", "cpd_min_warmup",
                "cpd_min_window")
        return dict(steps=int(self.epochs) * per_epoch, eval_every=per_epoch, **{k: getattr(self, k) for k in keep})


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

    def check_inputs(self, model_path=None, glue_dir=None) -> pd.DataFrame | None:
        """The paper profile's early check of ``MODEL_PATH`` and ``GLUE_DIR`` (:func:`moelab.mass.data.check_paper_inputs`,
        seconds, before any training); None for the profiles that read no user path."""
        if self.glue is None or self.glue.source != "glue":
            return None
        return check_paper_inputs(model_path, glue_dir, self.glue.tasks, self.glue.layer)

    @property
    def tokens_per_model(self) -> int:
        return self.synth.steps * self.synth.batch_size * (self.synth.input_len + 1)


# The GLUE arm of the paper profile (MASS Sec. 4.4; psmiz/MASS Language/scripts_mass/{cola,qnli,rte,mnli,mrpc}.sh and
# search_glue_no_trainer_mass.py): MoE at layer 10 of bert-large, MASS from 8 experts up to 16, top-p 0.5, AdamW at
# 2e-5 for every weight (the gate too), linear decay without warm-up, batch 32, length 128, 10 epochs, evaluated every
# epoch, seeds 0-2; the public change-point windows max(30, .05T) / max(60, .09T). Ours: DynMoE in the same 8-of-16
# slots, the cosine-router MoE (GMoE) with 8 experts top-2 (the scripts for these two are not public), early
# selection on 1000 items held out of train (the scripts select on dev, the reported split), and the dense arm.
PAPER_GLUE = GlueProfile(source="glue", tasks=("cola", "qnli", "rte", "mnli", "mrpc"),
                         methods=("dense", "cosine", "dynmoe", "mass"), seeds=(0, 1, 2), epochs=10, batch_size=32,
                         max_length=128, lr=2e-5, lr_new=2e-5, warmup_frac=0.0, layer=10, cosine_experts=8,
                         cosine_top_k=2, init_experts=8, max_experts=16, cpd_warmup_frac=0.05, cpd_window_frac=0.09,
                         cpd_min_warmup=30, cpd_min_window=60)

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
                         ks=(1, 2, 4), glue=PAPER_GLUE,
                         note="10/10/50 at GINC scale (4 layers, ~35M tokens per model) on one GPU; untuned; GLUE: "
                              "MODEL_PATH (BERT) on GLUE_DIR, the public scripts' settings, plus the dense parent"),
}

# What a dry run of the paper profile cuts (issue 51): sizes only -- steps, batch, test draw, the naive grid, seeds,
# MASS start sizes, the top-k sweep; on GLUE the epochs, items per split, seeds, batch and length. Every method, task,
# model shape and switch of the paper profile is kept, the change-point windows too: at 20 synthetic / 8 GLUE steps
# the expansion phase (10%) is shorter than the public window, so MASS records its gradient norms but its test never
# runs in a dry run (the test, the duplication and the stopping rule are exercised by tests/mass and the CPU profiles).
DRY_RUN_SYNTH = dict(steps=20, batch_size=16, n_test=64)
DRY_RUN_RUNS = dict(counts=(1, 2, 4), ks=(1, 2), seeds=(0, 1), mass_seeds=(0, 1), starts=(2, 4), sweep_ks=(1, 2),
                    sweep_seeds=(0,))
DRY_RUN_GLUE = dict(seeds=(0,), epochs=2, batch_size=8, max_length=64, max_train=32, max_eval=16)


def dry_run_profile() -> MassProfile:
    """The paper profile with only its sizes cut (:data:`DRY_RUN_SYNTH`, :data:`DRY_RUN_RUNS`,
    :data:`DRY_RUN_GLUE`): every cell of the paper path runs, on CPU in float32 in about a minute on the stand-ins."""
    p = PROFILES["paper"]
    return replace(p, synth=replace(p.synth, **DRY_RUN_SYNTH), glue=replace(p.glue, **DRY_RUN_GLUE),
                   note="dry run: the paper profile with sizes cut (not evidence)", **DRY_RUN_RUNS)


def profile(name: str, dry_run: bool = False) -> MassProfile:
    """The :class:`MassProfile` of ``name``; ValueError naming the profiles otherwise.  ``dry_run`` (paper profile
    only, issue 51): :func:`dry_run_profile`."""
    if name not in PROFILES:
        raise ValueError(f"unknown PROFILE {name!r}: expected one of {', '.join(PROFILES)}")
    if dry_run:
        if name != "paper":
            raise ValueError(f"DRY_RUN=True is for PROFILE='paper', got {name!r}")
        return dry_run_profile()
    return PROFILES[name]


def _settings(p: MassProfile) -> dict:
    """Every setting of a profile as one flat dict (``synth.<field>``, ``<run field>``, ``glue.<field>``)."""
    out = {f"synth.{k}": v for k, v in asdict(p.synth).items()}
    out.update({k: getattr(p, k) for k in ("counts", "ks", "seeds", "mass_seeds", "starts", "sweep_ks", "sweep_seeds")})
    out.update({f"glue.{k}": v for k, v in (asdict(p.glue) if p.glue else {}).items()})
    return out


def dry_run_table() -> pd.DataFrame:
    """What the dry run cuts (notebook 04's first table under ``DRY_RUN``): every setting whose value differs from the
    paper profile's, plus the model shapes, methods and tasks it keeps (:func:`moelab.profiles.dry_run_table`)."""
    keep = ("synth.d_model", "synth.attn_layers", "synth.n_heads", "synth.max_experts", "synth.d_ff", "synth.lr",
            "glue.source", "glue.tasks", "glue.methods", "glue.epochs", "glue.layer", "glue.init_experts",
            "glue.max_experts", "glue.lr")
    return dry_run_table_of(_settings(PROFILES["paper"]), _settings(dry_run_profile()), keep=keep)


# Training items of the official GLUE train files (GLUE's download script; MASS Sec. 4.4's five tasks), the size of
# bert-large, and the throughput assumed for the paper profile's cost estimate (no GPU was measured): 40% of an H100's
# ~300 TFLOP/s dense bf16.
GLUE_TRAIN_ITEMS = dict(cola=8551, qnli=104743, rte=2490, mnli=392702, mrpc=3668)
BERT_LARGE_PARAMS = 335e6
ASSUMED_GPU_FLOPS = 120e12


def glue_gpu_hours(g: GlueProfile) -> float:
    """Estimated GPU-hours of a GLUE arm on bert-large (an upper bound: every sequence at ``max_length`` tokens):
    6 N FLOPs per token (forward + backward, N = 335M) x tokens of ``epochs`` passes over each task's train split x
    methods x seeds, at :data:`ASSUMED_GPU_FLOPS`.  The MoE layer (< 10%) and evaluation (a few %) are left out."""
    items = sum(GLUE_TRAIN_ITEMS[t] for t in g.tasks) * g.epochs * len(g.methods) * len(g.seeds)
    return 6 * BERT_LARGE_PARAMS * items * g.max_length / ASSUMED_GPU_FLOPS / 3600


def _glue_text(g: GlueProfile | None) -> str:
    if g is None:
        return "no"
    if g.source == "standin":
        return f"stand-in (MiniLM, BIG-bench text tasks), {len(g.seeds)} seeds"
    return (f"MODEL_PATH on GLUE_DIR: {len(g.tasks)} tasks x {', '.join(g.methods)} x {len(g.seeds)} seeds, "
            f"{g.epochs} epochs; bert-large ~{glue_gpu_hours(g):.0f} GPU-h (estimate, {ASSUMED_GPU_FLOPS / 1e12:.0f} "
            f"TFLOP/s)")


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
            mass_seeds=len(p.mass_seeds), device=x.device, glue=_glue_text(p.glue))
    return pd.DataFrame(rows).T.fillna("")
