"""BIG-bench text classification tasks: the GLUE stand-in of the MASS notebook 04.

GLUE is not obtainable offline. ``CANDIDATES`` are BIG-bench tasks whose examples share one fixed label set
(NLI-like entailment, fact verification, intent detection, dialogue attribution, ...). Each was measured once
(``validate()``): all-MiniLM-L6-v2 with a fresh linear head fine-tuned briefly (``FT`` settings) on the train
split, accuracy on the test split with a percentile-bootstrap 95% interval; a task is kept (``USABLE``, written
to ``data/textcls_validation.csv``) only if the interval's lower end is above chance (the majority-class rate
of the test split, which is at least 1 / #labels).

``tasks(profile) -> {name: dict(train, validation, test, labels, chance)}``; splits are lists of
``(text, label_index)``, seeded (seed 0): test = first 200 of a permutation, validation = next 100, train = rest
(capped per profile).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from moelab import assets, profiles, progress
from moelab.seed import seed_everything
from moelab.stats import bootstrap_ci
from moelab.suite import bigbench

CANDIDATES = ["intent_recognition", "epistemic_reasoning", "vitaminc_fact_verification", "logical_fallacy_detection",
              "play_dialog_same_or_different", "presuppositions_as_nli", "metaphor_boolean", "sports_understanding"]
CSV = Path(__file__).resolve().parents[3] / "data" / "textcls_validation.csv"
N_TEST, N_VAL = 200, 100
TRAIN_CAP = {"smoke": 32, "default": 1000, "full": None, "paper": None}
TEST_CAP = {"smoke": 16, "default": None, "full": None, "paper": None}
FT = dict(train_examples=512, epochs=2, batch_size=16, lr=5e-5, max_length=128, seed=0)


def _task_splits(task: str) -> dict:
    items = bigbench.load_items(task)
    labels = sorted({tuple(sorted(it["choices"])) for it in items}, key=lambda x: -sum(
        tuple(sorted(it["choices"])) == x for it in items))[0]
    items = [it for it in items if tuple(sorted(it["choices"])) == labels]  # keep the dominant label set
    if len(items) < N_TEST + N_VAL + 20:
        raise ValueError(f"text classification task {task!r} has only {len(items)} items with one label set")
    data = [(it["input"], labels.index(it["choices"][it["gold"]])) for it in items]
    perm = bigbench.permutation(task, len(data), bigbench.SEED)
    data = [data[i] for i in perm]
    test, val, train = data[:N_TEST], data[N_TEST:N_TEST + N_VAL], data[N_TEST + N_VAL:]
    counts = np.bincount([y for _, y in test], minlength=len(labels))
    return dict(train=train, validation=val, test=test, labels=list(labels), chance=float(counts.max() / len(test)))


def usable() -> list[str]:
    """Tasks whose committed validation shows the fine-tuned MiniLM above chance (CI lower end)."""
    import pandas as pd

    if not CSV.exists():
        raise ValueError(f"{CSV} is missing: run moelab.suite.textcls.validate()")
    df = pd.read_csv(CSV)
    return sorted(df[df.usable.astype(bool)].task)


def tasks(profile: str, names=None) -> dict:
    """The usable text classification tasks (or ``names``) with their splits for ``profile``."""
    profiles.check_profile(profile)
    names = list(names) if names is not None else usable()
    out = {}
    for t in names:
        if t not in CANDIDATES:
            raise ValueError(f"{t!r} is not a text classification candidate ({CANDIDATES})")
        s = _task_splits(t)
        cap, tcap = TRAIN_CAP[profile], TEST_CAP[profile]
        s["train"] = s["train"][:cap] if cap else s["train"]
        if tcap:
            s["test"], s["validation"] = s["test"][:tcap], s["validation"][:tcap]
        if not s["train"] or not s["test"]:
            raise ValueError(f"text classification task {t!r} has an empty split for profile {profile!r}")
        out[t] = s
    return out


def finetune_eval(task: dict, ft: dict = FT):
    """Fine-tune all-MiniLM-L6-v2 + linear head on ``task['train']``; per-item correctness on ``task['test']``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    seed_everything(ft["seed"])
    path = str(assets.minilm_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(task["labels"]))
    train = task["train"][: ft["train_examples"]]
    opt = torch.optim.AdamW(model.parameters(), lr=ft["lr"])
    model.train()
    rng = np.random.default_rng(ft["seed"])
    per_epoch = -(-len(train) // ft["batch_size"])
    bar = progress.bar(total=ft["epochs"] * per_epoch, desc="text-cls fine-tune", unit="step")
    for _ in range(ft["epochs"]):
        order = rng.permutation(len(train))
        for s in range(0, len(order), ft["batch_size"]):
            batch = [train[i] for i in order[s:s + ft["batch_size"]]]
            enc = tok([x for x, _ in batch], truncation=True, max_length=ft["max_length"], padding=True,
                      return_tensors="pt")
            loss = model(**enc, labels=torch.tensor([y for _, y in batch])).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            bar.update(1)
    bar.close()
    model.eval()
    correct = []
    with torch.no_grad():
        for s in range(0, len(task["test"]), 64):
            batch = task["test"][s:s + 64]
            enc = tok([x for x, _ in batch], truncation=True, max_length=ft["max_length"], padding=True,
                      return_tensors="pt")
            pred = model(**enc).logits.argmax(-1).numpy()
            correct += list(pred == np.array([y for _, y in batch]))
    return np.array(correct, dtype=float)


def validate(names=CANDIDATES, path: Path | None = CSV):
    """Measure the candidates ``names`` (fine-tune + test accuracy with bootstrap CI) and write the CSV; rows of
    other tasks already in the CSV are kept (so candidates can be measured one at a time)."""
    import pandas as pd

    rows = []
    for t in names:
        s = _task_splits(t)
        correct = finetune_eval(s)
        est, lo, hi = bootstrap_ci(correct, n_boot=2000, seed=0)
        rows.append(dict(task=t, n_labels=len(s["labels"]), n_train=len(s["train"]),
                         n_train_used=min(len(s["train"]), FT["train_examples"]), n_test=len(s["test"]), acc=est,
                         ci_low=lo, ci_high=hi, chance=s["chance"], usable=bool(lo > s["chance"]), measured=True))
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    if path and Path(path).exists():
        old = pd.read_csv(path)
        df = pd.concat([old[~old.task.isin(df.task)], df], ignore_index=True)
        df = df.set_index("task").loc[[t for t in CANDIDATES if t in set(df.task)]
                                      + [t for t in df.task if t not in CANDIDATES]].reset_index()
    if path:
        df.to_csv(path, index=False, float_format="%.4f")
    return df
