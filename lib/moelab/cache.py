"""One cache directory for assets, derived data and trained artifacts.

``MOELAB_CACHE`` overrides the location (default ``~/.cache/moelab``). Every entry is a directory written into a
temporary sibling and renamed into place only when its builder finished; a ``.complete`` marker (with the metadata
that keyed it and the size and sha256 of every file in the entry) is written last. So an interrupted download or
build never leaves an entry that later looks valid: :func:`is_complete` is false for it and the next call rebuilds
it, and a file truncated afterwards is caught by :func:`entry_problems`.

Cache faults:

- a read-only cache raises :class:`CacheNotWritable`, which says how to point ``MOELAB_CACHE`` elsewhere; reading a
  complete read-only cache needs no write;
- the temporary folder of a killed build (``.<name>.tmp-<host>-<pid>-<random>``) is removed by the next process that
  uses the cache once its creating process is dead (or, for a folder whose creator cannot be checked, after
  :data:`STALE_TMP_AGE_S`);
- entries are created with the permissions the umask allows (not ``tempfile.mkdtemp``'s 0700), so a cache shared by
  a group can be read by the group.

Keys that cover the code: :func:`artifact` and :func:`memo` key an entry by its configuration,
the versions of the numeric packages, and :func:`code_closure` of the builder: the sha256 of every ``moelab`` module
the builder can execute (its module and, transitively, every ``moelab`` module that module imports; for a notebook
lambda, the ``moelab`` modules, functions, classes and objects it refers to). Verdict and report code
(:data:`NOT_IN_KEYS`) is never part of a key, so changing how a claim is judged never retrains anything.
"""
from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import secrets
import shutil
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

MARKER = ".complete"
FORMAT = 2  # storage format of artifact entries; part of every key (bump it when the stored layout changes)
STALE_TMP_AGE_S = 6 * 3600  # a temporary folder whose creator cannot be checked is stale after this age
WRITABLE_HINT = "set MOELAB_CACHE to a writable folder, e.g. export MOELAB_CACHE=~/moelab-cache"
# Modules whose code never enters a key: verdicts, reports, the notebook runner and provenance, the progress bar, the
# profile names and their messages, and the cache itself (its storage format is FORMAT). A module named ``report`` or
# ``claims`` in any package (a paper's report code and claim definitions) is left out too: NOT_IN_KEYS_LEAVES; so is
# the top package's ``__init__`` (``start_run`` and lazy attribute access): NOT_IN_KEYS_EXACT.
NOT_IN_KEYS = ("moelab.claims", "moelab.runner", "moelab.cache", "moelab.progress", "moelab.profiles")
NOT_IN_KEYS_LEAVES = ("report", "claims")
NOT_IN_KEYS_EXACT = ("moelab",)
KEY_PACKAGES = ("torch", "transformers", "numpy")  # their versions are part of every artifact key
LIB = Path(__file__).resolve().parent  # the moelab package folder
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
_TMP_TAG = ".tmp-"
_swept: set[Path] = set()


class CacheNotWritable(PermissionError):
    """The cache directory cannot be written (read-only file system or no permission); the message says what to do."""

    def __init__(self, root: Path, detail: str = ""):
        self.root = Path(root)
        super().__init__(f"cache directory {root} is not writable{' (' + detail + ')' if detail else ''}; "
                         f"{WRITABLE_HINT}")


class CorruptCacheEntry(RuntimeError):
    """A finished cache entry whose files no longer match what was recorded when it was built."""

    def __init__(self, path: Path, problems: list[str], command: str = ""):
        self.path, self.problems = Path(path), list(problems)
        # raised only where the entry cannot be invalidated in place (a read-only cache): deleting it is not possible
        # either, so the fix is another, writable cache that rebuilds the entry
        todo = (f"this cache cannot be written, so the entry cannot be rebuilt in place: {WRITABLE_HINT} and run "
                + (command if command else "again") + " (the owner of a writable copy may instead delete the entry)")
        super().__init__(f"cache entry {path} is corrupt ({'; '.join(problems)}); {todo}")


