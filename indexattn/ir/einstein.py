"""Einstein summation, top-down: which indices each product sums, and the mistakes of
summation, with a caret at the index written once."""

from __future__ import annotations

from dataclasses import replace

from ..errors import Span, SpecError
from .along import concat
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
            return concat(self.scope, replace(node, parts=self.parts(node, keep)))
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

    def parts(self, node: Concat, keep: frozenset[Index]) -> tuple[Node, ...]:
        """A concat's parts: each sums what it repeats; an index it carries once stays free
        (the one that runs along the concat's index among them)."""
        out = []
        for part in node.parts:
            others = frozenset(i for q in node.parts if q is not part for i in visible(q))
            out.append(self.visit(part, keep | others | once(part)))
        return tuple(out)

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


def signed(term: Node) -> tuple[Node, int]:
    """A term `-x` as (x, -1), so that it is subtracted; any other term as (term, 1)."""
    if isinstance(term, Product) and len(term.factors) == 2 and not term.summed:
        minus = [f for f in term.factors if isinstance(f, Field) and f.expr == -1]
        if minus:
            return next(f for f in term.factors if f is not minus[0]), -1
    return term, 1


def denominator(node: Node) -> bool:
    """A factor written below a fraction bar: x^-1."""
    return (
        isinstance(node, Apply)
        and node.fn == "pow"
        and isinstance(node.args[1], Field)
        and node.args[1].expr == -1
    )


def once(node: Node) -> frozenset[Index]:
    """The indices a node carries in one factor only."""
    factors = node.factors if isinstance(node, Product) else (node,)
    counts: dict[Index, int] = {}
    for factor in factors:
        for index in visible(factor):
            counts[index] = counts.get(index, 0) + 1
    return frozenset(i for i, n in counts.items() if n == 1)


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
