"""Notebook 00's configuration (moelab.primer.config): one frozen profile per run profile, a clear error for a bad
name, the reference setting beside every profile, and the settings the notebook saved before the configuration moved
out of it (same keys, same values)."""
from __future__ import annotations

import dataclasses

import pytest

from moelab.primer import config
from moelab.profiles import PROFILES


def test_one_frozen_profile_per_run_profile():
    assert tuple(config.PROFILES) == PROFILES
    p = config.profile("smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps = 5


def test_bad_profile_name_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"'turbo'.*smoke, default, full, paper"):
        config.profile("turbo")
    with pytest.raises(ValueError, match="n_eval_loss"):
        config.PrimerProfile("smoke", n_train=8, steps=1, n_eval=4, n_eval_loss=8)


def test_profile_table_has_the_reference_beside_every_profile():
    t = config.profile_table("default")
    assert list(t.columns) == ["setting", "reference", "smoke", "default (this run)", "full", "paper"]
    assert set(config.REFERENCE) <= set(t.setting)
    row = t.set_index("setting").loc["training"]
    assert "4 steps of 8 pairs" in row["smoke"] and "40 steps of 16 pairs" in row["default (this run)"]


def test_settings_equal_the_notebooks_former_dict():
    """The dict notebook 00 built with moelab.profiles.select before (copied here), key for key."""
    base = dict(num_experts=8, top_k=2, layers="every_other", router_lr=1e-3, expert_lr=3e-5, batch=16, aux_coef=0.05,
                warmup_frac=0.1, top_p=[0.3, 0.5, 0.7], n_eval=256, n_eval_loss=64, eval_every=20,
                timing_tokens=[64, 256], timing_repeats=3)
    full = {**base, "n_train": 6400, "steps": 200, "batch": 32, "eval_every": 25, "timing_tokens": [64, 256, 1024]}
    former = dict(smoke={**base, "n_train": 64, "steps": 4, "batch": 8, "n_eval": 64, "n_eval_loss": 32,
                         "eval_every": 2, "timing_tokens": [32, 64], "timing_repeats": 1},
                  default={**base, "n_train": 1280, "steps": 40}, full=full, paper=full)
    for name, want in former.items():
        got = config.profile(name).settings()
        assert got == want and list(got) == list(want), name


def test_the_balancing_comparison_trains_three_seeds_except_in_smoke():
    """Issue 47 item 9: 3 training seeds per arm decide the paired comparison; smoke stays one seed (inconclusive)."""
    assert config.profile("smoke").seeds == 1
    assert all(config.profile(n).seeds == 3 for n in ("default", "full", "paper"))
    with pytest.raises(ValueError, match="seeds=0"):
        config.PrimerProfile("smoke", n_train=8, steps=1, n_eval=8, n_eval_loss=8, seeds=0)
    assert "x 2 arms x 3 seed(s)" in config.profile_table().set_index("setting").loc["training", "default"]
