"""Geometry of MoE expert outputs and what aggregation does to it (SBA paper §III, §IV-B, §VI-B; notebook ``02_sba``).

Only what is new in the SBA paper lives here; the aggregation operators themselves (linear, SBA, norm-free, unit) are
:mod:`moelab.core.aggregation`, the expert-output capture is :mod:`moelab.core.capture`.

- :func:`pair_geometry`: per token and MoE layer, the two chosen experts' norms r1, r2 (router rank order), their ratio
  r1/r2 (Fig. 1), the angle between them (Fig. 2), and ||y|| / r̄ with r̄ = (r1 + r2)/2 for every aggregation operator
  (Fig. 5), plus an exact decomposition of linear aggregation's shrinkage:

      ||y_lin|| / r̄ = s · (||Σ ŵ_i e_i|| / Σ ŵ_i r_i) · (Σ ŵ_i r_i / r̄),   s = Σ_i w_i,  ŵ_i = w_i / s

  i.e. (weights not summing to one) × (angular cancellation, ≤ 1, = 1 iff aligned) × (radius mixing, ≈ 1 when r1 ≈ r2).
- :func:`collect_geometry`: runs a model over texts grouped by domain under :func:`moelab.core.capture.capture_moe`
  and returns a long table (one row per token × layer).
- :func:`summarize_geometry`: per-layer and pooled statistics (median ratio, share of angles above 40°, ...).
- Specialisation: :func:`routing_jsd` (Jensen–Shannon divergence of expert usage across domains) and
  :func:`expert_similarity` (mean pairwise cosine similarity of the experts' weights).
- Fine-tuning glue: :func:`build_moe_minilm` (MiniLM with every other FFN an 8-expert top-2 MoE) and :func:`mnrl_loss`.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import torch

# shared with notebook 03 through the core, not imported from moelab.cluster_upcycling (issue 21, item 0);
# expert_similarity and jensen_shannon are re-exported here (the JSD also backs routing_jsd below)
from moelab.core.cluster_init import ClusterAwareInit
from moelab.core.similarity import expert_similarity
from moelab.core import diagnostics
from moelab.profiles import paper_input_hint
from moelab.stats import jensen_shannon

ZERO_NORM_EPS = 1e-8
AGGREGATIONS = ("linear", "sba", "sba_normfree", "sba_unit")


# ----------------------------------------------------------------------------------------------------------------------
# per-token geometry of the two chosen experts
# ----------------------------------------------------------------------------------------------------------------------
def pair_geometry(expert_outputs: torch.Tensor, weights: torch.Tensor, eps: float = ZERO_NORM_EPS,
                  operators=AGGREGATIONS) -> dict:
    """Geometry of top-2 expert outputs (SBA paper §III-A/B, §IV-B, §VI-B).

    expert_outputs [T, 2, d] (the chosen experts, in router rank order), weights [T, 2] (router weights as the layer
    used them). Returns numpy arrays [T']: ``r1``, ``r2``, ``norm_ratio`` = r1/r2, ``angle_deg``, ``weight_sum`` s,
    ``ratio_<op>`` = ||op(e, w)|| / r̄ for each aggregation operator, and the three shrinkage factors
    ``f_weight_sum``, ``f_angular``, ``f_radius_mix`` whose product is ``ratio_linear``.

    Zero-norm expert outputs (r < eps) have no direction: those tokens are dropped and counted in ``n_zero_norm``
    (T' = T - n_zero_norm); a ``UserWarning`` says how many.
    """
    from moelab.core.aggregation import aggregate

    if expert_outputs.ndim != 3 or expert_outputs.shape[1] != 2:
        raise ValueError(f"expert_outputs must be [tokens, 2, d_model] (top-2), got {tuple(expert_outputs.shape)}")
    if weights.shape != expert_outputs.shape[:2]:
        raise ValueError(f"weights shape {tuple(weights.shape)} does not match expert_outputs "
                         f"{tuple(expert_outputs.shape[:2])}")
    e = expert_outputs.detach().double()
    w = weights.detach().double()
    r = e.norm(dim=-1)  # r_i = ||e_i||   [T, 2]
    valid = (r > eps).all(dim=1)
    n_zero = int((~valid).sum())
    if n_zero:
        warnings.warn(f"{n_zero} of {len(r)} token(s) have a zero-norm expert output (||e|| <= {eps:g}); "
                      "they have no direction and are left out of the geometry statistics", stacklevel=2)
    e, w, r = e[valid], w[valid], r[valid]
    out = {"n_zero_norm": n_zero, "n_tokens": int(valid.sum())}
    u = e / r.unsqueeze(-1)  # û_i = e_i / r_i   [T, 2, d]
    cos = (u[:, 0] * u[:, 1]).sum(-1).clamp(-1.0, 1.0)
    r_bar = r.mean(dim=1)  # r̄ = (r1 + r2) / 2
    s = w.sum(dim=1)  # s = w1 + w2 (< 1 for nomic's unnormalised top-2)
    w_hat = w / s.unsqueeze(-1)
    mix = (w_hat * r).sum(dim=1)  # Σ ŵ_i r_i
    lin_hat = (w_hat.unsqueeze(-1) * e).sum(dim=1).norm(dim=-1)  # ||Σ ŵ_i e_i||
    out.update(r1=r[:, 0], r2=r[:, 1], norm_ratio=r[:, 0] / r[:, 1], angle_deg=torch.rad2deg(torch.arccos(cos)),
               weight_sum=s, f_weight_sum=s, f_angular=lin_hat / mix, f_radius_mix=mix / r_bar)
    for op in operators:
        y = aggregate(e.float(), w.float(), method=op).double()
        out[f"ratio_{op}"] = y.norm(dim=-1) / r_bar
    return {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in out.items()}


def geometry_frame(records: dict, domain: str | None = None, max_tokens: int | None = None) -> pd.DataFrame:
    """Long table from capture records ``{layer_name: {indices, weights, expert_outputs}}``: one row per token × layer."""
    frames = []
    for li, (name, rec) in enumerate(records.items()):
        eo, w = rec["expert_outputs"], rec["weights"]
        if max_tokens is not None:
            eo, w = eo[:max_tokens], w[:max_tokens]
        if len(eo) == 0:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = pair_geometry(eo, w)
        n_zero = g.pop("n_zero_norm")
        g.pop("n_tokens")
        df = pd.DataFrame(g)
        df.insert(0, "layer", name)
        df.insert(1, "layer_pos", li)
        if domain is not None:
            df.insert(0, "domain", domain)
        df.attrs["n_zero_norm"] = n_zero
        frames.append(df)
    if not frames:
        raise ValueError("no captured tokens: were the MoE layers run under capture_moe?")
    out = pd.concat(frames, ignore_index=True)
    out.attrs["n_zero_norm"] = sum(f.attrs.get("n_zero_norm", 0) for f in frames)
    return out


def collect_geometry(model, forward_fn, texts_by_domain: dict, max_tokens_per_domain: int = 2000):
    """Run ``forward_fn(texts)`` per domain under ``capture_moe(model)``; return (geometry table, routing counts).

    ``forward_fn(texts) -> token_mask`` runs the model and returns a bool vector over the tokens the MoE layers saw
    (in order; False = padding), or None when the layers see real tokens only (nomic routes unpadded tokens).
    Routing counts: DataFrame [domain, layer, expert, count] of the top-k assignments of real tokens (for
    :func:`routing_jsd`). SBA paper §III (prompts spanning many subjects); notebook 02_sba.
    """
    from moelab.core.capture import capture_moe

    if not texts_by_domain:
        raise ValueError("texts_by_domain is empty")
    frames, counts = [], []
    for dom, texts in texts_by_domain.items():
        if not texts:
            raise ValueError(f"domain {dom!r} has no texts")
        with torch.no_grad(), capture_moe(model, keep_outputs=True, stats=False) as cap:
            token_mask = forward_fn(list(texts))
        recs = {}
        for name, rec in cap.records.items():
            keep = torch.ones(len(rec["indices"]), dtype=torch.bool)
            if token_mask is not None:
                keep = token_mask.bool()[rec["positions"]]
            keep &= torch.cumsum(keep, 0) <= max_tokens_per_domain
            recs[name] = {k: (v[keep] if torch.is_tensor(v) and v.ndim and len(v) == len(keep) else v)
                          for k, v in rec.items()}
            idx = recs[name]["indices"].reshape(-1)
            c = torch.bincount(idx[idx >= 0].long(), minlength=int(rec["num_experts"])).numpy()
            counts += [dict(domain=dom, layer=name, expert=e, count=int(c[e])) for e in range(len(c))]
        frames.append(geometry_frame(recs, domain=dom))
    geo = pd.concat(frames, ignore_index=True)
    geo.attrs["n_zero_norm"] = sum(f.attrs.get("n_zero_norm", 0) for f in frames)
    return geo, pd.DataFrame(counts)


def summarize_geometry(geo: pd.DataFrame, by=("layer",), angle_threshold: float = 40.0,
                       near_one: float = 0.1) -> pd.DataFrame:
    """Per-group and pooled statistics (rows with ``layer == 'pooled'`` aggregate all layers)."""
    if len(geo) == 0:
        raise ValueError("empty geometry table")
    ratio_cols = [c for c in geo.columns if c.startswith("ratio_")]

    def stats(d):
        row = {"n_tokens": len(d),
               "norm_ratio_median": d.norm_ratio.median(),
               "norm_ratio_iqr": d.norm_ratio.quantile(0.75) - d.norm_ratio.quantile(0.25),
               "share_norm_ratio_within_10pct": ((d.norm_ratio - 1).abs() <= near_one).mean(),
               "log_norm_ratio_sd": np.log(d.norm_ratio).std(),
               "angle_median_deg": d.angle_deg.median(),
               f"share_angle_above_{angle_threshold:g}deg": (d.angle_deg > angle_threshold).mean(),
               "weight_sum_mean": d.weight_sum.mean(),
               "f_weight_sum_mean": d.f_weight_sum.mean(), "f_angular_mean": d.f_angular.mean(),
               "f_radius_mix_mean": d.f_radius_mix.mean()}
        for c in ratio_cols:
            row[f"{c}_mean"] = d[c].mean()
        return pd.Series(row)

    by = list(by)
    per = geo.groupby(by, sort=False).apply(stats, include_groups=False).reset_index()
    pooled = stats(geo).to_frame().T
    for b in by:
        pooled.insert(0, b, "pooled") if b not in pooled else None
    return pd.concat([per, pooled[per.columns]], ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# specialisation
# ----------------------------------------------------------------------------------------------------------------------
def routing_jsd(counts: pd.DataFrame) -> pd.DataFrame:
    """JSD across domains of each layer's expert-usage distribution (0 = domain-blind routing; max log2(#domains)).

    counts: [domain, layer, expert, count] from :func:`collect_geometry`. Returns [layer, jsd_bits] plus a 'mean' row.
    """
    if counts.empty:
        raise ValueError("empty routing counts")
    rows = []
    for layer, d in counts.groupby("layer", sort=False):
        P = d.pivot_table(index="domain", columns="expert", values="count", aggfunc="sum").fillna(0).to_numpy(float)
        if (P.sum(axis=1) == 0).any():
            raise ValueError(f"layer {layer!r}: a domain routed no tokens")
        rows.append(dict(layer=layer, jsd_bits=jensen_shannon(P)))  # moelab.stats (issue 18, item 7)
    df = pd.DataFrame(rows)
    return pd.concat([df, pd.DataFrame([dict(layer="mean", jsd_bits=df.jsd_bits.mean())])], ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# prompts spanning many subjects: WordNet lexicographer files (stand-in for the paper's 57 MMLU subjects)
# ----------------------------------------------------------------------------------------------------------------------
def wordnet_subject_texts(num_subjects: int = 24, per_subject: int = 16, seed: int = 0,
                          min_words: int = 6) -> dict:
    """{lexicographer file -> texts "lemma: definition"} from the real WordNet 3.0 database (read by
    :mod:`moelab.suite.wordnet`): the ``num_subjects`` noun/verb files with the most definitions of at least
    ``min_words`` words, ``per_subject`` of them drawn at random (seeded) from each file."""
    from moelab.suite import wordnet

    if not 1 <= num_subjects <= 41:
        raise ValueError(f"num_subjects={num_subjects} must be in [1, 41] (WordNet has 26 noun + 15 verb files)")
    if per_subject < 1:
        raise ValueError(f"per_subject={per_subject} must be >= 1")
    by_file: dict = {}
    for pos in (("n",) if num_subjects <= 26 else ("n", "v")):  # 26 noun files; verbs only when more are asked
        for off in sorted(syn := wordnet.synsets(pos)):
            s = syn[off]
            if len(s.definition.split()) >= min_words and s.lexname[:4] in ("noun", "verb"):
                by_file.setdefault(s.lexname, []).append(f"{s.lemmas[0]}: {s.definition}")
    ranked = sorted(by_file, key=lambda k: (-len(by_file[k]), k))[:num_subjects]
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(ranked):
        items = by_file[name]
        pick = rng.choice(len(items), size=min(per_subject, len(items)), replace=False)
        out[name] = [items[i] for i in sorted(pick)]
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the embedded MoE embedding model: all-MiniLM-L6-v2 with every other FFN an 8-expert top-2 MoE
# ----------------------------------------------------------------------------------------------------------------------
def build_moe_minilm(renormalize: bool = True, init: str = "drop", aggregation: str = "linear",
                     num_experts: int = 8, top_k: int = 2, seed: int = 0, drop_ratio: float = 0.5,
                     max_seq_length: int = 128, calib_texts=None):
    """all-MiniLM-L6-v2 (``moelab.assets.load_minilm``) with its odd FFNs (layers 1, 3, 5) turned into MoE layers by
    :func:`moelab.core.convert.moeify` (notebook 02_sba; the stand-in for nomic-embed-text-v2-moe).

    Layout: experts keep the FFN's biases (b_in, b_out per expert) and, with ``renormalize=True``, the kept top-2
    weights sum to one, so sparse upcycling (``init="sparse"``) reproduces MiniLM exactly:
    Σ_i w_i FFN(x) = FFN(x). nomic's layout differs: bias-free experts plus one shared bias, and unnormalised top-2
    (w_1 + w_2 = s < 1); ``renormalize=False`` builds that routing here (the output then starts at s·FFN(x)).
    ``init``: "sparse" (identical copies: angle 0 between experts), "drop" (Drop-Upcycling, ``drop_ratio`` of the
    hidden units re-drawn per expert), "cluster" (cluster-aware init of notebook 03, calibrated on ``calib_texts``).
    """
    from moelab.assets import load_minilm
    from moelab.core import init as core_init
    from moelab.core.convert import collect_ffn_inputs, moeify
    from moelab.seed import seed_everything

    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r}; expected one of {AGGREGATIONS}")
    seed_everything(seed)
    st = load_minilm()
    st.max_seq_length = max_seq_length
    calib = None
    if init == "sparse":
        init_fn = core_init.sparse_upcycle
    elif init == "drop":
        init_fn = core_init.drop_init(ratio=drop_ratio, seed=seed)
    elif init == "cluster":
        if not calib_texts:
            raise ValueError("init='cluster' needs calib_texts")
        init_fn = ClusterAwareInit(seed=seed)
        batches = [dict(st.tokenize(list(calib_texts[i:i + 32]))) for i in range(0, len(calib_texts), 32)]
        calib = collect_ffn_inputs(st[0].auto_model, batches, layers="every_other", max_tokens=4096)
    else:
        raise ValueError(f"init={init!r}; expected 'sparse', 'drop' or 'cluster'")
    moeify(st[0].auto_model, layers="every_other", num_experts=num_experts, top_k=top_k, init=init_fn,
           calib_inputs=calib, renormalize=renormalize, aggregation=aggregation, bias=True)
    return st


def set_aggregation(model, method: str):
    """Switch every MoE layer of ``model`` to ``method`` (routing, experts and weights untouched)."""
    from moelab.core.layer import moe_layers

    if method not in AGGREGATIONS:
        raise ValueError(f"aggregation={method!r}; expected one of {AGGREGATIONS}")
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers")
    for layer in layers:
        layer.aggregation = method
    return model


def st_forward_fn(st, batch_size: int = 32):
    """forward_fn for :func:`collect_geometry` on a SentenceTransformer: runs the texts, returns the padding mask
    over the tokens the MoE layers saw (BERT's MoE sees padded [B, S] batches)."""

    @torch.no_grad()
    def run(texts):
        masks = []
        st.eval()
        for i in range(0, len(texts), batch_size):
            feats = st.tokenize(texts[i:i + batch_size])
            st(dict(feats))
            masks.append(feats["attention_mask"].reshape(-1).bool())
        return torch.cat(masks)

    return run


def st_encode_fn(st, batch_size: int = 64):
    """texts -> L2-normalised numpy embeddings [N, d] (the encode function for ``moelab.suite.embed.evaluate``)."""

    def encode(texts):
        texts = list(texts)
        if not texts:
            raise ValueError("encode got an empty list of texts")
        return st.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=False)

    return encode


class PairCollate:
    """Pairs (anchor, positive) or triplets (anchor, positive, negative) -> dict of tokenised features.

    ``tokenize_anchor`` / ``tokenize_doc``: texts -> features dict (for nomic: its query / document prefixes); a
    SentenceTransformer's ``tokenize`` serves both for MiniLM."""

    def __init__(self, tokenize_anchor, tokenize_doc=None):
        self.tok_a = tokenize_anchor
        self.tok_d = tokenize_doc or tokenize_anchor

    def __call__(self, batch):
        if not batch:
            raise ValueError("empty batch of pairs")
        n = {len(x) for x in batch}
        if n not in ({2}, {3}):
            raise ValueError(f"expected (anchor, positive[, negative]) tuples, got lengths {sorted(n)}")
        cols = list(zip(*batch))
        out = {"anchor": dict(self.tok_a(list(cols[0]))), "positive": dict(self.tok_d(list(cols[1])))}
        if len(cols) == 3:
            out["negative"] = dict(self.tok_d(list(cols[2])))
        return out


def st_embed(model, features):
    """Sentence embedding of a SentenceTransformer for a features dict."""
    return model(features)["sentence_embedding"]


def nomic_embed(model, features):
    """Sentence embedding of :class:`moelab.nomic.NomicEmbed` for a features dict."""
    return model.embed(features["input_ids"], features["attention_mask"])


def mnrl_loss(model, batch, scale: float = 20.0, aux_coef: float = 0.01, embed=st_embed):
    """Multiple Negatives Ranking Loss (SBA paper Eq. 12) with in-batch negatives, cosine similarity, τ = 1/scale:

        L = -1/N Σ_i log( exp(cos(a_i, p_i)/τ) / Σ_j exp(cos(a_i, c_j)/τ) ),  c = [p; n]   scores [N, N or 2N]

    (hard negatives n appended when the batch has them, as for all-nli triplets), plus ``aux_coef`` × the Switch
    balancing loss of the MoE layers summed over the passes. Written out instead of sentence-transformers' MNRL
    module because the trainer hands in its own (possibly wrapped) model, which that module would not call.
    """
    from moelab.core.layer import aux_loss

    F_ = torch.nn.functional
    a = embed(model, batch["anchor"])  # [N, d]
    aux = aux_loss(model)
    cands = [embed(model, batch["positive"])]  # [N, d]
    aux = aux + aux_loss(model)
    if "negative" in batch:
        cands.append(embed(model, batch["negative"]))
        aux = aux + aux_loss(model)
    c = torch.cat(cands)
    scores = scale * F_.normalize(a, dim=-1) @ F_.normalize(c, dim=-1).T  # cos(a_i, c_j) / τ
    labels = torch.arange(len(a), device=scores.device)
    ce = F_.cross_entropy(scores, labels)  # Eq. 12
    loss = ce + aux_coef * aux.to(ce.device)
    # task_loss: the MNRL alone, whose router gradient the trainer logs (issue 15, item 1)
    return loss, {"mnrl": float(ce.detach()), "aux": float(aux.detach()), "task_loss": ce}


def finetune_embedder(model, train_pairs, val_pairs, *, steps: int, batch_size: int = 32, lr: float = 2e-5,
                      seed: int = 0, eval_every: int = 0, warmup_frac: float = 0.1, aux_coef: float = 0.01,
                      val_batches: int = 4, collate=None, embed=st_embed, grad_accum: int = 1):
    """Contrastive fine-tuning through :func:`moelab.train.train`: MNRL (cosine, scale 20 = τ 0.05), AdamW, linear
    warm-up over 10% then linear decay (SBA paper §V-B). ``collate`` defaults to the SentenceTransformer's tokenizer.
    Returns the TrainResult (``eval_history.val_mnrl``: validation loss on held-out pairs)."""
    from torch.utils.data import DataLoader

    from moelab.train import TrainConfig, train

    if len(train_pairs) < batch_size:
        raise ValueError(f"{len(train_pairs)} training pairs < batch_size {batch_size}")
    if not val_pairs:
        raise ValueError("no validation pairs")
    collate = collate or PairCollate(model.tokenize)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(train_pairs), batch_size=batch_size, shuffle=True, collate_fn=collate, generator=g,
                        drop_last=True)
    val_pairs = list(val_pairs)[: val_batches * batch_size]
    vb = [collate(val_pairs[i:i + batch_size]) for i in range(0, len(val_pairs), batch_size)]
    vb = [b for b in vb if len(b["anchor"]["input_ids"]) > 1]

    def eval_fn(m):
        return {"val_mnrl": float(np.mean([mnrl_loss(m, b, aux_coef=0.0, embed=embed)[1]["mnrl"] for b in vb]))}

    cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=warmup_frac, decay="linear", weight_decay=0.01, seed=seed,
                      eval_every=eval_every, log_every=max(1, steps // 10), max_grad_norm=1.0, device="auto",
                      desc="mnrl", grad_accum=grad_accum)
    return train(model, loader, loss_fn=lambda m, b: mnrl_loss(m, b, aux_coef=aux_coef, embed=embed), cfg=cfg,
                 eval_fn=eval_fn)


def moe_specialisation(st) -> pd.DataFrame:
    """Mean pairwise expert similarity per MoE layer of a model (1 = the experts are still copies)."""
    from moelab.core.layer import moe_layers

    return pd.DataFrame([dict(layer=i, expert_similarity=expert_similarity(l)) for i, l in enumerate(moe_layers(st))])


# ----------------------------------------------------------------------------------------------------------------------
# paper profile: the paper's data from local copies (nothing can be downloaded here)
# ----------------------------------------------------------------------------------------------------------------------
_TABLE_EXT = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")


def _find_split_file(path, split: str, asset: str):
    from pathlib import Path

    from moelab.assets import MissingAsset

    if path is None or not Path(path).exists():
        param = "NLI_PATH" if asset.startswith("all-nli") else "MTEB_PATH"
        raise MissingAsset(asset, f"no local copy at {str(path)!r}",
                           paper_input_hint("02", param, f"the {asset} files (e.g. `{split}.jsonl.gz` or "
                                            f"`{split}-*.parquet`) copied from a machine with hub access"))
    p = Path(path)
    if p.is_file():
        return p
    cands = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_TABLE_EXT) and
                   (f.name.startswith(split) or f.parent.name == split))
    if not cands:
        raise MissingAsset(asset, f"{p} has no '{split}' file ({', '.join(_TABLE_EXT)})",
                           f"copy the {asset} '{split}' split into {p}")
    return cands[0]


