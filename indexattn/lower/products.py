"""The planner's products: a weight against one operand is `F.linear`; otherwise the scale
goes onto the smallest factor and three or more factors are contracted pairwise in the order
`order` chooses."""

from __future__ import annotations

import sympy

from .. import ir
from ..ir import Index
from ..ir.einstein import denominator
from .fusion import linear_form, whole
from .order import pairwise, planning_count
from .steps import Arg, Contract, Elementwise, Number, Operand


class Products:
    """Mixed into the Planner, which supplies var, add, node, ordered and linear."""

    def node_Product(self, node: ir.Product, hint: str) -> Arg:
        form = linear_form(node)
        if form is not None and whole(form):
            return self.linear(form, hint + "_proj")
        below = [f for f in node.factors if denominator(f)]
        summed_below = set(node.summed) & {i for f in below for i in f.free}
        if below and len(below) < len(node.factors) and not summed_below:
            return self.quotient(node, below, hint)
        scale = sympy.Integer(1)
        tensors: list[Operand] = []
        for factor in node.factors:
            value = self.node(factor, hint)
            if isinstance(value, Number):
                scale = scale * value.expr
            else:
                tensors.append(value)
        if len(tensors) <= 2:
            return self.contract(tensors, node.free, scale, hint)
        return self.contract_path(tensors, node, scale, hint)

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
        """Pairwise contractions in the order opt_einsum chooses."""
        pending = list(args)
        for pair in pairwise([a.dims for a in args], node.free):
            chosen = [pending[k] for k in pair]
            pending = [a for k, a in enumerate(pending) if k not in pair]
            last = not pending
            rest = {i for a in pending for i in a.dims} | set(node.free)
            dims = (
                node.free
                if last
                else tuple(dict.fromkeys(i for a in chosen for i in a.dims if i in rest))
            )
            pending.append(self.contract(chosen, dims, scale if last else sympy.Integer(1), hint))
        return pending[0]


def _batched(arg: Arg) -> bool:
    return isinstance(arg, Operand) and arg.batched
