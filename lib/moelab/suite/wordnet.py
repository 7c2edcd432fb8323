"""A small reader of the WordNet 3.0 database files (Debian ``wordnet-base``) for the embedding suite.

Written by hand: NLTK is not in the pinned set and its WordNet loader downloads its corpus. We need only synsets
(lemmas, lexicographer file, hypernyms, gloss definition and examples) and the path similarity
``sim(a, b) = 1 / (1 + shortest path length between a and b in the hypernym graph)`` (the definition NLTK's
``path_similarity`` uses; noun synsets all share the root ``entity``, so every noun pair has a path).

Data line format (``wndb(5)``): ``offset lex_filenum ss_type w_cnt(hex) word lex_id ... p_cnt ptr... | gloss``.
"""
from __future__ import annotations

import functools
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from moelab import assets

LEXNAMES = ["adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
            "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
            "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
            "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
            "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
            "verb.communication", "verb.competition", "verb.consumption", "verb.contact", "verb.creation",
            "verb.emotion", "verb.motion", "verb.perception", "verb.possession", "verb.social", "verb.stative",
            "verb.weather", "adj.ppl"]
_QUOTED = re.compile(r'"([^"]+)"')


@dataclass(frozen=True)
class Synset:
    offset: str
    pos: str
    lexname: str
    lemmas: tuple
    hypernyms: tuple
    definition: str
    examples: tuple


def parse_line(line: str, pos: str) -> Synset:
    """One data-file line -> Synset; ``ValueError`` naming the offset for a malformed line."""
    head, sep, gloss = line.partition(" | ")
    f = head.split()
    try:
        offset, lex = f[0], int(f[1])
        w_cnt = int(f[3], 16)
        words = [f[4 + 2 * i].replace("_", " ") for i in range(w_cnt)]
        words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
        i = 4 + 2 * w_cnt
        p_cnt = int(f[i])
        ptrs = [f[i + 1 + 4 * j: i + 5 + 4 * j] for j in range(p_cnt)]
        hyper = tuple(p[1] for p in ptrs if p[0] in ("@", "@i") and p[2] == pos)
    except (IndexError, ValueError) as e:
        raise ValueError(f"malformed WordNet line (offset {f[0] if f else '?'}): {e}") from None
    examples = tuple(_QUOTED.findall(gloss))
    definition = gloss.split(";")[0].strip().strip('"').strip() if sep else ""
    return Synset(offset, pos, LEXNAMES[lex] if lex < len(LEXNAMES) else str(lex), tuple(words), hyper, definition,
                  examples)


@functools.lru_cache(maxsize=4)
def synsets(pos: str = "n", root: str | None = None) -> dict:
    """All synsets of a part of speech (``"n"``, ``"v"``, ``"a"``, ``"r"``) keyed by offset."""
    files = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
    if pos not in files:
        raise ValueError(f"unknown WordNet part of speech {pos!r}")
    if root is None:
        root = assets.wordnet_dir()
    out = {}
    with open(Path(root) / files[pos], encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  "):
                continue  # licence header
            s = parse_line(line.rstrip("\n"), pos)
            out[s.offset] = s
    return out


def ancestors(offset: str, syn: dict) -> dict:
    """Hypernym ancestors of a synset with their distance (itself at 0), breadth-first."""
    dist = {offset: 0}
    q = deque([offset])
    while q:
        o = q.popleft()
        for h in syn[o].hypernyms:
            if h not in dist:
                dist[h] = dist[o] + 1
                q.append(h)
    return dist


def path_similarity(a: str, b: str, syn: dict) -> float:
    """``1 / (1 + min over common hypernym ancestors c of d(a, c) + d(b, c))``; 0 when there is none."""
    da, db = ancestors(a, syn), ancestors(b, syn)
    common = set(da) & set(db)
    if not common:
        return 0.0
    return 1.0 / (1.0 + min(da[c] + db[c] for c in common))