def _read_table(f) -> pd.DataFrame:
    name = f.name
    if name.endswith(".parquet"):
        return pd.read_parquet(f)
    if name.endswith(".csv"):
        return pd.read_csv(f)
    return pd.read_json(f, lines=not name.endswith(".json"), compression="infer")


def _need_columns(df, cols, what):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; found {list(df.columns)}")


def load_allnli_triplets(path, split: str = "train", limit: int | None = None) -> list:
    """sentence-transformers/all-nli ``triplet`` subset from a local copy -> [(anchor, positive, negative)]
    (SBA paper §V-C: 30K triplets). Columns anchor, positive, negative."""
    f = _find_split_file(path, split, "all-nli (sentence-transformers/all-nli, triplet)")
    df = _read_table(f)
    _need_columns(df, ["anchor", "positive", "negative"], str(f))
    if limit is not None:
        df = df.iloc[:limit]
    return list(df[["anchor", "positive", "negative"]].itertuples(index=False, name=None))


def load_mteb_local(root, split: str = "test") -> dict:
    """The paper's three MTEB tasks from local copies under ``root`` (one folder each, MTEB's HF layouts):

    - ``STSBenchmark`` (mteb/stsbenchmark-sts): sentence1, sentence2, score in [0, 5];
    - ``StackExchangeClustering`` (mteb/stackexchange-clustering): rows of sentences (list), labels (list);
    - ``SprintDuplicateQuestions`` (mteb/sprintduplicatequestions-pairclassification): rows of sentence1 (list),
      sentence2 (list), labels (list of 0/1).

    Returns {task: DataFrame}. A missing folder -> ``MissingAsset``; a wrong layout -> ``ValueError``.
    """
    from pathlib import Path

    root = Path(root) if root is not None else None
    spec = {"STSBenchmark": ["sentence1", "sentence2", "score"],
            "StackExchangeClustering": ["sentences", "labels"],
            "SprintDuplicateQuestions": ["sentence1", "sentence2", "labels"]}
    out = {}
    for task, cols in spec.items():
        f = _find_split_file(None if root is None else root / task, split, f"MTEB {task}")
        df = _read_table(f)
        _need_columns(df, cols, str(f))
        out[task] = df
    return out


