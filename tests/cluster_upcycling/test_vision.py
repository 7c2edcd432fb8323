"""Tests for the vision experiment of moelab.cluster_upcycling (poster 002, CLIP ViT analogue; notebook 03)."""
import copy
import warnings

import numpy as np
import pytest
import torch

from moelab import cluster_upcycling as cu
from moelab.core import moe_layers, moeify
from moelab.core.convert import collect_ffn_inputs, ffn_sites

TINY_VIT = dict(image_size=28, patch_size=7, num_channels=1, hidden_size=32, num_hidden_layers=4,
                num_attention_heads=2, intermediate_size=64, num_labels=10)


def _images(n=24, seed=0):
    from moelab.suite import images

    fm = images.fashion_mnist("smoke")  # real Fashion-MNIST images
    idx = np.random.default_rng(seed).choice(len(fm["train_y"]), n, replace=False)
    return fm["train_x"][idx], fm["train_y"][idx]


def test_ffn_sites_finds_vit_mlps():
    vit = cu.experiment.make_vit(TINY_VIT, 0)
    sites = ffn_sites(vit)
    assert len(sites) == 4 and all(s.kind == "mlp" for s in sites)
    assert sites[1].ffn is vit.vit.layers[1].mlp


def test_sparse_upcycled_vit_reproduces_dense_logits():
    x, _ = _images(8)
    dense = cu.experiment.make_vit(TINY_VIT, 0)
    with torch.no_grad():  # move the LayerNorms and biases off their trivial init so the check is not vacuous
        for p in dense.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moe = moeify(copy.deepcopy(dense), "every_other", num_experts=8, top_k=2, init="sparse", renormalize=True)
    assert len(moe_layers(moe)) == 2
    with torch.no_grad():
        a = dense(pixel_values=cu.data.to_pixels(x)).logits
        b = moe(pixel_values=cu.data.to_pixels(x)).logits
    assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())


def test_cluster_aware_init_runs_on_vit_ffn_inputs():
    x, _ = _images(40)
    dense = cu.experiment.make_vit(TINY_VIT, 0)
    calib = collect_ffn_inputs(dense, [{"pixel_values": cu.data.to_pixels(x)}], layers="every_other")
    assert sorted(calib) == [1, 3] and calib[1].shape == (40 * 17, 32)  # 16 patches + CLS per image
    model = copy.deepcopy(dense)
    special = cu.data.vit_special_mask(40 * 17, 17)  # the CLS token of each image, excluded from the clustering
    assert int(special.sum()) == 40 and bool(special[0]) and not bool(special[1])
    ci = cu.experiment.upcycle(model, "cluster_eesd", calib, seed=0, num_experts=4, top_k=2, energy=0.95, special_mask=special)
    layers = moe_layers(model)
    assert len(ci.log) == 2 and all(sum(r["sizes"]) == 40 * 16 for r in ci.log)
    assert all(sum(r["special_routed"]) == 40 and r["special_tokens"] == "exclude" for r in ci.log)
    for layer, km in zip(layers, ci.kmeans):  # router rows are the unit centroids (Step 3)
        assert torch.allclose(layer._router_rows(), km.centroids, atol=1e-6)
    with torch.no_grad():
        out = model(pixel_values=cu.data.to_pixels(x[:4])).logits
    assert torch.isfinite(out).all()


def test_few_shot_indices_exact_k_deterministic_and_errors():
    y = np.repeat(np.arange(5), 12)
    a = cu.experiment.few_shot_indices(y, 3, seed=7)
    assert np.array_equal(np.bincount(y[a], minlength=5), np.full(5, 3))
    assert len(set(a.tolist())) == 15  # without replacement
    assert np.array_equal(a, cu.experiment.few_shot_indices(y, 3, seed=7))
    assert not np.array_equal(a, cu.experiment.few_shot_indices(y, 3, seed=8))
    y_short = np.concatenate([y, [9, 9]])
    with pytest.raises(ValueError, match="class 9 has 2 examples, fewer than k=3"):
        cu.experiment.few_shot_indices(y_short, 3, seed=0)
    with pytest.raises(ValueError, match="k must be a positive int"):
        cu.experiment.few_shot_indices(y, 0, seed=0)


def test_few_shot_probe_separable_features():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    f = np.eye(3)[y] * 5 + 0.1 * rng.standard_normal((60, 3))
    acc = cu.experiment.few_shot_probe(f, y, f, y, k=2, draws=3, seed=0)
    assert acc.shape == (60,) and acc.mean() == 1.0


def test_cifar_to_grey28_matches_pillow_and_checks_input():
    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    g = cu.data.cifar_to_grey28(rgb)
    ref = np.asarray(Image.fromarray(rgb[1]).convert("L").resize((28, 28), Image.BILINEAR))
    assert g.shape == (2, 28, 28) and g.dtype == np.uint8 and np.array_equal(g[1], ref)
    with pytest.raises(ValueError, match="RGB"):
        cu.data.cifar_to_grey28(rgb[..., 0])


def test_vision_experiment_tiny_end_to_end(tmp_path, monkeypatch):
    from moelab.suite import images

    cifar = images._cifar_all()  # decoded CIFAR-10 from the real cache; the experiment's own entries go to tmp
    monkeypatch.setattr(images, "_cifar_all", lambda: cifar)
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    cfg = dict(vit=TINY_VIT, data_profile="smoke", pretrain_steps=2, pretrain_batch=16, pretrain_lr=1e-3,
               calib_images=32, calib_tokens=512, n_test=30, n_cifar_train=100, n_cifar_test=20, steps=2,
               batch_size=8, lr=1e-4, shots=(5, 10), probe_draws=2, ft_steps=2, ft_batch=8, ft_lr=1e-4,
               num_experts=4, top_k=2, energy=0.95, eesd_decay=0.9, eesd_weight=0.1, aux_coef=0.01)
    out = cu.vision_experiment(["dense", "sparse", "cluster_eesd"], [0], cfg)
    assert list(out["items"].columns) == cu.experiment.VISION_COLUMNS["items"]
    assert list(out["accuracy"].columns) == cu.experiment.VISION_COLUMNS["accuracy"]
    acc = out["accuracy"]
    assert set(acc["task"]) == {"fmnist_test", "cifar_5shot", "cifar_10shot", "cifar_ft"}
    assert set(acc["method"]) == {"dense", "sparse", "cluster_eesd"}
    assert acc["accuracy"].between(0, 100).all()
    assert cu.report.per_item_scores(out["items"], "sparse", "fmnist_test").shape == (1, 30)
    assert cu.report.per_item_scores(out["items"], "cluster_eesd", "cifar_5shot").shape == (1, 20)
    assert {"eesd", "balance", "ce"} <= set(out["history"].columns)
    assert out["pretrain"].loc[0, "steps"] == 2 and 0 <= out["pretrain"].loc[0, "test_accuracy"] <= 100
    assert set(out["timing"]["phase"]) >= {"continued_training", "evaluation_and_probes", "fine_tuning"}
    assert len(cu.init_table(out["results"])) == 2 * 4  # 2 MoE layers x 4 experts of the cluster-aware model
    table = cu.vision_table(acc)
    assert list(table.index) == ["dense", "sparse", "cluster_eesd"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cu.plot_vision(acc)
    again = cu.vision_experiment(["sparse"], [0], cfg)  # served from the cache: identical scores
    assert np.array_equal(again["items"]["score"].to_numpy(),
                          out["items"][out["items"]["method"] == "sparse"]["score"].to_numpy())
    with pytest.raises(ValueError, match="unknown vision method"):
        cu.vision_experiment(["bogus"], [0], cfg)
