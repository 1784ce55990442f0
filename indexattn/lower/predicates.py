"""Masks that read tensors, `where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)`, as the condition
under which attention is allowed: the kernel takes it as a boolean `attn_mask`, built without
a float tensor of the scores' size."""

from __future__ import annotations

import sympy
from sympy.logic.boolalg import to_nnf

from .. import ir

# Each comparison and its negation; `and` and `or` swap (De Morgan).
NEGATED = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "==", "and": "or"}
NEGATED |= {b: a for a, b in NEGATED.items()}


def keep_of(node: ir.Node) -> ir.Node | None:
    """For where(cond, -inf, 0): not cond; for where(cond, 0, -inf): cond; else None."""
    if not isinstance(node, ir.Apply) or node.fn != "where":
        return None
    cond, first, second = node.args
    if not isinstance(first, ir.Field) or not isinstance(second, ir.Field):
        return None
    if first.expr == -sympy.oo and second.expr == 0:
        return negate(cond)
    if first.expr == 0 and second.expr == -sympy.oo:
        return cond
    return None


def negate(cond: ir.Node) -> ir.Node:
    """`not cond`, pushed down to the comparisons: `τ' <= τ and D_<τ> == D_<τ'>`."""
    if isinstance(cond, ir.Field):
        return ir.Field(to_nnf(sympy.Not(cond.expr)), cond.free, cond.span)
    if isinstance(cond, ir.Apply) and cond.fn == "not":
        return cond.args[0]
    if isinstance(cond, ir.Apply) and cond.fn in ("and", "or"):
        return ir.Apply(NEGATED[cond.fn], tuple(map(negate, cond.args)), cond.span)
    if isinstance(cond, ir.Apply) and cond.fn in NEGATED:
        return ir.Apply(NEGATED[cond.fn], cond.args, cond.span)
    return ir.Apply("not", (cond,), cond.span)


def conjunction(keeps: list, free: tuple[ir.Index, ...], span) -> ir.Node:
    """Keeps (sympy predicates of positions, or nodes that read tensors) joined by `and`."""
    nodes = [ir.Field(k, _free(k, free), span) if isinstance(k, sympy.Basic) else k for k in keeps]
    joined = nodes[0]
    for node in nodes[1:]:
        joined = ir.Apply("and", (joined, node), span)
    return joined


def _free(expr: sympy.Basic, indices: tuple[ir.Index, ...]) -> tuple[ir.Index, ...]:
    return tuple(i for i in indices if i.symbol in expr.free_symbols)