def evaluate_mteb_local(encode_fn, tasks: dict, seed: int = 0) -> pd.DataFrame:
    """MTEB's main scores on local copies (per set / per item rows: task, item, metric, score):
    STS Spearman of cosine vs gold, clustering V-measure of mini-batch k-means (k = #labels, per set),
    pair classification average precision of cosine similarity (per set). Metrics from scipy / scikit-learn."""
    from scipy.stats import spearmanr
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import average_precision_score, v_measure_score

    rows = []
    if "STSBenchmark" in tasks:
        df = tasks["STSBenchmark"]
        a, b = encode_fn(list(df.sentence1)), encode_fn(list(df.sentence2))
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        rows.append(dict(task="STSBenchmark", item=0, metric="cos_spearman",
                         score=float(spearmanr(cos, df.score).statistic)))
    if "StackExchangeClustering" in tasks:
        for i, r in enumerate(tasks["StackExchangeClustering"].itertuples(index=False)):
            emb = encode_fn(list(r.sentences))
            k = len(set(r.labels))
            pred = MiniBatchKMeans(n_clusters=k, batch_size=32, n_init="auto", random_state=seed).fit_predict(emb)
            rows.append(dict(task="StackExchangeClustering", item=i, metric="v_measure",
                             score=float(v_measure_score(list(r.labels), pred))))
    if "SprintDuplicateQuestions" in tasks:
        for i, r in enumerate(tasks["SprintDuplicateQuestions"].itertuples(index=False)):
            a, b = encode_fn(list(r.sentence1)), encode_fn(list(r.sentence2))
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            rows.append(dict(task="SprintDuplicateQuestions", item=i, metric="cos_ap",
                             score=float(average_precision_score(np.asarray(list(r.labels)), cos))))
    if not rows:
        raise ValueError(f"no known MTEB task among {list(tasks)}")
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------------
# one fine-tuning run, measured (what the notebook memoises per aggregation x seed)
# ----------------------------------------------------------------------------------------------------------------------
def finetune_and_measure(*, aggregation: str, seed: int, train_pairs, val_pairs, subjects: dict, steps: int,
                         batch_size: int, lr: float, eval_every: int, renormalize: bool = True, init: str = "drop",
                         drop_ratio: float = 0.5, max_tokens: int = 200, evaluate=None, calib_texts=None,
                         aux_coef: float = 0.01, val_batches: int = 4) -> dict:
    """Build the MoE MiniLM with ``aggregation``, fine-tune it (MNRL) and measure it (SBA paper §V, §VI; nb 02_sba).

    Returns dict(history, val (validation loss per eval), flattened (bool, relative fall of the validation loss,
    :func:`moelab.train.flattened`), eval (``evaluate(encode_fn)`` table or None), geo / counts (geometry and
    routing over ``subjects`` after training), similarity (expert similarity per layer), wall_s).
    """
    st = build_moe_minilm(renormalize=renormalize, init=init, aggregation=aggregation, seed=seed,
                          drop_ratio=drop_ratio, calib_texts=calib_texts)
    res = finetune_embedder(st, train_pairs, val_pairs, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                            eval_every=eval_every, aux_coef=aux_coef, val_batches=val_batches)
    st = res.model.cpu().eval()
    val = res.eval_history
    flat = _flattened(val["val_mnrl"].to_numpy())
    geo, counts = collect_geometry(st, st_forward_fn(st), subjects, max_tokens)
    return dict(history=res.history, val=val, flattened=flat, eval=None if evaluate is None else
                evaluate(st_encode_fn(st)), geo=geo, counts=counts, similarity=moe_specialisation(st),
                wall_s=res.wall_s)


