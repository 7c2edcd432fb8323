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
def _jsd(P: np.ndarray) -> float:
    """Generalised Jensen–Shannon divergence (bits) of the rows of P [domains, experts] with equal weights."""
    P = P / P.sum(axis=1, keepdims=True)
    M = P.mean(axis=0)

    def H(p):
        p = p[p > 0]
        return float(-(p * np.log2(p)).sum())

    return H(M) - float(np.mean([H(p) for p in P]))


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
        rows.append(dict(layer=layer, jsd_bits=_jsd(P)))
    df = pd.DataFrame(rows)
    return pd.concat([df, pd.DataFrame([dict(layer="mean", jsd_bits=df.jsd_bits.mean())])], ignore_index=True)


def expert_similarity(layer) -> float:
    """Mean pairwise cosine similarity of the experts' flattened weights (1 = identical copies); the one in
    :mod:`moelab.cluster_upcycling` (notebook 03) is reused."""
    from moelab.cluster_upcycling import expert_similarity as _sim

    return _sim(layer)


# ----------------------------------------------------------------------------------------------------------------------
# prompts spanning many subjects: WordNet lexicographer files (stand-in for the paper's 57 MMLU subjects)
# ----------------------------------------------------------------------------------------------------------------------
# lexicographer file numbers of WordNet 3.0 (wndb(5WN) "lexnames"); Debian's wordnet-base ships no lexnames file
LEXNAMES = {
    3: "noun.Tops", 4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute", 8: "noun.body",
    9: "noun.cognition", 10: "noun.communication", 11: "noun.event", 12: "noun.feeling", 13: "noun.food",
    14: "noun.group", 15: "noun.location", 16: "noun.motive", 17: "noun.object", 18: "noun.person",
    19: "noun.phenomenon", 20: "noun.plant", 21: "noun.possession", 22: "noun.process", 23: "noun.quantity",
    24: "noun.relation", 25: "noun.shape", 26: "noun.state", 27: "noun.substance", 28: "noun.time",
    29: "verb.body", 30: "verb.change", 31: "verb.cognition", 32: "verb.communication", 33: "verb.competition",
    34: "verb.consumption", 35: "verb.contact", 36: "verb.creation", 37: "verb.emotion", 38: "verb.motion",
    39: "verb.perception", 40: "verb.possession", 41: "verb.social", 42: "verb.stative", 43: "verb.weather",
}


