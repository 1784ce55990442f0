"""The backward each shipped spec runs when a call names none: benchmarks/gradients.py
measures both and writes the table (defaults.json, beside this file), keyed by the hash of
the spec's text, so that an edited spec runs autograd's until it is measured again.

>>> default("index i : n\\ninput x_<i>\\ny_<i> = exp(x_<i>)\\n")
'autograd'
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

TABLE = Path(__file__).with_name("defaults.json")


@functools.cache
def table() -> dict[str, dict]:
    """The benchmark's rows by spec name: the choice, the text's hash, what was measured."""
    return json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else {}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@functools.cache
def default(text: str) -> str:
    """The benchmark's choice for a spec of this text, "derived" or "autograd"; autograd's
    for any other text."""
    found = digest(text)
    return next((r["backward"] for r in table().values() if r["sha256"] == found), "autograd")


def choose(autograd_ms: float, derived_ms: float, autograd_mb: float, derived_mb: float) -> str:
    """The derived backward where it was measured at least as fast and no larger.

    >>> choose(100.0, 90.0, 50.0, 20.0)
    'derived'
    """
    return "derived" if derived_ms <= autograd_ms and derived_mb <= autograd_mb else "autograd"
