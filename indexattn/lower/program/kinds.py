"""The step kinds' table: what each kind of step is, once, for every pass that asks (as
`ops.py` is for operators). What it reads, whether the constants function may build it
(`pure`), whether its result may share storage with what it reads (`view`), whether a block of
rows computes it as all rows would (`row_wise`), whether it makes a tensor nothing keeps for
the backward pass (`fresh`). How each kind prints is the printer it registered,
`@prints(Kind)` (lower/printers/), and what it costs its `step_cost` (views/cost.py);
tests/lower/test_kinds.py checks that every kind has all of these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import get_args, get_type_hints

import sympy

from ... import ops
from ...ir import Index
from .steps import (
    Add,
    Attention,
    Cat,
    Choose,
    Contract,
    Convolve,
    Elementwise,
    Flex,
    Flip,
    Full,
    Fuse,
    Gather,
    Grid,
    Linear,
    Number,
    Operand,
    Pad,
    PrefixProduct,
    Reduction,
    Rename,
    Scatter,
    Slice,
    SoftmaxValues,
    Spans,
    Split,
    Stack,
    Step,
    Unfuse,
    Var,
    Whole,
)

Fact = bool | Callable[[Step], bool]


@dataclass(frozen=True)
class Kind:
    """One step kind's facts; a fact that depends on the step's fields is a function of it."""

    pure: Fact  # built from what it reads alone by code the constants function may run
    view: bool  # its result may share the storage of what it reads
    fresh: Fact  # a new tensor (or one written over) that no step keeps for the backward
    row_wise: Callable[[Step, Index], bool] | None = None  # rows of the result from the same
    # rows of what it reads (None: never); the index is the rows'


def _always(step: Step, row: Index) -> bool:
    return True


def _not_flipped(step: Flip, row: Index) -> bool:
    """A flip along another axis than the rows' keeps each row where it was (a reversed
    read of the keys, `L_<τ[N - 1 - τ']>`); one along the rows reads other rows."""
    return step.out.dims[step.arg.dims.index(step.axis)] != row


def _not_repeated(step: Gather, row: Index) -> bool:
    """A gather reads the rows' positions alone, but a repeat makes every position of its
    axis (`repeat_interleave`), not a block of rows."""
    return step.repeat is None or row not in step.positions.dims


def _not_dropout(step: Elementwise) -> bool:
    return step.fn != "dropout"


def _fresh_product(step: Contract) -> bool:
    """A product of several operands, or a scale: a new tensor; a lone operand is a view."""
    return len(step.args) > 1 or step.scale != 1


def _fresh_function(step: Elementwise) -> bool:
    """A function of floats to floats that keeps its argument (not its result) for the
    backward: its result is new and nothing keeps it."""
    op = ops.lookup(step.fn)
    return op.kind == "function" and step.fn != "dropout" and not (op.integers or op.inplace)


KINDS: dict[type, Kind] = {
    Choose: Kind(pure=True, view=False, fresh=False),
    Unfuse: Kind(pure=False, view=False, fresh=False),
    Grid: Kind(pure=True, view=False, fresh=False),
    # a repeat makes the whole axis: not by rows of its positions
    Gather: Kind(pure=True, view=False, fresh=False, row_wise=_not_repeated),
    # its result is a view of the slots it added into, the last one cut off
    Scatter: Kind(pure=True, view=False, fresh=False, row_wise=lambda s, row: row != s.axis),
    Flip: Kind(pure=True, view=False, fresh=False, row_wise=lambda s, row: _not_flipped(s, row)),
    Slice: Kind(pure=True, view=True, fresh=False),
    Whole: Kind(pure=True, view=False, fresh=False),
    # conv's backward keeps its input and kernel, never its result
    Convolve: Kind(pure=False, view=False, fresh=True),
    Contract: Kind(pure=True, view=False, fresh=_fresh_product, row_wise=_always),
    Add: Kind(pure=True, view=False, fresh=True, row_wise=_always),
    Elementwise: Kind(pure=_not_dropout, view=False, fresh=_fresh_function, row_wise=_always),
    Rename: Kind(pure=True, view=True, fresh=False, row_wise=_always),
    Full: Kind(pure=True, view=False, fresh=False),
    Reduction: Kind(pure=True, view=False, fresh=False, row_wise=lambda s, row: row not in s.over),
    Cat: Kind(pure=True, view=False, fresh=False, row_wise=lambda s, row: s.over != row),
    # a copy of each part; its backward keeps nothing
    Stack: Kind(pure=True, view=False, fresh=True, row_wise=lambda s, row: s.over != row),
    Pad: Kind(pure=False, view=False, fresh=False),
    Fuse: Kind(pure=False, view=True, fresh=False),
    Linear: Kind(pure=False, view=False, fresh=False, row_wise=lambda s, row: row not in s.inner),
    Split: Kind(pure=False, view=True, fresh=False),
    Attention: Kind(pure=False, view=False, fresh=False),
    Flex: Kind(pure=False, view=False, fresh=False),
    Spans: Kind(pure=True, view=False, fresh=False),
    PrefixProduct: Kind(pure=False, view=False, fresh=False),
    SoftmaxValues: Kind(pure=False, view=False, fresh=False),
}


def _fact(fact: Fact, step: Step) -> bool:
    return fact(step) if callable(fact) else fact


def pure(step: Step) -> bool:
    return _fact(KINDS[type(step)].pure, step)


def view(step: Step) -> bool:
    return KINDS[type(step)].view


def fresh(step: Step) -> bool:
    return _fact(KINDS[type(step)].fresh, step)


def row_wise(step: Step, row: Index) -> bool:
    """The step's rows depend on the same rows of what it reads."""
    rule = KINDS[type(step)].row_wise
    return rule is not None and row in step.out.dims and rule(step, row)


