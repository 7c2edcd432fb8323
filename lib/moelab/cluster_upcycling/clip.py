"""The paper profile of notebook ``03_cluster_upcycling`` (poster 002, Chu et al.): the poster's experiment on the
user's CLIP and image-text pairs, through the same upcycling, training and analysis code as the text runs.

Poster, "Implementation Details": dense backbone CLIP ViT-B/32 or B/16, every other FFN replaced by an MoE layer,
8 experts, top-2, continued training for 1.3B samples, evaluated by zero-shot MSCOCO Recall@1 image->text and
text->image. Here:

* **Model** (``CLIP_PATH``): an open_clip checkpoint (:func:`load_clip`): a folder in the layout of open_clip's Hub
  repositories (``open_clip_pytorch_model.bin`` or ``open_clip_model.safetensors``, ``open_clip_config.json``, the
  CLIP BPE tokenizer files ``vocab.json`` + ``merges.txt`` or ``tokenizer.json``), or a checkpoint file written by
  open_clip's training script (``epoch_N.pt``: ``{"state_dict": {"module.visual...": ...}}``) with the config and
  tokenizer files beside it. Its weights are mapped onto ``transformers.CLIPModel`` (:func:`openclip_to_hf`: the same
  network; ``tests/cluster_upcycling/test_paper_dry_run.py`` checks it against a plain-PyTorch transcription of
  open_clip's forward), so the upcycling code of the other profiles (:func:`moelab.core.moeify` on the image tower's
  ``mlp.fc1``/``fc2``) runs on it unchanged. open_clip itself is not needed (nor installed here).
* **Data** (``PAIRS_PATH``): a folder with ``train.{tsv,csv,jsonl}`` (continued training; LAION in the poster) and
  ``test.{tsv,csv,jsonl}`` (zero-shot retrieval; the 5,000 MSCOCO test images of the Karpathy split, five captions
  each, in the poster). ``.tsv`` / ``.csv``: open_clip's CSV dataset (columns ``filepath`` and ``title``; tab- or
  comma-separated); ``.jsonl``: one ``{"image": ..., "caption": ...}`` object per line (``filepath``/``file_name`` and
  ``title``/``text`` are accepted too). Image paths are relative to ``PAIRS_PATH`` or absolute; an image may appear in
  several rows (one per caption). :func:`load_image_text_pairs` checks all of it before any work.
* **Preprocessing**: open_clip's evaluation transform (:func:`clip_pixels`: RGB, bicubic resize of the shorter side,
  centre crop, the checkpoint's mean/std), also for training (no augmentation: the poster names none).
* **Training** (:func:`run_clip_condition`): every parameter of CLIP (the poster continues training the model), with
  open_clip's symmetric contrastive loss and learnable temperature clamped at 100 (:func:`clip_loss`), AdamW
  (betas 0.9/0.98, eps 1e-6, weight decay 0.2 on matrices: open_clip's defaults), plus the balancing loss and, for the
  EESD methods, EESD, through :func:`moelab.train.train` (CUDA and bf16 autocast when present). The schedule is the
  text runs' (10% warmup, linear decay), so the claims read both profiles the same way.
* **Evaluation** (:func:`clip_retrieval_r1`): R@1 image->text (an image is right when its top caption is one of its
  own) and text->image (a caption is right when its top image is its own), the MSCOCO protocol.
* **Analyses**: the poster's four panels on a fixed held-out set of image tokens (the first ``n_probe`` test images),
  at initialisation and at the end, by :mod:`moelab.cluster_upcycling.analysis`.
* **Cached and resumable**: the calibration activations and every (method, seed) run are cached by the identity of
  CLIP_PATH and PAIRS_PATH (:func:`moelab.cache.path_identity`); a run that stops mid-training resumes from its last
  checkpoint (every ``ckpt_every`` steps, under the cache root's ``checkpoints/``).

Not implemented (said by the notebook and the claims): the image tower's CLS token is the special token of the
clustering (as in the vision stand-in), the text tower stays dense (the poster says "every other FFN" of the
backbone; its analyses and fine-tuning results are the image tower's); QuickGELU checkpoints (OpenAI's weights) are
refused, since the core's experts have no QuickGELU; zero-shot ImageNet/VTAB classification and ImageNet few-shot
and fine-tuning are not run.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

from moelab import cache, progress
from moelab.core import collect_ffn_inputs
from moelab.device import inference_placement
from moelab.inputs import InputFormatError, read_records, require_path
from moelab.seed import seed_everything
from moelab.train import TrainConfig, train

from .analysis import HeldoutEntropy, moe_analyses
from .data import vit_special_mask
from .experiment import METHODS, _moe_terms, trajectory_steps, upcycle
from .method import EESD, SPECIAL_TOKENS
from .report import special_token_ranks_table, special_token_summary

__all__ = [
    "OPENAI_MEAN", "OPENAI_STD", "ClipBundle", "ImageTextPairs", "read_openclip_state", "openclip_to_hf",
    "load_clip", "read_pair_rows", "load_image_text_pairs", "clip_pixels", "ImageTextDataset", "clip_loss",
    "make_clip_loss_fn", "encode_images", "encode_texts", "clip_retrieval_r1", "retrieval_hits", "clip_calibration",
    "run_clip_condition", "clip_runs", "clip_special_token_study",
]

NB = "03"
CLIP_WHAT = ("an open_clip checkpoint of CLIP ViT-B/32 or B/16 (a folder with open_clip_pytorch_model.bin and "
             "open_clip_config.json and the tokenizer's vocab.json + merges.txt, as on the Hub, or open_clip's "
             "epoch_N.pt with those files beside it)")
PAIRS_WHAT = ("a folder of image-text pairs: train.tsv / train.csv (open_clip's CSV: columns filepath, title) or "
              "train.jsonl ({\"image\", \"caption\"} per line), and test.{tsv,csv,jsonl} (MSCOCO's 5k test images, "
              "one row per caption); image paths relative to the folder")
# open_clip's default normalisation (OPENAI_DATASET_MEAN / _STD), used when open_clip_config.json names none
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
WEIGHT_FILES = ("open_clip_pytorch_model.bin", "open_clip_model.safetensors")
LOGIT_SCALE_MAX = math.log(100.0)  # open_clip clamps the learnable temperature: logit_scale in [0, ln 100]


# ---------------------------------------------------------------------------------------------------------------
# The model: an open_clip checkpoint on transformers' CLIPModel
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class ClipBundle:
    """The dense CLIP of the paper profile: ``model`` (``transformers.CLIPModel``, fp32 on the CPU), its
    ``tokenizer`` (CLIP BPE), the image preprocessing (``image_size``, ``mean``, ``std``), the text ``context_length``,
    the checkpoint's file and the identity of CLIP_PATH (:func:`moelab.cache.path_identity`, for cache keys)."""
    model: CLIPModel
    tokenizer: CLIPTokenizer
    image_size: int
    patch_size: int
    mean: tuple
    std: tuple
    context_length: int
    checkpoint: str
    identity: dict

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1  # patches + CLS

    def describe(self) -> str:
        v, t = self.model.config.vision_config, self.model.config.text_config
        return (f"CLIP from {self.checkpoint}: image tower {v.num_hidden_layers} layers x {v.hidden_size} "
                f"({self.image_size}px, patch {self.patch_size}, {v.hidden_act}), text tower {t.num_hidden_layers} "
                f"layers x {t.hidden_size} (context {self.context_length}, vocabulary {t.vocab_size}), embedding "
                f"{self.model.config.projection_dim}; {sum(p.numel() for p in self.model.parameters()) / 1e6:.1f}M "
                f"parameters")


