"""Scores in blocks of queries: where per-call steps hold tensors over two sequence indices
(the N×N scores of each head, and every elementwise step on them: soft-capping, sigmoid,
sinks), the steps from the scores to the values they produce over the queries alone (`A @ V`)
go into a function of their own, computed for all query positions at once on short
sequences, and for blocks of them on long ones.
Exact: a query's row of scores depends on that query alone."""

from __future__ import annotations

from dataclasses import replace

from ....ir import Index, Spec, sequence_indices
from ...planner.order import planning_count
from ..kinds import made as made_by
from ..kinds import reads, row_wise, tensors
from ..program import Program, Rows
from ..steps import Contract, Operand, Reduction, Step, Var
from .tables import entrywise


def run(program: Program) -> Program:
    """The program with the steps computed by blocks of rows marked, where there are any."""
    per_call = tuple(program.per_call(b) for b in program.blocks)
    read_after = {r.var for r in program.results}
    rows = find(program.spec, per_call, read_after)
    if rows is not None:
        return replace(program, rows=rows)
    found = find_summed(program.spec, per_call, read_after)
    if found is None:
        return program
    rows, deferred = found
    kept = [b for n, b in enumerate(program.blocks) if n not in deferred]
    at = rows.last - len(deferred) + 1  # the deferred blocks go right after the rows
    blocks = (*kept[:at], *(program.blocks[n] for n in deferred), *kept[at:])
    return replace(program, blocks=blocks, rows=replace(rows, last=at - 1))


def find(spec: Spec, per_call: tuple[tuple[Step, ...], ...], read_after: set[Var]) -> Rows | None:
    """The rows, where per-call steps hold values over two sequence indices and the steps
    that compute from them can go row by row; else None (the plain steps stay). Where they
    cannot with every such step, they may without the masks made entry by entry from
    vectors over one sequence index (`D_<τ> != D_<τ'>`, read at τ and at τ'): those are
    then inputs of the rows, which passes/tables.py makes a block at a time."""
    sequence = sequence_indices(spec)
    flat = [(b, s) for b, steps in enumerate(per_call) for s in steps]
    return _find(flat, sequence, read_after, set()) or _find(
        flat, sequence, read_after, from_vectors(flat, sequence)
    )


def from_vectors(flat: list, sequence: set[Index]) -> set[int]:
    """The steps over two sequence indices made entry by entry from values over one at most,
    constants, arguments or other such steps: a mask of document ids, not the scores."""
    found: set[int] = set()
    made: set[Var] = set()
    computed = {s.out.var for _, s in flat}  # not a constant, nor an argument
    for n, (_, step) in enumerate(flat):
        wide = len(sequence & set(step.out.dims)) >= 2
        if not wide or isinstance(step, Contract) or not entrywise(step, sequence):
            continue
        narrow = (o for o in reads(step) if o.var in computed and o.var not in made)
        if all(len(sequence & set(o.dims)) < 2 for o in narrow):
            found.add(n)
            made.add(step.out.var)
    return found


def _find(flat: list, sequence: set[Index], read_after: set[Var], left: set[int]) -> Rows | None:
    """The rows, without the steps `left` out (they stay where they are)."""
    wide = [
        n for n, (_, s) in enumerate(flat) if n not in left and len(sequence & set(s.out.dims)) >= 2
    ]
    if not wide:
        return None
    held = {flat[n][1].out.var for n in wide}
    readers = [n for n, (_, s) in enumerate(flat) if any(o.var in held for o in reads(s))]
    if not readers:  # the scores are an output themselves
        return None
    for starts in (set(wide), {wide[0]}):  # every wide step (one core's several score
        chosen, inside = _chain(flat, starts, readers[-1])  # products), else the first core
        mine = set(chosen)
        outside = {o.var for n, (_, s) in enumerate(flat) if n not in mine for o in reads(s)}
        outside |= read_after
        exits = [flat[n][1].out for n in chosen if flat[n][1].out.var in outside]
        if len(exits) == 1:
            break
    if len(exits) != 1 or len(sequence & set(exits[0].dims)) != 1:
        return None
    last = flat[chosen[-1]][0]  # the rows are computed after this block: none may read them before
    early = [s for n, (b, s) in enumerate(flat) if n not in mine and b <= last]
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
    scores = widest((s.out for s in steps), sequence)
    where = frozenset(flat[n][1].out.var for n in chosen)
    return Rows(row, where, last, inputs, sliced, (exits[0],), scores)


def find_summed(spec: Spec, per_call: tuple[tuple[Step, ...], ...], read_after: set[Var]):
    """Rows whose steps also sum the rows away (a backward's cotangents of the keys, Σ_τ
    dS_<ττ'> Q_<τa>): each block gives its part of those sums, which the blocks add up. With
    the blocks (after the rows) that read such a sum, or what one made, before the rows
    end, moved after them; None where there are no such rows."""
    sequence = sequence_indices(spec)
    flat = [(b, s) for b, steps in enumerate(per_call) for s in steps]
    wide = {n for n, (_, s) in enumerate(flat) if len(sequence & set(s.out.dims)) >= 2}
    if not wide:
        return None
    scores = widest((flat[n][1].out for n in wide), sequence)
    for row in (i for i in scores.dims if i in sequence):
        found = _summing(flat, wide, row, sequence, read_after)
        if found is not None:
            return found
    return None


