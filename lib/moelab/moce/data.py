"""MoCE's data: the instruction mix as prompts and answer tokens, the cached trunk states, the paper's data sets
(Eo et al. §4.1, App. A; notebook ``notebooks/01_moce.py``).

The suite's maths / code / reasoning mix (``moelab.suite.instruct.build_balanced``: equal counts per domain) stands in
for SlimOrca + Magicoder + MetaMathQA; the paper profile reads those three from local files (:func:`load_paper_mix`).
Prompts and answers are tokenised by ``moelab.suite.encoding.encode_pair``, the tokenisation the scorer uses too.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from moelab import cache
from moelab.assets import MissingAsset, load_causal_lm
from moelab.device import inference_placement
from moelab.inputs import InputFormatError, read_records, require_hf_model, require_path
from moelab.moce.method import BTX_DOMAINS
from moelab.moce.trunk import lower_hidden_states
from moelab.profiles import paper_input_hint
from moelab.suite.encoding import encode_pair, special_prefix_length

__all__ = ["PROMPT_FORMAT", "MIN_ANSWER_TOKENS", "TOKENISATION", "prompt_text", "encode_item", "tokenize_example",
           "example_inputs", "collate", "build_cache", "trunk_state_bytes", "subsample", "with_groups", "btx_domain_splits", "PAPER_SOURCES",
           "load_paper_mix", "load_paper_model", "paper_encoder_path", "check_paper_inputs"]

PROMPT_FORMAT = "{instruction}\nAnswer:"
MIN_ANSWER_TOKENS = 16
TOKENISATION = "encode_pair-v1"  # names the rule in moelab.suite.encoding; part of the hidden-state cache key


def prompt_text(tok, instruction: str) -> str:
    """The prompt: ``"<instruction>\nAnswer:"``, the format of the suite's lm-eval multiple-choice tasks (their prompt
    is the instruction plus ``"\nAnswer:"``, the continuation ``" " + option``), so training and evaluation agree."""
    return PROMPT_FORMAT.format(instruction=instruction)


def encode_item(tok, item: dict) -> tuple[list[int], list[int]]:
    """``(prompt_ids, answer_ids)`` of an instruction record, through ``moelab.suite.encoding.encode_pair`` (the
    tokenizer's special tokens, e.g. Gemma-3's ``<bos>``, on the prompt; the answer after one space, without them):
    the same tokens for training (:func:`tokenize_example`) and scoring (``suite.lmeval.domain_nll``)."""
    return encode_pair(tok, prompt_text(tok, item["instruction"]), str(item["answer"]))


def tokenize_example(tok, item: dict, max_len: int) -> dict:
    """``input_ids [S]`` and ``labels [S]`` (-100 on the prompt: loss on the answer and EOS only), S <= ``max_len``.

    Tokens: :func:`encode_item` (the scorer's), plus EOS after the answer. Defined behaviour for an instruction longer
    than the context: the prompt keeps its special prefix (BOS) and its *last* ``max_len - MIN_ANSWER_TOKENS`` tokens
    in all (the question's end and the generation prompt) and ``truncated`` is set; the answer is cut at ``max_len``.
    ``max_len`` < 2·MIN_ANSWER_TOKENS -> ``ValueError``.
    """
    if max_len < 2 * MIN_ANSWER_TOKENS:
        raise ValueError(f"max_len={max_len} is too short (need >= {2 * MIN_ANSWER_TOKENS})")
    p, a = encode_item(tok, item)
    a = a + [tok.eos_token_id]
    room = max_len - MIN_ANSWER_TOKENS
    truncated = len(p) > room
    if truncated:
        n_pre = special_prefix_length(tok, p)
        p = p[:n_pre] + p[n_pre:][-(room - n_pre):]
    a = a[: max_len - len(p)]
    ids = torch.tensor(p + a, dtype=torch.long)
    labels = torch.tensor([-100] * len(p) + a, dtype=torch.long)
    return {"input_ids": ids, "labels": labels, "truncated": truncated}


def example_inputs(example: dict) -> torch.Tensor:
    """The input of the first adapted block for one cached example, ``[S, d]`` fp32 on the CPU: its stored trunk
    output ``h``, or, for an example of :func:`build_cache` with ``start=0`` (every block adapted: the paper profile),
    its token embeddings looked up now from the model's frozen embedding module (``embed``; exactly what block 0
    receives: Llama's lookup, Gemma-3's scaled lookup), so no ``n x S x d`` copy is ever stored."""
    if example.get("h") is not None:
        return example["h"]
    emb = example["embed"]
    with torch.no_grad():
        return emb(example["input_ids"].to(emb.weight.device)).float().cpu()


def collate(examples: list[dict]) -> dict:
    """Right-pad cached examples: ``h [B,S,d]`` (:func:`example_inputs`), ``labels [B,S]`` (-100 pad), ``mask [B,S]``,
    ``group_ids [B]``."""
    B = len(examples)
    hs = [example_inputs(e) for e in examples]
    S = max(x.shape[0] for x in hs)
    d = hs[0].shape[1]
    h = torch.zeros(B, S, d)
    labels = torch.full((B, S), -100, dtype=torch.long)
    mask = torch.zeros(B, S)
    for i, (e, x) in enumerate(zip(examples, hs)):
        n = x.shape[0]
        h[i, :n], labels[i, :n], mask[i, :n] = x, e["labels"], 1
    return {"h": h, "labels": labels, "mask": mask,
            "group_ids": torch.tensor([int(e.get("group", 0)) for e in examples]),
            "idx": torch.tensor([int(e.get("idx", -1)) for e in examples])}


def build_cache(model, tok, items: list[dict], groups, start: int, max_len: int, cache_config: dict | None = None):
    """Tokenised examples with the frozen lower blocks' output ``h [S,d]`` and the sequence's cluster ``group``.

    With ``cache_config`` (JSON-able, naming the model and data) the hidden states are stored with
    ``moelab.cache.memo`` and reused by every variant and later runs. With ``start=0`` (every block adapted, the paper
    profile) no block is frozen below the adapters: the examples keep their token ids and the model's embedding module
    (``h`` None, ``embed``), and :func:`example_inputs` looks the embeddings up per batch, so the trunk cache holds
    nothing (a stored copy would be n x S x d x 4 bytes: ~170 GB for 20,000 Llama-2-7b sequences of 512 tokens).
    """
    if len(items) == 0:
        raise ValueError("build_cache got no items")
    groups = np.asarray(groups)
    if len(groups) != len(items):
        raise ValueError(f"{len(groups)} group ids for {len(items)} items")
    toks = [tokenize_example(tok, it, max_len) for it in items]
    if start == 0:
        emb = model.get_input_embeddings()
        return [{"h": None, "embed": emb, "labels": t["labels"], "input_ids": t["input_ids"], "group": int(g), "idx": i,
                 "truncated": t["truncated"], "domain": it.get("domain"), "task": it.get("task")}
                for i, (t, g, it) in enumerate(zip(toks, groups, items))]

    def compute():
        return lower_hidden_states(model, [t["input_ids"] for t in toks], start)

    if cache_config is not None:
        digest = hashlib.sha256(json.dumps([[it["instruction"], str(it["answer"])] for it in items]).encode()).hexdigest()
        hs = cache.memo("moce-hidden", {**cache_config, "start": start, "max_len": max_len, "items": digest,
                                        "tokenisation": TOKENISATION}, compute)
    else:
        hs = compute()
    return [{"h": h, "labels": t["labels"], "input_ids": t["input_ids"], "group": int(g), "idx": i,
             "truncated": t["truncated"], "domain": it.get("domain"), "task": it.get("task")}
            for i, (h, t, g, it) in enumerate(zip(hs, toks, groups, items))]


def trunk_state_bytes(examples: list[dict]) -> int:
    """Bytes of frozen-trunk states the examples of :func:`build_cache` hold (the size of their cache entry): 0 with
    every block adapted (``start=0``, the paper profile), else Σ S_i x d x 4 (fp32)."""
    return sum(e["h"].numel() * e["h"].element_size() for e in examples if e.get("h") is not None)


def subsample(items: list[dict], n: int | None, seed: int = 0, by: str | None = None) -> list[dict]:
    """A seeded subset of ``n`` items (all if ``n`` is None or >= len); with ``by`` (e.g. "domain"), equal shares per
    value: ``n // V`` each (the first ``n % V`` values in sorted order get one more; a value with fewer items gives
    all it has), interleaved value by value (each in a seeded random order) so every prefix is balanced too."""
    if by is None:
        if n is None or len(items) <= n:
            return list(items)
        rng = np.random.default_rng(seed)
        return [items[i] for i in np.sort(rng.choice(len(items), n, replace=False))]
    if any(by not in it for it in items):
        raise ValueError(f"subsample(by={by!r}): some items have no {by!r} field")
    vals = sorted({it[by] for it in items})
    if not vals:
        return []
    rng = np.random.default_rng(seed)
    pools = []
    for j, v in enumerate(vals):
        pool = [it for it in items if it[by] == v]
        want = len(pool) if n is None else n // len(vals) + (1 if j < n % len(vals) else 0)
        order = rng.permutation(len(pool))[:min(want, len(pool))]
        pools.append([pool[i] for i in order])
    out = []
    for r in range(max(len(p) for p in pools)):   # round robin: any prefix holds the values in equal shares
        out += [p[r] for p in pools if r < len(p)]
    return out


def with_groups(examples: list[dict], groups) -> list[dict]:
    """Shallow copies of cached examples with the sequence cluster ``group`` set."""
    groups = np.asarray(groups)
    if len(groups) != len(examples):
        raise ValueError(f"{len(groups)} group ids for {len(examples)} examples")
    return [{**e, "group": int(g)} for e, g in zip(examples, groups)]


def btx_domain_splits(examples: list[dict], domains: Sequence[str] = BTX_DOMAINS,
                      split: str = "training") -> dict[str, list[dict]]:
    """The per-domain ``split`` (training or validation) examples of the branch stage; unknown domain or an empty
    split -> ``ValueError``."""
    domains = list(domains)
    if len(domains) < 2 or len(set(domains)) != len(domains):
        raise ValueError(f"BTX needs >= 2 distinct domains, got {domains!r}")
    present = sorted({str(e.get("domain")) for e in examples})
    out = {}
    for d in domains:
        out[d] = [e for e in examples if e.get("domain") == d]
        if d not in BTX_DOMAINS and not out[d]:
            raise ValueError(f"unknown BTX domain {d!r}: expected one of {list(BTX_DOMAINS)} (examples have {present})")
        if not out[d]:
            raise ValueError(f"BTX domain {d!r} has an empty {split} split (examples have domains {present})")
    return out



PAPER_SOURCES = {"slimorca": "reasoning", "magicoder": "code", "metamathqa": "maths"}


def _read_records(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of records (or be .jsonl)")
    return data


def _paper_record(source: str, r: dict, i: int) -> dict:
    """Map one record of a paper data set to the suite's format (instruction, answer, domain, source, task)."""
    if source == "slimorca":  # {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}, ...]}
        conv = r.get("conversations")
        if not isinstance(conv, list):
            raise ValueError(f"SlimOrca record {i} has no 'conversations' list")
        sys = " ".join(t["value"] for t in conv if t.get("from") == "system")
        human = [t["value"] for t in conv if t.get("from") == "human"]
        gpt = [t["value"] for t in conv if t.get("from") == "gpt"]
        if not human or not gpt:
            raise ValueError(f"SlimOrca record {i} lacks a human or gpt turn")
        instr, ans = ((sys + "\n\n") if sys else "") + human[0], gpt[0]
    elif source == "magicoder":  # Evol-Instruct: instruction/response; OSS-Instruct: problem/solution
        instr = r.get("instruction", r.get("problem"))
        ans = r.get("response", r.get("solution"))
    elif source == "metamathqa":  # {"query", "response", "type", "original_question"}
        instr, ans = r.get("query"), r.get("response")
    else:
        raise ValueError(f"unknown paper source {source!r}")
    if not isinstance(instr, str) or not isinstance(ans, str) or not instr.strip():
        raise ValueError(f"{source} record {i} has no instruction/answer text")
    return {"id": f"{source}-{i}", "instruction": instr, "answer": ans, "domain": PAPER_SOURCES[source],
            "source": source, "task": r.get("type", source) if source == "metamathqa" else source}


