"""The axes of a lifted graph: atoms (one index each, in the end) that views split and fuse,
that products and broadcasts unify, by union-find with refinement: an atom split into parts
is those parts wherever it is read, as `(μ a)` is wherever the fused axis is read."""

from __future__ import annotations

import itertools

import sympy

from .errors import LiftError

_ids = itertools.count()


class Atom:
    """One axis factor: a size, a hint for its glyph (`μ`, `a`), its union-find parent and, once
    split, its parts in row-major order. Mutable while the graph is read; frozen after."""

    __slots__ = ("hint", "id", "parent", "parts", "size")

    def __init__(self, size, hint: str = "") -> None:
        self.size = sympy.sympify(size)
        self.hint, self.parent, self.parts, self.id = hint, None, None, next(_ids)

    def __repr__(self) -> str:
        return f"{self.hint or 'atom'}{self.id}:{self.size}"


def find(atom: Atom) -> Atom:
    while atom.parent is not None:
        atom = atom.parent
    return atom


def leaves(atom: Atom) -> list[Atom]:
    """The atom as it is read now: its finest parts, each its own representative."""
    atom = find(atom)
    if atom.parts is None:
        return [atom]
    return [leaf for part in atom.parts for leaf in leaves(part)]


def flat(atoms) -> list[Atom]:
    """Leaves of several atoms, size-1 ones dropped (a unit axis is no index)."""
    return [a for atom in atoms for a in leaves(atom) if a.size != 1]


def same(a, b) -> bool:
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def unify(a: Atom, b: Atom) -> None:
    """a and b are one index from now on (their leaves matched pairwise, split where needed)."""
    a, b = find(a), find(b)
    if a is b:
        return
    if a.parts is not None or b.parts is not None:
        unify_lists(leaves(a), leaves(b))
        return
    if not same(a.size, b.size):
        raise LiftError(f"axes of sizes {a.size} and {b.size} meet where one index is needed")
    if b.hint and not a.hint:
        a.hint = b.hint
    b.parent = a


def split(atom: Atom, size) -> tuple[Atom, Atom]:
    """The atom as (first of `size`, rest): refined in place, everywhere it is read."""
    atom = find(atom)
    rest = sympy.simplify(atom.size / size)
    if not (rest.is_Integer and sympy.sympify(size).is_Integer):
        raise LiftError(f"an axis of size {atom.size} is split by {size}")
    atom.parts = [Atom(size), Atom(rest)]
    return atom.parts[0], atom.parts[1]


def unify_lists(left: list[Atom], right: list[Atom]) -> None:
    """Two readings of one axis (or of one run of axes): leaves matched in order, the larger
    one split where sizes differ, units skipped."""
    left, right = flat(left), flat(right)
    while left and right:
        a, b = find(left.pop(0)), find(right.pop(0))
        if same(a.size, b.size):
            unify(a, b)
        elif _divides(b.size, a.size):
            first, rest = split(a, b.size)
            unify(first, b)
            left.insert(0, rest)
        elif _divides(a.size, b.size):
            first, rest = split(b, a.size)
            unify(a, first)
            right.insert(0, rest)
        else:
            raise LiftError(f"axes of sizes {a.size} and {b.size} cannot be one reading")
    if flat(left) or flat(right):
        raise LiftError("two readings of an axis differ in size")


def group(atoms: list[Atom], sizes) -> list[list[Atom]]:
    """A run of atoms regrouped into axes of the given sizes (a view or a reshape): each axis
    takes whole atoms, an atom larger than what an axis still needs split there."""
    pending, out = flat(atoms), []
    for size in sizes:
        size, axis = sympy.sympify(size), []
        while not same(size, 1):
            if not pending:
                raise LiftError("a view reads more than its tensor holds")
            atom = find(pending.pop(0))
            if _divides(atom.size, size):
                axis.append(atom)
                size = sympy.simplify(size / atom.size)
            elif _divides(size, atom.size):
                first, rest = split(atom, size)
                axis.append(first)
                pending.insert(0, rest)
                size = sympy.Integer(1)
            else:
                raise LiftError(f"a view of an axis of {atom.size} into {size} is no regrouping")
        out.append(axis or [Atom(1)])
    if pending:
        raise LiftError("a view leaves part of its tensor unread")
    return out


def _divides(part, whole) -> bool:
    """whole / part a whole number for every size: 3, or s0 (sizes are positive)."""
    quotient = sympy.simplify(sympy.sympify(whole) / sympy.sympify(part))
    numerator, denominator = sympy.fraction(sympy.together(quotient))
    if denominator != 1:
        return False
    poly = sympy.Poly(numerator, *sorted(numerator.free_symbols, key=str) or [sympy.Symbol("_")])
    return all(c.is_Integer and c > 0 for c in poly.coeffs())
