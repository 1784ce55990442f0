"""The right-hand sides a lifted graph builds: references with one slot per atom (or a
literal, where a slice was selected), index variables, numbers and operations, printed in
the spec language once every atom has its glyph."""

from __future__ import annotations

from dataclasses import dataclass

from .atoms import Atom, find, leaves


@dataclass(frozen=True)
class Ref:
    """A tensor read: each axis a group of slots (atoms, or whole numbers selecting a slice);
    `derived`: a tensor of the lifted spec's own, each leaf an axis of its own."""

    name: str
    axes: tuple[tuple[object, ...], ...]
    derived: bool = False


@dataclass(frozen=True)
class Var:
    """A position: the index variable of an atom."""

    atom: Atom


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Op:
    """`+ - * / ^`, comparisons, `and or not`, `neg`, `where`, or a function of the
    language (`exp`, `tanh`, `cos`, ...)."""

    op: str
    args: tuple


@dataclass(frozen=True)
class Size:
    """The range of some atoms, as the spec's size symbols say it (`d_k`)."""

    atoms: tuple


@dataclass(frozen=True)
class Softmax:
    atom: Atom
    arg: object


def slots(ref: Ref) -> Ref:
    """The reference with each atom slot replaced by its leaves now (a split seen)."""
    axes = tuple(
        tuple(leaf for s in axis for leaf in (leaves(s) if isinstance(s, Atom) else [s]))
        for axis in ref.axes
    )
    return Ref(ref.name, axes, ref.derived)


def substitute(expr, mapping: dict[int, object]):
    """Atoms (by representative id) replaced by a whole number (a slice selected) or another
    atom (a renamed index) wherever the expression reads them."""
    if isinstance(expr, Ref):
        ref = slots(expr)
        axes = tuple(
            tuple(mapping.get(find(s).id, s) if isinstance(s, Atom) else s for s in axis)
            for axis in ref.axes
        )
        return Ref(ref.name, axes, ref.derived)
    if isinstance(expr, Var):
        got = [mapping.get(leaf.id, leaf) for leaf in leaves(expr.atom)]
        if len(got) != 1:
            return expr
        return Var(got[0]) if isinstance(got[0], Atom) else Num(float(got[0]))
    if isinstance(expr, Op):
        return Op(expr.op, tuple(substitute(a, mapping) for a in expr.args))
    if isinstance(expr, Softmax):
        return Softmax(mapping.get(find(expr.atom).id, expr.atom), substitute(expr.arg, mapping))
    return expr


def key(expr):
    """A value equal for two expressions that read the same atoms the same way."""
    if isinstance(expr, Ref):
        ref = slots(expr)
        return ("ref", ref.name, tuple(tuple(_slot(s) for s in axis) for axis in ref.axes))
    if isinstance(expr, Var):
        return ("var", tuple(leaf.id for leaf in leaves(expr.atom)))
    if isinstance(expr, Op):
        return ("op", expr.op, tuple(key(a) for a in expr.args))
    if isinstance(expr, Softmax):
        return ("softmax", find(expr.atom).id, key(expr.arg))
    return ("num", expr.value)


def _slot(s):
    return ("atom", find(s).id) if isinstance(s, Atom) else ("lit", s)


def reads(expr) -> set[int]:
    """The representative ids of every atom the expression reads."""
    if isinstance(expr, Ref):
        return {find(s).id for axis in slots(expr).axes for s in axis if isinstance(s, Atom)}
    if isinstance(expr, Var):
        return {leaf.id for leaf in leaves(expr.atom)}
    if isinstance(expr, Op):
        return set().union(*(reads(a) for a in expr.args))
    if isinstance(expr, Softmax):
        return reads(expr.arg) | {leaf.id for leaf in leaves(expr.atom)}
    return set()


def atoms_of(expr) -> list[Atom]:
    """Every leaf atom the expression reads, in order of first reading."""
    out: dict[int, Atom] = {}
    _collect(expr, out)
    return list(out.values())


def _collect(expr, out: dict[int, Atom]) -> None:
    if isinstance(expr, Ref):
        for axis in slots(expr).axes:
            for s in axis:
                if isinstance(s, Atom):
                    out.setdefault(find(s).id, find(s))
    elif isinstance(expr, Var):
        for leaf in leaves(expr.atom):
            out.setdefault(leaf.id, leaf)
    elif isinstance(expr, Op):
        for a in expr.args:
            _collect(a, out)
    elif isinstance(expr, Softmax):
        for leaf in leaves(expr.atom):
            out.setdefault(leaf.id, leaf)
        _collect(expr.arg, out)
