"""Claim definitions of notebook 00 (the MoE primer).

The primer tests general MoE mechanics; its "paper" rows are the textbook facts it cites, each with the sentence it
tests (``paper_quote``, copied verbatim): sparse upcycling as paper 002's poster states it (citing Komatsuzaki et al.);
the Switch Transformer balancing loss (Fedus et al. 2022, Sec. 2.2: not among docs/papers, quoted from the
paper's text); MASS's top-p gate (paper 003, Sec. 3); SBA's inward collapse and radius (paper 001, Sec. IV).

- Three rows are identities (upcycling at initialisation, the linear-mix norm cos(θ/2), SBA's radius): ``holds by
  construction`` with the measured deviation and ``holds=`` whether it lies within rounding; a deviation beyond it
  is a failed check and stops the rebuild (a bug, never a label).
- The balancing loss is a comparison of trained models: both arms on the same seeds (the seed draws the routers,
  batches and dropout), paired by seed, with a regime check that the runs trained (no run worse than dense MiniLM
  on the held-out contrastive loss; every router moved from its draw).
- Top-p's varying count is the rule applied to one fixed trained router: a test over tokens that could fail (a
  near-uniform router would give every token the same count), so it decides.
- The dispatch timing is an extension (a check of our implementation, not a claim of the papers).

Verdicts are computed from the tables the notebook saved (docs/CLAIMS.md).
"""
from __future__ import annotations

import numpy as np

from moelab.claims import ByConstruction, Claim, Items, MissingTable, Regime, Seeds

# float32 sentence embeddings through 6 BERT layers differ by ~1e-7 between two orders of the same sums; 1e-5 is
# 100x that and still far below any real change of the model (unit-norm embeddings).
UPCYCLE_TOL = 1e-5
# float64 norms of two unit vectors: rounding ~1e-16; the SBA arc is computed in float32 (~1e-8); 1e-6 is above both.
NORM_TOL = 1e-6
# SBA on real expert outputs (d = 384) runs in float32: the norm of the reconstructed vector carries ~sqrt(d) x 1.2e-7
# ~ 2e-6 of rounding at worst; 1e-5 is above it (the committed run's worst is 2e-7).
REAL_NORM_TOL = 1e-5
# The routers of the balancing runs must have left their random draw: ||W - W0|| / ||W0|| of every router at least
# this (a router within 10% of its draw still routes by its draw, so its load says nothing about the training).
ROUTER_MOVED = 0.1

ARMS = ("with balancing loss", "no balancing loss")


def _max_abs(d) -> tuple[float, int]:
    d = np.asarray(d, dtype=float)
    return float(np.abs(d).max()), int(d.size)


def upcycling_evidence(T):
    """max |dense - upcycled| over the sentences of table1: within rounding (``UPCYCLE_TOL``) or a failed check."""
    worst, n = _max_abs(T.csv("table1_upcycling_equivalence").max_abs_diff)
    return ByConstruction("initialisation", "every expert is a copy of the dense FFN and the renormalised top-2 "
                          f"weights sum to 1, so the MoE computes the dense FFN; measured max |deviation| {worst:.2g} "
                          f"over {n} sentences (tolerance {UPCYCLE_TOL:g}: float32 rounding)",
                          ours=worst, holds=worst <= UPCYCLE_TOL)


def linear_mix_evidence(T):
    """|(u + v)/2| - cos(θ/2) over the angles of table7 within rounding, the mix inside the sphere (Eq. 3) at every
    θ > 0, and the real top-2 mixes of table8 inside their weighted mean norm (the triangle inequality, float32)."""
    agg = T.csv("table7_aggregation_two_vectors")
    worst, n = _max_abs(agg.linear_norm - agg.cos_half_angle)
    inside = bool((agg.linear_norm[agg.angle_deg > 0] < 1.0).all())
    real = T.csv("table8_aggregation_real")
    real_inside = bool((real.linear_ratio <= 1.0 + REAL_NORM_TOL).all())
    return ByConstruction("definition", "|(u + v)/2| = cos(θ/2) for unit u, v at angle θ, < 1 for every θ > 0 "
                          f"(Eq. 3 with r = 1); measured max |deviation| {worst:.2g} over {n} angles (tolerance "
                          f"{NORM_TOL:g}: rounding), norm < 1 at every θ > 0: {inside}; real top-2 mixes of the "
                          f"primer's model ({len(real)} tokens x layers) keep {real.linear_ratio.mean():.5f} of the "
                          f"weighted mean norm (min {real.linear_ratio.min():.5f}; <= 1 + {REAL_NORM_TOL:g}: "
                          f"{real_inside}; small because its experts are near-copies of one FFN, mean cosine "
                          f"{real.cos_top2.mean():.3f})", ours=worst, holds=worst <= NORM_TOL and inside and real_inside)