def wordnet_subject_texts(num_subjects: int = 24, per_subject: int = 16, seed: int = 0,
                          min_words: int = 6) -> dict:
    """{lexicographer file -> texts "lemma: gloss"} from the real WordNet 3.0 database (``moelab.assets.wordnet_dir``).

    The ``num_subjects`` files with the most glosses of at least ``min_words`` words; ``per_subject`` glosses drawn
    at random (seeded) from each. Hand-parsed because no installed library reads WordNet's data files offline
    (nltk's reader needs its own corpus download).
    """
    from moelab.assets import wordnet_dir

    if num_subjects < 1 or num_subjects > len(LEXNAMES):
        raise ValueError(f"num_subjects={num_subjects} must be in [1, {len(LEXNAMES)}]")
    if per_subject < 1:
        raise ValueError(f"per_subject={per_subject} must be >= 1")
    by_file: dict = {}
    for pos in ("noun", "verb"):
        with open(wordnet_dir() / f"data.{pos}", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("  ") or "|" not in line:
                    continue  # licence header
                head, gloss = line.split("|", 1)
                f = head.split()
                lex = int(f[1])
                if lex not in LEXNAMES:
                    continue
                gloss = gloss.strip()
                if len(gloss.split()) < min_words:
                    continue
                by_file.setdefault(LEXNAMES[lex], []).append(f"{f[4].replace('_', ' ')}: {gloss}")
    ranked = sorted(by_file, key=lambda k: -len(by_file[k]))[:num_subjects]
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
        from moelab.cluster_upcycling import ClusterAwareInit

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
    """List of (anchor, positive) -> {"anchor": features, "positive": features} tokenised by the model."""

    def __init__(self, st):
        self.st = st

    def __call__(self, batch):
        if not batch:
            raise ValueError("empty batch of pairs")
        a, p = zip(*[(x[0], x[1]) for x in batch])
        return {"anchor": dict(self.st.tokenize(list(a))), "positive": dict(self.st.tokenize(list(p)))}


def mnrl_loss(model, batch, scale: float = 20.0, aux_coef: float = 0.01):
    """Multiple Negatives Ranking Loss (SBA paper Eq. 12) with in-batch negatives, cosine similarity, τ = 1/scale:

        L = -1/N Σ_i log( exp(cos(a_i, p_i)/τ) / Σ_j exp(cos(a_i, p_j)/τ) )      scores [N, N]

    plus ``aux_coef`` × the Switch balancing loss of the MoE layers (summed over the anchor and positive passes).
    Written out (3 lines) instead of sentence-transformers' MNRL module because the trainer hands in its own
    (possibly wrapped) model, which that module would not call.
    """
    from moelab.core.layer import aux_loss

    a = model(batch["anchor"])["sentence_embedding"]  # [N, d]
    aux = aux_loss(model)
    p = model(batch["positive"])["sentence_embedding"]  # [N, d]
    aux = aux + aux_loss(model)
    scores = scale * torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(p, dim=-1).T
    labels = torch.arange(len(a), device=scores.device)
    ce = torch.nn.functional.cross_entropy(scores, labels)  # Eq. 12
    loss = ce + aux_coef * aux.to(ce.device)
    return loss, {"mnrl": float(ce.detach()), "aux": float(aux.detach())}


def finetune_embedder(st, train_pairs, val_pairs, *, steps: int, batch_size: int = 32, lr: float = 2e-5,
                      seed: int = 0, eval_every: int = 0, warmup_frac: float = 0.1, aux_coef: float = 0.01,
                      val_batches: int = 4):
    """Contrastive fine-tuning through :func:`moelab.train.train`: MNRL (cosine, scale 20 = τ 0.05), AdamW, linear
    warm-up over 10% then linear decay (SBA paper §V-B). Returns (TrainResult, validation-loss table)."""
    from torch.utils.data import DataLoader

    from moelab.train import TrainConfig, train

    if len(train_pairs) < batch_size:
        raise ValueError(f"{len(train_pairs)} training pairs < batch_size {batch_size}")
    if not val_pairs:
        raise ValueError("no validation pairs")
    collate = PairCollate(st)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(train_pairs), batch_size=batch_size, shuffle=True, collate_fn=collate, generator=g,
                        drop_last=True)
    vb = [collate(list(val_pairs[i:i + batch_size])) for i in range(0, min(len(val_pairs), val_batches * batch_size),
                                                                    batch_size)]
    vb = [b for b in vb if len(b["anchor"]["input_ids"]) > 1]

    def eval_fn(model):
        return {"val_mnrl": float(np.mean([mnrl_loss(model, b, aux_coef=0.0)[1]["mnrl"] for b in vb]))}

    cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=warmup_frac, decay="linear", weight_decay=0.01, seed=seed,
                      eval_every=eval_every, log_every=max(1, steps // 10), max_grad_norm=1.0, device="cpu",
                      progress=False, desc="mnrl")
    res = train(st, loader, loss_fn=lambda m, b: mnrl_loss(m, b, aux_coef=aux_coef), cfg=cfg, eval_fn=eval_fn)
    return res


def moe_specialisation(st) -> pd.DataFrame:
    """Mean pairwise expert similarity per MoE layer of a model (1 = the experts are still copies)."""
    from moelab.core.layer import moe_layers

    return pd.DataFrame([dict(layer=i, expert_similarity=expert_similarity(l)) for i, l in enumerate(moe_layers(st))])
