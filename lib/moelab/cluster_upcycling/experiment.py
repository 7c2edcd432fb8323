"""Runs of notebook ``03_cluster_upcycling`` (poster 002, Chu et al.): the methods compared, building and training
the upcycled models through :mod:`moelab.train`, evaluation, caching and seeds.

* Text (main comparison): all-MiniLM-L6-v2 upcycled (every other FFN -> 8 experts, top-2), continued contrastive
  training (:func:`text_experiment`, one cached cell per (method, seed): :func:`run_text_condition`). Every MoE
  method in a run is analysed on the same fixed held-out token set at initialisation and at the end, with the
  routing-entropy trajectory on a fixed held-out batch at fixed steps (:mod:`moelab.cluster_upcycling.analysis`).
* Vision stand-in: a small ViT pretrained here on Fashion-MNIST stands in for CLIP ViT-B (:func:`pretrain_vit`,
  :func:`vision_experiment`; few-shot probes and fine-tuning on CIFAR-10 in grey 28x28).
* The special-token handling of the calibration set, compared (:func:`special_token_logs`).
* The training settings (learning rate, steps, batch) chosen on the validation pairs for the sparse baseline by
  ``scripts/tune_03.py`` and read back by :func:`tuned_settings` (the same for every method); the EESD decay follows
  from the number of steps (:func:`eesd_decay_for`).
"""
from __future__ import annotations

import copy
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import ViTConfig, ViTForImageClassification

from moelab import assets, cache, progress
from moelab.core import aux_loss, collect_ffn_inputs, moe_layers, moeify
from moelab.core.convert import ffn_sites
from moelab.core.init import drop_init, noise_init
from moelab.core.losses import in_batch_contrastive
from moelab.seed import seed_everything
from moelab.suite import embed, images
from moelab.train import TrainConfig, train

from .analysis import HeldoutEntropy, heldout_layer_inputs, moe_analyses, router_agreement, routing_entropy
from .data import (PairBatches, cached_calibration, calibration_special_mask, heldout_batches,
                   image_loader, images_key, to_pixels, vision_data, vit_special_mask)
from .method import DEFAULT_SPECIAL_TOKENS, EESD, SPECIAL_TOKENS, SpecialTokenClusterInit
from .report import special_token_ranks_table, special_token_summary

__all__ = [
    "METHODS", "infonce_loss", "make_loss_fn", "upcycle", "build_model", "trainable_ffn_params", "encode",
    "retrieval_r1", "trajectory_steps", "run_text_condition", "text_calibration", "text_experiment",
    "run_from_config", "run_summary", "special_token_logs", "TUNED_KEYS", "tuned_settings", "eesd_decay_for",
    "VIT_SMALL", "VISION_METHODS", "VISION_COLUMNS", "make_vit", "make_cls_loss_fn", "train_classifier",
    "vit_outputs", "pretrain_vit", "vit_calibration", "few_shot_indices", "few_shot_probe", "finetune_accuracy",
    "run_vision_condition", "vision_experiment", "TUNING_DIR", "training_settings", "special_token_study",
    "text_runs", "vision_settings",
]

METHODS = {
    # name: (MoE?, initialiser, EESD?)
    "dense": (False, None, False),  # the pretrained dense model, no further training
    "dense_long": (False, None, False),  # dense, trained as long as the MoE models
    "sparse": (True, "sparse", False),  # sparse upcycling (copies, random router)
    "noise": (True, "noise", False),  # noise-injected copies
    "drop": (True, "drop", False),  # Drop-Upcycling (50% re-initialised)
    "cluster": (True, "cluster", False),  # cluster-aware init only (ablation)
    "sparse_eesd": (True, "sparse", True),  # EESD only (ablation)
    "cluster_eesd": (True, "cluster", True),  # cluster-aware upcycling (init + EESD): the paper's method
}


# ---------------------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------------------
def infonce_loss(emb: torch.Tensor, n: int, scale: float = 20.0) -> torch.Tensor:
    """In-batch InfoNCE = sentence-transformers' MultipleNegativesRankingLoss (cosine, scale 20, anchor -> positive):
    ``L = CE(scale * cos(a_i, p_j), j=i)``. ``emb`` [2n, h] = anchors then positives. Written out because the batch
    carries anchors and positives in one forward (MNRL encodes them in two). Notebook 03's contrastive training."""
    return in_batch_contrastive(emb[:n], emb[n:], scale)


def _moe_entropy(model, mask) -> float | None:
    """Routing entropy of the current TRAINING batch (a logged diagnostic; batch-to-batch noise, see
    :class:`moelab.cluster_upcycling.analysis.HeldoutEntropy` for the fixed held-out trajectory)."""
    hs = []
    for layer in moe_layers(model):
        z = layer.last_router_logits
        if z is None:
            continue
        m = mask.reshape(-1).bool() if mask is not None and mask.numel() == z.shape[0] else None
        hs.append(routing_entropy(z[m] if m is not None else z))
    return float(np.mean(hs)) if hs else None


def _moe_terms(model, loss, metrics: dict, aux_coef: float, eesd: "EESD | None", mask=None):
    """Add ``aux_coef`` * balancing loss (+ EESD) to ``loss`` and their values to ``metrics`` (text and vision).
    ``metrics["task_loss"]`` keeps the task loss alone, whose router gradient the trainer logs."""
    metrics["task_loss"] = loss
    if moe_layers(model):
        bal = aux_loss(model)
        loss = loss + aux_coef * bal
        metrics["balance"] = bal.detach()
        metrics["routing_entropy"] = _moe_entropy(model, mask)
    if eesd is not None:
        le = eesd.loss()
        loss = loss + le
        metrics["eesd"] = le.detach()
    return loss, metrics


