"""Runs of notebook ``02_sba``: contrastive fine-tuning (SBA paper §V-B, Eq. 12), the three phases of the
protocol, and the measurements after each run.

- :func:`mnrl_loss`, :func:`finetune_embedder`: MNRL with in-batch negatives through :func:`moelab.train.train`.
- Phase (b), :func:`train_until_plateau`: train the nomic-layout stand-in with linear aggregation for a length fixed
  by a validation-loss criterion (:func:`plateau_reached`), not by the geometry measured afterwards; returns the
  checkpoint. :func:`phase_b_run`: phases (a) and (b) as one memoisable run (init damage with and without
  compensation, geometry at init, training, geometry, benchmarks and router movement after).
- Phase (c), :func:`finetune_checkpoint`: from that one checkpoint, fine-tune with a chosen aggregation (linear,
  SBA, norm-free, unit-output) for fixed steps and seed, as the paper fine-tunes nomic; :func:`swap_aggregation`:
  the cheap arm that swaps the aggregation on the checkpoint without fine-tuning.
- :func:`measure_embedder`: benchmarks, geometry over subject prompts, expert similarity of one model.
- The earlier runs (renormalised stand-in; the "experts half random" drop ablation, :func:`drop_ablation_init` for
  its untrained scores) and the paper profile on nomic itself.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from moelab.assets import load_minilm, minilm_path
from moelab.cache import memo, path_identity
from moelab.device import inference_placement
from moelab.core.layer import aux_loss, moe_layers
from moelab.core.losses import in_batch_contrastive
from moelab.seed import seed_everything
from moelab.suite import embed as suite_embed
from moelab.train import Hooks, TrainConfig, flattened, resolve_device, train

from .config import SbaProfile
from .data import (MTEB_TASKS, PairCollate, check_nomic_folder, evaluate_benchmarks, find_allnli_triplet_dir,
                   load_allnli_triplets, load_mteb_local, short_pairs, wordnet_subject_texts)
from .geometry import collect_geometry, moe_specialisation, nomic_forward_fn, router_movement, st_forward_fn
from .loader import load_nomic
from .method import check_aggregation, set_aggregation
from .items import evaluate_mteb_with_items, evaluate_with_items
from .regime import RegimeProbe
from .standin import build_moe_minilm, build_nomic_layout_minilm, build_nomic_layout_moe, init_damage, st_encode_fn

__all__ = ["st_embed", "nomic_embed", "mnrl_loss", "finetune_embedder", "validation_mnrl", "plateau_reached",
           "PLATEAU_RULE", "train_until_plateau", "phase_b_run", "load_checkpoint", "finetune_checkpoint",
           "swap_aggregation", "measure_embedder", "phase_c_run", "swap_run", "finetune_and_measure", "init_geometry",
           "drop_ablation_init", "nomic_measure",
           "nomic_finetune_and_measure", "evaluate_mteb_local_nomic", "PHASE_B_FILE", "run_from_config",
           "moe_param_groups", "Setup", "setup", "separation", "phase_b", "phase_b_runs", "phase_c", "phase_c_runs", "swap_runs",
           "drop_ablation"]

PLATEAU_RULE = ("stop at the first evaluation n (n >= window) where the best validation loss of the last `window` "
                "evaluations is not below the best before them by at least `min_rel_improvement` (relative): "
                "(min L[:n+1-window] - min L[n+1-window:n+1]) / |min L[:n+1-window]| < min_rel_improvement")


# ----------------------------------------------------------------------------------------------------------------------
# the contrastive objective and one fine-tuning run
# ----------------------------------------------------------------------------------------------------------------------
def st_embed(model, features):
    """Sentence embedding of a SentenceTransformer for a features dict."""
    return model(features)["sentence_embedding"]


def nomic_embed(model, features):
    """Sentence embedding of :class:`moelab.sba.NomicEmbed` for a features dict."""
    return model.embed(features["input_ids"], features["attention_mask"])


def mnrl_loss(model, batch, scale: float = 20.0, aux_coef: float = 0.01, embed=st_embed):
    """Multiple Negatives Ranking Loss (SBA paper Eq. 12) with in-batch negatives, cosine similarity, τ = 1/scale:

        L = -1/N Σ_i log( exp(cos(a_i, p_i)/τ) / Σ_j exp(cos(a_i, c_j)/τ) ),  c = [p; n]   scores [N, N or 2N]

    (hard negatives n appended when the batch has them, as for all-nli triplets), plus ``aux_coef`` × the Switch
    balancing loss of the MoE layers summed over the passes. Written out instead of sentence-transformers' MNRL
    module because the trainer hands in its own (possibly wrapped) model, which that module would not call.
    """
    a = embed(model, batch["anchor"])  # [N, d]
    aux = aux_loss(model)
    cands = [embed(model, batch["positive"])]  # [N, d]
    aux = aux + aux_loss(model)
    if "negative" in batch:
        cands.append(embed(model, batch["negative"]))
        aux = aux + aux_loss(model)
    ce = in_batch_contrastive(a, torch.cat(cands), scale)  # Eq. 12
    loss = ce + aux_coef * aux.to(ce.device)
    # task_loss: the MNRL alone, whose router gradient the trainer logs
    return loss, {"mnrl": float(ce.detach()), "aux": float(aux.detach()), "task_loss": ce}


def _val_batches(model, val_pairs, batch_size, val_batches, collate):
    if not val_pairs:
        raise ValueError("no validation pairs")
    collate = collate or PairCollate(model.tokenize)
    val_pairs = list(val_pairs)[: val_batches * batch_size]
    vb = [collate(val_pairs[i:i + batch_size]) for i in range(0, len(val_pairs), batch_size)]
    vb = [b for b in vb if len(b["anchor"]["input_ids"]) > 1]
    if not vb:
        raise ValueError(f"{len(val_pairs)} validation pair(s) give no batch of >= 2 pairs; pass more")
    return vb


def _loader_and_val(model, train_pairs, val_pairs, batch_size, seed, val_batches, collate):
    if len(train_pairs) < batch_size:
        raise ValueError(f"{len(train_pairs)} training pairs < batch_size {batch_size}")
    vb = _val_batches(model, val_pairs, batch_size, val_batches, collate)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(train_pairs), batch_size=batch_size, shuffle=True,
                        collate_fn=collate or PairCollate(model.tokenize), generator=g, drop_last=True)
    return loader, vb


def _val_fn(vb, embed):
    def eval_fn(m):
        dev = next(m.parameters()).device
        vals = [mnrl_loss(m, _to(b, dev), aux_coef=0.0, embed=embed)[1]["mnrl"] for b in vb]
        return {"val_mnrl": float(np.mean(vals))}

    return eval_fn


def _to(batch, dev):
    return {k: {n: (t.to(dev) if torch.is_tensor(t) else t) for n, t in v.items()} for k, v in batch.items()}


def finetune_embedder(model, train_pairs, val_pairs, *, steps: int, batch_size: int = 32, lr: float = 2e-5,
                      seed: int = 0, eval_every: int = 0, warmup_frac: float = 0.1, aux_coef: float = 0.01,
                      val_batches: int = 4, collate=None, embed=st_embed, grad_accum: int = 1, device: str = "auto"):
    """Contrastive fine-tuning through :func:`moelab.train.train`: MNRL (cosine, scale 20 = τ 0.05), AdamW, linear
    warm-up over 10% then linear decay (SBA paper §V-B). ``collate`` defaults to the SentenceTransformer's tokenizer.
    Returns the TrainResult (``eval_history.val_mnrl``: validation loss on held-out pairs)."""
    loader, vb = _loader_and_val(model, train_pairs, val_pairs, batch_size, seed, val_batches, collate)
    cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=warmup_frac, decay="linear", weight_decay=0.01, seed=seed,
                      eval_every=eval_every, log_every=max(1, steps // 10), max_grad_norm=1.0, device=device,
                      desc="mnrl", grad_accum=grad_accum)
    return train(model, loader, loss_fn=lambda m, b: mnrl_loss(m, b, aux_coef=aux_coef, embed=embed), cfg=cfg,
                 eval_fn=_val_fn(vb, embed))


@torch.no_grad()
def validation_mnrl(model, val_pairs, batch_size: int = 32, val_batches: int = 4, collate=None,
                    embed=st_embed) -> float:
    """Mean MNRL (no balancing term) of ``model`` on the first ``val_batches`` batches of ``val_pairs``."""
    vb = _val_batches(model, val_pairs, batch_size, val_batches, collate)
    was = model.training
    model.eval()
    try:
        return _val_fn(vb, embed)(model)["val_mnrl"]
    finally:
        model.train(was)


# ----------------------------------------------------------------------------------------------------------------------
# phase (b): linear aggregation, length by a validation-loss criterion
# ----------------------------------------------------------------------------------------------------------------------
def plateau_reached(val_losses, window: int = 3, min_rel_improvement: float = 0.01) -> tuple[bool, float]:
    """The stop rule of phase (b) (:data:`PLATEAU_RULE`): over the validation losses
    ``L_0..L_n`` (one per evaluation),
    ``improvement = (min L[:n+1-window] - min L[n+1-window:]) / |min L[:n+1-window]|``;
    stop when it is below ``min_rel_improvement``. Returns ``(stop, improvement)``; ``(False, nan)`` while fewer than
    ``window + 1`` losses exist."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r} must be an int >= 1 (evaluations)")
    if not 0 <= min_rel_improvement < 1:
        raise ValueError(f"min_rel_improvement={min_rel_improvement!r} must be in [0, 1) (e.g. 0.01 = 1%)")
    x = np.asarray(val_losses, dtype=float).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("validation losses contain non-finite values")
    if len(x) <= window:
        return False, float("nan")
    before, recent = x[:len(x) - window].min(), x[len(x) - window:].min()
    imp = float((before - recent) / max(abs(before), 1e-12))
    return bool(imp < min_rel_improvement), imp


