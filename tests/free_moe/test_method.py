"""Tests for moelab.free_moe (Free-MoE / DOWP, paper 004; notebook 05) against naive references on tiny Llama models."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from moelab import free_moe as fm

from helpers.free_moe import TEXTS, batches, tiny_llama


# ---------------------------------------------------------------- calibration and Eq. 4 --------------------------
def test_input_norms_match_all_tokens_naive(model, tok):
    norms = fm.method.collect_input_norms(model, batches(tok))
    # naive: keep every token's input to each Linear, one unpadded sequence at a time
    lin = fm.method.target_linears(model)
    kept = {n: [] for n in lin}
    hs = [m.register_forward_hook(lambda mod, inp, out, n=n: kept[n].append(inp[0].reshape(-1, inp[0].shape[-1])))
          for n, m in lin.items()]
    with torch.no_grad():
        for t in TEXTS:
            model(**tok(t, return_tensors="pt"))
    for h in hs:
        h.remove()
    for n in lin:
        X = torch.cat(kept[n]).double()                                 # [T, in] all calibration tokens
        torch.testing.assert_close(norms.norm(n), X.norm(dim=0).float(), rtol=1e-4, atol=1e-5)
        # Eq. 4 at 1x1 = Wanda's metric |W_ij| * ||X_j||_2
        torch.testing.assert_close(fm.method.patch_importance(lin[n].weight, norms.norm(n), 1),
                                   lin[n].weight.abs() * X.norm(dim=0).float()[None, :], rtol=1e-4, atol=1e-6)
    assert norms.n_tokens == sum(len(tok(t)["input_ids"]) for t in TEXTS)


@pytest.mark.parametrize("p", [2, 4, 16])
def test_patch_importance_matches_loop(p):
    g = torch.Generator().manual_seed(1)
    W, x = torch.randn(32, 48, generator=g), torch.rand(48, generator=g)
    M = fm.method.patch_importance(W, x, p)
    ref = torch.zeros(32 // p, 48 // p)
    for i in range(32 // p):
        for j in range(48 // p):
            for m in range(i * p, (i + 1) * p):
                for n in range(j * p, (j + 1) * p):
                    ref[i, j] += abs(W[m, n]) * x[n]                   # M_ij = Σ |W_mn| ||X_n||
    torch.testing.assert_close(M, ref, rtol=1e-5, atol=1e-5)


def test_band_0_5_is_wanda_mask(model, tok):
    norms = fm.method.collect_input_norms(model, batches(tok))
    ranks = fm.method.patch_ranks(model, norms, patch=1)
    for sparsity in (5.0, 25.0, 50.0):
        mask = fm.method.band_mask(ranks, (0.0, sparsity), counts="floor")
        exact = fm.method.band_mask(ranks, (0.0, sparsity))                      # default counts="exact"
        for n, lin in fm.method.target_linears(model).items():
            # Wanda (locuslab/wanda lib/prune.py, unstructured): metric per output row, prune the lowest int(n*s)
            metric = lin.weight.abs() * norms.norm(n)[None, :]
            idx = torch.sort(metric, dim=-1, stable=True)[1][:, :int(metric.shape[1] * sparsity / 100)]
            ref = torch.zeros_like(metric, dtype=torch.bool).scatter_(1, idx, True)
            assert torch.equal(mask.element_mask(n), ref), n
            if metric.shape[1] * sparsity / 100 == int(metric.shape[1] * sparsity / 100):   # n·s whole: no rounding
                assert torch.equal(exact.element_mask(n), ref), n


def test_bands_tile_the_ranking(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)), patch=2, scope="matrix")
    total = {n: torch.zeros(r.shape, dtype=torch.int32) for n, r in ranks.ranks.items()}
    for lo in range(0, 100, 5):
        m = fm.method.band_mask(ranks, (lo, lo + 5))
        for n in total:
            total[n] += m.patch_mask(n).int()
    assert all(bool((t == 1).all()) for t in total.values())     # every patch in exactly one band


# ---------------------------------------------------------------- apply / remove ---------------------------------
@pytest.mark.parametrize("patch,sub", [(1, "both"), (2, "mlp"), (16, "attn")])
def test_apply_remove_bit_for_bit(tok, patch, sub):
    model = tiny_llama(seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok), sublayers=sub), patch, sub)
    mask = fm.method.band_mask(ranks, (50, 100))          # wide enough that a 2x2 grid of 16x16 patches purifies some
    lin = fm.method.target_linears(model, sub)
    assert set(mask.bits) == set(lin)
    for n, b in mask.bits.items():                                  # packed: one bit per patch
        assert b.dtype == np.uint8 and b.nbytes == math.ceil(lin[n].weight.numel() / patch ** 2 / 8)
    h = fm.method.apply_mask(model, mask)
    zeros = sum(int((lin[n].weight[mask.element_mask(n)] == 0).sum()) for n in lin)
    assert zeros == mask.n_purified() > 0
    changed = sum(int((model.state_dict()[k] != before[k]).sum()) for k in before)
    assert 0 < changed <= mask.n_purified()
    h.remove()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    h.remove()                                                      # idempotent


def test_mask_switcher_restores(model, tok):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    sw = fm.method.MaskSwitcher(model, {"a": fm.method.band_mask(ranks, (0, 5)), "b": fm.method.band_mask(ranks, (95, 100)), "c": None})
    for key in ["a", "a", "b", "c", "a", None, "b"]:
        sw.set(key)
    assert sw.n_switches == 6
    sw.close()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="zzz"):
        sw.set("zzz")


# ---------------------------------------------------------------- bad input --------------------------------------
def test_value_errors(model, tok):
    norms = fm.method.collect_input_norms(model, batches(tok))
    ranks = fm.method.patch_ranks(model, norms)
    for band in [(-1, 5), (95, 101), (10, 10), (50, 40)]:
        with pytest.raises(ValueError, match="band"):
            fm.method.band_mask(ranks, band)
    with pytest.raises(ValueError, match="does not divide"):
        fm.method.patch_importance(torch.randn(30, 32), torch.rand(32), 4)
    with pytest.raises(ValueError, match="does not divide"):
        fm.method.patch_ranks(tiny_llama(hidden=24, inter=40), norms, patch=16)
    with pytest.raises(ValueError, match="no nn.Linear named"):
        fm.method.target_linears(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="sublayers"):
        fm.method.target_linears(model, "ffn")
    with pytest.raises(ValueError, match="no reference examples"):
        fm.experiment.band_sweep(model, {"c0": ranks}, {"c0": []}, lambda m, it: np.zeros(len(it)), [(0, 5)])


# ---------------------------------------------------------------- sweep, selection, table ------------------------
def test_band_sweep_and_table(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    items = [dict(prompt=t[:10], answer=t[10:]) for t in TEXTS]
    score = lambda m, it: fm.scoring.answer_logprob(m, tok, it, batch_size=4)
    bands = [(0, 5), (50, 55), (95, 100)]
    sw = fm.experiment.band_sweep(model, {"c0": ranks, "c1": ranks}, {"c0": items[:5], "c1": items[5:]}, score, bands)
    assert set(sw.band) == {"base", "0-5%", "50-55%", "95-100%"} and len(sw) == 4 * 8
    t = fm.report.sweep_table(sw)
    assert list(t.columns) == ["cluster", "samples", "base", "0-5%", "50-55%", "95-100%", "max", "best_band", "share"]
    assert t.samples.tolist() == [5, 3] and abs(t.share.sum() - 100) < 1e-9
    best = fm.experiment.select_bands(sw, bands)
    means = sw.groupby(["cluster", "band"]).score.mean()
    for c, b in best.items():
        assert means[(c, fm.band_label(b))] == max(means[(c, fm.band_label(x))] for x in bands)


# ---------------------------------------------------------------- scoring vs naive --------------------------------
def test_continuation_logprobs_match_naive(model, tok):
    ctx, cont = [t[:12] for t in TEXTS], [t[12:] for t in TEXTS]
    lp, n = fm.scoring.continuation_logprobs(model, tok, ctx, cont, batch_size=3)
    for i in range(len(ctx)):
        a = tok(ctx[i], add_special_tokens=False)["input_ids"]
        b = tok(cont[i], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([a + b])).logits[0]
        ref = sum(torch.log_softmax(logits[len(a) + t - 1], -1)[b[t]].item() for t in range(len(b)))
        assert abs(lp[i] - ref) < 1e-4 and n[i] == len(b)
    items = [dict(prompt=ctx[0], choices=[cont[0], cont[1]], label=int(lp[0] < lp[1] * 0 + lp[0] - 1))]
    assert fm.scoring.choice_accuracy(model, tok, items).shape == (1,)


# ---------------------------------------------------------------- subdomains and router ---------------------------
def _blobs(n_per=30, centers=4, d=8, seed=0):
    rng = np.random.default_rng(seed)
    mu = rng.normal(0, 6, (centers, d))
    X = np.concatenate([mu[c] + rng.normal(0, 0.5, (n_per, d)) for c in range(centers)]).astype(np.float32)
    return X, np.repeat(np.arange(centers), n_per)


def test_kmeans_eq3_nearest_centroid():
    X, y = _blobs()
    km = fm.method.fit_subdomains(X, 4, seed=0)
    naive = np.argmin(((X[:, None, :] - km.cluster_centers_[None]) ** 2).sum(-1), 1)   # k = argmin ||F - μ_k||
    assert (km.predict(X) == naive).all()
    from sklearn.metrics import adjusted_rand_score
    assert adjusted_rand_score(y, km.labels_) > 0.99
    with pytest.raises(ValueError, match="k="):
        fm.method.fit_subdomains(X[:3], 5)


def test_multilevel_router():
    X, y = _blobs(centers=4)
    dom = np.where(y < 2, "code", "maths")
    sub = np.array([f"{d}_{c % 2}" for d, c in zip(dom, y)])
    r = fm.method.MultiLevelRouter().fit(X, dom, sub)
    pd_, ps = r.predict(X)
    assert (pd_ == dom).all() and (ps == sub).all()
    with pytest.raises(ValueError, match="two main domains"):
        fm.method.MultiLevelRouter().fit(X, ["a"] * len(X), sub)


def test_embedding_features(model, tok):
    F = fm.method.embedding_features(model, tok, TEXTS[:3])
    E = model.get_input_embeddings().weight
    ids = tok(TEXTS[1])["input_ids"]
    assert F.shape == (3, 32)
    np.testing.assert_allclose(F[1], E[ids].mean(0).detach().numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- paper profile path -----------------------------
def test_paper_profile_local_path(tmp_path, tok):
    from moelab.assets import MissingAsset
    with pytest.raises(MissingAsset):
        fm.experiment.load_local_model(None)
    with pytest.raises(MissingAsset):
        fm.experiment.load_local_model(tmp_path / "absent")
    m = tiny_llama(seed=5)
    m.save_pretrained(tmp_path / "llama")
    tok.save_pretrained(tmp_path / "llama")
    m2, tok2 = fm.experiment.load_local_model(tmp_path / "llama")
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k])
    assert len(fm.method.target_linears(m2)) == 2 * 7


# ---------------------------------------------------------------- pipeline pieces --------------------------------
def test_restrict_mask_equals_sublayer_ranking(model, tok):
    norms = fm.method.collect_input_norms(model, batches(tok))
    both = fm.method.band_mask(fm.method.patch_ranks(model, norms, 1, "both"), (0, 20))
    for sub in ("mlp", "attn"):
        only = fm.method.band_mask(fm.method.patch_ranks(model, norms, 1, sub), (0, 20))
        r = fm.method.restrict_mask(both, sub)
        assert set(r.bits) == set(only.bits)
        assert all(np.array_equal(r.bits[n], only.bits[n]) for n in r.bits)


def test_routed_scores_match_manual(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    masks = {"a": fm.method.band_mask(ranks, (0, 30)), "b": fm.method.band_mask(ranks, (70, 100)), "dense": None}
    items = [dict(prompt=t[:10], answer=t[10:]) for t in TEXTS]
    keys = ["a", "b", "dense", "a", "b", "a", "dense", "b"]
    got = fm.experiment.routed_scores(model, tok, items, keys, masks, batch_size=2)
    for i, (it, k) in enumerate(zip(items, keys)):
        if masks[k] is None:
            ref = fm.scoring.answer_logprob(model, tok, [it])[0]
        else:
            with fm.method.apply_mask(model, masks[k]):
                ref = fm.scoring.answer_logprob(model, tok, [it])[0]
        assert abs(got[i] - ref) < 1e-4


def test_assign_subdomains(model, tok):
    ref = {"code": [dict(prompt=t) for t in TEXTS[:4]], "maths": [dict(prompt=t) for t in TEXTS[4:]]}
    out = fm.experiment.assign_subdomains(model, tok, ref, {"code": ref["code"][:2], "maths": []}, k=2)
    assert set(out["code"]["ref_labels"]) <= {"code_0", "code_1"} and len(out["maths"]["test_labels"]) == 0
    assert list(out["code"]["test_labels"]) == list(out["code"]["ref_labels"][:2])   # same texts -> same centroid
    with pytest.raises(ValueError, match="no reference examples"):
        fm.experiment.assign_subdomains(model, tok, {"x": []}, {}, k=2)


def test_quantisation_grid_stats():
    m = tiny_llama(seed=2)
    with torch.no_grad():      # put one matrix on a 16-level grid per block of 32: w = d*q + m0
        w = m.model.layers[0].mlp.down_proj.weight
        q = torch.randint(0, 16, w.shape).float()
        w.copy_((q - 8) * 0.01)
    st = fm.quantisation_grid_stats(m).set_index("matrix")
    assert st.loc["model.layers.0.mlp.down_proj", "max_distinct"] <= 16
    assert st.loc["model.layers.1.mlp.down_proj", "distinct_per_block"] == 32


def test_choice_logprobs_shared_prefix_matches_batched(model, tok):
    for t in TEXTS[:4]:
        ctx, choices = t[:9], [t[9:], " yes", " no and maybe"]
        ref, _ = fm.scoring.continuation_logprobs(model, tok, [ctx] * 3, choices, batch_size=2)
        np.testing.assert_allclose(fm.scoring.choice_logprobs(model, tok, ctx, choices), ref, rtol=1e-4, atol=1e-4)
    items = [dict(prompt=TEXTS[0][:9], choices=[TEXTS[0][9:], " zz"], label=0)]
    ref, _ = fm.scoring.continuation_logprobs(model, tok, [items[0]["prompt"]] * 2, items[0]["choices"])
    assert fm.scoring.choice_accuracy(model, tok, items)[0] == float(np.argmax(ref) == 0)


def test_band_sweep_passes_the_band_reading(model, tok):
    """``mode`` / ``counts`` reach the masks the sweep applies (the alternative readings)."""
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)), patch=2, scope="matrix")
    items = [dict(prompt=t[:10], answer=t[10:]) for t in TEXTS[:3]]
    score = lambda m, it: fm.scoring.answer_logprob(m, tok, it, batch_size=4)
    sw = fm.experiment.band_sweep(model, {"c0": ranks}, {"c0": items}, score, [(90, 100)], include_base=False, mode="keep",
                       counts="floor")
    with fm.method.apply_mask(model, fm.method.band_mask(ranks, (90, 100), mode="keep", counts="floor")):
        ref = score(model, items)
    np.testing.assert_allclose(sw.score.values, ref, rtol=0, atol=1e-6)
