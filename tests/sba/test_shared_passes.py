"""Notebook 02 (SBA) cost cuts (issue 49), each against the straightforward path it replaces, on a tiny random BERT in
nomic's MoE layout: the held-out kept weight mass of every layer from one forward pass, the dense reference
embeddings of the init damage encoded once, the regime probe's init reading from the init geometry's routing, one
layout template for every checkpoint, and phase (c)'s starting loss under linear aggregation read from phase (b)'s
last evaluation. Every number must be equal, not close."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from moelab.core.layer import moe_layers
from moelab.sba import standin
from moelab.sba.experiment import (Setup, _phase_b_end_val, load_checkpoint, st_embed, train_until_plateau,
                                   validation_mnrl)
from moelab.sba.geometry import collect_geometry, st_forward_fn
from moelab.sba.regime import RegimeProbe
from moelab.sba.standin import build_nomic_layout_moe, embedding_cosine_to_dense, init_damage, kept_weight_masses

from helpers.sba import TEXTS, pairs


@pytest.fixture(scope="module")
def moe(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_nomic_layout_moe(tiny, init="cluster", calib_texts=TEXTS, seed=0)


@torch.no_grad()
def _kept_mass_own_pass(model, layer, texts):
    """The former path: one forward pass per layer, a hook on that layer only."""
    sums = []
    h = layer.register_forward_hook(lambda m, a, o: sums.append(m.last_route.weights.double().sum(-1)))
    try:
        mask = st_forward_fn(model)(list(texts))
    finally:
        h.remove()
    return float(torch.cat(sums)[mask.reshape(-1).bool()].mean())


def test_kept_weight_mass_of_every_layer_from_one_pass_equals_one_pass_per_layer(moe):
    calls = []
    fwd = st_forward_fn(moe)
    got = kept_weight_masses(moe, TEXTS[8:], forward_fn=lambda t: calls.append(1) or fwd(t))
    assert len(calls) == 1 and len(got) == len(moe_layers(moe)) >= 2
    assert got == [_kept_mass_own_pass(moe, layer, TEXTS[8:]) for layer in moe_layers(moe)]
    assert standin.kept_weight_mass(moe, moe_layers(moe)[1], TEXTS[8:]) == got[1]
    with pytest.raises(ValueError, match="calibration texts"):
        kept_weight_masses(moe, [])


def test_init_damage_encodes_the_dense_model_once_and_equals_the_former_cosines(tiny, monkeypatch):
    encoded = []
    real = standin.st_encode_fn
    monkeypatch.setattr(standin, "st_encode_fn", lambda st, *a, **k: (encoded.append(st is tiny), real(st, *a, **k))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = init_damage(tiny, TEXTS[:16], TEXTS[16:], init="cluster")
        given = init_damage(tiny, TEXTS[:16], TEXTS[16:], init="cluster", base_emb=real(tiny)(TEXTS[16:]))
    assert encoded.count(True) == 1   # the first call's dense encoding; the second was handed it
    pd.testing.assert_frame_equal(res["table"], given["table"], check_exact=True)
    monkeypatch.setattr(standin, "st_encode_fn", real)
    for name in ("cluster (nomic layout)", "cluster (nomic layout, compensated)"):
        row = res["table"].set_index("model").loc[name]
        cos = embedding_cosine_to_dense(res["models"][name], tiny, TEXTS[16:])   # the former path: encodes both
        assert (row.cos_mean, row.cos_min, row.cos_median) == (float(cos.mean()), float(cos.min()),
                                                               float(np.median(cos)))
    raw = res["models"]["cluster (nomic layout)"]
    assert res["factors"]["held_out_kept_mass"].tolist() == [_kept_mass_own_pass(raw, layer, TEXTS[16:])
                                                              for layer in moe_layers(raw)]
    with pytest.raises(ValueError, match="dense_emb has shape"):
        embedding_cosine_to_dense(raw, tiny, TEXTS[16:], dense_emb=np.zeros((2, 3)))


def test_probe_init_reading_from_the_init_geometry_equals_its_own_passes(moe):
    subjects = {"a": TEXTS[:6], "b": TEXTS[6:12], "c": TEXTS[12:18]}
    probe = RegimeProbe(moe, TEXTS[18:], subjects, max_tokens=20)
    _, counts = collect_geometry(moe, st_forward_fn(moe), subjects, 20)
    assert probe(moe, counts=counts, routed=probe.init_idx) == probe(moe)


def test_one_layout_template_serves_every_checkpoint(tiny, moe):
    ckpt = {k: v.clone() for k, v in moe.state_dict().items()}
    a = load_checkpoint(build_nomic_layout_moe(tiny, init="sparse", seed=0), ckpt, "sba")
    b = load_checkpoint(build_nomic_layout_moe(tiny, init="sparse", seed=7), ckpt, "sba")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert np.array_equal(a.encode(TEXTS[:6]), b.encode(TEXTS[:6]))
    s = Setup(cfg=None, seed=0, train_pairs=[], val_pairs=[], subjects={}, conf={}, dense=tiny, heldout=TEXTS[:4])
    assert s.layout_template() is s.layout_template()
    assert np.array_equal(s.heldout_dense_emb(), standin.st_encode_fn(tiny)(TEXTS[:4]))


def test_phase_c_linear_start_is_phase_b_last_evaluation(tiny, moe):
    model = copy.deepcopy(moe)
    b = train_until_plateau(model, pairs(24), pairs(8), max_steps=4, eval_every=2, batch_size=4, lr=1e-3, seed=0,
                            val_batches=2, val_batch_size=4, keep="last", stop_on_plateau=False, device="cpu")
    pb = dict(steps=b["steps"], checkpoint=b["checkpoint"],
              trajectory=pd.concat([pd.DataFrame([dict(step=0, val_mnrl=9.9)]), b["val"]], ignore_index=True))
    cfg = type("Cfg", (), {"phase_b": type("B", (), {"val_batches": 2})()})()
    s = Setup(cfg=cfg, seed=0, train_pairs=[], val_pairs=pairs(8), subjects={}, conf={})
    m = load_checkpoint(build_nomic_layout_moe(tiny, init="sparse", seed=3), pb["checkpoint"], "linear")
    fresh = validation_mnrl(m, pairs(8), batch_size=4, val_batches=2, embed=st_embed)
    assert _phase_b_end_val(s, pb, "linear", 2) == fresh
    assert _phase_b_end_val(s, pb, "sba", 2) is None and _phase_b_end_val(s, pb, "linear", 3) is None
    assert _phase_b_end_val(s, dict(pb, steps=6), "linear", 2) is None
