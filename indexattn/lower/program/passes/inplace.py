"""Steps over two sequence indices that write over a fresh tensor instead of making another: a
sum adds onto a product in place, `S.add_(M)`; a scale multiplies its operand in place,
`R.div_(c)`; a function whose backward reads its result overwrites its argument, `R.tanh_()`
(a result keeps the name of the tensor it is written over: lower/printers/naming.py). Each takes a
tensor made in this function, of the step's own shape, that nothing else reads, so the N×N
scores are held once, not once per step (smaller values keep the plainer out-of-place forms,
but for a tensor plus numbers, `Phi.add_(1)`: one pass where a new tensor costs an
allocation and a pass). Exact under autograd: the tensor taken is never one its own maker
keeps for the backward pass (a product, a scale and a sum keep their operands; tanh, exp and
sigmoid keep their result, so what follows them allocates).

A softmax over such scores, read by nothing else, writes its weights over them when no
gradient is needed (`out=S`): a new tensor of N×N per head costs more in page faults than
the softmax's arithmetic (docs/decisions.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .... import ops
from ....ir import sequence_indices
from ..kinds import fresh, made, makes_floats, reads
from ..program import Program
from ..steps import (
    Add,
    Arg,
    Contract,
    Elementwise,
    Grid,
    Operand,
    Reduction,
    Step,
    Unfuse,
    Var,
    Whole,
)
from .hoist import read_counts


def run(program: Program) -> Program:
    """The program with each wide per-call step that can write over a fresh tensor marked
    so; the rows' inputs are never written over (each block of rows slices them)."""
    kept = set(program.rows.inputs) if program.rows is not None else set()
    steps = [s for b in program.blocks for s in program.per_call(b)]
    reads_of = read_counts(steps, program.results)
    sequence = sequence_indices(program.spec)
    wide = {s.out.var for s in steps if len(sequence & set(s.out.dims)) >= 2}
    whole = _integers(program)
    marked: dict[Var, Step] = {}
    free: set[Var] = set()
    free_wide: set[Var] = set()  # free & wide, kept as free grows (linear in the steps)
    rows: set[Var] = set()
    for step in steps:
        new = _into(step, free if _shift(step) else free_wide, rows, reads_of)
        if new is not step:
            marked[step.out.var] = new
        out = new.out.var
        if fresh(new) and out not in whole and out not in kept:
            free.add(out)
            if out in wide:
                free_wide.add(out)
        if _contiguous(new, rows):
            rows.add(new.out.var)
    return program.with_steps(marked)


def _shift(step: Step) -> bool:
    """A tensor plus numbers (`elu(Q) + 1`, `P + eps`): in place at any width, where a fresh
    tensor takes it (one pass over the values, no new tensor)."""
    return isinstance(step, Add) and sum(isinstance(a, Operand) for a in step.args) == 1


def _integers(program: Program) -> set[Var]:
    """Values that may hold whole numbers in an integer dtype (which `mul_` by a float, or
    `add_` of one, cannot take): integer arguments, positions, and what steps that keep whole
    numbers whole make of them alone."""
    found = {Var(-1, t.ascii, argument=True) for t in program.spec.tensors if t.dtype == "int"}
    for step in program.steps:
        tensors = [o.var for o in reads(step)]
        whole = isinstance(step, Whole) or (isinstance(step, Grid) and step.index)
        whole = whole or (isinstance(step, Unfuse) and step.tensor.dtype == "int")
        if whole or (tensors and set(tensors) <= found and not makes_floats(step)):
            found.update(o.var for o in made(step))
    return found


def _contiguous(step: Step, rows: set[Var]) -> bool:
    """Steps whose result is laid out as its axes say: a product, a step that wrote over one,
    or a scale or function of one (torch keeps the layout of a lone argument). A safe softmax
    asks whether a row is dead by a reduction over its scores, slow over a strided axis
    (talking heads' scores, mixed across heads)."""
    if isinstance(step, Contract) and len(step.args) > 1:
        return True
    if isinstance(step, Add):
        return step.into is not None and step.args[step.into].var in rows
    if isinstance(step, Contract | Elementwise):
        tensors = [a for a in step.args if isinstance(a, Operand)]
        one = len(tensors) == 1 and not tensors[0].select and tensors[0].dims == step.out.dims
        return one and tensors[0].var in rows
    return False


def _into(step: Step, free: set[Var], rows: set[Var], reads: Counter) -> Step:
    """The step marked to write over the fresh tensor it reads, where it can (a safe softmax
    only over scores laid out as a product's)."""
    if isinstance(step, Add):
        return _add_into(step, free, reads)
    arg = _overwritable(step)
    if isinstance(step, Reduction) and step.safe and arg is not None and arg.var not in rows:
        return step
    if arg is not None and _target(arg, step.out, free, reads):
        return replace(step, into=True)
    return step


def _overwritable(step: Step) -> Arg | None:
    """What a step could write its result over: a softmax's scores, a scale's operand, the
    argument of a function the operator table writes in place."""
    if isinstance(step, Reduction) and step.fn == "softmax" and step.sink is None:
        return step.arg if len(step.over) == 1 else None
    if isinstance(step, Contract) and len(step.args) == 1 and step.scale != 1:
        return step.args[0]
    if isinstance(step, Elementwise) and ops.lookup(step.fn).inplace:
        return step.args[0]
    return None


def _add_into(step: Add, free: set[Var], reads: Counter) -> Step:
    """The sum marked with its last (widest) term that can take the others in place: one the
    others broadcast into, as a batched term does where the others' batch axes are its own."""
    signs = step.signs or (1,) * len(step.args)
    for k in reversed(range(len(step.args))):
        term, others = step.args[k], step.args[:k] + step.args[k + 1 :]
        if signs[k] > 0 and _target(term, step.out, free, reads) and _fits(term, others):
            return replace(step, into=k)
    return step


def _target(term: Arg, out: Operand, free: set[Var], reads: Counter) -> bool:
    return (
        isinstance(term, Operand)
        and term.var in free
        and reads[term.var] == 1
        and term.dims == out.dims
        and not term.select
    )


def _fits(term: Operand, others: tuple[Arg, ...]) -> bool:
    return term.batched or not any(isinstance(a, Operand) and a.batched for a in others)
