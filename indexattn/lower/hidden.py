"""Keys a block of rows may skip. Where a mask hides a key from every row of a block, the rows'
steps over the other keys alone give what they give over all of them, if every sum over the
keys sees the hidden entries as zeros: the mask added to the scores makes them -inf, a softmax
over the keys makes those zeros, a product keeps zeros zero. A pass over the rows' steps that
follows the value at hidden entries (-inf, 0, or any finite number) proves it, or finds the
step that would read a hidden entry (then the rows go over every key, as before).

The proof assumes the values the mask does not make are finite: a score of inf or NaN at a
hidden key would make NaN of its whole row over all keys, and nothing of it over the spans."""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from ..ir import Index, Spec
from ..ops import lookup
from .blocked import Rows, inputs_along, sequence_indices
from .hoist import Split, operands
from .steps import (
    Add,
    Cat,
    Contract,
    Elementwise,
    Gather,
    Linear,
    Operand,
    Reduction,
    Rename,
    Spans,
    Step,
    Var,
)

# a value at the hidden entries: -inf, 0, anything (inf and NaN too); None: a finite number
NEG, ZERO, ANY = "-inf", "0", "any"
FAIL = "fail"  # a step whose result would change without the hidden keys


@dataclass(frozen=True)
class Hidden:
    """The rows' key index, the mask that hides keys from rows, and which of its entries
    hide: "-inf" (a float mask), "true" or "false" (a boolean one, as `where` reads it).
    `keyed`: the rows' inputs with the key axis, each as (its place, its axes, batched)."""

    key: Index
    mask: Operand
    hides: str
    keyed: dict[Var, tuple[int, int, bool]]


@dataclass(frozen=True)
class Skip:
    """The mask the rows skip keys by, and the step that reads its spans (a constant)."""

    hidden: Hidden
    step: Spans


def skip(spec: Spec, rows: Rows, parts: Split) -> tuple[Split, Skip | None]:
    """The split with the spans' step among the constants, and how the rows skip keys; the
    same split and None where they cannot."""
    flat = [((b, k), s) for b, part in enumerate(parts.per_call) for k, s in enumerate(part)]
    steps = [s for where, s in flat if where in rows.chosen]
    hidden = find(spec, rows, steps, set(parts.held))
    if hidden is None:
        return parts, None
    mask = hidden.mask.var
    # a value of the code generator's own: the planner's variables have ids from 0 on
    out = Operand(Var(-2, mask.hint + "_spans"), (), False)
    step = Spans(out, hidden.mask, hidden.hides)
    constant = tuple(
        (*fixed, step) if any(s.out.var == mask for s in fixed) else fixed
        for fixed in parts.constant
    )
    parts = replace(parts, constant=constant, held=(*parts.held, out.var))
    return parts, Skip(hidden, step)


def find(spec: Spec, rows: Rows, steps: list[Step], constants: set[Var]) -> Hidden | None:
    """The mask whose hidden keys the rows may skip, or None. Only a mask built once per
    shape (`constants`): one the call builds from tensors is a step of the rows."""
    key = _key(spec, rows)
    inside = {s.out.var for s in steps}
    keyed = inputs_along(steps, inside, key) if key is not None else None
    if keyed is None:
        return None
    masks = (o for s in steps for o in operands(s) if o.var in keyed and o.var in constants)
    for op in (o for o in masks if not o.select):
        if op.dims[-2:] != (rows.row, key):
            continue
        senses = ("true", "false") if _condition(op.var, steps) else ("-inf",)
        others = {v for v in keyed if v in constants and v != op.var}
        for hides in senses:
            if _proves(steps, key, op.var, hides, others):
                return Hidden(key, op, hides, keyed)
    return None


def _key(spec: Spec, rows: Rows) -> Index | None:
    """The scores' other sequence index, summed before the rows' exit."""
    sequence = sequence_indices(spec) - set(rows.exit.dims)
    others = [i for i in rows.scores.dims if i in sequence]
    return others[0] if len(others) == 1 else None


def _condition(var: Var, steps: list[Step]) -> bool:
    """Whether `where` reads the variable as its condition: a boolean mask."""
    return any(
        isinstance(s, Elementwise) and s.fn == "where" and getattr(s.args[0], "var", None) == var
        for s in steps
    )


