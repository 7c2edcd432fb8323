"""BIG-bench task JSONs as normalised multiple-choice items, with fixed seeded evaluation pools.

Each item: ``dict(id, task, input, prompt, choices, gold, source_gold, option_seed, option_order)`` where
``prompt`` is the text the model sees (task prefix, the example, the options, then ``"Answer:"``) and
``choices[gold]`` is the correct option (the highest ``target_scores`` entry).

Option order: BIG-bench lists the gold option first in most items of some tasks (98% of
date_understanding, 100% of temporal_sequences), and the prompt lists the options, so a model that favours
the first option looks "above chance". Each item's options are therefore shuffled with its own fixed seed
(``option_seed(task, item_id)``: a sha256 of task name and item id, so the same on every run and machine):
``choices[j] = source_choices[option_order[j]]``; ``source_gold`` is the gold index in BIG-bench's order.
``gold_position_distribution(task)`` gives the gold-position counts before and after shuffling.

BIG-bench 1.0.0 stores ``target_scores`` as Python-literal strings; they are parsed with ``ast.literal_eval``. Items without a positive target, with fewer than two distinct
choices, or malformed are skipped and counted (``load_items(...).skipped``).

The evaluation pool of a task is a fixed, seeded prefix of a permutation of its items: every profile
evaluates the first ``limit`` items of that pool, so smaller profiles use subsets of larger ones.
Used by ``instruct`` (training/held-out splits), ``lmeval`` (task data), ``embed``, ``textcls``.
"""
from __future__ import annotations

import ast
import hashlib
import json
import zlib

import numpy as np
import pandas as pd

from moelab import assets
from moelab.assets import BIGBENCH_TASKS

SEED = 0
OPTION_SHUFFLE_VERSION = "options-v1"  # part of every item's option seed: change it to draw new orders


class Items(list):
    """A list of items that also records how many source examples were skipped (and why)."""

    skipped: dict


def load_task(name: str) -> dict:
    """The parsed ``task.json`` of a BIG-bench task (``"hyperbaton"``, ``"logical_deduction/three_objects"``),
    through ``moelab.assets.bigbench_task``. ``ValueError`` for a task not declared in ``moelab.assets.BIGBENCH_TASKS``."""
    top, _, sub = name.partition("/")
    if top not in BIGBENCH_TASKS:
        raise ValueError(f"BIG-bench task {name!r} is not in moelab.assets.BIGBENCH_TASKS")
    return assets.bigbench_task(top, sub or None)


