"""Base-model scorecard: which moelab LM tasks SmolLM2-135M-Instruct and Gemma-3-270M solve above chance.
Notebooks pick their evaluation tasks with ``usable_tasks(model_name)``.

For every task in ``lmeval.TASKS`` on a fixed item subset (``LIMITS``, the first items of each task's seeded
pool): mean score, percentile-bootstrap 95% interval over items (``moelab.stats.bootstrap_ci``), chance level and
``usable``:
- accuracy tasks: chance = mean over the evaluated items of 1 / #options (0 for generation tasks: GSM exact
  match, HumanEval pass@1); usable = CI lower end > chance;
- bits-per-byte tasks (``moelab_nll_*``): chance = 8 bits per byte (a uniform distribution over byte values);
  usable = CI upper end < chance.

Usability rule for multiple-choice tasks: a task is usable for a model only if the model beats
**each** of three baselines on the scored items (``moelab.suite.baselines``, per-item correctness): chance
(1/#options), the best always-same-position baseline and the best question-blind baseline (fixed heuristics on
the options alone and a logistic regression on the options cross-validated over the task's evaluation pool;
both "best" baselines are chosen on the scored items, so they are optimistic). The test, per baseline: a
one-sided paired test at 5% on the items: the lower end of the one-sided 95% percentile-bootstrap interval of
the mean per-item difference (model - baseline; ``moelab.stats.paired_bootstrap``, 2,000 resamples over items,
seed 0) must be above 0. Requiring all three to reject is an intersection-union test, so the rule's level is 5%
without a multiplicity correction. ``status`` is ``usable`` / ``not usable`` / ``needs rebuild``: per-item scores
count only if they carry the option order the items were scored with (column ``option_order``, written by
``per_item_scores``) and it equals the current order (``lmeval.option_order_text``); scores measured before the
seeded option shuffle (no such column) or with another order mark the task ``needs rebuild`` (never usable)
instead of being compared with baselines of prompts the model never saw. This applies to every task whose items
list options (the multiple-choice tasks and ``moelab_nll_reasoning``, whose contexts are those prompts).
The table is committed as ``data/scorecard.csv`` (per-item scores in ``data/scorecard_items.csv``);
``load()`` rebuilds it only if the file is absent; ``usable_tasks`` applies the rule to the per-item file. ``python -m moelab.suite.scorecard build [--model M]``
measures one or both models resumably: each finished task's per-item scores go to
``<cache>/scorecard/<model>.csv`` at once, a rerun skips tasks already measured at the current limit, and
``python -m moelab.suite.scorecard write`` merges the per-model files into ``data/``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from moelab import assets, progress, stats
from moelab.cache import cache_root
from moelab.suite import baselines, lmeval

DATA = Path(__file__).resolve().parents[3] / "data"
CSV = DATA / "scorecard.csv"
ITEMS_CSV = DATA / "scorecard_items.csv"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
BPB_CHANCE = 8.0
ALPHA = 0.05  # one-sided level of each paired test of the usability rule
N_BOOT = 2000
STATUSES = ("usable", "not usable", "needs rebuild")
# Items per task for the scorecard (first items of each fixed pool, or the whole pool where smaller). Sized with the
# one scorer (3.8x / 7.0x lm-eval's HFLM on multi-token multiple choice for SmolLM2 / Gemma-3) so that both
# models fit in about an hour on this 2-core CPU: 300 items give a +-0.057 interval at accuracy 0.5 (100 gave +-0.1);
# the 15-option colored-objects task gets 200; the two generation tasks (greedy decoding of up to 160/256 tokens,
# lm-eval's generation path, not sped up) keep 40; penguins has 89 items in all, nll_code 164.
LIMITS = {"mc": 300, "moelab_bb_reasoning_about_colored_objects": 200, "moelab_bb_penguins_in_a_table": 89,
          "moelab_gsm": 40, "moelab_humaneval": 40, "nll": 200}


def _limit(task: str) -> int:
    if task in LIMITS:
        return LIMITS[task]
    return LIMITS["nll"] if task.startswith("moelab_nll_") else LIMITS["mc"]


def load_model(name: str):
    """(model, tokenizer) of a scorecard model, through ``moelab.assets``."""
    if name == "smollm2-135m-instruct":
        return assets.load_smollm2()
    if name == "gemma-3-270m":
        return assets.load_gemma3()
    raise ValueError(f"unknown scorecard model {name!r}; known: {MODELS}")


def per_item_scores(model, tok, tasks=None, batch_size: int = 8, on_task=None, max_items: int | None = None):
    """Per-item scores on every task, one lm-eval call per task with its own fixed subset (``_limit``), with the
    option order each item was scored with (``with_option_order``).

    ``on_task(task, df)`` is called after each task (e.g. to save partial results of a long run).
    """

    out = []
    for t in progress.bar(list(tasks or lmeval.TASKS), desc="scorecard tasks", unit="task"):
        df = lmeval.evaluate(model, tok, [t], limit=_limit_n(t, max_items), batch_size=batch_size)
        df = with_option_order(df)
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


def _docs(task: str) -> dict:
    return {d["id"]: d for d in lmeval.task_docs(task[len("moelab_"):])}


def with_option_order(df: pd.DataFrame) -> pd.DataFrame:
    """Per-item scores plus column ``option_order``: the order of each item's options when it was scored
    (``lmeval.option_order_text``; empty for tasks whose items list no options)."""
    orders = {}
    for task in df["task"].unique():
        for i, d in _docs(task).items():
            orders[(task, i)] = d.get("option_order", "")
    return df.assign(option_order=[orders.get((t, i), "") for t, i in zip(df["task"], df["item_id"])])


@functools.lru_cache(maxsize=None)
def task_baselines(task: str) -> pd.DataFrame:
    """Per-item correctness of every baseline on a multiple-choice task's evaluation pool
    (``baselines.per_item`` on ``lmeval.task_docs``; the cross-validated model is fitted across the pool)."""
    return baselines.per_item(lmeval.task_docs(task[len("moelab_"):])).set_index("item_id")


def beats(model_scores, baseline_scores, alpha: float = ALPHA, n_boot: int = N_BOOT, seed: int = 0):
    """One-sided paired test of "the model beats the baseline" on per-item scores: returns
    ``(mean difference, lower end of the one-sided (1 - alpha) bootstrap interval, beats)``, beats = lower > 0."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    est, lo, _ = stats.paired_bootstrap(model_scores, baseline_scores, n_boot=n_boot, seed=seed,
                                        level=1 - 2 * alpha)
    return est, lo, bool(lo > 0)


