"""Base-model scorecard: which moelab LM tasks SmolLM2-135M-Instruct and Gemma-3-270M solve above chance
(issue 4, item 4). Notebooks pick their evaluation tasks with ``usable_tasks(model_name)``.

For every task in ``lmeval.TASKS`` on a fixed item subset (``LIMITS``, the first items of each task's seeded
pool): mean score, percentile-bootstrap 95% interval over items (``moelab.stats.bootstrap_ci``), chance level and
``usable``:
- accuracy tasks: chance = mean over the evaluated items of 1 / #options (0 for generation tasks: GSM exact
  match, HumanEval pass@1); usable = CI lower end > chance;
- bits-per-byte tasks (``moelab_nll_*``): chance = 8 bits per byte (a uniform distribution over byte values);
  usable = CI upper end < chance.
The table is committed as ``data/scorecard.csv`` (per-item scores in ``data/scorecard_items.csv``);
``load()`` rebuilds it (about an hour of CPU) only if the file is absent. The committed table is partial
(SmolLM2 only, 11 of 20 tasks; see data/README.md).
"""
from __future__ import annotations

from pathlib import Path

from moelab.suite import lmeval

DATA = Path(__file__).resolve().parents[3] / "data"
CSV = DATA / "scorecard.csv"
ITEMS_CSV = DATA / "scorecard_items.csv"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
BPB_CHANCE = 8.0
# Items per task for the scorecard (CPU budget on a shared 2-core machine); first items of each fixed pool.
# Measured here with load ~20 on 2 cores, a 135M model scores about one multiple-choice option per CPU-second,
# so the committed scorecard uses small subsets (intervals are wide; "usable" is conservative).
LIMITS = {"mc": 30, "moelab_bb_reasoning_about_colored_objects": 16, "moelab_bb_penguins_in_a_table": 16,
          "moelab_gsm": 8, "moelab_humaneval": 12, "nll": 30}


def _limit(task: str) -> int:
    if task in LIMITS:
        return LIMITS[task]
    return LIMITS["nll"] if task.startswith("moelab_nll_") else LIMITS["mc"]


def load_model(name: str):
    """(model, tokenizer) of a scorecard model, through ``moelab.assets``."""
    from moelab import assets

    if name == "smollm2-135m-instruct":
        return assets.load_smollm2()
    if name == "gemma-3-270m":
        return assets.load_gemma3()
    raise ValueError(f"unknown scorecard model {name!r}; known: {MODELS}")


def per_item_scores(model, tok, tasks=None, batch_size: int = 8, on_task=None):
    """Per-item scores on every task, one lm-eval call per task with its own fixed subset (``_limit``).

    ``on_task(task, df)`` is called after each task (e.g. to save partial results of a long run).
    """
    import pandas as pd

    out = []
    for t in list(tasks or lmeval.TASKS):
        df = lmeval.evaluate(model, tok, [t], limit=_limit(t), batch_size=batch_size)
        out.append(df)
        if on_task is not None:
            on_task(t, df)
    return pd.concat(out, ignore_index=True)


def chance_level(task: str, item_ids) -> float:
    """Chance score of ``task`` on the given items (see module docstring)."""
    metric = lmeval.PRIMARY_METRIC[task]
    if metric == "bpb":
        return BPB_CHANCE
    if metric in ("exact_match", "pass@1"):
        return 0.0
    name = task[len("moelab_"):]
    docs = {d["id"]: d for d in lmeval.task_docs(name)}
    ids = list(item_ids)
    missing = [i for i in ids if i not in docs]
    if missing:
        raise ValueError(f"items {missing[:3]} are not in task {task!r}")
    return float(sum(1.0 / len(docs[i]["choices"]) for i in ids) / len(ids))


def summarize(items, model_name: str):
    """Scorecard rows (model, task, metric, n, acc, ci_low, ci_high, chance, usable) from per-item scores."""
    import pandas as pd

    from moelab.stats import bootstrap_ci

    rows = []
    for task, g in items.groupby("task", sort=True):
        metric = lmeval.PRIMARY_METRIC[task]
        g = g[g.metric == metric]
        if g.empty:
            raise ValueError(f"no {metric!r} scores for task {task!r}")
        est, lo, hi = bootstrap_ci(g["score"].to_numpy(), n_boot=2000, seed=0)
        ch = chance_level(task, g["item_id"])
        usable = hi < ch if metric == "bpb" else lo > ch
        rows.append(dict(model=model_name, task=task, metric=metric, n=len(g), acc=est, ci_low=lo, ci_high=hi,
                         chance=ch, usable=bool(usable)))
    return pd.DataFrame(rows)


def build(models=MODELS, path: Path = CSV, items_path: Path = ITEMS_CSV):
    """Compute the scorecard for ``models`` (CPU-heavy: run it niced) and write both CSV files."""
    import pandas as pd
    import torch

    tables, all_items = [], []
    for name in models:
        model, tok = load_model(name)
        with torch.no_grad():
            items = per_item_scores(model, tok)
        items.insert(0, "model", name)
        all_items.append(items)
        tables.append(summarize(items, name))
        del model
    table = pd.concat(tables, ignore_index=True)
    table.to_csv(path, index=False, float_format="%.4f")
    pd.concat(all_items, ignore_index=True).to_csv(items_path, index=False)
    return table


def write(items, path: Path = CSV, items_path: Path = ITEMS_CSV):
    """Summarise per-item scores of one or more models (column ``model``) and write both CSV files."""
    import pandas as pd

    table = pd.concat([summarize(g.drop(columns="model"), m) for m, g in items.groupby("model", sort=False)],
                      ignore_index=True)
    table.to_csv(path, index=False, float_format="%.4f")
    items.to_csv(items_path, index=False)
    return table


def load():
    """The committed scorecard (model, task, metric, n, acc, ci_low, ci_high, chance, usable); rebuilt if absent."""
    import pandas as pd

    if not CSV.exists():
        build()
    df = pd.read_csv(CSV)
    need = {"model", "task", "acc", "ci_low", "ci_high", "chance", "usable"}
    if not need <= set(df.columns):
        raise ValueError(f"{CSV} lacks columns {sorted(need - set(df.columns))}; delete it to rebuild")
    return df


def usable_tasks(model_name: str) -> list[str]:
    """Tasks on which ``model_name`` is usable (CI clear of chance), from ``load()``."""
    df = load()
    if model_name not in set(df.model):
        raise ValueError(f"model {model_name!r} is not in the scorecard (has {sorted(set(df.model))})")
    return sorted(df[(df.model == model_name) & df.usable.astype(bool)].task)
