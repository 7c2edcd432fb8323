"""Synthetic result folders for the claim-definition tests: CSV tables (and JSON files) written into a temporary
folder and read back as the claims engine's ``Tables``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from moelab.claims import Tables


def tables_folder(tmp_path: Path, tables: dict[str, pd.DataFrame], jsons: dict = ()) -> Tables:
    """``tmp_path`` holding ``<stem>.csv`` per table and ``<stem>.json`` per object in ``jsons``."""
    for stem, df in tables.items():
        df.to_csv(tmp_path / f"{stem}.csv", index=False)
    for stem, obj in dict(jsons).items():
        (tmp_path / f"{stem}.json").write_text(json.dumps(obj))
    return Tables(tmp_path)


def run_folder(tmp_path: Path, nb: str, tables: dict[str, pd.DataFrame]) -> Tables:
    """A run folder of notebook ``nb`` (default profile): ``provenance.json`` plus ``<stem>.csv`` per table."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "provenance.json").write_text(json.dumps({"notebook": nb, "profile": "default"}))
    for stem, df in tables.items():
        df.to_csv(tmp_path / f"{stem}.csv", index=False)
    return Tables(tmp_path)


def by_seed(*arms):
    """Each arm as a pandas object indexed by seed 0..n-1 (paired evidence joins arms on the seed): a Series for
    per-seed values, a DataFrame for [seeds, items]."""
    out = []
    for x in arms:
        x = np.asarray(x, dtype=float)
        idx = pd.RangeIndex(len(x), name="seed")
        out.append(pd.Series(x, index=idx) if x.ndim == 1 else pd.DataFrame(x, index=idx))
    return out