def _flattened(losses) -> tuple:
    """:func:`moelab.train.flattened` of a validation-loss series, (False, nan) when it is too short to judge."""
    from moelab.train import flattened

    try:
        return flattened(losses)
    except ValueError:
        return (False, float("nan"))


def init_geometry(*, subjects: dict, renormalize: bool, init: str, seed: int = 0, drop_ratio: float = 0.5,
                  max_tokens: int = 200, calib_texts=None) -> dict:
    """Geometry, routing and expert similarity of a freshly upcycled MoE MiniLM (before any training)."""
    st = build_moe_minilm(renormalize=renormalize, init=init, seed=seed, drop_ratio=drop_ratio,
                          calib_texts=calib_texts)
    geo, counts = collect_geometry(st, st_forward_fn(st), subjects, max_tokens)
    return dict(geo=geo, counts=counts, similarity=moe_specialisation(st))


def shrinkage_decomposition(geo: pd.DataFrame, by=("layer",)) -> pd.DataFrame:
    """Mean log-factors of linear aggregation's shrinkage (see module docstring), per group and pooled:
    log(||y_lin||/r̄) = log s + log f_angular + log f_radius_mix, with each part's share of the total log-shrinkage."""
    d = geo.assign(log_total=np.log(geo.ratio_linear), log_weight_sum=np.log(geo.f_weight_sum),
                   log_angular=np.log(geo.f_angular), log_radius_mix=np.log(geo.f_radius_mix),
                   log_sba=np.log(geo.ratio_sba))
    cols = ["log_total", "log_weight_sum", "log_angular", "log_radius_mix", "log_sba"]
    per = d.groupby(list(by), sort=False)[cols].mean().reset_index()
    pooled = d[cols].mean().to_frame().T
    for b in by:
        pooled.insert(0, b, "pooled")
    out = pd.concat([per, pooled[per.columns]], ignore_index=True)
    tot = out.log_total.where(out.log_total != 0)
    for c in ("weight_sum", "angular", "radius_mix"):
        out[f"share_{c}"] = out[f"log_{c}"] / tot
    return out