def mc_usability(scores, base: pd.DataFrame, alpha: float = ALPHA, n_boot: int = N_BOOT) -> dict:
    """The usability rule on one task (see module docstring): ``scores`` per-item 0/1 accuracy, ``base`` the
    per-item baselines of the same items in the same order (a ``baselines.per_item`` table).

    Returns chance / best position / best question-blind accuracies, each test's lower bound and ``usable``."""
    a = np.asarray(scores, float)
    if len(a) != len(base):
        raise ValueError(f"{len(a)} model scores but {len(base)} baseline rows: pass the same items")
    pos = [c for c in base.columns if c.startswith("pos_")]
    blind = baselines.blind_columns(base)
    if not pos or not blind or "chance" not in base.columns:
        raise ValueError(f"baseline table lacks chance / pos_* / question-blind columns: {list(base.columns)}")
    best_pos = max(pos, key=lambda c: base[c].mean())
    best_blind = max(blind, key=lambda c: base[c].mean())
    out = dict(chance=float(base["chance"].mean()), best_position=int(best_pos[4:]),
               position_acc=float(base[best_pos].mean()), blind_baseline=best_blind,
               blind_acc=float(base[best_blind].mean()))
    ok = True
    for name, col in (("chance", "chance"), ("position", best_pos), ("blind", best_blind)):
        _, lo, b = beats(a, base[col].to_numpy(), alpha=alpha, n_boot=n_boot)
        out[f"diff_low_{name}"] = lo
        ok &= b
    out["usable"] = bool(ok)
    return out


