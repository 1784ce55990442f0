"""The syntax tree of a spec: what was written and where, with no meaning attached yet."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Span


@dataclass(frozen=True)
class IndexName:
    """An index glyph as written in a subscript or a declaration: `τ'`, `μ` (from `\\mu`)."""

    glyph: str
    span: Span


@dataclass(frozen=True)
class Literal:
    """A single digit in a subscript: selects one slice of that axis."""

    value: int
    span: Span


@dataclass(frozen=True)
class Computed:
    """`[τ' - τ + N - 1]` in a subscript: the position along that axis, a whole-number
    expression of index variables, sizes and integer tensors (a gather)."""

    expr: Expr
    span: Span


@dataclass(frozen=True)
class Group:
    """A parenthesised, fused axis: `(μBa)`."""

    items: tuple[IndexName | Literal | Computed, ...]
    span: Span


Axis = IndexName | Literal | Computed | Group


@dataclass(frozen=True)
class Ref:
    """A tensor reference `NAME_<axes>`."""

    name: str
    axes: tuple[Axis, ...]
    span: Span


@dataclass(frozen=True)
class Num:
    value: int | float
    span: Span


@dataclass(frozen=True)
class Inf:
    span: Span


@dataclass(frozen=True)
class Name:
    """A bare identifier (with primes, if any): an index variable, a scalar or a size."""

    name: str
    span: Span


@dataclass(frozen=True)
class Unary:
    op: str  # "-", "+" or "not"
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / ^ < <= > >= == != and or
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    """`f(args)` or, for reductions and softmax, `f_<over>(args)`."""

    func: str
    over: tuple[IndexName, ...]
    args: tuple[Expr, ...]
    span: Span


Expr = Ref | Num | Inf | Name | Unary | Binary | Call


@dataclass(frozen=True)
class IndexDecl:
    names: tuple[IndexName, ...]
    size: Expr  # a Name, a positive Num, or + - * of them
    doc: str
    span: Span


@dataclass(frozen=True)
class Init:
    kind: str  # normal, uniform, zeros, ones
    args: tuple[float, ...]
    span: Span


@dataclass(frozen=True)
class TensorDecl:
    role: str  # input, param, buffer
    ref: Ref
    init: Init | None
    doc: str
    span: Span
    dtype: str = "float"  # or "int": `input D_<τ> : int`


@dataclass(frozen=True)
class ScalarDecl:
    name: str
    value: Expr  # a constant expression (2 π, inf, 1 / sqrt(2)): the checker folds it
    doc: str
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    names: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class Equation:
    lhs: Ref
    rhs: Expr
    doc: str
    span: Span
    precision: str = ""  # "float32" or "float64": `A_<ττ'> : float32 = ...`


Statement = IndexDecl | TensorDecl | ScalarDecl | OutputDecl | Equation


@dataclass(frozen=True)
class Document:
    """A parsed spec file."""

    name: str
    file: str
    source: str
    title: str
    description: str
    statements: tuple[Statement, ...]


def children(node: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of an expression node."""
    if isinstance(node, Binary):
        return (node.left, node.right)
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, Call):
        return node.args
    return ()


def walk(node: Expr):
    """Every expression node below and including `node`, depth first."""
    yield node
    for child in children(node):
        yield from walk(child)
