"""Syntax tree -> canonical spec text, re-printed from parsed values (never the source)."""

from __future__ import annotations

from functools import singledispatch

from ..ops import OPERATORS
from . import syntax as ast

PRECEDENCE = {name: op.level for name, op in OPERATORS.items()}


def subscript(axes: tuple[ast.Axis, ...]) -> str:
    """`(μBa)i` for the axes of `W_<(μBa)i>`."""
    return "".join(_axis(axis) for axis in axes)


def _axis(axis: ast.Axis) -> str:
    if isinstance(axis, ast.Group):
        return "(" + "".join(_axis(item) for item in axis.items) + ")"
    if isinstance(axis, ast.Literal):
        return str(axis.value)
    if isinstance(axis, ast.Computed):
        return "[" + unparse(axis.expr) + "]"
    return axis.glyph


def ref(node: ast.Ref) -> str:
    return f"{node.name}_<{subscript(node.axes)}>"


def equation(eq: ast.Equation) -> str:
    """`Y_<τi> = W_O_<i(μa)> O_<μτa> + b_O_<i>`."""
    precision = f" : {eq.precision}" if eq.precision else ""
    return f"{ref(eq.lhs)}{precision} = {unparse(eq.rhs)}"


@singledispatch
def unparse(node: ast.Expr, outer: int = 0) -> str:
    raise TypeError(node)


@unparse.register
def _(node: ast.Ref, outer: int = 0) -> str:
    return ref(node)


@unparse.register
def _(node: ast.Num, outer: int = 0) -> str:
    return repr(node.value)


@unparse.register
def _(node: ast.Inf, outer: int = 0) -> str:
    return "inf"


@unparse.register
def _(node: ast.Name, outer: int = 0) -> str:
    return node.name


@unparse.register
def _(node: ast.Unary, outer: int = 0) -> str:
    level = PRECEDENCE["not" if node.op == "not" else "neg"]
    text = ("not " if node.op == "not" else node.op) + unparse(node.operand, level)
    return f"({text})" if level < outer else text


@unparse.register
def _(node: ast.Binary, outer: int = 0) -> str:
    level = PRECEDENCE[node.op]
    # a right factor with a sign needs parentheses: `a (-b)`, since `a -b` is a subtraction
    right_level = PRECEDENCE["neg"] + 1 if node.op == "*" else level + (node.op != "^")
    left, right = unparse(node.left, level + (node.op == "^")), unparse(node.right, right_level)
    if node.op == "*":
        text = f"{left} {right}"
    elif node.op == "^":
        text = f"{left}^{right}"
    else:
        text = f"{left} {node.op} {right}"
    return f"({text})" if level < outer else text


@unparse.register
def _(node: ast.Call, outer: int = 0) -> str:
    over = f"_<{''.join(i.glyph for i in node.over)}>" if node.over else ""
    return f"{node.func}{over}({', '.join(unparse(arg) for arg in node.args)})"