def _weights_file(p: Path) -> Path:
    if p.is_file():
        return p
    found = [p / f for f in WEIGHT_FILES if (p / f).is_file()] or sorted(p.glob("*.pt"))
    if not found:
        raise InputFormatError(NB, "CLIP_PATH", p, f"holds none of {list(WEIGHT_FILES)} and no *.pt checkpoint",
                               f"pass {CLIP_WHAT}")
    return found[0]


def read_openclip_state(path) -> tuple[dict, dict, Path]:
    """The state dict (``module.`` prefixes of DDP checkpoints removed, ``{"state_dict": ...}`` unwrapped), the parsed
    ``open_clip_config.json`` (``{}`` when absent) and the weights file of CLIP_PATH (a folder or a file; the config
    is read from the same folder). MissingAsset for a missing path, InputFormatError for an unreadable file."""
    p = require_path(NB, "CLIP_PATH", path, CLIP_WHAT)
    wfile = _weights_file(p)
    try:
        if wfile.suffix == ".safetensors":
            sd = load_file(str(wfile))
        else:
            sd = torch.load(wfile, map_location="cpu", weights_only=True)
    except Exception as e:  # torch and safetensors raise several types for a file that is not a checkpoint
        raise InputFormatError(NB, "CLIP_PATH", wfile, f"is not a readable torch/safetensors checkpoint "
                               f"({type(e).__name__}: {str(e)[:200]})", f"pass {CLIP_WHAT}") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise InputFormatError(NB, "CLIP_PATH", wfile, "holds no state dict of tensors", f"pass {CLIP_WHAT}")
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    cfg_file = wfile.parent / "open_clip_config.json"
    oc = {}
    if cfg_file.is_file():
        try:
            oc = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise InputFormatError(NB, "CLIP_PATH", cfg_file, f"is not JSON ({e})",
                                   "restore open_clip_config.json from the model's release") from None
    return sd, oc, wfile


# the keys of one open_clip ResidualAttentionBlock and their transformers names (in_proj is split into q, k, v)
_BLOCK = {"ln_1.weight": "layer_norm1.weight", "ln_1.bias": "layer_norm1.bias",
          "ln_2.weight": "layer_norm2.weight", "ln_2.bias": "layer_norm2.bias",
          "attn.out_proj.weight": "self_attn.out_proj.weight", "attn.out_proj.bias": "self_attn.out_proj.bias",
          "mlp.c_fc.weight": "mlp.fc1.weight", "mlp.c_fc.bias": "mlp.fc1.bias",
          "mlp.c_proj.weight": "mlp.fc2.weight", "mlp.c_proj.bias": "mlp.fc2.bias"}
_IN_PROJ = ("attn.in_proj_weight", "attn.in_proj_bias")
_TOP = {"visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
        "visual.class_embedding": "vision_model.embeddings.class_embedding",
        "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
        "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
        "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
        "visual.ln_post.weight": "vision_model.post_layernorm.weight",
        "visual.ln_post.bias": "vision_model.post_layernorm.bias",
        "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
        "positional_embedding": "text_model.embeddings.position_embedding.weight",
        "ln_final.weight": "text_model.final_layer_norm.weight", "ln_final.bias": "text_model.final_layer_norm.bias",
        "logit_scale": "logit_scale"}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}
_IGNORED = ("attn_mask",)  # open_clip's causal-mask buffer (transformers builds its own)


def _tower_blocks(sd: dict, prefix: str) -> int:
    idx = {int(k[len(prefix):].split(".")[0]) for k in sd if k.startswith(prefix)}
    if not idx or idx != set(range(len(idx))):
        return 0 if not idx else -1
    return len(idx)


