"""Whether a condition on positions holds at every point of a box of them, read off the
condition as a test on the box's ends: ring attention runs it on each tile pair's numbers
(indexattn/parallel/ring.py), the generated code prints it for the key spans of each block of
queries (lower/printers/tables_emit.py, `box_call`). The test is sufficient, not necessary: false
where it cannot tell."""

from __future__ import annotations

import sympy
from sympy.logic.boolalg import to_nnf

# a comparison of a difference d = lhs - rhs with 0, by d's least and greatest values
_HOLDS = {
    ">": lambda lo, hi: lo > 0,
    ">=": lambda lo, hi: lo >= 0,
    "<": lambda lo, hi: hi < 0,
    "<=": lambda lo, hi: hi <= 0,
    "==": lambda lo, hi: sympy.And(sympy.Eq(lo, 0), sympy.Eq(hi, 0)),
    "!=": lambda lo, hi: sympy.Or(lo > 0, hi < 0),
}


def holds_on_box(cond: sympy.Basic, box: dict, known: frozenset = frozenset()) -> sympy.Basic:
    """A condition on the ends of `box` (symbol -> (first, last): numbers or symbols) under
    which `cond` holds at every point of the box. `known`: the other symbols `cond` may read,
    fixed over the box (sizes, scalars); a comparison that reads any other (an index outside
    the box, a value read off a tensor) cannot be told. A negation is pushed down to the
    comparisons first (`to_nnf`: not τ > u is τ <= u); `or` holds where one of its parts
    holds on the whole box."""
    cond = to_nnf(cond)
    if cond in (sympy.true, sympy.false):
        return cond
    if isinstance(cond, sympy.Or | sympy.And):
        return type(cond)(*(holds_on_box(c, box, known) for c in cond.args))
    if isinstance(cond, sympy.core.relational.Relational) and cond.rel_op in _HOLDS:
        found = bounds(cond.lhs - cond.rhs, box, known)
        return sympy.false if found is None else _HOLDS[cond.rel_op](*found)
    return sympy.false


def bounds(expr: sympy.Expr, box: dict, known: frozenset = frozenset()):
    """(least, greatest) value of `expr` over the box, or None: where `expr` is a sum of
    parts each reading one of the box's symbols (and no two reading the same one, so that
    a sawtooth τ - C floor(τ / C) is not taken for two monotone parts), each monotone in it
    (c·x, or c·floor(a·x + b)), the extremes of each part at its symbol's ends."""
    if not expr.free_symbols <= set(box) | set(known):
        return None
    lo, hi, seen = sympy.S.Zero, sympy.S.Zero, set()
    for term in sympy.Add.make_args(sympy.expand(expr)):
        inside = term.free_symbols & set(box)
        rise = _rise(term, *inside) if len(inside) == 1 and not inside & seen else None
        if inside and rise is None:
            return None
        seen |= inside
        ends = [term.subs(s, end) for s in inside for end in box[s]] or [term, term]
        if rise == 0:  # the sign of its slope not known (a scalar's)
            ends = [sympy.Min(*ends), sympy.Max(*ends)]
        lo, hi = lo + ends[rise == -1], hi + ends[rise != -1]
    return lo, hi


def _rise(term: sympy.Expr, symbol: sympy.Symbol) -> int | None:
    """1 where the term rises with the symbol, -1 where it falls, 0 where it is monotone but
    the sign of its slope is not known; None where it is not c·x or c·floor(a·x + b)."""
    factor, rest = term.as_independent(symbol, as_Add=False)
    if isinstance(rest, sympy.floor | sympy.ceiling):
        rest = rest.args[0]
    if not rest.is_polynomial(symbol) or sympy.degree(rest, symbol) != 1:
        return None
    slope = factor * sympy.Poly(rest, symbol).coeffs()[0]
    if symbol in slope.free_symbols:
        return None
    return 1 if slope.is_nonnegative else -1 if slope.is_nonpositive else 0


def bounding(condition: sympy.Basic, read: sympy.Expr, size: sympy.Expr) -> list[sympy.Basic]:
    """The comparisons of a condition (a conjunction) that keep `read` inside an axis of
    `size`: `τ >= p` (or `τ > p`) for the read `τ - p`."""
    atoms = condition.args if isinstance(condition, sympy.And) else (condition,)
    bounds = read_bounds(read, size)
    return [
        atom
        for atom in atoms
        if (e := nonnegative(atom)) is not None
        and any(sympy.expand(b - e).is_nonnegative for b in bounds)
    ]


def comparisons(condition: sympy.Basic) -> list[sympy.Expr] | None:
    """A conjunction of comparisons of whole numbers as the e of each `e >= 0`, or None."""
    atoms = condition.args if isinstance(condition, sympy.And) else (condition,)
    found = [nonnegative(a) for a in atoms]
    return None if any(e is None for e in found) else found


def read_bounds(read: sympy.Expr, size: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """A read inside an axis, as two values >= 0: `read` and `size - 1 - read`."""
    return sympy.expand(read), sympy.expand(size - 1 - read)


def nonnegative(atom: sympy.Basic) -> sympy.Expr | None:
    """A comparison of whole numbers as `e >= 0`'s e."""
    if isinstance(atom, sympy.GreaterThan):
        return sympy.expand(atom.lhs - atom.rhs)
    if isinstance(atom, sympy.StrictGreaterThan):
        return sympy.expand(atom.lhs - atom.rhs - 1)
    if isinstance(atom, sympy.LessThan):
        return sympy.expand(atom.rhs - atom.lhs)
    if isinstance(atom, sympy.StrictLessThan):
        return sympy.expand(atom.rhs - atom.lhs - 1)
    return None
