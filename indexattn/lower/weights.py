"""Softmax weights that are returned and multiplied by the values: one step of autograd.
Where a spec returns its weights (GPT-2's `output_attentions`, torch's MultiheadAttention),
the kernel cannot compute them, and autograd's own steps make three tensors of the scores'
size in the backward: the product's gradient, its sum with the weights' own gradient, and
the softmax's gradient. `softmax_values` (kernels_emit) makes one, written over in place.

The steps it takes: `W = softmax(S)` over the last axis of scores read nowhere else (the
softmax may overwrite them), optionally `W = dropout(W, p)`, and `O = W @ V` (no scale),
each intermediate read by the next step alone (and by the outputs)."""

from __future__ import annotations

from collections import Counter

from .steps import Contract, Elementwise, Number, Operand, Reduction, SoftmaxValues, Step, Var


def fuse(blocks: list[tuple[Step, ...]], reads: Counter, results: set[Var]):
    """The blocks' steps with each softmax, dropout and product that can go as one step
    replaced by it (in the product's block)."""
    flat = [s for block in blocks for s in block]
    made = {s.out.var: s for s in flat}
    fused: dict[int, SoftmaxValues] = {}  # the product's place: the step that replaces it
    gone: set[int] = set()
    for step in flat:
        found = _chain(step, made, reads, results)
        if found is not None:
            fused[id(step)] = found[0]
            gone.update(map(id, found[1]))
    return [tuple(fused.get(id(s), s) for s in block if id(s) not in gone) for block in blocks]


def _chain(step: Step, made: dict, reads: Counter, results: set[Var]):
    """The fused step for a product of softmax weights and values, and the steps it takes
    the place of; None where `step` is not such a product."""
    if not isinstance(step, Contract) or step.scale != 1 or step.into or len(step.args) != 2:
        return None
    weights, values = step.args
    if not _product(weights, values, step.out) or reads[weights.var] != 1 + (
        weights.var in results
    ):
        return None
    source, dropout, taken = made.get(weights.var), None, []
    if isinstance(source, Elementwise) and source.fn == "dropout":
        inner, p = source.args
        if not isinstance(inner, Operand) or not isinstance(p, Number):
            return None
        if inner.var in results or reads[inner.var] != 1 or inner.dims != source.out.dims:
            return None
        dropout, taken, source = p.expr, [source], made.get(inner.var)
    if not _softmax(source, reads):
        return None
    return SoftmaxValues((weights, step.out), source.arg, values, dropout, source.safe), [
        source,
        *taken,
    ]


def _product(weights, values, out: Operand) -> bool:
    """`out = weights @ values`: the weights (…, row, key) as they are, the values holding
    the key, the width and every batch axis."""
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


def _softmax(step: Step | None, reads: Counter) -> bool:
    """A softmax over the last axis alone of scores read nowhere else, into (…, row, key)."""
    if not isinstance(step, Reduction) or step.fn != "softmax" or step.sink is not None:
        return False
    scores, out = step.arg, step.out
    return (
        step.over == out.dims[-1:]
        and step.into
        and scores.dims == out.dims
        and not scores.select
        and reads[scores.var] == 1
    )