def summarize(items, model_name: str):
    """Scorecard rows (model, task, metric, n, acc, ci_low, ci_high, chance, position_acc, blind_acc, status,
    usable) from per-item scores, with the usability rule of the module docstring."""
    rows = []
    for task, g in items.groupby("task", sort=True):
        metric = lmeval.PRIMARY_METRIC[task]
        g = g[g.metric == metric]
        if g.empty:
            raise ValueError(f"no {metric!r} scores for task {task!r}")
        est, lo, hi = stats.bootstrap_ci(g["score"].to_numpy(), n_boot=N_BOOT, seed=0)
        ch = chance_level(task, g["item_id"])
        row = dict(model=model_name, task=task, metric=metric, n=len(g), acc=est, ci_low=lo, ci_high=hi, chance=ch)
        docs = _docs(task) if metric not in ("exact_match", "pass@1") else {}
        ordered = any("option_order" in d for d in docs.values())
        if ordered:
            now = [docs[i].get("option_order", "") for i in g["item_id"]]
            if "option_order" not in g.columns or list(g["option_order"].fillna("").astype(str)) != now:
                rows.append(dict(row, status="needs rebuild", usable=False,
                                 reason="per-item scores lack the current option order (scored before the "
                                        "seeded shuffle or with another order)"))
                continue
        if metric == "acc":
            base = task_baselines(task).loc[list(g["item_id"])]
            r = mc_usability(g["score"].to_numpy(), base)
            usable = r.pop("usable")
            rows.append(dict(row, **{k: v for k, v in r.items() if k != "chance"},
                             status="usable" if usable else "not usable", usable=usable,
                             reason="beats chance, best position and question-blind baselines" if usable else
                             "does not beat " + ", ".join(k[9:] for k in ("diff_low_chance", "diff_low_position",
                                                                          "diff_low_blind") if r[k] <= 0)))
            continue
        usable = hi < ch if metric == "bpb" else lo > ch
        rows.append(dict(row, status="usable" if usable else "not usable", usable=bool(usable),
                         reason="CI clear of chance" if usable else "CI overlaps chance"))
    return pd.DataFrame(rows)


MDE_ITEMS = (100, 500, 2000)
# Share of items on which two variants of one model (base vs DOWP-purified, notebook 05's committed run) disagree:
# the paired per-item difference of two 0/1 scores has variance q - Δ² ≈ q, so its s.d. is about √q.
PAIRED_DISAGREEMENT = 0.28
MDE_CSV = DATA / "scorecard_mde.csv"   # written by ``write`` beside the scorecard