def make_loss_fn(aux_coef: float = 0.01, eesd: EESD | None = None):
    """``loss_fn(model, batch)`` for :func:`moelab.train.train`: InfoNCE + aux_coef * balancing loss (+ EESD)."""

    def loss_fn(model, batch):
        batch = dict(batch)
        n = batch.pop("n_pairs")
        out = model(batch)
        loss = infonce_loss(out["sentence_embedding"], n)
        return _moe_terms(model, loss, {"infonce": loss.detach()}, aux_coef, eesd, batch.get("attention_mask"))

    return loss_fn


# ---------------------------------------------------------------------------------------------------------------
# Building the upcycled models
# ---------------------------------------------------------------------------------------------------------------
def upcycle(backbone: nn.Module, method: str, calib: dict | None, seed: int, num_experts: int = 8, top_k: int = 2,
            energy: float = 0.95, project: str = "in", special_mask=None,
            special_tokens: str = DEFAULT_SPECIAL_TOKENS):
    """Convert every other FFN of the transformers model ``backbone`` in place per ``method`` (see :data:`METHODS`;
    renormalised top-k); returns the :class:`SpecialTokenClusterInit` (for its log) or None. Text and vision
    (notebook 03). Cluster-aware methods cluster the calibration tokens per ``special_tokens`` (default
    ``"exclude"``; ``special_mask`` [T] marks the special calibration tokens, needed unless ``"include"``)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
    is_moe, init, _ = METHODS[method]
    if not is_moe:
        return None
    ci = (SpecialTokenClusterInit(special_mask, special_tokens, energy=energy, project=project, seed=seed)
          if init == "cluster" else None)
    hook = ci or {"sparse": "sparse", "noise": noise_init(seed=seed), "drop": drop_init(seed=seed)}[init]
    moeify(backbone, "every_other", num_experts, top_k, init=hook, calib_inputs=calib if ci else None,
           renormalize=top_k > 1)                          # top-1: Switch's raw probability
    return ci


def build_model(st_dense, method: str, calib: dict | None, seed: int, num_experts: int = 8, top_k: int = 2,
                energy: float = 0.95, project: str = "in", special_mask=None,
                special_tokens: str = DEFAULT_SPECIAL_TOKENS):
    """A fresh copy of the dense sentence encoder, converted per ``method`` (see :data:`METHODS`); returns
    ``(model, cluster_init or None)``. Every other FFN -> MoE (layers 1, 3, 5), renormalised top-k (notebook 03)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
    torch.manual_seed(seed)
    model = copy.deepcopy(st_dense)
    return model, upcycle(model[0].auto_model, method, calib, seed, num_experts, top_k, energy, project,
                          special_mask, special_tokens)


def trainable_ffn_params(model) -> list:
    """Only the converted FFN sites train (MoE experts + routers; for dense models the same layers' FFN), for
    a fair and CPU-affordable comparison; everything else stays frozen (notebook 03)."""
    sites = ffn_sites(model[0].auto_model)
    keep = set()
    for s in sites[1::2]:
        mods = [s.layer.output.dense] + ([] if isinstance(s.layer.intermediate, nn.Identity) or
                                         not hasattr(s.layer.intermediate, "dense") else [s.layer.intermediate.dense])
        for m in mods:
            keep.update(id(p) for p in m.parameters())
    params = []
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
        if id(p) in keep:
            params.append(p)
    return params


# ---------------------------------------------------------------------------------------------------------------
# Text experiment: all-MiniLM-L6-v2 upcycled, continued contrastive training (notebook 03, main comparison)
# ---------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def encode(model, texts, batch_size: int = 128, max_len: int = 32) -> torch.Tensor:
    """L2-normalised sentence embeddings [N, h] (mean pooling + Normalize, as all-MiniLM-L6-v2)."""
    model.eval()
    model.max_seq_length = max_len
    return model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True,
                        show_progress_bar=False).float().cpu()


def retrieval_r1(model, pairs, max_len: int = 32) -> dict:
    """Recall@1 both ways on held-out pairs (the MSCOCO I->T / T->I analogue): per-item 0/1 arrays."""
    a = encode(model, [x for x, _ in pairs], max_len=max_len)
    p = encode(model, [y for _, y in pairs], max_len=max_len)
    s = a @ p.T  # cosine similarities [N, N]
    idx = torch.arange(len(pairs))
    return {"a2p": (s.argmax(1) == idx).float().numpy(), "p2a": (s.argmax(0) == idx).float().numpy()}


def trajectory_steps(steps: int, points: int = 7) -> list[int]:
    """The fixed steps at which the held-out routing entropy is measured: ``points`` evenly spaced steps from 0
    (initialisation) to ``steps`` (the end), rounded and de-duplicated."""
    if steps < 0 or points < 2:
        raise ValueError(f"need steps >= 0 and points >= 2, got steps={steps}, points={points}")
    return sorted({int(round(s)) for s in np.linspace(0, steps, points)})