def parse_task_json(text: str, source: str = "<string>") -> dict:
    """Parse a task.json text; a malformed file raises ``ValueError`` naming the source."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed BIG-bench task file {source}: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("examples"), list):
        raise ValueError(f"BIG-bench task file {source} has no 'examples' list")
    return d


def _scores(raw) -> dict:
    if isinstance(raw, str):
        raw = ast.literal_eval(raw)
    if not isinstance(raw, dict):
        raise ValueError("target_scores is not a mapping")
    return {str(k).strip(): float(v) for k, v in raw.items()}


def short_name(task: str) -> str:
    """``logical_deduction/three_objects`` -> ``logical_deduction_three_objects``."""
    return task.replace("/", "_")


def option_seed(task: str, item_id: str) -> int:
    """The fixed seed of one item's option order: the first 8 bytes of
    ``sha256(OPTION_SHUFFLE_VERSION | task | item_id)`` as an unsigned integer (stable across runs, machines and
    Python versions, unlike ``hash()``)."""
    if not task or not item_id:
        raise ValueError(f"option_seed needs a task name and an item id, got {task!r}, {item_id!r}")
    digest = hashlib.sha256(f"{OPTION_SHUFFLE_VERSION}|{task}|{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def option_order(task: str, item_id: str, n_options: int) -> list[int]:
    """The shuffled order of an item's options: ``choices[j] = source_choices[order[j]]``
    (``numpy.random.default_rng(option_seed(task, item_id)).permutation(n_options)``)."""
    if n_options < 1:
        raise ValueError(f"an item needs at least one option, got n_options={n_options}")
    return [int(i) for i in np.random.default_rng(option_seed(task, item_id)).permutation(n_options)]


def items_from_task(task: str, d: dict, shuffle: bool = True) -> Items:
    """Normalise the examples of a parsed task dict (see module docstring).

    ``shuffle=True`` (the default) lists each item's options in its seeded order
    (``option_order``); ``shuffle=False`` keeps BIG-bench's order (``option_order`` is then the identity), for
    measuring the source's gold-position distribution only.
    """
    prefix = (d.get("task_prefix") or "").strip()
    in_prefix = d.get("example_input_prefix") or ""
    out = Items()
    skipped: dict[str, int] = {}
    for i, ex in enumerate(d["examples"]):
        try:
            sc = _scores(ex["target_scores"])
            source_choices = list(sc)
            if len(source_choices) < 2 or len(set(c.lower() for c in source_choices)) < len(source_choices):
                raise ValueError("fewer than two distinct choices")
            best = max(sc.values())
            if best <= 0:
                raise ValueError("no positive target")
            gold = [c for c in source_choices if sc[c] == best]
            if len(gold) != 1:
                raise ValueError("several correct choices")
            text = str(ex["input"]).strip()
            if not text:
                raise ValueError("empty input")
        except (KeyError, ValueError, SyntaxError, TypeError) as e:
            reason = str(e).split(":")[0][:60] or type(e).__name__
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        item_id = f"{short_name(task)}-{i}"
        source_gold = source_choices.index(gold[0])
        seed = option_seed(task, item_id)
        order = option_order(task, item_id, len(source_choices)) if shuffle else list(range(len(source_choices)))
        choices = [source_choices[j] for j in order]
        body = (in_prefix.strip() + " " if in_prefix.strip() else "") + text
        options = "\n".join(f"- {c}" for c in choices)
        prompt = (prefix + "\n\n" if prefix else "") + body + "\nOptions:\n" + options + "\nAnswer:"
        out.append(dict(id=item_id, task=task, input=text, prompt=prompt, choices=choices,
                        gold=order.index(source_gold), source_gold=source_gold, option_seed=seed,
                        option_order=order))
    out.skipped = skipped
    return out


def load_items(task: str, shuffle: bool = True) -> Items:
    """All usable items of a BIG-bench task, in source order (each item's options shuffled unless
    ``shuffle=False``)."""
    return items_from_task(task, load_task(task), shuffle=shuffle)


def gold_position_distribution(task: str, items: list | None = None) -> pd.DataFrame:
    """Gold-option position counts of a task before (BIG-bench order) and after the seeded shuffle.
    ``items``: shuffled items of ``task`` (default: all of them, ``load_items(task)``).

    Returns one row per position: ``task, position, n_before, frac_before, n_after, frac_after, n_items``
    (positions beyond an item's option count simply do not occur in it).
    """
    items = load_items(task) if items is None else list(items)
    if not items:
        raise ValueError(f"gold_position_distribution({task!r}) got no items")
    bad = [it.get("id") for it in items if "source_gold" not in it or "gold" not in it]
    if bad:
        raise ValueError(f"items {bad[:3]} lack 'gold'/'source_gold': pass items from bigbench.load_items")
    n_pos = max(len(it["choices"]) for it in items)
    before = np.bincount([it["source_gold"] for it in items], minlength=n_pos)
    after = np.bincount([it["gold"] for it in items], minlength=n_pos)
    n = len(items)
    return pd.DataFrame(dict(task=task, position=np.arange(n_pos), n_before=before, frac_before=before / n,
                             n_after=after, frac_after=after / n, n_items=n))


def permutation(task: str, n: int, seed: int = SEED) -> np.ndarray:
    """The fixed permutation of a task's items (seed mixed with a checksum of the task name)."""
    return np.random.default_rng([seed, zlib.crc32(task.encode())]).permutation(n)


def split_items(task: str, n_eval: int, n_val: int, seed: int = SEED) -> dict:
    """Seeded split of a task's items: ``test`` (the evaluation pool, first ``n_eval`` of the permutation),
    ``validation`` (next ``n_val``), ``train`` (the rest)."""
    items = load_items(task)
    if not items:
        raise ValueError(f"BIG-bench task {task!r} has no usable items (skipped: {items.skipped})")
    perm = permutation(task, len(items), seed)
    shuffled = [items[i] for i in perm]
    return dict(test=shuffled[:n_eval], validation=shuffled[n_eval:n_eval + n_val], train=shuffled[n_eval + n_val:])


def chance(item: dict) -> float:
    """Chance accuracy of one multiple-choice item: 1 / number of choices."""
    return 1.0 / len(item["choices"])
