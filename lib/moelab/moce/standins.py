"""Stand-ins for notebook 01's paper profile (issue 51 dry run): the smallest local files in each format the paper
path reads, made from assets the project ships (no network). Called by ``scripts/make_paper_standins.py --only 01``.

Formats:
- ``MODEL_PATH``: a Hugging Face Llama folder (``config.json`` with ``model_type`` "llama", safetensors weights and a
  tokenizer), the layout of meta-llama/Llama-2-7b-chat-hf; stand-in ``moelab.standins.tiny_llama`` (2 blocks,
  SmolLM2's real tokenizer).
- ``ENCODER_PATH``: a sentence-transformers folder (``modules.json``, a BERT-type transformer), the layout of
  intfloat/e5-large-v2; stand-in ``moelab.standins.sentence_transformer`` (real all-MiniLM-L6-v2 cut to 1 layer).
- ``DATA_PATHS``: ``{"slimorca", "magicoder", "metamathqa"}`` -> JSONL files in the three data sets' own record
  formats (MoCE §4.1; read by :func:`moelab.moce.data.load_paper_mix`): SlimOrca
  ``{"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}``, Magicoder-Evol-Instruct
  ``{"instruction", "response"}``, MetaMathQA ``{"query", "response", "type", "original_question"}``. Their text is
  the suite's real instruction data (reasoning, code and maths items of ``moelab.suite.instruct.build("smoke")``).
"""
from __future__ import annotations

from pathlib import Path

from moelab import standins
from moelab.suite import instruct

__all__ = ["write", "N_PER_SOURCE"]

N_PER_SOURCE = 40  # records per data set: enough for the dry run's clustering, training and validation items


def _by_domain(n: int) -> dict:
    data = instruct.build("smoke")
    out = {}
    for split in ("train", "validation"):
        for r in data[split]:
            out.setdefault(r["domain"], [])
            if len(out[r["domain"]]) < n:
                out[r["domain"]].append(r)
    return out


def write(folder) -> dict:
    """Write the stand-ins under ``folder``; returns ``{"params": {...}, "formats": {NAME: (path, format)}}``."""
    folder = Path(folder).resolve()  # absolute: the notebook runs from another folder
    folder.mkdir(parents=True, exist_ok=True)
    model = standins.tiny_llama(folder / "llama")
    enc = standins.sentence_transformer(folder / "encoder", layers=1)
    dom = _by_domain(N_PER_SOURCE)
    orca = [{"conversations": [{"from": "system", "value": "You are a helpful assistant."},
                               {"from": "human", "value": r["instruction"]}, {"from": "gpt", "value": str(r["answer"])}]}
            for r in dom["reasoning"]]
    code = [{"instruction": r["instruction"], "response": str(r["answer"])} for r in dom["code"]]
    maths = [{"query": r["instruction"], "response": str(r["answer"]), "type": "GSM_Rephrased",
              "original_question": r["instruction"]} for r in dom["maths"]]
    paths = {"slimorca": standins.write_jsonl(folder / "slimorca.jsonl", orca),
             "magicoder": standins.write_jsonl(folder / "magicoder.jsonl", code),
             "metamathqa": standins.write_jsonl(folder / "metamathqa.jsonl", maths)}
    params = {"MODEL_PATH": str(model), "ENCODER_PATH": str(enc), "DATA_PATHS": {k: str(v) for k, v in paths.items()}}
    formats = {"MODEL_PATH": (str(model), "local Llama-2-7b-chat HF folder (tiny Llama, SmolLM2 tokenizer)"),
               "ENCODER_PATH": (str(enc), "e5-large-v2 sentence-transformers folder (MiniLM cut to 1 layer)"),
               **{f"DATA_PATHS[{k}]": (str(v), f"{k} JSONL in its own record format (suite instruction text)")
                  for k, v in paths.items()}}
    return {"params": params, "formats": formats}