def run_text_condition(st_dense, method: str, seed: int, train_pairs, test_pairs, probe_texts, calib, *,
                       steps: int, batch_size: int = 16, lr: float = 1e-4, max_len: int = 32, energy: float = 0.95,
                       eesd_decay: float = 0.95, eesd_weight: float = 0.1, aux_coef: float = 0.01,
                       benchmarks=None, num_experts: int = 8, top_k: int = 2, special_mask=None,
                       special_tokens: str = DEFAULT_SPECIAL_TOKENS, entropy_points: int = 7,
                       r1_at_init: bool = True) -> dict:
    """One cell of the zero-shot table analogue (notebook 03): build, (train), evaluate, analyse.

    The analyses (:func:`moelab.cluster_upcycling.analysis.moe_analyses`) run on the fixed held-out token set
    ``probe_texts`` at initialisation (``analysis_init``) and at the end (``analysis``); the routing entropy on the
    same held-out batch at :func:`trajectory_steps` ``(steps, entropy_points)`` (``entropy_heldout``: rows of step,
    moe_layer, routing_entropy; step 0 = initialisation). R@1 is measured at the end (``r1``) and, with
    ``r1_at_init``, also on the initialised model before any training (``r1_init``: an upcycling's damage at
    initialisation, e.g. Drop-Upcycling's; for the untrained ``"dense"`` model the two are the same
    measurement). Returns plain data: per-item R@1 both ways, suite benchmark scores, training history (with the
    training batches' routing entropy per step), the analyses, the cluster-aware init log.
    """
    t0 = time.perf_counter()
    seed_everything(seed)
    model, ci = build_model(st_dense, method, calib, seed, num_experts, top_k, energy, special_mask=special_mask,
                            special_tokens=special_tokens)
    heldout = heldout_batches(model, list(probe_texts), max_len)  # the fixed held-out token set
    res = {"method": method, "seed": seed, "init_log": ci.log if ci else None, "special_tokens": special_tokens}
    # one held-out forward pass at initialisation serves the analyses and the trajectory's step 0; the trajectory
    # keeps its last step's pass for the analyses at the end (the model does not change after the last step)
    at_init = heldout_layer_inputs(model, heldout)
    res["analysis_init"] = moe_analyses(model, heldout, layer_inputs=at_init)
    if r1_at_init and method != "dense":
        res["r1_init"] = retrieval_r1(model, test_pairs, max_len)  # the initialised model, before any step
    trajectory = (HeldoutEntropy(heldout, trajectory_steps(steps, entropy_points), keep=[steps])
                  if METHODS[method][0] else None)
    hist = None
    if trajectory is not None:
        trajectory.record(0, at_init)  # initialisation
    if method != "dense":
        params = trainable_ffn_params(model)
        eesd = EESD(model, decay=eesd_decay, weight=eesd_weight) if METHODS[method][2] else None
        ds = PairBatches(model, train_pairs, max_len)
        g = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                                             collate_fn=ds.collate, generator=g)
        cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=0.1, decay="linear", seed=seed, log_every=5,
                          max_grad_norm=1.0, desc=f"{method} s{seed}")

        def after_step(step, m):
            if eesd is not None:
                eesd.update()  # theta_ema <- decay theta_ema + (1 - decay) theta
            if trajectory is not None:
                trajectory(step, m)

        out = train(model, loader, loss_fn=make_loss_fn(aux_coef, eesd), cfg=cfg, hooks={"after_step": after_step},
                    param_groups=[{"params": params, "weight_decay": 0.0}])
        model, hist = out.model, out.history
        if eesd:
            eesd.remove()
    res["history"] = hist
    res["entropy_heldout"] = trajectory.rows if trajectory is not None else []
    res["analysis"] = moe_analyses(model, heldout,
                                   layer_inputs=trajectory.layer_inputs.get(steps) if trajectory is not None else None)
    res["r1"] = retrieval_r1(model, test_pairs, max_len)
    if r1_at_init and method == "dense":
        res["r1_init"] = res["r1"]  # never trained: initialisation and end are one model
    if benchmarks is not None:
        res["benchmarks"] = embed.evaluate(lambda t: encode(model, t, max_len=max_len).numpy(), benchmarks)
    res["wall_s"] = time.perf_counter() - t0
    return res


def text_calibration(st, pairs: dict, calib_texts: int, calib_tokens: int, max_len: int = 32):
    """The calibration token set of notebook 03's text experiment: FFN inputs ``{layer: [T, d]}`` of the dense
    encoder over the first ``calib_texts`` training anchors and positives (cached,
    :func:`moelab.cluster_upcycling.data.cached_calibration`) and the [T] mask of its special tokens
    (:func:`moelab.cluster_upcycling.data.calibration_special_mask`). Returns ``(calib, special_mask)``."""
    texts = [t for ab in list(pairs["train"])[:calib_texts] for t in ab]
    calib = cached_calibration(st, texts, calib_tokens, max_len)
    special = calibration_special_mask(st, texts, calib_tokens, max_len)
    if calib and len(special) != len(next(iter(calib.values()))):
        raise ValueError(f"special-token mask covers {len(special)} tokens but the calibration set has "
                         f"{len(next(iter(calib.values())))}: the cached calibration was built with other settings")
    return calib, special