def moe_param_groups(model, lr: float, moe_lr: float, weight_decay: float = 0.01) -> list[dict]:
    """AdamW groups: the MoE layers' parameters (experts, routers, shared bias) at ``moe_lr``, every other trainable
    parameter at ``lr``; weight decay on tensors of >= 2 dimensions only (as :mod:`moelab.train`'s default)."""
    if not (0 < lr < 1 and 0 < moe_lr < 1):
        raise ValueError(f"lr={lr!r} and moe_lr={moe_lr!r} must be in (0, 1)")
    moe = {id(p) for layer in moe_layers(model) for p in layer.parameters()}
    if not moe:
        raise ValueError("the model has no MoE layers: moe_lr needs them")
    groups = {}
    for p in model.parameters():
        if p.requires_grad:
            key = (id(p) in moe, p.ndim >= 2)
            groups.setdefault(key, []).append(p)
    return [dict(params=ps, lr=moe_lr if is_moe else lr, weight_decay=weight_decay if decay else 0.0)
            for (is_moe, decay), ps in sorted(groups.items())]


class _PlateauStop(Exception):
    """Raised from the trainer's on_eval hook when :func:`plateau_reached` says stop."""


def _snapshot(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def train_until_plateau(model, train_pairs, val_pairs, *, max_steps: int, eval_every: int, window: int = 3,
                        min_rel_improvement: float = 0.01, batch_size: int = 32, lr: float = 5e-5, seed: int = 0,
                        warmup_frac: float = 0.05, aux_coef: float = 0.01, val_batches: int = 4, collate=None,
                        embed=st_embed, keep: str = "last", device: str = "auto", stop_on_plateau: bool = True,
                        probe=None, val_batch_size: int | None = None, aggregation: str = "linear",
                        moe_lr: float | None = None) -> dict:
    """Phase (b) (notebook 02_sba): train ``model`` (the nomic-layout stand-in) with **linear**
    aggregation, MNRL + ``aux_coef`` × balancing loss, AdamW, warm-up then a constant learning rate, evaluating the
    validation MNRL every ``eval_every`` steps and stopping by :func:`plateau_reached` (``window`` evaluations,
    ``min_rel_improvement``), at most ``max_steps`` steps (``stop_on_plateau=False``: exactly ``max_steps``, the rule
    only reported). ``probe(model) -> dict`` (e.g. :class:`moelab.sba.regime.RegimeProbe`) adds its readings to every
    evaluation row of ``val``. ``val_batch_size``: the validation batches' size (default ``batch_size``; fix it to
    compare validation losses across training batch sizes: in-batch negatives make MNRL depend on it).
    ``aggregation``: the operator trained (phase (b): linear; phase (c) reuses this rule per aggregation).
    ``moe_lr``: the learning rate of the MoE layers' experts and routers (None: ``lr`` for every parameter), the rest
    of the model at ``lr`` (:func:`moe_param_groups`).

    Returns dict(checkpoint: CPU state dict at the stop step (``keep="last"``) or at the best validation loss
    (``keep="best"``), steps: steps trained, checkpoint_step, stopped: True when the rule fired (False = ``max_steps``
    reached first: the run did not plateau within the budget), improvement (last value of the rule), rule (text),
    val (DataFrame step, val_mnrl), history (DataFrame step, loss, mnrl, aux), wall_s, model (trained in place))."""
    if keep not in ("last", "best"):
        raise ValueError(f"keep={keep!r}; expected 'last' or 'best'")
    if not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"eval_every={eval_every!r} must be an int >= 1 (the rule needs evaluations)")
    if stop_on_plateau and max_steps < eval_every * (window + 1):
        raise ValueError(f"max_steps={max_steps} < eval_every*(window+1)={eval_every * (window + 1)}: the rule could "
                         "never fire; raise max_steps or lower eval_every / window")
    set_aggregation(model, aggregation)  # phase (b): "linear", the MoE the paper's figures describe; (c): each arm
    seed_everything(seed)
    loader, _ = _loader_and_val(model, train_pairs, val_pairs, batch_size, seed, val_batches, collate)
    vb = _val_batches(model, val_pairs, val_batch_size or batch_size, val_batches, collate)
    cfg = TrainConfig(lr=lr, steps=max_steps, warmup_frac=warmup_frac, decay="constant", weight_decay=0.01, seed=seed,
                      eval_every=eval_every, log_every=max(1, eval_every), max_grad_norm=1.0, device=device,
                      desc="phase-b", grad_accum=1)
    rows, val_rows = [], []
    state = {"step": 0, "best": math.inf, "ckpt": None, "ckpt_step": 0, "imp": float("nan"), "stopped": False}

    def loss_fn(m, b):
        loss, met = mnrl_loss(m, b, aux_coef=aux_coef, embed=embed)
        rows.append(dict(step=state["step"] + 1, loss=float(loss.detach()), mnrl=met["mnrl"], aux=met["aux"]))
        return loss, met

    def after_step(step, m):
        state["step"] = step

    def on_eval(step, metrics):
        v = float(metrics["val_mnrl"])
        val_rows.append(dict(step=step, **{k: float(x) for k, x in metrics.items()}))
        if keep == "best" and v < state["best"]:
            state.update(best=v, ckpt=_snapshot(model), ckpt_step=step)
        stop, imp = plateau_reached([r["val_mnrl"] for r in val_rows], window, min_rel_improvement)
        state["imp"] = imp
        if stop and stop_on_plateau:
            state["stopped"] = True
            raise _PlateauStop

    t0 = pd.Timestamp.now()
    try:
        val_fn = _val_fn(vb, embed)
        train(model, loader, loss_fn=loss_fn, cfg=cfg, param_groups=None if moe_lr is None else moe_param_groups(
              model, lr, moe_lr, weight_decay=cfg.weight_decay),
              eval_fn=val_fn if probe is None else (lambda m: {**val_fn(m), **probe(m)}),
              hooks=Hooks(after_step=after_step, on_eval=on_eval))
    except _PlateauStop:
        pass
    model.eval()
    steps = state["step"]
    if keep == "last":
        state.update(ckpt=_snapshot(model), ckpt_step=steps)
    return dict(checkpoint=state["ckpt"], steps=steps, checkpoint_step=state["ckpt_step"], stopped=state["stopped"],
                improvement=state["imp"], rule=PLATEAU_RULE.replace("`window`", str(window)).replace(
                    "`min_rel_improvement`", f"{min_rel_improvement:g}"), val=pd.DataFrame(val_rows),
                history=pd.DataFrame(rows), wall_s=(pd.Timestamp.now() - t0).total_seconds(), model=model)


