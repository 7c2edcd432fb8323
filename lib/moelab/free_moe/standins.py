"""Stand-ins for notebook 05's ``paper`` profile (paper 004, Free-MoE; issue 51): the smallest files in the format its
paper path reads, for the dry run (``python -m moelab.runner run --profile paper --dry-run --only 05``) and CI.

The paper profile reads one user path, ``MODEL_PATH``: a local Hugging Face folder of Llama-2-7b-chat (or
Llama-2-13b-chat, Gemma-7b, Gemma-2-9b; ``config.json`` with ``model_type`` ``llama`` / ``gemma`` / ``gemma2``,
``*.safetensors`` or ``*.bin`` weights, a tokenizer). Its evaluation data are the packaged suite tasks every profile
reads (BIG-bench multiple choice, elementary_math_qa, GSM-style templates, stdlib code records, HumanEval: see
``free_moe.data``), so no data path is passed and the stand-in is the model only:

- ``MODEL_PATH`` -> ``05/tiny-llama``: :func:`moelab.standins.tiny_llama`, a 2-layer ``LlamaForCausalLM`` (random
  weights, ``TINY_LLAMA`` shapes) with SmolLM2-135M-Instruct's real tokenizer and chat template, written by
  ``save_pretrained`` (``config.json``, ``model.safetensors``, ``tokenizer.json``): the layout of a Llama-2-7b-chat
  folder. Random weights: nothing it scores is evidence about the paper.
"""
from __future__ import annotations

from pathlib import Path

from moelab import standins

__all__ = ["write"]


def write(folder) -> dict:
    """Write notebook 05's stand-ins under ``folder``; returns ``{"params": {NAME: value}, "formats": {NAME: (path,
    what it stands for)}}`` (``scripts/make_paper_standins.py`` writes ``05.params`` from it)."""
    model = standins.tiny_llama(Path(folder).resolve() / "tiny-llama")
    return {"params": {"MODEL_PATH": str(model)},
            "formats": {"MODEL_PATH": (str(model), "a local Llama-2-7b-chat Hugging Face folder (save_pretrained "
                                                   "layout: config.json model_type 'llama', safetensors, tokenizer "
                                                   "with chat template); 2 layers, random weights")}}