def openclip_to_hf(sd: dict, oc: dict, tokenizer=None, where="CLIP_PATH") -> tuple[CLIPConfig, dict]:
    """open_clip's ViT CLIP state dict -> ``(transformers.CLIPConfig, CLIPModel state dict)``: the same network.

    open_clip's ``VisionTransformer`` / text ``Transformer`` (``ln_pre``, pre-norm residual blocks with
    ``nn.MultiheadAttention`` and ``mlp.c_fc -> act -> c_proj``, CLS pooling then ``ln_post`` and ``proj``; text:
    causal blocks, ``ln_final`` at the end-of-text token, ``text_projection``) is transformers' ``CLIPModel``: the
    fused ``in_proj_weight`` [3d, d] splits into q, k, v; ``proj`` [d, e] and ``text_projection`` [w, e] are the
    transposed projection weights. Shapes are read from the tensors; the head counts and activation from
    ``open_clip_config.json``'s ``model_cfg`` (``oc``; open_clip's defaults: vision ``head_width`` 64, text ``heads``
    8, GELU). Every key must be known (a layout this mapping does not cover is refused, never half-loaded):
    InputFormatError naming the key; NotImplementedError for the open_clip options this path does not run."""
    mc = oc.get("model_cfg", oc) if isinstance(oc, dict) else {}
    vc, tc = mc.get("vision_cfg", {}) or {}, mc.get("text_cfg", {}) or {}
    unsupported = {k: v for k, v in {
        "quick_gelu": mc.get("quick_gelu", False), "vision_cfg.timm_model_name": vc.get("timm_model_name"),
        "text_cfg.hf_model_name": tc.get("hf_model_name"), "vision_cfg.ls_init_value": vc.get("ls_init_value"),
        "text_cfg.ls_init_value": tc.get("ls_init_value"), "vision_cfg.attentional_pool": vc.get("attentional_pool"),
        "vision_cfg.global_average_pool": vc.get("global_average_pool"),
        "text_cfg.no_causal_mask": tc.get("no_causal_mask"),
        "text_cfg.pool_type": None if tc.get("pool_type", "argmax") in ("argmax", "eos") else tc.get("pool_type"),
        "vision_cfg.pool_type": None if vc.get("pool_type", "tok") == "tok" else vc.get("pool_type")}.items() if v}
    if unsupported:
        raise NotImplementedError(
            f"{where}: open_clip_config.json sets {unsupported}; the paper profile runs open_clip's standard ViT CLIP "
            "(ViT-B-32, ViT-B-16: GELU, CLS pooling, causal text tower with end-of-text pooling). QuickGELU (OpenAI's "
            "weights) is not implemented because the core's upcycled experts have no QuickGELU activation: use a "
            "LAION-trained open_clip ViT-B checkpoint (e.g. laion2b_s34b_b79k) or add QuickGELU to "
            "moelab.core.experts.ACTIVATIONS. The default and full profiles run the same experiment on "
            "all-MiniLM-L6-v2 and a small ViT instead.")
    nv, nt = _tower_blocks(sd, "visual.transformer.resblocks."), _tower_blocks(sd, "transformer.resblocks.")
    if nv <= 0 or nt <= 0:
        raise InputFormatError(NB, "CLIP_PATH", where, "has no (or non-consecutive) 'visual.transformer.resblocks.<i>' "
                               "and 'transformer.resblocks.<i>' keys: not an open_clip ViT CLIP checkpoint "
                               f"(first keys: {sorted(sd)[:5]})", f"pass {CLIP_WHAT}")
    out, known = {}, set(_IGNORED)
    for ocp, hfp, n in (("visual.transformer.resblocks.", "vision_model.encoder.layers.", nv),
                        ("transformer.resblocks.", "text_model.encoder.layers.", nt)):
        for i in range(n):
            for a, b in _BLOCK.items():
                out[f"{hfp}{i}.{b}"] = sd.get(f"{ocp}{i}.{a}")
                known.add(f"{ocp}{i}.{a}")
            for leaf, kind in zip(_IN_PROJ, ("weight", "bias")):
                t = sd.get(f"{ocp}{i}.{leaf}")
                known.add(f"{ocp}{i}.{leaf}")
                for name, part in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3, 0) if t is not None else (None,) * 3):
                    out[f"{hfp}{i}.self_attn.{name}.{kind}"] = part
    for a, b in _TOP.items():
        out[b] = sd.get(a)
        known.add(a)
    for a, b in _TRANSPOSED.items():
        out[b] = None if sd.get(a) is None else sd[a].t()
        known.add(a)
    missing = sorted(b for b, v in out.items() if v is None)
    unknown = sorted(set(sd) - known)
    if unknown or missing:
        problem = (f"has keys this mapping does not know: {unknown[:6]}" if unknown else
                   f"lacks {missing[:6]} (transformers names)")
        raise InputFormatError(NB, "CLIP_PATH", where, problem + " (open_clip's standard ViT CLIP layout is read: "
                               "visual.conv1/class_embedding/positional_embedding/ln_pre/transformer/ln_post/proj, "
                               "token_embedding, positional_embedding, transformer, ln_final, text_projection, "
                               "logit_scale)", f"pass {CLIP_WHAT}")
    out["logit_scale"] = out["logit_scale"].reshape(())
    vw, patch = sd["visual.conv1.weight"].shape[0], sd["visual.conv1.weight"].shape[-1]
    grid = int(round(math.sqrt(sd["visual.positional_embedding"].shape[0] - 1)))
    tw = sd["ln_final.weight"].shape[0]
    head_width = vc.get("head_width", 64)
    vheads = vw // head_width
    theads = tc.get("heads", 8)
    if vheads < 1 or vw % head_width or tw % theads:
        raise InputFormatError(NB, "CLIP_PATH", where, f"image width {vw} / head_width {head_width} or text width {tw}"
                               f" / heads {theads} is not a whole number of heads", "put the model's "
                               "open_clip_config.json (model_cfg.vision_cfg.head_width, text_cfg.heads) beside it")
    eos = getattr(tokenizer, "eos_token_id", None)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=sd["token_embedding.weight"].shape[0], hidden_size=tw,
                         intermediate_size=sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                         num_hidden_layers=nt, num_attention_heads=theads,
                         max_position_embeddings=sd["positional_embedding"].shape[0], hidden_act="gelu",
                         layer_norm_eps=1e-5, projection_dim=sd["text_projection"].shape[1],
                         **({} if eos is None else dict(eos_token_id=eos, bos_token_id=tokenizer.bos_token_id,
                                                        pad_token_id=tokenizer.pad_token_id))),
        vision_config=dict(hidden_size=vw,
                           intermediate_size=sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                           num_hidden_layers=nv, num_attention_heads=vheads, image_size=grid * patch,
                           patch_size=patch, num_channels=sd["visual.conv1.weight"].shape[1], hidden_act="gelu",
                           layer_norm_eps=1e-5, projection_dim=sd["visual.proj"].shape[1]),
        projection_dim=sd["visual.proj"].shape[1])
    return cfg, out


