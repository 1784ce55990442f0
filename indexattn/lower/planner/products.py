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
from ..program.steps import Arg, Choose, Contract, Elementwise, Number, Operand
from .fusion import direct, linear_form
from .order import choice, orders, planning_count, result_dims
from .sinks import sink


class Products:
    """Mixed into the Planner, which supplies var, add, node, ordered, linear, prefix_product,
    sink_softmax and the equations `defined`."""

    def node_Product(self, node: ir.Product, hint: str) -> Arg:
        """The first rule of PRODUCT_RULES that plans the product."""
        for rule in PRODUCT_RULES:
            found = rule.plan(self, node, hint)
            if found is not None:
                return found
        raise AssertionError("the last rule, contract, plans every product")

    def sink_rule(self, node: ir.Product, hint: str) -> Arg | None:
        found = sink(node, self.defined)
        return self.sink_softmax(found, hint) if found is not None else None

    def linear_rule(self, node: ir.Product, hint: str) -> Arg | None:
        form = linear_form(node)
        return self.linear(form, hint + "_proj") if form is not None and direct(form) else None

    def spread_rule(self, node: ir.Product, hint: str) -> Arg | None:
        spread = _spread(node)
        return self.node(spread, hint) if spread is not None else None

    def quotient_rule(self, node: ir.Product, hint: str) -> Arg | None:
        below = [f for f in node.factors if denominator(f)]
        summed_below = set(node.summed) & {i for f in below for i in f.free}
        if below and len(below) < len(node.factors) and not summed_below:
            return self.quotient(node, below, hint)
        return None

    def contract_rule(self, node: ir.Product, hint: str) -> Arg:
        scale = sympy.Integer(1)
        tensors: list[Operand] = []
        floats = node.summed and any(kind(f) == "float" for f in node.factors)
        for factor in node.factors:
            value = self.node(factor, hint)
            if isinstance(value, Number):
                scale = scale * value.expr
            elif floats and kind(factor) == "int" and ir.refs(factor):
                tensors.append(self.floated(value))
            else:
                tensors.append(value)
        if len(tensors) <= 2:
            return self.contract(tensors, node.free, scale, hint)
        return self.contract_path(tensors, node, scale, hint)

    def floated(self, value: Operand) -> Operand:
        """Integer data summed against floats (`P_<τ> dθ_<τj>`, a rotary base's gradient):
        in the call's dtype, as matmul and einsum take no mixed dtypes."""
        out = Operand(self.var(value.var.hint + "_float"), value.dims, value.batched)
        return self.add(Elementwise(out, "narrow", (value,)))

    def quotient(self, node: ir.Product, below: list[ir.Node], hint: str) -> Arg:
        """`a / b` written as a division: the numerator's sums stay above the bar."""
        above = [f for f in node.factors if f not in below]
        numerator = ir.Product(tuple(above), node.summed, node.span) if len(above) > 1 else above[0]
        bases = tuple(f.args[0] for f in below)
        divisor = ir.Product(bases, (), node.span) if len(bases) > 1 else bases[0]
        args = (self.node(numerator, hint), self.node(divisor, hint))
        out = Operand(self.var(hint + "_div"), self.ordered(node.free), any(map(_batched, args)))
        return self.add(Elementwise(out, "/", args))

    def contract(
        self, args: list[Operand], dims: tuple[Index, ...], scale: sympy.Basic, hint: str
    ) -> Operand:
        if scale != 1 and len(args) > 1:
            args = self.prescale(args, scale)
            scale = sympy.Integer(1)
        out = Operand(self.var(hint + "_prod"), self.ordered(dims), any(a.batched for a in args))
        return self.add(Contract(out, tuple(args), scale))

    def prescale(self, args: list[Operand], scale: sympy.Basic) -> list[Operand]:
        """The scale goes onto the smallest factor, before the product: Q / sqrt(d_k) keeps
        float16 scores from overflowing where (Q K) / sqrt(d_k) would not."""
        k = min(range(len(args)), key=lambda j: planning_count(args[j].dims))
        arg = args[k]
        out = Operand(
            self.var(arg.var.hint.removesuffix("_split") + "_scaled"), arg.dims, arg.batched
        )
        return [*args[:k], self.add(Contract(out, (arg,), scale)), *args[k + 1 :]]

    def contract_path(
        self, args: list[Operand], node: ir.Product, scale: sympy.Basic, hint: str
    ) -> Operand:
        """Pairwise contractions in the cheapest order, or, where that depends on the sizes,
        each order worth taking in a branch of its own."""
        found = orders([a.dims for a in args], node.free)
        if len(found) == 1:
            return self.follow(args, node, scale, hint, found[0].path)
        steps, seen, branches = self.steps, self.seen, []
        for order in found:
            self.steps, self.seen = [], ChainMap({}, seen)  # the branch's own, over all before
            self.follow(args, node, scale, hint, order.path)
            branches.append(tuple(self.steps))
        self.steps, self.seen = steps, seen
        out = Operand(
            self.var(hint + "_prod"), self.ordered(node.free), any(a.batched for a in args)
        )
        return self.add(Choose(out, choice(found), tuple(branches)))

    def follow(self, args, node: ir.Product, scale: sympy.Basic, hint: str, path) -> Operand:
        """The pairwise contractions of one path; the scale goes onto the last."""
        pending = list(args)
        for pair in path:
            chosen = [pending[k] for k in pair]
            pending = [a for k, a in enumerate(pending) if k not in pair]
            dims = result_dims([a.dims for a in chosen], [a.dims for a in pending], node.free)
            last = sympy.Integer(1) if pending else scale
            pending.append(self.contract(chosen, dims, last, hint))
        return pending[0]


@dataclass(frozen=True)
class Rule:
    """One way to plan a product (or a reduction, plan.py): `plan(planner, node, hint)` gives
    its value, or None where the rule does not apply."""

    name: str
    plan: Callable[[Products, ir.Node, str], Arg | None]


# The planner's rules for a product, in order: the first that applies plans it.
PRODUCT_RULES = (
    Rule("prefix", lambda p, node, hint: p.prefix_product(node, hint)),  # prefix.py: by chunks
    Rule("sink", Products.sink_rule),  # sinks.py: a softmax with one more logit
    Rule("convolve", lambda p, node, hint: p.convolve_rule(node, hint)),  # conv.py
    Rule("linear", Products.linear_rule),  # a weight against one operand: F.linear
    Rule("spread", Products.spread_rule),  # a number times a sum of products
    Rule("quotient", Products.quotient_rule),  # `a / b` with sums above the bar
    Rule("contract", Products.contract_rule),  # einsum, pairwise in the cheapest order
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
