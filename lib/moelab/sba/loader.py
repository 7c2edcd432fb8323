"""nomic-embed-text-v2-moe in plain PyTorch (SBA paper §III, §V-A; notebook ``02_sba``; ``moelab.nomic`` re-exports it).

The SBA paper analyses and fine-tunes ``nomic-ai/nomic-embed-text-v2-moe``. Upstream the model needs remote code
(transformers' own ``nomic_bert`` is the dense v1.5 design and silently lacks the MoE), so it is written out here and
loaded from a *local* directory (``config.json``, ``model.safetensors`` or a sharded index, XLM-RoBERTa tokenizer files).
Nothing is fetched from a hub.

Architecture (``docs/reference-facts.md``, section "nomic-embed-text-v2-moe"):

- embeddings: word + token-type (no learned positions), then ``emb_ln`` (LayerNorm);
- 12 post-norm blocks: ``h = norm1(attn(x) + x)``, ``x' = norm2(mlp(h) + h)``;
- attention: fused ``Wqkv`` with bias, 12 heads, rotary over the full head width (base 10000, halves not interleaved),
  ``out_proj`` with bias;
- dense FFN (even layers): ``fc2(gelu(fc1(x)))`` with biases;
- MoE FFN (odd layers 1, 3, ..., 11): router bias-free linear 768->8, softmax over all 8 experts in fp32, top-2 kept
  **without** renormalisation; expert e: ``gelu(x W1[e]^T) W2[e]``, no per-expert bias; the weighted sum over the two
  chosen experts plus **one shared bias** added once. This layer is a :class:`moelab.core.layer.MoELayer`, so the
  aggregation (``linear`` / ``sba`` / ``sba_normfree`` / ``sba_unit``) switches without touching routing, experts or
  weights (:meth:`NomicEmbed.set_aggregation`), and :func:`moelab.core.capture.capture_moe` sees the expert outputs;
- masked mean pooling over the last hidden states, then L2 normalisation; prefixes ``search_query: `` /
  ``search_document: ``; at most 512 tokens (longer inputs are truncated with a warning that says how many).

Checkpoint keys are the upstream (MegaBlocks) names; the stacked expert matrices ``w1``/``w2`` are stored as
``[E*f, d]`` and reshaped to ``(E, f, d)``; ``w1`` is applied transposed, ``w2`` as stored.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from moelab.assets import MissingAsset
from moelab.core.layer import MoELayer
from moelab.profiles import paper_input_hint

from .method import AGGREGATIONS, check_aggregation

__all__ = ["QUERY_PREFIX", "DOCUMENT_PREFIX", "MAX_LENGTH", "AGGREGATIONS", "NomicConfig", "rotary_cos_sin",
           "apply_rotary", "NomicAttention", "NomicDenseMLP", "make_moe_layer", "NomicBlock", "NomicEmbeddings",
           "NomicEncoder", "NomicEmbed", "expected_shapes", "check_state_dict", "load_state_dict_into",
           "upstream_state_dict", "read_safetensors", "load_nomic", "save_nomic"]

QUERY_PREFIX = "search_query: "
DOCUMENT_PREFIX = "search_document: "
MAX_LENGTH = 512


# ----------------------------------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class NomicConfig:
    """Shapes and switches of nomic-embed-text-v2-moe (defaults are the released model's)."""

    vocab_size: int = 250048
    d_model: int = 768
    num_heads: int = 12
    d_ff: int = 3072
    num_layers: int = 12
    num_experts: int = 8
    top_k: int = 2
    moe_every_n_layers: int = 2
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    rotary_base: float = 10000.0
    max_length: int = MAX_LENGTH
    pad_token_id: int = 1
    moe_layers: tuple = field(default=())

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "num_experts", "top_k",
                     "moe_every_n_layers", "type_vocab_size", "max_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"NomicConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if (self.d_model // self.num_heads) % 2:
            raise ValueError(f"head width {self.d_model // self.num_heads} must be even for rotary embeddings")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} > num_experts={self.num_experts}")
        if not self.moe_layers:
            # upstream: layer i is MoE when i % moe_every_n_layers == 1 (the odd layers for n=2)
            self.moe_layers = tuple(i for i in range(self.num_layers) if i % self.moe_every_n_layers == 1)
        self.moe_layers = tuple(int(i) for i in self.moe_layers)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_hf_config(cls, hf: dict, source: str = "config.json") -> "NomicConfig":
        """Validate an upstream ``config.json`` dict and translate it; another architecture -> ``ValueError``."""
        mt = hf.get("model_type")
        if mt != "nomic_bert":
            raise ValueError(f"{source}: model_type={mt!r} is not 'nomic_bert'; this loader reads only "
                             f"nomic-embed-text-v2-moe (architectures={hf.get('architectures')})")
        if int(hf.get("num_experts", 0) or 0) <= 0:
            raise ValueError(f"{source}: num_experts={hf.get('num_experts')!r}: this is a dense nomic_bert "
                             "(e.g. nomic-embed-text-v1.5), not the MoE model nomic-embed-text-v2-moe")
        checks = {
            "moe_normalize_expert_weights": (False, "the MoE router keeps the top-2 softmax weights unnormalised"),
            "prenorm": (False, "the blocks are post-norm"),
            "rotary_emb_fraction": (1.0, "rotary covers the full head width"),
            "rotary_emb_interleaved": (False, "rotary rotates halves, not interleaved pairs"),
            "activation_function": ("gelu", "experts and FFNs use GELU"),
            "num_shared_experts": (0, "no shared expert"),
            "qkv_proj_bias": (True, "Wqkv has a bias"),
            "parallel_block": (False, "sequential attention then MLP"),
        }
        for k, (want, why) in checks.items():
            if k in hf and hf[k] is not None and hf[k] != want:
                raise ValueError(f"{source}: {k}={hf[k]!r} but this implementation assumes {want!r} ({why})")
        if hf.get("rotary_scaling_factor") not in (None, 1, 1.0):
            raise ValueError(f"{source}: rotary_scaling_factor={hf['rotary_scaling_factor']!r} is not supported")
        return cls(
            vocab_size=int(hf.get("vocab_size", 250048)),
            d_model=int(hf.get("n_embd", hf.get("hidden_size", 768))),
            num_heads=int(hf.get("n_head", hf.get("num_attention_heads", 12))),
            d_ff=int(hf.get("n_inner", hf.get("intermediate_size", 3072))),
            num_layers=int(hf.get("n_layer", hf.get("num_hidden_layers", 12))),
            num_experts=int(hf["num_experts"]),
            top_k=int(hf.get("moe_top_k", 2)),
            moe_every_n_layers=int(hf.get("moe_every_n_layers", 2)),
            type_vocab_size=int(hf.get("type_vocab_size", 1)),
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            rotary_base=float(hf.get("rotary_emb_base", 10000)),
            pad_token_id=int(hf.get("pad_token_id", 1) if hf.get("pad_token_id") is not None else 1),
        )

    def to_hf_config(self) -> dict:
        """The upstream ``config.json`` fields this implementation reads (used to write test checkpoints)."""
        return {
            "model_type": "nomic_bert", "architectures": ["NomicBertModel"], "vocab_size": self.vocab_size,
            "n_embd": self.d_model, "n_head": self.num_heads, "n_inner": self.d_ff, "n_layer": self.num_layers,
            "num_experts": self.num_experts, "moe_top_k": self.top_k, "moe_every_n_layers": self.moe_every_n_layers,
            "moe_normalize_expert_weights": False, "type_vocab_size": self.type_vocab_size,
            "layer_norm_epsilon": self.layer_norm_eps, "rotary_emb_base": self.rotary_base,
            "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "prenorm": False,
            "activation_function": "gelu", "qkv_proj_bias": True, "num_shared_experts": 0,
            "pad_token_id": self.pad_token_id,
        }


# ----------------------------------------------------------------------------------------------------------------------
# modules
# ----------------------------------------------------------------------------------------------------------------------
def rotary_cos_sin(seq_len: int, head_dim: int, base: float, device=None, dtype=torch.float32):
    """cos, sin tables [S, head_dim/2] for positions 0..S-1: θ_j = base^(-2j/head_dim)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # [S, head_dim/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved rotary on x [B, H, S, Dh]: halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class NomicAttention(nn.Module):
    """Self-attention with fused ``Wqkv`` (bias) and rotary over the full head width."""

    def __init__(self, cfg: NomicConfig):
        super().__init__()
        self.cfg = cfg
        self.Wqkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=True)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=True)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        B, S, d = x.shape
        H, Dh = self.cfg.num_heads, self.cfg.head_dim
        qkv = self.Wqkv(x).view(B, S, 3, H, Dh).permute(2, 0, 3, 1, 4)  # [3, B, H, S, Dh]
        q, k, v = qkv[0], qkv[1], qkv[2]
        cos, sin = rotary_cos_sin(S, Dh, self.cfg.rotary_base, device=x.device, dtype=x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # softmax(q k^T / sqrt(Dh) + mask) v   [B, H, S, Dh]; padded keys masked out
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return self.out_proj(attn.transpose(1, 2).reshape(B, S, d))


class NomicDenseMLP(nn.Module):
    """Dense FFN of the even layers: ``fc2(gelu(fc1(x)))`` with biases."""

    def __init__(self, cfg: NomicConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def make_moe_layer(cfg: NomicConfig, aggregation: str = "linear") -> nn.Module:
    """nomic's MoE FFN as a core :class:`~moelab.core.layer.MoELayer`: 8 GELU experts without biases, fp32 softmax over
    all experts, top-2 without renormalisation, one shared output bias, switchable aggregation."""
    check_aggregation(aggregation)
    return MoELayer(cfg.d_model, cfg.d_ff, cfg.num_experts, cfg.top_k, act="gelu", router="topk",
                    renormalize=False, aggregation=aggregation, shared_bias=True)


class NomicBlock(nn.Module):
    """Post-norm block: ``h = norm1(attn(x) + x)``; ``x' = norm2(mlp(h) + h)``."""

    def __init__(self, cfg: NomicConfig, moe: bool, aggregation: str = "linear"):
        super().__init__()
        self.is_moe = moe
        self.attn = NomicAttention(cfg)
        self.mlp = make_moe_layer(cfg, aggregation) if moe else NomicDenseMLP(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(self.attn(x, mask) + x)
        if self.is_moe:
            # route only the real (unpadded) tokens, as upstream does: [T, d] with T = mask.sum()
            m = torch.zeros_like(h)
            m[mask] = self.mlp(h[mask])
        else:
            m = self.mlp(h)
        return self.norm2(m + h)


class NomicEmbeddings(nn.Module):
    def __init__(self, cfg: NomicConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.d_model)

    def forward(self, input_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)


class NomicEncoder(nn.Module):
    def __init__(self, cfg: NomicConfig, aggregation: str = "linear"):
        super().__init__()
        self.layers = nn.ModuleList(
            [NomicBlock(cfg, moe=i in cfg.moe_layers, aggregation=aggregation) for i in range(cfg.num_layers)])


class NomicEmbed(nn.Module):
    """nomic-embed-text-v2-moe: token ids -> L2-normalised sentence embeddings (SBA paper §V-A; notebook 02_sba)."""

    def __init__(self, cfg: NomicConfig, aggregation: str = "linear"):
        super().__init__()
        self.cfg = cfg
        self.embeddings = NomicEmbeddings(cfg)
        self.emb_ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.encoder = NomicEncoder(cfg, aggregation)
        self.tokenizer = None  # set by load_nomic

    # -- aggregation switch ------------------------------------------------------------------------------------------
    def moe_layers(self) -> list:
        return [blk.mlp for blk in self.encoder.layers if blk.is_moe]

    def set_aggregation(self, method: str) -> "NomicEmbed":
        """Switch every MoE layer's aggregation operator; routing, experts and weights stay untouched (paper §V-A)."""
        check_aggregation(method)
        for layer in self.moe_layers():
            layer.aggregation = method
        return self

    @property
    def aggregation(self) -> str:
        methods = {layer.aggregation for layer in self.moe_layers()}
        return methods.pop() if len(methods) == 1 else ",".join(sorted(methods))

    # -- forward -----------------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states [B, S, d]."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[0] == 0:
            raise ValueError("empty batch: input_ids has 0 rows")
        if input_ids.shape[1] > self.cfg.max_length:
            raise ValueError(f"sequence length {input_ids.shape[1]} > max_length {self.cfg.max_length}; "
                             "tokenise with NomicEmbed.tokenize (it truncates and says so)")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.bool()
        x = self.emb_ln(self.embeddings(input_ids, token_type_ids))
        for blk in self.encoder.layers:
            x = blk(x, mask)
        return x

    def embed(self, input_ids, attention_mask=None, normalize: bool = True) -> torch.Tensor:
        """Masked mean pooling, then L2 normalisation: ``e = mean_{t: m_t=1} h_t / ||.||``   [B, d]."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        h = self(input_ids, attention_mask)
        m = attention_mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
        return F.normalize(pooled, dim=-1) if normalize else pooled

    # -- text interface ----------------------------------------------------------------------------------------------
    def tokenize(self, texts, kind: str | None = "document"):
        """Prefix and tokenise ``texts``; inputs over 512 tokens are truncated with a warning naming how many."""
        if self.tokenizer is None:
            raise ValueError("this NomicEmbed has no tokenizer; load it with moelab.sba.load_nomic(path)")
        texts = _prefixed(texts, kind)
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=True)["input_ids"]]
        n_over = sum(L > self.cfg.max_length for L in lengths)
        if n_over:
            warnings.warn(f"{n_over} of {len(texts)} input(s) exceed {self.cfg.max_length} tokens "
                          f"(longest {max(lengths)}); truncated to {self.cfg.max_length}", stacklevel=2)
        self.last_truncated = n_over
        return self.tokenizer(texts, padding=True, truncation=True, max_length=self.cfg.max_length,
                              return_tensors="pt")

    @torch.no_grad()
    def encode(self, texts, kind: str | None = "document", batch_size: int = 32) -> torch.Tensor:
        """Texts -> L2-normalised embeddings [N, d] (``kind``: 'query' | 'document' | None for no prefix)."""
        texts = list(texts) if not isinstance(texts, str) else [texts]
        if not texts:
            raise ValueError("encode() got an empty list of texts")
        was_training = self.training
        self.eval()
        out = []
        dev = next(self.parameters()).device
        for i in range(0, len(texts), batch_size):
            enc = self.tokenize(texts[i:i + batch_size], kind)
            out.append(self.embed(enc["input_ids"].to(dev), enc["attention_mask"].to(dev)).cpu())
        self.train(was_training)
        return torch.cat(out)


def _prefixed(texts, kind):
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("got an empty list of texts")
    bad = [t for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings, got {type(bad[0]).__name__}: {bad[0]!r}")
    prefix = {"query": QUERY_PREFIX, "document": DOCUMENT_PREFIX, None: ""}
    if kind not in prefix:
        raise ValueError(f"kind={kind!r}; expected 'query', 'document' or None")
    return [prefix[kind] + t for t in texts]


# ----------------------------------------------------------------------------------------------------------------------
# checkpoint <-> module
# ----------------------------------------------------------------------------------------------------------------------
def expected_shapes(cfg: NomicConfig) -> dict:
    """Upstream key -> shape for every tensor of the checkpoint (``pooler.*`` is optional and ignored)."""
    d, f, E = cfg.d_model, cfg.d_ff, cfg.num_experts
    shapes = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, d),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, d),
        "emb_ln.weight": (d,), "emb_ln.bias": (d,),
    }
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}."
        shapes.update({
            p + "attn.Wqkv.weight": (3 * d, d), p + "attn.Wqkv.bias": (3 * d,),
            p + "attn.out_proj.weight": (d, d), p + "attn.out_proj.bias": (d,),
            p + "norm1.weight": (d,), p + "norm1.bias": (d,), p + "norm2.weight": (d,), p + "norm2.bias": (d,),
        })
        if i in cfg.moe_layers:
            shapes.update({
                p + "mlp.router.layer.weight": (E, d),
                p + "mlp.experts.mlp.w1": (E * f, d), p + "mlp.experts.mlp.w2": (E * f, d),
                p + "mlp.experts.bias": (d,),
            })
        else:
            shapes.update({p + "mlp.fc1.weight": (f, d), p + "mlp.fc1.bias": (f,),
                           p + "mlp.fc2.weight": (d, f), p + "mlp.fc2.bias": (d,)})
    return shapes


def check_state_dict(sd: dict, cfg: NomicConfig, source: str = "checkpoint") -> None:
    """Every expected key present with its shape; no unexpected key (except ``pooler.*``). Else ``ValueError``."""
    shapes = expected_shapes(cfg)
    if not any(k.startswith("encoder.layers.") for k in sd):
        sample = sorted(sd)[:3]
        raise ValueError(f"{source} does not look like nomic-embed-text-v2-moe (no 'encoder.layers.*' keys; "
                         f"first keys {sample}): another architecture?")
    missing = [k for k in shapes if k not in sd]
    if missing:
        raise ValueError(f"{source} is missing {len(missing)} key(s) of nomic-embed-text-v2-moe, e.g. {missing[:3]}")
    unexpected = [k for k in sd if k not in shapes and not k.startswith("pooler.")]
    if unexpected:
        raise ValueError(f"{source} has {len(unexpected)} unexpected key(s), e.g. {unexpected[:3]}: "
                         "another architecture or a config.json that does not match the weights")
    for k, shp in shapes.items():
        if tuple(sd[k].shape) != shp:
            raise ValueError(f"{source}: key {k!r} has shape {tuple(sd[k].shape)}, expected {shp}")


def load_state_dict_into(model: NomicEmbed, sd: dict, source: str = "checkpoint") -> NomicEmbed:
    """Copy an upstream-named state dict into ``model`` (validated first; stacked experts reshaped)."""
    cfg = model.cfg
    check_state_dict(sd, cfg, source)
    E, f, d = cfg.num_experts, cfg.d_ff, cfg.d_model
    own = {}
    for k, v in sd.items():
        if k.startswith("pooler."):
            continue
        if ".mlp.router.layer.weight" in k or ".mlp.experts." in k:
            continue
        own[k] = v
    missing, unexpected = model.load_state_dict(own, strict=False)
    moe_prefixes = [f"encoder.layers.{i}.mlp." for i in cfg.moe_layers]
    left = [k for k in missing if not any(k.startswith(p) for p in moe_prefixes)]
    if left or unexpected:  # a mismatch between this module and expected_shapes: a bug here, not bad input
        raise RuntimeError(f"internal key mismatch: missing {left[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for i in cfg.moe_layers:
            p = f"encoder.layers.{i}.mlp."
            layer = model.encoder.layers[i].mlp
            w1 = sd[p + "experts.mlp.w1"].reshape(E, f, d)  # applied transposed: x W1[e]^T   [E, f, d]
            w2 = sd[p + "experts.mlp.w2"].reshape(E, f, d)  # applied as stored: a W2[e]      [E, f, d]
            _set_moe_weights(layer, sd[p + "router.layer.weight"], w1, w2, sd[p + "experts.bias"])
    return model


def _set_moe_weights(layer, router_w, w1, w2, bias) -> None:
    """Write nomic's MoE tensors into a core MoELayer (router [E,d], w_in [E,f,d], w_out [E,d,f], shared bias [d])."""
    layer.router.proj.weight.copy_(router_w)
    layer.experts.w_in.copy_(w1)
    layer.experts.w_out.copy_(w2.transpose(1, 2))  # StackedExperts computes a @ w_out[e]^T
    layer.shared_bias.copy_(bias)


def _get_moe_weights(layer, cfg: NomicConfig) -> dict:
    E, f, d = cfg.num_experts, cfg.d_ff, cfg.d_model
    return {
        "router.layer.weight": layer.router.proj.weight.detach().clone(),
        "experts.mlp.w1": layer.experts.w_in.detach().reshape(E * f, d).clone(),
        "experts.mlp.w2": layer.experts.w_out.detach().transpose(1, 2).reshape(E * f, d).clone(),
        "experts.bias": layer.shared_bias.detach().clone(),
    }


def upstream_state_dict(model: NomicEmbed) -> dict:
    """The inverse of :func:`load_state_dict_into`: upstream key names and layouts (for writing checkpoints)."""
    cfg = model.cfg
    sd = {}
    for k, v in model.state_dict().items():
        if any(k.startswith(f"encoder.layers.{i}.mlp.") for i in cfg.moe_layers):
            continue
        sd[k] = v.detach().clone()
    for i in cfg.moe_layers:
        for k, v in _get_moe_weights(model.encoder.layers[i].mlp, cfg).items():
            sd[f"encoder.layers.{i}.mlp.{k}"] = v
    return {k: v.contiguous() for k, v in sd.items()}


def read_safetensors(path: Path) -> dict:
    """``model.safetensors`` or a sharded ``model.safetensors.index.json`` from a local directory."""
    path = Path(path)
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        sd = {}
        for s in shards:
            sd.update(load_file(str(path / s)))
        return sd
    raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")


def load_nomic(path, aggregation: str = "linear", device: str = "cpu", tokenizer: bool = True) -> NomicEmbed:
    """Load nomic-embed-text-v2-moe from a local directory (no remote code, no network).

    A missing directory raises :class:`moelab.assets.MissingAsset`; another architecture, a missing or misshaped key,
    or an unknown aggregation raise ``ValueError`` naming it. SBA paper §V-A; notebook 02_sba (paper profile).
    """
    check_aggregation(aggregation)
    if path is None or not Path(path).is_dir():
        raise MissingAsset("nomic-embed-text-v2-moe", f"no local directory at {str(path)!r} (it cannot be downloaded "
                           "here)", paper_input_hint("02", "MODEL_PATH", "a local folder of nomic-embed-text-v2-moe (config.json, "
                                                     "model.safetensors, tokenizer files; or set MOELAB_NOMIC_PATH)"))
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{path}: no config.json")
    cfg = NomicConfig.from_hf_config(json.loads(cfg_file.read_text()), source=str(cfg_file))
    sd = read_safetensors(path)
    model = NomicEmbed(cfg, aggregation=aggregation)
    load_state_dict_into(model, {k: v.float() for k, v in sd.items()}, source=str(path))
    if tokenizer:
        model.tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    return model.to(device).eval()


def save_nomic(model: NomicEmbed, path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer) with the upstream names (used by tests)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf_config(), indent=1))
    save_file(upstream_state_dict(model), str(path / "model.safetensors"))
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(path))
    return path
