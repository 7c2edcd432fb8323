"""Stand-ins in the formats notebook 04's ``paper`` profile reads (issue 51; ``scripts/make_paper_standins.py``).

- ``MODEL_PATH``: a local bert-large-uncased Hugging Face folder. Stand-in: :func:`moelab.standins.tiny_bert`, a
  randomly initialised BERT (``BertForPreTraining`` weights with the pooler, all-MiniLM-L6-v2's real WordPiece
  ``vocab.txt``) at width 64 but with :data:`LAYERS` = 12 layers, so the public scripts' MoE layer 10 exists.
- ``GLUE_DIR``: the official GLUE data folder (GLUE's ``download_glue_data.py`` layout), one folder per task the
  paper uses, tab-separated, no quoting:

  ========  =====================================  =====================================================================
  folder    files                                  columns (``moelab.mass.data.load_glue_task`` reads the bold ones)
  ========  =====================================  =====================================================================
  CoLA      train.tsv, dev.tsv (no header)         source, **label** (0/1), original mark (``*``), **sentence**
  RTE       train.tsv, dev.tsv                     index, **sentence1**, **sentence2**, **label** (entailment / not_entailment)
  QNLI      train.tsv, dev.tsv                     index, **question**, **sentence**, **label** (entailment / not_entailment)
  MNLI      train.tsv, dev_matched.tsv             index, promptID, pairID, genre, 4 parse columns, **sentence1**,
                                                   **sentence2**, label1 (dev: label1-label5), **gold_label**
  MRPC      train.tsv, dev.tsv                     **Quality** (0/1), #1 ID, #2 ID, **#1 String**, **#2 String**
  ========  =====================================  =====================================================================

  The text is real English the project ships, with labels that follow from how each pair is built (plausible, not
  GLUE's): MNLI and RTE from BIG-bench ``presuppositions_as_nli`` (its premise, hypothesis and gold relation; RTE
  folds neutral and contradiction into not_entailment); QNLI: "What is a <lemma>?" against the WordNet gloss of that
  noun (entailment) or of another noun (not_entailment); MRPC: "<lemma>: <gloss>." written with two synonyms of one
  synset (a paraphrase, 1) or with a synonym and another synset's gloss (0); CoLA: WordNet example sentences
  (acceptable, 1) and the same sentences with their words reversed (unacceptable, 0, mark ``*``).

Nothing trained on these is evidence about MASS: they exist to rehearse the paper path's formats and code.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from moelab.mass.data import GLUE_FILES, glue_file
from moelab.standins import tiny_bert
from moelab.suite import bigbench, wordnet

LAYERS = 12          # the public scripts' MoE layer is layer 10 (0-based) of bert-large: the stand-in needs > 10
N_TRAIN, N_DEV = 80, 32
_NLI = re.compile(r"Sentence 1:\s*(.*?)\s*\nSentence 2:\s*(.*?)\s*\n", re.S)


def _nli_pairs(n: int) -> list[tuple[str, str, str]]:
    """(premise, hypothesis, entailment / neutral / contradiction) from BIG-bench presuppositions_as_nli."""
    out = []
    for it in bigbench.load_items("presuppositions_as_nli"):
        m = _NLI.search(it["input"])
        if m:
            out.append((_clean(m.group(1)), _clean(m.group(2)), it["choices"][it["gold"]]))
    if len(out) < n:
        raise ValueError(f"presuppositions_as_nli gave {len(out)} premise/hypothesis pairs, need {n}")
    return out[:n]


def _clean(text: str) -> str:
    """One line without tabs (GLUE's files hold no tab or newline inside a field)."""
    return " ".join(text.replace("\t", " ").split())


def _nouns(n: int, rng: np.random.Generator) -> list:
    """``n`` WordNet noun synsets with a single-word first lemma, two lemmas and a gloss of >= 4 words."""
    syn = [s for s in wordnet.synsets("n").values() if len(s.lemmas) >= 2 and " " not in s.lemmas[0]
           and len(s.definition.split()) >= 4]
    return [syn[i] for i in rng.choice(len(syn), n, replace=False)]


def _examples(n: int) -> list[str]:
    """WordNet example sentences of >= 5 words (real English), in file order."""
    out = []
    for pos in ("v", "a"):
        for s in wordnet.synsets(pos).values():
            out += [_clean(e) for e in s.examples if len(e.split()) >= 5 and "\t" not in e]
            if len(out) >= n:
                return out[:n]
    raise ValueError(f"WordNet gave {len(out)} example sentences, need {n}")


def _write(path: Path, header, rows) -> None:
    """A GLUE TSV: fields joined by tabs, one row a line, no quoting (fields hold no tab or newline: :func:`_clean`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([header] if header else []) + list(rows)
    path.write_text("".join("\t".join(r) + "\n" for r in lines), encoding="utf-8")


def write_glue(root, n_train: int = N_TRAIN, n_dev: int = N_DEV, seed: int = 0) -> Path:
    """The GLUE folder (module docstring) with ``n_train`` + ``n_dev`` rows per task under ``root``."""
    root, rng, n = Path(root), np.random.default_rng(seed), n_train + n_dev
    nli = _nli_pairs(n)
    nouns = _nouns(2 * n, rng)
    sents = _examples(n)
    rows = {t: [] for t in GLUE_FILES}
    for i in range(n):
        p, h, rel = nli[i]
        rows["mnli"].append([str(i), str(1000 + i), f"{i}e", "fiction", p, h, p, h, p, h, rel])
        rows["rte"].append([str(i), p, h, "entailment" if rel == "entailment" else "not_entailment"])
        s, other = nouns[i], nouns[n + i]
        same = i % 2 == 0
        rows["qnli"].append([str(i), f"What is a {s.lemmas[0]}?", _clean(f"A {s.lemmas[0]} is "
                             f"{(s if same else other).definition}."), "entailment" if same else "not_entailment"])
        rows["mrpc"].append(["1" if same else "0", str(2 * i), str(2 * i + 1), _clean(f"{s.lemmas[0]}: {s.definition}."),
                             _clean(f"{s.lemmas[1]}: {(s if same else other).definition}.")])
        words = sents[i].rstrip(".").split()
        good = (i * 7) % 3 != 0                  # about two thirds acceptable, as in CoLA
        rows["cola"].append(["wn03", "1" if good else "0", "" if good else "*",
                             sents[i] if good else " ".join(reversed(words)) + "."])
    mnli_dev_extra = ["label2", "label3", "label4", "label5"]
    headers = {"rte": ["index", "sentence1", "sentence2", "label"], "qnli": ["index", "question", "sentence", "label"],
               "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], "cola": None,
               "mnli": ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                        "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]}
    for task, rs in rows.items():
        train, dev = rs[:n_train], rs[n_train:]
        _write(glue_file(root, task, "train"), headers[task],
               [r[:-1] + [r[-1], r[-1]] if task == "mnli" else r for r in train])
        if task == "mnli":                       # dev_matched.tsv: label1-label5 then gold_label
            _write(glue_file(root, task, "dev"), headers[task][:-1] + mnli_dev_extra + ["gold_label"],
                   [r[:-1] + [r[-1]] * 6 for r in dev])
        else:
            _write(glue_file(root, task, "dev"), headers[task], dev)
    return root


def write(folder) -> dict:
    """Notebook 04's paper-profile inputs under ``folder``: ``bert-large-uncased/`` (MODEL_PATH) and ``glue/``
    (GLUE_DIR).  Returns {"params": {name: path}, "formats": {name: (path, the format it stands for)}}."""
    folder = Path(folder)
    bert = tiny_bert(folder / "bert-large-uncased", num_hidden_layers=LAYERS)
    glue = write_glue(folder / "glue")
    return {"params": {"MODEL_PATH": str(bert), "GLUE_DIR": str(glue)},
            "formats": {"MODEL_PATH": (bert, "a local bert-large-uncased HF folder (tiny random BERT, 12 layers, "
                                              "MiniLM's WordPiece vocab)"),
                        "GLUE_DIR": (glue, "the official GLUE data folder: CoLA, QNLI, RTE, MNLI (dev_matched), MRPC "
                                           "TSVs (BIG-bench NLI pairs and WordNet text, labels by construction)")}}
