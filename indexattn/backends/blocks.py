"""The `blocks` backend: the core planned as the general steps (lower/plan.py), run by blocks
of rows over the keys each block sees (lower/passes: rows, spans, tables), printed by
lower/emit.py and lower/rows_emit.py. It takes any core."""

from __future__ import annotations

NAME = "blocks"


def takes(core) -> str | None:
    return None