def _proves(steps: list[Step], key: Index, mask: Var, hides: str, others: set[Var]) -> bool:
    """Whether no step reads a hidden key's entry in a way that its absence would change.
    `others`: inputs over the keys built once per shape, besides the mask: they may hold
    anything there (a second mask's -inf, or the mask plus one)."""
    state: dict[Var, str | None] = dict.fromkeys(others, ANY)
    state |= {mask: NEG} if hides == "-inf" else {}
    for step in steps:
        got = _follow(step, key, state, (mask, hides))
        if got == FAIL:
            return False
        state[step.out.var] = got if key in step.out.dims else None
    return True


def _follow(step: Step, key: Index, state: dict, mask: tuple[Var, str]) -> str | None:
    """The value at hidden entries of what the step makes, or FAIL."""

    def at(arg) -> str | None:
        return state.get(arg.var) if isinstance(arg, Operand) and key in arg.dims else None

    if isinstance(step, Rename):
        return at(step.arg)
    if isinstance(step, Contract):
        summed = any(key in a.dims for a in step.args) and key not in step.out.dims
        return _product([at(a) for a in step.args], summed, step.scale.is_positive)
    if isinstance(step, Linear):
        value = _product([at(step.x)], key in step.inner, False)
        return None if value == ZERO and step.bias is not None else value
    if isinstance(step, Add):
        return _sum(step, at)
    if isinstance(step, Reduction):
        return _reduction(step, key, at(step.arg))
    if isinstance(step, Elementwise):
        return _elementwise(step, at, mask)
    if isinstance(step, Cat):
        return FAIL if step.over == key else _any({at(p) for p in step.parts})
    if isinstance(step, Gather):
        return FAIL if key in step.arg.dims else _any({at(step.positions)})
    return FAIL


def _product(values: list[str | None], summed: bool, positive: bool | None) -> str | None:
    """A product of factors (times a scale), summed over the keys or not."""
    if ZERO in values:
        return FAIL if {NEG, ANY} & set(values) else ZERO  # 0 · -inf: NaN
    if summed:
        return FAIL
    if ANY in values:
        return ANY
    return NEG if values == [NEG] and positive else None


def _sum(step: Add, at) -> str | None:
    signs = step.signs or (1,) * len(step.args)
    values = [at(a) for a in step.args]
    if any(v == NEG and s < 0 for v, s in zip(values, signs)):
        return FAIL  # -inf - -inf: NaN
    if ANY in values or NEG in values:
        return ANY if ANY in values else NEG
    return ZERO if all(v == ZERO for v in values) else None


def _reduction(step: Reduction, key: Index, value: str | None) -> str | None:
    if key not in step.over:
        kept = {"sum": ZERO, "max": NEG, "min": NEG}.get(step.fn)
        return value if value in (kept, ANY) else None
    if step.fn == "softmax":
        return ZERO if value == NEG else FAIL
    if (step.fn, value) in (("sum", ZERO), ("max", NEG), ("logsumexp", NEG)):
        return None
    return FAIL


def _elementwise(step: Elementwise, at, mask: tuple[Var, str]) -> str | None:
    """`where` on the mask picks a branch at hidden entries; a function of one argument maps
    0 and -inf by its entry in the operator table."""
    if step.fn == "where":
        cond, *branches = step.args
        if isinstance(cond, Operand) and cond.var == mask[0] and mask[1] != "-inf":
            return _constant(branches[0 if mask[1] == "true" else 1], at)
        values = {_constant(b, at) for b in branches} | {at(cond)}
        return values.pop() if len(values) == 1 else _any(values)
    values = [at(a) for a in step.args]
    value = values[0] if len(values) == 1 else _any(set(values))
    if step.fn == "dropout":
        return value if value in (ZERO, ANY) else None
    form = lookup(step.fn).sympy
    if value in (None, ANY) or len(values) != 1 or form is None:
        return value if value in (None, ANY) else _any({value, ANY})
    image = form(sympy.S.Zero if value == ZERO else sympy.S.NegativeInfinity)
    return {sympy.S.Zero: ZERO, sympy.S.NegativeInfinity: NEG}.get(sympy.simplify(image))


def _any(values: set[str | None]) -> str | None:
    """Values that are not all the same special one: finite, unless one may be anything."""
    return ANY if ANY in values or NEG in values else None


def _constant(arg, at) -> str | None:
    """A branch's value at hidden entries: a number's own, a tensor's as followed."""
    if isinstance(arg, Operand):
        return at(arg)
    value = {sympy.S.Zero: ZERO, sympy.S.NegativeInfinity: NEG}.get(arg.expr)
    return value if value or arg.expr.is_finite else ANY
