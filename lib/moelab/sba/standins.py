"""Tiny stand-ins in the formats notebook 02's ``paper`` profile reads (issue 51; SBA paper §V; ``02_sba``).

:func:`write` writes, from assets the project already has (no network), the smallest files in each format and returns
the notebook parameters that point at them (``scripts/make_paper_standins.py`` calls it; the dry run
``python -m moelab.runner run --profile paper --dry-run --only 02 --params "$(cat runs/standins/02.params)"`` reads
them):

- ``MODEL_PATH`` -> ``nomic-embed-text-v2-moe/``: a local nomic-embed-text-v2-moe folder as upstream ships it
  (``config.json`` with ``model_type`` ``nomic_bert`` and ``num_experts`` 8, ``model.safetensors`` under the upstream
  (MegaBlocks) key names with the stacked expert matrices ``[E*f, d]``, tokenizer files with XLM-R's special ids);
  randomly initialised at the shapes of :data:`TINY` (4 layers, odd ones MoE, 8 experts, top-2 unnormalised) with a
  tiny Unigram tokenizer. :func:`write_checkpoint` is the builder the loader tests use (tests/helpers/nomic.py).
- ``NLI_PATH`` -> ``all-nli/``: sentence-transformers/all-nli's root with its ``triplet/`` subset
  (``triplet/{train,dev,test}-00000-of-00001.parquet``, columns ``anchor``, ``positive``, ``negative``); the rows are
  the suite's real training / validation / test pairs (WordNet lemmas, definitions and examples, BIG-bench items and
  their answers, Python docstrings: :func:`moelab.suite.embed.pairs`), each negative the positive of another pair.
- ``MTEB_PATH`` -> ``mteb/``: the three MTEB tasks of Tables I/II in MTEB's Hugging Face layouts, ``test.jsonl.gz``
  each: ``STSBenchmark`` (rows ``sentence1``, ``sentence2``, ``score`` in [0, 5]: the suite's ``wordnet_sts`` pairs of
  WordNet definitions, gold = 5 x WordNet path similarity), ``StackExchangeClustering`` (one row per set:
  ``sentences`` list, ``labels`` list: the suite's WordNet-definition and BIG-bench-question clustering subsets) and
  ``SprintDuplicateQuestions`` (one row: ``sentence1``, ``sentence2``, ``labels`` lists: the suite's ``wordnet_pairs``,
  an example sentence against its own definition or another sense's). Texts over :data:`MAX_CHARS` characters are
  left out of the triplets and the clustering sets (the tiny tokenizer spells words out letter by letter).

Nothing here is evidence about the paper: the model is random and the sets are tiny; they rehearse paths, formats and
code.
"""
from __future__ import annotations

import gzip
import json
import string
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from moelab.suite import embed as suite_embed

__all__ = ["TINY", "tiny_tokenizer", "upstream_tensors", "config_json", "write_checkpoint", "write_allnli",
           "write_mteb", "write"]

TINY = dict(vocab_size=128, d_model=32, num_heads=4, d_ff=48, num_layers=4, num_experts=8, top_k=2)