def nomic_finetune_and_measure(*, model_path, aggregation: str, seed: int, train_triplets, val_triplets,
                               subjects: dict, steps: int, batch_size: int, lr: float, grad_accum: int = 1,
                               eval_every: int = 0, max_tokens: int = 200, mteb_tasks=None, device: str = "cpu",
                               aux_coef: float = 0.0) -> dict:
    """Paper profile (SBA paper §V): nomic-embed-text-v2-moe from a local path with ``aggregation`` in place of the
    linear sum, fine-tuned with MNRL on all-nli triplets (query prefix on anchors, document prefix on the rest),
    evaluated on the three MTEB tasks from local copies; geometry over ``subjects`` after training."""
    from moelab.nomic import load_nomic
    from moelab.seed import seed_everything

    seed_everything(seed)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    m = load_nomic(model_path, aggregation=aggregation, device=device)
    collate = PairCollate(lambda t: m.tokenize(t, "query"), lambda t: m.tokenize(t, "document"))
    res = finetune_embedder(m, train_triplets, val_triplets, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                            eval_every=eval_every, aux_coef=aux_coef, collate=collate, embed=nomic_embed,
                            grad_accum=grad_accum)
    m = res.model.eval()
    val = res.eval_history
    flat = _flattened(val["val_mnrl"].to_numpy())
    geo, counts = collect_geometry(m, nomic_forward_fn(m), subjects, max_tokens)
    ev = None
    if mteb_tasks is not None:
        ev = evaluate_mteb_local(lambda t: m.encode(t, kind="document").numpy(), mteb_tasks, seed=seed)
    return dict(history=res.history, val=val, flattened=flat, eval=ev, geo=geo, counts=counts,
                similarity=moe_specialisation(m), wall_s=res.wall_s)


