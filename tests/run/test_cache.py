"""Cache faults and artifact keys that cover the code.

Derived assets are faked with small files (no model is dequantised); a read-only cache is simulated by making the
write calls raise PermissionError (tests run as root, for whom chmod does not stop a write).
"""
import errno
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from moelab import assets, cache, claims, mass
from moelab.runner import notebook_run
from moelab.mass.data import GINCConfig

from helpers import ROOT



def _denied(*args, **kwargs):
    raise PermissionError(errno.EROFS, "Read-only file system", str(args[0]) if args else "?")


def _fake_safetensors(path: Path, n: int = 64) -> None:
    """A valid safetensors file with one float32 tensor of ``n`` zeros (format: u64 header size, JSON, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4 * n))


# ---------------------------------------------------------------- 1. derived assets: recorded, verified, rebuilt
@pytest.fixture
def fake_dequantiser(monkeypatch):
    """transformers' Auto classes replaced by fakes whose save_pretrained writes a small safetensors + config."""
    import transformers

    calls = []

    class FakeModel:
        config = type("C", (), {})()

        @classmethod
        def from_pretrained(cls, *a, **k):
            calls.append("model")
            return cls()

        def save_pretrained(self, out, **k):
            _fake_safetensors(Path(out) / "model.safetensors")
            fd = os.open(Path(out) / "config.json", os.O_WRONLY | os.O_CREAT, 0o600)  # private, like safetensors
            os.write(fd, b'{"model_type": "llama"}')
            os.close(fd)

    class FakeTok:
        @classmethod
        def from_pretrained(cls, *a, **k):
            return cls()

        def save_pretrained(self, out):
            (Path(out) / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", FakeModel)
    monkeypatch.setattr(transformers, "AutoTokenizer", FakeTok)
    return calls


def test_derived_model_records_files_and_is_rebuilt_when_truncated_or_changed(tmp_cache, tmp_path,
                                                                             fake_dequantiser):
    sha = "ab" * 32
    out = assets._dequantise("toy", tmp_path, "toy.gguf", sha)
    st = out / "model.safetensors"
    rec = cache.read_marker(out)["files"]
    assert rec["model.safetensors"] == {"size": st.stat().st_size, "sha256": cache.sha256_file(st)}
    assert assets._dequantise("toy", tmp_path, "toy.gguf", sha) == out and fake_dequantiser == ["model"]  # cached
    good = st.read_bytes()
    st.write_bytes(good[: len(good) // 2])  # truncated (a killed copy, a full disk)
    assert cache.entry_problems(out) == [f"model.safetensors: {len(good) // 2} bytes, recorded {len(good)}"]
    assets._dequantise("toy", tmp_path, "toy.gguf", sha)  # the loader's cheap size check rebuilds it
    assert fake_dequantiser == ["model"] * 2 and st.read_bytes() == good
    st.write_bytes(good[:-4] + b"\x01\x02\x03\x04")  # same size, different bytes: only the install hash check sees it
    assets._dequantise("toy", tmp_path, "toy.gguf", sha)
    assert fake_dequantiser == ["model"] * 2
    assets._dequantise("toy", tmp_path, "toy.gguf", sha, hashes=True)
    assert fake_dequantiser == ["model"] * 3 and st.read_bytes() == good


def test_corrupt_derived_model_in_readonly_cache_names_file_and_command(tmp_cache, tmp_path, fake_dequantiser,
                                                                       monkeypatch):
    out = assets._dequantise("toy", tmp_path, "toy.gguf", "cd" * 32)
    (out / "model.safetensors").write_bytes(b"trunc")
    monkeypatch.setattr(Path, "unlink", _denied)
    with pytest.raises(cache.CorruptCacheEntry, match=rf"{out}.*model.safetensors: 5 bytes.*MOELAB_CACHE.*make assets") as e:
        assets._dequantise("toy", tmp_path, "toy.gguf", "cd" * 32)
    assert "rm -rf" not in str(e.value)   # a read-only entry cannot be deleted; another cache is the fix


def test_entry_without_record_gets_structural_check_then_record(tmp_cache):
    d = cache.cache_root() / "models" / "legacy"
    d.mkdir(parents=True)
    _fake_safetensors(d / "model.safetensors", n=16)
    os.chmod(d / "model.safetensors", 0o600)  # as safetensors wrote it
    (d / cache.MARKER).write_text(json.dumps({"source_sha256": "x"}))  # made before file records existed
    assert cache.entry_problems(d, hashes=True) == []
    assert assets.check_derived(d) and "files" not in cache.read_marker(d)  # loaders only read
    assert assets.check_derived(d, hashes=True) and "files" in cache.read_marker(d)  # adopted by install
    assert (d / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~cache.umask()
    assert cache.read_marker(d)["source_sha256"] == "x"
    (d / cache.MARKER).write_text("{}")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-8])
    assert "model.safetensors" in cache.entry_problems(d)[0]  # the header says how long the file must be
    assert not assets.check_derived(d) and not cache.is_complete(d)


@pytest.fixture
def toy_bigbench(tmp_cache, tmp_path, monkeypatch):
    """A fake BIG-bench sdist with one task, 'toy', served to the real extraction code."""
    task = {"name": "toy", "examples": [{"input": "2+2", "target_scores": {"4": 1, "5": 0}}] * 20}
    src = tmp_path / "src" / "bigbench-1.0.0" / "bigbench" / "benchmark_tasks" / "toy"
    src.mkdir(parents=True)
    (src / "task.json").write_text(json.dumps(task))
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "src" / "bigbench-1.0.0", arcname="bigbench-1.0.0")
    monkeypatch.setattr(assets, "bigbench_sdist", lambda: sdist)
    monkeypatch.setattr(assets, "BIGBENCH_TASKS", ["toy"])
    return task


def test_truncated_bigbench_task_is_extracted_again(toy_bigbench):
    root = assets.extract_bigbench()
    f = root / "toy" / "task.json"
    good = f.read_bytes()
    assert cache.read_marker(root / "toy")["files"]["task.json"]["size"] == len(good)
    f.write_bytes(good[:100])  # truncated: would fail deep inside json
    assert assets.bigbench_task("toy") == toy_bigbench and f.read_bytes() == good
    f.write_bytes(good.replace(b'"4"', b'"7"'))  # same size, still JSON: the install check restores it
    assert assets.bigbench_task("toy") != toy_bigbench
    assets.extract_bigbench(check_hashes=True)
    assert assets.bigbench_task("toy") == toy_bigbench
    f.write_bytes(good.replace(b"{", b"[", 1))  # same size, not JSON: the loader extracts again
    assert assets.bigbench_task("toy") == toy_bigbench
    assert not list(root.glob(".*tmp-*"))  # no staging folder left behind


def test_install_reports_a_derived_fault_as_failed(monkeypatch):
    def bad(check_hashes=False):
        raise cache.CorruptCacheEntry(Path("/c/models/x"), ["model.safetensors: 5 bytes, recorded 9"], "make assets")

    seen = {}
    for name in ("minilm_path", "humaneval_problems", "download_bigbench", "extract_bigbench", "fashion_mnist",
                 "wordnet_dir", "stdlib_dir", "e5_embed", "gemma3_path"):
        monkeypatch.setattr(assets, name, lambda *a, _n=name, **k: seen.setdefault(_n, k))
    monkeypatch.setattr(assets, "smollm2_path", bad)
    rows = dict(assets.install(gemma=True))
    assert rows["SmolLM2-135M-Instruct"].startswith("FAILED: cache entry /c/models/x is corrupt")
    assert rows["HumanEval"] == "ok" and rows["Gemma-3-270M"] == "ok"
    assert seen["extract_bigbench"] == seen["gemma3_path"] == {"check_hashes": True}  # install hashes derived files


# ---------------------------------------------------------------- 2. read-only cache
def test_readonly_cache_root_gives_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "ro" / "cache"))
    monkeypatch.setattr(Path, "mkdir", _denied)
    with pytest.raises(cache.CacheNotWritable) as e:
        cache.cache_root()
    msg = str(e.value)
    assert f"cache directory {tmp_path / 'ro' / 'cache'} is not writable" in msg
    assert "set MOELAB_CACHE to a writable folder, e.g. export MOELAB_CACHE=~/moelab-cache" in msg


