"""Code instructions from the Python standard library: "write a function that <docstring>" -> the function.

Real code with real docstrings (the interpreter's own ``Lib/``, via ``moelab.assets.stdlib_dir``), parsed with
``ast``: public top-level functions with a docstring, 3-40 source lines, no decorators, from non-test modules.
The split is by module (a seeded hash of the module path), so held-out functions come from modules never
seen in training. HumanEval stays held out for evaluation (dedup in ``instruct``).
A file that fails to parse is skipped and recorded (``skipped`` in the returned stats), never fatal.
Used by the MoCE notebook 01 (code domain) and ``embed`` (docstring/code pairs).
"""
from __future__ import annotations

import ast
import zlib
from pathlib import Path

from moelab import assets, cache

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "site-packages",
              "__pycache__", "pydoc_data", "encodings"}


def _signature(fn: ast.FunctionDef) -> str:
    return f"{fn.name}({ast.unparse(fn.args)})"


def functions_from_source(src: str, module: str) -> list[dict]:
    """Eligible functions of one module's source: ``dict(module, name, signature, doc, code)``.

    Raises ``ValueError`` naming the module if the source does not parse.
    """
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"malformed Python source in module {module!r}: {e}") from None
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20:
            continue
        n_lines = node.end_lineno - node.lineno + 1
        if not 3 <= n_lines <= 40:
            continue
        code = ast.get_source_segment(src, node)
        if not code:
            continue
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        out.append(dict(module=module, name=node.name, signature=_signature(node), doc=summary, code=code))
    return out


def stdlib_functions(root: Path | None = None) -> tuple[list[dict], dict]:
    """All eligible stdlib functions, sorted by (module, name); plus stats ``{files, skipped: [..]}``.

    Cached by (root, Python version) with ``moelab.cache.memo``.
    """
    import sys

    if root is None:
        root = assets.stdlib_dir()
    root = Path(root)
    return cache.memo("stdlib_functions", dict(root=str(root), python=sys.version, version=1),
                      lambda: _scan(root))


def _scan(root: Path) -> tuple[list[dict], dict]:
    out, skipped, files = [], [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if set(rel.parts[:-1]) & _SKIP_DIRS or rel.name.startswith("test_"):
            continue
        files += 1
        module = ".".join(rel.with_suffix("").parts)
        try:
            src = p.read_text(encoding="utf-8")
            out.extend(functions_from_source(src, module))
        except (ValueError, UnicodeDecodeError) as e:
            skipped.append(f"{module}: {str(e)[:120]}")
    return out, {"files": files, "skipped": skipped}


def module_split(module: str, seed: int = 0) -> str:
    """``train`` / ``validation`` / ``test`` by a seeded hash of the module name (80/10/10 of modules)."""
    h = zlib.crc32(f"{seed}:{module}".encode()) % 10
    return "test" if h == 0 else "validation" if h == 1 else "train"


def as_instruction(fn: dict) -> dict:
    """The instruction record for one function."""
    doc = fn["doc"].rstrip(".")
    return dict(instruction=f"Write a Python function `{fn['signature']}` that does the following: {doc}.",
                answer=fn["code"], domain="code", source="python-stdlib", task=f"stdlib:{fn['module']}")
