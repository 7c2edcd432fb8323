"""BIG-bench task JSONs as normalised multiple-choice items, with fixed seeded evaluation pools (issue 4).

Each item: ``dict(id, task, input, prompt, choices, gold)`` where ``prompt`` is the text the model sees
(task prefix, the example, the options, then ``"Answer:"``) and ``choices[gold]`` is the correct option
(the highest ``target_scores`` entry). BIG-bench 1.0.0 stores ``target_scores`` as Python-literal strings;
they are parsed with ``ast.literal_eval``. Items without a positive target, with fewer than two distinct
choices, or malformed are skipped and counted (``load_items(...).skipped``).

The evaluation pool of a task is a fixed, seeded prefix of a permutation of its items: every profile
evaluates the first ``limit`` items of that pool, so smaller profiles use subsets of larger ones.
Used by ``instruct`` (training/held-out splits), ``lmeval`` (task data), ``embed``, ``textcls``.
"""
from __future__ import annotations

import ast
import json
import zlib
import numpy as np

from moelab.suite import BIGBENCH_TASKS

SEED = 0


class Items(list):
    """A list of items that also records how many source examples were skipped (and why)."""

    skipped: dict


def load_task(name: str) -> dict:
    """The parsed ``task.json`` of a BIG-bench task (``"hyperbaton"``, ``"logical_deduction/three_objects"``),
    through ``moelab.assets.bigbench_task``. ``ValueError`` for a task not declared in ``BIGBENCH_TASKS``."""
    top, _, sub = name.partition("/")
    if top not in BIGBENCH_TASKS:
        raise ValueError(f"BIG-bench task {name!r} is not in moelab.suite.BIGBENCH_TASKS")
    from moelab import assets

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


def items_from_task(task: str, d: dict) -> Items:
    """Normalise the examples of a parsed task dict (see module docstring)."""
    prefix = (d.get("task_prefix") or "").strip()
    in_prefix = d.get("example_input_prefix") or ""
    out = Items()
    skipped: dict[str, int] = {}
    for i, ex in enumerate(d["examples"]):
        try:
            sc = _scores(ex["target_scores"])
            choices = list(sc)
            if len(choices) < 2 or len(set(c.lower() for c in choices)) < len(choices):
                raise ValueError("fewer than two distinct choices")
            best = max(sc.values())
            if best <= 0:
                raise ValueError("no positive target")
            gold = [c for c in choices if sc[c] == best]
            if len(gold) != 1:
                raise ValueError("several correct choices")
            text = str(ex["input"]).strip()
            if not text:
                raise ValueError("empty input")
        except (KeyError, ValueError, SyntaxError, TypeError) as e:
            reason = str(e).split(":")[0][:60] or type(e).__name__
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        body = (in_prefix.strip() + " " if in_prefix.strip() else "") + text
        options = "\n".join(f"- {c}" for c in choices)
        prompt = (prefix + "\n\n" if prefix else "") + body + "\nOptions:\n" + options + "\nAnswer:"
        out.append(dict(id=f"{short_name(task)}-{i}", task=task, input=text, prompt=prompt, choices=choices,
                        gold=choices.index(gold[0])))
    out.skipped = skipped
    return out


def load_items(task: str) -> Items:
    """All usable items of a BIG-bench task, in source order."""
    return items_from_task(task, load_task(task))


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