def _tokenizer(folder: Path) -> CLIPTokenizer:
    if not ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()) and \
            not (folder / "tokenizer.json").is_file():
        raise InputFormatError(NB, "CLIP_PATH", folder, "holds no CLIP tokenizer (vocab.json + merges.txt, or "
                               "tokenizer.json)", "copy the CLIP BPE tokenizer files beside the checkpoint (open_clip's "
                               "Hub repositories ship them; openai/clip-vit-base-patch32's are the same BPE)")
    try:
        return CLIPTokenizer.from_pretrained(str(folder))
    except Exception as e:  # tokenizers raises several types for malformed files
        raise InputFormatError(NB, "CLIP_PATH", folder, f"its tokenizer files do not load ({type(e).__name__}: "
                               f"{str(e)[:200]})", "restore vocab.json / merges.txt from the model's release") from None


def load_clip(path) -> ClipBundle:
    """CLIP_PATH -> :class:`ClipBundle` (checked in seconds: path, weights, config, tokenizer, every key and shape;
    see :func:`openclip_to_hf`). The image preprocessing follows ``open_clip_config.json``'s ``preprocess_cfg``
    (open_clip's defaults otherwise: OpenAI's mean/std)."""
    sd, oc, wfile = read_openclip_state(path)
    tok = _tokenizer(wfile.parent)
    cfg, hf = openclip_to_hf(sd, oc, tok, where=str(wfile))
    if len(tok) > cfg.text_config.vocab_size:
        raise InputFormatError(NB, "CLIP_PATH", wfile.parent, f"the tokenizer has {len(tok)} tokens but "
                               f"token_embedding has {cfg.text_config.vocab_size} rows",
                               "use the tokenizer the checkpoint was trained with")
    model = CLIPModel(cfg)
    try:
        model.load_state_dict(hf, strict=True)
    except RuntimeError as e:
        raise InputFormatError(NB, "CLIP_PATH", wfile, f"a tensor has the wrong shape ({str(e)[:300]})",
                               f"pass {CLIP_WHAT}") from None
    pre = oc.get("preprocess_cfg", {}) if isinstance(oc, dict) else {}
    v = cfg.vision_config
    read = [wfile] + [wfile.parent / f for f in ("open_clip_config.json", "vocab.json", "merges.txt",
                                                 "tokenizer.json", "tokenizer_config.json")
                      if (wfile.parent / f).is_file()]
    return ClipBundle(model=model.eval(), tokenizer=tok, image_size=v.image_size, patch_size=v.patch_size,
                      mean=tuple(pre.get("mean", OPENAI_MEAN)), std=tuple(pre.get("std", OPENAI_STD)),
                      context_length=cfg.text_config.max_position_embeddings, checkpoint=str(wfile),
                      identity={f.name: cache.path_identity(f) for f in read})  # the files read, by content


# ---------------------------------------------------------------------------------------------------------------
# The data: image-text pairs in open_clip's CSV format or JSONL
# ---------------------------------------------------------------------------------------------------------------
IMAGE_FIELDS = ("filepath", "image", "file_name", "image_path")
CAPTION_FIELDS = ("title", "caption", "text")


@dataclass
class ImageTextPairs:
    """The paper profile's pairs: ``train`` and ``test`` lists of ``(image path, caption)``, the files they came
    from, and ``identity`` (for cache keys: the caption files by content, and the images the runs read outside
    training, i.e. the test and calibration images, by size and modification time; :func:`load_image_text_pairs`)."""
    train: list
    test: list
    files: dict
    identity: dict = field(default_factory=dict)

    @property
    def test_images(self) -> list:
        return list(dict.fromkeys(p for p, _ in self.test))

    def describe(self) -> str:
        return (f"{len(self.train):,} training pairs ({self.files['train']}), {len(self.test):,} test captions of "
                f"{len(self.test_images):,} images ({self.files['test']})")


