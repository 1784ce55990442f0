"""The `blocks` backend: the core planned as the general steps (lower/planner/plan.py), run by
blocks of rows over the keys each block sees (lower/program/passes: rows, spans, tables),
its steps printed by lower/printers/emit.py and the rows' function with its blocks by its
`emit.py`. It takes any core. Nothing heavy is imported here."""

from __future__ import annotations

NAME = "blocks"


def takes(core) -> str | None:
    return None
