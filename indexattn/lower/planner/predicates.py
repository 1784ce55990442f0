"""Masks that read tensors, `where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)`, as the condition
under which attention is allowed: the kernel takes it as a boolean `attn_mask`, built without
a float tensor of the scores' size."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
from sympy.logic.boolalg import to_nnf

from ... import ir
from ...ops import lookup
from ..program import steps

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


@dataclass(frozen=True)
class Kept:
    """Where a table made by blocks keeps an entry: a condition on the positions and on
    `values`, each a symbol standing for a tensor a call passes read at an index's
    positions (document ids `D_<τ>`: the operand, the index); and whether the mask changes
    nothing at every entry it keeps (so, not where a bias is added to it)."""

    condition: sympy.Basic
    plain: bool
    values: dict = field(default_factory=dict)


def table_keep(chain, var, hides: str) -> Kept | None:
    """Where the table keeps an entry (`chain`: the steps that make it,
    lower/printers/tables_emit.py); None where it is read otherwise. A boolean table (`hides`
    "false" or "true") keeps where its value is true or false, a float one ("-inf") where it is not
    -inf. A part the condition cannot name (a value a call makes) is an unknown: it tells nothing
    of it."""
    makers = {s.out.var: s for s in chain}
    if hides in ("false", "true"):
        values = {}
        value = _boolean(makers, makers[var].out, values)
        return Kept(value if hides == "false" else sympy.Not(value), True, values)
    if hides != "-inf":
        return None
    values = {}
    return Kept(*_added(makers, var, values), values)


def _boolean(makers: dict, arg, values: dict) -> sympy.Basic:
    """A boolean value as a condition: a grid's expression, `and`, `or`, `not` and
    comparisons of such, and of a call's tensor read at an index's positions (a symbol,
    entered in `values`); anything else an unknown."""
    step = makers.get(getattr(arg, "var", None))
    if isinstance(arg, steps.Number):
        return arg.expr
    if isinstance(step, steps.Grid) and not step.index:
        return step.expr
    if isinstance(step, steps.Elementwise) and lookup(step.fn).kind in ("logic", "comparison"):
        return lookup(step.fn).sympy(*(_boolean(makers, a, values) for a in step.args))
    symbol = sympy.Dummy(real=True)
    read = _read(makers, step)
    if read is not None:
        values[symbol] = read
    return symbol


def _read(makers: dict, step) -> tuple | None:
    """(the tensor, the index) where the step reads a call's tensor along its last axis at
    an index's own positions (`D_<[τ]>`, passes/tables.py); else None."""
    if not isinstance(step, steps.Gather) or step.arg.var in makers or step.arg.select:
        return None
    grid = makers.get(step.positions.var)
    (index,) = step.positions.dims
    own = isinstance(grid, steps.Grid) and grid.index and grid.expr == index.symbol
    return (step.arg, index) if own and step.arg.dims[-1:] == (step.axis,) else None


def _added(makers: dict, var, values: dict) -> tuple[sympy.Basic, bool]:
    """A float table's condition: a grid `where(c, -inf, 0)` keeps where not c, and changes
    nothing where it keeps, and so does a `where` on a boolean table (its condition read as
    `_boolean` reads it, entering `values`); a sum keeps where each term does (the values a
    mask does not make are finite: passes/spans.py), changing nothing where each term is
    such a mask; any other value is kept everywhere, a bias (so is a sum that subtracts a
    mask)."""
    step = makers.get(var)
    if isinstance(step, steps.Add):
        parts = [
            _added(makers, a.var, values) if isinstance(a, steps.Operand) else _number(a.expr)
            for a in step.args
        ]
        signs = step.signs or (1,) * len(parts)
        if any(s < 0 and k is not sympy.true for (k, _), s in zip(parts, signs)):
            return sympy.true, False  # a mask subtracted: +inf
        return sympy.And(*(k for k, _ in parts)), all(p for _, p in parts)
    if _filled(step):
        cond, first, _ = step.args
        kept = _boolean(makers, cond, values)
        return (sympy.Not(kept) if first.expr == -sympy.oo else kept), True
    expr = step.expr if isinstance(step, steps.Grid) else None
    if (
        isinstance(expr, sympy.Piecewise)
        and len(expr.args) == 2
        and expr.args[1].cond is sympy.true
    ):
        (first, cond), (second, _) = expr.args
        if {first, second} == {-sympy.oo, sympy.S.Zero}:
            return (sympy.Not(cond) if first == -sympy.oo else cond), True
    return sympy.true, False


def _filled(step) -> bool:
    """`where(c, -inf, 0)` or `where(c, 0, -inf)` on a boolean value c."""
    if not isinstance(step, steps.Elementwise) or step.fn != "where":
        return False
    cond, *branches = step.args
    numbers = [b.expr for b in branches if isinstance(b, steps.Number)]
    return isinstance(cond, steps.Operand) and set(numbers) == {-sympy.oo, sympy.S.Zero}


def _number(expr: sympy.Basic) -> tuple[sympy.Basic, bool]:
    return sympy.sympify(expr != -sympy.oo), expr == 0
