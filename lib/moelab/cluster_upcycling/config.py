"""Per-profile sizes of notebook 03 (cluster-aware upcycling, Chu et al., poster 002): one frozen
:class:`ClusterUpcyclingConfig` per profile (``smoke``, ``default``, ``full``, ``paper``), read by the notebook's
derived-settings cell through :func:`config_for`; :func:`profile_table` prints them beside the poster's setting in the
notebook's introduction, so the table cannot drift from what runs.

The learning rate, steps and batch size of ``default`` and ``full`` are chosen on the validation pairs by
``scripts/tune_03.py`` (read back by :func:`moelab.cluster_upcycling.experiment.training_settings`);
``fallback_training`` applies until that choice exists, ``fixed_training`` (smoke) always.
``pairs_profile`` and ``benchmarks`` name size tables of ``moelab.suite.embed``, which still decides those sizes by
name (docs/NOTES.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import pandas as pd

from moelab.cluster_upcycling.experiment import VIT_SMALL
from moelab import profiles
from moelab.profiles import check_profile

__all__ = ["VisionConfig", "ClusterUpcyclingConfig", "CONFIGS", "config_for", "profile_table", "PAPER_SETTING",
           "PAPER_DRY_RUN", "DRY_RUN_KEEP", "dry_run_table", "CLIP_KEYS"]

SMOKE_TRAINING_SOURCE = "smoke: fixed tiny settings (the validation choice applies to default and full)"


@dataclass(frozen=True)
class VisionConfig:
    """The vision stand-in (a ViT pretrained here on Fashion-MNIST, upcycled, continued and fine-tuned on CIFAR-10
    grey 28x28): the fields of the dict :func:`moelab.cluster_upcycling.experiment.vision_experiment` takes."""
    methods: tuple
    seed_offsets: tuple
    data_profile: str
    vit: dict
    pretrain_steps: int
    pretrain_batch: int
    pretrain_lr: float
    calib_images: int
    calib_tokens: int
    n_test: int
    n_cifar_train: int
    n_cifar_test: int
    steps: int
    batch_size: int
    lr: float
    ft_steps: int
    ft_batch: int
    ft_lr: float
    eesd_decay: float
    shots: tuple = ()
    probe_draws: int = 0

    def settings(self, seed: int) -> dict:
        """The vision dict (methods and seeds as lists, seeds SEED + ``seed_offsets``), keys in the notebook's order."""
        d = asdict(self)
        out = dict(methods=list(self.methods), seeds=[seed + o for o in self.seed_offsets])
        for k in ("data_profile", "vit", "pretrain_steps", "pretrain_batch", "pretrain_lr", "calib_images",
                  "calib_tokens", "n_test", "n_cifar_train", "n_cifar_test", "steps", "batch_size", "lr", "shots",
                  "probe_draws", "ft_steps", "ft_batch", "ft_lr", "eesd_decay"):
            out[k] = dict(d[k]) if k == "vit" else d[k]
        return out


