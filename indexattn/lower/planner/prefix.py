"""Products computed by chunks of positions, never held whole: `H_<τa> Σ_(τ' ≤ τ) w F_<τ'a>
G_<τ'b>`, with w = 1 (a prefix sum, causal linear attention's state: `S_<τab> =
cumsum_<τ>(F_<τa> G_<τb>)` whose one reader is `H_<τa> S_<τab>`) or a decay γ^(τ - τ')
(retention, lower/planner/decay.py). Within a chunk, the causal scores `H Fᵀ` (times the decay
between its positions) times G; across chunks, H times the sum of the chunks before (each
decayed by γ^C per chunk). Memory falls from N·d_a·d_b (or N²) per head to (N/C)·d_a·d_b;
exact, the sums regrouped."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ... import ir
from ...ir import Index, Spec
from ...ir.einstein import denominator
from ..program.steps import Arg, Operand, PrefixProduct
from .order import prescale

CHUNK = 64  # positions per chunk of a prefix sum: fastest of 32, 64, 128 (docs/decisions.md)
DECAY_CHUNK = 64  # positions per chunk of a decay: fastest of 32 to 256 (docs/decisions.md)


@dataclass(frozen=True)
class Chunked:
    """A product to compute by chunks: H (carries `inner` and the position `over`), F
    (`inner` and its own position), G (`width` and F's position), the equations only it
    reads (`hidden`, the last the one it stands for) and, for a decay, its `rate` per step
    of τ - τ': the decay's log (`exp((τ - τ') λ)`), or its base γ where `power`."""

    hidden: tuple[ir.Equation, ...]
    h: ir.Node
    f: ir.Node
    g: ir.Node
    over: Index
    inner: Index
    width: Index
    rate: ir.Node | None = None
    power: bool = False

    @property
    def name(self) -> str:
        return self.hidden[-1].tensor.ascii

    @property
    def common(self) -> tuple[Index, ...]:
        """The axes all three share besides the positions (heads)."""
        return tuple(i for i in self.h.free if i not in (self.over, self.inner))


Readers = dict[str, list[tuple[ir.Node, ir.Ref]]]


def readers(spec: Spec) -> Readers:
    """Each tensor's references, with the node each is a factor (or argument) of."""
    found: Readers = {}
    for eq in spec.equations:
        for parent in ir.walk(eq.rhs):
            for ref in ir.children(parent):
                if isinstance(ref, ir.Ref):
                    found.setdefault(ref.tensor.name, []).append((parent, ref))
    return found


def find(spec: Spec) -> dict[str, Chunked]:
    """The prefix sums to compute by chunks, by their tensors' names."""
    outputs = {t.name for t in spec.outputs}
    read = readers(spec)
    found = {}
    for eq in spec.equations:
        uses = read.get(eq.tensor.name, [])
        if eq.tensor.name in outputs or len(uses) != 1:
            continue
        match = _match(eq, *uses[0])
        if match is not None:
            found[eq.tensor.name] = match
    return found


def _match(eq: ir.Equation, parent: ir.Node, ref: ir.Ref) -> Chunked | None:
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
    return Chunked((eq,), h, f, g, over, inner, width)


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


def prefix_rule(planner, node: ir.Product, hint: str) -> Arg | None:
    """The reader of a product found above (`H_<τa> S_<τab>`, `R_<ττ'> V_<τ'b>`): its
    chunked step; else None."""
    read = [f for f in node.factors if isinstance(f, ir.Ref) and f.tensor.name in planner.prefix]
    if not read or len(node.factors) != 2:  # with a denominator: its numerator comes here
        return None
    match = planner.prefix[read[0].tensor.name]
    args = [planner.as_tensor(planner.node(x, hint), hint) for x in (match.f, match.g)]
    args.insert(0, _scaled(planner, match.h, hint))
    rate = None if match.rate is None else planner.node(match.rate, hint + "_rate")
    dims = (*planner.ordered(match.common), match.over, match.width)
    out = Operand(planner.var(hint + "_prod"), dims, any(a.batched for a in args))
    chunk = CHUNK if rate is None else DECAY_CHUNK
    where = (match.over, match.inner, match.name, chunk, rate, match.power)
    return planner.add(PrefixProduct(out, *args, *where))


def _scaled(planner, h: ir.Node, hint: str) -> Operand:
    """H, or H times numbers (a decay's `Q / sqrt(d_k)`) as the scaled H."""
    numbers = [f for f in getattr(h, "factors", ()) if isinstance(f, ir.Field)]
    if not numbers:
        return planner.as_tensor(planner.node(h, hint), hint)
    (tensor,) = (f for f in h.factors if not isinstance(f, ir.Field))
    scale = sympy.Mul(*(f.expr for f in numbers))
    return prescale(planner, [planner.as_tensor(planner.node(tensor, hint), hint)], scale)[0]
