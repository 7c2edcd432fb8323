"""Dense -> MoE conversion of transformers models (upcycling; paper 002 notebook ``03_upcycling``, SBA/MoCE
experiments on MiniLM and SmolLM2).

Supported FFN sites: decoder layers with a LlamaMLP-style ``mlp`` (SmolLM2, Llama, Qwen2, Gemma), layers with an
``mlp.fc1``/``mlp.fc2`` MLP (transformers' ViT, the dense stand-in of notebook 03's vision experiment) and BERT layers
(all-MiniLM-L6-v2: ``intermediate.dense`` -> act -> ``output.dense`` -> dropout -> LayerNorm(h + residual)). For
BERT only the two linears' path becomes the MoE: ``intermediate`` turns into a pass-through and ``output.dense`` into
the MoELayer, so ``output.LayerNorm`` and the residual stay as they were.

transformers' layers call the FFN without the attention mask. So that padding stays out of the balancing loss
(as in transformers' ``load_balancing_loss_func``), ``moeify`` registers hooks on the model that
hand the forward call's 2-D ``attention_mask`` to every MoE layer (``MoELayer.token_mask``) and clear it afterwards.
"""
from __future__ import annotations

import inspect
import types
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .init import BertFFN
from .layer import MoELayer, moe_layers

__all__ = ["ffn_sites", "moeify", "collect_ffn_inputs", "save_moe", "load_moe", "PassThrough", "attach_mask_hooks"]


class PassThrough(nn.Module):
    """Identity standing in for BERT's ``intermediate`` after conversion (the MoE sits in ``output.dense``)."""

    def forward(self, hidden_states):
        return hidden_states


@dataclass
class Site:
    index: int
    name: str            # module path of the transformer layer
    layer: nn.Module     # the transformer layer
    kind: str            # "mlp" | "bert"

    @property
    def ffn(self) -> nn.Module:
        if self.kind == "mlp":
            return self.layer.mlp
        if isinstance(self.layer.output.dense, MoELayer):
            return self.layer.output.dense
        return BertFFN(self.layer)

    @property
    def input_module(self) -> nn.Module:
        """Module whose input is the FFN input x [B,S,d]."""
        return self.layer.mlp if self.kind == "mlp" else self.layer.output.dense if isinstance(
            self.layer.intermediate, PassThrough) else self.layer.intermediate


def ffn_sites(model: nn.Module) -> list[Site]:
    """The model's FFN sites in layer order (index = position among transformer layers)."""
    sites = []
    for name, m in model.named_modules():
        if hasattr(m, "mlp") and isinstance(m.mlp, nn.Module) and (
                isinstance(m.mlp, MoELayer) or all(hasattr(m.mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))
                or all(isinstance(getattr(m.mlp, a, None), nn.Linear) for a in ("fc1", "fc2"))):  # ViTMLP
            sites.append(Site(len(sites), name, m, "mlp"))
        elif (hasattr(m, "intermediate") and hasattr(m, "output") and hasattr(m.output, "dense")
              and hasattr(m.output, "LayerNorm")):
            sites.append(Site(len(sites), name, m, "bert"))
    if not sites:
        raise ValueError(f"no supported FFN found in {type(model).__name__} "
                         "(LlamaMLP-style mlp, mlp.fc1/fc2 as ViT, or BERT layers)")
    return sites


def _select(sites, layers):
    n = len(sites)
    if layers == "all":
        idx = list(range(n))
    elif layers == "every_other":
        idx = list(range(1, n, 2))                                           # odd layers, as nomic-embed-v2-moe
    elif isinstance(layers, (list, tuple)) and all(isinstance(i, int) for i in layers):
        bad = [i for i in layers if not -n <= i < n]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {n} FFN layers")
        idx = sorted({i % n for i in layers})
    else:
        raise ValueError(f"layers must be 'all', 'every_other' or a list of ints, got {layers!r}")
    return idx