def text_experiment(st, pairs: dict, methods, seeds, *, calib_texts: int, calib_tokens: int, n_test: int,
                    n_probe: int, benchmarks=None, bench_all_seeds: bool = True, use_cache: bool = True,
                    special_tokens: str = DEFAULT_SPECIAL_TOKENS, eval_split: str = "test", **kw) -> list[dict]:
    """Every (method, seed) cell of notebook 03's text experiment, each cached by its configuration.

    ``pairs``: ``moelab.suite.embed.pairs(profile)`` (train / test splits). Calibration sentences are the first
    ``calib_texts`` training anchors and positives, their special tokens handled per ``special_tokens`` (default
    ``"exclude"``, see :class:`moelab.cluster_upcycling.method.SpecialTokenClusterInit`); evaluation uses the first
    ``n_test`` test pairs and the analyses the first ``n_probe`` test anchors (the fixed held-out token set, never
    trained on, the same for every method). ``eval_split="validation"`` evaluates and analyses on the validation
    pairs instead (for choosing learning rate and steps without touching the test pairs). The untrained ``"dense"``
    model runs once (first seed); suite benchmarks run for every seed (``bench_all_seeds=True``), the first seed only
    (``False``), or every seed of the methods in a list (``bench_all_seeds=["sparse", "cluster_eesd"]``: the methods a
    seed-level claim compares) and the first seed of the others. ``kw`` go to :func:`run_text_condition`.
    """
    if special_tokens not in SPECIAL_TOKENS:
        raise ValueError(f"special_tokens must be one of {SPECIAL_TOKENS}, got {special_tokens!r}")
    if eval_split not in ("test", "validation") or eval_split not in pairs:
        raise ValueError(f"eval_split must be 'test' or 'validation' (a split of pairs: {sorted(pairs)}), "
                         f"got {eval_split!r}")
    train_pairs, test_pairs = list(pairs["train"]), list(pairs[eval_split])[:n_test]
    if len(test_pairs) < 2:
        raise ValueError(f"need at least 2 test pairs, got {len(test_pairs)}")
    calib, special = text_calibration(st, pairs, calib_texts, calib_tokens, kw.get("max_len", 32))
    probe = [a for a, _ in test_pairs[:n_probe]]
    data_key = cache.key([train_pairs, test_pairs])
    out = []
    cells = [(m, s) for m in methods for s in (seeds[:1] if m == "dense" else seeds)]  # untrained dense: no seed
    every = (lambda m: bench_all_seeds) if isinstance(bench_all_seeds, bool) else set(bench_all_seeds).__contains__
    for method, seed in progress.bar(cells, desc="03 text cells", unit="cell"):
        bench = benchmarks if (benchmarks is not None and (every(method) or seed == seeds[0])) else None
        cfg = {"method": method, "seed": seed, "data": data_key, "calib_texts": calib_texts,
               "calib_tokens": calib_tokens, "n_probe": n_probe, "special_tokens": special_tokens,
               "eval_split": eval_split,
               "benchmarks": None if bench is None else sorted(bench), **kw}

        def compute(method=method, seed=seed, bench=bench):
            return run_text_condition(st, method, seed, train_pairs, test_pairs, probe, calib, benchmarks=bench,
                                      special_mask=special, special_tokens=special_tokens, **kw)

        out.append(cache.memo("03_text_condition", cfg, compute) if use_cache else compute())
    return out


TUNED_KEYS = ("lr", "steps", "batch_size")


def tuned_settings(folder, fallback: dict) -> dict:
    """The training settings of notebook 03's text runs: learning rate, steps and batch size chosen
    on the VALIDATION pairs for the sparse baseline by ``scripts/tune_03.py`` (``<folder>/tuning_summary.json``, key
    ``choice``), the same for every method; ``fallback`` (a dict with ``lr``, ``steps``, ``batch_size``) when no
    choice has been made yet. Returns those three settings plus ``source`` (a sentence saying which applies and
    why) and ``candidate`` (the chosen candidate's name, or None)."""
    missing = [k for k in TUNED_KEYS if k not in (fallback or {})]
    if missing:
        raise ValueError(f"fallback must give {list(TUNED_KEYS)}, it lacks {missing}: {fallback!r}")
    path = Path(folder) / "tuning_summary.json"
    hint = "run scripts/tune_03.py --stage screen, then --stage choose"
    if not path.exists():
        return {**{k: fallback[k] for k in TUNED_KEYS}, "candidate": None,
                "source": f"fallback settings: no validation choice at {path} ({hint})"}
    choice = json.loads(path.read_text()).get("choice")
    if not choice:
        return {**{k: fallback[k] for k in TUNED_KEYS}, "candidate": None,
                "source": f"fallback settings: {path} holds no choice yet ({hint})"}
    settings = choice.get("settings", {})
    missing = [k for k in TUNED_KEYS if k not in settings]
    if missing:
        raise ValueError(f"{path}: the choice's settings lack {missing}; rerun scripts/tune_03.py --stage choose")
    return {**{k: settings[k] for k in TUNED_KEYS}, "candidate": choice["candidate"],
            "source": f"chosen on the validation pairs for sparse upcycling ({choice['candidate']}, {path.name})"}