def nomic_forward_fn(model, batch_size: int = 16):
    """forward_fn for :func:`collect_geometry` on :class:`moelab.nomic.NomicEmbed` (its MoE sees real tokens only)."""

    def run(texts):
        model.encode(texts, kind="document", batch_size=batch_size)
        return None

    return run


def scores_long(runs: dict) -> pd.DataFrame:
    """{(aggregation, seed): run dict with an ``eval`` table} -> one long table with aggregation and seed columns."""
    frames = [r["eval"].assign(aggregation=a, seed=s) for (a, s), r in runs.items() if r.get("eval") is not None]
    if not frames:
        raise ValueError("no evaluation tables in the runs")
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# notebook tables and figures (02_sba)
# ----------------------------------------------------------------------------------------------------------------------
def upcycling_exactness(texts) -> pd.DataFrame:
    """Max |embedding difference| between MiniLM and its sparse-upcycled MoE under both routings (nb 02_sba §1)."""
    from moelab.assets import load_minilm

    dense = load_minilm()
    dense.max_seq_length = 128
    ref = dense.encode(list(texts), convert_to_tensor=True)
    rows = []
    for name, renorm in [("renormalised top-2", True), ("unnormalised top-2 (nomic)", False)]:
        st = build_moe_minilm(renormalize=renorm, init="sparse")
        for agg in ("linear", "sba"):
            set_aggregation(st, agg)
            emb = st.encode(list(texts), convert_to_tensor=True)
            rows.append(dict(construction=name if agg == "linear" else f"{name}, SBA", aggregation=agg,
                             max_abs_diff=float((emb - ref).abs().max()),
                             min_cosine=float((emb * ref).sum(-1).min())))
    return pd.DataFrame(rows)


