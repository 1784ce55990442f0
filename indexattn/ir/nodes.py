"""The checked IR: indices with sympy sizes, tensors with roles and layouts, and expression
nodes whose tensor-free parts are folded into sympy Fields. Each node keeps the syntax node
it was read from, so later stages (LaTeX, carets) never re-parse or re-derive it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter

import sympy

from ..errors import Span
from ..notation import syntax as ast
from ..ops import REDUCTIONS, lookup


@dataclass(frozen=True)
class Index:
    glyph: str
    ascii: str
    size: sympy.Expr  # a positive integer Symbol, or an Integer
    doc: str = field(default="", compare=False)
    symbol: sympy.Symbol = field(default=None, compare=False)  # its value as an index variable

    def __repr__(self) -> str:
        return self.glyph


@dataclass(frozen=True)
class Tensor:
    name: str
    ascii: str
    role: str  # input, param, buffer, derived
    layout: tuple[tuple[Index, ...], ...]  # one tuple per axis; several indices = a fused axis
    batched: bool  # carries the inputs' leading batch axes
    init: ast.Init | None = field(default=None, compare=False)
    doc: str = field(default="", compare=False)
    span: Span | None = field(default=None, compare=False)
    dtype: str = "float"  # "int": integer elements, never cast to the float dtype of a call
    whole: bool = False  # derived, and its values are whole numbers (positions may read it)
    precision: str = ""  # derived: computed in float32 or float64 at least (`A_<ττ'> : float32`)

    @cached_property
    def indices(self) -> tuple[Index, ...]:
        return tuple(i for axis in self.layout for i in axis)

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return tuple(sympy.Mul(*(i.size for i in axis)) for axis in self.layout)

    @property
    def fused(self) -> bool:
        return any(len(axis) > 1 for axis in self.layout)

    def __repr__(self) -> str:
        return f"{self.name}_<{layout_text(self.layout)}>"


@dataclass(frozen=True)
class Scalar:
    name: str
    ascii: str
    value: float
    symbol: sympy.Symbol
    doc: str = ""


# -- expressions


@dataclass(frozen=True)
class Field:
    """A tensor-free expression: numbers, sizes, scalars and index variables, as sympy."""

    expr: sympy.Basic
    free: tuple[Index, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class At:
    """A computed position along one axis of a reference, `[τ' - τ + N - 1]` or
    `[β_<ττ'>]`: a whole-number value; its indices become the reference's in that place."""

    value: Node
    span: Span = field(compare=False)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return self.value.free


@dataclass(frozen=True)
class Ref:
    """A tensor read with a layout; literals (ints) select slices, computed positions (At)
    select (no free index) or gather."""

    tensor: Tensor
    axes: tuple[tuple[Index | int | At, ...], ...]
    span: Span = field(compare=False)
    spans: tuple[Span, ...] = field(compare=False, default=())  # one per index in `free`
    source: ast.Ref | None = field(compare=False, default=None)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        found: list[Index] = []
        for item in self.written:
            found += [item] if isinstance(item, Index) else list(getattr(item, "free", ()))
        return tuple(dict.fromkeys(found))

    @cached_property
    def written(self) -> tuple[Index | int | At, ...]:
        """The items of every axis, flat, as written."""
        return tuple(i for axis in self.axes for i in axis)

    @cached_property
    def computed(self) -> tuple[Node, ...]:
        """The values of its computed positions, in the order written."""
        return tuple(i.value for i in self.written if isinstance(i, At))


@dataclass(frozen=True)
class Product:
    """Factors multiplied elementwise, summed over `summed` (Einstein)."""

    factors: tuple[Node, ...]
    summed: tuple[Index, ...]
    span: Span = field(compare=False)
    source: ast.Expr | None = field(compare=False, default=None)  # the `*`, `/` or `-` written

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return union(*(f.free for f in self.factors), minus=self.summed)


@dataclass(frozen=True)
class Sum:
    terms: tuple[Node, ...]
    span: Span = field(compare=False)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return union(*(t.free for t in self.terms))


@dataclass(frozen=True)
class Apply:
    """An elementwise function, `pow`, a comparison or and/or/not: an entry of the operator
    table (indexattn/ops.py)."""

    fn: str
    args: tuple[Node, ...]
    span: Span = field(compare=False)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return union(*(a.free for a in self.args))

    @property
    def condition(self) -> bool:
        return lookup(self.fn).condition


@dataclass(frozen=True)
class Reduce:
    """softmax, cumsum, sum, max, min, mean or logsumexp over `over`."""

    fn: str
    over: tuple[Index, ...]
    body: Node
    span: Span = field(compare=False)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return self.body.free if self.keeps else union(self.body.free, minus=self.over)

    @property
    def keeps(self) -> bool:
        """softmax and cumsum keep their index free; the others sum (or max) it away."""
        return REDUCTIONS[self.fn].keeps


