"""Tables over two sequence indices computed per block of rows, never whole. A constant over
(τ, τ') (a mask, ALiBi's slopes times distances, T5's bucket ids) holds N² entries (h·N² with
heads): 5.6 GB at N = 8192 for ALiBi's. So does a mask or bias a call makes from vectors over
one sequence index (document ids D_<τ> == D_<τ'>, a forget gate's running sums C_<μτ> − C_<μτ'>,
T5's learned bias gathered at the bucket ids) when only the attention kernel reads it. Where
every reader of such tables takes them a block of rows at a time (the attention kernel's mask,
an input of the rows' function, the key spans read off a mask), the printer computes each from
its O(N) position vectors, and the O(N) values it reads, per block (lower/printers/tables_emit.py);
a value over one sequence index is read gathered at the block's positions; the constants
function keeps only what is O(N). A kernel whose mask is made by blocks runs by blocks of
queries (a `Spans` step where none reads the mask's: spans read per call where the table
writes an infinity, else every key for each block). Exact: an
entry of a table depends on its own positions alone, so a block's entries from the block's
positions are the same numbers (the same code, the same dtype)."""

from __future__ import annotations

from dataclasses import replace

import sympy

from ....ir import Index, sequence_indices
from ..kinds import chain, reads, with_reads
from ..program import Program
from ..steps import (
    Add,
    Attention,
    Contract,
    Elementwise,
    Gather,
    Grid,
    Operand,
    Reduction,
    Rename,
    Spans,
    Step,
    Var,
    Whole,
)


def run(program: Program) -> Program:
    """The program with its wide constants, and the wide values only kernels' masks read,
    marked `tables` where every reader takes them by blocks; the same program where one reads
    a table whole."""
    wide = wide_constants(program) | per_call_tables(program)
    if not wide or not all(_blockwise(program, s, wide) for s in program.steps):
        return program
    sequence = sequence_indices(program.spec)
    if not all(entrywise(s, sequence) for s in _chains(program, wide)):
        return program
    if {r.var for r in program.results} & wide:
        return program
    kept = [v for v in program.held if v not in wide]
    kept += [o.var for s in _chains(program, wide) for o in reads(s) if o.var not in wide]
    held = tuple(dict.fromkeys(v for v in kept if v in program.constant))
    program = replace(program, held=held)
    return _blocked_kernels(_by_position(program, wide, sequence))


def wide_constants(program: Program) -> set[Var]:
    """The constants whose values run over two sequence indices or more."""
    sequence = sequence_indices(program.spec)
    return {
        s.out.var
        for s in program.steps
        if s.out.var in program.constant
        and not isinstance(s, Spans)
        and len(sequence & set(s.out.dims)) >= 2
    }


def per_call_tables(program: Program) -> set[Var]:
    """The values a call makes over two sequence indices, entry by entry from values over
    one (D_<τ> == D_<τ'>), that only kernels' masks, their spans, the rows (sliced by their
    blocks) and other such values read."""
    sequence = sequence_indices(program.spec)
    rows = program.rows.steps if program.rows is not None else frozenset()
    found = {
        s.out.var
        for s in program.steps
        if program.region(s) == "call"
        and s.out.var not in rows
        and len(sequence & set(s.out.dims)) >= 2
        and not isinstance(s, (Contract, Spans))
        and entrywise(s, sequence)
    }
    makers = {s.out.var: s for s in program.steps}
    while True:  # a reader that takes one whole keeps it whole, and what reads a wide value
        whole = {o.var for s in program.steps for o in reads(s) if not _masks(program, s, o, found)}
        wide = {v for v in found for o in reads(makers[v]) if _wide(program, o, found, sequence)}
        if not found & (whole | wide):
            return found
        found -= whole | wide


def _wide(program: Program, operand: Operand, found: set[Var], sequence: set[Index]) -> bool:
    """Whether a value runs over two `sequence` indices and is neither a constant nor made by
    blocks: a call's scores, say."""
    known = operand.var in program.constant or operand.var in found
    return not known and len(sequence & set(operand.dims)) >= 2


def _masks(program: Program, step: Step, operand: Operand, found: set[Var]) -> bool:
    """Whether the step reads the operand a block at a time: as a kernel's mask, for its
    spans, into another value made by blocks, or as an input of the rows sliced by them."""
    if isinstance(step, Attention):
        return step.mask is not None and operand.var == step.mask.var
    rows = program.rows
    sliced = rows is not None and step.out.var in rows.steps and operand.var in rows.sliced
    return isinstance(step, Spans) or step.out.var in found or sliced