def phase_b_run(base, *, calib_texts, heldout_texts, train_pairs, val_pairs, subjects: dict, evaluate=None,
                base_scores=None, max_tokens: int = 200, seed: int = 0, init: str = "cluster",
                cluster_kw: dict | None = None, **train_kw) -> dict:
    """Phases (a) and (b) (notebook 02_sba) as one run.

    (a) :func:`moelab.sba.init_damage`: the nomic-layout MoE of the dense ``base`` (``init``, calibrated on
    ``calib_texts``) with and without kept-mass compensation, against ``base`` on ``heldout_texts`` (and
    ``evaluate``'s benchmarks for all three; ``base_scores``: the dense model's, when already computed); the
    compensated model is phase (b)'s start, measured over ``subjects``.
    (b) :func:`train_until_plateau` from it (``train_kw``: ``max_steps``, ``eval_every``, ``window``,
    ``min_rel_improvement``, ``batch_size``, ``lr``, ...), then the checkpoint measured (benchmarks, geometry,
    expert similarity) and :func:`moelab.sba.router_movement` from the start to the checkpoint on the subject texts.

    Returns dict(damage, damage_scores, factors (phase a), init (measure dict at the start), checkpoint, steps,
    checkpoint_step, stopped, improvement, rule, val, history, wall_s (phase b), after (measure dict of the
    checkpoint), movement)."""
    damage = init_damage(base, calib_texts, heldout_texts, evaluate=evaluate, seed=seed, init=init,
                         build_kw=dict(cluster_kw=cluster_kw) if cluster_kw else None, base_scores=base_scores)
    start = damage["models"][f"{init} (nomic layout, compensated)"]
    untrained = copy.deepcopy(start)
    at_init = measure_embedder(start, subjects=subjects, max_tokens=max_tokens)
    res = train_until_plateau(start, train_pairs, val_pairs, seed=seed, **train_kw)
    trained = res["model"]
    trained.load_state_dict(res["checkpoint"])  # keep="best": measure the checkpoint, not the last step
    after = measure_embedder(trained, evaluate=evaluate, subjects=subjects, max_tokens=max_tokens)
    movement = router_movement(untrained, trained, [t for v in subjects.values() for t in v])
    keys = ("checkpoint", "steps", "checkpoint_step", "stopped", "improvement", "rule", "val", "history", "wall_s")
    return dict(damage=damage["table"], damage_scores=damage["scores"], factors=damage["factors"], init=at_init,
                after=after, movement=movement, **{k: res[k] for k in keys})


