"""The maths / code / reasoning instruction mix (MoCE notebook 01, Free-MoE notebook 05).

``build(profile) -> {"train": [...], "validation": [...], "test": [...]}``, each record
``dict(id, instruction, answer, domain, source, task)``:

- maths: BIG-bench ``elementary_math_qa`` (question with five options -> the correct option) and templated
  GSM8K-style word problems (``mathgen``; worked answer ending ``#### <number>``). The split is by template:
  ``mathgen.HELD_OUT`` templates appear only in ``test``.
- code: Python standard-library functions, "write a function `sig` that <docstring summary>" -> the function
  (``codegen``); split by module. HumanEval is never in the mix: it is held out for evaluation.
- reasoning/knowledge: BIG-bench multiple-choice tasks. ``REASONING_TRAIN_TASKS`` contribute training
  examples and keep a held-out evaluation pool; ``REASONING_HELDOUT_TASKS`` are held out as whole tasks.

Every training and validation record is checked against every evaluation item (all ``test`` records, all
``lmeval`` task items, all HumanEval prompts): exact duplicates after normalisation and near-duplicates
(character 5-gram Jaccard >= 0.9, ``dedup``) are removed and counted in ``build_stats``.
Deterministic (seed 0) and cached with ``moelab.cache.memo``.

``build(profile)`` keeps every source's pool (maths and reasoning pools are 4-15x the code pool; notebook 05 reads its
code records). ``build_balanced(profile)`` (notebook 01) draws the *same number* of training and
validation records from each domain (:data:`BALANCED`), spread evenly over each domain's sources (maths: BIG-bench MC
and GSM-style; reasoning: one share per BIG-bench task), so no domain is starved; ``domain_counts`` tabulates a mix.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from moelab import assets, cache, profiles
from moelab.suite import bigbench, codegen, dedup, mathgen

VERSION = "instruct-v2"
SEED = 0
MATH_MC_TASK = "elementary_math_qa/question_only"
REASONING_TRAIN_TASKS = [
    "date_understanding", "logical_deduction/three_objects", "logical_deduction/five_objects",
    "tracking_shuffled_objects/three_objects", "hyperbaton", "formal_fallacies_syllogisms_negation", "navigate",
    "causal_judgment", "temporal_sequences", "reasoning_about_colored_objects", "penguins_in_a_table",
]
REASONING_HELDOUT_TASKS = ["disambiguation_qa", "winowhy", "sports_understanding"]
EVAL_POOL_MAX = 500  # evaluation pool per task (profiles evaluate a fixed prefix of it)
GSM_TEST_PER_TEMPLATE = 80

SIZES = {
    # per-source caps of the training split; test/validation caps per task
    "smoke": dict(math_mc=60, gsm_per_template=4, code=60, reasoning_per_task=20, test_per_task=5, val_per_task=5),
    "default": dict(math_mc=1500, gsm_per_template=80, code=None, reasoning_per_task=300, test_per_task=200,
                    val_per_task=50),
    "full": dict(math_mc=None, gsm_per_template=300, code=None, reasoning_per_task=3000, test_per_task=None,
                 val_per_task=None),
}
SIZES["paper"] = SIZES["full"]


def eval_pool_sizes(n: int) -> tuple[int, int]:
    """(evaluation pool, validation) sizes for a training task with ``n`` usable items."""
    n_eval = EVAL_POOL_MAX if n >= 800 else int(0.6 * n)
    return n_eval, min(200, (n - n_eval) // 4)


@functools.lru_cache(maxsize=None)
def task_splits(task: str) -> dict:
    """Seeded train/validation/test item lists of a BIG-bench task used by the suite (test = evaluation pool)."""
    items = bigbench.load_items(task)
    if task in REASONING_HELDOUT_TASKS:
        perm = bigbench.permutation(task, len(items), SEED)
        return dict(train=[], validation=[], test=[items[i] for i in perm[:EVAL_POOL_MAX]])
    n_eval, n_val = eval_pool_sizes(len(items))
    return bigbench.split_items(task, n_eval, n_val, SEED)


@functools.lru_cache(maxsize=None)
def gsm_splits(per_template: int = 300) -> dict:
    """GSM8K-style problems: train/validation from training templates (90/10 per template), test from held-out ones."""
    out = dict(train=[], validation=[], test=[])
    for t in mathgen.TEMPLATES:
        name = t.__name__
        if name in mathgen.HELD_OUT:
            out["test"].extend(mathgen.generate(name, GSM_TEST_PER_TEMPLATE, SEED))
        else:
            probs = mathgen.generate(name, per_template, SEED + 1)
            k = max(1, len(probs) // 10)
            out["validation"].extend(probs[:k])
            out["train"].extend(probs[k:])
    perm = np.random.default_rng(SEED).permutation(len(out["test"]))
    out["test"] = [out["test"][i] for i in perm]
    return out


def mc_record(item: dict, domain: str) -> dict:
    """A multiple-choice BIG-bench item as an instruction record (answer = the correct option's text)."""
    instr = item["prompt"][: -len("\nAnswer:")] if item["prompt"].endswith("\nAnswer:") else item["prompt"]
    return dict(id=item["id"], instruction=instr, answer=item["choices"][item["gold"]], domain=domain,
                source="bigbench", task=item["task"])


def gsm_record(p: dict) -> dict:
    return dict(id=p["id"], instruction=p["question"], answer=p["answer"], domain="maths", source="generated-gsm",
                task=f"gsm:{p['template']}")


def _cap(xs: list, n: int | None, seed: int) -> list:
    if n is None or len(xs) <= n:
        return list(xs)
    idx = np.sort(np.random.default_rng(seed).choice(len(xs), n, replace=False))
    return [xs[i] for i in idx]


def evaluation_texts() -> list[str]:
    """Every evaluation item's text (all pools, all profiles): the dedup reference."""
    texts = []
    for task in [MATH_MC_TASK, *REASONING_TRAIN_TASKS, *REASONING_HELDOUT_TASKS]:
        texts += [mc_record(it, "x")["instruction"] for it in task_splits(task)["test"]]
    texts += [p["question"] for p in gsm_splits()["test"]]
    texts += [p["prompt"] for p in assets.humaneval_problems().values()]
    return texts


def _build(profile: str) -> dict:
    sz = SIZES[profile]
    splits = dict(train=[], validation=[], test=[])
    # maths
    mc = task_splits(MATH_MC_TASK)
    splits["train"] += [mc_record(it, "maths") for it in _cap(mc["train"], sz["math_mc"], 1)]
    splits["validation"] += [mc_record(it, "maths") for it in _cap(mc["validation"], sz["val_per_task"], 2)]
    splits["test"] += [mc_record(it, "maths") for it in _cap(mc["test"], sz["test_per_task"], 3)]
    g = gsm_splits()
    per_t = sz["gsm_per_template"]
    by_t: dict[str, list] = {}
    for p in g["train"]:
        by_t.setdefault(p["template"], []).append(p)
    splits["train"] += [gsm_record(p) for ps in by_t.values() for p in ps[:per_t]]
    splits["validation"] += [gsm_record(p) for p in _cap(g["validation"], sz["val_per_task"], 4)]
    splits["test"] += [gsm_record(p) for p in _cap(g["test"], sz["test_per_task"], 5)]
    # code
    fns, _stats = codegen.stdlib_functions()
    by_split = {s: [codegen.as_instruction(f) | {"id": f"stdlib-{f['module']}.{f['name']}"} for f in fns
                    if codegen.module_split(f["module"], SEED) == s] for s in ("train", "validation", "test")}
    splits["train"] += _cap(by_split["train"], sz["code"], 6)
    splits["validation"] += _cap(by_split["validation"], sz["val_per_task"], 7)
    splits["test"] += _cap(by_split["test"], sz["test_per_task"], 8)
    # reasoning / knowledge
    for j, task in enumerate(REASONING_TRAIN_TASKS + REASONING_HELDOUT_TASKS):
        s = task_splits(task)
        splits["train"] += [mc_record(it, "reasoning") for it in _cap(s["train"], sz["reasoning_per_task"], 10 + j)]
        splits["validation"] += [mc_record(it, "reasoning") for it in _cap(s["validation"], sz["val_per_task"], 40 + j)]
        splits["test"] += [mc_record(it, "reasoning") for it in _cap(s["test"], sz["test_per_task"], 70 + j)]
    # dedup train and validation against every evaluation item (and validation against train)
    eval_texts = evaluation_texts() + [r["instruction"] for r in splits["test"]]
    stats = {}
    for name in ("train", "validation"):
        kept, counts = dedup.filter_against(splits[name], eval_texts)
        splits[name], stats[name] = kept, counts
    train_keys = {dedup.normalize(r["instruction"]) for r in splits["train"]}
    before = len(splits["validation"])
    splits["validation"] = [r for r in splits["validation"] if dedup.normalize(r["instruction"]) not in train_keys]
    stats["validation"]["in_train"] = before - len(splits["validation"])
    for name in splits:
        if not splits[name]:
            raise ValueError(f"instruction split {name!r} is empty for profile {profile!r}")
        perm = np.random.default_rng(SEED + 100).permutation(len(splits[name]))
        splits[name] = [splits[name][i] for i in perm]
    splits["_stats"] = stats
    return splits


def build(profile: str) -> dict:
    """The instruction mix for ``profile``: ``{"train", "validation", "test"}`` lists of records (see module doc).

    Cached (``moelab.cache.memo("instruct", ...)``); ``build_stats(profile)`` gives the dedup counts.
    """
    profiles.check_profile(profile)
    out = cache.memo("instruct", dict(version=VERSION, profile=profile, sizes=SIZES[profile], seed=SEED),
                     lambda: _build(profile))
    return {k: v for k, v in out.items() if not k.startswith("_")}


def build_stats(profile: str) -> dict:
    """Dedup counts of ``build(profile)``: per split, exact / near duplicates of evaluation items removed."""
    out = cache.memo("instruct", dict(version=VERSION, profile=profile, sizes=SIZES[profile], seed=SEED),
                     lambda: _build(profile))
    return out["_stats"]


# ------------------------------------------------------------------ the balanced mix (notebook 01)
DOMAINS = ("maths", "code", "reasoning")
# records per domain drawn by build_balanced (the code pool, 60 in smoke and 754 in default/full after dedup, bounds
# them): smoke 40 / 5, default 250 / 40, full and paper 750 / 90 (train / validation)
BALANCED = {"smoke": dict(train=40, validation=5), "default": dict(train=250, validation=40),
            "full": dict(train=750, validation=90)}
BALANCED["paper"] = BALANCED["full"]
BALANCE_RULE = dict(min_ratio=0.8)  # every domain >= 0.8 x the largest domain, in every profile and split


def _spread(records: list[dict], n: int, seed: int, key: str = "task") -> list[dict]:
    """``n`` records spread evenly over the values of ``key`` (round robin over the values in sorted order, each in a
    seeded random order; a value that runs out leaves its turns to the others)."""
    rng = np.random.default_rng(seed)
    groups = {}
    for r in records:
        groups.setdefault(r[key] if key != "task" or not r[key].startswith("gsm:") else "gsm", []).append(r)
    queues = [[g[i] for i in rng.permutation(len(g))] for _, g in sorted(groups.items())]
    out, r = [], 0
    while len(out) < n and any(r < len(q) for q in queues):
        out += [q[r] for q in queues if r < len(q)][: n - len(out)]
        r += 1
    return out


def balance(mix: dict, n_train: int, n_validation: int, seed: int = SEED) -> dict:
    """Equal per-domain counts: ``min(n, smallest domain pool)`` training and validation records from each of
    :data:`DOMAINS`, spread over each domain's tasks (GSM templates pooled as one source); records shuffled (seeded).
    ``test`` is kept whole: it is the evaluation pool, from which notebooks draw equal counts per domain
    (``moelab.moce.subsample(..., by="domain")``). A domain with no records -> ``ValueError`` naming it."""
    out = {"test": list(mix["test"])}
    for split, n in (("train", n_train), ("validation", n_validation)):
        pools = {d: [r for r in mix[split] if r["domain"] == d] for d in DOMAINS}
        empty = [d for d, p in pools.items() if not p]
        if empty:
            raise ValueError(f"instruction split {split!r} has no {empty} records: cannot balance the domains")
        per = min(n, *(len(p) for p in pools.values()))
        recs = [r for j, d in enumerate(DOMAINS) for r in _spread(pools[d], per, seed + 10 * j + len(split))]
        perm = np.random.default_rng(seed + 200).permutation(len(recs))
        out[split] = [recs[i] for i in perm]
    return out


def build_balanced(profile: str) -> dict:
    """The instruction mix of ``profile`` with equal per-domain training and validation counts (:data:`BALANCED`,
    drawn from ``build(profile)``'s deduplicated pools by :func:`balance`): ``{"train", "validation", "test"}``."""
    profiles.check_profile(profile)
    return balance(build(profile), **{f"n_{k}": v for k, v in BALANCED[profile].items()})


def domain_counts(mix: dict):
    """Records per split and domain: DataFrame(split, domain, n, share, ratio_to_max) (ratio to the split's largest
    domain; the balance rule :data:`BALANCE_RULE` asks for >= 0.8)."""
    rows = []
    for split in ("train", "validation", "test"):
        recs = mix.get(split, [])
        counts = {d: sum(r["domain"] == d for r in recs) for d in DOMAINS}
        top = max(counts.values()) or 1
        rows += [dict(split=split, domain=d, n=c, share=c / max(1, len(recs)), ratio_to_max=c / top)
                 for d, c in counts.items()]
    return pd.DataFrame(rows)
