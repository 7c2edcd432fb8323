"""Free-MoE's data (paper 004, §4.1; notebook ``notebooks/05_free_moe.py``): the three main domains built from
``moelab.suite`` (reference = validation splits for band selection, test = the lm-eval evaluation pools, train =
training splits for the router), the general tasks the suite's scorecard marks usable, and the calibration texts
and token batches DOWP calibrates on (§3.1, Eq. 4's ||X_n||_2)."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import pandas as pd
import torch

from moelab import cache, progress
from moelab.suite import instruct, lmeval, scorecard

__all__ = ["MATH_MC_LM_TASK", "GENERAL_CANDIDATES", "SCORECARD_TASKS", "task_usability", "load_domains", "load_groups",
           "load_groups_for", "choose_general_tasks", "primary_metric", "as_likelihood_item", "model_scorecard",
           "scorecard_tasks",
           "calibration_text", "tokenize_batches"]

MATH_MC_LM_TASK = "moelab_math_mc"             # the maths domain's multiple-choice task (elementary_math_qa)


def tokenize_batches(tok, texts: Sequence[str], batch_size: int = 8, max_length: int = 256) -> list[dict]:
    """Right-padded token batches for calibration (texts sorted by length to limit padding)."""
    if len(texts) == 0:
        raise ValueError("tokenize_batches: empty text list")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = []
    for s in range(0, len(order), batch_size):
        chunk = [texts[i] for i in order[s:s + batch_size]]
        enc = tok(chunk, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


def calibration_text(item: dict) -> str:
    """Prompt plus its reference answer (gold choice for multiple choice): the text DOWP calibrates on."""
    ans = item["choices"][item["label"]] if "choices" in item else item["answer"]
    return item["prompt"] + ans


# ----------------------------------------------------------------------------------------------------------------
# main domains from the suite (reference = validation splits, test = the lm-eval evaluation pools)
# ----------------------------------------------------------------------------------------------------------------
def _mc_item(it: dict, domain: str, task: str) -> dict:
    return dict(id=it["id"], domain=domain, task=task, prompt=it["prompt"],
                choices=[" " + c for c in it["choices"]], label=int(it["gold"]))


def _free_item(iid, domain: str, task: str, prompt: str, answer: str) -> dict:
    return dict(id=iid, domain=domain, task=task, prompt=prompt, answer=answer)


def load_domains(general_tasks: Sequence[str], n_ref_per_task: int, n_test_per_task: int, n_train_per_task: int,
                 n_code_ref: int, n_code_test: int, n_code_train: int, n_humaneval: int,
                 instruct_profile: str = "default") -> dict:
    """The three main domains of §4.1 built from ``moelab.suite`` (§3.1 D = {D_A, D_B, ...}):

    - ``general`` (knowledge & reasoning): BIG-bench multiple-choice lm tasks ``general_tasks`` (``moelab_bb_*``);
    - ``maths``: ``moelab_math_mc`` (elementary_math_qa, five options) plus GSM-style held-out templates
      (``moelab_nll_maths``, test only, reference-answer likelihood);
    - ``code``: stdlib function-writing records of ``suite.instruct`` (reference-answer likelihood: no tests) and
      HumanEval (``moelab_nll_code`` likelihood of the canonical solution; ``moelab_humaneval`` pass@k).

    Reference = the suite's validation split (selection), test = the first ``n_test_per_task`` items of each lm task's
    evaluation pool (``suite.lmeval.task_docs``), train = training split items (router only).
    Returns dict(reference, test, train) -> {domain: [items]}, plus ``humaneval`` (problems).
    """
    ref, test, train = ({d: [] for d in ("general", "maths", "code")} for _ in range(3))
    mc = [(t, "general") for t in general_tasks] + [(MATH_MC_LM_TASK, "maths")]
    for lm_task, dom in mc:
        if lm_task not in lmeval.MC_TASKS and lm_task.removeprefix("moelab_") not in lmeval.MC_TASKS:
            raise ValueError(f"{lm_task!r} is not a moelab multiple-choice lm task ({sorted(lmeval.MC_TASKS)})")
        src = lmeval.MC_TASKS[lm_task.removeprefix("moelab_")]
        sp = instruct.task_splits(src)
        ref[dom] += [_mc_item(it, dom, lm_task) for it in sp["validation"][:n_ref_per_task]]
        train[dom] += [_mc_item(it, dom, lm_task) for it in sp["train"][:n_train_per_task]]
        test[dom] += [_mc_item(it, dom, lm_task) for it in lmeval.task_docs(lm_task.removeprefix("moelab_"))
                      [:n_test_per_task]]
    for d in lmeval.task_docs("nll_maths")[:n_test_per_task]:
        test["maths"].append(_free_item(d["id"], "maths", "moelab_nll_maths", d["context"], d["continuation"]))
    for d in lmeval.task_docs("nll_code")[:n_code_test]:
        test["code"].append(_free_item(d["id"], "code", "moelab_nll_code", d["context"], d["continuation"]))
    mix = instruct.build(instruct_profile)
    for split, store, n in (("validation", ref, n_code_ref), ("train", train, n_code_train)):
        recs = [r for r in mix[split] if r["domain"] == "code"][:n]
        store["code"] += [_free_item(r["id"], "code", "stdlib_code", r["instruction"] + "\n", r["answer"])
                          for r in recs]
    he = [dict(d, domain="code", task="moelab_humaneval") for d in lmeval.task_docs("humaneval")[:n_humaneval]]
    for dom in ref:
        if not ref[dom]:
            raise ValueError(f"main domain {dom!r} has no reference examples")
    return dict(reference=ref, test=test, train=train, humaneval=he)


@lru_cache(maxsize=None)
def _usable_tasks(model_name: str) -> frozenset:
    """The tasks the committed scorecard (``data/scorecard.csv``, written by ``python -m moelab.suite.scorecard``
    with its usability rule) marks usable for ``model_name``; read, not recomputed (recomputing the rule with its
    question-blind classifiers takes a minute or more). A model absent from it -> ValueError."""
    card = pd.read_csv(scorecard.CSV)
    rows = card[card.model == model_name]
    if rows.empty:
        raise ValueError(f"model {model_name!r} is not in the scorecard {scorecard.CSV.name}")
    return frozenset(rows[rows.status == "usable"].task)


def choose_general_tasks(model_name: str, candidates: Sequence[str], max_tasks: int,
                         card: pd.DataFrame | None = None) -> tuple[list[str], str]:
    """General-domain lm tasks: the candidates the suite's scorecard marks usable (above chance) for ``model_name``,
    in candidate order; without a scorecard, the first candidates (the returned note says which happened). ``card``:
    the scorecard measured on this run's model (:func:`model_scorecard`, the paper profile), else the committed one."""
    try:
        if card is not None:
            usable = frozenset(card[card.status == "usable"].task)
        elif not scorecard.CSV.exists():    # never trigger the (hour-long) scorecard build from here
            return list(candidates[:max_tasks]), "no committed scorecard yet; fixed candidate list used"
        else:
            usable = _usable_tasks(model_name)
    except ValueError as e:  # model not in the scorecard: say so in the notebook
        return list(candidates[:max_tasks]), f"scorecard unusable ({e}); fixed candidate list used"
    chosen = [t for t in candidates if t in usable][:max_tasks]
    if not chosen:
        return list(candidates[:max_tasks]), "scorecard marks none of the candidates usable; fixed list used"
    return chosen, f"scorecard: {len(chosen)} of {len(candidates)} candidates above chance"


