"""Which steps depend on sizes and scalars only: tensors of positions, and whatever is
computed from them alone (cos and sin of rotary angles, ALiBi's slopes times distances, masks
summed). The generated module builds these in its constants function, once per shape, and the
spec's function computes the rest on every call."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields

from .steps import (
    Add,
    Cat,
    Choose,
    Contract,
    Elementwise,
    Flip,
    Full,
    Gather,
    Grid,
    Operand,
    Plan,
    Reduction,
    Rename,
    Slice,
    Spans,
    Step,
    Var,
    Whole,
)

PURE = (
    *(Grid, Contract, Add, Elementwise, Rename, Full, Reduction, Gather, Flip, Slice, Cat),
    *(Whole, Choose, Spans),
)


@dataclass(frozen=True)
class Split:
    """Each block's steps, in two parts; `held`: the constants the spec's function reads."""

    constant: tuple[tuple[Step, ...], ...]
    per_call: tuple[tuple[Step, ...], ...]
    held: tuple[Var, ...]


def split(plan: Plan) -> Split:
    made = constant(plan.steps)
    parts = [
        (
            tuple(s for s in block.steps if s.out.var in made),
            tuple(s for s in block.steps if s.out.var not in made),
        )
        for block in plan.blocks
    ]
    read = {o.var for _, rest in parts for s in rest for o in operands(s)}
    read |= {r.var for r in plan.results}
    read |= {s.positions.var for s in plan.steps if isinstance(s, Gather)}  # checked at calls
    held = tuple(s.out.var for fixed, _ in parts for s in fixed if s.out.var in read)
    return Split(tuple(f for f, _ in parts), tuple(r for _, r in parts), held)


def constant(steps: tuple[Step, ...]) -> set[Var]:
    """The values of `steps` that depend on sizes and scalars only."""
    made: set[Var] = set()
    for step in steps:
        if _hoistable(step, made):
            made.add(step.out.var)
    return made


def _hoistable(step: Step, constant: set[Var]) -> bool:
    if isinstance(step, Grid):
        return True
    if not isinstance(step, PURE) or (isinstance(step, Elementwise) and step.fn == "dropout"):
        return False
    return all(o.var in constant for o in operands(step))


def read_counts(steps, results) -> Counter:
    """How many times each value is read: by the steps, and once more as an output."""
    return Counter([*(o.var for s in steps for o in operands(s)), *(r.var for r in results)])


def operands(step: Step) -> tuple[Operand, ...]:
    """The operands a step reads (not its result); a choice reads what its branches read
    from before it."""
    if isinstance(step, Choose):
        inner = [s for branch in step.branches for s in branch]
        made = {s.out.var for s in inner}
        return tuple(o for s in inner for o in operands(s) if o.var not in made)
    found: list[Operand] = []
    for f in fields(step):
        if f.name in ("out", "outs"):
            continue
        value = getattr(step, f.name)
        values = value if isinstance(value, tuple) else (value,)
        found += [v for v in values if isinstance(v, Operand)]
    return tuple(found)
