"""The rules of ops.DERIVATIVES as IR: each rule read once, as the checker reads a right
side, into nodes over the placeholders x, y, z (the operator's arguments), then taken at the
forward's arguments, what is free of tensors folded as the checker folds it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import sympy

from ..ir import Apply, Field, Node, Product, Ref, Sum, Tensor, children
from ..ir.expressions import Expressions, fold
from ..ir.nodes import union
from ..ir.scope import Scope
from ..notation import parse
from ..notation import syntax as ast
from ..ops import DERIVATIVES, lookup

PLACEHOLDERS = "xyz"


ROUNDING = (sympy.floor, sympy.ceiling, sympy.sign)


def field_slope(expr: sympy.Basic, symbol: sympy.Symbol) -> sympy.Basic | None:
    """∂ expr / ∂ symbol for a tensor-free value, piecewise functions by the rules autograd
    follows: max's and min's Heaviside is (1 + sign(x)) / 2 (one half on a tie, as
    torch.maximum), rounding and sign are flat (their Dirac deltas zero), `mod(x, y)` is
    x - y floor(x / y). None where a derivative is left unevaluated."""
    expr = expr.replace(sympy.Mod, lambda x, y: x - y * sympy.floor(x / y))
    slope = sympy.diff(expr, symbol)
    slope = slope.replace(sympy.Heaviside, lambda x, *_: (1 + sympy.sign(x)) / 2)
    slope = slope.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
    slope = slope.replace(flat, lambda *_: sympy.Integer(0))  # then Subs(0, ξ, 3 x) is 0:
    slope = slope.replace(lambda e: isinstance(e, sympy.Subs), lambda e: e.doit())
    return None if slope.has(sympy.Derivative) else slope


def flat(e: sympy.Basic) -> bool:
    """A derivative of a rounding function (`Derivative(ceiling(ξ), ξ)`)."""
    return isinstance(e, sympy.Derivative) and isinstance(e.expr, ROUNDING)


def slope(node: Apply, k: int, value: Callable[[Node], Node]) -> Node:
    """∂ node.fn / ∂ argument k at node's arguments, each read as `value(argument)` (a
    forward value, named once); where the rule reads the function's own value (tanh's
    1 - tanh(x)^2) it reads `value(node)`."""
    holders = {placeholder(n): a for n, a in zip(PLACEHOLDERS, node.args)}
    itself = Apply(node.fn, tuple(Ref(t, (), None) for t in holders), None)

    def at(rule: Node) -> Node:
        if rule == itself:
            return value(node)
        if isinstance(rule, Ref):
            return value(holders[rule.tensor])
        if isinstance(rule, Field):
            return rule
        return rebuilt(rule, tuple(at(c) for c in children(rule)))

    return at(parsed(DERIVATIVES[node.fn][k]))


@cache
def parsed(rule: str) -> Node:
    """A rule's text as IR, x, y and z read as placeholder tensors."""
    doc = parse(f"r_<> = {rule}", "rule")
    return Placeholders(Scope(doc)).number(doc.statements[-1].rhs)


@cache
def placeholder(name: str) -> Tensor:
    return Tensor(name, name, "input", (), False)


class Placeholders(Expressions):
    """A rule's right side: x, y and z are the operator's arguments."""

    def expr_Name(self, node: ast.Name) -> Node:
        if node.name in PLACEHOLDERS:
            return Ref(placeholder(node.name), (), node.span)
        return super().expr_Name(node)


def rebuilt(node: Node, inner: tuple[Node, ...]) -> Node:
    """`node` with these children, numbers folded: a product or sum of numbers is one, a
    function of numbers is its value, x^1 is x and x^0 is 1."""
    if isinstance(node, (Product, Sum)):
        return constant_first(fold(inner, node.span, type(node)))
    form = lookup(node.fn).sympy
    if all(isinstance(a, Field) for a in inner) and form is not None:
        return Field(form(*(a.expr for a in inner)), union(*(a.free for a in inner)), node.span)
    if node.fn == "pow" and isinstance(inner[1], Field) and inner[1].expr in (0, 1):
        return inner[0] if inner[1].expr == 1 else Field(sympy.Integer(1), (), node.span)
    return Apply(node.fn, inner, node.span)


def constant_first(node: Node) -> Node:
    """A sum or product with its number first (`1 - x`, `2 x`, not `-x + 1`, `x (2)`), as
    rules are written."""
    parts = children(node)
    if isinstance(node, (Sum, Product)) and isinstance(parts[-1], Field):
        moved = (parts[-1], *parts[:-1])
        return Sum(moved, node.span) if isinstance(node, Sum) else Product(moved, (), node.span)
    return node
