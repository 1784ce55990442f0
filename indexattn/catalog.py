"""The specs that ship with indexattn, by name: `mha`, `rope`, `models/llama3`, ...

A wheel carries them as package data (`indexattn/specs`, read through importlib.resources);
a checkout, or an editable install of one, reads the repository's `specs/` beside the package.

>>> shipped("mha").name
'mha.attn'
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path

from .errors import SpecError

NAME = re.compile(r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*")  # what a shipped spec's name looks like


def folder() -> Path:
    """Where the shipped specs are: the package's data in a wheel, `specs/` in a checkout."""
    packaged = resources.files("indexattn") / "specs"
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "specs"


def names() -> list[str]:
    """Every shipped spec's name, sorted: `mha`, ..., `models/bert`, ..."""
    root = folder()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.attn"))


def shipped_specs() -> dict[str, str]:
    """Every shipped spec's name and title (its first comment line).

    >>> shipped_specs()["mha"]
    'Causal multi-head self-attention, one fused head-major projection'
    """
    return {name: _title(shipped(name)) for name in names()}


def shipped(name: str) -> Path:
    """The file of the shipped spec `name`, for `compile_spec`, `open` or the command line.

    >>> import indexattn
    >>> indexattn.compile_spec(shipped("gqa")).name
    'gqa'
    """
    if NAME.fullmatch(name) and name in names():
        return folder() / f"{name}.attn"
    raise LookupError(f"{name!r} is not a shipped spec;{suggestion(name)}")


def _title(path: Path) -> str:
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.lstrip("#").strip() if first.lstrip().startswith("#") else ""


def suggestion(name: str) -> str:
    """A close shipped name, if any, and where to see them all."""
    close = difflib.get_close_matches(name, names(), n=1)
    suggestion = f" did you mean {close[0]!r}?" if close else ""
    return suggestion + " indexattn.shipped_specs() (or `indexattn list`) names them all"


def looks_like_a_name(text: str) -> bool:
    """A string that can only be meant as a shipped spec's name: no spec has one line."""
    return bool(NAME.fullmatch(text))


def not_a_spec(text: str) -> SpecError:
    """For a string that is neither a file, a shipped spec's name nor spec text."""
    close = difflib.get_close_matches(text, names(), n=1)
    return SpecError(
        f"{text!r} is not a file, a shipped spec or spec text",
        file="<spec>",
        hint="compile_spec tried it as\n"
        "- a file: only a pathlib.Path or a str ending in .attn is read as one\n"
        f"- a shipped spec: none is called {text!r}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + "; indexattn.shipped_specs() names them all\n"
        "- spec text: a spec declares and defines on several lines",
    )