# ----------------------------------------------------------------------------------------------------------------------
# a nomic-embed-text-v2-moe checkpoint in the upstream format (written from docs/reference-facts.md, not from
# moelab.sba.loader, so that the loader's tests check the loader against an independent writer)
# ----------------------------------------------------------------------------------------------------------------------
def tiny_tokenizer():
    """A Unigram tokenizer with XLM-R's special ids (<s> 0, <pad> 1, </s> 2, <unk> 3) over characters and a few words."""
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-R ids 0..3
    chars = string.ascii_lowercase + string.digits + string.punctuation
    pieces = [(s, 0.0) for s in specials] + [("\u2581", -2.0)] + [(c, -3.0) for c in chars]
    pieces += [("\u2581" + c, -2.5) for c in string.ascii_lowercase]
    pieces += [("\u2581search", -1.0), ("_query", -1.0), ("_document", -1.0), ("\u2581the", -1.0)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    assert tok.get_vocab_size() <= TINY["vocab_size"]
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", cls_token="<s>", sep_token="</s>", model_max_length=512)


def upstream_tensors(seed=0, **over):
    """Random tensors under the upstream names at :data:`TINY` shapes (``over`` replaces some)."""
    c = dict(TINY, **over)
    V, d, f, L, E = c["vocab_size"], c["d_model"], c["d_ff"], c["num_layers"], c["num_experts"]
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    sd = {"embeddings.word_embeddings.weight": rnd(V, d, std=1.0),
          "embeddings.token_type_embeddings.weight": rnd(1, d),
          "emb_ln.weight": 1 + rnd(d, std=0.1), "emb_ln.bias": rnd(d, std=0.1)}
    for i in range(L):
        p = f"encoder.layers.{i}."
        sd.update({p + "attn.Wqkv.weight": rnd(3 * d, d), p + "attn.Wqkv.bias": rnd(3 * d, std=0.1),
                   p + "attn.out_proj.weight": rnd(d, d), p + "attn.out_proj.bias": rnd(d, std=0.1),
                   p + "norm1.weight": 1 + rnd(d, std=0.1), p + "norm1.bias": rnd(d, std=0.1),
                   p + "norm2.weight": 1 + rnd(d, std=0.1), p + "norm2.bias": rnd(d, std=0.1)})
        if i % 2 == 1:  # odd layers are MoE
            sd.update({p + "mlp.router.layer.weight": rnd(E, d, std=1.0),
                       p + "mlp.experts.mlp.w1": rnd(E * f, d), p + "mlp.experts.mlp.w2": rnd(E * f, d),
                       p + "mlp.experts.bias": rnd(d, std=0.1)})
        else:
            sd.update({p + "mlp.fc1.weight": rnd(f, d), p + "mlp.fc1.bias": rnd(f, std=0.1),
                       p + "mlp.fc2.weight": rnd(d, f), p + "mlp.fc2.bias": rnd(d, std=0.1)})
    return sd


def config_json(**over):
    """nomic_bert's config.json for :data:`TINY` (overridden by ``over``)."""
    c = dict(TINY, **over)
    return {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "vocab_size": c["vocab_size"],
            "n_embd": c["d_model"], "n_head": c["num_heads"], "n_inner": c["d_ff"], "n_layer": c["num_layers"],
            "num_experts": c["num_experts"], "moe_top_k": c["top_k"], "moe_every_n_layers": 2,
            "moe_normalize_expert_weights": False, "type_vocab_size": 1, "layer_norm_epsilon": 1e-5,
            "rotary_emb_base": 10000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
            "prenorm": False, "activation_function": "gelu", "qkv_proj_bias": True, "pad_token_id": 1}


def write_checkpoint(path, sd=None, cfg=None, tokenizer=True) -> Path:
    """``path`` holding config.json, model.safetensors and (``tokenizer``) the tiny tokenizer; defaults: TINY."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg if cfg is not None else config_json()))
    save_file({k: v.contiguous() for k, v in (sd if sd is not None else upstream_tensors()).items()},
              str(path / "model.safetensors"))
    if tokenizer:
        tiny_tokenizer().save_pretrained(str(path))
    return path


# ----------------------------------------------------------------------------------------------------------------------
# all-nli's triplet subset and the three MTEB tasks, from the suite's real text
# ----------------------------------------------------------------------------------------------------------------------
ALLNLI_SPLITS = {"train": "train", "dev": "validation", "test": "test"}  # all-nli split -> suite pairs split
N_TRIPLETS = {"train": 96, "dev": 32, "test": 16}


MAX_CHARS = 120  # texts longer than this are left out: the stand-in's tokenizer spells words out letter by letter


def _short(texts) -> bool:
    return all(len(t) <= MAX_CHARS for t in texts)


def _triplets(pairs: list, n: int) -> pd.DataFrame:
    """(anchor, positive) pairs -> ``n`` all-nli triplets, the negative of pair i the positive of pair i + 1 (pairs
    with a text over :data:`MAX_CHARS` characters left out)."""
    pairs = [p for p in pairs if _short(p)][: n + 1]
    if len(pairs) < n + 1:
        raise ValueError(f"{len(pairs)} pairs for {n} triplets")
    return pd.DataFrame([dict(anchor=a, positive=p, negative=pairs[i + 1][1]) for i, (a, p) in enumerate(pairs[:n])])


def write_allnli(out, n: dict = N_TRIPLETS) -> Path:
    """sentence-transformers/all-nli's root ``out`` with ``triplet/{split}-00000-of-00001.parquet`` (columns anchor,
    positive, negative) from the suite's pairs (``moelab.suite.embed.pairs("default")``)."""
    pairs = suite_embed.pairs("default")
    d = Path(out) / "triplet"
    d.mkdir(parents=True, exist_ok=True)
    for split, src in ALLNLI_SPLITS.items():
        _triplets(pairs[src], n[split]).to_parquet(d / f"{split}-00000-of-00001.parquet", index=False)
    return Path(out)