def load_paper_mix(paths: dict, n_per_source: int | None = None, val_frac: float = 0.02, seed: int = 0) -> dict:
    """The paper's ~1M-example mix (§4.1) from local JSON/JSONL files: ``paths`` maps ``slimorca``, ``magicoder``,
    ``metamathqa`` to files. Missing files -> ``moelab.assets.MissingAsset`` naming the file. Returns
    ``{"train", "validation"}`` in the suite's record format (evaluation uses the suite's tasks)."""
    unknown = set(paths) - set(PAPER_SOURCES)
    if unknown:
        raise ValueError(f"unknown paper data source(s) {sorted(unknown)}; expected {sorted(PAPER_SOURCES)}")
    recs = []
    for src in PAPER_SOURCES:
        p = paths.get(src)
        if p is None or not Path(p).is_file():
            raise MissingAsset(src, f"no local file at {p!r}",
                               paper_input_hint("01", "DATA_PATHS", f"a local JSON/JSONL copy of {src}; pass a dict, e.g. "
                                            f"DATA_PATHS=\"{{'{src}': '/data/{src}.jsonl'}}\""))
        rs = _read_records(Path(p))
        rng = np.random.default_rng(seed)
        if n_per_source is not None and len(rs) > n_per_source:
            rs = [rs[i] for i in np.sort(rng.choice(len(rs), n_per_source, replace=False))]
        recs += [_paper_record(src, r, i) for i, r in enumerate(rs)]
    perm = np.random.default_rng(seed).permutation(len(recs))
    recs = [recs[i] for i in perm]
    n_val = max(1, int(round(val_frac * len(recs))))
    return {"train": recs[n_val:], "validation": recs[:n_val]}