def _configured_root() -> Path:
    return Path(os.environ.get("MOELAB_CACHE") or Path.home() / ".cache" / "moelab").expanduser()


@contextlib.contextmanager
def writing():
    """Turn a permission or read-only-file-system error inside the block into :class:`CacheNotWritable`."""
    try:
        yield
    except CacheNotWritable:
        raise
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise CacheNotWritable(_configured_root(), f"{e.strerror}: {e.filename}") from e
        raise


def cache_root() -> Path:
    """The cache directory (``$MOELAB_CACHE`` or ``~/.cache/moelab``), created on first use.

    The first call per process (per root) also removes the temporary folders of killed builds (:func:`sweep_stale`).
    """
    root = _configured_root()
    if not root.is_dir():
        with writing():
            root.mkdir(parents=True, exist_ok=True)
    if root not in _swept:
        _swept.add(root)
        sweep_stale(root)
    return root


# ---------------------------------------------------------------- temporary folders, permissions, stale builds
def umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # portable fallback: read by setting and restoring
    os.umask(old)
    return old


def tmp_path(parent: Path, name: str) -> Path:
    """A fresh name ``parent/.<name>.tmp-<host>-<pid>-<random>`` for a temporary file or folder of this process."""
    return Path(parent) / f".{name}{_TMP_TAG}{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"


def make_tmp_dir(parent: Path, name: str) -> Path:
    """Create a temporary folder next to ``parent/name`` (owner and pid in its name, permissions from the umask)."""
    with writing():
        Path(parent).mkdir(parents=True, exist_ok=True)
        while True:
            p = tmp_path(parent, name)
            try:
                p.mkdir()  # mode 0o777 & ~umask, unlike tempfile.mkdtemp's 0700
                return p
            except FileExistsError:  # pragma: no cover - 32 random bits collided
                continue


def share_like_umask(top: Path) -> None:
    """Give ``top`` and everything under it the permissions the umask allows (executable files stay executable).

    Writers such as ``tempfile`` or safetensors create 0600 files; a cache shared by a group needs them readable.
    """
    mask = umask()
    for d, dirs, files in os.walk(top):
        os.chmod(d, 0o777 & ~mask)
        for f in files:
            p = os.path.join(d, f)
            mode = os.lstat(p).st_mode
            if not os.path.islink(p):
                os.chmod(p, (0o777 if mode & 0o111 else 0o666) & ~mask)


def _tmp_owner(name: str) -> tuple[str, int] | None:
    """(host tag, pid) encoded in a temporary name by :func:`tmp_path`, or None for an older or foreign name."""
    tail = name.rsplit(_TMP_TAG, 1)[-1].split("-")
    if len(tail) == 3 and len(tail[0]) == 6 and tail[1].isdigit():
        return tail[0], int(tail[1])
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_stale_tmp(path: Path, now: float | None = None) -> bool:
    """True for a temporary folder/file left by a build that can no longer finish.

    Created on this host: stale when its creating process is dead (a build in progress elsewhere is never touched).
    Created on another host or by an older version (no owner in the name): stale after :data:`STALE_TMP_AGE_S`.
    """
    owner = _tmp_owner(Path(path).name)
    if owner is not None and owner[0] == _HOST:
        return owner[1] != os.getpid() and not _pid_alive(owner[1])
    try:
        age = (now or time.time()) - Path(path).lstat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TMP_AGE_S


def sweep_stale(root: Path, name: str | None = None) -> list[Path]:
    """Remove stale temporary folders/files (:func:`is_stale_tmp`) at depth 1-3 under ``root`` (or only those of
    entry ``name`` directly in ``root``); returns what was removed. Never fails (a read-only cache keeps them)."""
    root = Path(root)
    patterns = [f".{name}{_TMP_TAG}*"] if name else [f"{d}.*{_TMP_TAG}*" for d in ("", "*/", "*/*/")]
    removed = []
    for pat in patterns:
        for p in root.glob(pat):
            if not is_stale_tmp(p):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
            if not p.exists():
                removed.append(p)
    return removed


