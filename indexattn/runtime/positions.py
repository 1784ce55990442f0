"""Computed positions checked at call time: a gather out of range is a ShapeError naming the
tensor, the axis and the range of positions, never a silent wrap (negative positions) or a
raw IndexError. Positions built from sizes are checked once per shape, when built; positions
read from integer inputs, on every eager call.

Positions *computed* from integer inputs (`T_<[4 P_<τ>]a>`) are computed in int64 by the
generated code, which cannot see a wrap. So on every eager call each integer input they read
gives its least and greatest value (one `aminmax`: one device sync, a value-dependent branch),
and the position's expression is bounded from those by interval arithmetic on plain data
(`Bounds`, built once when compiled): where any part of it can leave int64, the call is a
ShapeError before anything runs. Whether the positions are in range is then checked by the
gather itself (`index_select`, which refuses negative positions too, where indexing would
wrap them), and its IndexError made a ShapeError naming the reference (`Positions.failed`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import torch

from ..errors import ShapeError
from ..sizes import Tree, evaluate

if TYPE_CHECKING:
    from ..lower.program.program import Program
    from ..lower.program.steps import Var


@dataclass(frozen=True)
class Check:
    """Positions at `source` (a constant's place, or an argument's) must lie in [0, size)."""

    source: int
    size: Tree
    where: str


INT64 = (-(2**63), 2**63 - 1)

# An expression as plain data: a number, ("arg", k) for the k-th argument's values, ("size",
# Tree) for a size or an index's range's last position, or (op, *parts).
Expr = int | Fraction | tuple


@dataclass(frozen=True)
class Bounds:
    """Positions computed at call time from integer arguments: `expr` bounds them."""

    expr: Expr
    size: Tree
    where: str
    reads: tuple[str, ...]  # the integer arguments, by name, for the message


@dataclass(frozen=True)
class Positions:
    constants: tuple[Check, ...]
    arguments: tuple[Check, ...]
    computed: tuple[Bounds, ...] = ()

    @property
    def every_call(self) -> bool:
        """Whether an eager call checks positions on every call, not once per shape."""
        return bool(self.arguments or self.computed)

    def sizes(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The sizes the constants' checks compare with."""
        return tuple(evaluate(check.size, sizes) for check in self.constants)

    def check_constants(self, spec: str, built: tuple, sizes: dict[str, int]) -> None:
        for check in self.constants:
            _in_range(spec, check, built[check.source], sizes)

    def check_arguments(self, spec: str, tensors, sizes: dict[str, int]) -> None:
        for check in self.arguments:
            _in_range(spec, check, tensors[check.source], sizes)
        extremes: dict[int, tuple[int, int] | None] = {}
        for bounds in self.computed:
            found = _interval(bounds.expr, _Values(tensors, sizes, extremes))
            if found is not None and found[0] == "overflow":
                raise ShapeError(
                    f"{spec}: {bounds.where}: the positions computed from "
                    f"{' and '.join(bounds.reads)} (whose values run from "
                    f"{_extremes(extremes)}) can reach {found[1]}, outside "
                    "int64 (-2^63 to 2^63 - 1), where they would wrap round to a wrong "
                    "position; pass smaller values"
                )

    def failed(self, spec: str, error: IndexError, sizes: dict[str, int]) -> ShapeError:
        """The ShapeError for an IndexError of a gather at computed positions."""
        where = " or ".join(
            f"{b.where} (size {evaluate(b.size, sizes)}, so positions 0 to "
            f"{evaluate(b.size, sizes) - 1})"
            for b in self.computed
        )
        return ShapeError(
            f"{spec}: {where}: the positions computed at this call are out of range ({error})"
        )


def positions(plan: Program, held: tuple[Var, ...]) -> Positions:
    """The checks of every gather of a plan; `held`: the values the constants function
    returns, in order."""
    from ..ir.shapes import tree
    from ..lower.program.steps import Gather

    spec = plan.spec
    grids = list(held)
    arguments = [t.ascii for t in spec.arguments]
    constants, inputs, computed = [], [], []
    for step in (s for s in plan.steps if isinstance(s, Gather)):
        var, size = step.positions.var, tree(step.axis.size, spec.size_names)
        if var in grids:
            constants.append(Check(grids.index(var), size, step.where))
        elif var.argument and not step.positions.select:
            inputs.append(Check(arguments.index(var.hint), size, step.where))
        elif step.bounds is not None:
            expr = _plain(step.bounds, spec, arguments)
            reads = tuple(sorted(s.name[4:] for s in step.bounds.free_symbols if _int(s)))
            computed.append(Bounds(expr, size, step.where, reads))
    return Positions(tuple(constants), tuple(inputs), tuple(computed))


def _int(symbol) -> bool:
    return symbol.name.startswith("int:")