def sba_norm_evidence(T):
    """SBA-mix norm - weighted mean expert norm over the angles of table7 (float64 vectors, ``NORM_TOL``), and the
    SBA ratio ||y|| / Σ w_i ||e_i|| - 1 on the real expert outputs of table8 (float32, ``REAL_NORM_TOL``)."""
    agg = T.csv("table7_aggregation_two_vectors")
    worst, n = _max_abs(agg.sba_norm - agg.mean_expert_norm)
    real_worst, n_real = _max_abs(T.csv("table8_aggregation_real").sba_ratio - 1.0)
    return ByConstruction("definition", "Eq. 7 puts the SBA mix at radius r = Σ w_i r_i (Eq. 5); measured max "
                          f"|deviation| {worst:.2g} over {n} angles of two unit vectors (tolerance {NORM_TOL:g}) "
                          f"and {real_worst:.2g} over {n_real} real top-2 mixes (float32, tolerance "
                          f"{REAL_NORM_TOL:g})", ours=worst, holds=worst <= NORM_TOL and real_worst <= REAL_NORM_TOL)


def _imbalance_by_seed(T):
    imb = T.csv("table4_load_imbalance")
    if "seed" not in imb.columns:
        raise MissingTable("table4_load_imbalance.csv has no seed column (saved before the balancing runs were "
                           "repeated over seeds); produced by the next run")
    return imb


def balancing_evidence(T):
    """Load imbalance (CV of per-expert load, mean over held-out batches x layers) per training seed and arm, paired
    by seed (a Series indexed by seed per arm)."""
    imb = _imbalance_by_seed(T)
    per_seed = {arm: imb[imb.run == arm].groupby("seed").imbalance.mean() for arm in ARMS}
    n_items = int(imb[imb.run == ARMS[0]].groupby("seed").batch.nunique().min())
    return Seeds(a=per_seed[ARMS[0]], b=per_seed[ARMS[1]], paired=True, n_items=n_items)


def training_regime(T) -> Regime:
    """The balancing runs trained: every (seed, arm)'s final held-out contrastive loss is not above its seed's model
    at initialisation (= dense MiniLM: upcycling is exact), and every router moved by at least ``ROUTER_MOVED`` of
    its initial norm."""
    held, moved = T.csv("table2b_heldout_loss"), T.csv("table2c_router_change")
    dense = held[held.run == "both"].set_index("seed").heldout_contrastive
    runs = held[held.run != "both"]
    final = runs[runs.step == runs.step.max()].set_index(["seed", "run"]).heldout_contrastive
    margin = final - dense.reindex(final.index.get_level_values("seed")).to_numpy()
    passed = bool(len(final) and (margin <= 0).all() and moved.rel_change.min() >= ROUTER_MOVED)
    return Regime(check="every run trained: final held-out contrastive loss <= dense MiniLM's (its seed's model at "
                        f"initialisation) and every router moved >= {ROUTER_MOVED:g} of its initial norm",
                  value=(f"dense {dense.mean():.3f}; final {final.min():.3f}-{final.max():.3f} over {len(final)} runs "
                         f"(worst final - dense {margin.max():+.3f}); router change {moved.rel_change.min():.2f}-"
                         f"{moved.rel_change.max():.2f}"), passed=passed)


def varying_count_evidence(T):
    """Per held-out token (averaged over the MoE layers): whether the token's number of active experts differs from
    the rule's most common count, top-p (middle p of the config) vs top-k. The router is fixed (one trained model
    read under two rules), so items (tokens) are the unit of replication."""
    cfg, act = T.json("config"), T.csv("table6_active_experts")
    rules = (f"top-p {cfg['top_p'][len(cfg['top_p']) // 2]}", f"top-{cfg['top_k']}")
    off_mode = []
    for rule in rules:
        a = act[act.rule == rule].set_index(["layer", "token"]).active
        off_mode.append((a != a.mode().iloc[0]).astype(float).groupby(level="token").mean())
    p, k = off_mode[0].align(off_mode[1], join="inner")
    return Items(a=p.to_numpy(), b=k.to_numpy(), score_range=(0.0, 1.0))


