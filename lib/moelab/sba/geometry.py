"""Geometry of the two chosen experts' outputs and what each aggregation does to it (SBA paper §III-A/B, §IV-B,
§VI-B, Figs. 1, 2, 5; notebook ``02_sba``).

Per token and MoE layer, with the two chosen experts in router rank order (``e_1`` the top-ranked one):

- Fig. 1, norm ratio ``r_1 / r_2`` (``r_i = ||e_i||``) and its *concentration*: the share of tokens with
  ``|r_1/r_2 - 1| <= 0.10`` (:data:`CONCENTRATION_READING`; :func:`norm_ratio_concentration`);
- Fig. 2, the angle between ``e_1`` and ``e_2``;
- Fig. 5, the output norm of each aggregation operator against two references:
  ``||y|| / r̄`` with ``r̄ = (r_1 + r_2)/2`` (the raw ratio; under nomic's unnormalised routing it mostly reflects the
  kept weight mass ``s = w_1 + w_2``), and ``||y|| / Σ_i w_i r_i`` (the radius SBA keeps, Eq. 5; this one isolates the
  angular cancellation: ``= 1`` for SBA by construction, ``= ||Σ ŵ_i e_i|| / Σ ŵ_i r_i <= 1`` for linear);
- the exact decomposition of linear aggregation's shrinkage

      ||y_lin|| / r̄ = s · (||Σ ŵ_i e_i|| / Σ ŵ_i r_i) · (Σ ŵ_i r_i / r̄),   s = Σ_i w_i,  ŵ_i = w_i / s

  i.e. (weights not summing to one) × (angular cancellation, <= 1, = 1 iff aligned) × (radius mixing, ≈ 1 when
  r1 ≈ r2).

Specialisation: :func:`routing_jsd` (Jensen-Shannon divergence of expert usage across subjects) and
:func:`moe_specialisation` (mean pairwise cosine similarity of the experts' weights, :func:`expert_similarity`).
Router movement between two models of one layout (phase (b) of notebook 02_sba): :func:`router_movement`.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch

from moelab.core.aggregation import aggregate
from moelab.core.capture import capture_moe
from moelab.core.layer import moe_layers
from moelab.core.similarity import expert_similarity
from moelab.stats import jensen_shannon

from .method import AGGREGATIONS

__all__ = ["ZERO_NORM_EPS", "CONCENTRATION_TOL", "CONCENTRATION_READING", "pair_geometry", "geometry_frame",
           "collect_geometry", "summarize_geometry", "norm_ratio_concentration", "fig5_table",
           "shrinkage_decomposition", "routing_jsd", "moe_specialisation", "expert_similarity", "jensen_shannon",
           "routed_experts", "router_movement", "st_forward_fn", "nomic_forward_fn", "FIG5_READINGS",
           "fig5_weight_readings"]

ZERO_NORM_EPS = 1e-8
CONCENTRATION_TOL = 0.10
CONCENTRATION_READING = ("share of tokens with |r1/r2 - 1| <= 0.10, r1 the norm of the top-ranked expert's output and "
                         "r2 the second's (Fig. 1 read as 'within ±10% of equal norms'; the mean of log(r1/r2) is not "
                         "a concentration)")


# ----------------------------------------------------------------------------------------------------------------------
# per-token geometry of the two chosen experts
# ----------------------------------------------------------------------------------------------------------------------
def pair_geometry(expert_outputs: torch.Tensor, weights: torch.Tensor, eps: float = ZERO_NORM_EPS,
                  operators=AGGREGATIONS) -> dict:
    """Geometry of top-2 expert outputs (SBA paper §III-A/B, §IV-B, §VI-B; notebook 02_sba).

    expert_outputs [T, 2, d] (the chosen experts, in router rank order), weights [T, 2] (router weights as the layer
    used them). Returns numpy arrays [T']: ``r1``, ``r2``, ``norm_ratio`` = r1/r2 (Fig. 1), ``angle_deg`` (Fig. 2),
    ``weight_sum`` s, and for each aggregation operator ``ratio_<op>`` = ||op(e, w)|| / r̄ and
    ``radius_ratio_<op>`` = ||op(e, w)|| / Σ_i w_i r_i (Fig. 5, both readings), and the three shrinkage factors
    ``f_weight_sum``, ``f_angular``, ``f_radius_mix`` whose product is ``ratio_linear``.

    Zero-norm expert outputs (r < eps) have no direction: those tokens are dropped and counted in ``n_zero_norm``
    (T' = T - n_zero_norm); a ``UserWarning`` says how many.
    """
    if expert_outputs.ndim != 3 or expert_outputs.shape[1] != 2:
        raise ValueError(f"expert_outputs must be [tokens, 2, d_model] (top-2), got {tuple(expert_outputs.shape)}")
    if weights.shape != expert_outputs.shape[:2]:
        raise ValueError(f"weights shape {tuple(weights.shape)} does not match expert_outputs "
                         f"{tuple(expert_outputs.shape[:2])}")
    e = expert_outputs.detach().double()
    w = weights.detach().double()
    r = e.norm(dim=-1)  # r_i = ||e_i||   (Eq. 4)   [T, 2]
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
    radius = (w * r).sum(dim=1)  # Σ w_i r_i: SBA's radius (Eq. 5)
    lin_hat = (w_hat.unsqueeze(-1) * e).sum(dim=1).norm(dim=-1)  # ||Σ ŵ_i e_i||
    out.update(r1=r[:, 0], r2=r[:, 1], norm_ratio=r[:, 0] / r[:, 1], angle_deg=torch.rad2deg(torch.arccos(cos)),
               weight_sum=s, f_weight_sum=s, f_angular=lin_hat / mix, f_radius_mix=mix / r_bar)
    for op in operators:
        y_norm = aggregate(e.float(), w.float(), method=op).double().norm(dim=-1)
        out[f"ratio_{op}"] = y_norm / r_bar  # Fig. 5, raw: ||y|| / r̄
        out[f"radius_ratio_{op}"] = y_norm / radius  # Fig. 5 under unnormalised weights: ||y|| / Σ w_i r_i
    return {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in out.items()}


def geometry_frame(records: dict, domain: str | None = None, max_tokens: int | None = None) -> pd.DataFrame:
    """Long table from capture records ``{layer_name: {indices, weights, expert_outputs}}``: one row per token ×
    layer."""
    frames = []
    for li, (name, rec) in enumerate(records.items()):
        eo, w = rec["expert_outputs"], rec["weights"]
        if max_tokens is not None:
            eo, w = eo[:max_tokens], w[:max_tokens]
        if len(eo) == 0:
            continue
        with warnings.catch_warnings(record=True):
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


def _share_within(norm_ratio: pd.Series, tol: float) -> float:
    """Share of ``|r1/r2 - 1| <= tol``; the edges r1/r2 = 1 ± tol count as inside (1e-12 absorbs rounding)."""
    return float(((norm_ratio - 1).abs() <= tol + 1e-12).mean())


def _pooled(per: pd.DataFrame, pooled: pd.DataFrame, by: list) -> pd.DataFrame:
    for b in by:
        if b not in pooled:
            pooled.insert(0, b, "pooled")
    return pd.concat([per, pooled[per.columns]], ignore_index=True)


def summarize_geometry(geo: pd.DataFrame, by=("layer",), angle_threshold: float = 40.0,
                       near_one: float = CONCENTRATION_TOL) -> pd.DataFrame:
    """Per-group and pooled statistics (rows with ``layer == 'pooled'`` aggregate all layers); notebook 02_sba.

    ``share_norm_ratio_within_10pct`` is the Fig. 1 concentration (:data:`CONCENTRATION_READING`, ``near_one``);
    ``ratio_<op>_mean`` and ``radius_ratio_<op>_mean`` the two Fig. 5 readings (see :func:`pair_geometry`)."""
    if len(geo) == 0:
        raise ValueError("empty geometry table")
    ratio_cols = [c for c in geo.columns if c.startswith("ratio_") or c.startswith("radius_ratio_")]

    def stats(d):
        row = {"n_tokens": len(d),
               "norm_ratio_median": d.norm_ratio.median(),
               "norm_ratio_iqr": d.norm_ratio.quantile(0.75) - d.norm_ratio.quantile(0.25),
               "share_norm_ratio_within_10pct": _share_within(d.norm_ratio, near_one),
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
    return _pooled(per, stats(geo).to_frame().T, by)


def norm_ratio_concentration(geo: pd.DataFrame, tol: float = CONCENTRATION_TOL, by=("layer",)) -> pd.DataFrame:
    """Fig. 1 as a concentration claim (SBA paper §III-A; notebook 02_sba): per group and pooled, the share of tokens
    with ``|r1/r2 - 1| <= tol`` (:data:`CONCENTRATION_READING`), with the median r1/r2 beside it.
    Returns [by..., n_tokens, share_within, norm_ratio_median, tol, reading]."""
    if not 0 < tol < 1:
        raise ValueError(f"tol={tol!r} must be in (0, 1) (0.10 = within ±10%)")
    if len(geo) == 0:
        raise ValueError("empty geometry table")
    if "norm_ratio" not in geo:
        raise ValueError(f"geometry table has no norm_ratio column (columns {list(geo.columns)}); "
                         "build it with pair_geometry / collect_geometry")

    def stats(d):
        return pd.Series({"n_tokens": len(d), "share_within": _share_within(d.norm_ratio, tol),
                          "norm_ratio_median": float(d.norm_ratio.median())})

    by = list(by)
    per = geo.groupby(by, sort=False).apply(stats, include_groups=False).reset_index()
    out = _pooled(per, stats(geo).to_frame().T, by)
    reading = CONCENTRATION_READING if tol == CONCENTRATION_TOL else CONCENTRATION_READING.replace(
        "0.10", f"{tol:g}").replace("±10%", f"±{100 * tol:g}%")
    return out.assign(n_tokens=out.n_tokens.astype(int), tol=tol, reading=reading)


def fig5_table(geo: pd.DataFrame, by=("layer",), operators=None) -> pd.DataFrame:
    """Fig. 5 in both readings (SBA paper §IV-B, Fig. 5; notebook 02_sba): per group, operator and reference, the mean
    and median of ``||y|| / r̄`` (reference ``r_bar``) and ``||y|| / Σ_i w_i r_i`` (reference ``sum_w_r``), with the
    mean kept weight mass s beside them (under unnormalised routing the raw ratio of linear ≈ s × angular factor)."""
    ops = operators or [c[len("ratio_"):] for c in geo.columns if c.startswith("ratio_")]
    missing = [op for op in ops if f"ratio_{op}" not in geo or f"radius_ratio_{op}" not in geo]
    if missing:
        raise ValueError(f"geometry table lacks ratio_/radius_ratio_ columns for {missing}; rebuild it with "
                         "pair_geometry (moelab.sba) of this version")
    rows = []
    by = list(by)
    groups = [(k if isinstance(k, tuple) else (k,), d) for k, d in geo.groupby(by, sort=False)]
    for key, d in groups + [(("pooled",) * len(by), geo)]:
        for op in ops:
            for ref, col in (("r_bar", f"ratio_{op}"), ("sum_w_r", f"radius_ratio_{op}")):
                rows.append({**dict(zip(by, key)), "operator": op,
                             "reference": ref, "mean": float(d[col].mean()), "median": float(d[col].median()),
                             "weight_sum_mean": float(d.weight_sum.mean()), "n_tokens": len(d)})
    return pd.DataFrame(rows)


def shrinkage_decomposition(geo: pd.DataFrame, by=("layer",)) -> pd.DataFrame:
    """Mean log-factors of linear aggregation's shrinkage (see module docstring), per group and pooled:
    log(||y_lin||/r̄) = log s + log f_angular + log f_radius_mix, with each part's share of the total log-shrinkage."""
    d = geo.assign(log_total=np.log(geo.ratio_linear), log_weight_sum=np.log(geo.f_weight_sum),
                   log_angular=np.log(geo.f_angular), log_radius_mix=np.log(geo.f_radius_mix),
                   log_sba=np.log(geo.ratio_sba))
    cols = ["log_total", "log_weight_sum", "log_angular", "log_radius_mix", "log_sba"]
    per = d.groupby(list(by), sort=False)[cols].mean().reset_index()
    out = _pooled(per, d[cols].mean().to_frame().T, list(by))
    tot = out.log_total.where(out.log_total != 0)
    for c in ("weight_sum", "angular", "radius_mix"):
        out[f"share_{c}"] = out[f"log_{c}"] / tot
    return out


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
        rows.append(dict(layer=layer, jsd_bits=jensen_shannon(P)))  # moelab.stats
    df = pd.DataFrame(rows)
    return pd.concat([df, pd.DataFrame([dict(layer="mean", jsd_bits=df.jsd_bits.mean())])], ignore_index=True)


def moe_specialisation(model) -> pd.DataFrame:
    """Mean pairwise expert similarity per MoE layer of a model (1 = the experts are still copies)."""
    return pd.DataFrame([dict(layer=i, expert_similarity=expert_similarity(l))
                         for i, l in enumerate(moe_layers(model))])


@torch.no_grad()
def routed_experts(model, forward_fn, texts) -> list:
    """Per MoE layer of ``model`` (in order): the chosen experts of every real token of ``texts``, ``[T, k]`` in
    router rank order (``forward_fn`` as for :func:`collect_geometry`; padding dropped)."""
    texts = list(texts)
    if not texts:
        raise ValueError("routed_experts needs texts")
    with capture_moe(model, keep_outputs=False, stats=False) as cap:
        mask = forward_fn(texts)
    out = []
    for rec in cap.records.values():
        idx = rec["indices"]
        out.append(idx if mask is None else idx[mask.bool()[rec["positions"]]])
    return out


@torch.no_grad()
def router_movement(model_a, model_b, texts, forward_fn_a=None, forward_fn_b=None) -> pd.DataFrame:
    """How far routing moved from ``model_a`` (e.g. the phase-(b) start) to ``model_b`` (its end), per MoE layer
    (phase (b); notebook 02_sba), on the same real tokens of ``texts``:

    - ``top1_agreement``: share of tokens whose top-ranked expert is the same in both (1 = unmoved);
    - ``topk_set_agreement``: share whose set of chosen experts is the same;
    - ``router_weight_change``: ``||W_b - W_a||_F / ||W_a||_F`` of the router's weights.

    Token positions must match: both models tokenise the same texts (one tokenizer). Returns one row per layer and a
    ``mean`` row."""
    la, lb = moe_layers(model_a), moe_layers(model_b)
    if not la or len(la) != len(lb):
        raise ValueError(f"the two models have {len(la)} and {len(lb)} MoE layers; expected the same layout")
    ia = routed_experts(model_a, forward_fn_a or st_forward_fn(model_a), texts)
    ib = routed_experts(model_b, forward_fn_b or st_forward_fn(model_b), texts)
    rows = []
    for i, (xa, xb, a, b) in enumerate(zip(ia, ib, la, lb)):
        if xa.shape != xb.shape:
            raise ValueError(f"MoE layer {i}: {tuple(xa.shape)} vs {tuple(xb.shape)} routed tokens; the models must "
                             "see the same tokens")
        wa, wb = a.router.weight.detach().double().cpu(), b.router.weight.detach().double().cpu()
        rows.append(dict(layer=i, n_tokens=len(xa), top1_agreement=float((xa[:, 0] == xb[:, 0]).double().mean()),
                         topk_set_agreement=float((xa.sort(-1).values == xb.sort(-1).values).all(-1).double().mean()),
                         router_weight_change=float((wb - wa).norm() / wa.norm())))
    df = pd.DataFrame(rows)
    mean = df.drop(columns=["layer", "n_tokens"]).mean().to_dict()
    return pd.concat([df.astype({"layer": object}), pd.DataFrame([dict(layer="mean", n_tokens=int(df.n_tokens.sum()),
                                                                        **mean)])], ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# forward functions for collect_geometry
# ----------------------------------------------------------------------------------------------------------------------
def st_forward_fn(st, batch_size: int = 32):
    """forward_fn for :func:`collect_geometry` on a SentenceTransformer: runs the texts, returns the padding mask
    over the tokens the MoE layers saw (BERT's MoE sees padded [B, S] batches)."""

    @torch.no_grad()
    def run(texts):
        masks = []
        st.eval()
        dev = next(st.parameters()).device
        for i in range(0, len(texts), batch_size):
            feats = st.tokenize(texts[i:i + batch_size])
            st({k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in feats.items()})
            masks.append(feats["attention_mask"].reshape(-1).bool())
        return torch.cat(masks)

    return run


def nomic_forward_fn(model, batch_size: int = 16):
    """forward_fn for :func:`collect_geometry` on :class:`moelab.sba.NomicEmbed` (its MoE sees real tokens only)."""

    def run(texts):
        model.encode(texts, kind="document", batch_size=batch_size)
        return None

    return run


# ----------------------------------------------------------------------------------------------------------------------
# Fig. 5 under the two weight readings
# ----------------------------------------------------------------------------------------------------------------------
FIG5_READINGS = {
    ("unnormalised top-2", "linear"): ("ratio_linear", "arithmetic: s x angular cancellation x radius mixing, with "
                                       "the kept mass s = w1 + w2 < 1 of nomic's routing dominating"),
    ("unnormalised top-2", "sba"): ("ratio_sba", "arithmetic: s x radius mixing (Eq. 5 keeps s times the weighted "
                                    "mean norm), whatever the angles"),
    ("renormalised barycentre", "linear"): ("bary_linear", "geometry: angular cancellation x radius mixing; below 1 "
                                            "by as much as the active experts point apart"),
    ("renormalised barycentre", "sba"): ("bary_sba", "by construction: the radius mixing Σ ŵ_i r_i / r̄, 1 when "
                                         "r1 = r2"),
}


def fig5_weight_readings(geo: pd.DataFrame, by=("layer",)) -> pd.DataFrame:
    """Fig. 5's ``||y|| / r̄`` (SBA paper §VI-B) under both weight readings, per group and pooled, each labelled with
    what it measures (:data:`FIG5_READINGS`; notebook 02_sba):

    - *unnormalised top-2* (nomic's weights ``w``, ``s = w1 + w2 < 1``): ``ratio_<op>`` of :func:`pair_geometry`;
    - *renormalised barycentre* (``ŵ = w / s``): linear ``||Σ ŵ_i e_i|| / r̄ = f_angular · f_radius_mix`` and SBA
      ``Σ ŵ_i r_i / r̄ = f_radius_mix`` (SBA's direction does not depend on the weights' scale, its radius is
      ``Σ ŵ_i r_i``).

    Returns [by..., reading, operator, mean, median, n_tokens, what]."""
    need = {"ratio_linear", "ratio_sba", "f_angular", "f_radius_mix"}
    if not need <= set(geo.columns):
        raise ValueError(f"geometry table lacks {sorted(need - set(geo.columns))}; build it with pair_geometry")
    g = geo.assign(bary_linear=geo.f_angular * geo.f_radius_mix, bary_sba=geo.f_radius_mix)
    by = list(by)
    groups = [(k if isinstance(k, tuple) else (k,), d) for k, d in g.groupby(by, sort=False)]
    rows = []
    for key, d in groups + [(("pooled",) * len(by), g)]:
        for (reading, op), (col, what) in FIG5_READINGS.items():
            rows.append({**dict(zip(by, key)), "reading": reading, "operator": op, "mean": float(d[col].mean()),
                         "median": float(d[col].median()), "n_tokens": len(d), "what": what})
    return pd.DataFrame(rows)