def test_complete_readonly_cache_is_readable_and_new_entries_fail_clearly(tmp_cache, monkeypatch):
    value = cache.memo("ro", {"k": 1}, lambda: {"x": [1, 2]})
    monkeypatch.setattr(os, "mkdir", _denied)
    monkeypatch.setattr(os, "replace", _denied)
    monkeypatch.setattr(Path, "write_text", _denied)
    monkeypatch.setattr(Path, "unlink", _denied)
    assert cache.memo("ro", {"k": 1}, lambda: 1 / 0) == value  # read without writing anything
    with pytest.raises(cache.CacheNotWritable, match=rf"cache directory {tmp_cache} is not writable.*MOELAB_CACHE="):
        cache.memo("ro", {"k": 2}, lambda: 0)


def test_verify_does_not_rewrite_stamps_and_tolerates_readonly(tmp_cache, tmp_path, monkeypatch):
    f = tmp_path / "data.bin"
    f.write_bytes(b"real data")
    monkeypatch.setitem(assets.SHA256, "toy", cache.sha256_file(f))
    assets.verify("toy", f)
    stamp = tmp_cache / "verified" / "toy.json"
    before = (stamp.stat().st_mtime_ns, stamp.read_text())
    monkeypatch.setattr(Path, "write_text", _denied)  # any write now fails
    assert assets.verify("toy", f) == f  # unchanged: no hashing, no write
    assert (stamp.stat().st_mtime_ns, stamp.read_text()) == before
    stamp.unlink()
    assert assets.verify("toy", f) == f  # verified again; the stamp cannot be written, which is not an error
    f.write_bytes(b"fake data")
    with pytest.raises(assets.ChecksumMismatch):
        assets.verify("toy", f)


