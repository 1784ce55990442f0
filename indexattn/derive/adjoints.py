"""Each node kind's rule of reverse mode: what a node sends, as IR, to the nodes it reads,
given its own cotangent. An operator's slope is its rule in ops.DERIVATIVES (derive/rules.py);
`where` and dropout, which have none, and the reductions are written here."""

from __future__ import annotations

from collections.abc import Callable

import sympy

from ..ir import Apply, At, Concat, Field, Node, Product, Reduce, Ref, Sum, printer
from ..lower.program.numerics import guarded
from ..ops import DERIVATIVES
from . import rules
from .cotangents import (
    MINUS,
    ONE,
    ZERO,
    Cot,
    Part,
    is_reference,
    mentioned,
    negated,
    product,
    restrict,
    where,
)
from .walk import Walk


def back_ref(d: Walk, node: Ref, cot: Cot) -> None:
    """A part of the tensor's cotangent, summed over what the reference does not carry."""
    cot = restrict(cot, node.free)
    if d.precision() and not is_reference(cot.node):  # computed in it, then read
        cot = d.materialize(cot, "d" + node.tensor.name, node.free)
    d.parts.setdefault(node.tensor, []).append(Part(node, cot))


def back_field(d: Walk, node: Field, cot: Cot) -> None:
    """A field that reads a scalar sends the cotangent times its derivative in that
    scalar, summed over every index, to the scalar."""
    for symbol, scalar in d.symbols.items():
        slope = rules.field_slope(node.expr, symbol)
        if slope is None:
            raise d.refuse(
                f"the scalar {scalar.name}",
                node,
                f"{printer.field(node.expr)} has no derivative rule in {scalar.name}; pass "
                f"{scalar.ascii} as a float, or as a tensor that does not require grad.",
            )
        if slope != 0:
            carried = tuple(i for i in node.free if i.symbol in slope.free_symbols)
            free = frozenset(carried)
            factor = Cot(Field(slope, carried, node.span), free, free)
            d.scalar_parts.setdefault(scalar, []).append(product([cot, factor], frozenset()).node)


def back_sum(d: Walk, node: Sum, cot: Cot) -> None:
    """Each term gets the cotangent, summed over the indices the term does not carry."""
    for term in node.terms:
        d.back(term, restrict(cot, term.free))


def back_product(d: Walk, node: Product, cot: Cot) -> None:
    """Each factor gets the cotangent times the other factors' values."""
    for k, f in enumerate(node.factors):
        if d.needs(f):
            others = [d.value(g) for j, g in enumerate(node.factors) if j != k]
            d.back(f, d.into(f, product([cot, *others], frozenset(f.free))))


def back_apply(d: Walk, node: Apply, cot: Cot) -> None:
    """Each argument gets the cotangent times the function's slope in it."""
    if node.fn in STRUCTURAL:
        STRUCTURAL[node.fn](d, node, cot)
        return
    if DERIVATIVES.get(node.fn) is None:
        raise d.refuse(node.fn, node, "ops.DERIVATIVES has no rule for it.")
    for k, arg in enumerate(node.args):
        if DERIVATIVES[node.fn][k] == "0" or not d.needs(arg):
            continue
        d.back(arg, d.into(arg, product([cot, slope(d, node, k)], frozenset(arg.free))))


def back_where(d: Walk, node: Apply, cot: Cot) -> None:
    """Each branch gets the cotangent where it is chosen, as the forward evaluates it
    (numerics.guarded): a branch that can overflow reads a finite value where it is
    hidden, so its slope there is finite and the zero cotangent gives zero, not
    0 × inf = NaN (and a read kept inside its axis by the where is differentiated where
    the forward reads it)."""
    condition = node.args[0]
    branches = guarded(node).args[1:]
    mentions = cot.all | mentioned(condition)
    free = cot.free | frozenset(condition.free)
    for k, arg in enumerate(branches):
        if d.needs(arg):
            chosen = (cot.node, ZERO) if k == 0 else (ZERO, cot.node)
            d.back(arg, d.into(arg, Cot(where(condition, *chosen), free, mentions)))


def back_dropout(d: Walk, node: Apply, cot: Cot) -> None:
    """The cotangent times the mask the forward drew (in training)."""
    if d.training:
        mask = d.out.masks[id(node)]
        free = frozenset(mask.indices)
        cot = product([cot, Cot(Ref(mask, mask.layout, None), free, free)], free)
    d.back(node.args[0], d.into(node.args[0], cot))


def slope(d: Walk, node: Apply, k: int) -> Cot:
    """∂ fn / ∂ argument k, at the forward's arguments, by the rule of ops.DERIVATIVES.
    Where the rule reads the function's own value (tanh's 1 - tanh(x)^2), that value is
    named once, as the forward's."""
    read: list[Cot] = []

    def value(of: Node) -> Node:
        read.append(d.value(of))
        return read[-1].node

    rule = rules.slope(node, k, value)
    return Cot(rule, frozenset(node.free), frozenset().union(*(v.all for v in read)))


# Each reduction's rule, by its name in ops.REDUCTIONS (`@adjoint(name)` beside the rule).
ADJOINTS: dict[str, Callable[[Walk, Reduce, Cot], None]] = {}


def adjoint(*names: str):
    """Registers the rule of reverse mode of the reductions `names`."""

    def register(rule):
        ADJOINTS.update(dict.fromkeys(names, rule))
        return rule

    return register


