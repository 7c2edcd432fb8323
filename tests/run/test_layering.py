"""The architecture in STYLE.md ("one package per paper, one shared core"): no paper package imports another paper's
package; nothing below the paper packages (core, suite, stats, claims engine, train, ...) imports a paper package; the
claims engine (``moelab.claims``) reaches no paper package by any route (import, run layer, or a table of module
names); and every ``moelab`` import sits at the top of its module. Checked on the source with ``ast`` (every import
statement, including those inside functions, and ``importlib.import_module("...")`` with a literal name), so it also
holds for code paths no other test runs; each check is shown to fail on a planted violation. Also: the names that moved
into the core / ``moelab.stats`` still import from their old modules."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import ROOT

LIB = ROOT / "lib" / "moelab"

# paper -> its top-level modules (a module may later become a package of the same name: lib/moelab/<name>/)
PAPERS = {"00": ("primer",), "01": ("moce",), "02": ("sba",), "03": ("cluster_upcycling",), "04": ("mass",),
          "05": ("free_moe",)}
PAPER_OF = {name: paper for paper, names in PAPERS.items() for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, modname: str, is_package: bool) -> set[str]:
    """Absolute names of every module ``source`` imports (``from a import b`` yields ``a`` and ``a.b``: b may be a
    submodule), relative imports resolved against ``modname``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = modname.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return out


def paper_of(module: str) -> str | None:
    """The paper a ``moelab.<name>...`` module belongs to, or None for shared code and third-party modules."""
    parts = module.split(".")
    return PAPER_OF.get(parts[1]) if len(parts) > 1 and parts[0] == "moelab" else None


def violations(path: Path, source: str | None = None) -> list[str]:
    """Layering violations of one file of lib/moelab (``source`` overrides the file's text, for the self-test)."""
    modname = module_name(path)
    own = paper_of(modname)
    src = path.read_text() if source is None else source
    bad = []
    for mod in sorted(imported_modules(src, modname, path.name == "__init__.py")):
        other = paper_of(mod)
        if other is not None and other != own:
            kind = f"paper {own} module" if own else "shared module"
            bad.append(f"{modname} ({kind}) imports {mod} (paper {other})")
    return bad


def lib_files():
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_layout_is_what_this_test_knows():
    """Every paper module named above exists, so a rename cannot silently switch the check off."""
    for name in PAPER_OF:
        assert (LIB / f"{name}.py").is_file() or (LIB / name / "__init__.py").is_file(), name
    assert len(lib_files()) > 30


@pytest.mark.parametrize("path", lib_files(), ids=lambda p: str(p.relative_to(LIB)))
def test_no_import_across_papers_or_upwards(path):
    assert violations(path) == []


def test_the_check_can_fail():
    """The checker flags the imports an earlier version had, a shared module importing a paper module, a relative
    import inside a future paper package, and a dynamic import with a literal name; it allows same-paper imports."""
    sba, core = LIB / "sba.py", LIB / "core" / "init.py"
    assert violations(sba, "def f():\n    from moelab.cluster_upcycling import ClusterAwareInit\n")
    assert violations(sba, "from moelab import cluster_upcycling\n")
    assert violations(sba, "import importlib\nimportlib.import_module('moelab.mass')\n")
    assert violations(core, "from moelab.moce import find_knee\n")
    assert violations(LIB / "stats.py", "import moelab.free_moe as fm\n")
    pkg = LIB / "cluster_upcycling" / "method.py"          # not there yet: a package in the STYLE.md shape
    assert violations(pkg, "from ..sba import pair_geometry\n") == [
        "moelab.cluster_upcycling.method (paper 03 module) imports moelab.sba (paper 02)",
        "moelab.cluster_upcycling.method (paper 03 module) imports moelab.sba.pair_geometry (paper 02)"]
    assert violations(pkg, "from .data import load\nfrom moelab.core import moeify\n") == []
    assert violations(LIB / "mass" / "claims.py", "from moelab.mass import frontier\n") == []
    assert violations(LIB / "mass" / "claims.py", "from moelab.sba import routing_jsd\n")
    assert violations(LIB / "primer" / "claims.py", "from moelab.mass import frontier\n")



