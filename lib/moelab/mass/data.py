"""The MASS synthetic experiment's data and the real-data part's loaders (paper 003, Sec. 4.1 "Data Generation" and
Sec. 4.4; notebook ``notebooks/04_mass.py``).

GINC-style synthetic language (Xie et al. 2022), written by hand (no library samples GINC's structured HMM family;
hmmlearn only checks it in tests).  Hidden state h = (entity v, property s), index ``h = v * n_properties + s``
(GINC's "value" x "slot").  Emission is deterministic through a memory matrix ``memory[v, s] -> symbol``; property 0
always emits the delimiter symbol 0 ("/").  A concept theta fixes the property transitions; entity transitions are
shared:

    p(h_{t+1} | h_t, theta) = A_ent[v_t, v_{t+1}] * A_prop^theta[s_t, s_{t+1}]      (MASS Sec. 4.1; joint = A_ent ⊗ A_prop)
    A_ent = 0.9 I + 0.1 M                                                          (entity persistence 0.9)
    A_prop^theta = sum_j softmax(u^theta / 0.1)_j P_j^theta                        (tempered mixture of permutations)
    pi = softmax((u - 0.5) / 10)                                                    (near-uniform start)

Ten concepts are built; the first five are the in-distribution (pretraining) concepts.  M (entity switching) is a
stated parameter, :class:`GINCConfig` ``entity_switch``.

In-context data (the paper's format, :func:`sample_incontext`): sequences [x1, y1, o, x2, y2, o, ..., xn, yn] of n
GINC examples, each [x, y] of ``example_len`` tokens (x = the first example_len - 1, y = the target token), o = the
delimiter.  GINC's values (p-lambda/incontext-learning ``generate_data.py``): example lengths
:data:`GINC_EXAMPLE_LENS` = (3, 5, 8, 10), example counts :data:`GINC_EXAMPLE_COUNTS` = (0, 1, 2, 4, 8, 16, 32, 64,
128, 256) with (length + 1) * count <= 1024 tokens, 2500 prompts per (length, count); pretraining documents 1000 x
10240 tokens.  The exact Bayes predictor of this format (:func:`incontext_predictive`) and n-gram baselines
(:class:`NGram`) give the floor and the references a model's target-token loss is compared with.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moelab.assets import MissingAsset
from moelab.cache import path_identity
from moelab.inputs import InputFormatError, require_hf_model, require_path
from moelab.profiles import paper_input_hint

__all__ = ["GINCConfig", "GINC", "build_ginc", "sample_documents", "sample_prompts", "predictive_probs",
           "bayes_labels", "bayes_nll", "ENTITY_SWITCH", "top_switch_share", "GINC_EXAMPLE_LENS",
           "GINC_EXAMPLE_COUNTS", "GINC_PROMPTS_PER_SETTING", "GINC_MAX_PROMPT_TOKENS", "GINC_TRAIN_DOCS",
           "GINC_DOC_LEN", "switch_readings", "ginc_settings", "incontext_positions", "sample_incontext",
           "incontext_predictive", "incontext_bayes", "within_example_bayes", "NGram",
           "ngram_baselines", "GLUE_FILES", "GLUE_LABELS", "GLUE_TASKS", "glue_file", "load_glue_task",
           "check_glue_dir", "glue_task", "check_paper_inputs", "bert_large_path"]

ENTITY_SWITCH = ("ginc", "t1", "uniform")
# p-lambda/incontext-learning generate_data.py (reference facts): in-context prompt settings
GINC_EXAMPLE_LENS = (3, 5, 8, 10)                              # tokens per example [x, y] ("prompt_length")
GINC_EXAMPLE_COUNTS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)   # examples per prompt before the test example
GINC_PROMPTS_PER_SETTING = 2500                                # prompts per (length, count)
GINC_MAX_PROMPT_TOKENS = 1024                                  # settings with (length + 1) * count > 1024 are skipped
GINC_TRAIN_DOCS, GINC_DOC_LEN = 1000, 10240                    # pretraining documents x tokens


@dataclass(frozen=True)
class GINCConfig:
    """Settings of p-lambda/incontext-learning ``generate_data.py`` as its scripts use them (facts note; MASS Sec. 4.1
    "Data Generation", notebook 04).  ``entity_switch`` picks the switch distribution M of A_ent = 0.9 I + 0.1 M:
    "ginc" = mixture of permutations weighted softmax(u / transition_temp) (0.1, the original generator: one or two
    targets dominate each row), "t1" = the same mixture at temperature 1.0 (this companion's first version, default
    so earlier tables reproduce), "uniform" = a new entity uniformly, M = (J - I)/(V - 1) (the MASS paper's text).
    All three draw the same random numbers, so memory and property transitions are identical across them;
    :func:`top_switch_share` measures the difference."""
    n_entities: int = 10
    n_properties: int = 10
    n_symbols: int = 50
    n_concepts: int = 10
    n_train_concepts: int = 5
    transition_temp: float = 0.1
    persistence: float = 0.9
    start_temp: float = 10.0
    seed: int = 0
    entity_switch: str = "t1"


    def __post_init__(self):
        for name in ("n_entities", "n_properties", "n_concepts", "n_train_concepts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.n_symbols < 2:
            raise ValueError(f"n_symbols={self.n_symbols} must be >= 2 (delimiter + one symbol)")
        if not 1 <= self.n_train_concepts <= self.n_concepts:
            raise ValueError(f"n_train_concepts={self.n_train_concepts} must lie in [1, n_concepts={self.n_concepts}]")
        if not 0.0 <= self.persistence <= 1.0:
            raise ValueError(f"persistence={self.persistence} must lie in [0, 1]")
        if self.transition_temp <= 0 or self.start_temp <= 0:
            raise ValueError(f"temperatures must be > 0, got {self.transition_temp}, {self.start_temp}")
        if self.entity_switch not in ENTITY_SWITCH:
            raise ValueError(f"entity_switch={self.entity_switch!r} must be one of {ENTITY_SWITCH}")


@dataclass
class GINC:
    """A built GINC family. Arrays: memory [V, S] int, entity_trans [V, V], property_trans [C, S, S],
    trans [C, H, H] (H = V*S), start [H], state_symbol [H] int (deterministic emission)."""
    cfg: GINCConfig
    memory: np.ndarray
    entity_trans: np.ndarray
    property_trans: np.ndarray
    trans: np.ndarray
    start: np.ndarray
    state_symbol: np.ndarray = field(init=False)

    def __post_init__(self):
        self.state_symbol = self.memory.reshape(-1).copy()

    @property
    def n_states(self) -> int:
        return self.cfg.n_entities * self.cfg.n_properties

    @property
    def train_concepts(self) -> np.ndarray:
        return np.arange(self.cfg.n_train_concepts)

    def entity_of(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states) // self.cfg.n_properties

    def property_of(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states) % self.cfg.n_properties

    def emission_matrix(self) -> np.ndarray:
        """B [H, n_symbols], one-hot rows (deterministic emissions)."""
        B = np.zeros((self.n_states, self.cfg.n_symbols))
        B[np.arange(self.n_states), self.state_symbol] = 1.0
        return B


def _softmax(x: np.ndarray, temp: float) -> np.ndarray:
    z = x / temp
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def _perm_mixture(rng: np.random.Generator, n: int, n_perms: int, temp: float) -> np.ndarray:
    """sum_j softmax(u/temp)_j P_j with random permutation matrices P_j  [n, n] (doubly stochastic)."""
    weights = _softmax(rng.random(n_perms), temp)
    mat = np.zeros((n, n))
    for w in weights:
        mat[np.arange(n), rng.permutation(n)] += w
    return mat


def build_ginc(cfg: GINCConfig = GINCConfig()) -> GINC:
    """Build the concept family exactly from ``cfg.seed`` (MASS Sec. 4.1; notebook 04)."""
    rng = np.random.default_rng(cfg.seed)
    V, S, C = cfg.n_entities, cfg.n_properties, cfg.n_concepts
    # memory matrix [V, S] -> symbol in 1..n_symbols-1 (with replacement); property 0 emits the delimiter 0
    memory = rng.integers(1, cfg.n_symbols, size=(V, S))
    memory[:, 0] = 0
    # A_ent = p I + (1-p) M   [V, V], shared by every concept; M per ``entity_switch`` (same draws for every choice)
    mix = _perm_mixture(rng, V, V, cfg.transition_temp if cfg.entity_switch == "ginc" else 1.0)
    if cfg.entity_switch == "uniform":
        mix = (np.ones((V, V)) - np.eye(V)) / (V - 1) if V > 1 else np.eye(V)    # M = (J - I) / (V - 1)
    entity_trans = cfg.persistence * np.eye(V) + (1 - cfg.persistence) * mix
    # A_prop^theta [C, S, S], tempered mixture of permutations, redrawn per concept
    property_trans = np.stack([_perm_mixture(rng, S, S, cfg.transition_temp) for _ in range(C)])
    # joint transition A^theta = A_ent ⊗ A_prop^theta   [C, H, H]  (state index v*S + s)
    trans = np.stack([np.kron(entity_trans, property_trans[c]) for c in range(C)])
    start = _softmax(rng.random(V * S) - 0.5, cfg.start_temp)
    return GINC(cfg, memory, entity_trans, property_trans, trans, start)


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One categorical draw per row of probs [n, K] (inverse CDF)."""
    cdf = np.cumsum(probs, axis=1)
    u = rng.random((probs.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((u >= cdf).sum(axis=1), probs.shape[1] - 1)


def sample_documents(g: GINC, n_docs: int, length: int, seed: int, concepts=None) -> dict:
    """Pretraining documents: each picks one in-distribution concept uniformly, h_0 ~ pi, h_t ~ A^theta[h_{t-1}].
    Returns dict(tokens [n, L] int64, states [n, L] int64, concept [n])."""
    if n_docs < 1 or length < 1:
        raise ValueError(f"n_docs={n_docs} and length={length} must be >= 1")
    rng = np.random.default_rng(seed)
    pool = g.train_concepts if concepts is None else np.asarray(concepts)
    concept = rng.choice(pool, size=n_docs)
    states = np.empty((n_docs, length), dtype=np.int64)
    states[:, 0] = _draw(rng, np.broadcast_to(g.start, (n_docs, g.n_states)))
    for t in range(1, length):
        states[:, t] = _draw(rng, g.trans[concept, states[:, t - 1]])
    return dict(tokens=g.state_symbol[states].astype(np.int64), states=states, concept=concept)


def sample_prompts(g: GINC, n_prompts: int, n_examples: int, example_len: int, seed: int) -> dict:
    """In-context prompts as in GINC: one in-distribution concept per prompt; ``n_examples`` examples of
    ``example_len`` tokens, each started from a fresh entity right after a delimiter; examples are joined by the
    delimiter.  The prompt (input) is everything but the last token of the last example; ``target`` is that
    sampled token and ``label`` the argmax of the Bayes-optimal predictive (pretraining mixture, forward algorithm).
    Paths are kept inside the HMM's support (a zero-probability prompt has no Bayes predictive): the delimiter
    state and the fresh entity are drawn from the concept's positive-probability transitions.
    Returns dict(tokens [n, N-1], target [n], label [n], concept [n]) with N = n_examples*(example_len+1)-1."""
    if n_examples < 1 or example_len < 1:
        raise ValueError(f"n_examples={n_examples} and example_len={example_len} must be >= 1")
    rng = np.random.default_rng(seed)
    S = g.cfg.n_properties
    toks, concepts = [], []
    for _ in range(n_prompts):
        c = int(rng.choice(g.train_concepts))
        P = g.property_trans[c]
        seq, ent = [], int(rng.integers(g.cfg.n_entities))
        prev_delim_ent = None
        for i in range(n_examples):
            if prev_delim_ent is not None:  # fresh entity reachable from the delimiter state
                cand = [e for e in range(g.cfg.n_entities) if e != prev_delim_ent and g.entity_trans[prev_delim_ent, e] > 0]
                ent = int(rng.choice(cand)) if cand else prev_delim_ent
            for _try in range(1000):             # rejection: the example must be able to reach the delimiter
                s = int(_draw(rng, P[0:1])[0])        # first property after a delimiter
                h = ent * S + s
                states = [h]
                for _t in range(1, example_len):
                    h = int(_draw(rng, g.trans[c][h:h + 1])[0])
                    states.append(h)
                if i == n_examples - 1 or P[states[-1] % S, 0] > 0:
                    break
            else:
                raise ValueError(f"concept {c} cannot reach the delimiter within example_len={example_len}")
            seq.extend(g.state_symbol[states])
            if i < n_examples - 1:               # delimiter state (v', 0) reachable from the last state
                v_last = states[-1] // S
                prev_delim_ent = int(_draw(rng, g.entity_trans[v_last:v_last + 1])[0])
                seq.append(0)
        toks.append(seq)
        concepts.append(c)
    toks = np.asarray(toks, dtype=np.int64)
    inputs, target = toks[:, :-1], toks[:, -1]
    probs = predictive_probs(g, inputs)[:, -1]       # p(x_N | x_<N)  [n, n_symbols]
    return dict(tokens=inputs, target=target, label=probs.argmax(-1), concept=np.asarray(concepts), bayes_probs=probs)


def predictive_probs(g: GINC, tokens: np.ndarray, concepts=None) -> np.ndarray:
    """Bayes-optimal next-token distribution under the uniform mixture of (in-distribution) concepts, by the
    forward algorithm:  p(x_{t+1} | x_{1:t}) = sum_theta p(theta | x_{1:t}) sum_{h,h'} alpha_t^theta(h) A^theta(h,h') B(h', x_{t+1}).
    tokens [n, L] -> probs [n, L, n_symbols] (row t predicts token t+1).  Raises ValueError if a sequence has
    probability zero under every concept."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [n, L], got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= g.cfg.n_symbols:
        raise ValueError(f"tokens must lie in [0, {g.cfg.n_symbols}), got [{tokens.min()}, {tokens.max()}]")
    C = g.train_concepts if concepts is None else np.asarray(concepts)
    A = g.trans[C]                                         # [C, H, H]
    B = g.emission_matrix()                                # [H, K]
    n, L = tokens.shape
    out = np.empty((n, L, g.cfg.n_symbols))
    # filtered state posterior per concept alpha [n, C, H] and log evidence per concept [n, C]
    alpha = np.broadcast_to(g.start * B[:, tokens[:, 0]].T[:, None, :], (n, len(C), g.n_states)).copy()
    logev = np.zeros((n, len(C)))
    for t in range(L):
        z = alpha.sum(-1)                                  # p(x_t | x_<t, theta)
        if np.any(z.max(1) == 0):
            bad = int(np.flatnonzero(z.max(1) == 0)[0])
            raise ValueError(f"sequence {bad} has probability zero under every concept at position {t}")
        with np.errstate(divide="ignore"):
            logev = logev + np.log(z)
        alpha = np.divide(alpha, z[..., None], out=np.zeros_like(alpha), where=z[..., None] > 0)
        post = np.exp(logev - logev.max(1, keepdims=True))
        post = post / post.sum(1, keepdims=True)           # p(theta | x_{1:t})  [n, C]
        pred_state = np.einsum("nch,chk->nck", alpha, A)   # p(h_{t+1} | x_{1:t}, theta)  [n, C, H]
        out[:, t] = np.einsum("nc,nck,ks->ns", post, pred_state, B)
        if t + 1 < L:
            alpha = pred_state * B[:, tokens[:, t + 1]].T[:, None, :]
    return out


def bayes_labels(g: GINC, tokens: np.ndarray) -> np.ndarray:
    """argmax_x p(x_{t+1} = x | x_{1:t}) for every position  [n, L] (GINC's Bayes-optimal labels)."""
    return predictive_probs(g, tokens).argmax(-1)


def bayes_nll(g: GINC, tokens: np.ndarray) -> np.ndarray:
    """Per-sequence mean NLL (nats) of the Bayes-optimal predictor on next-token prediction  [n]
    (the floor any model's test loss is compared with)."""
    probs = predictive_probs(g, tokens[:, :-1])
    p = np.take_along_axis(probs, tokens[:, 1:, None], axis=-1)[..., 0]
    return -np.log(np.clip(p, 1e-300, None)).mean(1)


# ----------------------------------------------------------------------------------------------- entity switching
def top_switch_share(g: GINC, states: np.ndarray | None = None) -> float:
    """Share of entity switches that go to the row's most likely new entity (MASS Sec. 4.1; notebook 04): with
    ``states`` [n, L] (hidden states of sampled sequences) the measured share over consecutive positions with
    v_{t+1} != v_t; without, the expected share (1/V) sum_v max_{v' != v} A_ent[v, v'] / sum_{v' != v} A_ent[v, v'].
    1/(V-1) for uniform switching; GINC's tempered switching concentrates each row on one or two targets."""
    A = g.entity_trans
    off = A - np.diag(np.diag(A))                                       # switch part of each row  [V, V]
    top = off.argmax(1)                                                 # most likely new entity per row
    if states is None:
        tot = off.sum(1)
        return float(np.mean(np.divide(off.max(1), tot, out=np.zeros_like(tot), where=tot > 0)))
    v = g.entity_of(np.asarray(states))
    a, b = v[:, :-1].reshape(-1), v[:, 1:].reshape(-1)
    sw = a != b
    if not sw.any():
        raise ValueError("no entity switch in the given states: sample longer or more sequences")
    return float((b[sw] == top[a[sw]]).mean())


def switch_readings(seed: int = 0, n_docs: int = 256, length: int = 64, sample_seed: int = 7) -> pd.DataFrame:
    """Top-switch share of the three readings of entity switching (:data:`ENTITY_SWITCH`; MASS Sec. 4.1, notebook 04):
    per reading the expected share (:func:`top_switch_share` of the transition matrix), the share
    measured on ``n_docs`` sampled documents of ``length`` tokens, and the number of switches it counts.  All three
    families share every other random draw (``seed``), so only M differs."""
    rows = []
    for rule in ENTITY_SWITCH:
        g = build_ginc(GINCConfig(seed=seed, entity_switch=rule))
        st = sample_documents(g, n_docs, length, seed=sample_seed)["states"]
        v = g.entity_of(st)
        rows.append(dict(entity_switch=rule, expected_top_share=top_switch_share(g),
                         measured_top_share=top_switch_share(g, st), switches=int((v[:, 1:] != v[:, :-1]).sum()),
                         uniform_share=1.0 / (g.cfg.n_entities - 1)))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- in-context format
def ginc_settings(max_tokens: int = GINC_MAX_PROMPT_TOKENS) -> pd.DataFrame:
    """GINC's in-context prompt settings (generate_data.py): every (example_len, n_examples) with
    (example_len + 1) * n_examples <= ``max_tokens`` and the number of prompts per setting; notebook 04 states these."""
    rows = [dict(example_len=L, n_examples=k, prompts=GINC_PROMPTS_PER_SETTING, tokens=(L + 1) * k)
            for L in GINC_EXAMPLE_LENS for k in GINC_EXAMPLE_COUNTS if (L + 1) * k <= max_tokens]
    return pd.DataFrame(rows)


def _check_format(n_examples: int, example_len: int) -> None:
    if n_examples < 1 or example_len < 2:
        raise ValueError(f"n_examples={n_examples} must be >= 1 and example_len={example_len} >= 2 "
                         "(an example is [x, y] with x at least one token)")


def incontext_positions(n_examples: int, example_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(target positions, delimiter positions) of a sequence [x1, y1, o, ..., xn, yn] of length
    n (L + 1) - 1:  y_i at i (L + 1) + L - 1,  o_i at i (L + 1) + L  (0-based)."""
    _check_format(n_examples, example_len)
    starts = np.arange(n_examples) * (example_len + 1)
    return starts + example_len - 1, (starts + example_len)[:-1]


def sample_incontext(g: GINC, n_seqs: int, n_examples: int, example_len: int, seed: int, concepts=None) -> dict:
    """In-context sequences [x1, y1, o, x2, y2, o, ..., xn, yn] (MASS Sec. 4.1 "Data Generation"; notebook 04), drawn
    as GINC's in-distribution prompts are (generate_data.py, ``ID_sample``): one concept theta per sequence, uniform
    over the in-distribution concepts; one start property s0 per sequence, uniform over 1..S-1; per example a fresh
    start entity v uniform over 0..V-1, h_1 = (v, s0), h_{t+1} ~ A^theta[h_t] for the example's ``example_len``
    tokens (x = the first example_len - 1, y = the last); the delimiter o = symbol 0 follows every example but the
    last (hidden state (v_L, 0)).  GINC's values: example_len in :data:`GINC_EXAMPLE_LENS`, n_examples in
    :data:`GINC_EXAMPLE_COUNTS`.  Unlike GINC's prompts, y is sampled (not the Bayes argmax) and kept, so the
    sequence trains a model; :func:`incontext_bayes` gives the Bayes labels.
    Returns dict(tokens [n, N] int64, states [n, N], target_mask [n, N] bool (y positions), delim_mask [n, N] bool,
    concept [n], start_property [n], entity [n, n_examples] (start entity per example)), N = n_examples (L+1) - 1."""
    _check_format(n_examples, example_len)
    if n_seqs < 1:
        raise ValueError(f"n_seqs={n_seqs} must be >= 1")
    rng = np.random.default_rng(seed)
    S, V, L = g.cfg.n_properties, g.cfg.n_entities, example_len
    if S < 2:
        raise ValueError(f"n_properties={S} must be >= 2 (property 0 is the delimiter)")
    pool = g.train_concepts if concepts is None else np.asarray(concepts)
    concept = rng.choice(pool, size=n_seqs)
    s0 = rng.integers(1, S, size=n_seqs)
    N = n_examples * (L + 1) - 1
    states = np.empty((n_seqs, N), dtype=np.int64)
    ent = np.empty((n_seqs, n_examples), dtype=np.int64)
    for i in range(n_examples):
        p0 = i * (L + 1)
        ent[:, i] = rng.integers(0, V, size=n_seqs)
        states[:, p0] = ent[:, i] * S + s0                                   # h_1 = (v, s0)
        for t in range(1, L):
            states[:, p0 + t] = _draw(rng, g.trans[concept, states[:, p0 + t - 1]])   # h_{t+1} ~ A^theta[h_t]
        if i < n_examples - 1:
            states[:, p0 + L] = g.entity_of(states[:, p0 + L - 1]) * S       # delimiter state (v_L, 0)
    tokens = g.state_symbol[states].astype(np.int64)
    ypos, opos = incontext_positions(n_examples, L)
    target_mask = np.zeros((n_seqs, N), dtype=bool)
    target_mask[:, ypos] = True
    delim_mask = np.zeros((n_seqs, N), dtype=bool)
    delim_mask[:, opos] = True
    return dict(tokens=tokens, states=states, target_mask=target_mask, delim_mask=delim_mask, concept=concept,
                start_property=s0, entity=ent, n_examples=n_examples, example_len=L)


def incontext_predictive(g: GINC, tokens: np.ndarray, example_len: int, concepts=None) -> np.ndarray:
    """Exact Bayes predictive of the in-context format (MASS Sec. 4.1; notebook 04): row t = p(x_t | x_<t) under
    the process of :func:`sample_incontext`, by the forward algorithm over the hypotheses (theta, s0)
    (concept uniform over the in-distribution ones, start property uniform over 1..S-1):

        p(x_t | x_<t) = sum_{theta,s0} p(theta, s0 | x_<t) sum_h alpha_t^{theta,s0}(h) B(h, x_t)
        alpha at an example's first token = uniform over (v, s0), v = 0..V-1; inside an example alpha <- alpha A^theta;
        a delimiter position predicts symbol 0 with probability 1 and the next example starts afresh.

    tokens [n, N] with N = n_examples (example_len + 1) - 1 -> probs [n, N, n_symbols].  ValueError if a sequence
    has probability zero under every hypothesis or does not have the format's length."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [n, N], got shape {tokens.shape}")
    L = example_len
    n, N = tokens.shape
    if example_len < 2 or (N + 1) % (L + 1):
        raise ValueError(f"sequence length {N} is not n_examples * (example_len + 1) - 1 for example_len={L}")
    if tokens.min() < 0 or tokens.max() >= g.cfg.n_symbols:
        raise ValueError(f"tokens must lie in [0, {g.cfg.n_symbols}), got [{tokens.min()}, {tokens.max()}]")
    S, V, K = g.cfg.n_properties, g.cfg.n_entities, g.cfg.n_symbols
    C = g.train_concepts if concepts is None else np.asarray(concepts)
    A = g.trans[C]                                                      # [C, H, H]
    B = g.emission_matrix()                                             # [H, K]
    S0 = np.arange(1, S)
    start = np.zeros((len(S0), g.n_states))                             # uniform over (v, s0)   [S0, H]
    for j, s in enumerate(S0):
        start[j, np.arange(V) * S + s] = 1.0 / V
    logev = np.zeros((n, len(C), len(S0)))                              # log p(x_<t | theta, s0)
    alpha = None
    out = np.empty((n, N, K))
    for t in range(N):
        j = t % (L + 1)
        post = np.exp(logev - logev.max(axis=(1, 2), keepdims=True))
        post /= post.sum(axis=(1, 2), keepdims=True)                    # p(theta, s0 | x_<t)  [n, C, S0]
        if j == L:                                                      # delimiter: deterministic o
            out[:, t] = 0.0
            out[:, t, 0] = 1.0
            if np.any(tokens[:, t] != 0):
                bad = int(np.flatnonzero(tokens[:, t] != 0)[0])
                raise ValueError(f"sequence {bad} has no delimiter at position {t} (example_len={L})")
            continue
        if j == 0:
            pred = np.broadcast_to(start, (n, len(C)) + start.shape)    # p(h_1 | theta, s0)  [n, C, S0, H]
        else:
            pred = np.einsum("ncsh,chk->ncsk", alpha, A)                # alpha A^theta
        q = pred @ B                                                    # p(x_t | x_<t, theta, s0)  [n, C, S0, K]
        out[:, t] = np.einsum("ncs,ncsk->nk", post, q)
        lik = np.take_along_axis(q, tokens[:, t][:, None, None, None], axis=-1)[..., 0]      # [n, C, S0]
        if np.any(lik.max(axis=(1, 2)) == 0):
            bad = int(np.flatnonzero(lik.max(axis=(1, 2)) == 0)[0])
            raise ValueError(f"sequence {bad} has probability zero under every hypothesis at position {t}")
        with np.errstate(divide="ignore"):
            logev = logev + np.log(lik)
        alpha = pred * B[:, tokens[:, t]].T[:, None, None, :]
        alpha = np.divide(alpha, lik[..., None], out=np.zeros_like(alpha), where=lik[..., None] > 0)
    return out


def incontext_bayes(g: GINC, data: dict, concepts=None) -> dict:
    """Bayes floor of the in-context format (MASS Sec. 4.1; notebook 04) for ``data`` from :func:`sample_incontext`:
    dict(target_nll [n] (mean -log p(y_i | prefix) over the targets y), full_nll [n] (mean over positions 1..N-1,
    the positions a next-token model is scored on), target_acc [n] (argmax == y), label [n, n_examples] (Bayes
    argmax of each y), probs [n, N, K])."""
    tokens = np.asarray(data["tokens"])
    probs = incontext_predictive(g, tokens, data["example_len"], concepts)
    p_tok = np.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]          # p(x_t | x_<t)  [n, N]
    nll = -np.log(np.clip(p_tok, 1e-300, None))
    ypos, _ = incontext_positions(data["n_examples"], data["example_len"])
    label = probs[:, ypos].argmax(-1)
    return dict(target_nll=nll[:, ypos].mean(1), full_nll=nll[:, 1:].mean(1),
                target_acc=(label == tokens[:, ypos]).mean(1), label=label, probs=probs)


def within_example_bayes(g: GINC, data: dict, concepts=None) -> dict:
    """Bayes predictor that sees only the current example (notebook 04's regime check): each example [x_i, y_i] is
    scored as a one-example sequence by :func:`incontext_predictive`, so p(y_i | x_i) marginalises theta and s0 under
    their priors instead of inferring them from the earlier examples.  The gap to :func:`incontext_bayes` is what
    in-context inference is worth.  Returns dict(target_nll [n], target_acc [n])."""
    tokens = np.asarray(data["tokens"])
    n, L, k = len(tokens), data["example_len"], data["n_examples"]
    ex = np.concatenate([tokens, np.zeros((n, 1), tokens.dtype)], 1).reshape(n * k, L + 1)[:, :L]   # [n k, L]
    p = incontext_predictive(g, ex, L, concepts)[:, L - 1]                          # p(y | x of its example)  [n k, K]
    nll = -np.log(np.clip(p[np.arange(n * k), ex[:, L - 1]], 1e-300, None)).reshape(n, k)
    return dict(target_nll=nll.mean(1), target_acc=(p.argmax(-1) == ex[:, L - 1]).reshape(n, k).mean(1))


# ----------------------------------------------------------------------------------------------- n-gram baselines
class NGram:
    """Add-k smoothed n-gram model (order 1 = unigram, 2 = bigram, 3 = trigram; notebook 04 baselines):

        p(w | u) = (c(u, w) + k) / (c(u) + k |V|),   u = the previous order-1 tokens (BOS-padded at the start)

    counted on the positions of ``mask`` in the training sequences (all positions by default)."""

    def __init__(self, order: int, vocab_size: int, k: float = 1.0):
        if order < 1 or vocab_size < 1 or k <= 0:
            raise ValueError(f"need order >= 1, vocab_size >= 1 and k > 0, got {order}, {vocab_size}, {k}")
        self.order, self.V, self.k = order, vocab_size, k
        self.counts = np.zeros(((vocab_size + 1) ** (order - 1), vocab_size))     # [contexts, V]

    def _contexts(self, tokens: np.ndarray) -> np.ndarray:
        """Context index of every position  [n, N]  (BOS = id vocab_size)."""
        n, N = tokens.shape
        pad = np.concatenate([np.full((n, self.order - 1), self.V), tokens], axis=1)
        idx = np.zeros((n, N), dtype=np.int64)
        for j in range(self.order - 1):                                 # u = (x_{t-o+1}, ..., x_{t-1})
            idx = idx * (self.V + 1) + pad[:, j: j + N]
        return idx

    def _check(self, tokens, mask):
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.min() < 0 or tokens.max() >= self.V:
            raise ValueError(f"tokens must be [n, N] ids in [0, {self.V}), got shape {tokens.shape}")
        mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
        if mask.shape != tokens.shape:
            raise ValueError(f"mask shape {mask.shape} != tokens shape {tokens.shape}")
        return tokens, mask

    def fit(self, tokens, mask=None) -> "NGram":
        tokens, mask = self._check(tokens, mask)
        np.add.at(self.counts, (self._contexts(tokens)[mask], tokens[mask]), 1.0)
        return self

    def probs(self, tokens) -> np.ndarray:
        """p(. | context) at every position  [n, N, V]."""
        tokens, _ = self._check(tokens, None)
        c = self.counts[self._contexts(tokens)]
        return (c + self.k) / (c.sum(-1, keepdims=True) + self.k * self.V)

    def nll(self, tokens, mask=None) -> np.ndarray:
        """Per-sequence mean -log p(x_t | u_t) over the positions of ``mask``  [n]."""
        tokens, mask = self._check(tokens, mask)
        p = np.take_along_axis(self.probs(tokens), tokens[..., None], axis=-1)[..., 0]
        if np.any(mask.sum(1) == 0):
            raise ValueError("every sequence needs at least one scored position in mask")
        return (-np.log(p) * mask).sum(1) / mask.sum(1)


def ngram_baselines(train: dict, test: dict, vocab_size: int, orders=(1, 2, 3), k: float = 1.0,
                    fit_on: str = "targets") -> pd.DataFrame:
    """Unigram/bigram/trigram baselines of the in-context format (MASS Sec. 4.1; notebook 04): for the targets, fit
    on ``train`` at the positions of its ``target_mask`` (``fit_on="targets"``) or at every position ("all") and
    scored on ``test``'s targets y; for the full-sequence NLL, fit on every position and scored on positions 1..N-1.
    Returns DataFrame(order, name, k, fit_on, target_nll, full_nll, target_acc)."""
    if fit_on not in ("targets", "all"):
        raise ValueError(f"fit_on={fit_on!r} must be 'targets' or 'all'")
    names = {1: "unigram", 2: "bigram", 3: "trigram", 4: "4-gram"}
    tt = np.asarray(test["tokens"])
    full = np.ones(tt.shape, bool)
    full[:, 0] = False
    rows = []
    mask = np.asarray(test["target_mask"], bool)
    for o in orders:
        m = NGram(o, vocab_size, k).fit(train["tokens"], train["target_mask"] if fit_on == "targets" else None)
        m_all = m if fit_on == "all" else NGram(o, vocab_size, k).fit(train["tokens"])
        pred = m.probs(tt).argmax(-1)
        rows.append(dict(order=o, name=names.get(o, f"{o}-gram"), k=k, fit_on=fit_on,
                         target_nll=float(m.nll(tt, mask).mean()), full_nll=float(m_all.nll(tt, full).mean()),
                         target_acc=float((pred == tt)[mask].mean())))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- GLUE (paper profile)
# The official GLUE data folder (the layout of GLUE's download_glue_data.py; MASS Sec. 4.4 fine-tunes on CoLA, QNLI,
# RTE, MNLI, MRPC): <GLUE_DIR>/<TASK>/train.tsv and dev.tsv (MNLI: dev_matched.tsv), tab-separated, no quoting.
# CoLA has no header (columns: source, label, original mark, sentence); the others have a header row, and the columns
# read are named there (MNLI's train.tsv has 12 columns, its dev_matched.tsv 16: sentence1, sentence2 and gold_label
# are found by name). MRPC's header may start with a byte-order mark (the original msr_paraphrase files carry one).
GLUE_FILES = {"cola": ("CoLA", None), "rte": ("RTE", ("sentence1", "sentence2")), "qnli": ("QNLI", ("question", "sentence")),
              "mnli": ("MNLI", ("sentence1", "sentence2")), "mrpc": ("MRPC", ("#1 String", "#2 String"))}
GLUE_LABEL_COLUMN = {"rte": "label", "qnli": "label", "mnli": "gold_label", "mrpc": "Quality"}
# every label a task's files may hold, in the order of the classifier's outputs
GLUE_LABELS = {"cola": ("0", "1"), "rte": ("entailment", "not_entailment"), "qnli": ("entailment", "not_entailment"),
               "mnli": ("contradiction", "entailment", "neutral"), "mrpc": ("0", "1")}
GLUE_TASKS = tuple(GLUE_FILES)
_NB, _GLUE_WHAT = "04", "the official GLUE data folder (CoLA/, RTE/, QNLI/, MNLI/, MRPC/ with train.tsv and dev.tsv)"


def glue_file(glue_dir, task: str, split: str = "train") -> Path:
    """The TSV of ``task``'s ``split`` ("train" or "dev"; MNLI's dev is ``dev_matched.tsv``) under ``glue_dir``."""
    if task not in GLUE_FILES:
        raise ValueError(f"task={task!r} not among {list(GLUE_FILES)}")
    if split not in ("train", "dev"):
        raise ValueError(f"split={split!r} must be 'train' or 'dev'")
    folder = GLUE_FILES[task][0]
    return Path(glue_dir) / folder / f"{'dev_matched' if (task == 'mnli' and split == 'dev') else split}.tsv"


def _glue_rows(path: Path, task: str, limit: int | None = None) -> tuple[list[str] | None, list[list[str]]]:
    """(header or None for CoLA, rows) of a GLUE TSV, read as GLUE's own processors read it (tab-separated, no
    quoting, UTF-8 with an optional byte-order mark); ``limit``: only the first data rows."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = None if GLUE_FILES[task][1] is None else next(reader, None)
        rows = []
        for r in reader:
            if r:
                rows.append(r)
            if limit is not None and len(rows) >= limit:
                break
    return header, rows


def _glue_columns(path: Path, task: str, header) -> tuple[int, int, int | None]:
    """Column indices (text_a, label, text_b or None) of a GLUE TSV, from its header (CoLA: fixed, 3 / 1); a missing
    column raises :class:`moelab.inputs.InputFormatError` naming the file and the column."""
    cols = GLUE_FILES[task][1]
    if cols is None:
        return 3, 1, None
    if not header:
        raise InputFormatError(_NB, "GLUE_DIR", path, "is empty (no header row)", f"copy {task}'s files from {_GLUE_WHAT}")
    need = [cols[0], GLUE_LABEL_COLUMN[task], cols[1]]
    missing = [c for c in need if c not in header]
    if missing:
        raise InputFormatError(_NB, "GLUE_DIR", path, f"header has no column {missing[0]!r} (it has {header})",
                               f"use the official GLUE {GLUE_FILES[task][0]} files, whose header names {need}")
    return tuple(header.index(c) for c in need)


def load_glue_task(glue_dir, task: str, split: str = "train", limit: int | None = None) -> pd.DataFrame:
    """Read a GLUE task (MASS Sec. 4.4; notebook 04 paper profile) from the official TSV layout
    (``<glue_dir>/<TASK>/{train,dev}.tsv``; MNLI dev is ``dev_matched.tsv``) -> DataFrame(text_a, text_b, label) with
    the labels as written (:data:`GLUE_LABELS`).  A missing file raises ``MissingAsset`` naming ``GLUE_DIR``; a row
    without the needed columns or with a label outside :data:`GLUE_LABELS` raises
    :class:`moelab.inputs.InputFormatError` naming the file, the line and the field.  ``limit``: the first rows."""
    path = glue_file(glue_dir, task, split)
    if not path.is_file():
        raise MissingAsset(f"GLUE/{GLUE_FILES[task][0]}", f"{path} not found (GLUE_DIR={str(glue_dir)!r})",
                           command=paper_input_hint(_NB, "GLUE_DIR", _GLUE_WHAT))
    header, rows = _glue_rows(path, task, limit)
    ia, il, ib = _glue_columns(path, task, header)
    first = 1 if header is None else 2
    width = max(ia, il, ib or 0) + 1
    for n, r in enumerate(rows, first):
        if len(r) < width:
            raise InputFormatError(_NB, "GLUE_DIR", path, f"line {n} has {len(r)} tab-separated fields, expected at "
                                   f"least {width}", "use the official GLUE files (tab-separated, no quoting)")
        if r[il] not in GLUE_LABELS[task]:
            field = "label (column 2)" if header is None else repr(header[il])
            raise InputFormatError(_NB, "GLUE_DIR", path, f"line {n}: field {field} is {r[il]!r}, expected one of "
                                   f"{list(GLUE_LABELS[task])}", f"use the official GLUE {GLUE_FILES[task][0]} files")
    return pd.DataFrame(dict(text_a=[r[ia] for r in rows], text_b=["" if ib is None else r[ib] for r in rows],
                             label=[r[il] for r in rows]))


def check_glue_dir(glue_dir, tasks=GLUE_TASKS, rows: int = 5) -> dict:
    """Early check of ``GLUE_DIR`` (notebook 04 paper profile, issue 51; seconds, before any training): the folder
    exists, holds a folder per task in ``tasks`` with its train and dev files, each file's header names the columns
    :func:`load_glue_task` reads and its first ``rows`` rows parse with known labels.  A missing task folder raises
    :class:`moelab.inputs.InputFormatError` naming ``GLUE_DIR``, the folder and the fix.  Returns {task: {split:
    path}}."""
    root = require_path(_NB, "GLUE_DIR", glue_dir, _GLUE_WHAT)
    if not root.is_dir():
        raise InputFormatError(_NB, "GLUE_DIR", root, "is a file, not a folder", f"pass {_GLUE_WHAT}")
    out = {}
    for task in tasks:
        if task not in GLUE_FILES:
            raise ValueError(f"GLUE task {task!r} not among {list(GLUE_FILES)}")
        folder = root / GLUE_FILES[task][0]
        if not folder.is_dir():
            have = sorted(p.name for p in root.iterdir() if p.is_dir())
            raise InputFormatError(_NB, "GLUE_DIR", root, f"has no task folder {GLUE_FILES[task][0]!r} (task {task}; it "
                                   f"holds {have})", f"copy the official GLUE {GLUE_FILES[task][0]}/ folder "
                                   f"({glue_file(root, task, 'train').name}, {glue_file(root, task, 'dev').name}) "
                                   f"into {root}")
        for split in ("train", "dev"):
            p = glue_file(root, task, split)
            if not p.is_file():
                raise InputFormatError(_NB, "GLUE_DIR", folder, f"has no {p.name} (task {task})",
                                       f"copy the official GLUE {GLUE_FILES[task][0]}/{p.name} there")
            if load_glue_task(root, task, split, limit=rows).empty:
                raise InputFormatError(_NB, "GLUE_DIR", p, "holds no data rows", f"copy the official file there")
        out[task] = {s: glue_file(root, task, s) for s in ("train", "dev")}
    return out


def glue_task(glue_dir, task: str, val_items: int = 1000, max_train: int | None = None,
              max_eval: int | None = None, seed: int = 0) -> dict:
    """A GLUE task as the fine-tuning runs read it (notebook 04 paper profile; the same dict as
    ``moelab.suite.textcls.tasks``): ``train``/``validation``/``test`` lists of ((text_a, text_b) or text_a,
    label index in :data:`GLUE_LABELS`), ``labels``, ``chance`` (majority-class share of the test split).

    GLUE's test labels are hidden, so the reported split is the dev file (``test``; MNLI: dev_matched) and early
    selection reads ``validation``: min(``val_items``, 10% of train) items held out of train by a permutation seeded
    ``seed`` (the public scripts select the best epoch on dev itself, which would choose on the reported split).
    ``max_train`` / ``max_eval``: cut the training split and the two evaluation splits (the dry run)."""
    labels = GLUE_LABELS[task]

    def items(df):
        a, b = df.text_a.tolist(), df.text_b.tolist()
        x = a if GLUE_FILES[task][1] is None else list(zip(a, b))
        return [(xi, labels.index(y)) for xi, y in zip(x, df.label)]

    train, test = items(load_glue_task(glue_dir, task, "train")), items(load_glue_task(glue_dir, task, "dev"))
    perm = np.random.default_rng(seed).permutation(len(train))
    n_val = max(1, min(int(val_items), len(train) // 10))
    val, train = [train[i] for i in perm[:n_val]], [train[i] for i in perm[n_val:]]
    if max_train is not None:
        train = train[:max_train]
    if max_eval is not None:
        val, test = val[:max_eval], test[:max_eval]
    if not train or not test:
        raise InputFormatError(_NB, "GLUE_DIR", glue_file(glue_dir, task, "train" if not train else "dev"),
                               f"leaves an empty {'train' if not train else 'dev'} split for task {task}",
                               "use the official GLUE files")
    counts = np.bincount([y for _, y in test], minlength=len(labels))
    return dict(train=train, validation=val, test=test, labels=list(labels), chance=float(counts.max() / len(test)))


def check_paper_inputs(model_path, glue_dir, tasks=GLUE_TASKS, layer: int | None = None) -> pd.DataFrame:
    """Every input of notebook 04's paper profile, checked in seconds before any training (issue 51):
    ``MODEL_PATH`` (:func:`bert_large_path`) and ``GLUE_DIR`` (:func:`check_glue_dir` for ``tasks``).  Returns one row
    per input: parameter, resolved path, files and digest (:func:`moelab.cache.path_identity`, the identity the cache
    keys hold)."""
    bert_large_path(model_path, layer)
    files = check_glue_dir(glue_dir, tasks)
    rows = [dict(parameter="MODEL_PATH", what="BERT (HF folder)", **path_identity(model_path))]
    rows += [dict(parameter="GLUE_DIR", what=f"GLUE {t}", **path_identity(f["train"].parent)) for t, f in files.items()]
    return pd.DataFrame(rows)


def bert_large_path(path, layer: int | None = None) -> Path:
    """A local BERT Hugging Face folder (MASS Sec. 4.4 fine-tunes bert-large; notebook 04 paper profile): checked by
    :func:`moelab.inputs.require_hf_model` (config.json with ``model_type`` "bert", weights, tokenizer), and, with
    ``layer``, that it has more than ``layer`` transformer layers (the public scripts make layer 10 of bert-large's
    24 an MoE layer).  Missing -> ``MissingAsset``; wrong format -> :class:`moelab.inputs.InputFormatError`."""
    what = "a local bert-large-uncased folder (HF format)"
    cfg = require_hf_model(_NB, "MODEL_PATH", path, what, model_types=("bert",))
    p = Path(path).expanduser()
    if layer is not None and int(cfg.get("num_hidden_layers", 0)) <= int(layer):
        raise InputFormatError(_NB, "MODEL_PATH", p / "config.json", f"field 'num_hidden_layers' is "
                               f"{cfg.get('num_hidden_layers')}, but the MoE layer is layer {layer} (0-based)",
                               f"pass {what} (24 layers), or a BERT with more than {layer} layers")
    return p
