"""A sum of a `where` on a computed position, `sum_<J>(where(b == P_<J>, E, 0))`: how the
derived backward sends a cotangent back through a gather (derive/reverse.py), and a one-hot
sum written by hand. Read literally, the `where` is a tensor over b, J and E's other indices
(32 × N × N × h for T5's relative-position buckets); the planner adds E into the slots P
names instead, one scatter-add (`Scatter`), as autograd's backward of a gather does. Exact: for
each b, the sum over J of E where P is b, and nothing where P is no b (docs/decisions.md,
"A scatter's positions outside its axis add nothing")."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ... import ir
from ...ir import Index
from ...ir.kinds import kind
from ..program.steps import Arg, Flip, Operand, Rename, Scatter
from .fusion import reversal
from .gathers import whole_positions


@dataclass(frozen=True)
class ScatterForm:
    """`sum_<J>(where(b == P, E, 0))`: b, P (whole numbers over indices all in J) and E summed
    over the indices of J that P lacks."""

    axis: Index
    positions: ir.Node
    value: ir.Node


def scatter_form(node: ir.Node) -> ScatterForm | None:
    """The scatter a sum computes, or None: a sum over J of `where(b == P, E, 0)` (or `P ==
    b`), b an index alone, P whole numbers whose indices are all summed in J and all E's, b
    neither summed nor read by P or E."""
    if not (isinstance(node, ir.Reduce) and node.fn == "sum"):
        return None
    body = node.body
    if not (isinstance(body, ir.Apply) and body.fn == "where" and _zero(body.args[2])):
        return None
    value = body.args[1]
    for slot, positions in _sides(body.args[0]):
        if _fits(slot, positions, value, node.over):
            axis = slot.free[0]
            rest = tuple(i for i in node.over if i not in positions.free)
            summed = ir.Reduce("sum", rest, value, node.span) if rest else value
            return ScatterForm(axis, positions, summed)
    return None


def _sides(condition: ir.Node) -> list[tuple[ir.Node, ir.Node]]:
    """The two sides of an equality, each way round: `b == P_<τ>`, or a field of indices
    alone (`c == 1 - c'`) as two fields."""
    if isinstance(condition, ir.Apply) and condition.fn == "==":
        left, right = condition.args
    elif isinstance(condition, ir.Field) and isinstance(condition.expr, sympy.Eq):
        left, right = (_field(side, condition) for side in condition.expr.args)
    else:
        return []
    return [(left, right), (right, left)]


def _field(expr: sympy.Basic, whole: ir.Field) -> ir.Field:
    free = tuple(i for i in whole.free if i.symbol in expr.free_symbols)
    return ir.Field(expr, free, whole.span)


def _fits(slot: ir.Node, positions: ir.Node, value: ir.Node, over: tuple[Index, ...]) -> bool:
    if not (isinstance(slot, ir.Field) and len(slot.free) == 1):
        return False
    axis = slot.free[0]
    held = set(positions.free)
    return (
        slot.expr == axis.symbol
        and bool(held)
        and held <= set(over) & set(value.free)
        and axis not in (*over, *positions.free, *value.free)
        and kind(positions) == "int"
    )


def _zero(node: ir.Node) -> bool:
    return isinstance(node, ir.Field) and not node.free and node.expr == 0


def scatter_positions(node: ir.Node):
    """The positions of every scatter in a node: values read as whole numbers only."""
    for n in ir.walk(node):
        form = scatter_form(n)
        if form is not None:
            yield form.positions


def scatter_rule(planner, node: ir.Reduce, hint: str) -> Arg | None:
    """One scatter-add where the sum is a scatter (`scatter_form`); a flip where the
    positions reverse a whole axis (`[1 - c']` on halves: each slot gets one value)."""
    form = scatter_form(node)
    if form is None:
        return None
    value = planner.as_tensor(planner.node(form.value, hint), hint)
    flipped = reversal(form.positions, form.axis)
    if flipped is not None:  # each slot from one position: the values reversed
        dims = tuple(form.axis if i == flipped else i for i in value.dims)
        out = Operand(planner.var(hint + "_flip"), dims, value.batched)
        return planner.add(Flip(out, value, flipped))
    value = _viewed(planner, value)
    positions = whole_positions(planner, ir.At(form.positions, node.span), hint)
    first = min(value.dims.index(i) for i in positions.dims)
    rest = [i for i in value.dims if i not in positions.dims]
    dims = (*rest[:first], form.axis, *rest[first:])
    batched = value.batched or positions.batched
    out = Operand(planner.var(hint + "_scatter"), dims, batched)
    return planner.add(Scatter(out, value, form.axis, positions))


def _viewed(planner, value: Operand) -> Operand:
    """A value that names another's axes anew (`dB_2_<ττ'μ> = dS_<μττ'>`, a view), as that
    other value in its own order: the scatter reads the storage in its order (three
    times faster than through the view, T5's buckets at N = 1024 on a CPU)."""
    made = next((s for s in reversed(planner.planned) if s.out.var == value.var), None)
    if not isinstance(made, Rename) or value.select or made.arg.select:
        return value
    if set(made.arg.dims) != set(made.out.dims):
        return value
    names = dict(zip(made.out.dims, value.dims))
    return Operand(made.arg.var, tuple(names[i] for i in made.arg.dims), made.arg.batched)