# ---------------------------------------------------------------- the claims engine sits below the paper packages
# The run layer sits on top of the paper packages; the engine must not import it.
RUN_LAYER = ("moelab.runner",)
# Not engine code: `python -m moelab.claims` (an entry script) and the registry, the one module that holds the
# notebook -> claim definitions table (module names) and imports a definitions module by name when it is needed
# (issue 47, item 12: the claims package finds the definitions itself).
CLAIMS_ENTRY_SCRIPTS = {"moelab.claims.__main__", "moelab.claims.registry"}
_PAPER_NAME_RE = re.compile(r"\bmoelab\.(%s)\b" % "|".join(sorted(PAPER_OF)))


def _docstring_nodes(tree) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def claims_engine_violations(path: Path, source: str | None = None) -> list[str]:
    """How a module of ``moelab.claims`` reaches a paper package: an import of one (or of the run layer, which imports
    them all), or a string naming one outside a docstring (a table of module names is an import by another route)."""
    modname = module_name(path)
    if not modname.startswith("moelab.claims") or modname in CLAIMS_ENTRY_SCRIPTS:
        return []
    src = path.read_text() if source is None else source
    bad = []
    for mod in sorted(imported_modules(src, modname, path.name == "__init__.py")):
        if paper_of(mod) is not None or any(mod == r or mod.startswith(r + ".") for r in RUN_LAYER):
            bad.append(f"{modname} imports {mod}")
    tree = ast.parse(src)
    docs = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                and _PAPER_NAME_RE.search(node.value)):
            bad.append(f"{modname} names a paper module in a string: {node.value!r}")
    return bad


def claims_files():
    return [p for p in lib_files() if p.is_relative_to(LIB / "claims")]


@pytest.mark.parametrize("path", claims_files(), ids=lambda p: str(p.relative_to(LIB)))
def test_the_claims_engine_imports_no_paper_package(path):
    assert claims_engine_violations(path) == []


def test_the_claims_check_can_fail():
    """Planted violations: a static, a relative-looking, a dynamic and a by-name (string table) route into a paper
    package, and an import of the run layer; the entry script and docstrings may name them."""
    rebuild, engine, main = LIB / "claims" / "rebuild.py", LIB / "claims" / "engine.py", LIB / "claims" / "__main__.py"
    assert claims_engine_violations(rebuild, "from moelab.mass import claims\n")
    assert claims_engine_violations(engine, "from moelab import free_moe\n")
    assert claims_engine_violations(rebuild, "import importlib\nimportlib.import_module('moelab.sba.claims')\n")
    assert claims_engine_violations(rebuild, 'TABLE = {"04_mass": "moelab.mass.claims"}\n')
    assert claims_engine_violations(rebuild, "from moelab.runner.notebook_run import CLAIM_DEFS\n")
    assert claims_engine_violations(rebuild, '"""Definitions: ``moelab.mass.claims``."""\nimport json\n') == []
    assert claims_engine_violations(rebuild, "from moelab.stats import t_interval\nfrom .engine import Claim\n") == []
    assert claims_engine_violations(main, "from moelab.runner.notebook_run import claim_defs\n") == []
    assert len(claims_files()) >= 5 and LIB / "claims" / "registry.py" in claims_files()
    assert claims_engine_violations(LIB / "claims" / "registry.py") == []   # the table's one home


def test_paper_packages_do_not_load_their_claims():
    """A paper's ``claims.py`` is loaded by the runner or a rebuild, never by its package's ``__init__``."""
    for name in PAPER_OF:
        init = LIB / name / "__init__.py"
        if init.is_file():
            mods = imported_modules(init.read_text(), f"moelab.{name}", True)
            assert f"moelab.{name}.claims" not in mods, name