def dispatch_evidence(T):
    """log10 wall time per call at the largest token count timed, grouped dispatch vs per-token loop, paired by
    repeat (the same layer and inputs: fixed implementations, repeats are the replication)."""
    t = T.csv("table9_dispatch_timing")
    t = t[t.tokens == t.tokens.max()]
    g = t[t.impl == "grouped"].set_index("repeat").seconds
    loop = t[t.impl == "naive_loop"].set_index("repeat").seconds
    g, loop = g.align(loop, join="inner")
    return Items(a=np.log10(g.to_numpy()), b=np.log10(loop.to_numpy()))


# the sentences each row tests, copied from the papers (whitespace joined; " [...] " separates two excerpts)
QUOTE_UPCYCLING = "Functionally equivalent to the dense model at initialization."
QUOTE_SWITCH = ("Since we seek uniform routing of the batch of tokens across the N experts, we desire both vectors to "
                "have values of 1/N. The auxiliary loss of Equation 4 encourages uniform routing since it is minimized "
                "under a uniform distribution.")
QUOTE_MASS = ("Instead of assigning a hard number of experts to every token regardless of certainty, this "
              "confidence-aware strategy dynamically allocates expert capacity according to the model’s routing "
              "uncertainty.")
QUOTE_SBA_LINEAR = ("Unless all expert directions are perfectly aligned, the angular diversity among experts produces "
                    "partial cancellation in the weighted summation, yielding $$\\|y_{\\text{linear}}\\| < r. "
                    "\\quad (3)$$")
QUOTE_SBA_RADIUS = ("The aggregated radius is computed as the weighted barycenter of expert magnitudes: $$r = w_1 r_1 + "
                    "w_2 r_2. \\quad (5)$$ [...] The final aggregated representation is reconstructed on the "
                    "hypersphere: $$y_{\\text{SBA}} = r \\cdot \\hat{u}(\\theta), \\quad (7)$$")

