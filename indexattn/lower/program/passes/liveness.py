"""Where the spec's function lets go of its values: after the block that reads a local for
the last time, `del` drops it, so the projections and the parts of a rotation are freed as
soon as the next equation no longer needs them, as hand-written code frees a rebound name."""

from __future__ import annotations

from dataclasses import replace

from ..kinds import made, over, reads, view
from ..program import Program
from ..steps import Step, Var


def run(program: Program) -> Program:
    """The program with each block's `drop`: the locals of the spec's function it reads for
    the last time, and the rows' function its own. The held constants, the results and the
    rows' inputs stay in the spec's function (the
    comprehension over blocks of rows closes over them, and torch.compile cannot trace a
    `del` of a closed-over name: DELETE_DEREF)."""
    keep = {*program.held, *(r.var for r in program.results)}
    keep |= set(program.rows.inputs) if program.rows is not None else set()
    keep |= {program.spans.step.out.var} if program.spans is not None else set()
    keep |= {o.var for s in program.steps if program.region(s) == "table" for o in reads(s)}
    main = [tuple(s for s in b.steps if program.region(s) == "call") for b in program.blocks]
    dead = deaths(main, keep)
    blocks = tuple(replace(b, drop=d) for b, d in zip(program.blocks, dead))
    rows = program.rows
    if rows is not None:  # the rows' function lets go of its own locals the same way
        inner = [tuple(s for s in b.steps if program.region(s) == "rows") for b in program.blocks]
        rows = replace(rows, drop=tuple(deaths(inner, {e.var for e in rows.exits})))
    return replace(program, blocks=blocks, rows=rows)


def deaths(blocks: list[tuple[Step, ...]], keep: set[Var]) -> list[tuple[Var, ...]]:
    """For each block of per-call steps, the locals to drop after it: those made by these
    steps, read no later than it, not in `keep`. A view, or a result written over what it
    reads, lives as long as that storage (both are dropped together); nothing is dropped
    after the last block that computes anything (the function returns there)."""
    born: dict[Var, int] = {}  # each local, and the block that makes it
    root: dict[Var, Var] = {}  # a view's storage: the first local of its chain
    last: dict[Var, int] = {}  # each storage's last reading block
    for b, steps in enumerate(blocks):
        for step in steps:
            read = [o.var for o in reads(step)]
            for var in read:
                last[root.get(var, var)] = b
            for out in made(step):
                born.setdefault(out.var, b)
                target = over(step)
                if view(step) or target is not None:  # the same storage
                    first = read[0] if target is None else target.var
                    root[out.var] = root.get(first, first)
                last.setdefault(root.get(out.var, out.var), b)
    final = max((b for b, steps in enumerate(blocks) if steps), default=-1)
    kept = {root.get(v, v) for v in keep}
    dead: list[list[Var]] = [[] for _ in blocks]
    for var in born:
        storage = root.get(var, var)
        if storage in kept or storage.argument or last[storage] >= final:
            continue
        dead[last[storage]].append(var)
    return [tuple(d) for d in dead]
