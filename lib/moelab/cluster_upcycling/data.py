"""Data of notebook ``03_cluster_upcycling`` (poster 002, Chu et al.): the text stand-in's sentence pairs and
tokenised batches, the calibration token set (FFN inputs of the dense model and which of its tokens are special),
and the vision stand-in's images (Fashion-MNIST, CIFAR-10 in grey 28x28). The paper profile's CLIP checkpoint and
image-text pairs are read by :mod:`moelab.cluster_upcycling.clip`.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from PIL import Image

from moelab import cache
from moelab.core import collect_ffn_inputs
from moelab.suite import images

__all__ = [
    "PairBatches", "calibration_inputs", "cached_calibration", "special_token_ids", "special_token_mask",
    "calibration_special_mask", "heldout_batches", "to_pixels", "cifar_to_grey28",
    "image_loader", "vision_data", "vit_special_mask",
]


# ---------------------------------------------------------------------------------------------------------------
# Text: sentence pairs, tokenised batches, the calibration token set
# ---------------------------------------------------------------------------------------------------------------
def _features(st, texts, max_len):
    st.max_seq_length = max_len
    return dict(st.tokenize(list(texts)))


class PairBatches(torch.utils.data.Dataset):
    """Index dataset over (anchor, positive) pairs; :meth:`collate` tokenises anchors and positives together
    (one forward of 2B sentences per step, so routing statistics and aux losses cover both; notebook 03)."""

    def __init__(self, st, pairs, max_len: int = 32):
        if not pairs:
            raise ValueError("no training pairs")
        self.st, self.pairs, self.max_len = st, list(pairs), max_len

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]

    def collate(self, items):
        a, p = zip(*items)
        feats = _features(self.st, list(a) + list(p), self.max_len)
        feats["n_pairs"] = len(a)
        return feats


def heldout_batches(st, texts, max_len: int = 32, batch_size: int = 64) -> list[dict]:
    """The fixed held-out token set of notebook 03's analyses: ``texts`` tokenised once into
    feature dicts of ``batch_size`` sentences, so every method and every evaluation step sees the same tokens."""
    if not texts:
        raise ValueError("heldout_batches needs at least one held-out sentence")
    return [_features(st, texts[i:i + batch_size], max_len) for i in range(0, len(texts), batch_size)]


def calibration_inputs(st, texts, layers="every_other", max_tokens: int = 8192, max_len: int = 32, batch: int = 64):
    """FFN inputs x [T, d] of the dense MiniLM at the layers to be converted (padding dropped), via the core's
    streamed :func:`moelab.core.collect_ffn_inputs` (poster 002 Step 1's "collect FFN input activations X";
    notebook 03). Every layer gets the same T tokens in the same order (:func:`calibration_special_mask` marks
    which are special)."""
    bert = st[0].auto_model
    batches = (_features(st, texts[i:i + batch], max_len) for i in range(0, len(texts), batch))
    return collect_ffn_inputs(bert, batches, layers=layers, max_tokens=max_tokens)


def cached_calibration(st, texts, max_tokens: int, max_len: int = 32) -> dict:
    """:func:`calibration_inputs` through ``moelab.cache.memo`` (keyed by the texts, token budget and length)."""
    cfg = {"model": "all-MiniLM-L6-v2", "texts": cache.key(list(texts)), "n": len(texts), "max_tokens": max_tokens,
           "max_len": max_len, "layers": "every_other"}
    return cache.memo("03_minilm_ffn_inputs", cfg, lambda: calibration_inputs(st, texts, max_tokens=max_tokens,
                                                                              max_len=max_len))


def special_token_ids(tokenizer) -> list[int]:
    """Ids of the tokens the tokenizer adds or uses structurally ([CLS], [SEP], [PAD], [MASK], BOS/EOS): its
    ``all_special_ids`` minus the unknown-word token, which stands for real text."""
    unk = getattr(tokenizer, "unk_token_id", None)
    return sorted({int(i) for i in tokenizer.all_special_ids} - ({int(unk)} if unk is not None else set()))


def special_token_mask(features: dict, special_ids) -> torch.Tensor:
    """[T] bool over the non-padding tokens of one tokenised batch, in the order
    :func:`moelab.core.collect_ffn_inputs` stores them (row-major over [B, S], padding dropped): True where
    ``input_ids`` is one of ``special_ids``."""
    ids = torch.as_tensor(features["input_ids"])
    mask = features.get("attention_mask")
    special = torch.isin(ids, torch.as_tensor(list(special_ids), dtype=ids.dtype)).reshape(-1)
    return special if mask is None else special[torch.as_tensor(mask).reshape(-1).bool()]


def calibration_special_mask(st, texts, max_tokens: int = 8192, max_len: int = 32, batch: int = 64) -> torch.Tensor:
    """Which rows of :func:`calibration_inputs` (same ``texts``, ``max_tokens``, ``max_len``, ``batch``) are special
    tokens (:func:`special_token_ids`): [T] bool, from the tokenizer alone (notebook 03)."""
    ids = special_token_ids(st.tokenizer)
    parts = [special_token_mask(_features(st, texts[i:i + batch], max_len), ids) for i in range(0, len(texts), batch)]
    return torch.cat(parts)[:max_tokens] if parts else torch.zeros(0, dtype=torch.bool)


# ---------------------------------------------------------------------------------------------------------------
# Vision stand-in: Fashion-MNIST and CIFAR-10 (grey 28x28)
# ---------------------------------------------------------------------------------------------------------------
def to_pixels(x) -> torch.Tensor:
    """uint8 grey images [N, 28, 28] -> ``pixel_values`` [N, 1, 28, 28] in [-1, 1] (``(x/255 - 0.5)/0.5``, the
    mean/std that transformers' ``ViTImageProcessor`` uses by default)."""
    x = torch.as_tensor(np.asarray(x))
    if x.ndim != 3 or x.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images [N, H, W], got {x.dtype} {tuple(x.shape)}")
    return (x.float()[:, None] / 255.0 - 0.5) / 0.5


def cifar_to_grey28(x_rgb) -> np.ndarray:
    """CIFAR-10 uint8 [N, 32, 32, 3] -> uint8 [N, 28, 28]: Pillow's ``convert("L")`` (ITU-R 601-2 luma) then a
    bilinear resize to 28x28, so the Fashion-MNIST ViT can read them (notebook 03's few-shot probes)."""
    x_rgb = np.asarray(x_rgb)
    if x_rgb.ndim != 4 or x_rgb.shape[-1] != 3 or x_rgb.dtype != np.uint8:
        raise ValueError(f"expected uint8 RGB images [N, H, W, 3], got {x_rgb.dtype} {x_rgb.shape}")
    return np.stack([np.asarray(Image.fromarray(im).convert("L").resize((28, 28), Image.BILINEAR)) for im in x_rgb])


def _collate_images(b):
    return {"pixel_values": to_pixels(torch.stack([i[0] for i in b])), "labels": torch.stack([i[1] for i in b])}


def image_loader(x, y, batch_size: int, seed: int):
    """Shuffled, seeded ``DataLoader`` of ``dict(pixel_values [B,1,28,28], labels [B])`` over uint8 images."""
    if len(x) < batch_size:
        raise ValueError(f"batch_size={batch_size} exceeds the {len(x)} training images")
    ds = torch.utils.data.TensorDataset(torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y)))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                                       generator=torch.Generator().manual_seed(seed), collate_fn=_collate_images)