# ---------------------------------------------------------------- names that moved still import from the old modules
def test_shared_names_a_paper_package_exports_are_the_shared_objects():
    """A name a paper package still exports that ``moelab.core`` / ``moelab.core.cluster_init`` / ``moelab.stats``
    define is that very object (one definition, re-exported), never a copy; the claim definitions use the shared
    ones too."""
    from moelab import cluster_upcycling, core, free_moe, mass, moce, sba, stats
    from moelab.core import cluster_init, similarity

    shared = {}
    for mod in (core, cluster_init, similarity, stats):
        for name in dir(mod):
            if not name.startswith("_") and callable(getattr(mod, name)):
                shared.setdefault(name, getattr(mod, name))
    checked = 0
    for pkg in (cluster_upcycling, free_moe, mass, moce, sba):
        for name, obj in shared.items():
            if name in getattr(pkg, "__all__", dir(pkg)) and hasattr(pkg, name):
                assert getattr(pkg, name) is obj, f"{pkg.__name__}.{name} is not {obj.__module__}.{name}"
                checked += 1
    assert checked >= 1, checked       # the check ran on real re-exports
    from moelab.mass.claims import elbow_max_chord, frontier  # noqa: F401  (the claims use these)
    assert elbow_max_chord is stats.elbow_max_chord and frontier is mass.frontier


# a package's own lazy entry point: `import moelab` stays cheap (no torch, no claims) until a notebook starts a run
LAZY_ALLOWED = {("moelab", "start_run")}


def function_local_moelab_imports(source: str, modname: str) -> list[str]:
    """``function: import`` for every moelab import (absolute or relative) inside a function body."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (modname, fn.name) not in LAZY_ALLOWED:
            for n in ast.walk(fn):
                if (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("moelab"))
                        or isinstance(n, ast.Import) and any(a.name.startswith("moelab") for a in n.names)):
                    out.append(f"{modname}.{fn.name}: line {n.lineno}")
    return out


def test_moelab_imports_sit_at_the_top_of_their_module():
    """STYLE.md: a reader sees a module's dependencies in its first lines."""
    bad = [v for p in lib_files() for v in function_local_moelab_imports(p.read_text(), module_name(p))]
    assert not bad, "move these moelab imports to the top of their module:\n" + "\n".join(bad)


def test_the_local_import_check_catches_one():
    src = "import os\n\ndef f():\n    from moelab import assets\n    from .x import y\n    return os\n"
    assert len(function_local_moelab_imports(src, "moelab.suite.demo")) == 2
    assert function_local_moelab_imports("def start_run():\n    from moelab.runner.notebook_run import R\n", "moelab") == []


# ---------------------------------------------------------------- the run layer sits on top
# who may import moelab.runner: the runner itself, `moelab.start_run` (the top package's lazy entry point) and the
# claims CLI (an entry script that takes the definitions table from the run layer)
RUN_LAYER_IMPORTERS = {"moelab", "moelab.claims.__main__"}


def run_layer_violations(path: Path, source: str | None = None) -> list[str]:
    """Imports of the run layer (``moelab.runner``) from below it: a paper package or a shared service."""
    modname = module_name(path)
    if modname in RUN_LAYER_IMPORTERS or modname == "moelab.runner" or modname.startswith("moelab.runner."):
        return []
    src = path.read_text() if source is None else source
    return [f"{modname} imports {mod}" for mod in sorted(imported_modules(src, modname, path.name == "__init__.py"))
            if any(mod == r or mod.startswith(r + ".") for r in RUN_LAYER)]


def test_nothing_below_the_run_layer_imports_it():
    bad = [v for p in lib_files() for v in run_layer_violations(p)]
    assert not bad, "the run layer (moelab.runner) sits on top; these import it from below:\n" + "\n".join(bad)


def test_the_run_layer_check_can_fail():
    assert run_layer_violations(LIB / "mass" / "experiment.py", "from moelab.runner.notebook_run import REPO_ROOT\n")
    assert run_layer_violations(LIB / "stats.py", "import moelab.runner.cli\n")
    assert run_layer_violations(LIB / "runner" / "cli.py", "from moelab.runner.notebook_run import REPO_ROOT\n") == []
    assert (LIB / "runner" / "__main__.py").is_file() and not (LIB / "notebooks.py").exists()
