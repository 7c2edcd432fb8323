"""GINC-style synthetic language (Xie et al. 2022), as used by MASS's synthetic experiment.

MASS paper (003) section "Results on Synthetic-Data / Data Generation"; notebook ``notebooks/04_mass.py``.
Written by hand (no library samples GINC's structured HMM family; hmmlearn only checks it in tests).

Hidden state h = (entity v, property s), index ``h = v * n_properties + s`` (GINC's "value" x "slot").
Emission is deterministic through a memory matrix ``memory[v, s] -> symbol``; property 0 always emits the
delimiter symbol 0 ("/").  A concept theta fixes the property transitions; entity transitions are shared:

    p(h_{t+1} | h_t, theta) = A_ent[v_t, v_{t+1}] * A_prop^theta[s_t, s_{t+1}]      (MASS Sec. 4.1; joint = A_ent ⊗ A_prop)
    A_ent = 0.9 I + 0.1 M,   M = sum_j softmax(u)_j P_j                            (entity persistence 0.9)
    A_prop^theta = sum_j softmax(u^theta / 0.1)_j P_j^theta                        (tempered mixture of permutations)
    pi = softmax((u - 0.5) / 10)                                                    (near-uniform start)

Ten concepts are built; the first five are the in-distribution (pretraining) concepts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["GINCConfig", "GINC", "build_ginc", "sample_documents", "sample_prompts",
           "predictive_probs", "bayes_labels", "bayes_nll"]


@dataclass(frozen=True)
class GINCConfig:
    """Settings of p-lambda/incontext-learning ``generate_data.py`` as its scripts use them (facts note)."""
    n_entities: int = 10
    n_properties: int = 10
    n_symbols: int = 50
    n_concepts: int = 10
    n_train_concepts: int = 5
    transition_temp: float = 0.1
    persistence: float = 0.9
    start_temp: float = 10.0
    seed: int = 0

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
    # A_ent = p I + (1-p) M   [V, V], shared by every concept
    entity_trans = cfg.persistence * np.eye(V) + (1 - cfg.persistence) * _perm_mixture(rng, V, V, 1.0)
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