MTEB_SIZES = dict(sts=24, clus_subsets=2, clus_size=32, pairclass=24, retrieval=4)


def _short_subset(texts, labels) -> dict:
    keep = [(t, lab) for t, lab in zip(texts, labels) if _short([t])]
    return dict(sentences=[t for t, _ in keep], labels=[lab for _, lab in keep])


def write_mteb(out, sizes: dict = MTEB_SIZES) -> Path:
    """``out/{STSBenchmark,StackExchangeClustering,SprintDuplicateQuestions}/test.jsonl.gz`` in MTEB's layouts
    (:func:`moelab.sba.data.load_mteb_local`) from the suite's stand-in benchmarks (``benchmarks("smoke", sizes)``)."""
    b = suite_embed.benchmarks("smoke", sizes)
    sts, pairs = b["wordnet_sts"], b["wordnet_pairs"]
    tasks = {
        "STSBenchmark": [dict(sentence1=a, sentence2=c, score=round(5 * float(g), 4))
                         for a, c, g in zip(sts.texts_a, sts.texts_b, sts.gold)],
        "StackExchangeClustering": [_short_subset(t, lab) for name in ("wordnet_clustering", "bigbench_clustering")
                                    for t, lab in b[name].subsets],
        "SprintDuplicateQuestions": [dict(sentence1=list(pairs.texts_a), sentence2=list(pairs.texts_b),
                                          labels=[int(y) for y in pairs.gold])],
    }
    for task, rows in tasks.items():
        f = Path(out) / task / "test.jsonl.gz"
        f.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(f, "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return Path(out)


def write(folder) -> dict:
    """Every input of notebook 02's paper profile under ``folder``: {"params": {NAME: path}, "formats": {NAME: (path,
    the format it stands for)}} (``scripts/make_paper_standins.py``)."""
    folder = Path(folder).resolve()  # the notebook runs in another working directory
    model = write_checkpoint(folder / "nomic-embed-text-v2-moe")
    nli = write_allnli(folder / "all-nli")
    mteb = write_mteb(folder / "mteb")
    return {"params": {"MODEL_PATH": str(model), "NLI_PATH": str(nli), "MTEB_PATH": str(mteb)},
            "formats": {"MODEL_PATH": (str(model), "nomic-ai/nomic-embed-text-v2-moe (upstream keys, config.json "
                                                   "nomic_bert, safetensors, tokenizer); tiny random weights"),
                        "NLI_PATH": (str(nli), "sentence-transformers/all-nli root, triplet/ subset as parquet "
                                               "(anchor, positive, negative); suite pairs as text"),
                        "MTEB_PATH": (str(mteb), "MTEB STSBenchmark / StackExchangeClustering / "
                                                 "SprintDuplicateQuestions test.jsonl.gz; suite WordNet/BIG-bench "
                                                 "text")}}
