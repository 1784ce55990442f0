"""The compile cache on disk: what a call of a compiled spec and `spec.module(...)` need, as
plain data (generated source, argument names, shape rules, position checks, the params and
buffers), so that a process compiling a spec compiled before skips sympy, the checker and the
planner. Like numba's `cache=True`.

An entry is keyed by the spec's text, name and file, the contents of indexattn's own source
files and torch's version; it lives in $INDEXATTN_CACHE_DIR (default: ~/.cache/indexattn),
is written atomically, and one that does not load is ignored and rewritten.
INDEXATTN_CACHE=0 turns the cache off."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..sizes import Rules
from .held import Layer
from .positions import Positions

FORMAT = 2  # bumped when Plain changes shape


@dataclass(frozen=True)
class Plain:
    """Everything a call of a compiled spec, and `spec.module(...)`, reads, with no sympy."""

    name: str
    source: str  # the generated module
    function: str  # the name of the spec's function in it
    constants: str | None  # the function of per-shape constants, if any
    constant_args: tuple[str, ...]
    rules: Rules
    positions: Positions
    arguments: tuple[str, ...]  # ASCII names, in the function's order
    integer: tuple[bool, ...]  # per argument: an integer tensor
    like: int  # the argument that sets the device and dtype
    sizes: tuple[str, ...]  # every size's ASCII name
    scalars: tuple[tuple[str, float], ...]  # ASCII name and declared value
    outputs: int
    batch: tuple[tuple[int, int], ...]  # per input: its argument position and its rank
    layer: Layer  # the params and buffers, for spec.module(...)


def load(text: str, name: str, file: str) -> Plain | None:
    """The entry for this spec, or None: none kept, the cache off, or an entry that fails."""
    path = _path(text, name, file)
    if path is None or not path.exists():
        return None
    try:
        key, plain = pickle.loads(path.read_bytes())
    except Exception:  # a torn, foreign or stale entry: compiled again and rewritten
        return None
    return plain if key == path.stem and isinstance(plain, Plain) else None


def store(text: str, name: str, file: str, plain: Plain) -> None:
    """Keeps `plain` for later processes; a cache that cannot be written is skipped."""
    path = _path(text, name, file)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(pickle.dumps((path.stem, plain), protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(f.name, path)  # readers see the old entry or the new one, never a part
    except OSError:
        return


def directory() -> Path | None:
    """Where entries live; None when INDEXATTN_CACHE=0 (or there is no home directory)."""
    if os.environ.get("INDEXATTN_CACHE", "1") == "0":
        return None
    chosen = os.environ.get("INDEXATTN_CACHE_DIR")
    if chosen:
        return Path(chosen)
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return None if home.startswith("~") else Path(home) / "indexattn"  # no home: no cache


def _path(text: str, name: str, file: str) -> Path | None:
    where = directory()
    if where is None:
        return None
    parts = (str(FORMAT), text, name, file, torch.__version__, _package())
    # a spec's text may hold lone surrogates (read with errors="surrogateescape"): hashed too
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return where / f"{digest}.pickle"


@functools.cache
def _package() -> str:
    """A digest of indexattn's own source files: any change to the compiler is a miss."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
