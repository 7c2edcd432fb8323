"""Image sets for the MASS notebook 04 (PACS stand-in) and the cluster-upcycling notebook 03.

- Fashion-MNIST (Debian ``dataset-fashion-mnist``, MIT; via ``moelab.assets.fashion_mnist``): 60k train / 10k test
  28x28 grey images, 10 classes. Profiles take fixed seeded, class-stratified subsets.
- CIFAR-10 test set (10,000 32x32 RGB images) from BIG-bench's ``cifar10_classification/base64`` task
  (base64-encoded PNGs, label = the target with score 1). Decoded once with Pillow and cached as ``.npz``.
  Only the CIFAR-10 *test* set is in BIG-bench: notebooks split it (``cifar10_test(...)["train"/"test"]``)
  and say so.
"""
from __future__ import annotations

import ast
import base64
import io

import numpy as np

from moelab import assets, cache, profiles
from moelab.suite import bigbench

FASHION_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle boot"]
CIFAR_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_SIZES = {"smoke": (600, 200), "default": (12000, 2000), "full": (None, None), "paper": (None, None)}
CIFAR_SIZES = {"smoke": (300, 100), "default": (5000, 2000), "full": (8000, 2000), "paper": (8000, 2000)}


def stratified_subset(y: np.ndarray, n: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded subset of size ``n`` with (as nearly as possible) equal counts per class."""
    y = np.asarray(y)
    if n is None or n >= len(y):
        return np.arange(len(y))
    if n < 1:
        raise ValueError(f"subset size must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    per = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    take = [n // len(classes) + (i < n % len(classes)) for i in range(len(classes))]
    idx = np.concatenate([p[:t] for p, t in zip(per, take)])
    return np.sort(idx)


def fashion_mnist(profile: str) -> dict:
    """``dict(train_x uint8 [N,28,28], train_y int64 [N], test_x, test_y, labels)`` for ``profile``."""
    n_train, n_test = FASHION_SIZES[profiles.check_profile(profile)]
    d = assets.fashion_mnist()
    tr = stratified_subset(d["train_y"], n_train, 0)
    te = stratified_subset(d["test_y"], n_test, 1)
    return dict(train_x=d["train_x"][tr], train_y=d["train_y"][tr], test_x=d["test_x"][te], test_y=d["test_y"][te],
                labels=list(FASHION_LABELS))


def decode_png_b64(s: str) -> np.ndarray:
    """One base64 PNG -> uint8 array [H, W, 3]; ``ValueError`` for undecodable input."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(base64.b64decode(s, validate=False)))
        return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as e:  # PIL raises several types for corrupt data
        raise ValueError(f"undecodable base64 PNG ({type(e).__name__}: {e})") from None


def _cifar_all() -> dict:
    def build(tmp):
        d = bigbench.load_task("cifar10_classification/base64")
        xs, ys = [], []
        for ex in d["examples"]:
            sc = ex["target_scores"]
            sc = ast.literal_eval(sc) if isinstance(sc, str) else sc
            label = max(sc, key=sc.get)
            xs.append(decode_png_b64(ex["input"]))
            ys.append(CIFAR_LABELS.index(label))
        np.savez_compressed(tmp / "cifar10_test.npz", x=np.stack(xs), y=np.array(ys, dtype=np.int64))

    path = cache.artifact("cifar10_test", dict(source="bigbench-1.0.0/cifar10_classification/base64"), build)
    z = np.load(path / "cifar10_test.npz")
    return dict(x=z["x"], y=z["y"])


def cifar10_test(profile: str) -> dict:
    """CIFAR-10 test images split into ``train_x/train_y`` and ``test_x/test_y`` (uint8 [N,32,32,3]) + labels."""
    n_train, n_test = CIFAR_SIZES[profiles.check_profile(profile)]
    d = _cifar_all()
    perm = np.random.default_rng(0).permutation(len(d["y"]))
    te_pool, tr_pool = perm[:2000], perm[2000:]
    te = te_pool[stratified_subset(d["y"][te_pool], n_test, 1)]
    tr = tr_pool[stratified_subset(d["y"][tr_pool], n_train, 2)]
    return dict(train_x=d["x"][tr], train_y=d["y"][tr], test_x=d["x"][te], test_y=d["y"][te], labels=list(CIFAR_LABELS))