def primary_metric(model_name: str, mc_tasks: Sequence[str]) -> tuple[str, str]:
    """The metric bands are selected on and claims lead with. ``"acc"`` (the paper's Eq. 6) when the
    suite's scorecard marks every multiple-choice task in ``mc_tasks`` usable for ``model_name`` (above chance, the
    best fixed position and the best question-blind baseline), or when the model is not in the scorecard (the
    paper's own models); else ``"loglik"``, the answer likelihood (accuracy at chance carries no signal to select
    on). Returns (metric, note)."""
    if not scorecard.CSV.exists():          # never trigger the (hour-long) scorecard build from here
        return "acc", "no committed scorecard: the paper's accuracy"
    try:
        usable = _usable_tasks(model_name)
    except ValueError:
        return "acc", f"{model_name} is not in the scorecard: the paper's accuracy"
    bad = [t for t in mc_tasks if t not in usable]
    if bad:
        return "loglik", (f"the scorecard marks {len(bad)} of {len(mc_tasks)} multiple-choice tasks not usable for "
                          f"{model_name} ({', '.join(bad)}): answer likelihood is the primary metric")
    return "acc", f"the scorecard marks every multiple-choice task usable for {model_name}: accuracy"


def as_likelihood_item(item: dict) -> dict:
    """The answer-likelihood view of a test item: a multiple-choice item becomes ``dict(prompt, answer=gold option)``
    (same prompt and option text as its accuracy scoring); a free item is returned as is. The off-domain probe of
    notebook 05 scores these."""
    if "choices" not in item:
        return item
    out = {k: v for k, v in item.items() if k not in ("choices", "label")}
    return dict(out, answer=item["choices"][item["label"]])