def _task_col(df):
    for c in ("benchmark", "task", "name", "dataset"):
        if c in df.columns:
            return c
    raise ValueError(f"evaluation table has no benchmark/task column: {list(df.columns)}")


def _with_key(scores: pd.DataFrame) -> pd.DataFrame:
    """Add ``bench`` = benchmark (+ '/metric' when a benchmark reports several metrics)."""
    tc = _task_col(scores)
    if "metric" not in scores.columns:
        return scores.assign(bench=scores[tc].astype(str))
    multi = scores.groupby(tc)["metric"].transform("nunique") > 1
    return scores.assign(bench=np.where(multi, scores[tc].astype(str) + "/" + scores["metric"].astype(str),
                                        scores[tc].astype(str)))


def training_table(runs: dict) -> pd.DataFrame:
    rows = []
    for (agg, seed), r in runs.items():
        h, v = r["history"], r["val"]
        flat, fall = r["flattened"]
        rows.append(dict(aggregation=agg, seed=seed, steps=int(h.step.max()),
                         train_mnrl_first=float(h.mnrl.iloc[0]), train_mnrl_last=float(h.mnrl.iloc[-1]),
                         val_mnrl_first=float(v.val_mnrl.iloc[0]) if len(v) else np.nan,
                         val_mnrl_last=float(v.val_mnrl.iloc[-1]) if len(v) else np.nan,
                         flattened=bool(flat), val_relative_fall=float(fall),
                         train_flattened=bool(_flattened(h.mnrl.to_numpy())[0]),
                         train_relative_fall=float(_flattened(h.mnrl.to_numpy())[1]), wall_s=float(r["wall_s"]),
                         **diagnostics.router_grad_summary(h)))
    return pd.DataFrame(rows)


