"""Stand-ins for notebook 03's paper profile (issue 51): the smallest files in the formats it reads, made from assets
the project already has (:func:`write`, called by ``scripts/make_paper_standins.py``). Formats and code paths only:
no number computed on them is evidence about the poster.

* ``CLIP_PATH`` -> ``clip/``: the layout of an open_clip Hub repository (e.g. laion/CLIP-ViT-B-32-laion2B-s34B-b79K):
  ``open_clip_pytorch_model.bin`` (a state dict in open_clip's key layout: ``visual.conv1``, ``visual.class_embedding``,
  ``visual.transformer.resblocks.<i>.{ln_1, attn.in_proj_weight, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}``,
  ``visual.ln_post``, ``visual.proj``, ``token_embedding``, ``positional_embedding``, ``transformer.resblocks.<i>``,
  ``ln_final``, ``text_projection``, ``logit_scale``, ``attn_mask``), ``open_clip_config.json`` (``model_cfg`` with
  ``embed_dim``, ``vision_cfg``, ``text_cfg``; ``preprocess_cfg``) and the CLIP BPE tokenizer files ``vocab.json`` +
  ``merges.txt`` (CLIP's byte-level alphabet, each symbol also with ``</w>``, merges learned here from the captions,
  then ``<|startoftext|>`` and ``<|endoftext|>``, as in CLIP's own vocabulary). A ViT with 4 blocks of width 32
  (32x32 images, patch 8) and a 2-block text tower of width 32 with CLIP's 77-token context, randomly initialised
  (no CLIP weights can be had here). ViT-B/32 has 12 blocks of width 768 (224px, patch 32) and a 512-wide text tower.
* ``PAIRS_PATH`` -> ``pairs/``: ``train.tsv`` in open_clip's CSV format (tab-separated, columns ``filepath`` and
  ``title``; LAION's place) and ``test.jsonl`` (``{"image", "caption"}`` per line, two captions per image like
  MSCOCO's five; the Karpathy test split's place), with PNG files under ``images/``: real CIFAR-10 images (BIG-bench's
  copy of its test set, 32x32 RGB) captioned with their class names in CLIP's prompt templates.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from moelab.standins import write_jsonl
from moelab.suite import images

__all__ = ["TINY_CLIP", "TEMPLATES", "bytes_to_unicode", "learn_bpe_merges", "write_clip_tokenizer",
           "tiny_openclip_state", "write_tiny_openclip", "write_pairs", "write"]

TINY_CLIP = dict(embed_dim=16, vision_cfg=dict(image_size=32, layers=4, width=32, patch_size=8, head_width=16,
                                               mlp_ratio=4.0),
                 text_cfg=dict(context_length=77, width=32, heads=2, layers=2))
# CLIP's zero-shot prompt templates (a few of the 80 in its notebook), filled with a class name
TEMPLATES = ("a photo of a {}.", "a blurry photo of a {}.", "a low resolution photo of the {}.",
             "a close-up photo of a {}.", "a bright photo of a {}.", "a cropped photo of the {}.")
N_TRAIN, N_TEST = 64, 16


def bytes_to_unicode() -> dict[int, str]:
    """CLIP's (and GPT-2's) reversible map from the 256 byte values to printable characters (the BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def learn_bpe_merges(texts, n_merges: int) -> list[tuple[str, str]]:
    """BPE merges learned on ``texts`` (lower-cased words as byte-level symbols, the last one with ``</w>``, as CLIP's
    tokenizer splits them): repeatedly merge the most frequent adjacent pair (ties: the first in sorted order)."""
    enc = bytes_to_unicode()
    words = Counter()
    for t in texts:
        for w in t.lower().replace(".", " .").split():
            sym = [enc[b] for b in w.encode("utf-8")]
            words[tuple(sym[:-1] + [sym[-1] + "</w>"])] += 1
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return merges


def write_clip_tokenizer(out, texts, n_merges: int = 200) -> int:
    """``vocab.json`` + ``merges.txt`` of a CLIP BPE tokenizer in CLIP's layout (the 256 byte symbols, the same with
    ``</w>``, the merges, then ``<|startoftext|>`` and ``<|endoftext|>``, the largest id). Returns the vocabulary size."""
    out = Path(out)
    base = list(bytes_to_unicode().values())
    merges = learn_bpe_merges(texts, n_merges)
    vocab = base + [c + "</w>" for c in base] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n")
    return len(vocab)


def tiny_openclip_state(vocab_size: int, shape: dict = TINY_CLIP, seed: int = 0) -> dict:
    """A randomly initialised state dict in open_clip's ``CLIP`` key layout (weights N(0, 0.02), LayerNorms 1/0,
    ``logit_scale`` ln(1/0.07) as open_clip initialises it)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g) * 0.02

    v, t, e = shape["vision_cfg"], shape["text_cfg"], shape["embed_dim"]
    sd = {}

    def blocks(prefix, width, layers, mlp):
        for i in range(layers):
            p = f"{prefix}transformer.resblocks.{i}."
            sd.update({p + "ln_1.weight": torch.ones(width), p + "ln_1.bias": torch.zeros(width),
                       p + "attn.in_proj_weight": rnd(3 * width, width), p + "attn.in_proj_bias": torch.zeros(3 * width),
                       p + "attn.out_proj.weight": rnd(width, width), p + "attn.out_proj.bias": torch.zeros(width),
                       p + "ln_2.weight": torch.ones(width), p + "ln_2.bias": torch.zeros(width),
                       p + "mlp.c_fc.weight": rnd(mlp, width), p + "mlp.c_fc.bias": torch.zeros(mlp),
                       p + "mlp.c_proj.weight": rnd(width, mlp), p + "mlp.c_proj.bias": torch.zeros(width)})

    vw, grid = v["width"], v["image_size"] // v["patch_size"]
    sd.update({"visual.class_embedding": rnd(vw), "visual.positional_embedding": rnd(grid * grid + 1, vw),
               "visual.conv1.weight": rnd(vw, 3, v["patch_size"], v["patch_size"]),
               "visual.ln_pre.weight": torch.ones(vw), "visual.ln_pre.bias": torch.zeros(vw)})
    blocks("visual.", vw, v["layers"], int(vw * v["mlp_ratio"]))
    sd.update({"visual.ln_post.weight": torch.ones(vw), "visual.ln_post.bias": torch.zeros(vw),
               "visual.proj": rnd(vw, e)})
    tw, ctx = t["width"], t["context_length"]
    sd.update({"token_embedding.weight": rnd(vocab_size, tw), "positional_embedding": rnd(ctx, tw)})
    blocks("", tw, t["layers"], 4 * tw)
    sd.update({"ln_final.weight": torch.ones(tw), "ln_final.bias": torch.zeros(tw), "text_projection": rnd(tw, e),
               "logit_scale": torch.tensor(np.log(1 / 0.07), dtype=torch.float32),
               "attn_mask": torch.full((ctx, ctx), float("-inf")).triu_(1)})
    return sd


def write_tiny_openclip(out, captions, seed: int = 0) -> Path:
    """A folder in the layout of an open_clip Hub repository (see the module docstring); returns it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_clip_tokenizer(out, captions)
    torch.save(tiny_openclip_state(vocab, TINY_CLIP, seed), out / "open_clip_pytorch_model.bin")
    cfg = {"model_cfg": {**TINY_CLIP, "text_cfg": {**TINY_CLIP["text_cfg"], "vocab_size": vocab}},
           "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}}
    (out / "open_clip_config.json").write_text(json.dumps(cfg, indent=1))
    return out


def write_pairs(out, n_train: int = N_TRAIN, n_test: int = N_TEST) -> tuple[Path, list[str]]:
    """``train.tsv`` (open_clip's CSV) and ``test.jsonl`` (two captions per image) over real CIFAR-10 images saved as
    PNG; returns the folder and every caption written."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    c = images.cifar10_test("smoke")
    labels = c["labels"]
    captions, train, test = [], [], []
    for split, xs, ys, n in (("train", c["train_x"], c["train_y"], n_train), ("test", c["test_x"], c["test_y"], n_test)):
        for i in range(n):
            rel = f"images/{split}_{i:04d}.png"
            Image.fromarray(xs[i]).save(out / rel)
            name = labels[int(ys[i])]
            if split == "train":
                train.append((rel, TEMPLATES[i % len(TEMPLATES)].format(name)))
            else:
                test += [{"image": rel, "caption": TEMPLATES[(i + k) % len(TEMPLATES)].format(name)} for k in (0, 3)]
    with (out / "train.tsv").open("w", encoding="utf-8") as f:
        f.write("filepath\ttitle\n" + "".join(f"{p}\t{t}\n" for p, t in train))
    write_jsonl(out / "test.jsonl", test)
    return out, [t for _, t in train] + [r["caption"] for r in test]


def write(folder) -> dict:
    """Notebook 03's paper-profile stand-ins under ``folder``: ``{"params": {CLIP_PATH, PAIRS_PATH}, "formats": ...}``
    (``scripts/make_paper_standins.py``)."""
    folder = Path(folder)
    pairs, captions = write_pairs(folder / "pairs")
    clip = write_tiny_openclip(folder / "clip", captions)
    return {"params": {"CLIP_PATH": str(clip), "PAIRS_PATH": str(pairs)},
            "formats": {"CLIP_PATH": (clip, "open_clip Hub repository of CLIP ViT-B/32 (open_clip_pytorch_model.bin, "
                                            "open_clip_config.json, CLIP BPE vocab.json + merges.txt); tiny, random"),
                        "PAIRS_PATH": (pairs, "image-text pairs: train.tsv in open_clip's CSV format (LAION) and "
                                              "test.jsonl with several captions per image (MSCOCO Karpathy test); "
                                              "CIFAR-10 images with prompt-template captions")}}
