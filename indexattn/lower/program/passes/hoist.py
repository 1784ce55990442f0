"""Which steps depend on sizes and scalars only: tensors of positions, and whatever is
computed from them alone (cos and sin of rotary angles, ALiBi's slopes times distances, masks
summed). The generated module builds these in its constants function, once per shape, and the
spec's function computes the rest on every call."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..kinds import constant, reads
from ..program import Program
from ..steps import Gather


def run(program: Program) -> Program:
    """The program with its constant steps marked, and those the spec's function reads held."""
    made = constant(program.steps)
    per_call = [s for s in program.steps if s.out.var not in made]
    read = {o.var for s in per_call for o in reads(s)}
    read |= {r.var for r in program.results}
    read |= {s.positions.var for s in program.steps if isinstance(s, Gather)}  # checked at calls
    held = tuple(s.out.var for s in program.steps if s.out.var in made and s.out.var in read)
    return replace(program, constant=frozenset(made), held=held)


def read_counts(steps, results) -> Counter:
    """How many times each value is read: by the steps, and once more as an output."""
    return Counter([*(o.var for s in steps for o in reads(s)), *(r.var for r in results)])
