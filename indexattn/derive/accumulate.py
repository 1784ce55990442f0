"""The cotangent of one tensor: the sum of what each reference to it sent, each part read in
the names the tensor's cotangent is written with, a part through a slice or a computed
position scattered back by `where` on the index it selects."""

from __future__ import annotations

from ..ir import At, Index, Node, Reduce, Ref, Sum, Tensor, renamed
from .cotangents import ZERO, Cot, Line, Part, conjunction, equal, where
from .walk import Walk


def accumulate(d: Walk, tensor: Tensor) -> Cot:
    """One equation for the cotangent of `tensor`: the sum of its parts; returns it read
    with the tensor's own layout."""
    parts = d.parts.pop(tensor)
    plain = next((p for p in parts if all(isinstance(i, Index) for i in p.ref.written)), None)
    names = list(plain.ref.written if plain else tensor.indices)
    flat = iter(names)
    axes = tuple(tuple(next(flat) for _ in axis) for axis in tensor.layout)
    free = frozenset(tensor.indices)
    name = d.fresh("d" + tensor.name)  # before its parts' names
    grouped = d.rewritten("sums", tuple(parts), names, tensor)
    terms = [term(d, p, names, tensor) for p in grouped]
    given = terms[0]  # already a tensor of its own (the cotangent input): read as it is
    if (
        tensor.role == "derived"
        and len(terms) == 1
        and isinstance(given, Ref)
        and given.axes == axes
    ):
        d.taken.discard(name)
        d.names[tensor] = given.tensor
        return Cot(Ref(given.tensor, tensor.layout, None), free, free)
    uncovered(d, tensor, parts, names)
    cotangent = d.names[tensor] = d.tensor(name, axes)
    value = terms[0] if len(terms) == 1 else Sum(tuple(terms), None)
    d.out.equations.append(Line(Ref(cotangent, axes, None), value))
    return Cot(Ref(cotangent, tensor.layout, None), free, free)


def uncovered(d: Walk, tensor: Tensor, parts: list[Part], names: list[Index]) -> None:
    """Every index of a cotangent must vary in some part (a cotangent constant along an
    index alone would need a tensor of ones, which the language has no name for)."""
    covered = set()
    for p in parts:
        for g, w in zip(names, p.ref.written):
            if not isinstance(w, Index) or w in p.cot.free:
                covered.add(g)
    for g in names:
        if g not in covered:
            raise d.refuse(
                f"the cotangent of {tensor.name}, constant along {g.glyph}",
                parts[0].ref,
                "a cotangent that only broadcasts along an index is not derived yet.",
            )


def term(d: Walk, part: Part, names: list[Index], tensor: Tensor) -> Node:
    """A part read in `names`: as it is, where its reference writes them; placed by `where`
    on a slice's index, where it writes a literal there; else scattered."""
    written, cot = part.ref.written, part.cot
    slots = [(g, w) for g, w in zip(names, written) if not isinstance(w, Index)]
    same = all(w == g for g, w in zip(names, written) if isinstance(w, Index))
    if same and not slots:
        return cot.node
    if same and not any(isinstance(w, At) or g in cot.all for g, w in slots):
        return where(conjunction([equal(g, w) for g, w in slots]), cot.node, ZERO)
    return scatter(d, part, names, tensor)


def scatter(d: Walk, part: Part, names: list[Index], tensor: Tensor) -> Node:
    """A part whose reference selects a slice or reads computed positions: named, then
    placed by `where` on the index of the slot, summed over the positions' indices."""
    ref, cot = part.ref, part.cot
    order = [i for i in ref.free if i in cot.free]
    named = d.materialize(cot, "d" + tensor.name, order)
    rename = {w: g for g, w in zip(names, ref.written) if isinstance(w, Index)}
    fresh = []
    for w in ref.written:
        for i in w.free if isinstance(w, At) else ():
            if i not in rename:
                rename[i] = d.fresh_index(i)
                fresh.append(rename[i])
    conditions = []
    for g, w in zip(names, ref.written):
        if isinstance(w, int):
            conditions.append(equal(g, w))
        elif isinstance(w, At):
            conditions.append(equal(g, renamed(w.value, rename)))
    value = Ref(named.node.tensor, tuple((rename.get(i, i),) for i in order), None)
    if conditions:
        value = where(conjunction(conditions), value, ZERO)
    return Reduce("sum", tuple(fresh), value, None) if fresh else value