def eesd_decay_for(steps: int) -> float:
    """EMA decay of EESD's teacher for a run of ``steps`` steps (the poster gives none; notebook 03): the teacher's
    averaging horizon ``1 / (1 - decay)`` is a tenth of the run, at least 5 steps:
    ``decay = 1 - 1 / max(5, steps / 10)`` (6 or 24 steps -> 0.8, 120 -> 0.917, 1000 -> 0.99)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return 1.0 - 1.0 / max(5.0, steps / 10.0)


def run_from_config(config: dict) -> pd.DataFrame:
    """Notebook 03's text experiment as a script (``python -m moelab.launch moelab.cluster_upcycling:run_from_config
    --config cfg.json``; one process). Keys: ``profile`` (the suite's pairs and, with ``benchmarks``, its
    benchmarks: "smoke" / "default" / "full"), ``methods``, ``seeds``, ``calib_texts``, ``calib_tokens``, ``n_test``,
    ``n_probe``, optional ``benchmarks`` (a suite profile or null), ``eval_split`` ("test" or "validation"),
    ``special_tokens``, ``use_cache`` (true), and :func:`run_text_condition`'s settings (``steps``, ``batch_size``,
    ``lr``, ``max_len``, ``energy``, ``eesd_decay``, ``eesd_weight``, ``aux_coef``, ``num_experts``, ``top_k``,
    ``entropy_points``, ``r1_at_init``). Returns :func:`run_summary`'s table: one row per (method, seed) with R@1 (mean of
    both directions, %) at the end and at initialisation and, for MoE methods, the held-out router movement and
    analyses at init and at the end, averaged over MoE layers."""
    if not isinstance(config, dict) or not config.get("methods") or not config.get("seeds"):
        raise ValueError(f"config must be a dict with non-empty 'methods' and 'seeds', got {config!r}")
    cfg = dict(config)
    profile = cfg.pop("profile", "smoke")
    bench = cfg.pop("benchmarks", None)
    methods, seeds = list(cfg.pop("methods")), [int(s) for s in cfg.pop("seeds")]
    st = assets.load_minilm()
    results = text_experiment(st, embed.pairs(profile), methods, seeds,
                              benchmarks=embed.benchmarks(bench) if bench else None, **cfg)
    return run_summary(results)


def run_summary(results) -> pd.DataFrame:
    """One row per text run (method, seed): R@1 (mean of both directions, %) at the end and, when measured, at
    initialisation (``r1_init_avg``); the steps trained, the last 5 steps' mean training loss and the run's wall
    seconds (build, train, evaluate; for a run served from the cache, the original run's); for MoE methods the
    held-out router movement (``top1_agreement`` with the init router, averaged over MoE layers) and the analyses at
    init and at the end averaged over MoE layers (:func:`run_from_config`, ``scripts/tune_03.py``)."""
    rows = []
    for r in results:
        row = {"method": r["method"], "seed": r["seed"],
               "r1_avg": 50 * float(r["r1"]["a2p"].mean() + r["r1"]["p2a"].mean())}
        if r.get("r1_init") is not None:
            row["r1_init_avg"] = 50 * float(r["r1_init"]["a2p"].mean() + r["r1_init"]["p2a"].mean())
        h = r.get("history")
        if h is not None and len(h):
            row["steps"] = len(h)
            row["train_loss_end"] = float(h["loss"].iloc[-5:].mean())  # the last 5 steps' mean
        if "wall_s" in r:
            row["wall_s"] = float(r["wall_s"])
        a0, a1 = r["analysis_init"], r["analysis"]
        if a0:
            row["top1_agreement"] = float(np.mean([router_agreement(x, y) for x, y in zip(a0["top1"], a1["top1"])]))
            for k in ("routing_entropy", "expert_output_similarity", "expert_similarity", "relative_compactness"):
                row[f"{k}_init"], row[f"{k}_final"] = float(np.mean(a0[k])), float(np.mean(a1[k]))
        rows.append(row)
    return pd.DataFrame(rows)


def special_token_logs(st_dense, calib: dict, special_mask, *, seed: int = 0, num_experts: int = 8,
                       top_k: int = 2, energy: float = 0.95, modes=SPECIAL_TOKENS) -> dict:
    """Cluster-aware initialisation (Steps 1-3, no training) of the dense encoder once per special-token handling in
    ``modes`` on the same calibration set; returns ``{mode: init log}`` for
    :func:`moelab.cluster_upcycling.report.special_token_ranks_table` (notebook 03)."""
    logs = {}
    for mode in modes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # small clusters get SVD-LLM jitter, by design
            _, ci = build_model(st_dense, "cluster", calib, seed, num_experts, top_k, energy,
                                special_mask=special_mask, special_tokens=mode)
        logs[mode] = ci.log
    return logs


# ---------------------------------------------------------------------------------------------------------------
# Vision experiment (poster "Implementation Details" and "Few-shot and Full Fine-tuning" on CLIP ViT; notebook 03)
# A small ViT pretrained here on real Fashion-MNIST stands in for the dense CLIP ViT-B (no CLIP weights here).
# ---------------------------------------------------------------------------------------------------------------
VIT_SMALL = dict(image_size=28, patch_size=7, num_channels=1, hidden_size=128, num_hidden_layers=6,
                 num_attention_heads=4, intermediate_size=512, num_labels=10)
VISION_METHODS = ("dense", "dense_long", "sparse", "noise", "drop", "cluster_eesd")
VISION_COLUMNS = {"items": ["method", "seed", "task", "item", "score"],
                  "accuracy": ["method", "seed", "task", "accuracy"]}


def make_vit(vit: dict, seed: int):
    """A randomly initialised ``transformers.ViTForImageClassification`` from the settings ``vit`` (e.g.
    :data:`VIT_SMALL`); it is then pretrained here on real Fashion-MNIST (:func:`pretrain_vit`)."""
    torch.manual_seed(seed)
    return ViTForImageClassification(ViTConfig(**vit)).eval()


def _tokens_per_image(vit: dict) -> int:
    return (vit["image_size"] // vit["patch_size"]) ** 2 + 1  # patches + CLS


def make_cls_loss_fn(aux_coef: float = 0.01, eesd: EESD | None = None):
    """``loss_fn(model, batch)``: cross-entropy of the ViT's logits + aux_coef * balancing loss (+ EESD)."""

    def loss_fn(model, batch):
        logits = model(pixel_values=batch["pixel_values"]).logits
        loss = F.cross_entropy(logits, batch["labels"])
        return _moe_terms(model, loss, {"ce": loss.detach()}, aux_coef, eesd)

    return loss_fn


def train_classifier(model, x, y, *, steps: int, batch_size: int, lr: float, seed: int, aux_coef: float = 0.01,
                     eesd: EESD | None = None, weight_decay: float = 0.0, desc: str = "vit"):
    """All parameters of the ViT trained with cross-entropy through :func:`moelab.train.train` (AdamW, 10% warmup,
    cosine decay, clip 1.0); EESD's EMA teachers are updated after every step. Returns the ``TrainResult``."""
    cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=0.1, decay="cosine", seed=seed, log_every=10,
                      max_grad_norm=1.0, weight_decay=weight_decay, desc=desc)
    hooks = {"after_step": (lambda step, m: eesd.update())} if eesd else None
    return train(model, image_loader(x, y, batch_size, seed), loss_fn=make_cls_loss_fn(aux_coef, eesd), cfg=cfg,
                 hooks=hooks)