# ----------------------------------------------------------------------------------------------------------------
# held-out reference pools per selection group (main domain x task type)
# ----------------------------------------------------------------------------------------------------------------
def _interleave(lists: Sequence[list]) -> list:
    """Round-robin merge, so that any prefix covers every list."""
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def _tag(items: list, kind: str) -> list:
    return [dict(it, kind=kind, group=f"{it['domain']}-{kind}") for it in items]


def load_groups(general_tasks: Sequence[str], pool_per_task: int, n_test: int, n_train: int, code_test: int,
                code_train: int, n_humaneval: int, instruct_profile: str = "default", max_code_chars: int = 0) -> dict:
    """Notebook 05's data in selection groups (§4.1; multiple choice selects for multiple choice,
    generative for generative). Every item carries ``domain``, ``kind`` ("mc" | "gen") and ``group``
    (``f"{domain}-{kind}"``). Reference pools (band selection; never tested on):

    - ``general-mc``: each general BIG-bench task's validation split, then its training items past the router's
      first ``n_train`` (interleaved over tasks); ``maths-mc``: the same for ``elementary_math_qa``;
    - ``maths-gen``: GSM-style problems of the training templates' validation split (``instruct.gsm_splits``), in
      ``moelab_nll_maths``' format (its test items come from held-out templates);
    - ``code-gen``: stdlib function-writing records (validation, then training past the router's ``code_train``).

    Test = the lm-eval evaluation pools (first ``n_test`` per task; ``code_test`` HumanEval canonical solutions;
    ``n_humaneval`` problems for pass@k); train = the router's items per main domain (MC tasks' and GSM training
    items, stdlib code). ``max_code_chars`` > 0 keeps only code reference answers that short (the smoke profile).
    Returns dict(pools={group: items}, test={domain: items}, train={domain: items},
    humaneval=[problems])."""
    if pool_per_task < 1:
        raise ValueError(f"pool_per_task={pool_per_task}: need at least one reference item per task")
    pools = {g: [] for g in ("general-mc", "maths-mc", "maths-gen", "code-gen")}
    test, train = ({d: [] for d in ("general", "maths", "code")} for _ in range(2))
    per_group: dict = {"general-mc": [], "maths-mc": []}
    for lm_task, dom in [(t, "general") for t in general_tasks] + [(MATH_MC_LM_TASK, "maths")]:
        name = lm_task.removeprefix("moelab_")
        if name not in lmeval.MC_TASKS:
            raise ValueError(f"{lm_task!r} is not a moelab multiple-choice lm task ({sorted(lmeval.MC_TASKS)})")
        sp = instruct.task_splits(lmeval.MC_TASKS[name])
        pool = (list(sp["validation"]) + list(sp["train"][n_train:]))[:pool_per_task]
        per_group[f"{dom}-mc"].append(_tag([_mc_item(it, dom, lm_task) for it in pool], "mc"))
        train[dom] += _tag([_mc_item(it, dom, lm_task) for it in sp["train"][:n_train]], "mc")
        test[dom] += _tag([_mc_item(it, dom, lm_task) for it in lmeval.task_docs(name)[:n_test]], "mc")
    for g, lists in per_group.items():
        pools[g] = _interleave(lists)
    gsm = instruct.gsm_splits()
    as_gsm = lambda p, task: _free_item(p["id"], "maths", task, f"Question: {p['question']}\nAnswer:",
                                        " " + p["answer"])
    pools["maths-gen"] = _tag([as_gsm(p, "gsm_validation") for p in gsm["validation"][:pool_per_task]], "gen")
    train["maths"] += _tag([as_gsm(p, "gsm_train") for p in gsm["train"][:n_train]], "gen")
    test["maths"] += _tag([_free_item(d["id"], "maths", "moelab_nll_maths", d["context"], d["continuation"])
                           for d in lmeval.task_docs("nll_maths")[:n_test]], "gen")
    test["code"] += _tag([_free_item(d["id"], "code", "moelab_nll_code", d["context"], d["continuation"])
                          for d in lmeval.task_docs("nll_code")[:code_test]], "gen")
    mix = instruct.build(instruct_profile)
    code = {s: [r for r in mix[s] if r["domain"] == "code"] for s in ("validation", "train")}
    short = lambda rs: [r for r in rs if max_code_chars <= 0 or len(r["answer"]) <= max_code_chars]
    as_code = lambda r: _free_item(r["id"], "code", "stdlib_code", r["instruction"] + "\n", r["answer"])
    pools["code-gen"] = _tag([as_code(r) for r in short(code["validation"] + code["train"][code_train:])
                              [:pool_per_task]], "gen")
    train["code"] += _tag([as_code(r) for r in code["train"][:code_train]], "gen")
    he = [dict(d, domain="code", task="moelab_humaneval", kind="gen", group="code-gen")
          for d in lmeval.task_docs("humaneval")[:n_humaneval]]
    empty = [g for g, v in pools.items() if not v]
    if empty:
        raise ValueError(f"reference pools {empty} are empty")
    return dict(pools=pools, test=test, train=train, humaneval=he)


