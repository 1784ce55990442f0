"""Softmax weights times the values outside the kernel, as one step of autograd. Where a spec
returns its weights (GPT-2's `output_attentions`, torch's MultiheadAttention) the kernel
cannot compute them, and autograd's own steps make three tensors of the scores' size in the
backward: the product's gradient, its sum with the weights' own gradient, and the softmax's
gradient. `softmax_values` (kernels_emit) makes one, written over in place.

The steps it takes, one after the other: `W = softmax(S)` over the last axis of scores it
may write over (the softmax's `into`: read nowhere else), optionally `W = dropout(W, p)`,
and `O = W @ V` (no scale), each intermediate read by the next step alone and by the
outputs. One after the other, so that no step (another dropout's draw) moves between them."""

from __future__ import annotations

from collections import Counter

from ..program import Program
from ..steps import Contract, Elementwise, Number, Operand, Reduction, SoftmaxValues, Step, Var
from .hoist import read_counts


def run(program: Program) -> Program:
    """The program with each softmax, dropout and product of the spec's function that can go
    as one step replaced by it (in the product's place)."""
    per_call = [s for b in program.blocks for s in program.per_call(b)]
    reads = read_counts(per_call, program.results)
    results = {r.var for r in program.results}
    flat = [s for s in per_call if program.region(s) == "call"]
    new: dict[Var, Step | None] = {}  # the product's value: the step that replaces it
    for k, step in enumerate(flat):
        for before in (flat[k - 1 : k], flat[k - 2 : k] if k >= 2 else []):
            found = _chain(before, step, reads, results)  # a softmax (and a dropout) before
            if found is not None:
                new[step.out.var] = found
                new.update(dict.fromkeys((s.out.var for s in before), None))
    return program.with_steps(new)


def _chain(before: list[Step], step: Step, reads: Counter, results: set[Var]):
    """The fused step for `before` (a softmax, then maybe a dropout) and `step` (the product
    of their weights and the values); None where they are not such steps."""
    if not isinstance(step, Contract) or step.scale != 1 or step.into or len(step.args) != 2:
        return None
    weights, values = step.args
    if not _product(weights, values, step.out) or not _read_once(weights, reads, results):
        return None
    if not before or before[-1].out.var != weights.var:
        return None
    softmax, dropout = before[0], None
    if len(before) == 2:
        dropout = _dropout(before[1], softmax, reads)
        if dropout is None:
            return None
    if not _softmax(softmax):
        return None
    return SoftmaxValues((weights, step.out), softmax.arg, values, dropout, softmax.safe)


def _dropout(step: Step, softmax: Step, reads: Counter):
    """The probability of a dropout of the softmax's weights as they are; None where `step`
    is not one."""
    if not isinstance(step, Elementwise) or step.fn != "dropout":
        return None
    inner, p = step.args
    if not isinstance(p, Number) or not _read_once(inner, reads, set()) or inner.select:
        return None
    return p.expr if (inner.var, inner.dims) == (softmax.out.var, step.out.dims) else None


def _read_once(op, reads: Counter, results: set[Var]) -> bool:
    """Read by the next step alone (and by the outputs, where it is one)."""
    return isinstance(op, Operand) and reads[op.var] == 1 + (op.var in results)


def _product(weights, values, out: Operand) -> bool:
    """`out = weights @ values`: the weights (…, row, key) as they are, the values holding
    the key, the width and every batch axis, and nothing else."""
    if not isinstance(weights, Operand) or not isinstance(values, Operand) or weights.select:
        return False
    if len(out.dims) < 2:
        return False
    *batch, row, width = out.dims
    key = weights.dims[-1] if weights.dims else None
    return (
        weights.dims == (*batch, row, key)
        and sorted(values.dims, key=str) == sorted((*batch, key, width), key=str)
        and key != width
        and weights.batched == values.batched
    )


def _softmax(step: Step) -> bool:
    """A softmax over the last axis alone that may write over its scores (`into`: scores
    read nowhere else, in the weights' own layout)."""
    return (
        isinstance(step, Reduction)
        and step.fn == "softmax"
        and step.sink is None
        and step.into
        and step.over == step.out.dims[-1:]
    )
