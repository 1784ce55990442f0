"""The planner's products, by the first rule of PRODUCT_RULES that applies: a weight against
one operand is `F.linear`; otherwise the scale goes onto the smallest factor and three or
more factors are contracted pairwise in the order `order` chooses (by the call's sizes where
the best order depends on them)."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ... import ir
from ...ir import Index
from ...ir.einstein import denominator
from ...ir.kinds import kind
from ..program.steps import Arg, Choose, Contract, Elementwise, Number, Operand, Reduction
from .conv import convolve_rule
from .fusion import direct, linear_form
from .order import choice, orders, prescale, result_dims
from .prefix import prefix_rule
from .sinks import Sink, sink


def sink_rule(planner, node: ir.Product, hint: str) -> Arg | None:
    found = sink(node, planner.defined)
    return sink_softmax(planner, found, hint) if found is not None else None


def sink_softmax(planner, found: Sink, hint: str) -> Operand:
    """A softmax with one more logit in its denominator (lower/planner/sinks.py)."""
    body = planner.as_tensor(planner.node(found.scores, hint), hint)
    logit = planner.as_tensor(planner.node(found.logit, hint + "_sink"), hint + "_sink")
    out = Operand(planner.var(f"{hint}_softmax"), body.dims, body.batched)
    return planner.add(Reduction(out, "softmax", body, (found.over,), sink=logit))


def linear_rule(planner, node: ir.Product, hint: str) -> Arg | None:
    form = linear_form(node)
    return planner.linear(form, hint + "_proj") if form is not None and direct(form) else None


def spread_rule(planner, node: ir.Product, hint: str) -> Arg | None:
    spread = _spread(node)
    return planner.node(spread, hint) if spread is not None else None


def quotient_rule(planner, node: ir.Product, hint: str) -> Arg | None:
    below = [f for f in node.factors if denominator(f)]
    summed_below = set(node.summed) & {i for f in below for i in f.free}
    if below and len(below) < len(node.factors) and not summed_below:
        return quotient(planner, node, below, hint)
    return None


def contract_rule(planner, node: ir.Product, hint: str) -> Arg:
    scale = sympy.Integer(1)
    tensors: list[Operand] = []
    floats = node.summed and any(kind(f) == "float" for f in node.factors)
    for factor in node.factors:
        value = planner.node(factor, hint)
        if isinstance(value, Number):
            scale = scale * value.expr
        elif floats and kind(factor) == "int" and ir.refs(factor):
            tensors.append(floated(planner, value))
        else:
            tensors.append(value)
    if len(tensors) <= 2:
        return contract(planner, tensors, node.free, scale, hint)
    return contract_path(planner, tensors, node, scale, hint)


def floated(planner, value: Operand) -> Operand:
    """Integer data summed against floats (`P_<τ> dθ_<τj>`, a rotary base's gradient):
    in the call's dtype, as matmul and einsum take no mixed dtypes."""
    out = Operand(planner.var(value.var.hint + "_float"), value.dims, value.batched)
    return planner.add(Elementwise(out, "narrow", (value,)))


def quotient(planner, node: ir.Product, below: list[ir.Node], hint: str) -> Arg:
    """`a / b` written as a division: the numerator's sums stay above the bar."""
    above = [f for f in node.factors if f not in below]
    numerator = ir.Product(tuple(above), node.summed, node.span) if len(above) > 1 else above[0]
    bases = tuple(f.args[0] for f in below)
    divisor = ir.Product(bases, (), node.span) if len(bases) > 1 else bases[0]
    args = (planner.node(numerator, hint), planner.node(divisor, hint))
    out = Operand(planner.var(hint + "_div"), planner.ordered(node.free), any(map(_batched, args)))
    return planner.add(Elementwise(out, "/", args))


def contract(
    planner, args: list[Operand], dims: tuple[Index, ...], scale: sympy.Basic, hint: str
) -> Operand:
    if scale != 1 and len(args) > 1:
        args = prescale(planner, args, scale)
        scale = sympy.Integer(1)
    out = Operand(planner.var(hint + "_prod"), planner.ordered(dims), any(a.batched for a in args))
    return planner.add(Contract(out, tuple(args), scale))


def contract_path(
    planner, args: list[Operand], node: ir.Product, scale: sympy.Basic, hint: str
) -> Operand:
    """Pairwise contractions in the cheapest order, or, where that depends on the sizes,
    each order worth taking in a branch of its own."""
    found = orders([a.dims for a in args], node.free)
    if len(found) == 1:
        return follow(planner, args, node, scale, hint, found[0].path)
    steps, seen, branches = planner.steps, planner.seen, []
    for order in found:
        planner.steps, planner.seen = [], ChainMap({}, seen)  # the branch's own, over all before
        follow(planner, args, node, scale, hint, order.path)
        branches.append(tuple(planner.steps))
    planner.steps, planner.seen = steps, seen
    out = Operand(
        planner.var(hint + "_prod"), planner.ordered(node.free), any(a.batched for a in args)
    )
    return planner.add(Choose(out, choice(found), tuple(branches)))


def follow(planner, args, node: ir.Product, scale: sympy.Basic, hint: str, path) -> Operand:
    """The pairwise contractions of one path; the scale goes onto the last."""
    pending = list(args)
    for pair in path:
        chosen = [pending[k] for k in pair]
        pending = [a for k, a in enumerate(pending) if k not in pair]
        dims = result_dims([a.dims for a in chosen], [a.dims for a in pending], node.free)
        last = sympy.Integer(1) if pending else scale
        pending.append(contract(planner, chosen, dims, last, hint))
    return pending[0]


@dataclass(frozen=True)
class Rule:
    """One way to plan a product (or a reduction, plan.py): `plan(planner, node, hint)` gives
    its value, or None where the rule does not apply. The planner (plan.py's) is the rule's
    context: what it plans into (`var`, `add`, `steps`) and the spec's facts it has found."""

    name: str
    plan: Callable[..., Arg | None]


# The planner's rules for a product, in order: the first that applies plans it.
PRODUCT_RULES = (
    Rule("prefix", prefix_rule),  # prefix.py: by chunks
    Rule("sink", sink_rule),  # sinks.py: a softmax with one more logit
    Rule("convolve", convolve_rule),  # conv.py
    Rule("linear", linear_rule),  # a weight against one operand: F.linear
    Rule("spread", spread_rule),  # a number times a sum of products
    Rule("quotient", quotient_rule),  # `a / b` with sums above the bar
    Rule("contract", contract_rule),  # einsum, pairwise in the cheapest order
)


def _spread(node: ir.Product) -> ir.Sum | None:
    """A number times a sum of contractions, `(Q K + R P) / c`, as `Q K / c + R P / c`: the
    number then scales each contraction's smallest factor, not the sum's (N×N) result."""
    numbers = [f for f in node.factors if isinstance(f, ir.Field) and not f.free]
    rest = [f for f in node.factors if not (isinstance(f, ir.Field) and not f.free)]
    if node.summed or not numbers or len(rest) != 1 or not isinstance(rest[0], ir.Sum):
        return None
    terms = rest[0].terms
    if not all(isinstance(t, ir.Product) and t.summed for t in terms):
        return None
    scaled = tuple(ir.Product((*t.factors, *numbers), t.summed, t.span) for t in terms)
    return ir.Sum(scaled, rest[0].span)


def _batched(arg: Arg) -> bool:
    return isinstance(arg, Operand) and arg.batched