# ---------------------------------------------------------------- entries
def key(config: Any) -> str:
    """A stable 16-hex-digit key for a JSON-able configuration (dict order does not matter)."""
    try:
        blob = json.dumps(config, sort_keys=True, default=_json_default)
    except TypeError as e:
        raise ValueError(f"cache key config is not JSON-able: {e}") from None
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"object of type {type(o).__name__} is not JSON-able")


def is_complete(path: Path) -> bool:
    """True if ``path`` is a finished cache entry."""
    return (Path(path) / MARKER).is_file()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def file_record(folder: Path) -> dict:
    """``{relative path: {"size", "sha256"}}`` of every file under ``folder`` except the marker."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MARKER}


# files up to this size are identified by their content (sha256); larger ones (checkpoint shards) by size and
# modification time, which a copy or a rewrite changes, so identifying a 13 GB checkpoint costs no read
CONTENT_HASH_MAX = 64 << 20


def path_identity(path, content_hash_max: int = CONTENT_HASH_MAX) -> dict:
    """The identity of a user-given model or data path, for cache keys and staleness records (issue 51): the resolved
    path and a digest over every file under it (a file: itself), each by content when at most ``content_hash_max``
    bytes, else by size and modification time. Changing a weight, a data row or the file set changes the digest, so
    an entry built from another model or data of the same shape is never reused. ``None`` -> ``None``.

    Raises ``FileNotFoundError`` naming a path that does not exist (the notebooks' loaders check first, with the
    parameter to pass)."""
    if path is None:
        return None
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise FileNotFoundError(f"path_identity: {root} does not exist")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        name = f.name if f == root else str(f.relative_to(root))
        ident = sha256_file(f) if st.st_size <= content_hash_max else f"{st.st_size}:{st.st_mtime_ns}"
        h.update(f"{name}\0{st.st_size}\0{ident}\n".encode())
    return {"path": str(root), "files": len(files), "digest": h.hexdigest()[:16]}


def read_marker(path: Path) -> dict:
    """The metadata in an entry's ``.complete`` marker ({} for an empty or unreadable marker)."""
    try:
        data = json.loads((Path(path) / MARKER).read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_marker(path: Path, meta: dict, record: bool = True) -> None:
    """Write ``path``'s ``.complete`` marker: ``meta`` plus creation time and (``record``) its file record."""
    data = {"created": time.time(), **meta}
    if record:
        data["files"] = file_record(path)
    tmp = tmp_path(path, MARKER)
    with writing():
        tmp.write_text(json.dumps(data, default=str))
        os.replace(tmp, Path(path) / MARKER)  # a reader never sees a half-written marker


def _safetensors_problem(p: Path) -> str | None:
    """Structural check of a safetensors file: 8-byte header length + JSON header + the data it describes."""
    size = p.stat().st_size
    try:
        with open(p, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 + n:
                return f"{p.name}: truncated header ({size} bytes)"
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return f"{p.name}: unreadable header ({type(e).__name__}: {e})"
    if size != 8 + n + end:
        return f"{p.name}: {size} bytes, its header describes {8 + n + end}"
    return None


def entry_problems(path: Path, hashes: bool = False) -> list[str]:
    """What is wrong with a finished entry's files: missing or resized files (always), changed contents (``hashes``).

    Uses the file record written at creation; an entry made before records existed gets structural checks instead
    (safetensors header against file size; with ``hashes``, every JSON file parses).
    """
    path = Path(path)
    files = read_marker(path).get("files")
    problems = []
    if files is None:
        for p in sorted(path.rglob("*.safetensors")):
            if (msg := _safetensors_problem(p)) is not None:
                problems.append(msg)
        if hashes:
            for p in sorted(path.rglob("*.json")):
                if p.name == MARKER:
                    continue
                try:
                    json.loads(p.read_bytes())
                except (OSError, ValueError) as e:
                    problems.append(f"{p.relative_to(path)}: not valid JSON ({e})")
        return problems
    for rel, rec in files.items():
        p = path / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != rec["size"]:
            problems.append(f"{rel}: {p.stat().st_size} bytes, recorded {rec['size']}")
        elif hashes and sha256_file(p) != rec["sha256"]:
            problems.append(f"{rel}: sha256 differs from the one recorded when it was built")
    return problems


def invalidate(path: Path, problems: list[str], command: str = "") -> None:
    """Mark a corrupt entry as unfinished (its marker removed) so the next build replaces it; where the cache cannot
    be written, raise :class:`CorruptCacheEntry` saying to point ``MOELAB_CACHE`` at a writable folder and which
    command to run."""
    try:
        (Path(path) / MARKER).unlink(missing_ok=True)
    except OSError as e:
        raise CorruptCacheEntry(path, problems, command) from e
    print(f"[moelab.cache] {path} is corrupt ({'; '.join(problems)}); rebuilding it", file=sys.stderr)


@contextlib.contextmanager
def atomic_dir(path: Path, meta: dict | None = None):
    """Yield a temporary directory that becomes ``path`` only if the block succeeds.

    On an exception the temporary directory is removed and ``path`` is left as it was. An existing
    incomplete entry at ``path`` (from an earlier crash) is replaced. The marker records ``meta`` and the size and
    sha256 of every file; permissions follow the umask; stale temporary siblings of ``path`` are removed first.
    """
    path = Path(path)
    if path.parent.is_dir():
        sweep_stale(path.parent, path.name)
    tmp = make_tmp_dir(path.parent, path.name)
    try:
        yield tmp
        with writing():
            write_marker(tmp, meta or {})
            share_like_umask(tmp)
            if path.exists():
                if is_complete(path):  # built concurrently by someone else: keep theirs
                    shutil.rmtree(tmp, ignore_errors=True)
                    return
                shutil.rmtree(path)
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def adopt_entries(src: Path, dst: Path) -> int:
    """Copy every complete entry ``<kind>/<key>`` of the artifact folder ``src`` into ``dst`` where ``dst`` has no
    complete entry of that name, and return how many it copied. A cold run (``python -m moelab.runner run --cold``)
    builds into an empty cache of its own; its entries then serve later warm runs. Each entry lands whole through
    :func:`atomic_dir`, with its marker's metadata (creation time, config, code) kept."""
    n = 0
    for entry in sorted(Path(src).glob("*/*")):
        target = Path(dst) / entry.parent.name / entry.name
        if entry.name.startswith(".") or not is_complete(entry) or is_complete(target):
            continue
        with atomic_dir(target, read_marker(entry)) as tmp, writing():
            shutil.copytree(entry, tmp, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MARKER))
        n += 1
    return n


# ---------------------------------------------------------------- keys that cover the code
def _excluded(module: str) -> bool:
    return module in NOT_IN_KEYS_EXACT or module.rsplit(".", 1)[-1] in NOT_IN_KEYS_LEAVES or any(
        module == m or module.startswith(m + ".") for m in NOT_IN_KEYS)


def _module_index(lib: Path = LIB) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the package rooted at ``lib``."""
    return {_dotted(Path(lib.name) / f.relative_to(lib)): f for f in sorted(lib.rglob("*.py"))}


def _dotted(rel: Path) -> str:
    """``moelab/core/routing.py`` -> ``moelab.core.routing``; ``moelab/__init__.py`` -> ``moelab``."""
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=4096)
def _parse_imports(path: str, sha: str, module: str, is_pkg: bool) -> frozenset[str]:
    """Dotted names a module imports (any depth, function-local imports included) or reaches as attributes of an
    imported package (``moelab.suite.embed.x`` after ``import moelab``). Memoised per file content (``sha``)."""
    tree = ast.parse(Path(path).read_text(), filename=path)
    package = module if is_pkg else module.rpartition(".")[0]
    names, bound = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names.add(a.name)
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names.add(base)
            for a in node.names:
                names.add(f"{base}.{a.name}")  # a submodule, or an attribute (dropped if not a module)
                bound[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):  # attribute chains on imported names: pkg.sub.mod.func -> pkg.sub.mod (and prefixes)
        if isinstance(node, ast.Attribute):
            chain, n = [], node
            while isinstance(n, ast.Attribute):
                chain.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id in bound:
                names.add(".".join([bound[n.id], *reversed(chain)]))
    return frozenset(names)


def _resolve(name: str, index: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is a module in ``index``."""
    while name:
        if name in index:
            return name
        name = name.rpartition(".")[0]
    return None


class _Normalise(ast.NodeTransformer):
    """Drop what cannot change behaviour: string statements (docstrings, bare strings) and the order of imports
    within a run of import statements (and of the names one statement imports). Comments and formatting are not in
    the AST at all; names, constants and structure stay."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.AST):
                continue
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]
            out, run = [], []
            for s in kept + [None]:
                if isinstance(s, (ast.Import, ast.ImportFrom)):
                    s.names.sort(key=lambda a: (a.name, a.asname or ""))
                    run.append(s)
                    continue
                out += sorted(run, key=ast.dump)
                run = []
                if s is not None:
                    out.append(s)
            setattr(node, field, out or ([ast.Pass()] if field == "body" else []))
        return node


_DIGESTS: dict[str, str] = {}  # raw sha -> normalised digest (the file is read every time; only parsing is memoised)


def source_digest(path: Path) -> str:
    """16-hex-digit identity of a Python source's behaviour: sha256 of its normalised AST (:class:`_Normalise`:
    docstrings, comments, formatting and import order removed). The code part of every cache key and of the
    figure folders' staleness check, so that fixing a comment or moving an import retrains nothing. Not memoised by
    file time: an edit within one timestamp tick must still change the key (parsing is memoised by content)."""
    return source_digest_of(Path(path).read_bytes(), str(path))


def source_digest_of(raw: bytes, filename: str = "<source>") -> str:
    """:func:`source_digest` of source text ``raw`` (e.g. a file as a commit holds it)."""
    sha = hashlib.sha256(raw).hexdigest()
    if sha not in _DIGESTS:
        tree = _Normalise().visit(ast.parse(raw, filename=filename))
        blob = ast.dump(tree, annotate_fields=False, include_attributes=False)
        _DIGESTS[sha] = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return _DIGESTS[sha]


def _module_sha(path: Path) -> str:
    """The code identity of one module in a key: :func:`source_digest`."""
    return source_digest(path)


def import_closure(modules, lib: Path = LIB) -> dict[str, str]:
    """``{module: sha}`` of every module of the package at ``lib`` that importing ``modules`` can execute: the
    modules, their parent packages, and transitively everything they import (statically, function-local imports
    included). Modules in :data:`NOT_IN_KEYS` (and ``*.report``, ``*.claims``) are left out and not followed."""
    index = _module_index(lib)
    todo = [m for m in (_resolve(m, index) for m in modules) if m]
    seen: dict[str, str] = {}
    while todo:
        m = todo.pop()
        if m in seen or _excluded(m):
            continue
        f = index[m]
        seen[m] = _module_sha(f)
        parent = m.rpartition(".")[0]
        if parent in index:
            todo.append(parent)
        for name in _parse_imports(str(f), seen[m], m, f.name == "__init__.py"):
            r = _resolve(name, index)
            if r is not None and r not in seen:
                todo.append(r)
    return dict(sorted(seen.items()))


def _in_lib(module: str | None) -> bool:
    return bool(module) and (module == LIB.name or module.startswith(LIB.name + "."))


_LIBRARY_DIRS = tuple({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _library_code(code: types.CodeType) -> bool:
    """True for code of an installed library or the standard library (not followed: it cannot call moelab)."""
    f = code.co_filename
    if f.startswith("<frozen") or "site-packages" in f or "dist-packages" in f:
        return True
    with contextlib.suppress(OSError, ValueError):
        f = str(Path(f).resolve())
    return f.startswith(_LIBRARY_DIRS) and not f.startswith(str(LIB))


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _referenced_modules(obj: Any, out: set[str], seen: set[int], depth: int = 0) -> None:
    """Add to ``out`` the moelab modules that calling ``obj`` can run (see :func:`code_closure`)."""
    if depth > 40 or id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)):
        return
    seen.add(id(obj))
    rec = functools.partial(_referenced_modules, out=out, seen=seen, depth=depth + 1)
    if isinstance(obj, types.ModuleType):
        if _in_lib(obj.__name__):
            out.add(obj.__name__)
        return
    if isinstance(obj, functools.partial):
        for x in (obj.func, *obj.args, *obj.keywords.values()):
            rec(x)
        return
    if isinstance(obj, types.MethodType):
        rec(obj.__func__)
        rec(obj.__self__)
        return
    if isinstance(obj, types.FunctionType):
        if _in_lib(obj.__module__):
            out.add(obj.__module__)  # the static import graph covers what its module refers to
        elif _library_code(obj.__code__):
            return
        else:  # defined in a notebook, a script or a test: follow the globals its code names
            names = _code_names(obj.__code__)
            mods = set()
            for n in names:
                if n in obj.__globals__:
                    v = obj.__globals__[n]
                    rec(v)
                    if isinstance(v, types.ModuleType) and _in_lib(v.__name__):
                        mods.add(v.__name__)
                if "." in n and _in_lib(n):  # `import moelab.x` inside the function
                    out.add(n)
            index = _module_index()
            while mods:  # attribute access on a module global: moelab.suite.embed -> moelab.suite.embed
                m = mods.pop()
                for n in names:
                    if f"{m}.{n}" in index and f"{m}.{n}" not in out:
                        out.add(f"{m}.{n}")
                        mods.add(f"{m}.{n}")
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                rec(cell.cell_contents)
        for x in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
            rec(x)
        return
    if isinstance(obj, type):
        if _in_lib(obj.__module__):
            out.add(obj.__module__)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for x in list(obj)[:1000]:
            rec(x)
        return
    if isinstance(obj, dict):
        for x in list(obj.values())[:1000]:
            rec(x)
        return
    if _in_lib(type(obj).__module__):  # an instance of a moelab class (a config, a model): its methods may run
        out.add(type(obj).__module__)
    elif callable(obj) and isinstance(getattr(type(obj), "__call__", None), types.FunctionType):
        rec(type(obj).__call__)  # a callable object: its __call__ (followed only if written outside libraries)


def code_closure(fn: Callable) -> dict[str, str]:
    """``{source path: source_digest}`` of every moelab module that running ``fn`` can execute.

    For a function defined in a moelab module: that module, its parent packages and (transitively, statically) every
    moelab module they import. For a lambda or function defined elsewhere (a notebook): the moelab modules, functions,
    classes and instances its code refers to (globals, closure cells, defaults; functions defined next to it are
    followed), and their import closure. Modules in :data:`NOT_IN_KEYS` and ``*.report`` / ``*.claims`` modules are
    never included.
    Paths are relative to the repository (``lib/moelab/core/routing.py``), as in provenance's ``sources``.
    """
    roots: set[str] = set()
    _referenced_modules(fn, roots, set())
    index = _module_index()
    base = LIB.parent.parent if LIB.parent.name == "lib" else LIB.parent
    return {str(index[m].relative_to(base)): sha for m, sha in import_closure(roots).items()}


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str | None]:
    """Versions of the packages whose numerics an artifact depends on (:data:`KEY_PACKAGES`) and of Python."""
    out: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:2]))}
    for p in KEY_PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def _keyed(config: dict, fn: Callable, version=None) -> tuple[dict, dict]:
    """(config + code digest + versions + storage format [+ the step's own ``version``], the code closure itself)."""
    if not isinstance(config, dict):
        raise ValueError(f"cache config must be a dict, got {type(config).__name__}")
    reserved = {"_code", "_versions", "_format", "_version"} & set(config)
    if reserved:
        raise ValueError(f"cache config keys {sorted(reserved)} are reserved by moelab.cache; rename them")
    if version is not None and not isinstance(version, (str, int)):
        raise ValueError(f"cache version must be a str or int (bump it when data or external behaviour changes), "
                         f"got {version!r}")
    closure = code_closure(fn)
    digest = hashlib.sha256(json.dumps(closure, sort_keys=True).encode()).hexdigest()[:16]
    cfg = {**config, "_code": digest, "_versions": package_versions(), "_format": FORMAT}
    if version is not None:
        cfg["_version"] = version
    return cfg, closure


# How this process has used the artifact cache: entries reused, entries built, and the seconds spent building the
# outermost ones (a build that memoises inner steps counts its own time once). A run's provenance records the
# difference over the run (moelab.runner.notebook_run), so a wall time measured on a warm cache is never read as a cold one.
# An entry this process built and then asks for again counts as ``reused_own``, not ``reused``: a cold run that
# reuses its own work is still cold.
USAGE = {"reused": 0, "reused_own": 0, "built": 0, "build_s": 0.0}
_BUILD_DEPTH = [0]
_BUILT_HERE: set[str] = set()


def usage() -> dict:
    """A copy of :data:`USAGE` (take one at the start of a run and subtract it at the end)."""
    return dict(USAGE)


def _artifact(kind: str, config: dict, build: Callable[[Path], None], keyed_by: Callable, version=None) -> Path:
    if not kind or "/" in kind:
        raise ValueError(f"artifact kind must be a non-empty name without '/', got {kind!r}")
    cfg, closure = _keyed(config, keyed_by, version)
    path = cache_root() / "artifacts" / kind / key(cfg)
    if is_complete(path) and (problems := entry_problems(path)):
        invalidate(path, problems)
    if is_complete(path):
        USAGE["reused_own" if str(path) in _BUILT_HERE else "reused"] += 1
        return path
    t0 = time.perf_counter()
    _BUILD_DEPTH[0] += 1
    try:
        with atomic_dir(path, meta={"kind": kind, "config": cfg, "code": closure}) as tmp:
            (tmp / "config.json").write_text(json.dumps(cfg, sort_keys=True, indent=1, default=_json_default))
            build(tmp)
    finally:
        _BUILD_DEPTH[0] -= 1
    USAGE["built"] += 1
    _BUILT_HERE.add(str(path))
    if _BUILD_DEPTH[0] == 0:
        USAGE["build_s"] = round(USAGE["build_s"] + time.perf_counter() - t0, 1)
    return path


def artifact(kind: str, config: dict, build: Callable[[Path], None], version=None) -> Path:
    """Directory ``cache_root()/artifacts/<kind>/<key>`` built once by ``build(tmpdir)`` and reused.

    The key hashes ``config``, :func:`package_versions` and :func:`code_closure` of ``build``, so changing a setting,
    a package version or any moelab module the builder can run builds a new entry. The code part is each module's
    :func:`source_digest` (a docstring, comment or import-order edit keeps the key). ``version`` (a str or int) is
    for what the code hash cannot see: bump it when a data file or an external tool's behaviour changes. An entry
    whose files were truncated or deleted since is rebuilt.
    """
    return _artifact(kind, config, build, build, version)


def memo(kind: str, config: dict, compute: Callable[[], Any], version=None) -> Any:
    """Cache the value of ``compute()`` (torch tensors, numpy arrays, DataFrames, plain objects) by configuration,
    by the code ``compute`` can run (:func:`code_closure`) and by ``version`` (see :func:`artifact`)."""

    def build(tmp: Path):
        value = compute()
        try:
            import torch  # optional: values are pickled without it

            torch.save(value, tmp / "value.pt")
        except Exception:  # not torch-serialisable (or no torch): fall back to pickle
            (tmp / "value.pt").unlink(missing_ok=True)
            with open(tmp / "value.pkl", "wb") as f:
                pickle.dump(value, f)

    path = _artifact(kind, config, build, compute, version)
    if (path / "value.pt").exists():
        import torch  # optional, as above

        return torch.load(path / "value.pt", weights_only=False)
    with open(path / "value.pkl", "rb") as f:
        return pickle.load(f)


# ---------------------------------------------------------------- re-keying after the exclusion rules change
def _module_of_path(rel: str) -> str:
    """``lib/moelab/core/routing.py`` -> ``moelab.core.routing``; ``lib/moelab/__init__.py`` -> ``moelab``."""
    path = Path(rel)
    return _dotted(path.relative_to("lib") if path.parts[0] == "lib" else path)


def _code_digest(closure: dict) -> str:
    return hashlib.sha256(json.dumps(closure, sort_keys=True).encode()).hexdigest()[:16]


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rekey(root: Path | None = None, dry_run: bool = False) -> list[tuple[str, str, str]]:
    """Move every entry keyed under older exclusion rules to the key the current rules give it.

    A module added to :data:`NOT_IN_KEYS` (or :data:`NOT_IN_KEYS_EXACT`) leaves every closure that held it, so every
    key that covered it changes although no step computes anything else. For each finished entry whose marker records
    its code closure, this checks that the entry's key is what that configuration and closure give (otherwise the
    entry is left alone), drops the modules now excluded, and renames the entry to the resulting key (its marker
    rewritten, noting ``rekeyed`` with the old key and what was dropped; its ``config.json`` too when that file is the
    cache's record of the key, never when the builder wrote its own there, e.g. a ``save_pretrained`` model). Modules
    still in the closure keep their recorded digests: an entry built from code that has changed since stays unmatched.
    Returns ``[(kind, old key, new key)]``."""
    base = (Path(root) if root is not None else cache_root()) / "artifacts"
    moved = []
    for entry in sorted(base.glob("*/*")):
        if not entry.is_dir() or not is_complete(entry):
            continue
        meta = read_marker(entry)
        cfg, code = meta.get("config"), meta.get("code")
        if not isinstance(cfg, dict) or not isinstance(code, dict) or key(cfg) != entry.name:
            continue
        if cfg.get("_code") != _code_digest(code):
            continue
        kept = {p: d for p, d in code.items() if not _excluded(_module_of_path(p))}
        if kept == code:
            continue
        new_cfg = {**cfg, "_code": _code_digest(kept)}
        dest = entry.parent / key(new_cfg)
        if dest.exists():
            continue
        moved.append((entry.parent.name, entry.name, dest.name))
        if dry_run:
            continue
        with writing():
            own = entry / "config.json"   # the cache's record of the key, unless the builder wrote its own there
            if own.is_file() and _json_or_none(own) == json.loads(json.dumps(cfg, default=_json_default)):
                own.write_text(json.dumps(new_cfg, sort_keys=True, indent=1, default=_json_default))
            write_marker(entry, {**meta, "config": new_cfg, "code": kept,
                                 "rekeyed": {"from": entry.name, "dropped": sorted(set(code) - set(kept)),
                                             "at": time.time()}})
            os.replace(entry, dest)
    return moved


def main(argv=None) -> int:
    """``python -m moelab.cache rekey [--root DIR] [--dry-run]``: see :func:`rekey`."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m moelab.cache",
                                 description="Artifact cache maintenance (see the module docstring).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rk = sub.add_parser("rekey", help="move entries keyed under older exclusion rules to their current keys")
    rk.add_argument("--root", type=Path, default=None, help="cache folder (default: MOELAB_CACHE or ~/.cache/moelab)")
    rk.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    done = rekey(a.root, a.dry_run)
    for kind, old, new in done:
        print(f"{kind}: {old} -> {new}")
    print(f"{'would move' if a.dry_run else 'moved'} {len(done)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
