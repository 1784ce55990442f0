"""Einstein summation, top-down: which indices each product sums, and the mistakes of
summation, with a caret at the index written once."""

from __future__ import annotations

from dataclasses import replace

from ..errors import Span, SpecError
from .nodes import Apply, Concat, Field, Index, Node, Product, Reduce, Ref, Sum, children
from .scope import Scope


class Analysis:
    """Decides, for each product, the indices it sums: those two of its factors carry that
    neither the left-hand side nor an enclosing product keeps."""

    def __init__(self, scope: Scope, lhs: frozenset[Index]) -> None:
        self.scope, self.lhs = scope, lhs

    def top(self, node: Node) -> Node:
        node = self.visit(node, self.lhs)
        for index in node.free:
            if index not in self.lhs:
                raise self.once(index, node)
        return node

    def once(self, index: Index, node: Node) -> SpecError:
        return self.scope.error(
            f"index {index.glyph} is not on the left and appears only once",
            locate(node, index),
            f"Einstein summation sums an index that appears in two factors. To sum over "
            f"{index.glyph}, write sum_<{index.glyph}>(...); to keep it, add it to the left; "
            f"to pick one slice, write a digit in its place.",
        )

    def visit(self, node: Node, keep: frozenset[Index]) -> Node:
        if isinstance(node, (Field, Ref)):
            return node
        if isinstance(node, Product):
            return self.product(node, keep)
        if isinstance(node, Reduce):
            return self.reduce(node, keep)
        if isinstance(node, Concat):
            parts = tuple(self.visit(p, keep | frozenset(p.free)) for p in node.parts)
            return replace(node, parts=parts)
        new = tuple(self.visit(child, keep) for child in children(node))
        return Sum(new, node.span) if isinstance(node, Sum) else Apply(node.fn, new, node.span)

    def product(self, node: Product, keep: frozenset[Index]) -> Node:
        factors = []
        for k, factor in enumerate(node.factors):
            siblings = frozenset(
                i for j, other in enumerate(node.factors) if j != k for i in visible(other)
            )
            # A denominator sums on its own, as a paper's fraction does: in
            # F_<τa> KV_<ab> / (F_<τa> z_<a>) each of numerator and denominator sums a.
            factors.append(self.visit(factor, keep if denominator(factor) else keep | siblings))
        counts: dict[Index, int] = {}
        for factor in factors:
            for index in factor.free:
                counts[index] = counts.get(index, 0) + 1
        for index, count in counts.items():
            if count == 1 and index not in keep:
                raise self.once(index, node)
        summed = tuple(i for i, c in counts.items() if c > 1 and i not in keep)
        return Product(tuple(factors), summed, node.span, node.source)

    def reduce(self, node: Reduce, keep: frozenset[Index]) -> Node:
        body = self.visit(node.body, keep | frozenset(node.over))
        for index in node.over:
            if index not in body.free:
                raise self.scope.error(
                    f"{node.fn} over {index.glyph}, which is not free in its argument",
                    node.span,
                    f"{node.fn}_<{index.glyph}> needs {index.glyph} among the "
                    "indices of what it is applied to.",
                )
        return Reduce(node.fn, node.over, body, node.span)


def denominator(node: Node) -> bool:
    """A factor written below a fraction bar: x^-1."""
    return (
        isinstance(node, Apply)
        and node.fn == "pow"
        and isinstance(node.args[1], Field)
        and node.args[1].expr == -1
    )


def visible(node: Node) -> frozenset[Index]:
    """Every index a node mentions and does not bind: what its siblings must not sum away."""
    if isinstance(node, (Field, Ref)):
        return frozenset(node.free)
    if isinstance(node, Concat):  # its parts' indices along `over` are bound inside
        return frozenset(node.free)
    inner = frozenset(i for child in children(node) for i in visible(child))
    return inner - frozenset(node.over) if isinstance(node, Reduce) and not node.keeps else inner


def locate(node: Node, index: Index) -> Span:
    """Where an index is written inside a node (for carets)."""
    if isinstance(node, Ref):
        return next((s for i, s in zip(node.free, node.spans) if i == index), node.span)
    if isinstance(node, Field):
        return node.span
    for child in children(node):
        if index in visible(child):
            return locate(child, index)
    return node.span
