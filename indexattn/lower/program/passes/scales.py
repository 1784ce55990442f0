"""A scale of a scale is one scale: `T = x / 3`, read only by `y = 2 T`, becomes
`y = x * (2/3)`, one pass over the values where there were two and no tensor between them.
Exact in real numbers; in floating point one rounding of the product of the scales (sympy
multiplies them exactly) replaces the rounding of each step."""

from __future__ import annotations

from dataclasses import replace

from ..program import Program
from ..steps import Contract, Step, Var
from .hoist import read_counts


def run(program: Program) -> Program:
    """The program with each scale of a scale that nothing else reads folded into one."""
    reads = read_counts(program.steps, program.results)
    makers = {s.out.var: s for s in program.steps}
    new: dict[Var, Step | None] = {}
    for step in program.steps:
        inner = makers.get(step.args[0].var) if _scale(step) else None
        if inner is None or not _scale(inner) or reads[inner.out.var] != 1:
            continue
        read = step.args[0]
        if read.select or (read.dims, read.batched) != (inner.out.dims, inner.out.batched):
            continue  # read in another layout than made: the fold would relayout twice
        folded = replace(step, args=inner.args, scale=inner.scale * step.scale)
        makers[step.out.var] = new[step.out.var] = folded
        new[inner.out.var] = None
    return program.with_steps(new)


def _scale(step: Step) -> bool:
    """A tensor times a number, not yet written in place."""
    return isinstance(step, Contract) and len(step.args) == 1 and step.scale != 1 and not step.into