def vision_data(cfg: dict) -> dict:
    """Fashion-MNIST (continued training, test) and CIFAR-10 test images converted to 28x28 grey
    (:func:`cifar_to_grey28`; ``cifar10_test`` splits them into a training pool and an evaluation pool) for
    ``cfg["data_profile"]``'s sizes; ``cfg["n_test"]``, ``cfg["n_cifar_train"]`` and ``cfg["n_cifar_test"]`` (None =
    all) cap the Fashion-MNIST test set and the two CIFAR pools (seeded, class-stratified)."""
    fm, cf = images.fashion_mnist(cfg["data_profile"]), images.cifar10_test(cfg["data_profile"])
    te = images.stratified_subset(fm["test_y"], cfg.get("n_test"), 3)
    ctr = images.stratified_subset(cf["train_y"], cfg.get("n_cifar_train"), 4)
    cte = images.stratified_subset(cf["test_y"], cfg.get("n_cifar_test"), 5)
    return dict(train_x=fm["train_x"], train_y=fm["train_y"], test_x=fm["test_x"][te], test_y=fm["test_y"][te],
                cifar_train_x=cifar_to_grey28(cf["train_x"][ctr]), cifar_train_y=cf["train_y"][ctr],
                cifar_test_x=cifar_to_grey28(cf["test_x"][cte]), cifar_test_y=cf["test_y"][cte])


def vit_special_mask(num_tokens: int, tokens_per_image: int) -> torch.Tensor:
    """[num_tokens] bool: the ViT's CLS token (position 0 of each image's ``tokens_per_image`` = 1 + patches) in
    calibration inputs collected image by image (notebook 03's vision stand-in)."""
    if tokens_per_image < 1 or num_tokens < 0:
        raise ValueError(f"need tokens_per_image >= 1 and num_tokens >= 0, got {tokens_per_image}, {num_tokens}")
    return torch.arange(num_tokens) % tokens_per_image == 0


def images_key(x, n: int) -> str:
    """Short content hash of the first ``n`` images (cache keys of the ViT calibration)."""
    return hashlib.sha256(np.ascontiguousarray(x[:n]).tobytes()).hexdigest()[:16]