def test_assets_cli_reports_readonly_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "nope"))
    monkeypatch.setattr(Path, "mkdir", _denied)
    assert assets.main(["status"]) == 2
    assert "export MOELAB_CACHE=~/moelab-cache" in capsys.readouterr().err


# ---------------------------------------------------------------- 3. temporary folders of killed builds
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_tmp_rule(tmp_path):
    host = cache._HOST
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cases = {
            f".e.tmp-{host}-{_dead_pid()}-0001": True,   # this host, creator dead
            f".e.tmp-{host}-{live.pid}-0002": False,     # this host, creator running: a build in progress
            f".e.tmp-{host}-{os.getpid()}-0003": False,  # this process
            ".e.tmp-k2j4_x9z": False,                     # older name without an owner, fresh
            ".e.tmp-oldbuild": True,                      # older name, 7 h old
            f".e.tmp-ffffff-{live.pid}-0004": False,      # another host, fresh: cannot check its pid
        }
        for name in cases:
            (tmp_path / name).mkdir()
            (tmp_path / name / "half.bin").write_bytes(b"x")
        old = time.time() - 7 * 3600
        os.utime(tmp_path / ".e.tmp-oldbuild", (old, old))
        assert {n: cache.is_stale_tmp(tmp_path / n) for n in cases} == cases
        removed = cache.sweep_stale(tmp_path, "e")
        assert sorted(p.name for p in removed) == sorted(n for n, stale in cases.items() if stale)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, stale in cases.items() if not stale)
    finally:
        live.kill()
        live.wait()


