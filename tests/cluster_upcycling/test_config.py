"""Notebook 03's configuration (moelab.cluster_upcycling.config): one frozen configuration per profile, a clear error
for a bad name, the poster's setting beside every profile, the settings equal to the dict notebook 03 built before,
and the training settings (smoke's fixed ones; the validation choice or the fallback otherwise)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from moelab.cluster_upcycling import config
from moelab.cluster_upcycling.experiment import VIT_SMALL, eesd_decay_for, training_settings
from moelab.profiles import PROFILES


def test_one_frozen_config_per_profile():
    assert tuple(config.CONFIGS) == PROFILES
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.config_for("smoke").n_test = 5


def test_bad_profile_name_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"'turbo'.*smoke, default, full, paper"):
        config.config_for("turbo")
    with pytest.raises(ValueError, match="special_tokens='all'"):
        config.config_for("smoke", special_tokens="all")
    with pytest.raises(ValueError, match="lacks"):
        config.config_for("smoke", fallback_training=dict(lr=1e-4))


def test_profile_table_has_the_poster_beside_every_profile():
    t = config.profile_table("full")
    assert list(t.columns) == ["setting", "paper (poster)", "smoke", "default", "full (this run)", "paper"]
    assert set(config.PAPER_SETTING) == set(t.setting)
    assert "ViT d=128, 6 layers" in t.set_index("setting").loc["vision", "full (this run)"]


def _former(PROFILE, SEED, tuned):
    """The dict notebook 03 built with moelab.profiles.select before its configuration moved (copied)."""
    SEEDS3 = [SEED, SEED + 1, SEED + 2]
    common = dict(num_experts=8, top_k=2, energy=0.99, eesd_weight=0.1, aux_coef=0.01, special_tokens="exclude",
                  lr=tuned["lr"], steps=tuned["steps"], batch_size=tuned["batch_size"],
                  eesd_decay=eesd_decay_for(tuned["steps"]))
    cfg = dict(
        smoke=dict(methods=["dense", "sparse", "drop", "cluster_eesd"], seeds=[SEED], n_test=48, n_probe=24,
                   calib_texts=96, calib_tokens=2048, benchmarks=None, max_len=24, bench_all_seeds=False,
                   vision=dict(methods=["dense", "sparse", "cluster_eesd"], seeds=[SEED], data_profile="smoke",
                               vit=dict(VIT_SMALL, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                                        intermediate_size=128),
                               pretrain_steps=20, pretrain_batch=64, pretrain_lr=1e-3, calib_images=64,
                               calib_tokens=1088, n_test=200, n_cifar_train=300, n_cifar_test=100, steps=3,
                               batch_size=32, lr=2e-4, shots=(), probe_draws=0, ft_steps=3, ft_batch=32,
                               ft_lr=5e-4, eesd_decay=0.9)),
        default=dict(methods=["dense", "sparse", "cluster_eesd"], seeds=SEEDS3, n_test=300, n_probe=64,
                     calib_texts=256, calib_tokens=6144, benchmarks="smoke", max_len=24, bench_all_seeds=True,
                     vision=None),
        full=dict(methods=["dense", "dense_long", "sparse", "noise", "drop", "cluster", "sparse_eesd",
                           "cluster_eesd"], seeds=SEEDS3, n_test=300, n_probe=64, calib_texts=512, calib_tokens=8192,
                  benchmarks="default", max_len=24, bench_all_seeds=["sparse", "cluster_eesd"],
                  vision=dict(methods=["dense", "sparse", "drop", "cluster_eesd"], seeds=SEEDS3, data_profile="full",
                              vit=VIT_SMALL, pretrain_steps=500, pretrain_batch=128, pretrain_lr=1e-3,
                              calib_images=512, calib_tokens=8192, n_test=2000, n_cifar_train=1000,
                              n_cifar_test=1000, steps=120, batch_size=128, lr=2e-4, shots=(), probe_draws=0,
                              ft_steps=40, ft_batch=64, ft_lr=5e-4, eesd_decay=0.99)),
        # issue 51: the paper profile runs the poster's experiment on CLIP (it ran no method before)
        paper=dict(methods=["dense", "dense_long", "sparse", "noise", "drop", "cluster", "sparse_eesd",
                            "cluster_eesd"], seeds=SEEDS3, n_test=5000, n_probe=256, calib_texts=2048,
                   calib_tokens=65536, benchmarks=None, max_len=77, bench_all_seeds=False, vision=None,
                   weight_decay=0.2, num_workers=8, ckpt_every=2000, eval_batch=256))[PROFILE]
    return {**common, **cfg}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("seed", [0, 5])
def test_settings_equal_the_notebooks_former_dict(profile, seed):
    c = config.config_for(profile)
    tuned = c.fixed_training or c.fallback_training
    got = c.settings(seed, tuned, eesd_decay_for(tuned["steps"]))
    want = _former(profile, seed, tuned)
    assert got == want and list(got) == list(want)
    if want["vision"]:
        assert list(got["vision"]) == list(want["vision"])


def test_training_settings_fixed_choice_and_fallback(tmp_path):
    smoke = config.config_for("smoke")
    got = training_settings(smoke.fallback_training, smoke.fixed_training, smoke.fixed_training_source, tmp_path)
    assert got == dict(lr=1e-4, steps=4, batch_size=8, candidate=None,
                       source="smoke: fixed tiny settings (the validation choice applies to default and full)")
    full = config.config_for("full")
    assert training_settings(full.fallback_training, folder=tmp_path)["steps"] == 24          # no choice yet
    (tmp_path / "tuning_summary.json").write_text(json.dumps(
        {"choice": {"candidate": "c1", "settings": dict(lr=3e-4, steps=120, batch_size=16)}}))
    assert training_settings(full.fallback_training, folder=tmp_path)["steps"] == 120