@torch.no_grad()
def vit_outputs(model, x, batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [N, C], features [N, d])``; features = the final-LayerNorm CLS token, i.e. the pooled
    representation the classifier head reads (what the linear probes use)."""
    model.eval()
    dev = next(model.parameters()).device
    logits, feats = [], []
    for i in range(0, len(x), batch_size):
        h = model.vit(pixel_values=to_pixels(x[i:i + batch_size]).to(dev)).last_hidden_state[:, 0]  # [B, d]
        feats.append(h.cpu())
        logits.append(model.classifier(h).cpu())
    return torch.cat(logits), torch.cat(feats)


def pretrain_vit(cfg: dict, seed: int):
    """The dense model: :func:`make_vit` trained on the Fashion-MNIST training images of ``cfg["data_profile"]``
    (``cfg["pretrain_steps"]`` steps of ``cfg["pretrain_batch"]``, lr ``cfg["pretrain_lr"]``, weight decay 0.05),
    cached with ``moelab.cache.artifact`` (keyed by these settings). Returns ``(model, info)``; ``info``: steps,
    images seen, epochs, seconds per step, Fashion-MNIST test accuracy, final training loss (notebook 03)."""
    key = {k: cfg[k] for k in ("vit", "data_profile", "pretrain_steps", "pretrain_batch", "pretrain_lr")}

    def build(tmp):
        data = images.fashion_mnist(cfg["data_profile"])
        model = make_vit(cfg["vit"], seed)
        out = train_classifier(model, data["train_x"], data["train_y"], steps=cfg["pretrain_steps"],
                               batch_size=cfg["pretrain_batch"], lr=cfg["pretrain_lr"], seed=seed,
                               weight_decay=0.05, desc="pretrain ViT")
        logits, _ = vit_outputs(out.model, data["test_x"])
        seen = cfg["pretrain_steps"] * cfg["pretrain_batch"]
        info = dict(steps=cfg["pretrain_steps"], images_seen=seen, epochs=seen / len(data["train_y"]),
                    s_per_step=out.wall_s / cfg["pretrain_steps"], final_loss=float(out.history["loss"].iloc[-5:].mean()),
                    test_accuracy=100 * float((logits.argmax(1).numpy() == data["test_y"]).mean()))
        out.model.save_pretrained(tmp)
        (tmp / "pretrain_info.json").write_text(json.dumps(info))

    path = cache.artifact("03_vit_fashion_mnist", {**key, "seed": seed}, build)
    model = ViTForImageClassification.from_pretrained(path).eval()
    return model, json.loads((path / "pretrain_info.json").read_text())


def vit_calibration(model, x, cfg: dict, model_key: str) -> dict:
    """FFN inputs ``{layer: [T, d]}`` of the dense ViT (every other layer; CLS and patch tokens, image by image)
    over the first ``cfg["calib_images"]`` training images, at most ``cfg["calib_tokens"]`` per layer, cached by
    ``moelab.cache.memo`` (poster Step 1's "collect FFN input activations X"; the CLS rows are marked by
    :func:`moelab.cluster_upcycling.data.vit_special_mask`)."""
    n, bs = cfg["calib_images"], 128
    batches = ({"pixel_values": to_pixels(x[i:i + bs])} for i in range(0, n, bs))
    key = {"model": model_key, "images": images_key(x, n), "n": n, "max_tokens": cfg["calib_tokens"],
           "layers": "every_other"}
    return cache.memo("03_vit_ffn_inputs", key, lambda: collect_ffn_inputs(model, batches, layers="every_other",
                                                                            max_tokens=cfg["calib_tokens"]))


def few_shot_indices(y, k: int, seed) -> np.ndarray:
    """Exactly ``k`` indices per class of ``y`` drawn without replacement, deterministic per ``seed`` (an int or a
    sequence for ``numpy.random.default_rng``); ``ValueError`` naming a class with fewer than ``k`` examples."""
    y = np.asarray(y)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    rng = np.random.default_rng(seed)
    out = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < k:
            raise ValueError(f"class {c} has {len(idx)} examples, fewer than k={k} shots")
        out.append(rng.choice(idx, size=k, replace=False))
    return np.concatenate(out)


def few_shot_probe(train_feats, train_y, test_feats, test_y, k: int, draws: int, seed: int) -> np.ndarray:
    """Linear probe (scikit-learn ``StandardScaler`` + ``LogisticRegression``, default C=1) on ``k`` shots per class
    of frozen features, ``draws`` independent shot draws (seeded by ``(seed, k, draw)``, the same for every method so
    the comparison is paired). Returns per-test-item accuracy averaged over draws ``[N_test]`` in [0, 1]."""
    train_feats, test_feats = np.asarray(train_feats, np.float64), np.asarray(test_feats, np.float64)
    hits = np.zeros(len(test_y))
    for d in range(draws):
        idx = few_shot_indices(train_y, k, [seed, k, d])
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(train_feats[idx], train_y[idx])
        hits += clf.predict(test_feats) == np.asarray(test_y)
    return hits / draws


def finetune_accuracy(model, data: dict, cfg: dict, seed: int) -> np.ndarray:
    """"Full fine-tuning" analogue: a copy of ``model`` with a fresh 10-way head (seeded) is trained end to end on
    the CIFAR training pool (``cfg["ft_steps"]`` x ``cfg["ft_batch"]``, lr ``cfg["ft_lr"]``, balancing loss, no EESD)
    and scored on the evaluation pool. Returns per-item 0/1 correctness."""
    m = copy.deepcopy(model)
    torch.manual_seed(seed)
    m.classifier = nn.Linear(m.classifier.in_features, int(data["cifar_train_y"].max()) + 1)
    out = train_classifier(m, data["cifar_train_x"], data["cifar_train_y"], steps=cfg["ft_steps"],
                           batch_size=cfg["ft_batch"], lr=cfg["ft_lr"], seed=seed, aux_coef=cfg["aux_coef"],
                           desc="fine-tune")
    logits, _ = vit_outputs(out.model, data["cifar_test_x"])
    return (logits.argmax(1).numpy() == data["cifar_test_y"]).astype(float)


def run_vision_condition(vit_dense, method: str, seed: int, data: dict, calib: dict, cfg: dict,
                         special_mask=None) -> dict:
    """One (method, seed) cell of notebook 03's vision experiment: upcycle every other FFN of the pretrained ViT
    (``cfg["num_experts"]`` experts, top-``cfg["top_k"]``; the CLS token handled per ``cfg["special_tokens"]``,
    default ``"exclude"``), continue training on Fashion-MNIST (all parameters; EESD when the method has it;
    ``"dense"`` skips training), then score: Fashion-MNIST test correctness, k-shot probes on CIFAR-10 features, and
    CIFAR-10 fine-tuning. Returns plain data (per-item arrays, history, timings)."""
    seed_everything(seed)
    model = copy.deepcopy(vit_dense)
    ci = upcycle(model, method, calib, seed, cfg["num_experts"], cfg["top_k"], cfg["energy"],
                 special_mask=special_mask, special_tokens=cfg.get("special_tokens", DEFAULT_SPECIAL_TOKENS))
    res = {"method": method, "seed": seed, "init_log": ci.log if ci else None, "history": None, "timing": []}
    if method != "dense":
        eesd = EESD(model, decay=cfg["eesd_decay"], weight=cfg["eesd_weight"]) if METHODS[method][2] else None
        out = train_classifier(model, data["train_x"], data["train_y"], steps=cfg["steps"],
                               batch_size=cfg["batch_size"], lr=cfg["lr"], seed=seed, aux_coef=cfg["aux_coef"],
                               eesd=eesd, desc=f"{method} s{seed}")
        model, res["history"] = out.model, out.history
        res["timing"].append(("continued_training", cfg["steps"], out.wall_s))
        if eesd:
            eesd.remove()
    t0 = time.perf_counter()
    logits, _ = vit_outputs(model, data["test_x"])
    res["fmnist_test"] = (logits.argmax(1).numpy() == data["test_y"]).astype(float)
    if cfg["shots"]:  # few-shot probes (no signal on this ViT; notebook 03 runs none by default)
        _, f_tr = vit_outputs(model, data["cifar_train_x"])
        _, f_te = vit_outputs(model, data["cifar_test_x"])
    for k in cfg["shots"]:
        res[f"cifar_{k}shot"] = few_shot_probe(f_tr.numpy(), data["cifar_train_y"], f_te.numpy(),
                                               data["cifar_test_y"], k, cfg["probe_draws"], seed)
    res["timing"].append(("evaluation_and_probes", 0, time.perf_counter() - t0))
    if cfg["ft_steps"]:
        t0 = time.perf_counter()
        res["cifar_ft"] = finetune_accuracy(model, data, cfg, seed)
        res["timing"].append(("fine_tuning", cfg["ft_steps"], time.perf_counter() - t0))
    return res


def vision_experiment(methods, seeds, cfg: dict, use_cache: bool = True) -> dict:
    """Notebook 03's vision experiment: the ViT is pretrained once (first seed, cached), its FFN inputs collected once
    (cached), then every (method, seed) cell runs :func:`run_vision_condition` (each cached by its settings). The
    untrained ``"dense"`` model runs with every seed when ``cfg["ft_steps"]`` (its fine-tuning is seeded training),
    else with the first seed only; ``shots=()`` runs no few-shot probe.

    ``cfg`` keys: ``vit``, ``data_profile``, ``pretrain_steps``, ``pretrain_batch``, ``pretrain_lr``,
    ``calib_images``, ``calib_tokens``, ``n_test``, ``n_cifar_train``, ``n_cifar_test``, ``steps``, ``batch_size``,
    ``lr``, ``shots``, ``probe_draws``, ``ft_steps``, ``ft_batch``, ``ft_lr``, ``num_experts``, ``top_k``, ``energy``,
    ``eesd_decay``, ``eesd_weight``, ``aux_coef``, optional ``special_tokens`` (default ``"exclude"``: the CLS token
    is left out of the clustering). Returns tidy DataFrames: ``items`` (method, seed, task, item, score: per-item
    0/1, probe scores averaged over shot draws), ``accuracy`` (method, seed, task, accuracy in %), ``history`` (per
    training step), ``timing`` (method, seed, phase, steps, wall_s), ``pretrain`` (one row), and the raw ``results``
    (init logs for :func:`moelab.cluster_upcycling.report.init_table`). Tasks: ``fmnist_test``, ``cifar_{k}shot``
    for k in ``shots``, ``cifar_ft``.
    """
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown vision method(s) {bad}; expected names from {list(METHODS)}")
    if not seeds:
        raise ValueError("vision_experiment needs at least one seed")
    special_tokens = cfg.get("special_tokens", DEFAULT_SPECIAL_TOKENS)
    if special_tokens not in SPECIAL_TOKENS:
        raise ValueError(f"special_tokens must be one of {SPECIAL_TOKENS}, got {special_tokens!r}")
    vit, info = pretrain_vit(cfg, seeds[0])
    model_key = cache.key({k: cfg[k] for k in ("vit", "data_profile", "pretrain_steps", "pretrain_batch",
                                                 "pretrain_lr")} | {"seed": seeds[0]})
    data = vision_data(cfg)
    calib = vit_calibration(vit, data["train_x"], cfg, model_key)
    special = vit_special_mask(len(next(iter(calib.values()))), _tokens_per_image(cfg["vit"]))
    results = []
    cells = [(m, s) for m in methods for s in (seeds[:1] if m == "dense" and not cfg["ft_steps"] else seeds)]
    for method, seed in progress.bar(cells, desc="03 vision cells", unit="cell"):
        key = {"model": model_key, "method": method, "seed": seed, "special_tokens": special_tokens,
               **{k: v for k, v in cfg.items() if k not in ("vit", "methods", "seeds")}}

        def compute(method=method, seed=seed):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # small clusters get SVD-LLM jitter, by design
                return run_vision_condition(vit, method, seed, data, calib, cfg, special)

        results.append(cache.memo("03_vit_condition", key, compute) if use_cache else compute())
    tasks = ["fmnist_test"] + [f"cifar_{k}shot" for k in cfg["shots"]] + (["cifar_ft"] if cfg["ft_steps"] else [])
    items = pd.DataFrame([{"method": r["method"], "seed": r["seed"], "task": t, "item": i, "score": float(v)}
                          for r in results for t in tasks for i, v in enumerate(r[t])], columns=VISION_COLUMNS["items"])
    acc = (items.groupby(["method", "seed", "task"], sort=False)["score"].mean() * 100).rename("accuracy").reset_index()
    hist = [r["history"].assign(method=r["method"], seed=r["seed"]) for r in results if r["history"] is not None]
    timing = pd.DataFrame([{"method": r["method"], "seed": r["seed"], "phase": p, "steps": n, "wall_s": w}
                           for r in results for p, n, w in r["timing"]])
    return dict(items=items, accuracy=acc, history=pd.concat(hist, ignore_index=True) if hist else pd.DataFrame(),
                timing=timing, pretrain=pd.DataFrame([info]), results=results)


# ---------------------------------------------------------------------------------------------------------------
# The notebook's steps (03): training settings, the special-token study, the text runs, the vision settings
# ---------------------------------------------------------------------------------------------------------------
# where scripts/tune_03.py writes its validation choice (not under figures/: publishing replaces that folder)
TUNING_DIR = Path(__file__).resolve().parents[3] / "data" / "tuning" / "03_cluster_upcycling"


def training_settings(fallback: dict, fixed: dict | None = None, fixed_source: str = "",
                      folder=TUNING_DIR) -> dict:
    """The text runs' learning rate, steps and batch size with ``candidate`` and ``source`` (a sentence): ``fixed``
    when given (the smoke profile's tiny settings, ``fixed_source`` saying so), else the validation choice of
    ``scripts/tune_03.py`` in ``folder`` or ``fallback`` until it exists (:func:`tuned_settings`)."""
    if fixed is not None:
        return {**{k: fixed[k] for k in TUNED_KEYS}, "candidate": None, "source": fixed_source}
    return tuned_settings(folder, fallback)


def special_token_study(st, pairs: dict, cfg: dict, seed: int = 0) -> dict:
    """Notebook 03, Steps 1-3: the calibration set (``cfg`` calib_texts / calib_tokens / max_len) and the
    cluster-aware initialisation under each special-token handling (no training). Returns the per-expert ranks
    table, its per-layer summary, and the numbers of special and of all calibration tokens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # rank-deficient clusters (smoke) get jitter, by design
        calib, special = text_calibration(st, pairs, cfg["calib_texts"], cfg["calib_tokens"], cfg["max_len"])
        logs = special_token_logs(st, calib, special, seed=seed, num_experts=cfg["num_experts"], top_k=cfg["top_k"],
                                  energy=cfg["energy"])
    ranks = special_token_ranks_table(logs)
    return {"ranks": ranks, "summary": special_token_summary(ranks), "n_special": int(special.sum()),
            "n_tokens": len(special)}


def text_runs(st, pairs: dict, cfg: dict, benchmarks=None) -> list[dict]:
    """Notebook 03's text experiment (:func:`text_experiment`) with the sizes of ``cfg`` (methods, seeds, calibration,
    evaluation, training and the init / EESD settings)."""
    keys = ("special_tokens", "steps", "batch_size", "lr", "max_len", "energy", "eesd_decay", "eesd_weight",
            "aux_coef", "num_experts", "top_k")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return text_experiment(st, pairs, cfg["methods"], cfg["seeds"], calib_texts=cfg["calib_texts"],
                               calib_tokens=cfg["calib_tokens"], n_test=cfg["n_test"], n_probe=cfg["n_probe"],
                               benchmarks=benchmarks, bench_all_seeds=cfg["bench_all_seeds"],
                               **{k: cfg[k] for k in keys})


def vision_settings(cfg: dict) -> dict:
    """The dict :func:`vision_experiment` takes: the text runs' init and EESD settings with ``cfg["vision"]``."""
    shared = ("num_experts", "top_k", "energy", "eesd_weight", "aux_coef", "special_tokens")
    return {**{k: cfg[k] for k in shared}, **cfg["vision"]}
