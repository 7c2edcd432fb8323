"""MoCE's runs: training the variants on the cached trunk, evaluating them with per-sequence cluster ids, the
configuration as a script (Eo et al. §4.1, Tables 1, 3, 4, Fig. 4; notebook ``notebooks/01_moce.py``).

Each notebook cell is one call here: :func:`plan_runs` / :func:`train_runs` (``moelab.train.train`` on cached hidden
states, results memoised with ``moelab.cache.memo``), :func:`evaluate_runs` (held-out answer likelihood and lm-eval
tasks through the one scorer, ``moelab.suite.scorer``, batched with per-row cluster ids), and
:func:`run_from_config` (``python -m moelab.launch moelab.moce:run_from_config --config cfg.json``).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from moelab import assets, cache, progress
from moelab import train as mtrain
from moelab.moce.clustering import (ClusterModel, cluster_predictor, context_instruction, elbow_curve, embed_texts,
                                    find_knee, fit_clusters, instruction_texts)
from moelab.moce.data import (btx_domain_splits, build_cache, collate, example_inputs, load_paper_mix, load_paper_model,
                              paper_encoder_path, prompt_text, subsample, with_groups)
from moelab.moce.method import (BTX_DOMAINS, MoCESpec, aux_loss, btx_branch_spec, btx_merge_states, group_context,
                                install, moce_layers, set_group_ids, top_layer_ids, trainable_state, uninstall,
                                variant_spec, count_parameters)
from moelab.moce.report import criterion_table, summarize_scores
from moelab.moce.trunk import TopStack, trunk_memo
from moelab.suite import instruct, lmeval, scorecard, scorer

__all__ = ["make_loss_fn", "per_item_nll", "validation_trend", "validation_flattened", "EarlyStopping",
           "STOP_REASONS", "FLAT_MIN_EVALS", "VariantResult", "train_variant", "load_variant", "train_btx",
           "plan_runs", "run_identity", "train_runs", "RequestHook", "make_request_hook", "lm_tasks_for", "in_run_scorecard",
           "evaluate_runs", "RUN_DEFAULTS", "run_from_config", "load_instruction_mix", "split_items", "moce_encoder",
           "load_backbone", "cache_trunk", "cluster_groups", "gemma_experiment"]


def make_loss_fn(spec: MoCESpec):
    """``loss_fn(model, batch)`` for ``moelab.train.train``: answer-token CE + balancing coef · Σ_layers aux (§4.1)."""

    def loss_fn(stack, batch):
        raw = stack.module if hasattr(stack, "module") else stack
        with group_context(raw.model, batch["group_ids"], batch["mask"]):
            nll = stack(batch["h"], batch["labels"])
            aux = aux_loss(raw.model)
        n = (batch["labels"][:, 1:] != -100).sum().clamp_min(1)
        ce = nll.sum() / n
        loss = ce + spec.balance_coef * aux
        # task_loss: the answer-token CE alone, whose router gradient the trainer logs
        return loss, {"ce": float(ce.detach()), "aux": float(aux.detach()) if torch.is_tensor(aux) else float(aux),
                      "task_loss": ce}

    return loss_fn


def per_item_nll(stack: TopStack, examples: list[dict], batch_size: int = 16) -> np.ndarray:
    """Mean answer-token NLL (nats/token) per example, cluster id set per sequence   [n].

    Scored by ``moelab.suite.scorer`` on the cached trunk states: the answer is the labelled tail of each
    example (position t predicts ``labels[t + 1]``), batches by length, the LM head only on answer positions."""
    reqs = []
    for i, e in enumerate(examples):
        lab = e["labels"]
        keep = (lab != -100).nonzero().view(-1)
        if len(keep) == 0 or int(keep[0]) == 0 or len(keep) != len(lab) - int(keep[0]):
            raise ValueError(f"example {i}: labels must be -100 on a non-empty prompt followed by the answer tokens")
        reqs.append((example_inputs(e), lab[int(keep[0]):].tolist()))
    groups = [int(e.get("group", 0)) for e in examples]
    res = scorer.loglikelihood_embeddings(
        stack, reqs, batch_size=batch_size,
        batch_context=lambda rows, mask: group_context(stack.model, [groups[r] for r in rows], mask))
    return np.array([-lp / len(t) for (lp, _), (_, t) in zip(res, reqs)])


def validation_trend(losses, window_frac: float = 0.2, tol: float = 0.02) -> tuple[str, float]:
    """Where a validation-loss curve stands, by the suite's criterion (``moelab.train.flattened``: relative fall of the
    smoothed loss over the last ``window_frac`` of the evaluations) with a rising loss told apart:

    - ``"falling"``: relative fall >= ``tol`` (still improving; train longer);
    - ``"flattened"``: 0 <= relative fall < ``tol`` (converged by the project's criterion);
    - ``"rising"``: relative fall < 0 (the loss went *up*: over-fitting or instability, never "flattened");
    - ``"too short"``: fewer than 4 evaluations (NaN fall).
    Returns ``(trend, relative_fall)``.
    """
    x = np.asarray(losses, dtype=float).ravel()
    if len(x) < 4:
        return "too short", float("nan")
    _, fall = mtrain.flattened(x, window_frac=window_frac, tol=tol)
    if fall < 0:
        return "rising", fall
    return ("flattened" if fall < tol else "falling"), fall


def validation_flattened(losses, window_frac: float = 0.2, tol: float = 0.02) -> tuple[bool, float]:
    """``moelab.train.flattened`` for a validation loss, except that a rising loss is never "flattened":
    ``(trend == "flattened", relative_fall)`` of :func:`validation_trend`."""
    trend, fall = validation_trend(losses, window_frac, tol)
    return trend == "flattened", fall


STOP_REASONS = ("flattened", "rising", "patience", "budget")
# The flattened criterion stops training only on a curve of at least this many evaluations: its last-20 % window then
# spans two or more of them (on 4 evaluations it compares two single noisy values; seen stopping a run after 24 steps).
FLAT_MIN_EVALS = 8


@dataclass
class EarlyStopping:
    """Early stopping on the validation loss that keeps the best checkpoint.

    :meth:`observe` is called after every evaluation with the step, the validation loss and the model: a loss below
    every earlier one makes the model's trainable tensors (:func:`trainable_state`) the best checkpoint and resets the
    count of evaluations since the best; :attr:`exhausted` is true once ``patience`` evaluations in a row brought no new
    minimum (``patience=None``: never); :meth:`restore` loads the best checkpoint back into the model. A tie does not
    replace the earlier best (the earlier, shorter-trained checkpoint is kept).
    """

    patience: int | None = None
    best_loss: float = math.inf
    best_step: int = 0
    best_state: dict | None = field(default=None, repr=False)
    since_best: int = 0
    evaluations: int = 0

    def __post_init__(self):
        if self.patience is not None and (isinstance(self.patience, bool) or not isinstance(self.patience, int)
                                          or self.patience < 1):
            raise ValueError(f"patience must be a positive number of evaluations or None, got {self.patience!r}")

    def observe(self, step: int, loss: float, model) -> bool:
        """Record one evaluation; returns whether it is the new best (its state is then copied)."""
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError(f"validation loss at step {step} is {loss}: training diverged (lower the learning rate)")
        self.evaluations += 1
        if loss < self.best_loss:
            self.best_loss, self.best_step, self.since_best = loss, int(step), 0
            self.best_state = trainable_state(model)
            return True
        self.since_best += 1
        return False

    @property
    def exhausted(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    def restore(self, model) -> None:
        """Load the best checkpoint into ``model`` (the layers of the same spec must be installed)."""
        if self.best_state is None:
            raise ValueError("no evaluation was observed: nothing to restore (train with eval_every > 0)")
        _load_state(model, self.best_state, "best checkpoint")


@dataclass
class VariantResult:
    """A trained variant: ``state`` (trainable tensors of the returned checkpoint: the best validation loss when
    training restored it), ``history`` (per step), ``eval_history`` (val loss), ``flat`` / ``rel_fall`` / ``trend``
    (:func:`validation_trend` of the validation loss), ``params``, ``wall_s``, ``steps`` (trained), ``best_step`` /
    ``best_val_loss`` (the best evaluation) and ``stop_reason`` (one of :data:`STOP_REASONS`)."""

    spec: MoCESpec
    seed: int
    state: dict
    history: object
    eval_history: object
    flat: bool
    rel_fall: float
    params: dict
    wall_s: float
    steps: int
    branches: dict | None = None  # BTX: per-domain branch runs (steps, wall_s, params, val_loss_last, ...)
    trend: str = ""               # "falling" | "flattened" | "rising" | "too short" (validation_trend)
    best_step: int = 0
    best_val_loss: float = float("nan")
    stop_reason: str = ""
    restored_best: bool = False

    @property
    def converged(self) -> bool:
        """The validation loss stopped improving before the step budget ran out (flattened, rose past its minimum,
        or ``patience`` evaluations without a new minimum); ``budget``: it was still improving."""
        return self.stop_reason in ("flattened", "rising", "patience")


def _carry_optimizer(state: dict):
    """``after_backward`` hook loading the previous round's AdamW state at the round's first step, so that rounds
    continue one optimiser (moments and step count) instead of restarting it."""

    def hook(step, model, optimizer):
        if step == 1:
            optimizer.load_state_dict(state)

    return hook


def train_variant(model, spec: MoCESpec, train_ex: list[dict], val_ex: list[dict], *, layers: Sequence[int],
                  steps: int, batch_size: int = 8, lr: float = 2e-4, seed: int = 0, eval_every: int = 10,
                  max_rounds: int = 1, warmup_frac: float = 0.05, init_state: dict | None = None,
                  train_experts: bool = True, device: str = "auto", patience: int | None = None,
                  restore_best: bool = True) -> VariantResult:
    """Install ``spec`` in ``layers``, train only the adapters/routers with ``moelab.train.train`` (AdamW, lr 2e-4 as
    App. A) on cached hidden states, evaluating the validation loss every ``eval_every`` steps.

    Training runs in rounds of ``steps`` steps (up to ``max_rounds``); each later round continues the same AdamW
    optimiser (its moments and step count; warmup only in the first round, then a constant learning rate) on a new
    shuffle of the data. Early stopping on validation, checked after each round: the validation
    loss has flattened (:func:`validation_trend` over all evaluations so far, at least :data:`FLAT_MIN_EVALS` of them:
    a fall of less than 2 % over the last 20 %), or ``patience`` evaluations brought no new minimum
    (:class:`EarlyStopping`); without ``patience``, a rising loss stops too (with it, a rise stops training only once
    it has lasted ``patience`` evaluations). Otherwise the next round starts, and ``budget`` is recorded when
    ``max_rounds`` ran out.
    With ``restore_best`` the model (and the returned ``state``) is the checkpoint of the lowest validation loss.
    ``init_state`` (a :func:`trainable_state`-style dict) overwrites the fresh layers' weights before training
    (BTX's merged experts); ``train_experts=False`` freezes the adapters so only the routers train; ``device``: the
    trainer's device (``moelab.train.TrainConfig``: "auto" = the GPU with bf16 autocast when CUDA is available, else
    the CPU).
    Returns a :class:`VariantResult` (the model keeps the trained layers installed).
    """
    if not train_ex or not val_ex:
        raise ValueError(f"train_variant needs training and validation examples, got {len(train_ex)} and {len(val_ex)}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be a positive int, got {max_rounds!r}")
    if spec.num_groups > 1:
        used = {e["group"] for e in train_ex}
        missing = sorted(set(range(spec.num_groups)) - used)
        if missing:
            raise ValueError(f"expert group(s) {missing} have no training sequence (empty cluster); "
                             f"choose fewer clusters than {spec.num_groups}")
    stopper = EarlyStopping(patience)
    install(model, spec, layers, seed=seed)
    if init_state is not None:
        _load_state(model, init_state, spec.name)
    if not train_experts:
        for m in moce_layers(model):
            for p in m.experts.parameters():
                p.requires_grad_(False)
    stack = TopStack(model, min(layers))
    params = count_parameters(model)
    loss_fn = make_loss_fn(spec)

    def eval_fn(st):
        return {"val_loss": float(per_item_nll(st, val_ex).mean())}

    hist, ev, wall, done, opt_state, stop = [], [], 0.0, 0, None, "budget"
    for rnd in range(max_rounds):
        g = torch.Generator().manual_seed(seed * 1000 + rnd)
        loader = DataLoader(train_ex, batch_size=batch_size, shuffle=True, collate_fn=collate, generator=g,
                            drop_last=len(train_ex) > batch_size)
        cfg = mtrain.TrainConfig(lr=lr, steps=steps, seed=seed + rnd, eval_every=eval_every, log_every=max(1, steps // 5),
                                 warmup_frac=warmup_frac if rnd == 0 else 0.0, device=device,
                                 desc=f"{spec.name}-s{seed}", max_grad_norm=1.0)
        hooks = {"on_eval": lambda step, m, done=done: stopper.observe(done + step, m["val_loss"], model)}
        if opt_state is not None:
            hooks["after_backward"] = _carry_optimizer(opt_state)
        res = mtrain.train(stack, loader, loss_fn=loss_fn, cfg=cfg, eval_fn=eval_fn, hooks=hooks)
        opt_state = copy.deepcopy(res.optimizer.state_dict())
        h, e = res.history.copy(), res.eval_history.copy()
        h["step"] += done
        e["step"] += done
        hist.append(h)
        ev.append(e)
        wall += res.wall_s
        done += steps
        evh = pd.concat(ev, ignore_index=True)
        trend, fall = validation_trend(evh["val_loss"].to_numpy())
        if (trend == "flattened" and len(evh) >= FLAT_MIN_EVALS) or (trend == "rising" and patience is None):
            stop = trend
            break
        if stopper.exhausted:
            stop = "patience"
            break
    restored = restore_best and stopper.best_step != done
    if restore_best:
        stopper.restore(model)
    model.eval()
    return VariantResult(spec=spec, seed=seed, state=trainable_state(model), history=pd.concat(hist, ignore_index=True),
                         eval_history=evh, flat=trend == "flattened", rel_fall=fall, params=params, wall_s=wall,
                         steps=done, trend=trend, best_step=stopper.best_step, best_val_loss=stopper.best_loss,
                         stop_reason=stop, restored_best=restored)


def load_variant(model, result: VariantResult, layers: Sequence[int]) -> None:
    """Install a trained variant's layers and weights into ``model`` (e.g. from a cached :class:`VariantResult`)."""
    install(model, result.spec, layers, seed=result.seed)
    _load_state(model, result.state, result.spec.name)
    model.eval()


def _load_state(model, state: dict, name: str) -> None:
    own = dict(model.named_parameters())
    bad = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
    if bad:
        raise ValueError(f"state of variant {name!r} does not fit the model: {bad[:3]}")
    model.load_state_dict(state, strict=False)


def train_btx(model, spec: MoCESpec, train_ex: list[dict], val_ex: list[dict], *, layers: Sequence[int], steps: int,
              batch_size: int = 8, lr: float = 2e-4, seed: int = 0, eval_every: int = 10, max_rounds: int = 1,
              domains: Sequence[str] = BTX_DOMAINS, train_experts: bool = True, device: str = "auto",
              patience: int | None = None, restore_best: bool = True) -> VariantResult:
    """BTX (A), the baseline of MoCE Table 1 (§4.1; Branch-Train-miX, Sukhbaatar et al. 2024, §2 with adapters).

    1. *Branch-train*: for each domain d, a dense adapter of width ``spec.rank`` (:func:`btx_branch_spec`) is trained
       on that domain's sequences only and early-stopped on that domain's validation sequences (the Specialized-*
       runs' rule), with the same step budget as every other run.
    2. *MiX*: the |D| adapters become the experts of one adapter-MoE layer per adapted block (:func:`btx_merge_states`),
       y = E(x) + Σ_{d∈TopK(R(x), k)} w_d Δ_d(E(x)) with a new token router R [|D|, d_model] (PESC softmax over the
       top-k, Switch balancing loss ``spec.balance_coef``); router and experts (``train_experts``) are then trained on
       the whole mix, as every other variant (same rounds, early stopping and best-checkpoint rule).
    Returns the mix stage's :class:`VariantResult` (``params``: trainable in the mix stage) with ``branches`` holding
    each branch's steps, best step, stop reason, wall time, trainable parameters and validation losses; ``wall_s``
    includes the branches.
    """
    if spec.num_groups != 1 or spec.experts_per_group != len(domains):
        raise ValueError(f"BTX spec must have one group of {len(domains)} experts (one per domain {list(domains)}), "
                         f"got M={spec.num_groups}, N={spec.experts_per_group}")
    splits = btx_domain_splits(train_ex, domains)
    val_splits = btx_domain_splits(val_ex, domains, "validation")
    kw = dict(layers=layers, steps=steps, batch_size=batch_size, lr=lr, seed=seed, eval_every=eval_every,
              max_rounds=max_rounds, device=device, patience=patience, restore_best=restore_best)
    branch, states, info = btx_branch_spec(spec), [], {}
    for d in domains:
        r = train_variant(model, branch, splits[d], val_splits[d], **kw)
        states.append(r.state)
        info[d] = {"steps": r.steps, "best_step": r.best_step, "stop_reason": r.stop_reason, "wall_s": r.wall_s,
                   "n_train": len(splits[d]), "n_val": len(val_splits[d]), **r.params,
                   "val_loss_best": r.best_val_loss, "val_loss_last": float(r.eval_history.val_loss.iloc[-1])}
        uninstall(model)
    res = train_variant(model, spec, train_ex, val_ex, init_state=btx_merge_states(states),
                        train_experts=train_experts, **kw)
    res.branches = info
    res.wall_s += sum(v["wall_s"] for v in info.values())
    return res


def plan_runs(cfg: dict, k: int) -> list[dict]:
    """The list of training runs of a profile: dict(label, variant, M, N, top_k, domain, k_clusters, seed).

    ``cfg["variants"]``: names from :func:`variant_spec` (M = ``k`` clusters, N = ``cfg["experts_per_group"]``);
    ``cfg["extra"]``: dicts overriding fields (experts per group, domain-specialised) or giving ``k_offset``
    (cluster count k + offset; ``label`` may contain ``{k}``) or ``seed_offset`` (the run's seed is each profile
    seed + offset: the second arm of an A/A comparison, e.g. ``dict(label="pesc_aa", variant="pesc",
    seed_offset=3)`` trains PESC again on seeds 3, 4, 5 beside PESC on 0, 1, 2; an offset that lands on a profile
    seed would train the same run twice -> ``ValueError``).
    """
    runs = []
    for seed in cfg["seeds"]:
        for v in cfg["variants"]:
            runs.append(dict(label=v, variant=v, M=k, N=cfg["experts_per_group"], top_k=2, domain=None,
                             k_clusters=k, seed=seed))
        for ex in cfg.get("extra", []):
            ex = dict(ex)
            kc = max(1, k + int(ex.pop("k_offset", 0)))  # cluster counts around the elbow (Fig. 4); k=1: one group
            off = int(ex.pop("seed_offset", 0))
            if off and seed + off in cfg["seeds"]:
                raise ValueError(f"seed_offset={off} of run {ex.get('label')!r} maps seed {seed} onto profile seed "
                                 f"{seed + off}: an A/A arm needs seeds of its own (offset >= {len(cfg['seeds'])})")
            r = dict(variant="moce", M=kc, N=cfg["experts_per_group"], top_k=2, domain=None, k_clusters=kc,
                     seed=seed + off)
            r.update(ex)
            r["label"] = r["label"].format(k=kc)
            runs.append(r)
    return runs


def run_identity(spec: MoCESpec, run: dict) -> str:
    """What a run trains, without its label: the spec (the balancing coefficient zeroed where the layer has no router,
    since it then multiplies a zero loss), clusters, domain and seed. Two runs with equal identities (e.g. ``seq_only``
    and Table 3's ``moce_N1``: both M groups of one rank-r expert) train the same model, so :func:`train_runs`
    trains it once."""
    s = asdict(spec)
    s.pop("name")
    if spec.experts_per_group == 1 and not spec.num_general:
        s["balance_coef"] = 0.0
    return json.dumps({"spec": s, "k": run["k_clusters"], "domain": run.get("domain"), "seed": run["seed"],
                       "btx": run["variant"] == "btx"}, sort_keys=True)


def train_runs(model, runs: list[dict], train_ex: list[dict], val_ex: list[dict], groups_by_k: dict, *,
               layers: Sequence[int], cfg: dict, cache_config: dict) -> list[VariantResult]:
    """Train (or load from ``moelab.cache.memo``) every planned run; returns their :class:`VariantResult`.

    Runs with the same :func:`run_identity` are trained once; the later ones get a copy under their own label."""
    out, seen = [], {}
    for r in progress.bar(runs, desc="01 training runs", unit="run"):
        spec = variant_spec(r["variant"], r["M"], r["N"], rank=cfg["rank"], top_k=r["top_k"])
        spec = MoCESpec(**{**asdict(spec), "name": r["label"]})
        ident = run_identity(spec, r)
        if ident in seen:
            out.append(dataclasses.replace(seen[ident], spec=spec))
            continue
        g_tr, g_va = groups_by_k[r["k_clusters"]]
        tr, va = with_groups(train_ex, g_tr), with_groups(val_ex, g_va)
        if r.get("domain"):   # a domain-specialised model is trained and early-stopped on its own domain
            tr = [e for e in tr if e["domain"] == r["domain"]]
            va = [e for e in va if e["domain"] == r["domain"]]
        stopping = {"patience": cfg.get("patience"), "restore_best": cfg.get("restore_best", True)}
        key = {**cache_config, "run": {k: v for k, v in r.items()}, "spec": asdict(spec), "layers": list(layers),
               "steps": cfg["steps"], "batch": cfg["batch"], "lr": cfg["lr"], "eval_every": cfg["eval_every"],
               "max_rounds": cfg["max_rounds"], **stopping, "n_train": len(tr), "n_val": len(va),
               "groups": hashlib.sha1(np.asarray(g_tr).tobytes() + np.asarray(g_va).tobytes()).hexdigest()}

        def compute(spec=spec, tr=tr, va=va, r=r):
            fit = train_btx if r["variant"] == "btx" else train_variant  # BTX: branch stage, then the same mix run
            res = fit(model, spec, tr, va, layers=layers, steps=cfg["steps"], batch_size=cfg["batch"],
                      lr=cfg["lr"], seed=r["seed"], eval_every=cfg["eval_every"], max_rounds=cfg["max_rounds"],
                      device=cfg.get("device", "auto"), **stopping)
            uninstall(model)
            return res

        seen[ident] = cache.memo("moce-variant", key, compute)
        out.append(seen[ident])
    uninstall(model)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation: the sequence's cluster set per batch row, the frozen trunk memoised across variants
# ---------------------------------------------------------------------------------------------------------------------
class RequestHook:
    """lm-eval request hook for ``suite.lmeval.evaluate(request_hook=...)``: stage 1 of MoCE's routing (§3.3) for an
    evaluation prompt, i.e. its cluster ``cluster_of(instruction)`` (memoised per context in ``seen``) set on the
    model's MoCE layers.

    - ``hook.for_batch(contexts)``: a context manager setting one cluster id per batch row for the enclosed forward
      pass (``group_context``); ``lmeval.FastHFLM`` enters it around every batched forward, so requests stay batched.
    - ``hook(context)``: the one-request form (sets the id until changed), for callers that score one at a time.
    """

    def __init__(self, model, cluster_of: Callable[[str], int]):
        if not callable(cluster_of):
            raise ValueError(f"cluster_of must be callable (instruction -> cluster id), got {cluster_of!r}")
        self.model, self.cluster_of = model, cluster_of
        self.seen: dict[str, int] = {}

    def cluster(self, context: str) -> int:
        if context not in self.seen:
            self.seen[context] = int(self.cluster_of(context_instruction(context)))
        return self.seen[context]

    def __call__(self, context: str) -> None:
        set_group_ids(self.model, [self.cluster(context)])

    def for_batch(self, contexts: Sequence[str]):
        return group_context(self.model, [self.cluster(c) for c in contexts])


def make_request_hook(model, cluster_of: Callable[[str], int]) -> RequestHook:
    """The :class:`RequestHook` of ``model`` (``cluster_of(instruction) -> int``, e.g. :func:`cluster_predictor`)."""
    return RequestHook(model, cluster_of)


LM_TASKS_FALLBACK = ("moelab_math_mc", "moelab_bb_hyperbaton", "moelab_bb_navigate")


def lm_tasks_for(model_name: str, n: int | None, fallback: Sequence[str] = LM_TASKS_FALLBACK,
                 in_run: bool = False) -> tuple[list[str], str]:
    """The suite's lm-eval tasks on which ``model_name`` is above chance (``suite.scorecard.usable_tasks``), without
    the answer-likelihood tasks (scored separately) and the generation tasks (GSM, HumanEval), the first ``n``;
    ``fallback`` when the committed scorecard is absent (never built here: hours of CPU) or lacks the model.
    ``in_run`` (the paper profile: a user's model, which the committed scorecard cannot know): every multiple-choice
    task, the first ``n``, all scored, the usable ones then chosen by :func:`in_run_scorecard` on the untrained
    model's items. Returns ``(tasks, note)``, the note saying which source was used."""
    if in_run:
        mc = [t for t in lmeval.TASKS if lmeval.PRIMARY_METRIC[t] == "acc"][:n]
        return mc, (f"every multiple-choice task (first {n}): the usable ones are chosen by this run's scorecard of "
                    f"{model_name} (moce.in_run_scorecard)")
    try:
        if not scorecard.CSV.exists():
            raise FileNotFoundError(scorecard.CSV)
        usable = [t for t in scorecard.usable_tasks(model_name) if not t.startswith("moelab_nll")]
        note = f"suite.scorecard.usable_tasks({model_name!r})"
    except (ValueError, FileNotFoundError) as e:
        usable, note = list(fallback), f"fixed list (scorecard unavailable for {model_name}: {type(e).__name__})"
    return [t for t in usable if t not in ("moelab_gsm", "moelab_humaneval")][:n], note


def in_run_scorecard(scores: pd.DataFrame, lm_tasks: Sequence[str], model_name: str) -> pd.DataFrame:
    """The scorecard of the run's own model (issue 51: the committed one knows only SmolLM2 and Gemma-3): the
    usability rule of ``moelab.suite.scorecard`` (beats chance, the best always-same-position and the best
    question-blind baselines, one-sided paired tests at 5 % on the items) applied to the untrained model's
    (``vanilla``) per-item accuracies of ``lm_tasks`` in ``scores`` (:func:`evaluate_runs`). One row per task with
    ``usable``, ``status`` and ``reason``; the claims read accuracy only on its usable tasks."""
    v = scores[(scores["variant"] == "vanilla") & (scores["metric"] == "acc") & scores["task"].isin(list(lm_tasks))]
    if v.empty:
        raise ValueError(f"no untrained-model accuracy rows for {list(lm_tasks)} in the scores: score the vanilla model "
                         "(None first in evaluate_runs' results) on the lm tasks")
    items = scorecard.with_option_order(v[["task", "item_id", "metric", "score"]].reset_index(drop=True))
    return scorecard.summarize(items, model_name)


def _digest(obj) -> str:
    """sha1 of a JSON-able object, a state dict of tensors, or an array (cache keys of scored models)."""
    h = hashlib.sha1()
    if isinstance(obj, dict) and all(torch.is_tensor(v) for v in obj.values()):
        for k in sorted(obj):
            h.update(k.encode())
            h.update(obj[k].detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + obj.tobytes())
    else:
        h.update(json.dumps(obj, sort_keys=True, default=str).encode())
    return h.hexdigest()


def evaluate_runs(model, tok, results: list[VariantResult | None], test_items: list[dict], test_groups: dict,
                  lm_tasks: Sequence[str], lm_limit: int | None, cluster_of: dict, layers: Sequence[int],
                  labels: Sequence[str] | None = None, batch_size: int = 8, cache_config: dict | None = None):
    """Per-item scores of the vanilla model (``None`` in ``results``) and every trained run.

    - per-domain likelihood: ``suite.lmeval.domain_nll`` (bits per byte of the reference answer) on ``test_items``,
      batched, each batch row with its item's cluster id (``test_groups[k]``: cluster per test item with k clusters);
    - ``suite.lmeval.evaluate`` on ``lm_tasks`` with the :class:`RequestHook` setting each row's cluster
      (``cluster_of[k]``: instruction -> cluster id with k clusters), batched the same way.
    The frozen lower blocks are memoised across models (:func:`trunk_memo`). With ``cache_config`` (JSON-able, naming
    the model) each model's scores are stored with ``moelab.cache.memo`` (keyed by its trained weights, the items and
    their clusters), so an interrupted evaluation resumes model by model; a result whose weights, seed and clusters
    equal an earlier one's (a run trained once under two labels) reuses its scores. Returns a tidy DataFrame
    (variant, seed, task, item_id, metric, score).
    """
    rows = []
    start = min(layers)
    memo = None
    labels = list(labels) if labels is not None else [None] * len(results)
    pairs = [(prompt_text(tok, it["instruction"]), it["answer"]) for it in test_items]
    items_key = _digest([[it.get("id", str(i)), it["instruction"], str(it["answer"]), it["domain"]]
                         for i, it in enumerate(test_items)])

    def score(res, name, seed, k, g):
        nonlocal memo
        uninstall(model)
        if res is not None:
            load_variant(model, res, layers)
        out = []
        ctx = trunk_memo(model, start, memo) if start > 0 else contextlib.nullcontext(None)
        with ctx as memo:
            df = lmeval.domain_nll(model, tok, pairs, batch_size=batch_size,
                                   batch_context=lambda rows_, mask, g=g: group_context(model, g[list(rows_)]))
            for i, it in enumerate(test_items):
                out.append({"variant": name, "seed": seed, "task": f"nll_{it['domain']}",
                            "item_id": it.get("id", str(i)), "metric": "bpb", "score": float(df.bpb.iloc[i])})
            if lm_tasks:
                hook = make_request_hook(model, cluster_of[k]) if k > 1 else None
                df = lmeval.evaluate(model, tok, list(lm_tasks), limit=lm_limit, request_hook=hook,
                                     batch_size=batch_size)
                df.insert(0, "seed", seed)
                df.insert(0, "variant", name)
                out += df.to_dict("records")
        uninstall(model)
        return out

    done: dict[str, list[dict]] = {}   # the same trained weights under two labels (seq_only = moce_N1) scored once
    for res, lab in progress.bar(list(zip(results, labels)), desc="01 evaluated models", unit="model"):
        name = lab or (res.spec.name if res is not None else "vanilla")
        seed = res.seed if res is not None else -1
        k = res.spec.num_groups if res is not None else 1
        g = np.asarray(test_groups.get(k, np.zeros(len(test_items), int)))
        same = _digest([seed, _digest(g.astype(np.int64)), _digest(res.state) if res is not None else None,
                        {kk: v for kk, v in asdict(res.spec).items() if kk != "name"} if res is not None else None])
        if same in done:
            rows += [{**r, "variant": name} for r in done[same]]
            continue
        if cache_config is None:
            out = score(res, name, seed, k, g)
        else:
            key = {**cache_config, "name": name, "seed": seed, "items": items_key,
                   "groups": _digest(g.astype(np.int64)), "spec": asdict(res.spec) if res is not None else None,
                   "state": _digest(res.state) if res is not None else None, "lm_tasks": list(lm_tasks or []),
                   "lm_limit": lm_limit, "batch_size": batch_size, "layers": list(layers)}
            out = cache.memo("moce-scores", key, lambda res=res, name=name, seed=seed, k=k, g=g: score(res, name, seed,
                                                                                                        k, g))
        done[same] = out
        rows += out
    uninstall(model)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------------
# The configuration as a script (moelab.launch)
# ---------------------------------------------------------------------------------------------------------------------
RUN_DEFAULTS = dict(profile="smoke", model="smollm2", encoder="e5", k=None, ks=list(range(1, 7)), n_cluster=60,
                    n_train=48, n_val=12, n_top=2, max_len=96, rank=64, experts_per_group=2, steps=4, batch=4,
                    lr=2e-4, eval_every=1, max_rounds=1, patience=None, restore_best=True, seeds=[0],
                    variants=["pesc", "moce"], extra=[], device="auto")


def run_from_config(config: dict) -> pd.DataFrame:
    """Notebook 01's training as a script: ``python -m moelab.launch moelab.moce:run_from_config --config cfg.json``.

    Keys (defaults :data:`RUN_DEFAULTS`, a smoke-sized run): ``profile`` (the balanced instruction mix,
    ``suite.instruct.build_balanced``), ``model`` ("smollm2", "gemma3" or a local Hugging Face folder), ``encoder``
    ("e5", "minilm" or a local sentence-transformers folder), ``k`` (clusters; null = the elbow of ``ks``),
    ``n_cluster`` / ``n_train`` / ``n_val`` (balanced per domain), ``n_top`` (adapted top blocks or "all"),
    ``max_len``, ``rank``, ``experts_per_group``, ``steps``, ``batch``, ``lr``, ``eval_every``, ``max_rounds``,
    ``patience`` and ``restore_best`` (early stopping, :func:`train_variant`), ``seeds``, ``variants`` and ``extra``
    (as :func:`plan_runs`), ``device`` ("auto": CUDA with bf16 autocast when available, else the CPU; under
    ``moelab.launch``'s CPU processes pass "cpu"). Trains every run (memoised like the
    notebook's) and returns the criterion table (steps, best step, stop reason, validation trend, parameter counts)
    with the clusters' k.
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(RUN_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown run_from_config key(s) {unknown}; known: {sorted(RUN_DEFAULTS)}")
    cfg = {**RUN_DEFAULTS, **config}
    seed = int(cfg["seeds"][0])
    data = instruct.build_balanced(cfg["profile"])
    items = subsample(data["train"], cfg["n_cluster"], seed=seed, by="domain")
    train_items = items[: cfg["n_train"]]
    val_items = subsample(data["validation"], cfg["n_val"], seed=seed, by="domain")
    emb = embed_texts(instruction_texts(items), cfg["encoder"])
    k = cfg["k"]
    if k is None:
        curve = elbow_curve(emb, cfg["ks"], seed=seed)
        k = find_knee(curve.k, curve.sse)["k"]
    runs = plan_runs(cfg, int(k))
    cms: dict[int, ClusterModel] = {kc: fit_clusters(emb, kc, seed=seed, encoder=cfg["encoder"])
                                    for kc in sorted({r["k_clusters"] for r in runs} | {int(k)})}
    if cfg["model"] == "smollm2":
        model, tok = assets.load_smollm2()
    elif cfg["model"] == "gemma3":
        model, tok = assets.load_gemma3()
    else:
        model, tok = assets.load_causal_lm(cfg["model"])
    layers = top_layer_ids(model, cfg["n_top"])
    ccfg = {"model": str(cfg["model"]), "profile": cfg["profile"]}
    train_ex = build_cache(model, tok, train_items, np.zeros(len(train_items), int), min(layers), cfg["max_len"], ccfg)
    val_ex = build_cache(model, tok, val_items, np.zeros(len(val_items), int), min(layers), cfg["max_len"], ccfg)
    emb_va = embed_texts(instruction_texts(val_items), cfg["encoder"])
    groups_by_k = {1: (np.zeros(len(train_ex), int), np.zeros(len(val_ex), int))}
    groups_by_k.update({kc: (c.predict(emb[: len(train_items)]), c.predict(emb_va)) for kc, c in cms.items()})
    results = train_runs(model, runs, train_ex, val_ex, groups_by_k, layers=layers, cfg=cfg, cache_config=ccfg)
    return criterion_table(results, len(layers), model.config.hidden_size).assign(clusters_k=int(k))


# ---------------------------------------------------------------------------------------------------------------------
# The notebook's steps (01 sections 1-6): the paper / stand-in choice, the data splits, the cached trunk, the groups
# ---------------------------------------------------------------------------------------------------------------------
def load_instruction_mix(suite_profile: str, data_paths: dict | None = None, paper_data: bool = False) -> dict:
    """§1 of notebook 01: the instruction mix. ``paper_data``: the paper's three sets from ``data_paths``
    (:func:`moelab.moce.data.load_paper_mix`) with the suite's ``full`` evaluation pool as test; otherwise the suite's
    mix with equal training / validation counts per domain at the size table ``suite_profile``
    (``moelab.suite.instruct.build_balanced``)."""
    if paper_data:
        data = load_paper_mix(data_paths or {})
        data["test"] = instruct.build("full")["test"]
        return data
    return instruct.build_balanced(suite_profile)


def split_items(data: dict, *, n_cluster: int, n_train: int | None, n_val: int, n_test_per_domain: int,
                seed: int) -> dict:
    """The items a run uses, balanced by domain: ``cluster`` (``n_cluster`` training items to cluster), ``train`` (a
    prefix of them, balanced too: :func:`subsample` interleaves, and embedded already), ``validation`` and ``test``
    (``n_test_per_domain`` per domain of the evaluation pool)."""
    clu = subsample(data["train"], n_cluster, seed=seed, by="domain")
    return {"cluster": clu, "train": clu[:n_train],
            "validation": subsample(data["validation"], n_val, seed=seed, by="domain"),
            "test": subsample(data["test"], 3 * n_test_per_domain, seed=seed, by="domain")}


def moce_encoder(paper_data: bool = False, encoder_path=None) -> str:
    """The encoder MoCE clusters with: E5 (the MoCE-E5 row of Table 1; ``multilingual-e5-small`` here), or with
    ``paper_data`` e5-large-v2 from the local folder ``encoder_path`` (``MissingAsset`` when absent)."""
    return paper_encoder_path(encoder_path) if paper_data else "e5"


def load_backbone(paper_data: bool = False, model_path=None):
    """``(model, tokenizer, name)``: SmolLM2-135M-Instruct, or with ``paper_data`` Llama-2-7b-chat from the local
    folder ``model_path`` (name "paper")."""
    if paper_data:
        return (*load_paper_model(model_path), "paper")
    return (*assets.load_smollm2(), "smollm2-135m-instruct")


def cache_trunk(model, tok, train_items: list[dict], val_items: list[dict], *, n_top, max_len: int,
                cache_config: dict):
    """§3 of notebook 01: the adapted top ``n_top`` blocks and the frozen lower blocks' outputs of the training and
    validation sequences, computed once and cached (:func:`build_cache`). Returns (layers, train_ex, val_ex)."""
    layers = top_layer_ids(model, n_top)
    start = min(layers)  # first adapted block: blocks below it are frozen and cached
    train_ex = build_cache(model, tok, train_items, np.zeros(len(train_items), int), start, max_len, cache_config)
    val_ex = build_cache(model, tok, val_items, np.zeros(len(val_items), int), start, max_len, cache_config)
    return layers, train_ex, val_ex


def cluster_groups(study: dict, encoder: str, k: int, runs: list[dict], items: dict, seed: int) -> dict:
    """The sequence-level routing (Stage 1) of every planned run: the k-means model per cluster count the runs need
    (the elbow's from ``study``, the others fitted on the same embeddings), the group ids of the training and
    validation items per k (k = 1: one group) and of the test items, and each k's predictor for scoring."""
    ks_needed = sorted({r["k_clusters"] for r in runs} | {k})
    cm = study["clusters"][encoder]
    cms = {kc: (cm if kc == k else fit_clusters(study["emb"][encoder], kc, seed=seed)) for kc in ks_needed}
    emb_tr = embed_texts(instruction_texts(items["train"]), encoder)
    emb_va = embed_texts(instruction_texts(items["validation"]), encoder)
    emb_te = embed_texts(instruction_texts(items["test"]), encoder)
    groups_by_k = {1: (np.zeros(len(items["train"]), int), np.zeros(len(items["validation"]), int))}
    groups_by_k.update({kc: (c.predict(emb_tr), c.predict(emb_va)) for kc, c in cms.items()})
    return {"models": cms, "train_val": groups_by_k, "test": {kc: c.predict(emb_te) for kc, c in cms.items()},
            "predictors": {kc: cluster_predictor(c, encoder) for kc, c in cms.items()}}


def gemma_experiment(runs: list[dict], items: dict, groups: dict, encoder: str, cfg: dict, cache_config: dict) -> dict:
    """§6 of notebook 01: PESC and MoCE (``cfg["gemma_variants"]``, seeds ``cfg["gemma_seeds"]``) on Gemma-3-270M with
    the same clusters, training data, early stopping and adapter sizes, scored on ``gemma_test_per_domain`` held-out
    answers per domain. Returns the criterion, per-item scores and summary tables and what was run."""
    gmodel, gtok = assets.load_gemma3()
    layers, g_train, g_val = cache_trunk(gmodel, gtok, items["train"], items["validation"], n_top=cfg["n_top"],
                                         max_len=cfg["max_len"], cache_config=cache_config)
    g_runs = [r for r in runs if r["label"] in cfg["gemma_variants"] and r["seed"] in cfg["gemma_seeds"]]
    results = train_runs(gmodel, g_runs, g_train, g_val, groups["train_val"], layers=layers, cfg=cfg,
                         cache_config=cache_config)
    test = subsample(items["test"], 3 * cfg["gemma_test_per_domain"], seed=cfg["seeds"][0], by="domain")
    emb = embed_texts(instruction_texts(test), encoder)
    lm, _ = lm_tasks_for("gemma-3-270m", cfg["lm_tasks_max"])
    g_groups = {k: c.predict(emb) for k, c in groups["models"].items()}
    scores = evaluate_runs(gmodel, gtok, [None] + results, test, g_groups, lm, cfg["lm_limit"], groups["predictors"],
                           layers, cache_config=cache_config)
    return {"criterion": criterion_table(results, len(layers), gmodel.config.hidden_size), "scores": scores,
            "summary": summarize_scores(scores), "layers": layers, "n_test": len(test), "lm_tasks": lm}