@dataclass(frozen=True)
class ClusterUpcyclingConfig:
    """Every size notebook 03 uses. Model: ``num_experts`` experts, top-``top_k``, in every other FFN of MiniLM; the
    cluster-aware init keeps ``energy`` of the spectral energy, clusters ``calib_tokens`` tokens of ``calib_texts``
    calibration sentences (``special_tokens`` handling); EESD weight ``eesd_weight``, balancing ``aux_coef``.
    Runs: ``methods`` x seeds SEED + ``seed_offsets``; R@1 on ``n_test`` test pairs, analyses on ``n_probe`` held-out
    anchors, ``max_len`` tokens; suite benchmarks at the size table ``benchmarks`` (None: none) for every seed
    (``bench_all_seeds``: True, False or the methods that get them). ``vision``: the vision stand-in (None: not in
    this profile); ``clip``: the paper profile's experiment on the user's CLIP (CLIP_PATH) and image-text pairs
    (PAIRS_PATH) through :mod:`moelab.cluster_upcycling.clip`: ``calib_texts`` then counts calibration IMAGES,
    ``n_test`` test images, ``n_probe`` held-out images, ``max_len`` the text context; ``weight_decay``,
    ``num_workers`` (image-decoding processes), ``ckpt_every`` (training checkpoints, for resuming) and
    ``eval_batch`` are read by that path only."""
    profile: str
    methods: tuple
    seed_offsets: tuple
    n_test: int
    n_probe: int
    calib_texts: int
    calib_tokens: int
    benchmarks: str | None
    bench_all_seeds: bool | tuple
    pairs_profile: str
    fallback_training: dict
    fixed_training: dict | None = None
    fixed_training_source: str = ""
    show_tuning: bool = False
    max_len: int = 24
    vision: VisionConfig | None = None
    num_experts: int = 8
    top_k: int = 2
    energy: float = 0.99
    eesd_weight: float = 0.1
    aux_coef: float = 0.01
    special_tokens: str = "exclude"
    clip: bool = False
    weight_decay: float = 0.0
    num_workers: int = 0
    ckpt_every: int = 0
    eval_batch: int = 128
    budget: str = ""

    def __post_init__(self):
        check_profile(self.profile)
        check_profile(self.pairs_profile)
        if self.benchmarks is not None:
            check_profile(self.benchmarks)
        if self.special_tokens not in ("include", "exclude", "own_expert"):
            raise ValueError(f"special_tokens={self.special_tokens!r}: expected 'include', 'exclude' or 'own_expert'")
        missing = [k for k in ("lr", "steps", "batch_size") if k not in self.fallback_training]
        if missing:
            raise ValueError(f"fallback_training lacks {missing}: {self.fallback_training!r}")

    def settings(self, seed: int, training: dict, eesd_decay: float) -> dict:
        """The dict of sizes the notebook's calls read (``training``: lr, steps, batch_size as chosen;
        ``eesd_decay``: EESD's EMA decay for that many steps), keys in the order the notebook saved them."""
        bench = list(self.bench_all_seeds) if isinstance(self.bench_all_seeds, tuple) else self.bench_all_seeds
        return dict(num_experts=self.num_experts, top_k=self.top_k, energy=self.energy, eesd_weight=self.eesd_weight,
                    aux_coef=self.aux_coef, special_tokens=self.special_tokens, lr=training["lr"],
                    steps=training["steps"], batch_size=training["batch_size"], eesd_decay=eesd_decay,
                    methods=list(self.methods), seeds=[seed + o for o in self.seed_offsets], n_test=self.n_test,
                    n_probe=self.n_probe, calib_texts=self.calib_texts, calib_tokens=self.calib_tokens,
                    benchmarks=self.benchmarks, max_len=self.max_len, bench_all_seeds=bench,
                    vision=self.vision.settings(seed) if self.vision else None,
                    **({k: getattr(self, k) for k in CLIP_KEYS} if self.clip else {}))


_DEFAULT_TRAINING = dict(lr=1e-4, steps=6, batch_size=12)   # the settings before the validation choice (fallback)
_SEEDS3 = (0, 1, 2)
CLIP_KEYS = ("weight_decay", "num_workers", "ckpt_every", "eval_batch")  # settings only the paper (CLIP) path reads
FULL_METHODS = ("dense", "dense_long", "sparse", "noise", "drop", "cluster", "sparse_eesd", "cluster_eesd")
# The poster's budget: "MoE upcycling: additional 1.3B seen samples" = 1,269,532 steps of 1024 pairs (1,300,000,768).
# The poster gives no learning rate, batch or schedule for it: ours are a fine-tuning learning rate for a pretrained
# CLIP, one GPU's batch, and the text runs' schedule (10% warmup, linear decay) so the claims read both the same way.
PAPER_TRAINING = dict(lr=5e-5, steps=1_269_532, batch_size=1024)
PAPER_TRAINING_SOURCE = ("paper: the poster's 1.3B continued-training samples at batch 1024; lr 5e-5 is ours (the "
                         "poster gives none)")

