"""A tiny randomly initialised nomic-embed-text-v2-moe checkpoint in the *upstream* format (key names, stacked expert
matrices [E*f, d], config.json, a tiny XLM-R-like Unigram tokenizer), written with safetensors: the loader tests
(tests/sba/test_loader.py) and the SBA measurements on a nomic checkpoint (tests/sba/test_phase_b.py).

The writer lives in :mod:`moelab.sba.standins` (the paper profile's dry run uses the same checkpoint as its
``MODEL_PATH`` stand-in); it is written from docs/reference-facts.md, not from :mod:`moelab.sba.loader`."""
from moelab.sba.standins import TINY, config_json, tiny_tokenizer, upstream_tensors, write_checkpoint  # noqa: F401