# ----------------------------------------------------------------------------------------------------------------------
# phase (c): from one checkpoint, one aggregation, fixed steps and seed; and the swap-without-fine-tuning arm
# ----------------------------------------------------------------------------------------------------------------------
def load_checkpoint(template, checkpoint: dict, aggregation: str):
    """A copy of ``template`` (a model of the checkpoint's architecture) with ``checkpoint`` loaded and every MoE layer
    switched to ``aggregation``; the template is left untouched."""
    check_aggregation(aggregation)
    if not isinstance(checkpoint, dict) or not checkpoint:
        raise ValueError("checkpoint must be a non-empty state dict (train_until_plateau(...)['checkpoint'])")
    m = copy.deepcopy(template)
    missing, unexpected = m.load_state_dict(checkpoint, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the template: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]} (build the template with the same layout as phase (b)'s model)")
    return set_aggregation(m, aggregation)


def swap_aggregation(template, checkpoint: dict, aggregation: str):
    """The cheap arm of phase (c): the phase-(b) checkpoint with ``aggregation`` swapped in and no
    fine-tuning (eval mode)."""
    return load_checkpoint(template, checkpoint, aggregation).eval()


def finetune_checkpoint(template, checkpoint: dict, *, aggregation: str, seed: int, steps: int, train_pairs,
                        val_pairs, batch_size: int = 32, lr: float = 2e-5, eval_every: int = 0,
                        warmup_frac: float = 0.1, aux_coef: float = 0.01, val_batches: int = 4, collate=None,
                        embed=st_embed, device: str = "auto"):
    """Phase (c) (SBA paper §V-B; notebook 02_sba): from the phase-(b) ``checkpoint``, fine-tune
    with ``aggregation`` for a fixed number of ``steps`` and ``seed`` (same data, steps and seeds for every
    aggregation; the paper's schedule: warm-up then linear decay). Returns the TrainResult of
    :func:`finetune_embedder` (``.model`` the fine-tuned copy)."""
    m = load_checkpoint(template, checkpoint, aggregation)
    seed_everything(seed)
    return finetune_embedder(m, train_pairs, val_pairs, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                             eval_every=eval_every, warmup_frac=warmup_frac, aux_coef=aux_coef,
                             val_batches=val_batches, collate=collate, embed=embed, device=device)


def measure_embedder(model, *, evaluate=None, subjects: dict | None = None, max_tokens: int = 200,
                     forward_fn=None, encode_fn=None) -> dict:
    """One model measured (notebook 02_sba): ``eval`` = ``evaluate(encode_fn)`` (None without ``evaluate``),
    ``geo`` / ``counts`` = geometry and routing over ``subjects`` (None without), ``similarity`` per MoE layer."""
    model.eval()
    ev = None if evaluate is None else evaluate(encode_fn or st_encode_fn(model))
    geo = counts = None
    if subjects:
        geo, counts = collect_geometry(model, forward_fn or st_forward_fn(model), subjects, max_tokens)
    return dict(eval=ev, geo=geo, counts=counts, similarity=moe_specialisation(model))


def phase_c_run(template, checkpoint: dict, *, aggregation: str, seed: int, steps: int, train_pairs, val_pairs,
                evaluate=None, subjects=None, max_tokens: int = 200, **kw) -> dict:
    """:func:`finetune_checkpoint` then :func:`measure_embedder`: dict(history, val, flattened, eval, geo, counts,
    similarity, wall_s) as :func:`finetune_and_measure` returns (the notebook memoises one per aggregation × seed)."""
    res = finetune_checkpoint(template, checkpoint, aggregation=aggregation, seed=seed, steps=steps,
                              train_pairs=train_pairs, val_pairs=val_pairs, **kw)
    val = res.eval_history
    out = measure_embedder(res.model, evaluate=evaluate, subjects=subjects, max_tokens=max_tokens)
    return dict(history=res.history, val=val, flattened=_flattened(val["val_mnrl"].to_numpy()), wall_s=res.wall_s,
                **out)


def swap_run(template, checkpoint: dict, *, aggregation: str, val_pairs=None, evaluate=None, subjects=None,
             max_tokens: int = 200, batch_size: int = 32, val_batches: int = 4) -> dict:
    """:func:`swap_aggregation` then :func:`measure_embedder`, plus the validation MNRL (``val_mnrl``) when
    ``val_pairs`` are given."""
    m = swap_aggregation(template, checkpoint, aggregation)
    out = measure_embedder(m, evaluate=evaluate, subjects=subjects, max_tokens=max_tokens)
    out["val_mnrl"] = (validation_mnrl(m, val_pairs, batch_size, val_batches) if val_pairs else float("nan"))
    return out


def _flattened(losses) -> tuple:
    """:func:`moelab.train.flattened` of a validation-loss series, (False, nan) when it is too short to judge."""
    try:
        return flattened(losses)
    except ValueError:
        return (False, float("nan"))


# ----------------------------------------------------------------------------------------------------------------------
# the earlier runs: renormalised stand-in (drop ablation) and the paper profile on nomic
# ----------------------------------------------------------------------------------------------------------------------
def finetune_and_measure(*, aggregation: str, seed: int, train_pairs, val_pairs, subjects: dict, steps: int,
                         batch_size: int, lr: float, eval_every: int, renormalize: bool = True, init: str = "drop",
                         drop_ratio: float = 0.5, max_tokens: int = 200, evaluate=None, calib_texts=None,
                         aux_coef: float = 0.01, val_batches: int = 4) -> dict:
    """Build the renormalised MoE MiniLM with ``aggregation``, fine-tune it (MNRL) and measure it (SBA paper §V, §VI;
    nb 02_sba; the "experts half random" ablation with ``init="drop"``).

    Returns dict(history, val (validation loss per eval), flattened (bool, relative fall of the validation loss,
    :func:`moelab.train.flattened`), eval (``evaluate(encode_fn)`` table or None), geo / counts (geometry and
    routing over ``subjects`` after training), similarity (expert similarity per layer), wall_s).
    """
    st = build_moe_minilm(renormalize=renormalize, init=init, aggregation=aggregation, seed=seed,
                          drop_ratio=drop_ratio, calib_texts=calib_texts)
    res = finetune_embedder(st, train_pairs, val_pairs, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                            eval_every=eval_every, aux_coef=aux_coef, val_batches=val_batches)
    st = res.model.cpu().eval()
    val = res.eval_history
    out = measure_embedder(st, evaluate=evaluate, subjects=subjects, max_tokens=max_tokens)
    return dict(history=res.history, val=val, flattened=_flattened(val["val_mnrl"].to_numpy()), wall_s=res.wall_s,
                **out)


def drop_ablation_init(*, aggregations, seed: int = 0, drop_ratio: float = 0.5, evaluate=None, subjects=None,
                       max_tokens: int = 200, base=None) -> dict:
    """The "experts half random" ablation before any training (notebook 02_sba, full profile): one
    renormalised Drop-Upcycled MiniLM (:func:`moelab.sba.build_moe_minilm`, ``init="drop"``; a copy of ``base``
    instead of MiniLM when given) measured under each of ``aggregations`` (:func:`measure_embedder`). With half of
    every expert re-drawn, the ranking of the aggregations is set here, before fine-tuning. Returns {aggregation:
    measure dict}."""
    if not aggregations:
        raise ValueError("drop_ablation_init needs at least one aggregation")
    st = build_moe_minilm(renormalize=True, init="drop", seed=seed, drop_ratio=drop_ratio, base=base)
    return {agg: measure_embedder(set_aggregation(st, agg), evaluate=evaluate, subjects=subjects,
                                  max_tokens=max_tokens) for agg in aggregations}


def init_geometry(*, subjects: dict, renormalize: bool, init: str, seed: int = 0, drop_ratio: float = 0.5,
                  max_tokens: int = 200, calib_texts=None) -> dict:
    """Geometry, routing and expert similarity of a freshly upcycled renormalised-layout MoE MiniLM."""
    st = build_moe_minilm(renormalize=renormalize, init=init, seed=seed, drop_ratio=drop_ratio,
                          calib_texts=calib_texts)
    geo, counts = collect_geometry(st, st_forward_fn(st), subjects, max_tokens)
    return dict(geo=geo, counts=counts, similarity=moe_specialisation(st))


def evaluate_mteb_local_nomic(model, mteb_tasks, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, per-item scores) of :class:`moelab.sba.NomicEmbed` on the MTEB tasks from local copies
    (:func:`moelab.sba.items.evaluate_mteb_with_items`; document prefix on every text, as nomic's MTEB runs)."""
    return evaluate_mteb_with_items(lambda t: model.encode(t, kind="document").float().numpy(), mteb_tasks, seed=seed)


def _measure_nomic(m, subjects, max_tokens, mteb_tasks, seed, device) -> dict:
    """:func:`measure_embedder` of a nomic model placed for inference by :mod:`moelab.device` (CUDA in bf16 when
    present, else the CPU in fp32; the torch thread count stays the notebook's), with ``eval`` / ``items`` the MTEB
    tasks (None without ``mteb_tasks``)."""
    where = inference_placement(device)
    m = m.eval().to(device=where.device, dtype=where.dtype)
    out = measure_embedder(m, subjects=subjects, max_tokens=max_tokens, forward_fn=nomic_forward_fn(m))
    out["eval"], out["items"] = (None, None) if mteb_tasks is None else evaluate_mteb_local_nomic(m, mteb_tasks, seed)
    return out


def nomic_measure(model_path, *, aggregation: str = "linear", subjects: dict | None = None, max_tokens: int = 200,
                  mteb_tasks=None, seed: int = 0, device: str = "auto") -> dict:
    """Paper profile (SBA paper §III, §V-A; notebook 02_sba): pretrained nomic-embed-text-v2-moe from a local path
    with ``aggregation`` in place of the linear sum and no fine-tuning, measured as :func:`measure_embedder` (geometry
    over ``subjects``) with ``eval`` / ``items`` = the MTEB tasks from local copies and their per-item scores (None
    without ``mteb_tasks``). With "linear" this is the trained MoE the paper's figures describe (phase (b)'s place);
    otherwise the swap arm. ``device`` "auto": CUDA in bf16 when present (:func:`moelab.device.inference_placement`)."""
    return _measure_nomic(load_nomic(model_path, aggregation=aggregation), subjects, max_tokens, mteb_tasks, seed,
                          device)


def nomic_finetune_and_measure(*, model_path, aggregation: str, seed: int, train_triplets, val_triplets,
                               subjects: dict, steps: int, batch_size: int, lr: float, grad_accum: int = 1,
                               eval_every: int = 0, max_tokens: int = 200, mteb_tasks=None, device: str = "auto",
                               aux_coef: float = 0.0, val_batches: int = 4, warmup_frac: float = 0.1) -> dict:
    """Paper profile (SBA paper §V): nomic-embed-text-v2-moe from a local path with ``aggregation`` in place of the
    linear sum, fine-tuned with MNRL on all-nli triplets (query prefix on anchors, document prefix on the rest) for
    the paper's fixed schedule (``steps`` x ``batch_size`` x ``grad_accum``, warm-up then linear decay), evaluated on
    the three MTEB tasks from local copies; geometry over ``subjects`` after training. ``device`` "auto" trains on
    CUDA (bf16 autocast, :mod:`moelab.train`) when present and measures as :func:`nomic_measure`.

    Returns the keys of a stand-in phase-(c) run (:func:`moelab.sba.report.phase_c_table`): history, val (validation
    MNRL by step, step 0 before fine-tuning), val_init, steps, checkpoint_step (= steps: the paper keeps the last),
    stopped (False: a fixed schedule), improvement (nan), flattened, wall_s, and eval / items / geo / counts /
    similarity."""
    seed_everything(seed)
    m = load_nomic(model_path, aggregation=aggregation).to(resolve_device(device)[0])  # the trainer's device
    collate = PairCollate(lambda t: m.tokenize(t, "query"), lambda t: m.tokenize(t, "document"))
    val0 = validation_mnrl(m, val_triplets, batch_size, val_batches, collate, embed=nomic_embed)
    res = finetune_embedder(m, train_triplets, val_triplets, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                            eval_every=eval_every, aux_coef=aux_coef, collate=collate, embed=nomic_embed,
                            grad_accum=grad_accum, device=device, val_batches=val_batches, warmup_frac=warmup_frac)
    val = pd.concat([pd.DataFrame([dict(step=0, val_mnrl=val0)]), res.eval_history], ignore_index=True)
    out = _measure_nomic(res.model, subjects, max_tokens, mteb_tasks, seed, device)
    return dict(history=res.history, val=val, val_init=val0, steps=steps, checkpoint_step=steps, stopped=False,
                improvement=float("nan"), flattened=_flattened(val["val_mnrl"].to_numpy()), wall_s=res.wall_s, **out)


# ----------------------------------------------------------------------------------------------------------------------
# phases (b) and (c) as a script (python -m moelab.launch moelab.sba:run_from_config --config cfg.json)
# ----------------------------------------------------------------------------------------------------------------------
PHASE_B_FILE = "phase_b.pt"
_PHASE_B_KEYS = ("max_steps", "eval_every", "window", "min_rel_improvement", "batch_size", "lr", "warmup_frac",
                 "aux_coef", "val_batches", "keep", "device")
_PHASE_C_KEYS = ("steps", "batch_size", "lr", "eval_every", "warmup_frac", "aux_coef", "val_batches", "device")


def run_from_config(config: dict) -> dict:
    """Notebook 02's phases (b) and (c) on the nomic-layout MiniLM stand-in as a script:
    ``python -m moelab.launch moelab.sba:run_from_config --config cfg.json``.

    Keys: ``phase`` ("b" or "c"), ``out_dir`` (phase b writes ``phase_b.pt`` there, phase c reads it), ``profile``
    (the suite's pairs: smoke / default / full), ``seed``, ``max_pair_tokens`` (32: only the pairs whose two sides
    fit in that many MiniLM tokens train and validate, as in the notebook). Phase b: ``calib_texts`` (number of
    training anchors that
    calibrate the cluster-aware init and the compensation; 256), ``compensate`` (true), and
    :func:`train_until_plateau`'s ``max_steps``, ``eval_every``, ``window``, ``min_rel_improvement``, ``batch_size``,
    ``lr``, ``warmup_frac``, ``aux_coef``, ``val_batches``, ``keep``, ``device``. Phase c: ``aggregation`` and
    :func:`finetune_checkpoint`'s ``steps``, ``batch_size``, ``lr``, ``eval_every``, ``warmup_frac``, ``aux_coef``,
    ``val_batches``, ``device``; ``benchmarks`` (a suite profile, or null for none; scored by
    :func:`moelab.sba.evaluate_benchmarks`). Returns a JSON-able summary."""
    if not isinstance(config, dict) or config.get("phase") not in ("b", "c") or not config.get("out_dir"):
        raise ValueError(f"config needs 'phase' ('b' or 'c') and 'out_dir', got {config!r}")
    cfg = dict(config)
    phase, out = cfg.pop("phase"), Path(cfg.pop("out_dir"))
    profile, seed = cfg.pop("profile", "smoke"), int(cfg.pop("seed", 0))
    n_tok = int(cfg.pop("max_pair_tokens", 32))
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    pairs = suite_embed.pairs(profile)
    data = {k: short_pairs(pairs[k], lambda t: tokenizer(t, truncation=True, max_length=n_tok + 1)["input_ids"], n_tok)
            for k in ("train", "validation")}
    if phase == "b":
        n_calib, compensate = int(cfg.pop("calib_texts", 256)), bool(cfg.pop("compensate", True))
        _no_unknown(cfg, _PHASE_B_KEYS, "b")
        calib = [a for a, _ in data["train"][:n_calib]]
        model = build_nomic_layout_minilm(init="cluster", calib_texts=calib, seed=seed, compensate=compensate)
        res = train_until_plateau(model, data["train"], data["validation"], seed=seed, **cfg)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(profile=profile, seed=seed, max_pair_tokens=n_tok, calib_texts=n_calib, compensate=compensate,
                    steps=res["steps"], checkpoint_step=res["checkpoint_step"], stopped=res["stopped"],
                    rule=res["rule"])
        torch.save(dict(checkpoint=res["checkpoint"], meta=meta), out / PHASE_B_FILE)
        return dict(meta, improvement=res["improvement"], val=res["val"].to_dict("records"),
                    checkpoint=str(out / PHASE_B_FILE))
    aggregation = check_aggregation(cfg.pop("aggregation", "linear"))
    bench = cfg.pop("benchmarks", None)
    _no_unknown(cfg, _PHASE_C_KEYS, "c")
    f = out / PHASE_B_FILE
    if not f.is_file():
        raise ValueError(f"{f} does not exist: run phase 'b' with out_dir={str(out)!r} first")
    saved = torch.load(f, weights_only=False)
    template = build_nomic_layout_minilm(init="sparse", seed=seed)  # the architecture; weights from the checkpoint
    steps = int(cfg.pop("steps", 100))
    res = finetune_checkpoint(template, saved["checkpoint"], aggregation=aggregation, seed=seed, steps=steps,
                              train_pairs=data["train"], val_pairs=data["validation"], **cfg)
    ev = None
    if bench:
        benches = suite_embed.benchmarks(bench)
        ev = evaluate_benchmarks(st_encode_fn(res.model.eval()), benches, seed=seed).to_dict("records")
    return dict(phase_b=saved["meta"], aggregation=aggregation, seed=seed, steps=steps,
                val=res.eval_history.to_dict("records"), eval=ev)


def _no_unknown(cfg: dict, known: tuple, phase: str) -> None:
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        raise ValueError(f"unknown phase-{phase} config keys {unknown}; known: {sorted(known)}")


# ----------------------------------------------------------------------------------------------------------------------
# the notebook's steps: one call each, every run its own cache entry (a stopped run resumes run by run), and the
# choice between the MiniLM stand-in and nomic-embed-text-v2-moe itself (the paper profile)
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What every step of notebook 02 reads: the profile ``cfg``, the notebook's ``seed`` (benchmarks, subjects),
    the data (training / validation pairs; held-out texts, probe texts), the benchmarks and the subject prompts; for
    the paper profile the paths of nomic, all-nli and MTEB. ``conf`` identifies the data in every cache key (for the
    paper profile the content identity of each user path, :func:`moelab.cache.path_identity`)."""
    cfg: SbaProfile
    seed: int
    train_pairs: list
    val_pairs: list
    subjects: dict
    conf: dict
    dense: object = None
    heldout: list = field(default_factory=list)
    probe_texts: list = field(default_factory=list)
    benches: dict = field(default_factory=dict)
    model_path: str | None = None
    mteb_tasks: dict | None = None
    _built: dict = field(default_factory=dict, repr=False, compare=False)  # what the steps share (below), built once

    def evaluate(self, encode_fn):
        """(scores, per-item scores) of ``encode_fn`` on this setup's benchmarks (:mod:`moelab.sba.items`)."""
        return evaluate_with_items(encode_fn, self.benches, seed=self.seed)

    def heldout_dense_emb(self):
        """The dense model's embeddings of the held-out texts (``st_encode_fn(dense)(heldout)``), the reference of
        every phase-(b) seed's init damage: encoded once per setup."""
        if "heldout_emb" not in self._built:
            was = self.dense.training  # encode() switches to eval mode: leave the dense model as it was
            self._built["heldout_emb"] = st_encode_fn(self.dense)(list(self.heldout))
            self.dense.train(was)
        return self._built["heldout_emb"]

    def layout_template(self):
        """The nomic-layout MoE of ``dense`` that phase (c) and the swap arm load a phase-(b) checkpoint into
        (:func:`load_checkpoint`, which copies it and replaces every weight, so its initialisation does not matter):
        built once per setup instead of once per run."""
        if "template" not in self._built:
            self._built["template"] = build_nomic_layout_moe(self.dense, init="sparse", seed=self.seed)
        return self._built["template"]


def setup(cfg: SbaProfile, seed: int = 0, model_path=None, nli_path=None, mteb_path=None) -> Setup:
    """The data of notebook 02 for profile ``cfg`` (SBA paper §V-C): for the stand-in, the suite's (anchor,
    positive) pairs of ``cfg.bench_profile`` whose two sides fit in ``cfg.max_pair_tokens`` MiniLM tokens, held-out
    test texts (init damage), validation texts not used by the validation loss (router agreement), the suite's
    benchmarks; for the paper profile (``cfg.stand_in`` False) all-nli triplets from ``nli_path`` and the MTEB tasks
    from ``mteb_path``, nomic from ``model_path`` (or env MOELAB_NOMIC_PATH), each checked first (a missing path:
    ``MissingAsset``; a wrong layout or field: :class:`moelab.inputs.InputFormatError`), before anything is computed.
    Subjects: WordNet prompts."""
    if not cfg.stand_in:
        path = model_path or os.environ.get("MOELAB_NOMIC_PATH")
        check_nomic_folder(path)
        train, val = (load_allnli_triplets(nli_path, "train", limit=cfg.n_triplets),
                      load_allnli_triplets(nli_path, "dev", limit=N_VAL_TRIPLETS))
        mteb = load_mteb_local(mteb_path)
        conf = dict(model=path_identity(path), nli=path_identity(find_allnli_triplet_dir(nli_path)),
                    mteb={t: path_identity(Path(mteb_path) / t) for t in MTEB_TASKS}, n_val=len(val))
        return Setup(cfg, seed, train, val, _subjects(cfg, seed), conf, model_path=path, mteb_tasks=mteb)
    subjects = _subjects(cfg, seed)
    dense = load_minilm()
    dense.max_seq_length = 128
    pairs = suite_embed.pairs(cfg.bench_profile)
    n = cfg.max_pair_tokens
    tok = lambda t: dense.tokenizer(t, truncation=True, max_length=n + 1)["input_ids"]  # noqa: E731
    train, val = short_pairs(pairs["train"], tok, n), short_pairs(pairs["validation"], tok, n)
    n_val = cfg.phase_b.val_batches * cfg.phase_b.val_batch_size
    probe = [t for p in val[n_val:n_val + cfg.n_probe // 2] for t in p] or [t for p in val[:cfg.n_probe // 2] for t in p]
    benches = suite_embed.benchmarks(cfg.bench_profile, dict(cfg.bench_sizes))
    benches = {k: benches[k] for k in (cfg.benchmarks or benches)}
    conf = dict(profile=cfg.bench_profile, sizes=dict(cfg.bench_sizes), names=list(benches), n_tok=n,
                subjects=[cfg.n_subjects, cfg.per_subject, cfg.max_tokens], seed=seed)
    return Setup(cfg, seed, train, val, subjects, conf, dense=dense,
                 heldout=[t for p in pairs["test"][:cfg.n_heldout // 2] for t in p], probe_texts=probe, benches=benches)


N_VAL_TRIPLETS = 256  # all-nli dev triplets read for the paper profile's validation MNRL


def _subjects(cfg: SbaProfile, seed: int) -> dict:
    return memo("wordnet_subjects", dict(n=cfg.n_subjects, per=cfg.per_subject, seed=seed),
                lambda: wordnet_subject_texts(cfg.n_subjects, cfg.per_subject, seed=seed))


def separation(s: Setup) -> pd.DataFrame | None:
    """Can the benchmarks separate two encoders? MiniLM, a bag-of-words and a random encoder scored on the very sets
    scored later ([encoder, benchmark, metric, score, ci_low, ci_high, ...]; read by
    :func:`moelab.sba.report.separation_table`). None for the paper profile."""
    if not s.cfg.stand_in:
        return None
    return memo("sba_separation", dict(v=1, bench=s.conf), lambda: pd.concat(
        [evaluate_benchmarks(fn, s.benches, seed=s.seed).assign(encoder=name) for name, fn in (
            ("all-MiniLM-L6-v2", st_encode_fn(s.dense)), ("bag-of-words (tf-idf)", suite_embed.bow_encoder(s.benches)),
            ("random", suite_embed.random_encoder()))], ignore_index=True))


def _measure(model, s: Setup, evaluate: bool = True) -> dict:
    """:func:`measure_embedder` plus per-item scores: dict(eval, items, geo, counts, similarity)."""
    out = measure_embedder(model, subjects=s.subjects, max_tokens=s.cfg.max_tokens)
    out["eval"], out["items"] = s.evaluate(st_encode_fn(model)) if evaluate else (None, None)
    return out


def _phase_b_conf(s: Setup, seed: int) -> dict:
    c = s.cfg
    return dict(v=2, data=s.conf, seed=seed, n_calib=c.n_calib, n_heldout=c.n_heldout, n_probe=c.n_probe,
                damage_benchmarks=c.damage_benchmarks, **asdict(c.phase_b))


def _phase_b_compute(s: Setup, seed: int) -> dict:
    c, b = s.cfg, s.cfg.phase_b
    rng = np.random.default_rng([seed, 2])  # the seed draws the calibration texts of the cluster-aware init
    calib = [s.train_pairs[i][0] for i in sorted(rng.choice(len(s.train_pairs), c.n_calib, replace=False))]
    damage = init_damage(s.dense, calib, s.heldout, seed=seed, base_emb=s.heldout_dense_emb(),
                         evaluate=(lambda fn: s.evaluate(fn)[0]) if c.damage_benchmarks else None)
    start = damage["models"]["cluster (nomic layout, compensated)"]
    untrained = copy.deepcopy(start)
    at_init = _measure(start, s, evaluate=False)
    probe = RegimeProbe(start, s.probe_texts, s.subjects, c.max_tokens)
    vb = dict(batch_size=b.val_batch_size, val_batches=b.val_batches)
    # the init reading: its subject routing is the init geometry's, its probe routing the probe's own reference
    init = dict(step=0, val_mnrl=validation_mnrl(start, s.val_pairs, **vb),
                **probe(start, counts=at_init["counts"], routed=probe.init_idx))
    res = train_until_plateau(start, s.train_pairs, s.val_pairs, max_steps=b.steps, eval_every=b.eval_every,
                              batch_size=b.batch_size, lr=b.lr, moe_lr=b.moe_lr, seed=seed, warmup_frac=b.warmup_frac,
                              val_batches=b.val_batches, val_batch_size=b.val_batch_size, keep="last",
                              stop_on_plateau=False, probe=probe, device="cpu")
    trained = res["model"].eval()
    end = res["val"].iloc[-1].to_dict()
    readings = pd.DataFrame([dict(init, stage="init"), dict(end, stage="end")]).assign(seed=seed)
    return dict(damage=damage["table"], damage_scores=damage["scores"], factors=damage["factors"], init=at_init,
                after=_measure(trained, s), movement=router_movement(untrained, trained, [
                    t for v in s.subjects.values() for t in v]), readings=readings,
                trajectory=pd.concat([pd.DataFrame([init]), res["val"]], ignore_index=True).assign(seed=seed),
                **{k: res[k] for k in ("checkpoint", "steps", "history", "wall_s", "stopped", "improvement")})


def phase_b(s: Setup, seed: int) -> dict:
    """Phases (a) and (b) for one ``seed`` (its own cache entry): the cluster-aware init calibrated on a seeded draw
    of training anchors, compensated (phase a; its damage against dense MiniLM), measured, then trained with linear
    aggregation for the profile's schedule with the regime probe at every evaluation; the end measured (benchmarks
    with per-item scores, geometry, router movement). Paper profile: nomic itself, measured (no init)."""
    if not s.cfg.stand_in:
        return dict(after=_nomic_measure_memo(s, "linear"))
    return memo("sba_phase_b", _phase_b_conf(s, seed), lambda: _phase_b_compute(s, seed))


def _nomic_measure_memo(s: Setup, agg: str) -> dict:
    """Paper profile: :func:`nomic_measure` of nomic with ``agg`` (no fine-tuning), its own cache entry keyed by the
    content of MODEL_PATH and MTEB_PATH (:func:`moelab.cache.path_identity`)."""
    c = s.cfg
    return memo("sba_nomic_measure", dict(v=3, model=s.conf["model"], mteb=s.conf["mteb"], agg=agg, seed=s.seed,
                                          n=c.n_subjects, per=c.per_subject, max_tokens=c.max_tokens),
                lambda: nomic_measure(s.model_path, aggregation=agg, subjects=s.subjects, max_tokens=c.max_tokens,
                                      mteb_tasks=s.mteb_tasks, seed=s.seed, device=c.device))


def phase_b_runs(s: Setup) -> dict:
    """{seed: :func:`phase_b`} for every seed of the profile (the paper profile: one, nomic)."""
    return {seed: phase_b(s, seed) for seed in (s.cfg.seeds if s.cfg.stand_in else s.cfg.seeds[:1])}


def _phase_b_end_val(s: Setup, pb: dict, agg: str, val_batches: int) -> float | None:
    """Phase (b)'s validation MNRL at its checkpoint (its last evaluation) when phase (c)'s starting loss is that very
    measurement: linear aggregation (phase (b)'s), the same validation batches, the checkpoint at the last step
    (``keep="last"``). None otherwise."""
    end = pb["trajectory"].iloc[-1]
    if agg != "linear" or val_batches != s.cfg.phase_b.val_batches or int(end["step"]) != int(pb["steps"]):
        return None
    return float(end["val_mnrl"])


def _phase_c_compute(s: Setup, pb: dict, agg: str, seed: int) -> dict:
    c = s.cfg.phase_c
    m = load_checkpoint(s.layout_template(), pb["checkpoint"], agg)  # the layout; weights from the checkpoint
    vb = dict(batch_size=s.cfg.phase_b.val_batch_size, val_batches=c.val_batches)
    val0 = _phase_b_end_val(s, pb, agg, c.val_batches)  # linear: measured at phase (b)'s last evaluation
    val0 = validation_mnrl(m, s.val_pairs, **vb) if val0 is None else val0
    res = train_until_plateau(m, s.train_pairs, s.val_pairs, max_steps=c.max_steps, eval_every=c.eval_every,
                              window=c.window, min_rel_improvement=c.min_rel_improvement, batch_size=c.batch_size,
                              lr=c.lr, seed=seed, warmup_frac=c.warmup_frac, val_batches=c.val_batches,
                              val_batch_size=vb["batch_size"], keep="best", aggregation=agg, device="cpu")
    model = res["model"]
    model.load_state_dict(res["checkpoint"])
    val = pd.concat([pd.DataFrame([dict(step=0, val_mnrl=val0)]), res["val"]], ignore_index=True)
    keys = ("steps", "checkpoint_step", "stopped", "improvement", "history", "wall_s")
    return dict(val=val, val_init=val0, **{k: res[k] for k in keys}, **_measure(model.eval(), s))


def phase_c(s: Setup, pb: dict, agg: str, seed: int) -> dict:
    """Phase (c) for one phase-(b) seed and aggregation (its own cache entry): from that seed's checkpoint, fine-tune
    with ``agg`` (data order by ``seed``) until the validation loss stops falling (:func:`plateau_reached`) or the
    step budget, keep the best validation checkpoint, measure it (benchmarks with per-item scores, geometry). Paper
    profile: nomic fine-tuned on all-nli with ``agg`` (the paper's schedule)."""
    c = s.cfg.phase_c
    if not s.cfg.stand_in:
        return memo("sba_nomic_run", dict(v=3, agg=agg, seed=seed, bench_seed=s.seed, **s.conf, n=s.cfg.n_subjects,
                                          per=s.cfg.per_subject, max_tokens=s.cfg.max_tokens,
                                          n_triplets=s.cfg.n_triplets, **asdict(c)),
                    lambda: nomic_finetune_and_measure(
                        model_path=s.model_path, aggregation=agg, seed=seed, train_triplets=s.train_pairs,
                        val_triplets=s.val_pairs, subjects=s.subjects, steps=c.max_steps, batch_size=c.batch_size,
                        lr=c.lr, grad_accum=c.grad_accum, eval_every=c.eval_every, max_tokens=s.cfg.max_tokens,
                        mteb_tasks=s.mteb_tasks, device=s.cfg.device, val_batches=c.val_batches,
                        warmup_frac=c.warmup_frac))
    return memo("sba_phase_c", dict(v=2, b=_phase_b_conf(s, seed), agg=agg, **asdict(c)),
                lambda: _phase_c_compute(s, pb, agg, seed))


def phase_c_runs(s: Setup, pbs: dict) -> dict:
    """{(aggregation, seed): :func:`phase_c`} for every phase-(b) seed and aggregation of the profile."""
    seeds = s.cfg.seeds if s.cfg.stand_in else s.cfg.seeds
    base = next(iter(pbs.values()))
    return {(a, seed): phase_c(s, pbs.get(seed, base), a, seed) for a in s.cfg.aggregations for seed in seeds}


def swap_runs(s: Setup, pbs: dict) -> dict:
    """{(aggregation, seed): measure dict} of every phase-(b) checkpoint with each of the profile's ``swaps`` in
    place of linear aggregation and no fine-tuning (paper §V-A's change alone); the linear arm is phase (b)'s end."""
    out = {("linear", seed): pb["after"] for seed, pb in pbs.items()}
    for a in s.cfg.swaps:
        for seed, pb in pbs.items():
            if not s.cfg.stand_in:
                out[(a, seed)] = _nomic_measure_memo(s, a)
                continue
            out[(a, seed)] = memo("sba_swap", dict(v=2, b=_phase_b_conf(s, seed), agg=a), lambda a=a, pb=pb, seed=seed:
                                  _measure(swap_aggregation(s.layout_template(), pb["checkpoint"], a), s))
    return out


def drop_ablation(s: Setup) -> dict | None:
    """The "experts half random" ablation (full profile): dict(init: {aggregation: measure dict}, runs: {(aggregation,
    seed): run dict}) or None when the profile has none."""
    d = s.cfg.drop
    if d is None or not s.cfg.stand_in:
        return None
    dc = asdict(d)
    evaluate = lambda fn: s.evaluate(fn)[0]  # noqa: E731
    init = memo("sba_drop_init", dict(v=2, bench=s.conf, **dc), lambda: drop_ablation_init(
        aggregations=d.aggregations, seed=s.seed, drop_ratio=d.drop_ratio, evaluate=evaluate, subjects=s.subjects,
        max_tokens=s.cfg.max_tokens))
    runs = {(a, seed): memo("sba_drop_run", dict(v=2, bench=s.conf, agg=a, seed=seed, **dc),
                            lambda a=a, seed=seed: finetune_and_measure(
                                aggregation=a, seed=seed, train_pairs=s.train_pairs, val_pairs=s.val_pairs,
                                subjects=s.subjects, steps=d.steps, batch_size=d.batch_size, lr=d.lr,
                                eval_every=d.eval_every, drop_ratio=d.drop_ratio, max_tokens=s.cfg.max_tokens,
                                evaluate=evaluate, val_batches=d.val_batches))
            for a in d.aggregations for seed in d.seeds}
    return dict(init=init, runs=runs)
