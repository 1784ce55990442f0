"""Keys a block of rows may skip. Where a mask hides a key from every row of a block, the rows'
steps over the other keys alone give what they give over all of them, if every sum over the
keys sees the hidden entries as zeros: the mask added to the scores makes them -inf, a softmax
over the keys makes those zeros, a product keeps zeros zero (so a mask of zeros that
multiplies, RetNet's decay written `where(τ' > τ, 0, γ)` or a factor of 0s and 1s, hides keys
too). A pass over the rows' steps that
follows the value at hidden entries (-inf, 0, any finite number, or anything) proves it, or
finds the step that would read a hidden entry (then the rows go over every key, as before).
A function maps the value by its torch code, run on -inf and 0, and must have a finite
derivative there: the backward passes through the hidden entries too.

The proof assumes the values the mask does not make are finite: a score of inf or NaN at a
hidden key would make NaN of its whole row over all keys, and nothing of it over the spans.
Functions that make inf or NaN of finite numbers (log, sqrt, division: `partial` in the
operator table) are not followed at hidden entries at all."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from ....ir import Index, Spec
from ....ops import lookup
from ..kinds import reads
from ..program import Hidden, KeySpans, Program, Rows
from ..steps import (
    Add,
    Arg,
    Cat,
    Contract,
    Elementwise,
    Gather,
    Grid,
    Linear,
    Number,
    Operand,
    Reduction,
    Rename,
    Spans,
    Stack,
    Step,
    Var,
)
from .rows import axes_of, inputs_along, sequence_indices
from .tables import per_call_tables

# a value at the hidden entries: -inf, 0, anything (inf and NaN too); None: a finite number
NEG, ZERO, ANY = "-inf", "0", "any"
FAIL = "fail"  # a step whose result would change without the hidden keys


def run(program: Program) -> Program:
    """The program with the spans' step among the constants, after the mask's step, and how
    the rows skip keys; the same program where they cannot."""
    rows = program.rows
    if rows is None:
        return program
    steps = [s for s in program.steps if s.out.var in rows.steps]
    grids = {s.out.var: s.expr for s in program.steps if isinstance(s, Grid)}
    tables = per_call_tables(program)  # masks a call makes, read by blocks of rows
    finite = finite_constants(program, grids)
    hidden = find_hidden(program.spec, rows, steps, set(program.held) | tables, grids, finite)
    if hidden is None:
        return program
    mask = hidden.mask.var
    program, out = program.fresh(mask.hint + "_spans")
    step = Spans(Operand(out, (), False), hidden.mask, hidden.hides)
    maker = next(s for s in program.steps if s.out.var == mask)
    blocks = tuple(
        replace(b, steps=(*b.steps, step)) if maker in b.steps else b for b in program.blocks
    )
    spans = KeySpans(hidden, step)
    if mask in tables:  # read per call, off the table made by blocks (passes/tables.py)
        return replace(program, blocks=blocks, spans=spans)
    assert program.region(maker) == "constant", f"the mask {mask} is held but not a constant"
    constant = program.constant | {out}
    return replace(
        program, blocks=blocks, constant=constant, held=(*program.held, out), spans=spans
    )


def find_hidden(
    spec: Spec,
    rows: Rows,
    steps: list[Step],
    constants: set[Var],
    grids: dict | None = None,
    finite: set[Var] | None = None,
) -> Hidden | None:
    """The mask whose hidden keys the rows may skip, or None. Only a mask built once per
    shape, or made by blocks from vectors (`constants`): one the rows build is theirs. `grids`:
    the constants built from positions alone, by their expressions: one finite everywhere
    (RetNet's exponent `τ - τ'`) holds no -inf or NaN at hidden entries; one that puts 0 in
    one branch may hide keys by its zeros (a mask that multiplies). `finite`: the constants
    finite everywhere (those grids, and products and sums of them: ALiBi's slopes times
    distances)."""
    grids = grids or {}
    finite = {v for v, e in grids.items() if _finite(e)} if finite is None else finite
    key = _key(spec, rows)
    inside = {s.out.var for s in steps}
    keyed = inputs_along(steps, inside, key) if key is not None else None
    if keyed is None:
        return None
    masks = (o for s in steps for o in reads(s) if o.var in keyed and o.var in constants)
    # a block's part of a sum over the rows, over the keys: zero at the keys it skips
    summed = [e.var for e in rows.exits if e.var in rows.summed and key in e.dims]
    for op in (o for o in masks if not o.select):
        if op.dims[-2:] != (rows.row, key):
            continue
        senses = ("true", "false") if _condition(op.var, steps) else ("-inf",)
        senses = ("0", *senses) if _zeros(grids.get(op.var)) else senses
        others = {v for v in keyed if v in constants and v != op.var}
        for hides in senses:
            # the other inputs over the keys built once per shape may hold anything there
            # (a second mask's -inf, or the mask plus one), unless finite everywhere
            start = {v: None if v in finite else ANY for v in others}
            start |= {op.var: {"-inf": NEG, "0": ZERO}[hides]} if hides in ("-inf", "0") else {}
            proof = Proof(rows.row, key, op.var, hides, start)
            if proof.proves(steps) and _zero_at_hidden(proof, summed):
                return Hidden(key, op, hides, keyed)
    return None


# sympy's functions that are finite wherever their arguments are
BOUNDED = (sympy.exp, sympy.sin, sympy.cos, sympy.tanh, sympy.Abs, sympy.Min, sympy.Max)


def _finite(expr: sympy.Basic) -> bool:
    """Whether a grid's expression is a finite number at every position (positions, sizes
    and scalars are): sums, products, whole powers, powers of a positive number or size, exp and
    the like of finite numbers, either branch of a choice. `where(τ' > τ, -inf, 0)`, a
    condition or a division (by 0 somewhere?) is not."""
    if isinstance(expr, sympy.Piecewise):
        return all(_finite(e) for e, _ in expr.args)
    if isinstance(expr, sympy.Number):
        return bool(expr.is_finite)
    if isinstance(expr, sympy.Symbol):
        return True
    if isinstance(expr, sympy.Pow):
        base, power = expr.args
        whole = power.is_integer and power.is_nonnegative
        positive = bool(base.is_positive)  # a size; a position may be 0
        return _finite(power) and _finite(base) and bool(whole or positive)
    if isinstance(expr, (sympy.Add, sympy.Mul, *BOUNDED)):
        return all(_finite(a) for a in expr.args)
    return False


def finite_constants(program: Program, grids: dict) -> set[Var]:
    """The constants finite at every entry: grids of finite expressions (`_finite`), and
    views, sums and products of such, times finite numbers (ALiBi's slopes m_<μ> times the
    distances τ - τ', a per-head bias)."""
    found = {v for v, expr in grids.items() if _finite(expr)}
    for step in program.steps:
        if step.out.var not in program.constant or not isinstance(step, (Contract, Add, Rename)):
            continue
        numbers = [a.expr for a in getattr(step, "args", ()) if isinstance(a, Number)]
        numbers += [step.scale] if isinstance(step, Contract) else []
        if all(o.var in found for o in reads(step)) and all(map(_finite, numbers)):
            found.add(step.out.var)
    return found


def _zeros(expr: sympy.Basic | None) -> bool:
    """Whether a grid is a mask that multiplies: a choice with 0 in one branch, finite."""
    chosen = isinstance(expr, sympy.Piecewise) and any(e == 0 for e, _ in expr.args)
    return chosen and _finite(expr)


def _zero_at_hidden(proof: Proof, summed: list[Var]) -> bool:
    """Whether each block's part of these sums over the rows is zero at the keys it skips
    (the keys no row of the block sees), so that adding it into the keys it sees is exact."""
    return all(proof.state.get(v) == ZERO for v in summed)


def _key(spec: Spec, rows: Rows) -> Index | None:
    """The scores' other sequence index, summed before the rows' exits: none where an exit
    joined over the rows keeps it (a block over some keys would give part of its rows)."""
    joined = (i for e in rows.exits if e.var not in rows.summed for i in e.dims)
    sequence = sequence_indices(spec) - set(joined)
    others = [i for i in rows.scores.dims if i in sequence]
    return others[0] if len(others) == 1 else None


def _condition(var: Var, steps: list[Step]) -> bool:
    """Whether `where` reads the variable as its condition: a boolean mask."""
    return any(
        isinstance(s, Elementwise) and s.fn == "where" and getattr(s.args[0], "var", None) == var
        for s in steps
    )


@dataclass
class Proof:
    """The pass over the rows' steps: the value each makes at hidden entries (`state`), and
    the axes it was made with (`made`), so that a read that swaps the row and key axes, or
    renames the key, is seen (it reads other entries than the hidden ones)."""

    row: Index
    key: Index
    mask: Var
    hides: str
    state: dict[Var, str | None]
    made: dict[Var, tuple[Index, ...]] = field(default_factory=dict)

    def proves(self, steps: list[Step]) -> bool:
        """Whether no step reads a hidden key's entry in a way that its absence would change."""
        for step in steps:
            if not all(map(self.aligned, reads(step))):
                return False
            got = self.follow(step)
            if got == FAIL:
                return False
            if self.key in step.out.dims:
                self.state[step.out.var] = got
                self.made[step.out.var] = step.out.dims
        return True

    def aligned(self, op: Operand) -> bool:
        """Whether the read puts the row and the key on the axes the value has them on."""
        if op.var == self.mask:
            return axes_of(op)[-2:] == [self.row, self.key]
        made = self.made.get(op.var)
        if made is None:
            return True
        own = zip(made, axes_of(op), strict=True)
        return all((m == i) == (d == i) for m, d in own for i in (self.row, self.key))

    def at(self, arg: Arg) -> str | None:
        if not isinstance(arg, Operand):
            return _number(arg.expr)
        return self.state.get(arg.var) if self.key in arg.dims else None

    def follow(self, step: Step) -> str | None:
        """The value at hidden entries of what the step makes, or FAIL."""
        at, key = self.at, self.key
        if isinstance(step, Rename):
            return at(step.arg)
        if isinstance(step, Contract):
            summed = any(key in a.dims for a in step.args) and key not in step.out.dims
            return _product([at(a) for a in step.args], summed, step.scale.is_positive)
        if isinstance(step, Linear):
            value = _product([at(step.x)], key in step.inner, False)
            return None if value == ZERO and step.bias is not None else value
        if isinstance(step, Add):
            return _sum([at(a) for a in step.args], step.signs or (1,) * len(step.args))
        if isinstance(step, Reduction):
            return _reduction(step.fn, key in step.over, at(step.arg))
        if isinstance(step, Elementwise):
            return self.elementwise(step)
        if isinstance(step, Cat | Stack):
            return FAIL if step.over == key else _either([at(p) for p in step.parts])
        if isinstance(step, Gather):  # a table's entries at positions: finite numbers
            return FAIL if key in step.arg.dims else None
        return FAIL

    def elementwise(self, step: Elementwise) -> str | None:
        """`where` on the mask picks a branch at hidden entries (the other gets a gradient of
        0 there, which is NaN times an infinite derivative: it may not be anything), and any
        other picks either; dropout keeps 0 and nothing else; a function maps the values by
        its torch code."""
        if step.fn == "where":
            cond, *branches = step.args
            on_mask = isinstance(cond, Operand) and cond.var == self.mask
            picked = on_mask and self.hides in ("true", "false")
            if picked:
                kept, dropped = branches if self.hides == "true" else branches[::-1]
                return FAIL if self.at(dropped) == ANY else self.at(kept)
            return _either([self.at(b) for b in branches])
        values = [self.at(a) for a in step.args]
        if step.fn == "dropout":  # -inf times a dropped entry's 0 is NaN
            return values[0] if values[0] in (ZERO, None) else ANY
        return _image(step.fn, values, step.args)


def _product(values: list[str | None], summed: bool, positive: bool | None) -> str | None:
    """A product of factors (times a scale), summed over the keys or not."""
    if ZERO in values:
        return FAIL if {NEG, ANY} & set(values) else ZERO  # 0 · -inf: NaN
    if summed:
        return FAIL
    if values == [NEG] and positive:
        return NEG
    return ANY if {NEG, ANY} & set(values) else None  # -inf · -inf, -inf · x: ±inf or NaN


def _sum(values: list[str | None], signs: tuple[int, ...]) -> str | None:
    if any(v == NEG and s < 0 for v, s in zip(values, signs)):
        return FAIL  # -inf - -inf: NaN
    if ANY in values or NEG in values:
        return ANY if ANY in values else NEG
    return ZERO if all(v == ZERO for v in values) else None


# reductions along other axes than the key that give back a value all of whose entries are
# the same: the sum, max, min and mean of 0s are 0, of -infs -inf
KEEPING = frozenset({"sum", "max", "min", "mean"})


def _reduction(fn: str, over_key: bool, value: str | None) -> str | None:
    """A sum (or max, softmax, ...) over the keys must see the hidden entries as nothing;
    one along other axes maps the value."""
    if over_key:
        if fn == "softmax" and value == NEG:
            return ZERO
        return None if (fn, value) in (("sum", ZERO), ("max", NEG), ("logsumexp", NEG)) else FAIL
    if value in (None, ANY) or fn in KEEPING:
        return value
    if fn == "logsumexp":
        return NEG if value == NEG else None  # log n of 0s
    return None if value == ZERO else ANY  # a softmax of -infs is NaN


def _either(values: list[str | None]) -> str | None:
    """One of the values at each entry: the value they all are, else finite, unless one may
    be anything or -inf."""
    if len(set(values)) == 1:
        return values[0]
    return ANY if ANY in values or NEG in values else None


def _number(expr: sympy.Basic) -> str | None:
    """A number's value: 0, -inf, anything (inf, NaN) or finite (scalars are finite)."""
    if expr == 0:
        return ZERO
    if expr == sympy.S.NegativeInfinity:
        return NEG
    return ANY if expr.is_finite is False else None


# finite values a finite argument is tried at, next to a hidden entry's 0 or -inf
SAMPLES = (-2.5, -1.0, 0.0, 0.5, 3.0)


def _image(fn: str, values: list[str | None], args: tuple[Arg, ...]) -> str | None:
    """What the operator makes of the arguments' values at hidden entries: run its torch code
    on -inf, 0 and finite samples; 0 or -inf everywhere is that, finite numbers are finite;
    anything else (inf, NaN, an infinite derivative, an error) may be anything."""
    op = lookup(fn)
    partial = op.partial and not _whole_power(fn, args)
    if ANY in values:
        return ANY
    if not {NEG, ZERO} & set(values):
        return ANY if partial else None
    try:
        made, grads = _run(op.torch, values, args)
    except (RuntimeError, TypeError, ValueError):
        return ANY
    if not all(g is None or bool(g.isfinite().all()) for g in grads):
        return ANY
    if bool((made == 0).all()):
        return ZERO
    if bool((made == float("-inf")).all()):
        return NEG
    return None if bool(made.isfinite().all()) and not partial else ANY


def _whole_power(fn: str, args: tuple[Arg, ...]) -> bool:
    """x^n for a whole number n: finite wherever x is (`pow` is partial for x^-1, x^0.5)."""
    exponent = args[1] if fn == "pow" else None
    return (
        isinstance(exponent, Number) and bool(exponent.expr.is_integer) and bool(exponent.expr >= 0)
    )


def _run(template: str, values: list[str | None], args: tuple[Arg, ...]):
    """The template run on probes (each argument's own axis of values) in float64, and its
    derivative in each argument where it has one."""
    import math

    import torch
    import torch.nn.functional as F

    probes = []
    for k, (value, arg) in enumerate(zip(values, args)):
        if value is None and not isinstance(arg, Operand) and arg.expr.is_number:
            points = [float(arg.expr)]
        else:
            points = {NEG: [float("-inf")], ZERO: [0.0]}.get(value, list(SAMPLES))
        shape = [1] * len(args)
        shape[k] = len(points)
        probe = torch.tensor(points, dtype=torch.float64).reshape(shape)
        probes.append(probe.requires_grad_())
    names = {f"x{k}": p for k, p in enumerate(probes)}
    scope = {"torch": torch, "F": F, "math": math, "training": False, "dtype": torch.float64}
    scope |= names  # the casts of a precision (ops.CASTS) read the call's dtype: the probes'
    made = eval(template.format(*names), scope)  # the operator table's own code, no spec text
    if not made.dtype.is_floating_point:
        return made.to(torch.float64), []
    grads = torch.autograd.grad(made.sum(), probes, allow_unused=True)
    return made.detach(), grads
