"""What a value holds: true/false, whole numbers or floats. Integer tensors (`input D_<τ> :
int`) keep their dtype through comparisons, + - *, floor, mod, min, max, where and positions;
a function that needs floats (exp, softmax, ...) of a value made of integer tensors only is a
SpecError, since torch would compute it in its default float dtype, not the call's."""

from __future__ import annotations

import sympy

from ..ops import lookup
from .nodes import (
    Apply,
    Concat,
    Field,
    Node,
    Product,
    Reduce,
    Ref,
    Sum,
    children,
    is_condition,
    refs,
)

INTEGERS_ONLY = ("sum", "max", "min")  # reductions that keep whole numbers whole


def kind(node: Node) -> str:
    """`bool`, `int` or `float`."""
    if is_condition(node):
        return "bool"
    if isinstance(node, Field):
        return "int" if node.expr.is_integer else "float"
    if isinstance(node, Ref):
        return "int" if node.tensor.dtype == "int" or node.tensor.whole else "float"
    if isinstance(node, (Product, Sum, Concat)):
        return _join(kind(p) for p in children(node))
    if isinstance(node, Reduce):
        if node.fn == "rank":  # a place in an order: whole whatever it orders
            return "int"
        return kind(node.body) if node.fn in INTEGERS_ONLY else "float"
    return _apply(node)


def _apply(node: Apply) -> str:
    if node.fn == "pow":
        base, exponent = node.args
        whole = (
            isinstance(exponent, Field)
            and exponent.expr.is_integer
            and exponent.expr.is_nonnegative
        )
        return kind(base) if whole else "float"
    if not lookup(node.fn).integers:
        return "float"
    values = node.args[1:] if node.fn == "where" else node.args
    return _join(kind(v) for v in values)


def _join(kinds) -> str:
    return "int" if all(k in ("int", "bool") for k in kinds) else "float"


def integer_tensors(node: Node) -> tuple[str, ...]:
    """The declared integer tensors a value is made of, when it is made of nothing else."""
    if kind(node) != "int":
        return ()
    names = [n.tensor.name for n in refs(node) if n.tensor.dtype == "int"]
    return tuple(dict.fromkeys(names))


def whole_form(node: Node, equations) -> sympy.Expr:
    """The sympy form of a whole-number value made of integer tensors (each the Symbol
    `int:NAME`, NAME its ASCII name), index variables and sizes; derived tensors are read
    through their equations (`equations`: name -> right-hand side). A part with no such form
    (a reduction) is `unknown(...)`: nothing bounds it."""
    if isinstance(node, Field):
        return node.expr
    if isinstance(node, Ref):
        if node.tensor.name in equations:
            return whole_form(equations[node.tensor.name], equations)
        return sympy.Symbol("int:" + node.tensor.ascii, integer=True)
    parts = [whole_form(p, equations) for p in children(node)]
    if isinstance(node, (Product, Sum, Apply)) and not getattr(node, "summed", ()):
        if isinstance(node, Product):
            return sympy.Mul(*parts)
        if isinstance(node, Sum):
            return sympy.Add(*parts)
        return _applied(node.fn, parts)
    return UNKNOWN(*parts)


UNKNOWN = sympy.Function("unknown")


def _applied(fn: str, parts: list) -> sympy.Expr:
    if fn == "pow":
        return sympy.Pow(*parts)
    if fn == "neg":
        return -parts[0]
    if fn == "-":
        return parts[0] - parts[1]
    form = lookup(fn).sympy
    return form(*parts) if form is not None else UNKNOWN(*parts)
