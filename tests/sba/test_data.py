"""Paper-profile inputs of notebook 02_sba: ``NLI_PATH`` pointing at an all-nli root finds its
``triplet/`` split, and every missing input names the notebook parameter to pass (moelab.profiles.paper_input_hint);
one in the wrong layout raises moelab.inputs.InputFormatError.
A tiny fake all-nli in the hub's layout: <root>/{pair,pair-class,pair-score,triplet}/{train,dev}-00000-of-00001.parquet."""
from __future__ import annotations

import pandas as pd
import pytest

from moelab.sba.data import find_allnli_triplet_dir, load_allnli_triplets, load_mteb_local
from moelab.sba.loader import load_nomic
from moelab.assets import MissingAsset
from moelab.inputs import InputFormatError

SUBSET_COLUMNS = {"pair": ["anchor", "positive"], "pair-class": ["premise", "hypothesis", "label"],
                  "pair-score": ["sentence1", "sentence2", "score"], "triplet": ["anchor", "positive", "negative"]}


def _fake_allnli(root, subsets=SUBSET_COLUMNS):
    for sub, cols in subsets.items():
        (root / sub).mkdir(parents=True)
        for split, n in (("train", 3), ("dev", 2), ("test", 1)):
            pd.DataFrame({c: [f"{sub}-{split}-{c}-{i}" if c not in ("label", "score") else i for i in range(n)]
                          for c in cols}).to_parquet(root / sub / f"{split}-00000-of-00001.parquet")
    return root


def test_allnli_root_finds_the_triplet_split(tmp_path):
    root = _fake_allnli(tmp_path / "all-nli")
    want = [(f"triplet-train-anchor-{i}", f"triplet-train-positive-{i}", f"triplet-train-negative-{i}")
            for i in range(3)]
    assert find_allnli_triplet_dir(root) == root / "triplet"
    assert load_allnli_triplets(root) == want  # the root: 'pair/' sorts first and must not be read
    assert load_allnli_triplets(root / "triplet") == want  # the triplet folder itself
    assert load_allnli_triplets(tmp_path) == want  # a folder above the root
    assert load_allnli_triplets(root, "dev", limit=1) == [("triplet-dev-anchor-0", "triplet-dev-positive-0",
                                                               "triplet-dev-negative-0")]
    f = root / "triplet" / "test-00000-of-00001.parquet"
    assert len(load_allnli_triplets(f)) == 1


def test_every_missing_input_names_what_to_pass(tmp_path):
    with pytest.raises(MissingAsset, match=r"-p NLI_PATH=<path>"):
        load_allnli_triplets(tmp_path / "nope")
    with pytest.raises(MissingAsset, match=r"-p NLI_PATH=<path>"):
        load_allnli_triplets(None)
    # a path that exists in the wrong layout is a format error naming the parameter and the fix
    only_pairs = _fake_allnli(tmp_path / "pairs-only", {"pair": SUBSET_COLUMNS["pair"]})
    with pytest.raises(InputFormatError, match=r"NLI_PATH=.*no 'triplet/' folder.*Fix: "):
        load_allnli_triplets(only_pairs)
    root = _fake_allnli(tmp_path / "all-nli", {"triplet": SUBSET_COLUMNS["triplet"]})
    with pytest.raises(InputFormatError, match=r"NLI_PATH=.*no 'validation' split file.*Fix: "):
        load_allnli_triplets(root, "validation")
    with pytest.raises(MissingAsset, match=r"STSBenchmark.*-p MTEB_PATH=<path>"):
        load_mteb_local(tmp_path / "nope")
    with pytest.raises(MissingAsset, match=r"-p MTEB_PATH=<path>"):
        load_mteb_local(None)
    (tmp_path / "mteb" / "STSBenchmark").mkdir(parents=True)
    with pytest.raises(InputFormatError, match=r"MTEB_PATH=.*STSBenchmark.*no 'test' split file.*Fix: "):
        load_mteb_local(tmp_path / "mteb")
    with pytest.raises(MissingAsset, match=r"-p MODEL_PATH=<path>"):
        load_nomic(tmp_path / "no-model")