CONFIGS = {
    "smoke": ClusterUpcyclingConfig(
        profile="smoke", methods=("dense", "sparse", "drop", "cluster_eesd"), seed_offsets=(0,), n_test=48,
        n_probe=24, calib_texts=96, calib_tokens=2048, benchmarks=None, bench_all_seeds=False, pairs_profile="smoke",
        fallback_training=_DEFAULT_TRAINING, fixed_training=dict(lr=1e-4, steps=4, batch_size=8),
        fixed_training_source=SMOKE_TRAINING_SOURCE,
        vision=VisionConfig(methods=("dense", "sparse", "cluster_eesd"), seed_offsets=(0,), data_profile="smoke",
                            vit=dict(VIT_SMALL, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=128),
                            pretrain_steps=20, pretrain_batch=64, pretrain_lr=1e-3, calib_images=64,
                            calib_tokens=1088, n_test=200, n_cifar_train=300, n_cifar_test=100, steps=3,
                            batch_size=32, lr=2e-4, ft_steps=3, ft_batch=32, ft_lr=5e-4, eesd_decay=0.9),
        budget="integration test only"),
    "default": ClusterUpcyclingConfig(
        profile="default", methods=("dense", "sparse", "cluster_eesd"), seed_offsets=_SEEDS3, n_test=300, n_probe=64,
        calib_texts=256, calib_tokens=6144, benchmarks="smoke", bench_all_seeds=True, pairs_profile="default",
        fallback_training=_DEFAULT_TRAINING, show_tuning=True, budget="~25 min at 120 steps on 2 cores"),
    "full": ClusterUpcyclingConfig(
        profile="full", methods=FULL_METHODS, seed_offsets=_SEEDS3, n_test=300, n_probe=64, calib_texts=512,
        calib_tokens=8192, benchmarks="default", bench_all_seeds=("sparse", "cluster_eesd"), pairs_profile="full",
        fallback_training=dict(lr=1e-4, steps=24, batch_size=12), show_tuning=True,
        vision=VisionConfig(methods=("dense", "sparse", "drop", "cluster_eesd"), seed_offsets=_SEEDS3,
                            data_profile="full", vit=dict(VIT_SMALL), pretrain_steps=500, pretrain_batch=128,
                            pretrain_lr=1e-3, calib_images=512, calib_tokens=8192, n_test=2000, n_cifar_train=1000,
                            n_cifar_test=1000, steps=120, batch_size=128, lr=2e-4, ft_steps=40, ft_batch=64,
                            ft_lr=5e-4, eesd_decay=0.99),
        budget="~105 min at 120 steps on 2 cores (text ~80, benchmarks ~7, vision ~20)"),
    # The poster's experiment on the user's CLIP and image-text pairs: every method of the full profile (the poster's
    # zero-shot table and its ablation), 3 seeds (the claims' seed-level tests need them; the poster ran one), R@1
    # both ways on the 5,000 MSCOCO test images of the Karpathy split; the image tower's every other MLP upcycled.
    "paper": ClusterUpcyclingConfig(
        profile="paper", methods=FULL_METHODS, seed_offsets=_SEEDS3, n_test=5000, n_probe=256, calib_texts=2048,
        calib_tokens=65536, benchmarks=None, bench_all_seeds=False, pairs_profile="full",
        fallback_training=PAPER_TRAINING, fixed_training=PAPER_TRAINING, fixed_training_source=PAPER_TRAINING_SOURCE,
        max_len=77, clip=True, weight_decay=0.2, num_workers=8, ckpt_every=2000, eval_batch=256,
        budget="GPU: 21 continued trainings of 1.3B samples, ~40-70 H100-hours each, ~1,100 in all (estimated from "
               "FLOPs; docs/paper-scale.md)"),
}

# The dry run of the paper profile (issue 51): the paper configuration with only sizes cut, to the least that runs
# every code path (all methods, two seeds so that the untrained dense model's single run and the paired seed
# comparisons both run, checkpoints written mid-run). The user's model shapes and every switch are kept.
PAPER_DRY_RUN = dict(seed_offsets=(0, 1), n_test=16, n_probe=8, calib_texts=32, calib_tokens=544,
                     fallback_training=dict(PAPER_TRAINING, steps=4, batch_size=8),
                     fixed_training=dict(PAPER_TRAINING, steps=4, batch_size=8), num_workers=0, ckpt_every=2,
                     eval_batch=16, budget="dry run: a minute on a CPU (formats and code paths; no evidence)")
