"""The one way from a checked spec to the program the code printer prints: the canonical
form (canonical.REWRITES), the planner's program, then every pass of passes.PASSES. The
runtime, the command line and the tests all call it; `indexattn compile --dump-after STAGE`
prints any stage, "canonical" as spec text, the others as programs."""

from __future__ import annotations

from collections.abc import Iterator

from ..ir import Spec, printer
from .planner import canonical
from .planner.plan import Planner
from .program import passes
from .program.program import Program

STAGES = ("canonical", "plan", *passes.NAMES)


def stages(
    spec: Spec,
    rewrites: tuple[canonical.Rewrite, ...] | None = None,
    pipeline: tuple[passes.Pass, ...] = passes.PASSES,
    *,
    each: bool = True,
    backend: str = "auto",
) -> Iterator[tuple[str, Spec | Program]]:
    """("canonical", the spec the planner reads), ("plan", its program), then the program
    after each pass, by name; `each`: every program checked (`Program.check`), else the
    planner's and the last alone (a compile's own run). `backend`: the attention core's
    (indexattn/backends)."""
    spec = canonical.canonical(spec, rewrites)
    yield "canonical", spec
    yield from passes.stages(Planner(spec, backend).plan(), pipeline, each=each)


def pipeline(spec: Spec, after: str | None = None, backend: str = "auto") -> Spec | Program:
    """The program after every pass (what the generated module prints), or the stage named
    `after` (a canonical spec, or a program checked after each pass); ValueError naming the
    stages for a name that is none of them."""
    if after is not None and after not in STAGES:
        raise ValueError(f"no stage named {after!r}; the stages are {', '.join(STAGES)}")
    for name, found in stages(spec, each=after is not None, backend=backend):
        if name == after:
            return found
    return found


def plan(spec: Spec) -> Program:
    """`plan(check(text, "mha"))` -> the program of steps that the passes then transform:
    the plan of the spec's canonical form, the "plan" stage."""
    return pipeline(spec, after="plan")


def dump(spec: Spec, after: str, backend: str = "auto") -> str:
    """The stage `after` as text: the canonical spec as the language writes it, a program as
    its steps."""
    found = pipeline(spec, after, backend)
    return printer.spec_text(found) if isinstance(found, Spec) else str(found)
