"""Tables over two sequence indices computed per block of rows, never whole. A constant over
(τ, τ') (a mask, ALiBi's slopes times distances) holds N² entries (h·N² with heads): 5.6 GB
at N = 8192 for ALiBi's. Where every reader of such tables takes them a block of rows at a
time (the attention kernel's mask, an input of the rows' function, the key spans read off a
mask), the printer computes each from its O(N) position vectors, and the O(N) constants it
reads, per block (lower/tables_emit.py); the constants function keeps only what is O(N).
Exact: an entry of a table of positions depends on its own positions alone, so a block's
entries from the block's positions are the same numbers (the same code, the same dtype)."""

from __future__ import annotations

from dataclasses import replace

from ...ir import sequence_indices
from ..kinds import reads
from ..program import Program
from ..steps import (
    Add,
    Attention,
    Contract,
    Elementwise,
    Grid,
    Reduction,
    Rename,
    Spans,
    Step,
    Var,
    Whole,
)


def run(program: Program) -> Program:
    """The program with its wide constants marked `tables` where every reader takes them by
    blocks; the same program where one reads a table whole."""
    wide = wide_constants(program)
    if not wide or not all(_blockwise(program, s, wide) for s in program.steps):
        return program
    sequence = sequence_indices(program.spec)
    if not all(_entrywise(s, sequence) for s in _chains(program, wide)):
        return program
    if {r.var for r in program.results} & wide:
        return program
    kept = [v for v in program.held if v not in wide]
    kept += [o.var for s in _chains(program, wide) for o in reads(s) if o.var not in wide]
    held = tuple(dict.fromkeys(v for v in kept if not v.argument))
    return replace(program, tables=frozenset(wide), held=held)


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


def _entrywise(step: Step, sequence: set) -> bool:
    """Whether each entry of the step's value comes from the same positions' entries of
    what it reads: a block of positions gives the block (not so a flip, a slice, a sum over
    a sequence index, a tensor shaped by sizes)."""
    if isinstance(step, Reduction):
        return not set(step.over) & sequence
    if isinstance(step, Contract):
        return not ({i for a in step.args for i in a.dims} - set(step.out.dims)) & sequence
    return isinstance(step, (Grid, Elementwise, Add, Rename, Whole))


def _chains(program: Program, wide: set[Var]) -> list[Step]:
    return [s for s in program.steps if s.out.var in wide]