def _plain(expr, spec, arguments: list[str]) -> Expr:
    """A sympy whole-number expression (ir.kinds.whole_form) as plain data."""
    from ..ir.shapes import tree

    if expr.is_Integer or expr.is_Rational:
        return Fraction(int(expr.p), int(expr.q)) if expr.q != 1 else int(expr)
    if expr.is_Symbol:
        if _int(expr):
            return ("arg", arguments.index(expr.name[4:]))
        index = next((i for i in spec.indices if i.symbol == expr), None)
        if index is not None:
            return ("index", tree(index.size, spec.size_names))
        return ("size", tree(expr, spec.size_names))
    if expr.is_Boolean or expr.is_Relational:
        return ("condition",)
    name = _OPS.get(type(expr).__name__)
    if name is None:
        return ("unknown",)
    if name == "where":
        return ("where", *(_plain(value, spec, arguments) for value, _ in expr.args))
    return (name, *(_plain(a, spec, arguments) for a in expr.args))


_OPS = {
    "Add": "+",
    "Mul": "*",
    "Pow": "pow",
    "floor": "floor",
    "ceiling": "ceil",
    "Mod": "mod",
    "Min": "min",
    "Max": "max",
    "Abs": "abs",
    "sign": "sign",
    "Piecewise": "where",
}


class _Values:
    """What the leaves of a Bounds expression are at one call: each integer argument's least
    and greatest value (one aminmax each, computed once per call), sizes and ranges."""

    def __init__(self, tensors, sizes: dict[str, int], extremes: dict) -> None:
        self.tensors, self.sizes, self.extremes = tensors, sizes, extremes

    def leaf(self, node: tuple) -> tuple | None:
        kind = node[0]
        if kind == "arg":
            if node[1] not in self.extremes:
                values = self.tensors[node[1]]
                low, high = torch.aminmax(values) if values.numel() else (None, None)
                self.extremes[node[1]] = None if low is None else (int(low), int(high))
            return self.extremes[node[1]]
        if kind == "size":
            value = evaluate(node[1], self.sizes)
            return value, value
        if kind == "index":
            return 0, evaluate(node[1], self.sizes) - 1
        return (0, 1) if kind == "condition" else None


def _interval(node: Expr, values: _Values):
    """(low, high) of `node`, ("overflow", value) where a part of it can leave int64, or None
    where unknown (an empty argument, a form with no bounds here)."""
    if not isinstance(node, tuple):
        return node, node
    if node[0] in ("arg", "size", "index", "condition", "unknown"):
        return values.leaf(node)
    parts = []
    for part in node[1:]:
        found = _interval(part, values)
        if found is None or found[0] == "overflow":
            return found
        parts.append(found)
    try:
        low, high = _RULES[node[0]](*parts)
    except _Unknown:
        return None
    for value in (low, high):
        if not INT64[0] <= value <= INT64[1]:
            return "overflow", value
    return low, high


def _corners(op, a, b):
    found = [op(x, y) for x in a for y in b]
    return min(found), max(found)


def _sum(*parts):
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _product(*parts):
    low = high = 1
    for part in parts:
        low, high = _corners(lambda x, y: x * y, (low, high), part)
    return low, high


def _power(base, exponent):
    if exponent[0] != exponent[1] or exponent[0] < 0 or exponent[0] != int(exponent[0]):
        raise _Unknown
    n = int(exponent[0])
    low, high = _corners(lambda x, y: x**n, base, (0,))
    return (0, high) if n % 2 == 0 and base[0] < 0 < base[1] else (low, high)


def _mod(a, b):
    if b[0] > 0:
        return 0, b[1] - 1
    raise _Unknown


def _abs(a):
    low = 0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))
    return low, max(abs(a[0]), abs(a[1]))


def _sign(x) -> int:
    return (x > 0) - (x < 0)


class _Unknown(Exception):
    """A form bounded by nothing here."""


_RULES = {
    "+": _sum,
    "*": _product,
    "pow": _power,
    "floor": lambda a: (math.floor(a[0]), math.floor(a[1])),
    "ceil": lambda a: (math.ceil(a[0]), math.ceil(a[1])),
    "mod": _mod,
    "min": lambda *p: (min(x[0] for x in p), min(x[1] for x in p)),
    "max": lambda *p: (max(x[0] for x in p), max(x[1] for x in p)),
    "abs": _abs,
    "sign": lambda a: (_sign(a[0]), _sign(a[1])),
    "where": lambda *p: (min(x[0] for x in p), max(x[1] for x in p)),
}


def _extremes(extremes: dict) -> str:
    found = [extremes[k] for k in sorted(extremes) if extremes[k] is not None]
    return ", ".join(f"{low} to {high}" for low, high in found)


def _in_range(spec: str, check: Check, values: torch.Tensor, sizes: dict[str, int]) -> None:
    if values.numel() == 0:
        return
    size = evaluate(check.size, sizes)
    low, high = (int(v) for v in torch.aminmax(values))  # one device sync
    if low < 0 or high >= size:
        raise ShapeError(
            f"{spec}: {check.where}: positions {low} to {high} are out of range; this axis "
            f"has size {size}, so positions 0 to {size - 1}"
        )
