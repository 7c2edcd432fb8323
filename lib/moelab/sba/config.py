"""Per-profile sizes of notebook 02 (SBA, paper 001): one frozen :class:`SbaProfile` per profile (``smoke``,
``default``, ``full``, ``paper``), read by the notebook's derived-settings cell; :func:`profile_table` prints them
beside the paper's setting; ``profile("paper", dry_run=True)`` is the paper profile with only its sizes cut (issue 51,
:data:`DRY_RUN_SIZES`) and :func:`dry_run_table` says what the cut changes. How phase (b)'s schedule was chosen (on
the validation split only, against regime targets fixed before the screen): docs/sba-settings.md.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass, replace

import pandas as pd

from moelab.profiles import dry_run_table as _dry_run_table

__all__ = ["PhaseB", "PhaseC", "DropAblation", "SbaProfile", "PROFILES", "DRY_RUN_SIZES", "profile", "profile_table",
           "dry_run_table"]


@dataclass(frozen=True)
class PhaseB:
    """Phase (b): the stand-in trained with linear aggregation for ``steps`` x ``batch_size`` pairs (AdamW ``lr``;
    the MoE layers' experts and routers at ``moe_lr``, None: ``lr``; ``warmup_frac`` warm-up then constant),
    validation MNRL and the regime probe every ``eval_every`` steps on ``val_batches`` batches of ``val_batch_size``
    validation pairs; the checkpoint is the last step."""
    steps: int
    batch_size: int
    lr: float
    eval_every: int
    moe_lr: float | None = None
    val_batches: int = 4
    val_batch_size: int = 16
    warmup_frac: float = 0.05

    def __post_init__(self):
        for f in ("steps", "batch_size", "eval_every", "val_batches", "val_batch_size"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"PhaseB.{f}={getattr(self, f)!r} must be an int >= 1")
        if not 0 < self.lr < 1 or not (self.moe_lr is None or 0 < self.moe_lr < 1):
            raise ValueError(f"PhaseB.lr={self.lr!r} / moe_lr={self.moe_lr!r} must be in (0, 1)")


@dataclass(frozen=True)
class PhaseC:
    """Phase (c): from a phase-(b) checkpoint, fine-tune one aggregation until the validation loss stops falling (the
    plateau rule of :func:`moelab.sba.experiment.plateau_reached`: ``window`` evaluations, ``min_rel_improvement``)
    or ``max_steps``; the checkpoint is the best validation loss."""
    max_steps: int
    batch_size: int
    lr: float
    eval_every: int
    window: int = 2
    min_rel_improvement: float = 0.005
    val_batches: int = 4
    warmup_frac: float = 0.1
    grad_accum: int = 1

    def __post_init__(self):
        if self.max_steps < self.eval_every * (self.window + 1):
            raise ValueError(f"PhaseC.max_steps={self.max_steps} < eval_every*(window+1)="
                             f"{self.eval_every * (self.window + 1)}: the plateau rule could never fire")


@dataclass(frozen=True)
class DropAblation:
    """The "experts half random" ablation (renormalised Drop-Upcycled stand-in), full profile only."""
    aggregations: tuple = ("linear", "sba", "sba_unit")
    seeds: tuple = (0,)
    steps: int = 24
    batch_size: int = 16
    lr: float = 5e-5
    eval_every: int = 4
    val_batches: int = 2
    drop_ratio: float = 0.5


@dataclass(frozen=True)
class SbaProfile:
    """Every size of one profile of notebook 02. Data: the suite's pairs of ``bench_profile`` whose two sides fit in
    ``max_pair_tokens`` tokens; ``n_calib`` training anchors (drawn per phase-(b) seed) calibrate the cluster-aware
    init and the kept-mass compensation; ``n_heldout`` test texts measure the init's damage; ``n_probe`` validation
    texts measure router agreement; ``n_subjects`` x ``per_subject`` WordNet prompts (``max_tokens`` real tokens per
    subject) give the geometry. Benchmarks: ``benchmarks`` of the suite's ``bench_profile`` (None: all) at
    ``bench_sizes``. Runs: phase (b) per seed of ``seeds``, phase (c) per seed x ``aggregations``, the swap without
    fine-tuning for ``swaps`` (every phase-(b) seed), the drop ablation (``drop``; None: not in this profile)."""
    name: str
    phase_b: PhaseB | None
    phase_c: PhaseC
    seeds: tuple = (0, 1, 2)
    aggregations: tuple = ("linear", "sba")
    swaps: tuple = ()
    bench_profile: str = "default"
    bench_sizes: tuple = (("pairclass", 1000),)
    benchmarks: tuple | None = ("wordnet_sts", "wordnet_clustering", "wordnet_pairs", "wordnet_retrieval")
    n_calib: int = 256
    n_heldout: int = 256
    n_probe: int = 128
    n_subjects: int = 24
    per_subject: int = 6
    max_tokens: int = 100
    max_pair_tokens: int = 32
    damage_benchmarks: bool = False
    drop: DropAblation | None = None
    n_triplets: int | None = None
    device: str = "cpu"
    est_minutes: float | None = None
    note: str = ""

    @property
    def stand_in(self) -> bool:
        """True for the MiniLM stand-in profiles; False for ``paper`` (nomic-embed-text-v2-moe's own weights)."""
        return self.phase_b is not None


PAPER_SETTING = dict(model="nomic-embed-text-v2-moe (trained MoE)", phase_b="none (nomic is trained)",
                     phase_c="all-nli 30K triplets x 3 epochs, AdamW 2e-6, batch 64", aggregations="4",
                     seeds="3", geometry="MMLU, 57 subjects", evaluation="MTEB STSB / StackExchange / SprintDup.",
                     cost="one T4 GPU (no time given)")

# phase (b): chosen by scripts/tune_02.py on the validation split (data/tuning/02_sba; docs/sba-settings.md): the
# backbone at 2e-5, experts and routers at 1e-3 (the only screened expert rate whose validation loss fell); the
# default runs the cheapest schedule that met every target (120 steps), the full the screen's longest (150)
_PB_DEFAULT = PhaseB(steps=120, batch_size=16, lr=2e-5, moe_lr=1e-3, eval_every=30)
_PB_FULL = PhaseB(steps=150, batch_size=16, lr=2e-5, moe_lr=1e-3, eval_every=30)

PROFILES = {
    "smoke": SbaProfile("smoke", phase_b=PhaseB(steps=4, batch_size=8, lr=2e-5, moe_lr=1e-3, eval_every=2,
                                                val_batches=1, val_batch_size=8),
                        phase_c=PhaseC(max_steps=3, batch_size=8, lr=2e-5, eval_every=1, window=1, val_batches=1),
                        seeds=(0,), bench_profile="smoke", bench_sizes=(), benchmarks=("wordnet_sts", "wordnet_pairs"),
                        n_calib=32, n_heldout=16, n_probe=8, n_subjects=20, per_subject=1, max_tokens=20,
                        note="integration test only", est_minutes=3),
    "default": SbaProfile("default", phase_b=_PB_DEFAULT,
                          phase_c=PhaseC(max_steps=24, batch_size=16, lr=2e-5, eval_every=6),
                          note="3 phase-(b) seeds, linear vs SBA, 2 cores at one thread", est_minutes=30),
    "full": SbaProfile("full", phase_b=_PB_FULL, phase_c=PhaseC(max_steps=48, batch_size=16, lr=2e-5, eval_every=8),
                       aggregations=("linear", "sba", "sba_normfree", "sba_unit"),
                       swaps=("sba", "sba_normfree", "sba_unit"), benchmarks=None, n_subjects=41, per_subject=12,
                       drop=DropAblation(),
                       note="every benchmark and aggregation, the swap and the drop ablation; resumable run by run",
                       est_minutes=108),
    "paper": SbaProfile("paper", phase_b=None,
                        phase_c=PhaseC(max_steps=1400, batch_size=16, lr=2e-6, eval_every=100, window=3,
                                       grad_accum=4),
                        aggregations=("linear", "sba", "sba_normfree", "sba_unit"),
                        swaps=("sba", "sba_normfree", "sba_unit"), benchmarks=None, n_subjects=41, per_subject=24,
                        max_tokens=400, n_triplets=30000, device="auto",
                        note="nomic-embed-text-v2-moe's weights, all-nli and MTEB from local copies, one GPU: 3 seeds "
                             "x 4 aggregations = 12 fine-tunes of 1400 steps and 16 MTEB evaluations, about 1-3 "
                             "GPU-hours on one H100 (an estimate from FLOPs: docs/paper-scale.md)"),
}


# The paper profile's dry run (issue 51): the same configuration with only sizes cut, to the least that runs every
# code path of the paper path: every aggregation fine-tuned and swapped, 3 seeds (the claims' t-intervals need 3: with
# fewer the engine stops before the code that decides), gradient accumulation > 1 (the paper's batch 64 is 16 x 4),
# 27 subjects (more than WordNet's 26 noun files, so the verb files are read as for the paper's 41), every evaluation
# of the plateau window; the model's shapes are the user's (read from MODEL_PATH), the device "auto".
DRY_RUN_SIZES = dict(phase_c=dict(max_steps=4, batch_size=4, eval_every=1, grad_accum=2, val_batches=1),
                     n_subjects=27, per_subject=1, max_tokens=40, n_triplets=64)


def profile(name: str, dry_run: bool = False) -> SbaProfile:
    """The :class:`SbaProfile` of ``name``; ValueError naming the profiles otherwise. ``dry_run`` (``paper`` only):
    the paper profile with the sizes of :data:`DRY_RUN_SIZES` (every switch of the paper configuration kept)."""
    if name not in PROFILES:
        raise ValueError(f"unknown PROFILE {name!r}: expected one of {', '.join(PROFILES)}")
    if not dry_run:
        return PROFILES[name]
    if name != "paper":
        raise ValueError(f"DRY_RUN=True is for PROFILE='paper', got {name!r}")
    p = PROFILES["paper"]
    sizes = dict(DRY_RUN_SIZES)
    return replace(p, phase_c=replace(p.phase_c, **sizes.pop("phase_c")), **sizes)


def _flat(c, prefix: str = "") -> dict:
    out = {}
    for k, v in (asdict(c) if is_dataclass(c) else c).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def dry_run_table(paths: dict | None = None) -> pd.DataFrame:
    """What the paper profile's dry run cuts (issue 51; notebook 02's first table under ``DRY_RUN``): one row per
    setting that differs (``phase_c.max_steps``, ...) and, unchanged, the settings that make it the paper's
    configuration (aggregations, swaps, learning rate, device) and ``paths`` (the user's MODEL_PATH, NLI_PATH,
    MTEB_PATH, read as given)."""
    paths = {k: str(v) for k, v in (paths or {}).items()}
    keep = ("aggregations", "swaps", "seeds", "phase_c.lr", "phase_c.warmup_frac", "device", *paths)
    return _dry_run_table({**_flat(PROFILES["paper"]), **paths}, {**_flat(profile("paper", dry_run=True)), **paths},
                          keep=keep)


def profile_table(current: str | None = None) -> pd.DataFrame:
    """The paper's setting beside every profile's (notebook 02's introduction); ``current`` marks the running one."""
    rows = {"paper (SBA §V)": PAPER_SETTING}
    for n, p in PROFILES.items():
        b, c = p.phase_b, p.phase_c
        rows[n + (" (this run)" if n == current else "")] = dict(
            model="MiniLM-L6 in nomic's layout, cluster-aware init" if p.stand_in else "nomic-embed-text-v2-moe",
            phase_b=(f"{b.steps} x {b.batch_size} pairs, AdamW {b.lr:g}" + (f", experts {b.moe_lr:g}" if b.moe_lr
                                                                              else "") if b else "none (nomic is trained)"),
            phase_c=(f"<= {c.max_steps} x {c.batch_size * c.grad_accum}, AdamW {c.lr:g}, plateau rule" if p.stand_in
                     else f"{c.max_steps} x {c.batch_size * c.grad_accum}, AdamW {c.lr:g} (the paper's schedule)"),
            aggregations=str(len(p.aggregations)), seeds=str(len(p.seeds)),
            geometry=f"{p.n_subjects} subjects x {p.per_subject}",
            evaluation=("suite " + ", ".join(p.benchmarks) if p.benchmarks else "every suite benchmark")
            if p.stand_in else "MTEB tasks from local copies",
            cost=f"~{p.est_minutes:g} min on 2 CPU cores" if p.est_minutes else p.note.split(": ")[-1])
    return pd.DataFrame(rows).T
