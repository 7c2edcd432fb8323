"""Tiny stand-ins in the formats the ``paper`` profiles read (issue 51), made from assets the project already has.

A researcher's paper run reads local copies of the papers' models and data (Llama-2-7b, e5-large-v2,
nomic-embed-text-v2-moe, BERT-large, SlimOrca, GLUE, ...). Their dry run (``run --profile paper --dry-run``) and CI's
rehearsal of it need the smallest files in the same formats: this module writes the shared ones (a Llama-architecture
causal LM with SmolLM2's real tokenizer, a BERT with MiniLM's real tokenizer, a sentence-transformers folder cut from
the real all-MiniLM-L6-v2, JSONL files); each paper package's ``standins.write(out)`` writes its own on top and
returns the notebook parameters that point at them. ``scripts/make_paper_standins.py`` calls them all.

The stand-ins are for formats and code paths only: the tiny Llama and BERT are randomly initialised at small width
(a dry run keeps the user's shapes; these shapes are ours), so no number from them is evidence about a paper. The
sentence-transformers folder keeps MiniLM's real weights (first layers only).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from moelab.assets import minilm_path, smollm2_path

# the shapes of the tiny models (a dry run on them must finish in a few minutes on two CPU cores)
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
TINY_BERT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=512)


def tiny_llama(out, seed: int = 0, **shape) -> Path:
    """A Llama-architecture causal LM (``LlamaForCausalLM``, random init at ``TINY_LLAMA`` shapes unless overridden)
    with SmolLM2-135M-Instruct's real tokenizer (and its chat template), saved with ``save_pretrained``: the layout of
    a local Llama-2-7b-chat folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tok = AutoTokenizer.from_pretrained(str(smollm2_path()))
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True, **{**TINY_LLAMA, **shape})
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def tiny_bert(out, seed: int = 0, **shape) -> Path:
    """A BERT (``BertModel`` weights, random init at ``TINY_BERT`` shapes) with all-MiniLM-L6-v2's real WordPiece
    tokenizer (``vocab.txt``), saved with ``save_pretrained``: the layout of a local bert-large-uncased folder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining

    out = Path(out)
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    cfg = BertConfig(vocab_size=len(tok), **{**TINY_BERT, **shape})
    torch.manual_seed(seed)
    BertForPreTraining(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def sentence_transformer(out, layers: int = 1) -> Path:
    """A sentence-transformers folder (``modules.json``, pooling, normalise) holding the real all-MiniLM-L6-v2 cut
    to its first ``layers`` transformer layers: the layout of a local e5-large-v2 or other sentence-transformers
    encoder."""
    from sentence_transformers import SentenceTransformer

    out = Path(out)
    st = SentenceTransformer(str(minilm_path()), device="cpu")
    bert = st[0].auto_model
    bert.encoder.layer = bert.encoder.layer[:layers]
    bert.config.num_hidden_layers = layers
    st.save(str(out))
    return out


def write_jsonl(path, rows) -> Path:
    """Write ``rows`` (dicts) as JSONL, one object per line (UTF-8); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def params_text(params: dict) -> str:
    """Notebook parameters as the runner's ``--params`` / make's ``P`` string (``NAME=VALUE`` separated by spaces; a
    value is its Python literal, so a dict or a path with spaces survives the split before each ``NAME=``)."""
    return " ".join(f"{k}={v!r}" for k, v in params.items())


def relocated_params(folder, nb: str) -> str:
    """``folder/NN.params`` (written by scripts/make_paper_standins.py) with every path moved under ``folder``: the
    stand-ins may have been written on another machine or in another clone (scripts/gpu_check.sh ``--dry-run``).  A
    quoted path ``'<old root>/NN/<rest>'`` becomes ``'<folder>/NN/<rest>'``; other values are kept."""
    folder = Path(folder).resolve()
    src = folder / f"{nb}.params"
    if not src.is_file():
        raise FileNotFoundError(f"no {src}: write the stand-ins first (python scripts/make_paper_standins.py {folder} "
                                f"--only {nb})")
    text = src.read_text().strip()
    return re.sub(r"""(['"])[^'"]*?/""" + re.escape(nb) + "/", lambda m: f"{m.group(1)}{folder / nb}/", text)