def mde_table(items: pd.DataFrame, n_items=MDE_ITEMS, disagreement: float = PAIRED_DISAGREEMENT,
              alpha: float = 0.05, power: float = 0.80) -> pd.DataFrame:
    """Smallest effect a two-sided level-``alpha`` test detects with probability ``power`` on ``n`` items of each task
    (``stats.minimum_detectable_effect`` with SE = s.d. / √n, large-sample df), per model and task:

    - ``mde_one_sample_<n>``: a model's mean score against a fixed value (chance, a paper's number), s.d. = the per-item
      s.d. of the model's primary metric measured on the scorecard's items;
    - ``mde_paired_<n>`` (accuracy tasks): two variants of one model scored on the same items, s.d. = √q with q the
      share of items on which they disagree (``disagreement``, default 05's measured 28%; for bits per byte the
      paired s.d. depends on the two variants and is not given).

    ``pool``: items the task has; counts above it cannot be reached (the MDE is then what the item count would give,
    marked by ``n > pool``)."""
    rows = []
    for (model, task), g in items.groupby(["model", "task"], sort=True):
        metric = lmeval.PRIMARY_METRIC[task]
        x = g.loc[g.metric == metric, "score"].to_numpy(float)
        if len(x) < 2:
            continue
        sd = float(np.std(x, ddof=1))
        row = dict(model=model, task=task, metric=metric, n_measured=len(x), pool=len(_docs(task)), sd_item=sd)
        for n in n_items:
            row[f"mde_one_sample_{n}"] = stats.minimum_detectable_effect(sd / np.sqrt(n), 10**6, alpha, power)
            row[f"mde_paired_{n}"] = (stats.minimum_detectable_effect(np.sqrt(disagreement / n), 10**6, alpha, power)
                                      if metric == "acc" else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def mde_markdown(mde: pd.DataFrame, n_items=MDE_ITEMS) -> str:
    """The MDE table as markdown, one row per (model, task): accuracy tasks in points (x100), bits per byte as is."""
    head = ["model", "task", "metric", "items (pool)", "item s.d."]
    head += [f"one-sample {n}" for n in n_items] + [f"paired {n}" for n in n_items]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in mde.itertuples(index=False):
        points = r.metric != "bpb"       # accuracy, exact match, pass@1: proportions, shown in points (x100)
        fmt = (lambda v, k=100.0 if points else 1.0, d=1 if points else 3: "" if pd.isna(v) else f"{v * k:.{d}f}")
        cells = [r.model, r.task.removeprefix("moelab_"), f"{r.metric} (points)" if points else r.metric,
                 f"{r.n_measured} ({r.pool})", fmt(r.sd_item)]
        cells += [fmt(getattr(r, f"mde_one_sample_{n}")) + ("*" if n > r.pool else "") for n in n_items]
        cells += [fmt(getattr(r, f"mde_paired_{n}")) + ("*" if n > r.pool and r.metric == "acc" else "")
                  for n in n_items]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def partial_path(model_name: str) -> Path:
    """Per-item scores of one model, written task by task while ``build`` runs (in the moelab cache)."""
    return cache_root() / "scorecard" / f"{model_name}.csv"


def build(models=MODELS, path: Path = CSV, items_path: Path = ITEMS_CSV, tasks=None, threads: int | None = None,
          max_items: int | None = None):
    """Measure ``models`` on ``tasks`` (default: all) resumably and write both CSV files (CPU-heavy).

    Tasks already in ``partial_path(model)`` with at least ``_limit_n(task, max_items)`` items are not measured
    again (``max_items`` caps every task's limit, for a model too slow for the full subsets).
    """
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
    """Write the scorecard from the per-model partial files of ``build``; tasks a partial file lacks (or a model
    without one) keep their rows from the existing ``items_path`` (e.g. the committed scores of a task not yet
    measured again: their ``status`` then says whether they are still current)."""

    old = pd.read_csv(items_path, dtype={"option_order": str}) if Path(items_path).exists() else None
    parts = []
    for name in models:
        new = (pd.read_csv(partial_path(name), dtype={"option_order": str}).assign(model=name)
               if partial_path(name).exists() else None)
        if new is not None:
            parts.append(new)
        if old is not None and name in set(old.model):
            kept = old[(old.model == name) & ~old.task.isin(set() if new is None else set(new.task))]
            if len(kept):
                parts.append(kept)
    if not parts:
        raise ValueError(f"no per-model scorecard files under {partial_path(models[0]).parent}; run build first")
    items = pd.concat(parts, ignore_index=True)
    return write(items[["model"] + [c for c in items.columns if c != "model"]], path, items_path)


def write(items, path: Path = CSV, items_path: Path = ITEMS_CSV):
    """Summarise per-item scores of one or more models (column ``model``) and write both CSV files."""

    table = pd.concat([summarize(g.drop(columns="model"), m) for m, g in items.groupby("model", sort=False)],
                      ignore_index=True)
    table.to_csv(path, index=False, float_format="%.4f")
    items.to_csv(items_path, index=False)
    mde_table(items).to_csv(Path(path).with_name(Path(path).stem + "_mde.csv"), index=False, float_format="%.4f")
    return table


def load():
    """The committed scorecard (model, task, metric, n, acc, ci_low, ci_high, chance, usable); rebuilt if absent."""

    if not CSV.exists():
        build()
    df = pd.read_csv(CSV)
    need = {"model", "task", "acc", "ci_low", "ci_high", "chance", "usable"}
    if not need <= set(df.columns):
        raise ValueError(f"{CSV} lacks columns {sorted(need - set(df.columns))}; delete it to rebuild")
    return df


def usability(model_name: str, items_path: Path = ITEMS_CSV) -> pd.DataFrame:
    """The usability rule (module docstring) applied to the committed per-item scores of ``model_name``: one row
    per task with ``status`` in ``STATUSES`` and the reason."""
    if not Path(items_path).exists():
        load()  # builds the scorecard (and its per-item file) if absent
    items = pd.read_csv(items_path, dtype={"option_order": str})
    if model_name not in set(items.model):
        raise ValueError(f"model {model_name!r} is not in the scorecard (has {sorted(set(items.model))})")
    return summarize(items[items.model == model_name].drop(columns="model"), model_name)


def usable_tasks(model_name: str, items_path: Path = ITEMS_CSV) -> list[str]:
    """Tasks whose status is ``usable`` for ``model_name`` under the usability rule (``usability``)."""
    df = usability(model_name, items_path)
    return sorted(df[df.status == "usable"].task)


DOC = DATA.parent / "docs" / "scorecard.md"


def write_doc(table: pd.DataFrame, mde: pd.DataFrame, path: Path = DOC) -> None:
    """``docs/scorecard.md``: the scorecard (status per model and task) and the MDE table, from the committed CSVs."""
    cols = ["model", "task", "metric", "n", "acc", "ci_low", "ci_high", "chance", "status"]
    t = table.assign(task=table.task.str.removeprefix("moelab_"))[cols]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in t.itertuples(index=False):
        rows.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    usable_text = " ".join(
        f"**{m}**: usable on {', '.join(g.task[g.status == 'usable']) or 'no task'}"
        f" ({int((g.status == 'usable').sum())} of {len(g)})." for m, g in t.groupby("model", sort=False))
    text = f"""# Base-model scorecard and the effects its tasks can detect

Written by `python -m moelab.suite.scorecard build | write` from `data/scorecard_items.csv` (per-item scores through
the one scorer, `moelab.suite.scorer`); the rule behind `status` is in `lib/moelab/suite/scorecard.py` (a multiple-choice
task is usable only if the model beats chance, the best always-same-position baseline and the best question-blind
baseline in one-sided paired tests at 5%; a bits-per-byte task if its interval is below 8 bits per byte).

## Scorecard

{usable_text}

{chr(10).join(rows)}

## Minimum detectable effect per item count

Smallest effect a two-sided 5% test detects with 80% power on n items (`scorecard.mde_table`, normal quantiles):
**one-sample** = a model's mean against a fixed value (a paper's number, chance), from the per-item s.d. measured here;
**paired** = two variants of one model on the same items (how notebooks 01 and 05 compare methods), s.d. = √q with
q = {PAIRED_DISAGREEMENT:.2f}, the share of items on which notebook 05's base and purified models disagree (a lower q gives
a smaller MDE: MDE ∝ √q). Accuracy in points (x100), bits per byte as is. `*`: more items than the task's pool holds
(pools are capped at 500 items, except the 5,112-item nll_reasoning). The paper-size effects (e.g. Free-MoE's +2 points)
need about {int(np.ceil((stats.minimum_detectable_effect(1.0, 10**6) / 0.02) ** 2 * PAIRED_DISAGREEMENT)):,} items
at q = {PAIRED_DISAGREEMENT:.2f}.

{mde_markdown(mde)}"""
    path.write_text(text)


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
    write_doc(table, pd.read_csv(MDE_CSV))
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