def _split_file(root: Path, split: str) -> Path:
    found = [root / f"{split}.{ext}" for ext in ("tsv", "csv", "jsonl", "json") if (root / f"{split}.{ext}").is_file()]
    if not found:
        raise InputFormatError(NB, "PAIRS_PATH", root, f"has no {split}.tsv, {split}.csv or {split}.jsonl",
                               f"pass {PAIRS_WHAT}")
    return found[0]


def read_pair_rows(path, root=None, n: int | None = None) -> list[tuple[str, str]]:
    """``(image path, caption)`` rows of one captions file (the first ``n``; all with ``None``): open_clip's CSV
    (``.tsv`` tab-, ``.csv`` comma-separated, columns ``filepath`` and ``title``, or ``image``/``caption``) or JSONL /
    JSON records (:func:`moelab.inputs.read_records`, fields as above). Relative image paths are resolved against
    ``root`` (default: the file's folder). InputFormatError naming the file, the column or record and the fix."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    if path.suffix in (".tsv", ".csv"):
        try:
            df = pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",", nrows=n, dtype=str,
                             keep_default_na=False)
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
            raise InputFormatError(NB, "PAIRS_PATH", path, f"is not a readable {path.suffix[1:].upper()} file ({e})",
                                   f"pass {PAIRS_WHAT}") from None
        img = next((c for c in IMAGE_FIELDS if c in df.columns), None)
        cap = next((c for c in CAPTION_FIELDS if c in df.columns), None)
        if img is None or cap is None:
            col = "/".join(IMAGE_FIELDS if img is None else CAPTION_FIELDS)
            raise InputFormatError(NB, "PAIRS_PATH", path, f"has no column {col} (columns: {list(df.columns)[:8]})",
                                   "name the columns filepath and title "
                                   "(open_clip's --csv-img-key / --csv-caption-key defaults); a .tsv is tab-separated")
        rows = list(zip(df[img], df[cap]))
    else:
        recs = read_records(NB, "PAIRS_PATH", path, [IMAGE_FIELDS, CAPTION_FIELDS], PAIRS_WHAT, n=n)
        rows = [(next(r[f] for f in IMAGE_FIELDS if f in r), next(r[f] for f in CAPTION_FIELDS if f in r))
                for r in recs]
    if not rows:
        raise InputFormatError(NB, "PAIRS_PATH", path, "holds no pairs", f"pass {PAIRS_WHAT}")
    out = []
    for i, (im, cap) in enumerate(rows, 1):
        if not str(im).strip() or not isinstance(cap, str) or not cap.strip():
            raise InputFormatError(NB, "PAIRS_PATH", path, f"row {i} has an empty image path or caption",
                                   "every row needs an image path and a caption")
        p = Path(im)
        out.append((str(p if p.is_absolute() else root / p), cap))
    return out


def _check_images(paths, file: Path, decode: int = 2) -> None:
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise InputFormatError(NB, "PAIRS_PATH", file, f"{len(missing)} image(s) listed are not files, the first "
                               f"{missing[0]!r}", "image paths are relative to PAIRS_PATH or absolute")
    for p in list(paths)[:decode]:
        try:
            with Image.open(p) as im:
                im.convert("RGB").load()
        except Exception as e:  # PIL raises several types for undecodable files
            raise InputFormatError(NB, "PAIRS_PATH", p, f"is not a decodable image ({type(e).__name__}: {e})",
                                   "list image files (JPEG/PNG/...) in the captions file") from None


def _stat_digest(paths) -> str:
    return cache.key([(p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in paths])


def load_image_text_pairs(path, cfg: dict) -> ImageTextPairs:
    """PAIRS_PATH -> :class:`ImageTextPairs`, checked before any work (seconds): both split files exist and parse,
    every row has an image and a caption, the test images (the first ``cfg["n_test"]`` distinct ones, all their
    captions), the calibration images (``cfg["calib_texts"]``) and the first ``cfg["batch_size"]`` training images
    exist and the first decode; there are enough of each. Training images past those are read during training (a
    missing one fails there, naming its row)."""
    root = require_path(NB, "PAIRS_PATH", path, PAIRS_WHAT)
    if not root.is_dir():
        raise InputFormatError(NB, "PAIRS_PATH", root, "is a file, expected a folder with train and test files",
                               f"pass {PAIRS_WHAT}")
    files = {s: _split_file(root, s) for s in ("train", "test")}
    train, test_all = read_pair_rows(files["train"], root), read_pair_rows(files["test"], root)
    images = list(dict.fromkeys(p for p, _ in test_all))
    if len(images) < cfg["n_test"]:
        raise InputFormatError(NB, "PAIRS_PATH", files["test"], f"lists {len(images)} distinct images, the profile "
                               f"evaluates n_test={cfg['n_test']}", "list MSCOCO's 5,000 Karpathy-test images (one "
                               "row per caption)")
    keep = set(images[:cfg["n_test"]])
    test = [(p, c) for p, c in test_all if p in keep]
    need = max(cfg["calib_texts"], cfg["batch_size"])
    if len(train) < need:
        raise InputFormatError(NB, "PAIRS_PATH", files["train"], f"has {len(train)} pairs, fewer than the "
                               f"{need} the calibration and one training batch need", "add training pairs")
    calib_images = [p for p, _ in train[:cfg["calib_texts"]]]
    _check_images(images[:cfg["n_test"]], files["test"])
    _check_images(list(dict.fromkeys(calib_images + [p for p, _ in train[:cfg["batch_size"]]])), files["train"])
    identity = {"captions": {s: cache.path_identity(f) for s, f in files.items()},
                "images": _stat_digest(list(keep) + calib_images), "root": str(root.resolve())}
    return ImageTextPairs(train=train, test=test, files={s: str(f) for s, f in files.items()}, identity=identity)


def clip_pixels(path, size: int, mean, std) -> torch.Tensor:
    """One image -> ``[3, size, size]``: open_clip's evaluation transform (``Resize(size, BICUBIC)`` of the shorter
    side, ``CenterCrop(size)``, RGB, ``ToTensor``, ``Normalize(mean, std)``), written with Pillow as torchvision does
    it (longer side ``int(size * long / short)``, crop offset ``round((h - size) / 2)``)."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        if w <= h:
            nw, nh = size, int(size * h / w)
        else:
            nw, nh = int(size * w / h), size
        if (nw, nh) != (w, h):
            im = im.resize((nw, nh), Image.BICUBIC)
        top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
        im = im.crop((left, top, left + size, top + size))
        x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


