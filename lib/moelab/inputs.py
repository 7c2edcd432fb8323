"""Early checks of the local models and data a ``paper`` profile reads (issue 51: "fail early and clearly").

Every paper path is checked before any long work, within seconds: a missing path raises
:class:`moelab.assets.MissingAsset`; a path that exists in the wrong format raises :class:`InputFormatError`. Both
name the notebook parameter, the file, the field where there is one, and the fix. The paper packages call these in
their loaders' first lines (``moce.data``, ``sba.data``, ``cluster_upcycling.data``, ``mass.data``,
``free_moe.experiment``).

Hand-written: these are a few lines of ``json`` and ``pathlib``; no library checks a Hugging Face folder or a JSONL
file against a paper's expected fields with the parameter name in the message.
"""
from __future__ import annotations

import json
from pathlib import Path

from moelab.assets import MissingAsset
from moelab.profiles import paper_input_hint


class InputFormatError(ValueError):
    """A user-given model or data path exists but is not in the format the paper profile reads: the message names
    the parameter, the file, the field and the fix."""

    def __init__(self, notebook: str, param: str, path, problem: str, fix: str):
        self.notebook, self.param, self.path = notebook, param, str(path)
        super().__init__(f"{param}={str(path)!r} (notebook {notebook}): {problem}. Fix: {fix}")


def require_path(notebook: str, param: str, path, what: str) -> Path:
    """``path`` as a ``Path`` if it exists; ``None`` or a missing path raises ``MissingAsset`` with the command that
    passes it (``what``: what the parameter should point at)."""
    if path is None or str(path).strip() == "":
        raise MissingAsset(what, f"the paper profile needs {param}", paper_input_hint(notebook, param, what))
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingAsset(what, f"no file or folder at {str(p)!r} ({param})", paper_input_hint(notebook, param, what))
    return p


def require_hf_model(notebook: str, param: str, path, what: str, model_types=None) -> dict:
    """Check a local Hugging Face model folder: it exists, holds ``config.json`` with a ``model_type`` in
    ``model_types`` (when given; e.g. ``("llama", "mistral")``), weights (``*.safetensors`` or ``*.bin``) and a
    tokenizer. Returns the parsed ``config.json``."""
    p = require_path(notebook, param, path, what)
    if not p.is_dir():
        raise InputFormatError(notebook, param, p, "is a file, not a model folder",
                               f"pass the folder that holds config.json and the weights ({what})")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise InputFormatError(notebook, param, p, "has no config.json (not a Hugging Face model folder)",
                               f"pass the folder written by save_pretrained / downloaded from the Hub ({what})")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise InputFormatError(notebook, param, cfg_file, f"config.json is not JSON ({e})",
                               "restore the file from the model's release") from None
    mt = cfg.get("model_type")
    if model_types is not None and mt not in model_types:
        raise InputFormatError(notebook, param, cfg_file, f"field 'model_type' is {mt!r}, expected one of "
                               f"{list(model_types)}", f"pass {what}")
    if not (list(p.glob("*.safetensors")) or list(p.glob("*.bin")) or list(p.glob("*.safetensors.index.json"))):
        raise InputFormatError(notebook, param, p, "holds no weights (*.safetensors or *.bin)",
                               "copy the weight files beside config.json")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.txt", "tokenizer_config.json")):
        raise InputFormatError(notebook, param, p, "holds no tokenizer (tokenizer.json, tokenizer.model or vocab.txt)",
                               "copy the tokenizer files beside config.json (tokenizer.save_pretrained)")
    return cfg


def read_records(notebook: str, param: str, path, fields, what: str, n: int | None = None) -> list[dict]:
    """The first ``n`` records (all with ``None``) of a local JSONL file (one object per line) or JSON file (a list of
    objects), each checked to hold every field in ``fields``; a missing field names the file, the line and the
    field. ``fields`` may list alternatives as tuples: ``("output", "response")`` needs one of them."""
    p = require_path(notebook, param, path, what)
    if p.is_dir():
        raise InputFormatError(notebook, param, p, "is a folder, expected a .jsonl or .json file", f"pass {what}")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json" or text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputFormatError(notebook, param, p, f"is not valid JSON ({e})", f"pass {what}") from None
        if not isinstance(rows, list):
            raise InputFormatError(notebook, param, p, f"holds a JSON {type(rows).__name__}, expected a list of "
                                   "objects", "save the records as a JSON list or as JSONL (one object per line)")
        numbered = list(enumerate(rows[:n] if n else rows, 1))
    else:
        numbered = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                raise InputFormatError(notebook, param, p, f"line {i} is not JSON ({e})",
                                       "one JSON object per line (JSONL)") from None
            if n and len(numbered) >= n:
                break
    if not numbered:
        raise InputFormatError(notebook, param, p, "holds no records", f"pass {what}")
    for line, rec in numbered:
        if not isinstance(rec, dict):
            raise InputFormatError(notebook, param, p, f"record {line} is a {type(rec).__name__}, expected an object",
                                   f"pass {what}")
        for f in fields:
            alts = f if isinstance(f, tuple) else (f,)
            if not any(a in rec for a in alts):
                raise InputFormatError(notebook, param, p, f"record {line} has no field {' or '.join(map(repr, alts))} "
                                       f"(it has {sorted(rec)})", f"pass {what}")
    return [rec for _, rec in numbered]
