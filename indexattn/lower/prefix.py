"""Prefix sums of outer products read only through a contraction: `S_<τab> =
cumsum_<τ>(F_<τa> G_<τb>)` whose one reader is `H_<τa> S_<τab>` (causal linear attention's
state) is computed by chunks of τ, never held whole: within a chunk, the causal scores
`H Fᵀ` times G; across chunks, H times the sum of the chunks before. Memory falls from
N·d_a·d_b per head to (N/C)·d_a·d_b; exact, the sums regrouped."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..ir import Index, Spec
from ..ir.einstein import denominator
from .steps import Arg, Operand, PrefixProduct

CHUNK = 64  # positions per chunk: measured fastest of 32, 64, 128 (docs/decisions.md)


@dataclass(frozen=True)
class PrefixSum:
    """The prefix sum's equation, its factors (F carries `inner`, G `width`) and indices."""

    equation: ir.Equation
    f: ir.Node
    g: ir.Node
    over: Index  # τ, summed in prefixes
    inner: Index  # a, contracted by the reader
    width: Index  # b, kept


def find(spec: Spec) -> dict[str, PrefixSum]:
    """The prefix sums to compute by chunks, by their tensors' names."""
    outputs = {t.name for t in spec.outputs}
    found = {}
    for eq in spec.equations:
        readers = [
            (parent, ref)
            for other in spec.equations
            for parent in ir.walk(other.rhs)
            for ref in ir.children(parent)
            if isinstance(ref, ir.Ref) and ref.tensor.name == eq.tensor.name
        ]
        if eq.tensor.name in outputs or len(readers) != 1:
            continue
        match = _match(eq, *readers[0])
        if match is not None:
            found[eq.tensor.name] = match
    return found


def _match(eq: ir.Equation, parent: ir.Node, ref: ir.Ref) -> PrefixSum | None:
    """The prefix sum, when `eq` is one of an outer product and `parent` contracts it with
    one factor over the first factor's own index, as the planner will see it."""
    rhs = eq.rhs
    if not (isinstance(rhs, ir.Reduce) and rhs.fn == "cumsum" and len(rhs.over) == 1):
        return None
    body = rhs.body
    if not isinstance(body, ir.Product) or body.summed or len(body.factors) != 2:
        return None
    reader = numerator(parent)
    if reader is None or ref.written != eq.indices or len(reader.summed) != 1:
        return None
    (over,), (inner,) = rhs.over, reader.summed
    f, g = sorted(body.factors, key=lambda factor: inner not in factor.free)
    widths = set(g.free) - set(f.free)
    if len(widths) != 1 or not {over, inner} <= set(eq.indices):
        return None
    (width,) = widths
    common = set(eq.indices) - {over, inner, width}
    h = next(factor for factor in reader.factors if factor is not ref)
    shapes = [(f, inner), (g, width), (h, inner)]
    if not all(set(x.free) == common | {over, i} for x, i in shapes):
        return None
    return PrefixSum(eq, f, g, over, inner, width)


def numerator(node: ir.Node) -> ir.Product | None:
    """The two factors above the fraction bar of a product, as the planner contracts them
    (products.quotient): a product of exactly two, or None."""
    if not isinstance(node, ir.Product):
        return None
    below = [f for f in node.factors if denominator(f)]
    if set(node.summed) & {i for f in below for i in f.free}:
        return None
    above = tuple(f for f in node.factors if f not in below)
    return ir.Product(above, node.summed, node.span) if len(above) == 2 else None


class PrefixProducts:
    """Mixed into the Planner, which supplies var, add, node, as_tensor, ordered, prefix."""

    def prefix_product(self, node: ir.Product, hint: str) -> Arg | None:
        """`H_<τa> S_<τab>` for a prefix sum S found above: its chunked step; else None."""
        read = [f for f in node.factors if isinstance(f, ir.Ref) and f.tensor.name in self.prefix]
        if not read or len(node.factors) != 2:  # with a denominator: its numerator comes here
            return None
        match = self.prefix[read[0].tensor.name]
        h = next(f for f in node.factors if f is not read[0])
        args = [self.as_tensor(self.node(f, hint), hint) for f in (h, match.f, match.g)]
        free = set(node.free) - {match.over, match.width}
        dims = (*self.ordered(tuple(free)), match.over, match.width)
        out = Operand(self.var(hint + "_prod"), dims, any(a.batched for a in args))
        name = match.equation.tensor.ascii
        return self.add(PrefixProduct(out, *args, match.over, match.inner, name, CHUNK))