@dataclass(frozen=True)
class Concat:
    """`concat_<σ>(Kc_<μca>, Kn_<μτa>)`: the parts one after another along `over`; `along`
    names, for each part, its index in `over`'s place (the one it does not share)."""

    over: Index
    parts: tuple[Node, ...]
    along: tuple[Index, ...]
    span: Span = field(compare=False)

    @cached_property
    def free(self) -> tuple[Index, ...]:
        return (self.over, *union(self.parts[0].free, minus=self.along))


Node = Field | Ref | Product | Sum | Apply | Reduce | Concat


@dataclass(frozen=True)
class Equation:
    tensor: Tensor  # the left-hand side, with its layout
    rhs: Node
    text: str  # the equation re-printed from the syntax tree
    doc: str = ""
    source: ast.Equation | None = field(compare=False, default=None)

    @cached_property
    def indices(self) -> tuple[Index, ...]:
        """The left-hand side's indices, flat, as written."""
        return self.tensor.indices


@dataclass(frozen=True)
class Spec:
    """A checked spec: what every later stage reads."""

    name: str
    title: str
    description: str
    indices: tuple[Index, ...]
    sizes: tuple[sympy.Symbol, ...]
    tensors: tuple[Tensor, ...]  # declared, then derived, in order
    scalars: tuple[Scalar, ...]
    equations: tuple[Equation, ...]
    outputs: tuple[Tensor, ...]
    size_asciis: tuple[str, ...] = ()  # the ASCII name of each size, as `sizes`

    def tensors_of(self, *roles: str) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role in roles)

    @property
    def arguments(self) -> tuple[Tensor, ...]:
        return self.tensors_of("input", "param", "buffer")

    @property
    def like(self) -> Tensor:
        """The argument whose device and dtype a call computes in: the first float one."""
        return next(t for t in self.arguments if t.dtype == "float")

    def size_ascii(self, symbol: sympy.Symbol) -> str:
        """The name a size has in the generated code and in a caller's keywords."""
        return self.size_asciis[self.sizes.index(symbol)]

    @property
    def size_names(self) -> dict[sympy.Symbol, str]:
        return dict(zip(self.sizes, self.size_asciis))


def union(*groups: tuple[Index, ...], minus: tuple[Index, ...] = ()) -> tuple[Index, ...]:
    seen: dict[Index, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group))
    return tuple(i for i in seen if i not in minus)


def layout_text(layout) -> str:
    def one(axis) -> str:
        text = "".join(str(i) if isinstance(i, int) else i.glyph for i in axis)
        return f"({text})" if len(axis) > 1 else text

    return "".join(one(axis) for axis in layout)


# -- walking


def children(node: Node) -> tuple[Node, ...]:
    return _CHILDREN.get(type(node), _leaf)(node)


def _leaf(node: Node) -> tuple[Node, ...]:
    return ()


_CHILDREN = {
    Product: attrgetter("factors"),
    Sum: attrgetter("terms"),
    Apply: attrgetter("args"),
    Reduce: lambda node: (node.body,),
    Concat: attrgetter("parts"),
    Ref: attrgetter("computed"),
}


def walk(node: Node) -> Iterator[Node]:
    """Every node below and including `node`, depth first in the order written."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def refs(node: Node) -> Iterator[Ref]:
    """Every tensor reference in a node, depth first in the order written."""
    return (n for n in walk(node) if isinstance(n, Ref))


def batched(node: Node) -> bool:
    """Whether a value carries the inputs' leading batch axes."""
    return any(ref.tensor.batched for ref in refs(node))


CONDITIONS = (
    sympy.core.relational.Relational,
    sympy.logic.boolalg.BooleanFunction,  # And, Or, Not
    sympy.logic.boolalg.BooleanAtom,  # true, false
)  # not sympy's Boolean: every Symbol is one


def is_condition(node: Node) -> bool:
    if isinstance(node, Field):
        return isinstance(node.expr, CONDITIONS)
    return isinstance(node, Apply) and node.condition


def renamed(node: Node, names: dict[Index, Index]) -> Node:
    """The node with its indices renamed (a contraction transposes by renaming)."""

    def index(i: Index) -> Index:
        return names.get(i, i)

    def item(i):
        return At(renamed(i.value, names), i.span) if isinstance(i, At) else names.get(i, i)

    inner = tuple(renamed(c, names) for c in children(node)) if not isinstance(node, Ref) else ()
    if isinstance(node, Field):
        subs = {i.symbol: names[i].symbol for i in node.free if i in names}
        return Field(node.expr.subs(subs), tuple(map(index, node.free)), node.span)
    if isinstance(node, Ref):
        return Ref(node.tensor, tuple(tuple(map(item, a)) for a in node.axes), node.span)
    if isinstance(node, Product):
        return Product(inner, tuple(map(index, node.summed)), node.span)
    if isinstance(node, Reduce):
        return Reduce(node.fn, tuple(map(index, node.over)), inner[0], node.span)
    if isinstance(node, Concat):
        return Concat(index(node.over), inner, tuple(map(index, node.along)), node.span)
    return Sum(inner, node.span) if isinstance(node, Sum) else Apply(node.fn, inner, node.span)