def made(step: Step) -> tuple[Operand, ...]:
    """The values a step makes: its `outs`, or its `out`."""
    return getattr(step, "outs", (step.out,))


def reads(step: Step) -> tuple[Operand, ...]:
    """The operands a step reads (not its result); a choice reads what its branches read
    from before it. Declared tensors a step reads by name are `tensors`."""
    if isinstance(step, Choose):
        inner = [s for branch in step.branches for s in branch]
        made_inside = {s.out.var for s in inner}
        return tuple(o for s in inner for o in reads(s) if o.var not in made_inside)
    found: list[Operand] = []
    for name in _inputs(type(step)):
        value = getattr(step, name)
        if type(value) is tuple:
            found += [v for v in value if type(v) is Operand]
        elif type(value) is Operand:
            found.append(value)
    return tuple(found)


def with_reads(step: Step, new: dict[Operand, Operand]) -> Step:
    """The step reading `new[o]` wherever it read an operand `o` of `new` (not a choice)."""
    changed = {}
    for name in _inputs(type(step)):
        value = getattr(step, name)
        if isinstance(value, tuple):
            changed[name] = tuple(new.get(v, v) if isinstance(v, Operand) else v for v in value)
        elif isinstance(value, Operand):
            changed[name] = new.get(value, value)
    return replace(step, **changed)


@cache
def _inputs(kind: type) -> tuple[str, ...]:
    """The fields of a step kind besides its result that may hold operands, by their types."""
    types = get_type_hints(kind)
    return tuple(
        f.name for f in fields(kind) if f.name not in ("out", "outs") and _holds(types[f.name])
    )


def _holds(hint) -> bool:
    """Whether a field of this type may hold an operand (alone, in a tuple or as an `Arg`)."""
    return hint is Operand or any(map(_holds, get_args(hint)))


def over(step: Step) -> Operand | None:
    """The operand whose storage a step writes its result into (lower/program/passes/inplace.py
    marks it): a scale's, a function's argument, a sum's term. The result is that tensor from
    then on (lower/printers/naming.py prints it under one name; liveness drops them together). A
    softmax's `out=` is not one: it writes over its scores only without gradients."""
    if isinstance(step, Add) and step.into is not None:
        return step.args[step.into]
    if isinstance(step, Contract | Elementwise) and step.into:
        return step.args[0]
    return None


def tensors(step: Step) -> tuple[Var, ...]:
    """The declared tensors a step reads by name, not as operands: a product's weight and
    bias (an unfused tensor is read whole before any step of the rows)."""
    if isinstance(step, Linear):
        held = (step.weight, step.bias) if step.bias is not None else (step.weight,)
        return tuple(Var(-1, t.ascii, argument=True) for t in held)
    return ()


def makes_floats(step: Step) -> bool:
    """Whether a step makes floats of whatever it reads, the one answer lower/program/numerics.py
    (which tables are cast) and lower/program/passes/inplace.py (which values may hold integers that
    a float cannot be written into) read: a number that is not whole, a scale that is not,
    `/` (torch's int / int is a float), a function the operator table does not keep whole, a
    reduction other than those it keeps whole (sum, max, min, the running sum), a projection
    or an attention kernel. A comparison makes booleans."""
    numbers = [a.expr for a in getattr(step, "args", ()) if isinstance(a, Number)]
    if not all(sympy.sympify(n).is_integer for n in numbers):
        return True
    if isinstance(step, Contract):
        return not sympy.sympify(step.scale).is_integer
    if isinstance(step, Elementwise):
        op = ops.lookup(step.fn)
        return step.fn == "/" or not (op.integers or op.condition)
    if isinstance(step, Reduction):
        return not ops.REDUCTIONS[step.fn].integers
    return isinstance(step, Linear | Attention | Flex | PrefixProduct)


def constant(steps: tuple[Step, ...]) -> set[Var]:
    """The values of `steps` that depend on sizes and scalars only."""
    made: set[Var] = set()
    for step in steps:
        if pure(step) and all(o.var in made for o in reads(step)):
            made.add(step.out.var)
    return made


def chain(steps, var: Var):
    """The steps among `steps` the value needs, in order."""
    needed, out = {var}, []
    for step in reversed(steps):
        if step.out.var in needed:
            out.append(step)
            needed |= {o.var for o in reads(step)}
    return out[::-1]