def load_paper_model(path, device: str = "auto"):
    """The paper profile's backbone (Llama-2-7b-chat, App. A) from a local folder -> ``(model, tokenizer)``;
    missing -> ``MissingAsset``. Placed on ``moelab.device.inference_placement(device)``'s device (CUDA when present,
    else the CPU) in fp32: the adapters train in fp32 under ``moelab.train``'s bf16 autocast on CUDA, and fp32 frozen
    weights let the trained model be scored without autocast (7B: 28 GB of GPU memory)."""
    if path is None or not Path(path).is_dir():
        raise MissingAsset("llama-2-7b-chat", f"no local model folder at {path!r}",
                           paper_input_hint("01", "MODEL_PATH", "a local folder of meta-llama/Llama-2-7b-chat-hf"))
    return load_causal_lm(path, dtype=torch.float32, device=inference_placement(device).device)


def paper_encoder_path(path):
    """The paper profile's clustering encoder (e5-large-v2, App. A) as a local sentence-transformers folder."""
    if path is None or not Path(path).is_dir():
        raise MissingAsset("e5-large-v2", f"no local encoder folder at {path!r}",
                           paper_input_hint("01", "ENCODER_PATH", "a local folder of intfloat/e5-large-v2"))
    return str(path)


# the fields each paper data set's records must hold (tuples: alternatives), as _paper_record reads them
PAPER_FIELDS = {"slimorca": ("conversations",), "magicoder": (("instruction", "problem"), ("response", "solution")),
                "metamathqa": ("query", "response")}