class ImageTextDataset(torch.utils.data.Dataset):
    """``(pixels [3, S, S], caption)`` per pair; :meth:`collate` stacks the images and tokenises the captions to the
    context length (open_clip pads every caption to it; the end-of-text token is the pooled one). A missing or
    undecodable image raises InputFormatError naming its row."""

    def __init__(self, rows, bundle: ClipBundle):
        if not rows:
            raise ValueError("no image-text pairs")
        self.rows, self.size, self.mean, self.std = list(rows), bundle.image_size, bundle.mean, bundle.std
        self.tok, self.ctx = bundle.tokenizer, bundle.context_length

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        p, cap = self.rows[i]
        try:
            return clip_pixels(p, self.size, self.mean, self.std), cap
        except (OSError, ValueError) as e:
            raise InputFormatError(NB, "PAIRS_PATH", p, f"training row {i + 1}: the image does not load "
                                   f"({type(e).__name__}: {e})", "fix or drop that row of the training file") from None

    def collate(self, items):
        px, caps = zip(*items)
        t = self.tok(list(caps), padding="max_length", truncation=True, max_length=self.ctx, return_tensors="pt")
        return {"pixel_values": torch.stack(px), "input_ids": t["input_ids"], "attention_mask": t["attention_mask"]}


# ---------------------------------------------------------------------------------------------------------------
# Loss, encoding, retrieval
# ---------------------------------------------------------------------------------------------------------------
def clip_loss(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """open_clip's ``ClipLoss``: with unit embeddings ``u_i`` (images), ``v_j`` (captions), ``s = exp(logit_scale)``,
    ``L = 1/2 [CE(s U V^T, i) + CE(s V U^T, i)]`` (the i-th caption is the i-th image's)."""
    u, v = F.normalize(img.float(), dim=-1), F.normalize(txt.float(), dim=-1)
    logits = logit_scale.float().exp() * u @ v.T  # [B, B]
    labels = torch.arange(len(u), device=u.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def _image_embeds(model, pixel_values):
    return model.visual_projection(model.vision_model(pixel_values=pixel_values).pooler_output)


def _text_embeds(model, input_ids, attention_mask):
    out = model.text_model(input_ids=input_ids, attention_mask=attention_mask)
    return model.text_projection(out.pooler_output)


def make_clip_loss_fn(aux_coef: float = 0.01, eesd: EESD | None = None):
    """``loss_fn(model, batch)`` for :func:`moelab.train.train`: :func:`clip_loss` + ``aux_coef`` x the balancing loss
    (+ EESD), the same extra terms as the text runs."""

    def loss_fn(model, batch):
        out = model(**batch)  # CLIPModel's own forward: both towers' projected embeddings
        m = model.module if hasattr(model, "module") else model  # DDP
        loss = clip_loss(out.image_embeds, out.text_embeds, m.logit_scale)
        return _moe_terms(m, loss, {"clip_loss": loss.detach(), "logit_scale": m.logit_scale.detach().exp()},
                          aux_coef, eesd)

    return loss_fn


def _autocast(device: str, dtype: torch.dtype):
    return torch.autocast("cuda", dtype=dtype) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)


@torch.no_grad()
def encode_images(model, bundle: ClipBundle, paths, batch_size: int = 128) -> torch.Tensor:
    """Unit image embeddings [N, e] on the CPU, computed where :func:`moelab.device.inference_placement` puts work
    (the model's device; bf16 autocast on CUDA)."""
    where = inference_placement()
    dev = next(model.parameters()).device
    model.eval()
    out = []
    for i in range(0, len(paths), batch_size):
        x = torch.stack([clip_pixels(p, bundle.image_size, bundle.mean, bundle.std) for p in paths[i:i + batch_size]])
        with _autocast(str(dev), where.dtype):
            out.append(F.normalize(_image_embeds(model, x.to(dev)).float(), dim=-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def encode_texts(model, bundle: ClipBundle, texts, batch_size: int = 128) -> torch.Tensor:
    """Unit caption embeddings [N, e] on the CPU (tokenised to the context length, as in training)."""
    where = inference_placement()
    dev = next(model.parameters()).device
    model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        t = bundle.tokenizer(list(texts[i:i + batch_size]), padding="max_length", truncation=True,
                             max_length=bundle.context_length, return_tensors="pt")
        with _autocast(str(dev), where.dtype):
            out.append(F.normalize(_text_embeds(model, t["input_ids"].to(dev), t["attention_mask"].to(dev)).float(),
                                   dim=-1).cpu())
    return torch.cat(out)


def clip_retrieval_r1(model, bundle: ClipBundle, test, batch_size: int = 128) -> dict:
    """Zero-shot Recall@1 both ways on the test pairs (MSCOCO's protocol, several captions per image): ``a2p``
    (image->text) per image, 1 when the caption most similar to it is one of its own; ``p2a`` (text->image) per
    caption, 1 when the most similar image is its own. Per-item 0/1 arrays (image order of first appearance)."""
    images = list(dict.fromkeys(p for p, _ in test))
    owner = torch.as_tensor(pd.Index(images).get_indexer([p for p, _ in test]))  # each caption's image
    u = encode_images(model, bundle, images, batch_size)
    v = encode_texts(model, bundle, [c for _, c in test], batch_size)
    return retrieval_hits(u @ v.T, owner)


def retrieval_hits(sim: torch.Tensor, owner: torch.Tensor) -> dict:
    """Per-item R@1 hits from the similarities ``sim`` [images, captions] and ``owner`` [captions] (each caption's
    image index): ``a2p`` [images] = 1 where ``owner[argmax_j sim[i, j]] = i``, ``p2a`` [captions] = 1 where
    ``argmax_i sim[i, j] = owner[j]``."""
    i2t = (owner[sim.argmax(1)] == torch.arange(sim.shape[0])).float().numpy()
    t2i = (sim.argmax(0) == owner).float().numpy()
    return {"a2p": i2t, "p2a": t2i}


# ---------------------------------------------------------------------------------------------------------------
# Calibration, one (method, seed) run, all runs
# ---------------------------------------------------------------------------------------------------------------
def _pixel_batches(bundle: ClipBundle, paths, batch_size: int, device) -> list[dict]:
    return [{"pixel_values": torch.stack([clip_pixels(p, bundle.image_size, bundle.mean, bundle.std)
                                          for p in paths[i:i + batch_size]]).to(device)}
            for i in range(0, len(paths), batch_size)]


def _device() -> str:
    """Where the paper path computes: :func:`moelab.device.inference_placement`'s device (CUDA when present)."""
    return inference_placement().device


def clip_calibration(bundle: ClipBundle, pairs: ImageTextPairs, cfg: dict) -> tuple[dict, torch.Tensor]:
    """Poster Step 1's "collect FFN input activations X" on CLIP's image tower: the inputs of every other MLP over
    the first ``cfg["calib_texts"]`` training images (all their tokens, at most ``cfg["calib_tokens"]`` per layer),
    cached by the identities of CLIP_PATH and PAIRS_PATH; and the [T] mask of the CLS tokens (the special token:
    :func:`moelab.cluster_upcycling.data.vit_special_mask`). On the GPU when there is one."""
    paths = [p for p, _ in pairs.train[:cfg["calib_texts"]]]
    key = {"model": bundle.identity, "pairs": pairs.identity, "images": cache.key(paths), "n": len(paths),
           "max_tokens": cfg["calib_tokens"], "layers": "every_other"}

    def compute():
        dev = _device()
        m = copy.deepcopy(bundle.model.vision_model).to(dev)
        return collect_ffn_inputs(m, _pixel_batches(bundle, paths, cfg["eval_batch"], dev), layers="every_other",
                                  max_tokens=cfg["calib_tokens"])

    calib = cache.memo("03_clip_ffn_inputs", key, compute)
    return calib, vit_special_mask(len(next(iter(calib.values()))), bundle.tokens_per_image)


class _RunState:
    """What a resumed run needs besides the model and optimiser (registered with the trainer's checkpoints): the
    EESD teachers and the held-out entropy rows measured so far."""

    def __init__(self, eesd, trajectory):
        self.eesd, self.trajectory = eesd, trajectory

    def state_dict(self) -> dict:
        return {"teachers": [t.state_dict() for t in self.eesd.teachers] if self.eesd else [],
                "entropy_rows": list(self.trajectory.rows) if self.trajectory else []}

    def load_state_dict(self, state: dict) -> None:
        if self.eesd:
            for t, s in zip(self.eesd.teachers, state["teachers"]):
                t.load_state_dict(s)
        if self.trajectory:
            self.trajectory.rows[:] = state["entropy_rows"]


def _vision_forward(model, batch):
    return model.vision_model(pixel_values=batch["pixel_values"].to(next(model.parameters()).device))


def run_clip_condition(bundle: ClipBundle, method: str, seed: int, pairs: ImageTextPairs, probe: list, calib: dict,
                       special_mask, cfg: dict, ckpt_dir=None) -> dict:
    """One (method, seed) cell of the poster's zero-shot table on the user's CLIP (notebook 03, paper profile):
    upcycle every other MLP of the image tower per ``method`` (:func:`moelab.cluster_upcycling.experiment.upcycle`,
    the CLS token handled per ``cfg["special_tokens"]``), measure R@1 and the analyses at initialisation, train all
    of CLIP for ``cfg["steps"]`` steps of ``cfg["batch_size"]`` pairs (checkpoints in ``ckpt_dir`` every
    ``cfg["ckpt_every"]`` steps, resumed when present), then measure again. Returns the same plain data as
    :func:`moelab.cluster_upcycling.experiment.run_text_condition` (``r1`` / ``r1_init`` with ``a2p`` = image->text,
    ``p2a`` = text->image), so the notebook's tables and the claims read both."""
    t0 = time.perf_counter()
    seed_everything(seed)
    dev = _device()
    model = copy.deepcopy(bundle.model)
    ci = upcycle(model.vision_model, method, calib, seed, cfg["num_experts"], cfg["top_k"], cfg["energy"],
                 special_mask=special_mask, special_tokens=cfg["special_tokens"])
    model.to(dev)  # before EESD copies the MoE layers, so the teachers sit where the students train
    heldout = _pixel_batches(bundle, probe, cfg["eval_batch"], "cpu")
    res = {"method": method, "seed": seed, "init_log": ci.log if ci else None, "special_tokens": cfg["special_tokens"]}
    res["analysis_init"] = moe_analyses(model, heldout, forward=_vision_forward)
    if method != "dense":
        res["r1_init"] = clip_retrieval_r1(model, bundle, pairs.test, cfg["eval_batch"])
    trajectory = (HeldoutEntropy(heldout, trajectory_steps(cfg["steps"]), forward=_vision_forward)
                  if METHODS[method][0] else None)
    hist = None
    if trajectory is not None:
        trajectory(0, model)  # initialisation
    if method != "dense":
        eesd = EESD(model, decay=cfg["eesd_decay"], weight=cfg["eesd_weight"]) if METHODS[method][2] else None
        ds = ImageTextDataset(pairs.train, bundle)
        loader = torch.utils.data.DataLoader(ds, batch_size=cfg["batch_size"], shuffle=True, drop_last=True,
                                             collate_fn=ds.collate, num_workers=cfg["num_workers"],
                                             generator=torch.Generator().manual_seed(seed),
                                             pin_memory=dev == "cuda")
        tcfg = TrainConfig(lr=cfg["lr"], steps=cfg["steps"], warmup_frac=0.1, decay="linear", seed=seed, log_every=5,
                           max_grad_norm=1.0, weight_decay=cfg["weight_decay"], betas=(0.9, 0.98), eps=1e-6,
                           ckpt_dir=ckpt_dir, ckpt_every=cfg["ckpt_every"] if ckpt_dir else 0,
                           desc=f"CLIP {method} s{seed}")

        def after_step(step, m):
            with torch.no_grad():
                m.logit_scale.clamp_(0, LOGIT_SCALE_MAX)  # open_clip: clamp the temperature after each step
            if eesd is not None:
                eesd.update()  # theta_ema <- decay theta_ema + (1 - decay) theta
            if trajectory is not None:
                trajectory(step, m)

        out = train(model, loader, loss_fn=make_clip_loss_fn(cfg["aux_coef"], eesd), cfg=tcfg,
                    hooks={"after_step": after_step}, checkpoint_objects=[_RunState(eesd, trajectory)])
        model, hist = out.model, out.history
        res["resumed_from"] = out.resumed_from
        if eesd:
            eesd.remove()
    res["history"] = hist
    res["entropy_heldout"] = trajectory.rows if trajectory is not None else []
    res["analysis"] = moe_analyses(model, heldout, forward=_vision_forward)
    res["r1"] = clip_retrieval_r1(model, bundle, pairs.test, cfg["eval_batch"])
    if method == "dense":
        res["r1_init"] = res["r1"]  # never trained: initialisation and end are one model
    res["wall_s"] = time.perf_counter() - t0
    return res


RUN_KEYS = ("special_tokens", "steps", "batch_size", "lr", "energy", "eesd_decay", "eesd_weight", "aux_coef",
            "num_experts", "top_k", "weight_decay", "calib_texts", "calib_tokens", "n_test", "n_probe")


def clip_runs(bundle: ClipBundle, pairs: ImageTextPairs, cfg: dict, use_cache: bool = True) -> list[dict]:
    """Every (method, seed) cell of the paper profile (notebook 03): ``cfg["methods"]`` x ``cfg["seeds"]`` (the
    untrained ``"dense"`` model once, first seed), each cached by the identities of CLIP_PATH and PAIRS_PATH and the
    settings, and resumable mid-training from its checkpoints (removed once the cell is cached)."""
    if cfg["special_tokens"] not in SPECIAL_TOKENS:
        raise ValueError(f"special_tokens must be one of {SPECIAL_TOKENS}, got {cfg['special_tokens']!r}")
    calib, special = clip_calibration(bundle, pairs, cfg)
    probe = pairs.test_images[:cfg["n_probe"]]
    seeds = cfg["seeds"]
    cells = [(m, s) for m in cfg["methods"] for s in (seeds[:1] if m == "dense" else seeds)]
    out = []
    for method, seed in progress.bar(cells, desc="03 CLIP cells", unit="cell"):
        key = {"model": bundle.identity, "pairs": pairs.identity, "method": method, "seed": seed,
               **{k: cfg[k] for k in RUN_KEYS}}

        ckpt = (cache.cache_root() / "checkpoints" / "03_clip_condition" /
                cache.key({"cell": key, "code": cache.code_closure(run_clip_condition)})) if use_cache else None

        def compute(method=method, seed=seed, ckpt=ckpt):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # small clusters get SVD-LLM jitter, by design
                return run_clip_condition(bundle, method, seed, pairs, probe, calib, special, cfg, ckpt)

        out.append(cache.memo("03_clip_condition", key, compute) if use_cache else compute())
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)  # the finished cell is cached; its checkpoints are not needed
    return out


def clip_special_token_study(bundle: ClipBundle, pairs: ImageTextPairs, cfg: dict, seed: int = 0) -> dict:
    """Steps 1-3 on CLIP's image tower under each special-token handling of its CLS token (no training; the paper
    profile's counterpart of :func:`moelab.cluster_upcycling.experiment.special_token_study`, same return value)."""
    calib, special = clip_calibration(bundle, pairs, cfg)
    logs = {}
    for mode in SPECIAL_TOKENS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.manual_seed(seed)
            ci = upcycle(copy.deepcopy(bundle.model.vision_model), "cluster", calib, seed, cfg["num_experts"],
                         cfg["top_k"], cfg["energy"], special_mask=special, special_tokens=mode)
        logs[mode] = ci.log
    ranks = special_token_ranks_table(logs)
    return {"ranks": ranks, "summary": special_token_summary(ranks), "n_special": int(special.sum()),
            "n_tokens": len(special)}
