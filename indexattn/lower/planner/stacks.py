"""A `where` chain on every value of a literal index, `where(B == 0, dQ, where(B == 1, dK,
dV))`: the parts stacked along B. How the derived backward regroups the cotangents of one
fused tensor (derive/rewrites.py, `stack`), and a stack written by hand. Read literally, it
is one `torch.where` per part over the whole result; the planner makes it one `torch.stack`
(`Stack`), a copy of each part. Exact: at each value c of B the chain picks part c, and no
part reads B."""

from __future__ import annotations

import sympy

from ... import ir
from ...ir import Index


def stack_form(node: ir.Node) -> tuple[Index, tuple[ir.Node, ...]] | None:
    """(B, the parts in B's order), or None: a chain of `where(B == c, part, ...)` (or `c ==
    B`) with one condition for each value of B but one, which the innermost part takes; or a
    sum of such chains that end in 0, on distinct values (`where(B == 0, X, 0) + where(B ==
    1, Y, 0)`), 0 at the values none names. B of a literal size, read by no part."""
    if isinstance(node, ir.Sum):
        chains = [_chain(t) for t in node.terms]
        if any(c is None or not _zero(c[2]) for c in chains) or len({c[0] for c in chains}) > 1:
            return None
        chosen = [pair for c in chains for pair in c[1].items()]
        found = chains[0][0], dict(chosen), ir.Field(sympy.S.Zero, (), node.span)
        return _parts(*found, fill=True) if len(dict(chosen)) == len(chosen) else None
    found = _chain(node)
    return None if found is None else _parts(*found, fill=False)


def _chain(node: ir.Node) -> tuple[Index, dict[int, ir.Node], ir.Node] | None:
    """(B, the part for each value a condition names, the innermost part) of a chain of
    `where(B == c, part, ...)` on one index and distinct values, or None."""
    chosen: dict[int, ir.Node] = {}
    index = None
    while isinstance(node, ir.Apply) and node.fn == "where":
        cond, part, node = node.args
        found = _equality(cond)
        if found is None or found[0] != (index or found[0]) or found[1] in chosen:
            return None
        index, chosen[found[1]] = found[0], part
    return None if index is None else (index, chosen, node)


def _parts(index: Index, chosen: dict, last: ir.Node, fill: bool):
    """(B, a part for each value of B): `last` at the one value no condition names, or
    (`fill`) at every such value; None where B's size is not a number, a value is outside
    it, or a part reads B."""
    if not index.size.is_Integer or not set(chosen) <= set(range(int(index.size))):
        return None
    left = set(range(int(index.size))) - set(chosen)
    if len(left) != 1 and not fill:
        return None
    parts = tuple(chosen.get(c, last) for c in range(int(index.size)))
    return None if any(index in p.free for p in parts) else (index, parts)


def _zero(node: ir.Node) -> bool:
    return isinstance(node, ir.Field) and node.expr == 0


def _equality(cond: ir.Node) -> tuple[Index, int] | None:
    """(B, c) for a condition `B == c` or `c == B` on one index alone, c a whole number."""
    if not (isinstance(cond, ir.Field) and isinstance(cond.expr, sympy.Eq)):
        return None
    if len(cond.free) != 1:
        return None
    index = cond.free[0]
    for side, value in (cond.expr.args, cond.expr.args[::-1]):
        if side == index.symbol and value.is_Integer:
            return index, int(value)
    return None
