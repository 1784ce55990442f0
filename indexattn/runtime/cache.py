"""The compile cache on disk: what a call of a compiled spec and `spec.module(...)` need, as
plain data (generated source, argument names, shape rules, position checks, the params and
buffers), so that a process compiling a spec compiled before skips sympy, the checker and the
planner. Like numba's `cache=True`.

An entry is keyed by the spec's text, name and file, the contents of indexattn's own source
files and torch's version; it lives in $INDEXATTN_CACHE_DIR (default: ~/.cache/indexattn),
is written atomically, and one that does not load is ignored and rewritten. An entry is
unpickled, so it is code: the directory is made 0700, and entries are loaded only from a
directory and files this user owns and no one else can write (docs/robustness.md).
INDEXATTN_CACHE=0 turns the cache off."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import stat
import tempfile
import warnings
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
    """The entry for this spec, or None: none kept, the cache off, an entry that fails, or a
    directory or entry another user could have written (an entry is unpickled: code)."""
    path = _path(text, name, file)
    if path is None or not path.exists() or not _private(path.parent, path):
        return None
    try:
        key, plain = pickle.loads(path.read_bytes())
    except Exception:  # a torn, foreign or stale entry: compiled again and rewritten
        return None
    return plain if key == path.stem and isinstance(plain, Plain) else None


def store(text: str, name: str, file: str, plain: Plain) -> None:
    """Keeps `plain` for later processes, written atomically; a cache that cannot be written
    (or is not private) is skipped, and a failed write leaves nothing behind."""
    path = _path(text, name, file)
    if path is None:
        return
    temporary = None
    try:
        _private_folders(path.parent)
        if not _private(path.parent):
            return
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            temporary = f.name
            f.write(pickle.dumps((path.stem, plain), protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(f.name, path)  # readers see the old entry or the new one, never a part
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _private_folders(folder: Path) -> None:
    """Makes the folder and every missing folder above it 0700, whatever the umask (0 would
    leave Path.mkdir's parents 0777: anyone could swap the cache folder inside them)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            os.mkdir(path, 0o700)


def _private(*paths: Path) -> bool:
    """Whether each path is owned by this user and writable by no one else; said once per
    directory when not."""
    if not hasattr(os, "getuid"):  # no owners to compare (Windows): the user's profile
        return True
    for path in paths:
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            _untrusted(str(path.parent if path.is_file() else path), st.st_uid, st.st_mode)
            return False
    return True


@functools.cache
def _untrusted(directory: str, owner: int, mode: int) -> None:
    warnings.warn(
        f"indexattn: the compile cache {directory} is not private (owner uid {owner}, mode "
        f"{stat.filemode(mode)}); its entries are not loaded, and specs are compiled instead. "
        "Point INDEXATTN_CACHE_DIR at a directory only you can write (chmod 700), or set "
        "INDEXATTN_CACHE=0.",
        stacklevel=4,
    )


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
