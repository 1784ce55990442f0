"""The passes from the planner's program to the one the code printer prints, in order. Each
takes a `Program` and returns one that computes the same values (tests/lower/test_passes.py runs
the program after every pass against the literal interpreter, on every shipped spec and on
random ones); each module's docstring says what its pass does and why."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..program import Program
from . import hoist, inplace, liveness, rows, scales, softmax_values, spans, tables


@dataclass(frozen=True)
class Pass:
    """One pass: its name (`indexattn compile --dump-after NAME`), its function, and what the
    program it returns guarantees besides the same values."""

    name: str
    run: Callable[[Program], Program]
    guarantees: str


PASSES = (
    Pass("scales", scales.run, "a scale of a scale read once is one scale"),
    Pass("hoist", hoist.run, "steps of sizes and scalars alone are built once per shape"),
    Pass("rows", rows.run, "steps over two sequence indices run by blocks of rows"),
    Pass("spans", spans.run, "blocks of rows skip the keys a constant mask hides"),
    Pass("tables", tables.run, "tables over two sequence indices are made per block of rows"),
    Pass("inplace", inplace.run, "wide steps write over fresh tensors read once"),
    Pass("softmax_values", softmax_values.run, "a softmax (and dropout) times values: one step"),
    Pass("liveness", liveness.run, "each block drops the locals it reads for the last time"),
)
NAMES = tuple(p.name for p in PASSES)


def stages(
    program: Program, passes: tuple[Pass, ...] = PASSES, *, each: bool = True
) -> Iterator[tuple[str, Program]]:
    """The planner's program ("plan"), then the program after each pass, by name; each is
    checked (`Program.check`) before it is handed on, or with `each=False` the planner's and
    the last alone (a compile's own run: tests/lower/test_passes.py checks every pass's)."""
    program.check()
    yield "plan", program
    for k, one in enumerate(passes, 1):
        program = one.run(program)
        if each or k == len(passes):
            program.check()
        yield one.name, program