def plot_validation(runs: dict):
    fig, ax = plt_subplots(1, 1, figsize=(5, 3.2))
    for (agg, seed), r in runs.items():
        v = r["val"]
        if len(v):
            ax.plot(v.step, v.val_mnrl, label=f"{agg} s{seed}", color=_COLORS.get(agg), alpha=0.5 + 0.15 * (seed % 3))
    ax.set_xlabel("step")
    ax.set_ylabel("validation MNRL")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


_COLORS = {"linear": "tab:blue", "sba": "tab:orange", "sba_normfree": "tab:green", "sba_unit": "tab:red"}


def plt_subplots(*a, **k):
    import matplotlib.pyplot as plt

    return plt.subplots(*a, **k)


def plot_hist(geo: pd.DataFrame, col: str, xlabel: str, by: str = "model", bins: int = 60):
    """Overlaid normalised histograms of ``col`` per ``by`` group (Figs. 1 and 2)."""
    fig, ax = plt_subplots(1, 1, figsize=(6, 3.4))
    lo, hi = np.nanpercentile(geo[col], [0.5, 99.5])
    edges = np.linspace(lo, hi, bins)
    for name, d in geo.groupby(by, sort=False):
        ax.hist(d[col].clip(lo, hi), bins=edges, density=True, histtype="step", lw=1.4, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fig5(geo: pd.DataFrame):
    """||y||/r̄ of each model's own operator (linear-trained: linear; SBA-trained: SBA), plus init models (both)."""
    fig, ax = plt_subplots(1, 1, figsize=(6, 3.4))
    edges = np.linspace(0, 1.3, 66)
    for name, d in geo.groupby("model", sort=False):
        ops = ["linear", "sba"] if d.stage.iloc[0] == "init" else (
            [name.split(" ")[0]] if name.split(" ")[0] in AGGREGATIONS else ["linear"])
        for op in ops:
            ax.hist(d[f"ratio_{op}"].clip(0, 1.3), bins=edges, density=True, histtype="step", lw=1.3,
                    ls="-" if op == "linear" else "--", label=f"{name}: {op}")
    ax.axvline(1.0, color="k", lw=0.6)
    ax.set_xlabel("||y|| / mean(r1, r2)")
    ax.set_ylabel("density")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def specialisation_table(inits: dict, runs: dict) -> pd.DataFrame:
    """Routing JSD across subjects (mean over MoE layers) and mean expert similarity, at init and after training."""
    rows = []
    for name, r in inits.items():
        rows.append(dict(model=name, stage="init", seed=None,
                         routing_jsd_bits=float(routing_jsd(r["counts"]).set_index("layer").loc["mean", "jsd_bits"]),
                         expert_similarity=float(r["similarity"].expert_similarity.mean())))
    for (agg, seed), r in runs.items():
        rows.append(dict(model=f"{agg} (fine-tuned)", stage="fine-tuned", seed=seed,
                         routing_jsd_bits=float(routing_jsd(r["counts"]).set_index("layer").loc["mean", "jsd_bits"]),
                         expert_similarity=float(r["similarity"].expert_similarity.mean())))
    return pd.DataFrame(rows)


def table_one(scores: pd.DataFrame) -> pd.DataFrame:
    """Table I/II: per aggregation and benchmark, mean over seeds (x100) with a bootstrap 95% CI over seeds, and the
    mean of the per-run intervals the suite reports (bootstrap over items / subsets)."""
    from moelab.stats import bootstrap_ci

    sc = _with_key(scores)
    rows = []
    for (agg, bench), d in sc.groupby(["aggregation", "bench"], sort=False):
        v = d.groupby("seed").score.mean().to_numpy()
        est, lo, hi = bootstrap_ci(v) if len(v) > 1 else (v[0],) * 3
        row = dict(aggregation=agg, benchmark=bench, mean=100 * est, seeds_ci_low=100 * lo, seeds_ci_high=100 * hi,
                   n_seeds=len(v))
        if "ci_low" in d.columns:
            row.update(run_ci_low=100 * d.ci_low.mean(), run_ci_high=100 * d.ci_high.mean())
        rows.append(row)
    return pd.DataFrame(rows)