def test_killed_build_tmp_is_cleaned_on_next_start(tmp_cache):
    """A real build killed with SIGKILL: its folder survives it, is left alone while it runs, removed after."""
    script = ("import time\nfrom pathlib import Path\nfrom moelab import cache\n"
              "def build(d):\n    (d / 'started').write_text('x')\n    time.sleep(120)\n"
              "cache.artifact('slow', {'a': 1}, build)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "MOELAB_CACHE": str(tmp_cache)})
    kind_dir = tmp_cache / "artifacts" / "slow"
    try:
        for _ in range(300):
            tmps = list(kind_dir.glob(".*.tmp-*/started")) if kind_dir.exists() else []
            if tmps:
                break
            time.sleep(0.1)
        assert tmps, "the build did not start"
        tmp = tmps[0].parent
        assert cache.sweep_stale(tmp_cache) == [] and tmp.exists()  # in progress in another process: kept
    finally:
        proc.kill()
        proc.wait()
    assert tmp.exists()  # what a killed build leaves behind

    def build(d):
        (d / "v").write_text("done")

    path = cache.artifact("slow", {"a": 1}, build)  # same key: config, code closure (none), versions
    assert (path / "v").read_text() == "done"
    assert not tmp.exists() and not list(kind_dir.glob(".*.tmp-*"))


# ---------------------------------------------------------------- 4. permissions follow the umask
@pytest.mark.parametrize("mask", [0o002, 0o022, 0o077])
def test_cache_entries_honour_umask(tmp_cache, mask):
    def build(d):
        fd = os.open(d / "weights.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # a writer that makes private files
        os.close(fd)
        (d / "sub").mkdir()
        (d / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(d / "run.sh", 0o700)

    old = os.umask(mask)
    try:
        path = cache.artifact("perm", {"mask": mask}, build)
    finally:
        os.umask(old)
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(path) == 0o777 & ~mask and mode(path / "sub") == 0o777 & ~mask
    assert mode(path / "weights.bin") == 0o666 & ~mask
    assert mode(path / "run.sh") == 0o777 & ~mask
    assert mode(path.parent) == 0o777 & ~mask  # folders made on the way, too


def test_umask_reader_matches_os_umask():
    old = os.umask(0o027)
    try:
        assert cache.umask() == 0o027
    finally:
        os.umask(old)


# ---------------------------------------------------------------- 5. keys that cover the code
def _write_pkg(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / "moelab" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "moelab"


def test_import_closure_follows_imports_and_skips_claims_and_reports(tmp_path):
    """Static import graph on a small package, against the closure worked out by hand."""
    lib = _write_pkg(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "from .layer import Layer\n",
        "core/layer.py": "from . import routing as R\n",
        "core/routing.py": "import math\n",
        "core/unused.py": "",
        "paper.py": ("import moelab\nfrom moelab.core.layer import Layer\nfrom moelab.claims import ClaimSet\n"
                     "def f():\n    from moelab import util\n    return moelab.suite.embed.x\n"),
        "util.py": "from .helpers import h\n",
        "helpers.py": "",
        "suite/__init__.py": "",
        "suite/embed.py": "",
        "claims/__init__.py": "from moelab.stats import boot\n",
        "stats.py": "",
        "paper2/__init__.py": "from . import method, report\n",
        "paper2/method.py": "",
        "paper2/report.py": "from moelab import stats\n",
        "runner/__init__.py": "",
        "runner/notebook_run.py": "from moelab.claims import ClaimSet\n",
    })
    got = cache.import_closure(["moelab.paper"], lib=lib)
    assert set(got) == {"moelab.paper", "moelab.core", "moelab.core.layer", "moelab.core.routing",
                        "moelab.util", "moelab.helpers", "moelab.suite", "moelab.suite.embed"}
    assert set(cache.import_closure(["moelab.paper2"], lib=lib)) == {"moelab.paper2", "moelab.paper2.method"}
    assert cache.import_closure(["moelab.claims", "moelab.runner.notebook_run"], lib=lib) == {}
    # a real edit of a transitively imported file changes its hash; an edit of claims changes nothing
    before = cache.import_closure(["moelab.paper"], lib=lib)
    (lib / "core" / "routing.py").write_text("import math\nE = math.e\n")
    (lib / "claims" / "__init__.py").write_text("from moelab.stats import boot\nX = 1\n")
    after = cache.import_closure(["moelab.paper"], lib=lib)
    assert {m for m in before if before[m] != after[m]} == {"moelab.core.routing"}


def test_code_closure_of_real_modules_covers_core_and_never_claims():
    keyed = cache.code_closure(mass.run_mass)
    assert "lib/moelab/mass/experiment.py" in keyed and "lib/moelab/core/routing.py" in keyed
    assert keyed["lib/moelab/core/routing.py"] == cache.source_digest(ROOT / "lib/moelab/core/routing.py")
    for never in ("claims", "runner", "cache", "profiles.py", "__init__.py"):
        assert not any(k.startswith(f"lib/moelab/{never}") for k in keyed), never
    assert not any(k.endswith("/report.py") for k in keyed)
    assert cache.code_closure(lambda: claims.frame([])) == {}  # verdict code alone keys nothing



def test_a_papers_claims_module_is_never_in_a_key(tmp_path):
    """A paper's claim definitions (``<paper>/claims.py``) are verdict code like ``<paper>/report.py``: left out of
    the closure even when a keyed module imports them, and editing them changes no key."""
    lib = _write_pkg(tmp_path, {
        "__init__.py": "",
        "paper3/__init__.py": "from . import method\n",
        "paper3/method.py": "from . import claims\nfrom moelab import stats\n",
        "paper3/claims.py": "from moelab.stats import boot\nfrom moelab.paper3 import method\n",
        "stats.py": "",
    })
    before = cache.import_closure(["moelab.paper3.method"], lib=lib)
    assert set(before) == {"moelab.paper3", "moelab.paper3.method", "moelab.stats"}
    (lib / "paper3" / "claims.py").write_text("from moelab.stats import boot\nTHRESHOLD = 0.5\n")
    assert cache.import_closure(["moelab.paper3.method"], lib=lib) == before
    assert cache.import_closure(["moelab.paper3.claims"], lib=lib) == {}


def test_plumbing_that_computes_nothing_is_never_in_a_key(tmp_path):
    """The top package's ``__init__`` (``start_run``, lazy attribute access), ``moelab.profiles`` (profile names and
    the messages that name the runner) and the run layer ``moelab.runner`` are left out of every closure: moving the
    runner or rewording a message retrains nothing. A parent package below the top one still counts."""
    lib = _write_pkg(tmp_path, {
        "__init__.py": "def start_run():\n    from moelab.runner.notebook_run import NotebookRun\n",
        "profiles.py": "PROFILES = ('smoke',)\n",
        "runner/__init__.py": "",
        "runner/notebook_run.py": "from moelab import profiles\n",
        "paper4/__init__.py": "from . import method\n",
        "paper4/method.py": "from moelab.profiles import PROFILES\nfrom moelab.core import routing\n",
        "core/__init__.py": "",
        "core/routing.py": "import math\n",
    })
    before = cache.import_closure(["moelab.paper4.method"], lib=lib)
    assert set(before) == {"moelab.paper4", "moelab.paper4.method", "moelab.core", "moelab.core.routing"}
    (lib / "__init__.py").write_text("def start_run():\n    from moelab.run.record import NotebookRun\n")
    (lib / "profiles.py").write_text("PROFILES = ('smoke', 'default')\n")
    (lib / "runner" / "notebook_run.py").write_text("X = 2\n")
    assert cache.import_closure(["moelab.paper4.method"], lib=lib) == before
    (lib / "core" / "__init__.py").write_text("Y = 1\n")   # a parent package inside moelab: still part of the key
    assert cache.import_closure(["moelab.paper4.method"], lib=lib) != before


@pytest.mark.parametrize("paper", ["moce", "sba", "cluster_upcycling", "mass", "free_moe"])
def test_real_paper_claims_modules_key_nothing(paper, tmp_cache, monkeypatch):
    """The real ``moelab.<paper>.claims`` modules: never in a closure, and a memo keyed on a lambda that uses one
    (beside its paper package) is not rebuilt when the claims file changes."""
    defs = importlib.import_module(f"moelab.{paper}.claims")
    pkg = importlib.import_module(f"moelab.{paper}")
    rel = f"lib/moelab/{paper}/claims.py"
    assert rel not in cache.code_closure(lambda: (pkg.__name__, defs.CLAIMS))
    calls = []

    def compute():
        calls.append(1)
        return (pkg.__name__, len(defs.CLAIMS))

    cache.memo("claims-edit", {"paper": paper}, compute)
    real = cache._module_sha
    monkeypatch.setattr(cache, "_module_sha", lambda p: "0" * 16 if Path(p).as_posix().endswith(rel) else real(p))
    cache.memo("claims-edit", {"paper": paper}, compute)
    assert len(calls) == 1


def test_a_papers_claims_file_makes_no_folder_stale(tmp_path):
    """Staleness: ``lib/moelab/<paper>/claims.py`` is never a recorded source, and an old provenance that recorded
    one is not stale because of it; a paper's method file still is."""
    from moelab.runner import cli
    from moelab.mass import claims as mass_claims  # noqa: F401  (loaded, as at a run's finish())

    for paper in ("moce", "sba", "cluster_upcycling", "mass", "free_moe"):
        assert notebook_run.is_verdict_code(f"lib/moelab/{paper}/claims.py"), paper
    assert not notebook_run.is_verdict_code("lib/moelab/mass/method.py")
    assert not notebook_run.is_verdict_code("lib/moelab/mass/claims_extra.py")
    assert not notebook_run.is_verdict_code("lib/moelab/mass/sub/claims.py")
    hashed = notebook_run.source_hashes("04_mass")
    assert "lib/moelab/mass/claims.py" not in hashed and "lib/moelab/mass/__init__.py" in hashed
    real = {"lib/moelab/mass/__init__.py": hashed["lib/moelab/mass/__init__.py"]}
    prov = tmp_path / "provenance.json"
    prov.write_text(json.dumps({"source_digest": notebook_run.SOURCE_DIGEST,
                                "sources": {**real, "lib/moelab/mass/claims.py": "0" * 16}}))
    assert cli.sources_current(prov) == (True, [])
    prov.write_text(json.dumps({"source_digest": notebook_run.SOURCE_DIGEST,
                                "sources": {**real, "lib/moelab/mass/method.py": "0" * 16}}))
    assert cli.sources_current(prov) == (False, ["lib/moelab/mass/method.py"])

# ---- the code identity ignores what cannot change behaviour
_BASE = '''"""A module."""
import os
from math import pi, e  # constants


def area(r):
    """Area of a circle."""
    return pi * r ** 2  # the formula


class C:
    """A class."""

    def f(self):
        "short doc"
        return os.sep
'''


@pytest.mark.parametrize("edited, same", [
    (_BASE.replace("# the formula", "# pi r squared"), True),                      # a comment
    (_BASE.replace('"""Area of a circle."""', '"""Area of a disc, eq. (1)."""'), True),  # a docstring
    (_BASE.replace('"short doc"\n        ', ""), True),                              # a docstring removed
    (_BASE.replace("import os\nfrom math import pi, e", "from math import e, pi\nimport os"), True),  # import order
    (_BASE.replace("return pi * r ** 2", "return (pi * r**2)"), True),               # formatting
    (_BASE.replace("pi * r ** 2", "pi * r ** 3"), False),                            # an expression
    (_BASE.replace("return os.sep", "return os.pathsep"), False),                    # a name
    (_BASE.replace("def area(r):", "def area(radius):").replace("* r **", "* radius **"), False),  # an argument
    (_BASE + "\nX = 1\n", False),                                                  # a new statement
])
def test_source_digest_ignores_comments_docstrings_format_and_import_order(tmp_path, edited, same):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(_BASE)
    b.write_text(edited)
    assert edited != _BASE
    assert (cache.source_digest(a) == cache.source_digest(b)) is same


def test_a_function_of_only_a_docstring_stays_valid_and_differs_from_no_function(tmp_path):
    (tmp_path / "a.py").write_text('def f():\n    """doc"""\n')
    (tmp_path / "b.py").write_text("def f():\n    pass\n")
    (tmp_path / "c.py").write_text("")
    assert cache.source_digest(tmp_path / "a.py") == cache.source_digest(tmp_path / "b.py")
    assert cache.source_digest(tmp_path / "a.py") != cache.source_digest(tmp_path / "c.py")


def test_import_closure_keys_survive_comment_edits_and_change_when_closure_grows(tmp_path):
    lib = _write_pkg(tmp_path, {"__init__.py": "", "paper.py": "from moelab import core\n",
                                "core.py": "X = 1\n", "extra.py": "Y = 2\n"})
    before = cache.import_closure(["moelab.paper"], lib=lib)
    (lib / "core.py").write_text("# explained\nX = 1  # one\n")
    (lib / "paper.py").write_text('"""The paper."""\nfrom moelab import core  # the core\n')
    assert cache.import_closure(["moelab.paper"], lib=lib) == before
    (lib / "paper.py").write_text("from moelab import core, extra\n")  # the closure gains a module
    grown = cache.import_closure(["moelab.paper"], lib=lib)
    assert set(grown) == set(before) | {"moelab.extra"}
    digest = lambda c: cache.hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()
    assert digest(grown) != digest(before)


def test_version_is_part_of_the_key_and_must_be_plain(tmp_cache):
    calls = []
    compute = lambda: calls.append(1) or 7
    assert cache.memo("v", {"a": 1}, compute) == 7
    cache.memo("v", {"a": 1}, compute)
    cache.memo("v", {"a": 1}, compute, version=2)
    cache.memo("v", {"a": 1}, compute, version=2)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="version"):
        cache.memo("v", {"a": 1}, compute, version=[1])
    with pytest.raises(ValueError, match="reserved"):
        cache.memo("v", {"_version": 1}, compute)


def test_notebook_lambda_gets_the_modules_it_calls():
    """Functions defined in a notebook (no moelab __module__): globals, attribute chains, helpers, cells, objects."""
    ns = {}
    exec("import moelab\nfrom moelab import core\nfrom moelab.mass.data import GINCConfig\n"
         "f_core = lambda: core.routing.topk_route\n"
         "f_chain = lambda: moelab.suite.embed.pair_sets\n"
         "def helper():\n    return moelab.seed.seed_everything(0)\n"
         "f_helper = lambda: helper()\n"
         "def make(fn):\n    return lambda: fn()\n"
         "f_cell = make(lambda: None)\n"
         "cfg = GINCConfig()\n"
         "f_obj = lambda: cfg\n", ns)
    assert "lib/moelab/core/routing.py" in cache.code_closure(ns["f_core"])
    assert "lib/moelab/suite/embed.py" in cache.code_closure(ns["f_chain"])
    assert "lib/moelab/seed.py" in cache.code_closure(ns["f_helper"])
    assert cache.code_closure(ns["f_cell"]) == {}
    assert "lib/moelab/mass/data.py" in cache.code_closure(ns["f_obj"])
    assert "lib/moelab/mass/data.py" in cache.code_closure(lambda: GINCConfig.__name__)


def test_memo_key_changes_with_transitive_core_edit_not_with_claims_edit(tmp_cache, monkeypatch):
    calls = []

    def compute():
        calls.append(1)
        return (mass.__name__, claims.__name__)  # a notebook lambda using a paper module and verdict code

    real = cache._module_sha

    def edited(target):  # as if every file whose path contains ``target`` had been edited
        return lambda p: "0" * 16 if target in Path(p).as_posix() else real(p)

    cache.memo("k", {"a": 1}, compute)
    cache.memo("k", {"a": 1}, compute)
    assert len(calls) == 1
    monkeypatch.setattr(cache, "_module_sha", edited("/moelab/claims"))
    cache.memo("k", {"a": 1}, compute)
    assert len(calls) == 1  # changing how verdicts are computed never retrains
    monkeypatch.setattr(cache, "_module_sha", edited("/moelab/core/routing.py"))  # mass -> core -> layer -> routing
    cache.memo("k", {"a": 1}, compute)
    assert len(calls) == 2
    monkeypatch.setattr(cache, "_module_sha", real)
    monkeypatch.setattr(cache, "package_versions", lambda: {"torch": "9.9", "transformers": "1.0"})
    cache.memo("k", {"a": 1}, compute)
    assert len(calls) == 3


def test_artifact_records_its_code_and_rejects_reserved_keys(tmp_cache):
    def build(d):
        (d / "x").write_text(mass.__name__)

    path = cache.artifact("rec", {"a": 1}, build)
    meta = cache.read_marker(path)
    assert meta["code"] == cache.code_closure(build) and "lib/moelab/mass/__init__.py" in meta["code"]
    assert set(meta["config"]["_versions"]) >= {"torch", "transformers", "python"}
    with pytest.raises(ValueError, match="reserved"):
        cache.artifact("rec", {"_code": 1}, build)


def test_truncated_artifact_is_rebuilt(tmp_cache):
    calls = []

    def build(d):
        calls.append(1)
        (d / "big.bin").write_bytes(bytes(1000))

    p = cache.artifact("trunc", {"a": 1}, build)
    (p / "big.bin").write_bytes(bytes(10))
    assert cache.artifact("trunc", {"a": 1}, build) == p and len(calls) == 2
    assert (p / "big.bin").stat().st_size == 1000


def test_provenance_sources_use_the_digest_they_were_written_with(tmp_path):
    """Staleness compares lib modules by normalised digest under "ast-v1", and raw bytes in legacy provenance."""
    from moelab.runner import cli

    rels = ["lib/moelab/core/routing.py", "notebooks/00_moe_primer.py"]
    assert notebook_run.source_id(rels[0]) == cache.source_digest(ROOT / rels[0])
    assert notebook_run.source_id(rels[1]) == notebook_run.file_sha(ROOT / rels[1])  # the narrative is published: its bytes
    with pytest.raises(ValueError, match="unknown source digest"):
        notebook_run.source_id(rels[0], "ast-v0")
    prov = tmp_path / "provenance.json"
    for kind in (None, notebook_run.SOURCE_DIGEST):
        sources = {r: notebook_run.source_id(r, kind) for r in rels}
        prov.write_text(json.dumps({"sources": sources, **({"source_digest": kind} if kind else {})}))
        assert cli.sources_current(prov) == (True, [])
        prov.write_text(json.dumps({"sources": {**sources, rels[0]: "0" * 16},
                                    **({"source_digest": kind} if kind else {})}))
        assert cli.sources_current(prov) == (False, [rels[0]])
    legacy = {rels[0]: cache.source_digest(ROOT / rels[0])}  # a digest read as raw bytes does not match
    prov.write_text(json.dumps({"sources": legacy}))
    assert cli.sources_current(prov)[0] is False


def test_rekey_moves_an_entry_keyed_under_older_rules_to_its_current_key(tmp_cache):
    """An entry built when ``lib/moelab/__init__.py`` and ``profiles.py`` were still part of keys (planted: the same
    entry with those paths added to its recorded closure and stored under the key that closure gave) is found again
    after ``cache.rekey()``, without rebuilding; an entry whose recorded key does not match its folder is left alone,
    and one whose kept modules differ moves to a key that no current step asks for."""
    calls = []

    def compute():
        calls.append(1)
        return {"w": 3}

    assert cache.memo("toy", {"n": 1}, compute) == {"w": 3} and calls == [1]
    (current,) = (tmp_cache / "artifacts" / "toy").iterdir()
    meta = cache.read_marker(current)
    old_code = {**meta["code"], "lib/moelab/__init__.py": "aaaa", "lib/moelab/profiles.py": "bbbb"}
    old_cfg = {**meta["config"], "_code": cache._code_digest(old_code)}
    old = current.parent / cache.key(old_cfg)
    current.rename(old)
    (old / "config.json").write_text(json.dumps(old_cfg, sort_keys=True, indent=1))
    cache.write_marker(old, {**meta, "config": old_cfg, "code": old_code})
    # a second planted entry whose recorded closure differs in a module that is still keyed: never matched
    stale_code = {**old_code, "lib/moelab/core/routing.py": "cccc"}
    stale_cfg = {**meta["config"], "n": 2, "_code": cache._code_digest(stale_code)}
    stale = current.parent / cache.key(stale_cfg)
    shutil.copytree(old, stale)
    cache.write_marker(stale, {**meta, "config": stale_cfg, "code": stale_code})
    # and one whose marker does not match its folder name: left as it is
    odd = current.parent / "0123456789abcdef"
    shutil.copytree(old, odd)

    assert cache.rekey(dry_run=True) and old.exists()
    moved = cache.rekey()
    assert ("toy", old.name, current.name) in moved and not old.exists() and odd.exists()
    assert cache.memo("toy", {"n": 1}, compute) == {"w": 3} and calls == [1]      # reused, not rebuilt
    marker = cache.read_marker(current)
    assert marker["rekeyed"]["from"] == old.name
    assert marker["rekeyed"]["dropped"] == ["lib/moelab/__init__.py", "lib/moelab/profiles.py"]
    assert cache.entry_problems(current, hashes=True) == []
    assert json.loads((current / "config.json").read_text()) == meta["config"]
    assert any(o == stale.name for _, o, _ in moved)   # moved too, to a key no current step asks for
    assert cache.rekey() == []                          # nothing left to move


def test_rekey_keeps_a_config_json_the_builder_wrote(tmp_cache):
    """A builder that saves a Hugging Face model writes its own ``config.json`` over the cache's record of the key;
    re-keying must leave that file as the builder wrote it (the model cannot load without it)."""
    model_cfg = {"model_type": "vit", "hidden_size": 64}

    def build(tmp):
        (tmp / "config.json").write_text(json.dumps(model_cfg))
        (tmp / "weights.bin").write_bytes(b"0123")

    path = cache.artifact("toy_model", {"n": 1}, build)
    meta = cache.read_marker(path)
    old_code = {**meta["code"], "lib/moelab/__init__.py": "aaaa"}
    old_cfg = {**meta["config"], "_code": cache._code_digest(old_code)}
    old = path.parent / cache.key(old_cfg)
    path.rename(old)
    cache.write_marker(old, {**meta, "config": old_cfg, "code": old_code})
    assert cache.rekey() == [("toy_model", old.name, path.name)]
    assert json.loads((path / "config.json").read_text()) == model_cfg
    assert cache.entry_problems(path, hashes=True) == []
    assert cache.artifact("toy_model", {"n": 1}, lambda tmp: pytest.fail("rebuilt")) == path


def test_reuse_of_an_entry_built_by_this_process_is_not_counted_as_warm(tmp_cache, monkeypatch):
    before = cache.usage()
    cache.memo("own_step", {"n": 1}, lambda: 1)           # built here
    cache.memo("own_step", {"n": 1}, lambda: 1)           # asked for again by the same process
    monkeypatch.setattr(cache, "_BUILT_HERE", set())      # as another process (a later run) would see it
    cache.memo("own_step", {"n": 1}, lambda: 1)
    now = cache.usage()
    assert {k: now[k] - before[k] for k in ("built", "reused_own", "reused")} == {"built": 1, "reused_own": 1,
                                                                                   "reused": 1}