def moeify(model: nn.Module, layers="all", num_experts: int = 8, top_k: int = 2, init="sparse",
           calib_inputs: dict | None = None, **layer_kwargs) -> nn.Module:
    """Replace the chosen dense FFNs by :class:`MoELayer` in place (and return the model).

    init: "sparse" (copies), "noise" (noise-injected copies), "drop" (Drop-Upcycling), a callable
    ``init(dense_ffn, layer, calib_x)``, or None (leave random; used by :func:`load_moe`). ``calib_inputs``:
    {layer index: Tensor[T,d]} from :func:`collect_ffn_inputs`. ``layer_kwargs`` go to :class:`MoELayer`
    (e.g. ``renormalize=True`` makes sparse upcycling exact; ``renormalize=False`` scales the output by the kept
    routing mass).
    """
    sites = ffn_sites(model)
    idx = _select(sites, layers)
    for i in idx:
        s = sites[i]
        if isinstance(s.ffn, MoELayer):
            raise ValueError(f"layer {i} ({s.name}) is already an MoE layer")
        calib = None if calib_inputs is None else calib_inputs.get(i)
        moe = MoELayer.from_dense(s.ffn, num_experts, top_k, init=init, calib=calib, **layer_kwargs)
        if s.kind == "mlp":
            s.layer.mlp = moe
        else:
            s.layer.intermediate = PassThrough()
            s.layer.output.dense = moe
    attach_mask_hooks(model)
    record = getattr(model, "_moelab_moe", None) or {"conversions": []}
    record["conversions"].append({"layers": idx, "num_experts": num_experts, "top_k": top_k,
                                  "layer_kwargs": _jsonable(layer_kwargs)})
    model._moelab_moe = record
    return model


def _call_argument(model: nn.Module, name: str, args: tuple, kwargs: dict):
    """The value of ``model.forward``'s argument ``name`` in this call (keyword or positional), or None."""
    if name in kwargs:
        return kwargs[name]
    params = list(inspect.signature(type(model).forward).parameters)[1:]     # the class's (not a bound wrapper's)
    if name in params and params.index(name) < len(args):
        return args[params.index(name)]
    return None