def _blockwise(program: Program, step: Step, wide: set[Var]) -> bool:
    """Whether the step reads the wide constants (if any) a block at a time: another wide
    constant, the spans read off a mask, the kernel's mask, or an input of the rows."""
    read = {o.var for o in reads(step)} & wide
    if not read or step.out.var in wide or isinstance(step, Spans):
        return True
    if isinstance(step, Attention):
        return {o.var for o in reads(step) if o.var in wide} == {step.mask.var}
    rows = program.rows
    return rows is not None and step.out.var in rows.steps and read <= set(rows.sliced)


def entrywise(step: Step, sequence: set) -> bool:
    """Whether each entry of the step's value comes from the same positions' entries of
    what it reads: a block of positions gives the block (not so a flip, a slice, a sum over
    a sequence index, a tensor shaped by sizes, a gather along a sequence index)."""
    if isinstance(step, Reduction):
        return not set(step.over) & sequence
    if isinstance(step, Contract):
        return not ({i for a in step.args for i in a.dims} - set(step.out.dims)) & sequence
    if isinstance(step, Gather):
        return not set(step.arg.dims) & sequence
    return isinstance(step, (Grid, Elementwise, Add, Rename, Whole))


def _chains(program: Program, wide: set[Var]) -> list[Step]:
    return [s for s in program.steps if s.out.var in wide]


def _by_position(program: Program, wide: set[Var], sequence: set) -> Program:
    """The program whose tables read each value over one sequence index (not a table itself)
    gathered at their positions: `D_<[τ]>` for `D_<τ>`, so that a block of rows reads the
    block's entries."""
    blocks, made = [], set(wide)
    for block in program.blocks:
        steps = []
        for step in block.steps:
            if step.out.var in wide:
                program, step, extra = _gathered(program, step, wide, sequence)
                steps += extra
                made |= {s.out.var for s in extra}
            steps.append(step)
        blocks.append(replace(block, steps=tuple(steps)))
    return replace(program, blocks=tuple(blocks), tables=frozenset(made))


def _gathered(program: Program, step: Step, wide: set[Var], sequence: set):
    """The step reading its operands along a sequence index at their positions, and the
    steps that gather them (a grid of the positions, the gather)."""
    extra, swap = [], {}
    for operand in reads(step):
        (index, *_) = [i for i in operand.dims if i in sequence] or [None]
        if operand.var in wide or index is None or operand in swap:
            continue
        program, at = program.fresh(f"{index.ascii}_at")
        program, value = program.fresh(f"{operand.var.hint}_{index.ascii}")
        positions = Operand(at, (index,), False)
        extra.append(Grid(positions, index.symbol, index=True))
        out = Operand(value, operand.dims, operand.batched)
        extra.append(Gather(out, replace(operand, select=()), index, positions, operand.var.hint))
        swap[operand] = replace(operand, var=value, select=())
    return program, with_reads(step, swap), extra


def _blocked_kernels(program: Program) -> Program:
    """The program whose kernels with a mask made by blocks run by blocks of queries: where
    nothing reads the mask's spans, a `Spans` step (read per call, or hiding nothing: every
    key for each block) before the kernel."""
    blocks = []
    for block in program.blocks:
        steps = []
        for step in block.steps:
            if isinstance(step, Attention) and step.spans is None and _table_mask(program, step):
                program, out = program.fresh(step.mask.var.hint + "_spans")
                spans = Spans(Operand(out, (), False), step.mask, _hides(program, step.mask))
                steps.append(spans)
                step = replace(step, spans=spans.out)
            steps.append(step)
        blocks.append(replace(block, steps=tuple(steps)))
    return replace(program, blocks=tuple(blocks))


def _hides(program: Program, mask: Operand) -> str:
    """`-inf` where the mask's table is made from an infinity written (forgetting's causal
    `M_<ττ'>`): its spans, read block by block, skip the keys it hides from a whole block;
    else `none` (a bias, T5's, hides no key: reading it would cost a pass for nothing)."""
    made = chain(program.steps, mask.var)
    written = any(isinstance(s, Grid) and s.expr.has(sympy.S.NegativeInfinity) for s in made)
    return "-inf" if written else "none"


def _table_mask(program: Program, step: Attention) -> bool:
    mask = step.mask
    return mask is not None and mask.var in program.tables and mask.dims[-2:] == step.mask_dims[-2:]