def _summing(flat: list, wide: set[int], row: Index, sequence: set[Index], read_after: set[Var]):
    """The rows over `row` with sums, and the blocks to move after them; or None."""
    held = {flat[n][1].out.var for n in wide}
    end = max((n for n, (_, s) in enumerate(flat) if {o.var for o in reads(s)} & held), default=0)
    chosen, inside, summed = [], set(), set()
    for n in range(min(wide), end + 1):
        step = flat[n][1]
        read = {o.var for o in reads(step)}
        if n in wide or read & inside:
            if read & summed:  # a block would read its part of a sum
                return None
            chosen.append(n)
            (summed if _sums(step, row) else inside).add(step.out.var)
    chosen = _needed(flat, chosen, held)
    steps = [flat[n][1] for n in chosen]
    inside &= {s.out.var for s in steps}
    summed &= {s.out.var for s in steps}
    mine = set(chosen)
    outside = {o.var for n, (_, s) in enumerate(flat) if n not in mine for o in reads(s)}
    outside |= read_after
    exits = tuple(s.out for s in steps if s.out.var in outside)
    joined = [e for e in exits if e.var not in summed]
    # what does not sum the rows away is joined over them, each row its own (an exit may
    # keep another sequence index: a mask's cotangent dM_<ττ'>, made whole anyway)
    by_row = all(row_wise(s, row) for s in steps if s.out.var not in summed)
    if not summed or not joined or not by_row:
        return None
    last = flat[chosen[-1]][0]
    deferred = _deferred(flat, chosen, last, {e.var for e in exits})
    sliced = inputs_along(steps, inside | summed, row)
    if deferred is None or sliced is None or not _aligned(steps, row):
        return None
    read = [v for s in steps for v in (*(o.var for o in reads(s)), *tensors(s))]
    inputs = tuple(dict.fromkeys(v for v in read if v not in inside | summed))
    scores = widest((s.out for s in steps), sequence)
    where = frozenset(s.out.var for s in steps)
    rows = Rows(row, where, last, inputs, sliced, exits, scores, frozenset(summed))
    return rows, deferred


def widest(outs, sequence: set[Index]) -> Operand:
    """The value whose axes but the row's count the elements of one row: of those over the
    most sequence indices (the scores), the largest. A value over one sequence index and
    several others (rope's dKr_<μτ'cj> in a backward) is larger at planning sizes, but holds
    no row of scores."""
    return max(outs, key=lambda o: (len(sequence & set(o.dims)), planning_count(o.dims)))


def _sums(step: Step, row: Index) -> bool:
    """A step linear in what it reads that sums `row` away: its sum over blocks of rows is its
    value over all of them."""
    if isinstance(step, Contract):
        return row not in step.out.dims and any(row in a.dims for a in step.args)
    return isinstance(step, Reduction) and step.fn == "sum" and row in step.over


def _needed(flat: list, chosen: list[int], held: set[Var]) -> list[int]:
    """The chosen steps that make or read a value over two sequence indices, that one of
    those reads, or that share a block with one: not those that merely go on from a row-wise
    result (a cotangent's projection), which run after the rows."""
    kept: set[int] = set()
    while True:
        needed = {o.var for n in kept for o in reads(flat[n][1])}
        blocks = {flat[n][0] for n in kept}
        more = set()
        for n in reversed(chosen):
            step, block = flat[n][1], flat[n][0]
            read = {o.var for o in reads(step)}
            out = step.out.var
            if n not in kept and (out in held or out in needed or read & held or block in blocks):
                more.add(n)
                needed |= read
                blocks.add(block)
        if not more:
            return sorted(kept)
        kept |= more


def _deferred(flat: list, chosen: list[int], last: int, late: set[Var]) -> list[int] | None:
    """The blocks up to `last` that read what the rows give (or what such a block made):
    they can run after the rows where no step of the rows, nor of their blocks, reads them."""
    mine, taken = {flat[n][0] for n in chosen}, set(chosen)
    others: dict[int, list[Step]] = {}  # each block's steps the rows do not take
    for n, (c, s) in enumerate(flat):
        if n not in taken:
            others.setdefault(c, []).append(s)
    deferred: list[int] = []
    for b in range(flat[chosen[0]][0], last + 1):
        steps = others.get(b, [])
        if not any({o.var for o in reads(s)} & late for s in steps):
            continue
        if b in mine:
            return None
        deferred.append(b)
        late |= {o.var for s in steps for o in made_by(s)}
    rows_read = {o.var for n in chosen for o in reads(flat[n][1])}
    return None if rows_read & late - {flat[n][1].out.var for n in chosen} else deferred


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
