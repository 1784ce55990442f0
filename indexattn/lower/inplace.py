"""Sums over two sequence indices that add onto a product in place, `S = S_prod.add_(M)`:
where one term is a fresh tensor of the sum's own shape that nothing else reads, the N×N
scores are held once, not twice (smaller sums keep the plainer `M + S_prod`). Exact under
autograd: the steps that make such a term (a product, a scaled tensor, a sum) keep their
operands for the backward pass, never their result.

A softmax over such scores, read by nothing else, writes its weights over them when no
gradient is needed (`out=S`): a new tensor of N×N per head costs more in page faults than
the softmax's arithmetic (docs/decisions.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..ir import Spec
from .blocked import sequence_indices
from .hoist import operands
from .steps import Add, Arg, Contract, Operand, Reduction, Step, Var


def accumulate(spec: Spec, per_call: tuple[tuple[Step, ...], ...], results: tuple[Operand, ...]):
    """The per-call steps, each wide sum marked with the term it adds onto (`Add.into`)."""
    steps = [s for block in per_call for s in block]
    reads = Counter(o.var for s in steps for o in operands(s))
    reads.update(r.var for r in results)
    fresh = {s.out.var for s in steps if _fresh(s)}
    sequence = sequence_indices(spec)
    wide = {s.out.var for s in steps if len(sequence & set(s.out.dims)) >= 2}
    return tuple(tuple(_into(s, fresh & wide, reads) for s in block) for block in per_call)


def _softmax_into(step: Step, fresh: set[Var], reads: Counter) -> Step:
    """A softmax along one axis over fresh scores nothing else reads, marked `into`."""
    if not (isinstance(step, Reduction) and step.fn == "softmax" and len(step.over) == 1):
        return step
    if step.sink is None and _target(step.arg, step.out, fresh, reads):
        return replace(step, into=True)
    return step


def _fresh(step: Step) -> bool:
    """Steps whose result is a new tensor, not a view of what they read."""
    if isinstance(step, Contract):
        return len(step.args) > 1 or step.scale != 1
    return isinstance(step, Add)


def _into(step: Step, fresh: set[Var], reads: Counter) -> Step:
    """The sum marked with its last (widest) term that can take the others in place: one the
    others broadcast into, as a batched term does where the others' batch axes are its own."""
    if not isinstance(step, Add):
        return _softmax_into(step, fresh, reads)
    signs = step.signs or (1,) * len(step.args)
    for k in reversed(range(len(step.args))):
        term, others = step.args[k], step.args[:k] + step.args[k + 1 :]
        if signs[k] > 0 and _target(term, step.out, fresh, reads) and _fits(term, others):
            return replace(step, into=k)
    return step


def _target(term: Arg, out: Operand, fresh: set[Var], reads: Counter) -> bool:
    return (
        isinstance(term, Operand)
        and term.var in fresh
        and reads[term.var] == 1
        and term.dims == out.dims
        and not term.select
    )


def _fits(term: Operand, others: tuple[Arg, ...]) -> bool:
    return term.batched or not any(isinstance(a, Operand) and a.batched for a in others)
