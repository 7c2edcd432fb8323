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
``load()`` rebuilds it only if the file is absent. ``python -m moelab.suite.scorecard build [--model M]``
measures one or both models resumably: each finished task's per-item scores go to
``<cache>/scorecard/<model>.csv`` at once, a rerun skips tasks already measured at the current limit, and
``python -m moelab.suite.scorecard write`` merges the per-model files into ``data/``.
"""
from __future__ import annotations

from pathlib import Path

from moelab.suite import lmeval

DATA = Path(__file__).resolve().parents[3] / "data"
CSV = DATA / "scorecard.csv"
ITEMS_CSV = DATA / "scorecard_items.csv"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
BPB_CHANCE = 8.0
# Items per task for the scorecard (first items of each fixed pool), sized so that both models fit in about an
# hour on this 2-core CPU: 100 items give a +-0.1 interval at accuracy 0.5; the 15-option colored-objects task and
# the two generation tasks (greedy decoding of up to 160/256 tokens) get fewer; penguins has 89 items in all.
LIMITS = {"mc": 100, "moelab_bb_reasoning_about_colored_objects": 60, "moelab_bb_penguins_in_a_table": 89,
          "moelab_gsm": 40, "moelab_humaneval": 40, "nll": 100}


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


def per_item_scores(model, tok, tasks=None, batch_size: int = 8, on_task=None, max_items: int | None = None):
    """Per-item scores on every task, one lm-eval call per task with its own fixed subset (``_limit``).

    ``on_task(task, df)`` is called after each task (e.g. to save partial results of a long run).
    """
    import pandas as pd

    out = []
    for t in list(tasks or lmeval.TASKS):
        df = lmeval.evaluate(model, tok, [t], limit=_limit_n(t, max_items), batch_size=batch_size)
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


def partial_path(model_name: str) -> Path:
    """Per-item scores of one model, written task by task while ``build`` runs (in the moelab cache)."""
    from moelab.cache import cache_root

    return cache_root() / "scorecard" / f"{model_name}.csv"


def build(models=MODELS, path: Path = CSV, items_path: Path = ITEMS_CSV, tasks=None, threads: int | None = None,
          max_items: int | None = None):
    """Measure ``models`` on ``tasks`` (default: all) resumably and write both CSV files (CPU-heavy).

    Tasks already in ``partial_path(model)`` with at least ``_limit_n(task, max_items)`` items are not measured
    again (``max_items`` caps every task's limit, for a model too slow for the full subsets).
    """
    import pandas as pd
    import torch

    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown scorecard model(s) {unknown}; known: {MODELS}")
    if threads:
        torch.set_num_threads(threads)
    for name in models:
        part = partial_path(name)
        part.parent.mkdir(parents=True, exist_ok=True)
        done = pd.read_csv(part) if part.exists() else pd.DataFrame(columns=["task", "item_id", "metric", "score"])
        counts = done.groupby("task").item_id.nunique().to_dict() if len(done) else {}
        todo = [t for t in (tasks or lmeval.TASKS) if counts.get(t, 0) < _limit_n(t, max_items)]
        done = done[~done.task.isin(todo)]
        if not todo:
            continue
        model, tok = load_model(name)

        def save(task, df, _name=name, _part=part):
            nonlocal done
            done = pd.concat([done, df], ignore_index=True)
            done.to_csv(_part, index=False)
            print(f"[scorecard] {_name} {task}: {df.item_id.nunique()} items", flush=True)

        with torch.no_grad():
            per_item_scores(model, tok, todo, on_task=save, max_items=max_items)
        del model
    return merge(path=path, items_path=items_path)


def _limit_n(task: str, max_items: int | None = None) -> int:
    """Items a task actually yields at its limit (the pool may be smaller; ``max_items`` caps it)."""
    return min(_limit(task), len(lmeval.task_docs(task[len("moelab_"):])), max_items or 10**9)


def merge(models=MODELS, path: Path = CSV, items_path: Path = ITEMS_CSV):
    """Write the scorecard from the per-model partial files of ``build``; a model without a partial file keeps its
    rows from the existing ``items_path`` (e.g. the committed scores on a machine that did not measure it)."""
    import pandas as pd

    old = pd.read_csv(items_path) if Path(items_path).exists() else None
    parts = []
    for name in models:
        if partial_path(name).exists():
            parts.append(pd.read_csv(partial_path(name)).assign(model=name))
        elif old is not None and name in set(old.model):
            parts.append(old[old.model == name])
    if not parts:
        raise ValueError(f"no per-model scorecard files under {partial_path(models[0]).parent}; run build first")
    items = pd.concat(parts, ignore_index=True)
    return write(items[["model"] + [c for c in items.columns if c != "model"]], path, items_path)


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


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m moelab.suite.scorecard", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="measure (resumable), then write data/scorecard*.csv")
    b.add_argument("--model", choices=MODELS, action="append", help="default: both")
    b.add_argument("--task", action="append", choices=lmeval.TASKS, help="default: all")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--max-items", type=int, default=None, help="cap on every task's item count")
    sub.add_parser("write", help="merge the per-model files into data/scorecard*.csv")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        table = build(tuple(a.model or MODELS), tasks=a.task, threads=a.threads, max_items=a.max_items)
    else:
        table = merge()
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