CLAIMS = [
    # Sparse upcycling (Komatsuzaki et al. 2023), as paper 002's poster states it: every expert a copy of the dense
    # FFN and renormalised top-k weights summing to 1 give sum_i w_i E(x) = E(x): an identity (0 up to rounding).
    Claim(id="upcycling_equals_dense", determined_by="initialisation",
          claim="a sparsely upcycled MiniLM equals the dense model at initialisation (sentence embeddings)",
          paper_ref="paper 002 (cluster-aware upcycling poster), panel 'Sparse Upcycling [Komatsuzaki et al., ICLR "
                    "2023]': the poster's statement of Komatsuzaki et al.'s method",
          paper_quote=QUOTE_UPCYCLING,
          metric="max |dense - upcycled| per sentence embedding", unit="embedding units", higher_is_better=False,
          paper_value=0.0, target=0.0, tolerance=UPCYCLE_TOL,
          tolerance_why="float32 rounding through 6 layers is ~1e-7; 1e-5 is 100x that",
          legacy="sparsely upcycled MiniLM equals the dense model at initialisation (max abs difference of sentence "
                 "embeddings)",
          evidence=upcycling_evidence),
    # Switch Transformer (Fedus et al. 2022), Sec. 2.2: the auxiliary loss alpha N sum_i f_i P_i is minimised by
    # uniform routing (qualitative: no number for our setting). Expected: imbalance with - without < 0.
    Claim(id="balancing_loss_lowers_imbalance", determined_by="training", regime=training_regime,
          claim="the balancing loss lowers expert-load imbalance after training",
          paper_ref="Switch Transformer (Fedus, Zoph, Shazeer, JMLR 2022), Sec. 2.2 'A Differentiable Load Balancing "
                    "Loss' (reference [4] of the SBA paper; not among docs/papers: quoted from the paper's text, "
                    "arXiv:2101.03961)",
          paper_quote=QUOTE_SWITCH,
          metric="CV of expert load on held-out batches (mean over batches x layers)", unit="CV",
          higher_is_better=False, paper_value=None, compare=ARMS, expected_sign=-1,
          replication="seeds are the unit: both arms are trained from each seed's router draw, batches and dropout, "
                      "paired by seed (held-out batches x layers averaged within each seed)",
          note="Switch gives no number for our setting; its coefficient is alpha = 1e-2, ours 0.05 (a short run); "
               "the sentence tested holds for any alpha > 0",
          legacy="the balancing loss lowers expert-load imbalance (CV of load, held-out batches x layers)",
          evidence=balancing_evidence),
    # MASS (paper 003) Sec. 3: top-p keeps the smallest set of experts whose mass reaches p, so the count varies
    # with the router's confidence; top-k keeps k for every token. The rule applied to one fixed trained router:
    # a test over tokens (a near-uniform router would give every token the same count). Expected: +1.
    Claim(id="top_p_count_varies", determined_by="definition",
          claim="top-p routing gives tokens a varying number of experts, top-k a fixed one (on the trained router)",
          paper_ref="MASS (paper 003) Sec. 3, 'Routing-Mass Based Expert Selection'",
          paper_quote=QUOTE_MASS,
          metric="share of tokens whose active-expert count differs from the rule's most common count",
          unit="share of tokens (0-1)", paper_value=None, compare=("top-p", "top-k"), expected_sign=+1,
          replication="items are the unit: tokens of one fixed trained router (the first seed's balanced model) read "
                      "under both rules, paired by token",
          note="top-k's share is 0 by its definition; top-p's depends on the router's confidence, so it is measured",
          legacy="top-p routing gives tokens a varying number of experts, top-k a fixed one",
          evidence=varying_count_evidence),
    # SBA (paper 001) Sec. IV-B, Eq. 3: the linear mix of two unit vectors at weights 1/2, 1/2 has norm cos(θ/2) < 1
    # (inward collapse): an identity of Euclidean geometry (0 deviation).
    Claim(id="linear_mix_norm_cos_half", determined_by="definition",
          claim="linear aggregation of two unit vectors at equal weights has norm cos(θ/2) < 1 (inward collapse); "
                "real top-2 mixes lie inside their weighted mean norm",
          paper_ref="SBA (paper 001) Sec. IV-B, Eqs. 2-3", paper_quote=QUOTE_SBA_LINEAR,
          metric="linear-mix norm - cos(θ/2)", unit="norm",
          higher_is_better=False, paper_value=0.0, target=0.0, tolerance=NORM_TOL,
          tolerance_why="float64/float32 rounding of unit-vector norms is below 1e-7",
          legacy="linear aggregation of two unit vectors at equal weights has norm cos(θ/2) (inward collapse)",
          evidence=linear_mix_evidence),
    # SBA (paper 001) Sec. IV-C, Eqs. 5 and 7: the spherical barycentre sits at the weighted mean norm of the experts.
    Claim(id="sba_keeps_norm", determined_by="definition",
          claim="SBA keeps the weighted mean norm of the experts (two unit vectors, θ < 180°; real top-2 mixes)",
          paper_ref="SBA (paper 001) Sec. IV-C, Eqs. 5 and 7", paper_quote=QUOTE_SBA_RADIUS,
          metric="SBA-mix norm - weighted mean expert norm", unit="norm",
          higher_is_better=False, paper_value=0.0, target=0.0, tolerance=NORM_TOL,
          tolerance_why="float64/float32 rounding of unit-vector norms is below 1e-7 (real float32 mixes: 1e-5)",
          legacy="SBA keeps the weighted mean norm of the experts (two unit vectors, θ < 180°)",
          evidence=sba_norm_evidence),
    # MegaBlocks-style dropless dispatch (Gale et al.): grouping tokens by expert is faster than a per-token loop
    # (no number for this layer; expected: log time grouped - loop < 0).
    Claim(id="grouped_dispatch_faster", determined_by="definition", extension=True,
          claim="the grouped dispatch is faster than the per-token loop at the largest size timed",
          paper_ref="MegaBlocks-style dropless dispatch (Gale et al.); benchmarks/ has the full comparison",
          metric="wall time per call (median of repeats in the figure)", unit="log10 seconds",
          higher_is_better=False, paper_value=None, compare=("grouped", "naive_loop"), expected_sign=-1,
          note="MegaBlocks: sorting tokens by expert turns the MoE into grouped matmuls (no number for this layer)",
          legacy="the grouped dispatch is faster than the per-token loop at the largest size timed",
          evidence=dispatch_evidence),
]