# what the dry-run table shows although the dry run keeps it: the switches that decide which code runs
DRY_RUN_KEEP = ("methods", "special_tokens", "num_experts", "top_k", "energy", "eesd_weight", "aux_coef", "max_len",
                "weight_decay")

PAPER_SETTING = dict(dense_model="CLIP ViT-B/32, B/16 (4.0B samples)", moe="every other FFN, 8 experts, top-2",
                     continued_training="1.3B LAION samples",
                     evaluation="zero-shot MSCOCO R@1, ImageNet variants, VTAB",
                     methods="dense, dense long, Drop, sparse, CLIP-MoE, DeRS, ours", seeds="1",
                     vision="CLIP ViT-B image tower; ImageNet-1k 5-/10-shot, full fine-tuning", budget="not stated")


def config_for(profile: str, dry_run: bool = False, **overrides) -> ClusterUpcyclingConfig:
    """The frozen configuration of ``profile`` (``overrides`` replace fields, e.g. in tests); ValueError naming the
    value and the profiles for an unknown one. ``dry_run=True`` (paper profile only): the paper configuration with
    the sizes of :data:`PAPER_DRY_RUN` (``run --profile paper --dry-run``)."""
    check_profile(profile)
    if dry_run and profile != "paper":
        raise ValueError(f"dry_run=True is the paper profile's rehearsal; PROFILE={profile!r} runs as it is "
                         "(use --profile paper --dry-run)")
    c = replace(CONFIGS[profile], **PAPER_DRY_RUN) if dry_run else CONFIGS[profile]
    return replace(c, **overrides) if overrides else c


def dry_run_table() -> pd.DataFrame:
    """What the paper profile's dry run cuts (notebook 03's first table under ``DRY_RUN``): the settings that differ
    from the paper configuration, and the switches it keeps (:data:`DRY_RUN_KEEP`)."""
    return profiles.dry_run_table(config_for("paper"), config_for("paper", dry_run=True), keep=DRY_RUN_KEEP)


def profile_table(current: str | None = None) -> pd.DataFrame:
    """The poster's setting beside every profile's (notebook 03's introduction): one row per setting, one column per
    profile (``current`` marked "this run")."""
    cols = {"paper (poster)": PAPER_SETTING}
    for n, c in CONFIGS.items():
        t = c.fixed_training or c.fallback_training
        v = c.vision
        cols[n + (" (this run)" if n == current else "")] = dict(
            dense_model=("CLIP from CLIP_PATH (open_clip checkpoint)" if c.clip else
                         "all-MiniLM-L6-v2 (real, pretrained)"),
            moe=f"every other FFN{' of the image tower' if c.clip else ''}, {c.num_experts} experts, top-{c.top_k}",
            continued_training=(f"{t['steps']:,} steps x {t['batch_size']} image-text pairs of PAIRS_PATH "
                                f"({t['steps'] * t['batch_size'] / 1e9:.2f}B samples) at lr {t['lr']:g}" if c.clip else
                                f"{t['steps']} steps x {t['batch_size']} pairs at lr {t['lr']:g}"
                                + (" until scripts/tune_03.py's validation choice exists" if c.show_tuning else "")),
            evaluation=(f"zero-shot R@1 I->T and T->I on {c.n_test} test images of PAIRS_PATH" if c.clip else
                        f"R@1 both ways on {c.n_test} test pairs"
                        + (f" + suite embedding benchmarks ({c.benchmarks} sizes)" if c.benchmarks else "")),
            methods=", ".join(c.methods) or "-", seeds=str(len(c.seed_offsets)),
            vision="-" if v is None else f"ViT d={v.vit['hidden_size']}, {v.vit['num_hidden_layers']} layers, "
            f"{v.pretrain_steps} pretraining steps; {', '.join(v.methods)}; {len(v.seed_offsets)} seed(s)",
            budget=c.budget or "-")
    return pd.DataFrame(cols).fillna("-").rename_axis("setting").reset_index()