def back_reduce(d: Walk, node: Reduce, cot: Cot) -> None:
    ADJOINTS[node.fn](d, node, cot)


@adjoint("sum")
def reduce_sum(d: Walk, node: Reduce, cot: Cot) -> None:
    """The cotangent, spread along the summed indices."""
    d.back(node.body, d.into(node.body, cot))


@adjoint("mean")
def reduce_mean(d: Walk, node: Reduce, cot: Cot) -> None:
    count = sympy.Mul(*(i.size for i in node.over))
    scale = Cot(Field(1 / count, (), None), frozenset())
    reduce_sum(d, node, product([cot, scale], frozenset(node.free)))


@adjoint("softmax")
def reduce_softmax(d: Walk, node: Reduce, cot: Cot) -> None:
    """A (g - Σ_j A g), the row sum as a rewrite may write it."""
    a = d.value(node)
    cot = d.named(cot, node)
    rows = Reduce("sum", node.over, Product((a.node, cot.node), (), None), None)
    rows = d.rewritten("rows", Cot(rows, frozenset()), node)
    g = Sum((cot.node, negated(rows.node)), None)
    free = frozenset(node.free)
    slope = Cot(Product((a.node, g), (), None), free, free | a.all | rows.all)
    d.back(node.body, d.into(node.body, slope))


def scaled(d: Walk, node: Node, cot: Cot, slope: Cot) -> None:
    """The cotangent times the derivative `slope` (which carries node's indices), to
    `node`."""
    free = frozenset(node.free)
    slope = Cot(slope.node, free, slope.all)
    d.back(node, d.into(node, product([cot, slope], free)))


@adjoint("logsumexp")
def reduce_logsumexp(d: Walk, node: Reduce, cot: Cot) -> None:
    """The cotangent times the softmax of the argument."""
    weights = d.value(Reduce("softmax", node.over, node.body, node.span))
    scaled(d, node.body, cot, weights)


@adjoint("max", "min")
def reduce_max(d: Walk, node: Reduce, cot: Cot) -> None:
    """The cotangent where the argument equals the result, split evenly among the tied
    entries (as autograd's amax and the literal interpreter split it)."""
    body, top = d.value(node.body), d.value(node)
    tie = where(Apply("==", (body.node, top.node), None), ONE, ZERO)
    chosen = d.materialize(
        Cot(tie, body.free, body.all | top.all), d.eq.tensor.name + "_tie", node.body.free
    )
    count = Apply("pow", (Reduce("sum", node.over, chosen.node, None), MINUS), None)
    share = Cot(Product((chosen.node, count), (), None), frozenset(), chosen.all)
    scaled(d, node.body, cot, share)


@adjoint("cumsum")
def reduce_cumsum(d: Walk, node: Reduce, cot: Cot) -> None:
    """The reverse running sum, Σ over j' ≥ j: the total, less the running sum, plus the
    term itself (or as a rewrite of BACKWARD_REWRITES writes it)."""
    g = d.named(cot, node)
    total = Reduce("sum", node.over, g.node, None)
    running = negated(Reduce("cumsum", node.over, g.node, None))
    plain = Cot(Sum((total, running, g.node), None), g.free, g.all)
    d.back(node.body, d.into(node.body, d.rewritten("running", plain, node, g)))


@adjoint("cumprod")
def reduce_cumprod(d: Walk, node: Reduce, cot: Cot) -> None:
    """Entry j of the running product y is Π over j' ≤ j of x: x_j's cotangent is Σ over
    j' ≥ j of g y, the reverse running sum as cumsum's (the total, less the running sum, plus
    the term), over x_j. Not finite where an entry is 0 (autograd's is)."""
    g, y, x = d.named(cot, node), d.value(node), d.value(node.body)
    gy = Product((g.node, y.node), (), None)
    total = Reduce("sum", node.over, gy, None)
    running = negated(Reduce("cumsum", node.over, gy, None))
    over_x = Apply("pow", (x.node, MINUS), None)
    free = frozenset(node.body.free)
    slope = Product((Sum((total, running, gy), None), over_x), (), None)
    d.back(node.body, d.into(node.body, Cot(slope, free, free | g.all | y.all | x.all)))


def back_concat(d: Walk, node: Concat, cot: Cot) -> None:
    """Each part's cotangent is the whole's, read where the part was written: at
    [c] for the first, [N_c + τ] for the second."""
    if not cot.layout or node.over not in cot.free:
        cot = d.materialize(cot, "d" + d.eq.tensor.name, node.free)
    offset = sympy.Integer(0)
    for part, along in zip(node.parts, node.along):
        slot = At(Field(offset + along.symbol, (along,), None), None)
        axes = tuple(tuple(slot if i == node.over else i for i in a) for a in cot.layout)
        free = (cot.free - {node.over}) | {along}
        d.back(part, d.into(part, Cot(Ref(cot.node.tensor, axes, None), free, free)))
        offset += along.size


BACK = {
    Ref: back_ref,
    Field: back_field,
    Sum: back_sum,
    Product: back_product,
    Apply: back_apply,
    Reduce: back_reduce,
    Concat: back_concat,
}
STRUCTURAL = {"where": back_where, "dropout": back_dropout}  # the functions without a rule