PAPER_MODEL_TYPES = ("llama", "mistral", "qwen2")  # Llama-2-7b-chat, and the Mistral / Qwen backbones of §4
ENCODER_MODEL_TYPES = ("bert", "xlm-roberta", "roberta", "mpnet", "t5")  # e5-large-v2 is BERT; instructor-xl is T5


def check_paper_inputs(model_path, encoder_path, data_paths) -> dict:
    """Notebook 01's paper-profile inputs, checked in its first seconds (issue 51), before any clustering or training:
    ``MODEL_PATH`` a Hugging Face Llama-family folder, ``ENCODER_PATH`` a sentence-transformers / BERT-type encoder
    folder (not a causal LM), ``DATA_PATHS`` a dict of the three sets whose records hold the fields of
    ``PAPER_FIELDS`` (first 50 records read). Raises ``MissingAsset`` / ``moelab.inputs.InputFormatError`` naming the
    parameter, file, field and fix. Returns the model's ``config.json``."""
    mcfg = require_hf_model("01", "MODEL_PATH", model_path, "a local meta-llama/Llama-2-7b-chat-hf folder",
                            model_types=PAPER_MODEL_TYPES)
    enc = require_path("01", "ENCODER_PATH", encoder_path, "a local intfloat/e5-large-v2 sentence-transformers folder")
    ecfg_file = enc / "config.json"
    if not enc.is_dir() or not ecfg_file.is_file():
        raise InputFormatError("01", "ENCODER_PATH", enc, "is not an encoder folder (no config.json)",
                               "pass a local intfloat/e5-large-v2 sentence-transformers folder")
    mt = json.loads(ecfg_file.read_text()).get("model_type")
    if mt not in ENCODER_MODEL_TYPES:
        raise InputFormatError("01", "ENCODER_PATH", ecfg_file, f"field 'model_type' is {mt!r}, not a sentence "
                               f"encoder (expected one of {list(ENCODER_MODEL_TYPES)})",
                               "pass the e5-large-v2 sentence-transformers folder, not the language model's")
    if not isinstance(data_paths, dict) or set(data_paths) != set(PAPER_SOURCES):
        raise InputFormatError("01", "DATA_PATHS", data_paths, f"must be a dict with exactly the keys "
                               f"{sorted(PAPER_SOURCES)}", "pass DATA_PATHS=\"{'slimorca': '/data/slimorca.jsonl', "
                               "'magicoder': '/data/magicoder.jsonl', 'metamathqa': '/data/metamathqa.jsonl'}\"")
    for src, fields in PAPER_FIELDS.items():
        recs = read_records("01", "DATA_PATHS", data_paths[src], fields, f"a {src} JSON/JSONL file", n=50)
        for i, r in enumerate(recs):
            try:
                _paper_record(src, r, i)
            except ValueError as e:
                raise InputFormatError("01", "DATA_PATHS", data_paths[src], str(e),
                                       f"pass {src} in its released record format") from None
    return mcfg


def paper_cache_identity(model_path, data_paths) -> dict:
    """The cache-key part of the paper profile's user inputs: ``moelab.cache.path_identity`` (content digest) of
    ``MODEL_PATH`` and of each ``DATA_PATHS`` file, so a second model of the same width, or an edited data row,
    gets new trunk states and new trainings (issue 51)."""
    return {"model_identity": cache.path_identity(model_path),
            "data_identity": {k: cache.path_identity(v) for k, v in sorted(dict(data_paths).items())}}