def load_groups_for(general_tasks: Sequence[str], cfg) -> dict:
    """:func:`load_groups` with the sizes of a ``FreeMoeConfig`` (the smoke profile reads the suite's smoke mix)."""
    return load_groups(general_tasks, cfg.pool_per_task, cfg.n_test, cfg.n_train, cfg.code_test, cfg.code_train,
                       cfg.n_he, instruct_profile="smoke" if cfg.profile == "smoke" else "default",
                       max_code_chars=cfg.max_code_chars)


# BIG-bench multiple-choice lm tasks for the general domain (the scorecard's usable ones first, else this order)
GENERAL_CANDIDATES = ("moelab_bb_date_understanding", "moelab_bb_hyperbaton", "moelab_bb_sports_understanding",
                      "moelab_bb_navigate", "moelab_bb_causal_judgment", "moelab_bb_winowhy")


def task_usability(model_name: str, tasks: Sequence[str], card: pd.DataFrame | None = None) -> dict:
    """Per lm task: ``usable`` / ``not usable`` from the suite's committed scorecard, or from ``card`` (the scorecard
    measured on this run's model, :func:`model_scorecard`) when given (the model beats chance and the options-only
    baselines, or a bits-per-byte interval below 8), or ``not in the scorecard``. Accuracy claims on a task that is
    not usable are outside the regime."""
    if card is not None:
        status = dict(zip(card.task, card.status))
        return {t: "usable" if status.get(t) == "usable" else "not usable" if t in status else "not in the scorecard"
                for t in tasks}
    try:
        usable = _usable_tasks(model_name) if scorecard.CSV.exists() else None
    except ValueError:
        usable = None
    if usable is None:
        return {t: "not in the scorecard" for t in tasks}
    return {t: "usable" if t in usable else "not usable" for t in tasks}


