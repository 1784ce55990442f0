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


LONG = 4096  # the shortest sequence a default is chosen at
SLOWER = 1.1  # the most time the derived step may take, as a multiple of autograd's


def choose(measured: dict[str, dict[str, float]]) -> str:
    """The derived backward where, at every measured N of at least LONG (and there must be
    one), it held less memory than autograd and took at most SLOWER times its time.

    >>> row = {"autograd ms": 100, "derived ms": 109, "autograd MB": 50, "derived MB": 20}
    >>> slower = {**row, "derived ms": 111}
    >>> choose({"4096": row}), choose({"2048": row}), choose({"4096": row, "8192": slower})
    ('derived', 'autograd', 'autograd')
    """
    long = [m for n, m in measured.items() if int(n) >= LONG]
    holds = all(
        m["derived MB"] < m["autograd MB"] and m["derived ms"] <= SLOWER * m["autograd ms"]
        for m in long
    )
    return "derived" if long and holds else "autograd"