def _capture_attention_mask(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: the call's ``attention_mask`` [B, S] -> ``token_mask`` of every MoE layer of ``model``.

    With a KV cache the mask covers past + current positions while the layers see only the S current tokens
    (those of ``input_ids`` / ``inputs_embeds``): the last S columns are theirs."""
    mask = _call_argument(model, "attention_mask", args, kwargs)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError("a moeify'd model takes a 2-D attention_mask [B, S] (1 = real token) so that padding "
                             f"stays out of the balancing loss; got {getattr(mask, 'shape', type(mask).__name__)}")
        ids = _call_argument(model, "input_ids", args, kwargs)
        if ids is None:
            ids = _call_argument(model, "inputs_embeds", args, kwargs)
        if isinstance(ids, torch.Tensor) and ids.dim() >= 2 and mask.shape[1] > ids.shape[1]:
            mask = mask[:, -ids.shape[1]:]                                   # KV cache: current positions
    for layer in moe_layers(model):
        layer.token_mask = mask


def _release_attention_mask(model: nn.Module, args: tuple, kwargs: dict, output) -> None:
    """Forward hook (always called, also after an exception): clear the MoE layers' ``token_mask``."""
    for layer in moe_layers(model):
        layer.token_mask = None


def _forward_with_mask(self: nn.Module, *args, **kwargs):
    """``model.forward`` called directly (sentence-transformers calls ``auto_model.forward(...)``, which skips module
    hooks): the same capture and release as the hooks, around the class's forward."""
    _capture_attention_mask(self, args, kwargs)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _release_attention_mask(self, args, kwargs, None)


def attach_mask_hooks(model: nn.Module) -> nn.Module:
    """Hand ``model``'s ``attention_mask`` to its MoE layers during each forward pass, whether the model is called
    (``model(...)``: forward hooks) or its ``forward`` is called directly (an instance-bound ``forward``, as
    sentence-transformers does). Once per model; both look the layers up from the module they run on and the bound
    method is rebound by ``copy.deepcopy``, so they survive copies."""
    if not getattr(model, "_moelab_mask_hooks", False):
        model.register_forward_pre_hook(_capture_attention_mask, with_kwargs=True)
        model.register_forward_hook(_release_attention_mask, with_kwargs=True, always_call=True)
        model.forward = types.MethodType(_forward_with_mask, model)
        model._moelab_mask_hooks = True
    return model


def _jsonable(kw: dict) -> dict:
    try:
        json.dumps(kw)
    except TypeError as e:
        raise ValueError(f"layer_kwargs must be JSON-serialisable to save the model: {e}") from None
    return dict(kw)


@torch.no_grad()
def collect_ffn_inputs(model: nn.Module, batches, layers="all", max_tokens: int | None = None) -> dict:
    """Inputs of the FFNs (x [T,d], padding dropped when a batch carries ``attention_mask``) for calibration-aware
    initialisers. ``batches``: iterable of dicts of model kwargs or of ``input_ids`` tensors. Returns
    {layer index: Tensor[T,d] float32 on CPU}, at most ``max_tokens`` rows per layer."""
    sites = ffn_sites(model)
    idx = _select(sites, layers)
    store = {i: [] for i in idx}
    count = {i: 0 for i in idx}
    current_mask = [None]
    handles = []

    def make_hook(i):
        def hook(mod, args):
            x = args[0]
            flat = x.reshape(-1, x.shape[-1])
            m = current_mask[0]
            if m is not None and m.numel() == flat.shape[0]:
                flat = flat[m.reshape(-1).bool().to(flat.device)]
            if max_tokens is not None:
                flat = flat[: max(0, max_tokens - count[i])]
            if flat.shape[0]:
                store[i].append(flat.detach().float().cpu())
                count[i] += flat.shape[0]
        return hook

    for i in idx:
        handles.append(sites[i].input_module.register_forward_pre_hook(make_hook(i)))
    was_training = model.training
    model.eval()
    try:
        for b in batches:
            if isinstance(b, dict):
                current_mask[0] = b.get("attention_mask")
                model(**b)
            else:
                current_mask[0] = None
                model(b)
            if max_tokens is not None and all(c >= max_tokens for c in count.values()):
                break
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    d = None
    out = {}
    for i in idx:
        if store[i]:
            out[i] = torch.cat(store[i])
            d = out[i].shape[1]
    for i in idx:
        if i not in out:
            out[i] = torch.zeros(0, d or 0)
    return out


def save_moe(model: nn.Module, path) -> Path:
    """Save a moeified transformers model: ``model.safetensors`` (all weights, tied ones once) + ``moe_config.json``
    (model class, base config, conversion record)."""
    from safetensors.torch import save_model
    rec = getattr(model, "_moelab_moe", None)
    if rec is None:
        raise ValueError("model was not converted by moelab.core.convert.moeify (no _moelab_moe record)")
    if not hasattr(model, "config"):
        raise ValueError(f"save_moe needs a transformers model with .config, got {type(model).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path / "model.safetensors"))
    meta = {"model_class": type(model).__name__, "config": model.config.to_dict(), "moe": rec}
    (path / "moe_config.json").write_text(json.dumps(meta, indent=1, default=str))
    return path


def load_moe(path, dtype: torch.dtype | None = None) -> nn.Module:
    """Rebuild a model saved by :func:`save_moe` (same outputs)."""
    import transformers
    from safetensors.torch import load_model
    path = Path(path)
    cfg_file = path / "moe_config.json"
    if not cfg_file.exists():
        raise ValueError(f"{cfg_file} not found (not a save_moe directory)")
    meta = json.loads(cfg_file.read_text())
    cfg_dict = dict(meta["config"])
    model_type = cfg_dict.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg_dict)
    cls = getattr(transformers, meta["model_class"], None)
    if cls is None:
        raise ValueError(f"unknown model class {meta['model_class']!r}")
    model = cls(config)
    for conv in meta["moe"]["conversions"]:
        moeify(model, conv["layers"], conv["num_experts"], conv["top_k"], init=None, **conv["layer_kwargs"])
    load_model(model, str(path / "model.safetensors"))
    if dtype is not None:
        model.to(dtype)
    model.eval()
    return model