# the tasks notebook 05 tests on or reads the paper's metric of, besides the general candidates: MathQA's stand-in,
# the GSM-style and HumanEval-solution likelihoods, and GSM exact match / HumanEval pass@1 (the paper's metrics, which
# decide whether a likelihood may stand in for them: claims.paper_metric_floor)
SCORECARD_TASKS = (MATH_MC_LM_TASK, "moelab_nll_maths", "moelab_nll_code", "moelab_gsm", "moelab_humaneval")


def scorecard_tasks(n_candidates: int = len(GENERAL_CANDIDATES)) -> tuple[str, ...]:
    """Every task notebook 05 reads for a run that chooses its general tasks among the first ``n_candidates`` of
    ``GENERAL_CANDIDATES``: those candidates, then ``SCORECARD_TASKS``."""
    return (*GENERAL_CANDIDATES[:n_candidates], *SCORECARD_TASKS)


def model_scorecard(model, tok, model_name: str, max_items: int, tasks: Sequence[str] | None = None,
                    batch_size: int = 8, cache_config: dict | None = None) -> pd.DataFrame:
    """The suite's scorecard measured on this run's model (the paper profile: the committed ``data/scorecard.csv``
    holds SmolLM2-135M-Instruct and Gemma-3-270M only): per task the first ``min(scorecard limit, max_items)`` items
    of its fixed pool scored through lm-eval (``scorecard.per_item_scores``, as ``python -m moelab.suite.scorecard
    build`` does), then the same usability rule (``scorecard.summarize``: a multiple-choice task is usable when the
    model beats chance, the best always-same-position and the best question-blind baseline in one-sided paired tests
    at 5%; a bits-per-byte task when its interval lies below 8; GSM / HumanEval when the interval lies above 0).
    ``max_items`` >= 300 gives the committed scorecard's item counts. With ``cache_config`` (which must identify the
    model: ``moelab.cache.path_identity`` of its folder) each task's per-item scores are cached on their own, so an
    interrupted run resumes task by task. Returns ``scorecard.summarize``'s rows (model, task, metric, n, acc, ci_low,
    ci_high, chance, ..., status, usable, reason). ``tasks``: default :func:`scorecard_tasks` (every candidate)."""
    tasks = scorecard_tasks() if tasks is None else tuple(tasks)
    if max_items < 1:
        raise ValueError(f"model_scorecard: max_items={max_items}, need at least one item per task")
    unknown = [t for t in tasks if t not in lmeval.TASKS]
    if unknown:
        raise ValueError(f"model_scorecard: {unknown} are not moelab lm tasks ({lmeval.TASKS})")
    parts = []
    for t in progress.bar(list(tasks), desc="scorecard of this model", unit="task"):
        def compute(t=t):
            with torch.no_grad():
                return scorecard.per_item_scores(model, tok, [t], batch_size=batch_size, max_items=max_items)
        parts.append(compute() if cache_config is None else
                     cache.memo("free_moe_scorecard", dict(cache_config, step="scorecard", task=t, max_items=max_items,
                                                           batch_size=batch_size), compute))
    items = pd.concat(parts, ignore_index=True)
    if cache_config is None:
        return scorecard.summarize(items, model_name)
    # the rule's baselines (options-only classifiers over each task's pool) take seconds per task: cached by scores
    return cache.memo("free_moe_scorecard", dict(cache_config, step="scorecard-rule", model_name=model_name,
                                                 scores=cache.key({"csv": items.to_csv(index=False)})),
                      lambda: scorecard.summarize(items, model_name))
