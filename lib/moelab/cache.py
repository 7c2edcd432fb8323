"""One cache directory for assets, derived data and trained artifacts (foundation issue, items 3 and 5).

``MOELAB_CACHE`` overrides the location (default ``~/.cache/moelab``). Every entry is a directory written into a
temporary sibling and renamed into place only when its builder finished; a ``.complete`` marker (with the metadata
that keyed it) is written last. So an interrupted download or build never leaves an entry that later looks valid:
:func:`is_complete` is false for it and the next call rebuilds it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

MARKER = ".complete"


def cache_root() -> Path:
    """The cache directory (``$MOELAB_CACHE`` or ``~/.cache/moelab``), created on first use."""
    root = Path(os.environ.get("MOELAB_CACHE") or Path.home() / ".cache" / "moelab").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


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


@contextlib.contextmanager
def atomic_dir(path: Path, meta: dict | None = None):
    """Yield a temporary directory that becomes ``path`` only if the block succeeds.

    On an exception the temporary directory is removed and ``path`` is left as it was. An existing
    incomplete entry at ``path`` (from an earlier crash) is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        (tmp / MARKER).write_text(json.dumps({"created": time.time(), **(meta or {})}, default=str))
        if path.exists():
            if is_complete(path):  # built concurrently by someone else: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _versioned(config: dict, fn: Callable | None = None) -> dict:
    """Config + moelab version + a hash of the moelab source file that defines ``fn`` (so editing the code that
    builds an artifact invalidates it; edits in modules it calls do not: pass a version in ``config`` for those)."""
    import inspect

    import moelab

    out = {"moelab": moelab.__version__, **config}
    try:
        src = Path(inspect.getsourcefile(fn)).resolve() if fn is not None else None
    except TypeError:
        src = None
    lib = Path(moelab.__file__).resolve().parent
    if src is not None and src.is_file() and src.is_relative_to(lib):
        out.setdefault("_code", f"{src.relative_to(lib)}:{sha256_file(src)[:12]}")
    return out


def artifact(kind: str, config: dict, build: Callable[[Path], None]) -> Path:
    """Directory ``cache_root()/artifacts/<kind>/<key>`` built once by ``build(tmpdir)`` and reused.

    The key hashes ``config`` together with the moelab version, so changing a setting builds a new entry.
    """
    if not kind or "/" in kind:
        raise ValueError(f"artifact kind must be a non-empty name without '/', got {kind!r}")
    cfg = _versioned(config, build)
    path = cache_root() / "artifacts" / kind / key(cfg)
    if not is_complete(path):
        with atomic_dir(path, meta={"kind": kind, "config": cfg}) as tmp:
            (tmp / "config.json").write_text(json.dumps(cfg, sort_keys=True, indent=1, default=_json_default))
            build(tmp)
    return path


def memo(kind: str, config: dict, compute: Callable[[], Any]) -> Any:
    """Cache the value of ``compute()`` (torch tensors, numpy arrays, DataFrames, plain objects) by configuration."""

    def build(tmp: Path):
        value = compute()
        try:
            import torch

            torch.save(value, tmp / "value.pt")
        except Exception:  # not torch-serialisable: fall back to pickle
            with open(tmp / "value.pkl", "wb") as f:
                pickle.dump(value, f)

    cfg = _versioned(config, compute)
    cfg.pop("moelab")
    path = artifact(kind, cfg, build)
    if (path / "value.pt").exists():
        import torch

        return torch.load(path / "value.pt", weights_only=False)
    with open(path / "value.pkl", "rb") as f:
        return pickle.load(f)


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
