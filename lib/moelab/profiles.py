"""Run profiles shared by every notebook.

- ``smoke``: under 3 minutes per notebook; what CI runs; writes to a scratch directory.
- ``default``: the embedded default on a 2-core CPU (``make figures``); writes ``figures/<notebook>/``.
- ``full``: every table and ablation a notebook implements, on CPU; writes ``figures/<notebook>/full/``.
- ``paper``: the paper's own models/data/scale from local paths (usually GPUs); writes ``figures/<notebook>/paper/``.
"""
from __future__ import annotations

PROFILES = ("smoke", "default", "full", "paper")


def check_profile(name) -> str:
    """Return ``name`` if it is a known profile, else raise ``ValueError`` naming it."""
    if name not in PROFILES:
        raise ValueError(f"unknown PROFILE {name!r}: expected one of {', '.join(PROFILES)}")
    return name


def select(profile: str, **per_profile):
    """Pick the value for ``profile`` from keyword arguments named after profiles.

    ``select("smoke", smoke=dict(steps=5), default=dict(steps=300), full=..., paper=...)``.
    Every profile must be given (so a notebook states what each profile does); ``paper`` may be
    ``None`` only if the notebook says the paper profile is configured elsewhere.
    """
    check_profile(profile)
    unknown = set(per_profile) - set(PROFILES)
    if unknown:
        raise ValueError(f"select() got settings for unknown profile(s) {sorted(unknown)}; expected {PROFILES}")
    missing = [p for p in PROFILES if p not in per_profile]
    if missing:
        raise ValueError(f"select() needs a setting for every profile; missing {missing}")
    return per_profile[profile]


def paper_input_hint(notebook: str, param: str, what: str) -> str:
    """How to give a paper-profile notebook a local input it cannot download: the instruction every paper loader's
    ``MissingAsset`` carries.

    ``paper_input_hint("05", "MODEL_PATH", "a local Hugging Face folder of Llama-2-7b-chat")`` ->
    "get a local Hugging Face folder of Llama-2-7b-chat, then pass it: python -m moelab.runner run --profile paper
    --only 05 -p MODEL_PATH=<path> (or set MODEL_PATH in the notebook's parameters cell)".
    """
    return (f"get {what} (it cannot be downloaded here), then pass it: python -m moelab.runner run --profile paper "
            f"--only {notebook} -p {param}=<path>  (or set {param} in the notebook's parameters cell)")


def dry_run_table(paper, dry, keep=()):
    """What a dry run of the paper profile cuts (issue 51; each notebook's first table under ``DRY_RUN``): one row per
    setting whose value differs between ``paper`` and ``dry`` (dataclasses or dicts of the same fields), plus the
    settings named in ``keep`` (shown unchanged: the user's model and data, the method's own constants).

    Columns ``setting``, ``paper``, ``dry run``, ``cut``. Raises ``ValueError`` when the two name different settings
    (a dry run must be the paper configuration with sizes cut, not another configuration)."""
    import dataclasses

    import pandas as pd

    def fields(c):
        return dataclasses.asdict(c) if dataclasses.is_dataclass(c) else dict(c)

    p, d = fields(paper), fields(dry)
    if set(p) != set(d):
        raise ValueError(f"dry_run_table: the dry run names settings the paper profile does not (or the reverse): "
                         f"{sorted(set(p) ^ set(d))}")
    rows = [{"setting": k, "paper": str(p[k]), "dry run": str(d[k]), "cut": p[k] != d[k]}
            for k in p if p[k] != d[k] or k in keep]
    return pd.DataFrame(rows, columns=["setting", "paper", "dry run", "cut"])
