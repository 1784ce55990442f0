"""The values reverse mode hands from step to step, as IR nodes: a cotangent (or a forward
value) as a factor of a product, one contribution to a tensor's cotangent, one equation of
the backward; and the algebra that builds them (products with their sums, restrictions,
`where`s). Nothing here is text until ir/printer.py prints it."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir import Apply, Field, Index, Node, Product, Reduce, Ref, children, printer, walk

ZERO = Field(sympy.Integer(0), (), None)
ONE = Field(sympy.Integer(1), (), None)
MINUS = Field(sympy.Integer(-1), (), None)


@dataclass(frozen=True)
class Cot:
    """A cotangent (or a value) as a factor of a product: its node, the indices it carries
    and every index it mentions (those it sums inside included)."""

    node: Node
    free: frozenset[Index]
    mentions: frozenset[Index] = frozenset()
    factors: tuple[Cot, ...] = ()  # a product's factors, when it sums nothing explicitly
    ref: Ref | None = None  # the forward's reference, when the factor is one

    @property
    def all(self) -> frozenset[Index]:
        return self.free | self.mentions

    @property
    def layout(self) -> tuple[tuple[Index, ...], ...]:
        """A reference's axes, when it is one that reads whole indices; else ()."""
        node = self.node
        if isinstance(node, Ref) and all(isinstance(i, Index) for i in node.written):
            return node.axes
        return ()

    def __str__(self) -> str:
        return printer.text(self.node)


@dataclass(frozen=True)
class Part:
    """One contribution to a tensor's cotangent: through `ref`, in the names `ref` is
    written with."""

    ref: Ref
    cot: Cot


@dataclass(frozen=True)
class Line:
    """One equation of the backward: `target = value`, computed in `precision` if set."""

    target: Ref
    value: Node
    precision: str = ""

    def __str__(self) -> str:
        return printer.equation(self.target, self.value, self.precision)


def product(parts: list[Cot], target: frozenset[Index]) -> Cot:
    """Factors multiplied and summed over every index not in `target`: Einstein sums those
    written twice; those written once are summed explicitly."""
    counts: dict[Index, int] = {}
    for p in parts:
        for i in p.free:
            counts[i] = counts.get(i, 0) + 1
    once = tuple(i for i, n in counts.items() if n == 1 and i not in target)
    summed = tuple(i for i, n in counts.items() if n > 1 and i not in target)
    node = Product(tuple(p.node for p in parts), summed, None) if len(parts) > 1 else parts[0].node
    if once:
        node = Reduce("sum", once, node, None)
    mentions = frozenset().union(*(p.all for p in parts))
    signs = any(p.node == MINUS for p in parts)
    factors = tuple(parts) if not once and not signs else ()
    return Cot(node, frozenset(counts) & target, mentions, factors=factors)


def restrict(cot: Cot, free) -> Cot:
    """The cotangent of a node that carries only `free`: summed over the rest."""
    extra = [i for i in cot.free if i not in set(free)]
    if not extra:
        return cot
    over = tuple(sorted(extra, key=lambda i: i.glyph))
    return Cot(Reduce("sum", over, cot.node, None), cot.free - set(extra), cot.all)


def negated(node: Node) -> Node:
    """-node, as the checker reads `-x`."""
    return Product((MINUS, node), (), None)


def where(condition: Node, chosen: Node, other: Node) -> Node:
    """`where(condition, chosen, other)`."""
    return Apply("where", (condition, chosen, other), None)


def equal(index: Index, value: Node | int) -> Node:
    """The condition `index == value`: a Field where the value is free of tensors."""
    value = Field(sympy.Integer(value), (), None) if isinstance(value, int) else value
    if isinstance(value, Field):
        expr = sympy.Eq(index.symbol, value.expr, evaluate=False)
        return Field(expr, tuple(dict.fromkeys((index, *value.free))), None)
    return Apply("==", (Field(index.symbol, (index,), None), value), None)


def conjunction(conditions: list[Node]) -> Node:
    """Every condition holds."""
    found = conditions[0]
    for c in conditions[1:]:
        found = Apply("and", (found, c), None)
    return found


def is_reference(node: Node) -> bool:
    """A reference, or one negated: read as it is, never named again."""
    if isinstance(node, Product) and len(node.factors) == 2 and MINUS in node.factors:
        node = next(f for f in node.factors if f != MINUS)
    return isinstance(node, Ref) and not any(
        isinstance(n, Ref) for v in node.computed for n in walk(v)
    )


def mentioned(node: Node) -> frozenset[Index]:
    """Every index a node carries or sums inside."""
    found: set[Index] = set(node.free)
    if isinstance(node, Reduce):
        found |= set(node.over)
    if isinstance(node, Product):
        found |= set(node.summed)
    for c in children(node):
        found |= mentioned(c)
    return frozenset(found)
