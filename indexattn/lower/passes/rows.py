"""Scores in blocks of queries: where per-call steps hold tensors over two sequence indices
(the N×N scores of each head, and every elementwise step on them: soft-capping, sigmoid,
sinks), the steps from the scores to the values they produce over the queries alone (`A @ V`)
go into a function of their own, computed for all query positions at once on short
sequences, and for blocks of them on long ones.
Exact: a query's row of scores depends on that query alone."""

from __future__ import annotations

from dataclasses import replace

from ...ir import Index, Spec
from ..kinds import made as made_by
from ..kinds import reads, row_wise, tensors
from ..order import planning_count
from ..program import Program, Rows
from ..steps import Operand, Step, Var


def run(program: Program) -> Program:
    """The program with the steps computed by blocks of rows marked, where there are any."""
    per_call = tuple(program.per_call(b) for b in program.blocks)
    rows = find(program.spec, per_call, {r.var for r in program.results})
    return replace(program, rows=rows)


def find(spec: Spec, per_call: tuple[tuple[Step, ...], ...], read_after: set[Var]) -> Rows | None:
    """The rows, where per-call steps hold values over two sequence indices and the steps
    that compute from them can go row by row; else None (the plain steps stay)."""
    sequence = sequence_indices(spec)
    flat = [(b, s) for b, steps in enumerate(per_call) for s in steps]
    wide = [n for n, (_, s) in enumerate(flat) if len(sequence & set(s.out.dims)) >= 2]
    if not wide:
        return None
    held = {flat[n][1].out.var for n in wide}
    readers = [n for n, (_, s) in enumerate(flat) if any(o.var in held for o in reads(s))]
    if not readers:  # the scores are an output themselves
        return None
    for starts in (set(wide), {wide[0]}):  # every wide step (one core's several score
        chosen, inside = _chain(flat, starts, readers[-1])  # products), else the first core
        outside = {o.var for n, (_, s) in enumerate(flat) if n not in chosen for o in reads(s)}
        exits = [flat[n][1].out for n in chosen if flat[n][1].out.var in outside | read_after]
        if len(exits) == 1:
            break
    if len(exits) != 1 or len(sequence & set(exits[0].dims)) != 1:
        return None
    last = flat[chosen[-1]][0]  # the rows are computed after this block: none may read them before
    early = [s for n, (b, s) in enumerate(flat) if n not in chosen and b <= last]
    if any(o.var == exits[0].var for s in early for o in reads(s)):
        return None
    steps = [flat[n][1] for n in chosen]
    row = next(i for i in exits[0].dims if i in sequence)
    if not all(row_wise(s, row) for s in steps) or not _aligned(steps, row):
        return None
    sliced = inputs_along(steps, inside, row)
    if sliced is None:
        return None
    read = [v for s in steps for v in (*(o.var for o in reads(s)), *tensors(s))]
    inputs = tuple(dict.fromkeys(v for v in read if v not in inside))
    scores = max((s.out for s in steps), key=lambda o: planning_count(o.dims))
    where = frozenset(flat[n][1].out.var for n in chosen)
    return Rows(row, where, last, inputs, sliced, exits[0], scores)


def _chain(flat: list, starts: set[int], end: int) -> tuple[list[int], set[Var]]:
    """The steps from the first start to `end` that are a start or read one chosen before."""
    chosen, inside = [], set()
    for n in range(min(starts), end + 1):
        step = flat[n][1]
        if n in starts or any(o.var in inside for o in reads(step)):
            chosen.append(n)
            inside.add(step.out.var)
    return chosen, inside


def _aligned(steps: list[Step], row: Index) -> bool:
    """Every value made by the rows is read there with the row on the axis it was made with:
    a block of rows holds those rows alone, so a read that swaps the row with another axis
    (`T_<τ'τ>` of a `T_<ττ'>` made by the rows) would need the others."""
    made = {o.var: o.dims.index(row) for s in steps for o in made_by(s) if row in o.dims}
    for op in (o for s in steps for o in reads(s) if o.var in made):
        axes = axes_of(op)
        if row not in axes or axes.index(row) != made[op.var]:
            return False
    return True


def sequence_indices(spec: Spec) -> set[Index]:
    """Indices whose sizes no parameter has: positions in the inputs, not widths or heads."""
    fixed = {
        s
        for t in spec.tensors_of("param", "buffer")
        for axis in t.layout
        for index in axis
        for s in index.size.free_symbols
    }
    indices = {i for t in spec.tensors for axis in t.layout for i in axis}
    indices |= {i for eq in spec.equations for i in eq.indices}
    return {i for i in indices if i.size.free_symbols and not i.size.free_symbols & fixed}


def inputs_along(steps: list[Step], inside: set[Var], index: Index):
    """Inputs read with the index's axis, each as (its place, its axes, batched); None when
    one input is read both with and without it, or with it on two axes (it would be needed
    sliced and whole, or sliced twice)."""
    sliced: dict[Var, tuple[int, int, bool]] = {}
    whole: set[Var] = set()
    for op in (o for s in steps for o in reads(s) if o.var not in inside):
        if index not in op.dims:
            whole.add(op.var)
            continue
        axes = axes_of(op)
        place = (axes.index(index), len(axes), op.batched)
        if sliced.setdefault(op.var, place) != place:
            return None
    return None if whole & set(sliced) else sliced


def axes_of(op: Operand) -> list[Index | None]:
    """The variable's own axes: a literal's selected axis as None."""
    dims = iter(op.dims)
    return [next(dims) if s is None else None for s in op.select] + list(dims)
