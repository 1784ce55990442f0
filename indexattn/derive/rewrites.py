"""The rewrites of the derived backward, in the order they apply (as lower/program/passes' PASSES).
Reverse mode proper (derive/reverse.py) writes each step plainly and hands it, a frozen value
that prints (a cotangent, the parts of a sum), to each rewrite of that step in
this order; a rewrite returns it rewritten, or as it found it where it does not apply. Each
function's first docstring line is its guarantee (besides equal gradients).
tests/derive/test_derive_rewrites.py checks the backward against the literal interpreter after each
rewrite, and planted wrong rewrites are caught and named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir import At, Field, Index, Node, Product, Reduce, Ref, Tensor
from .cotangents import ZERO, Cot, Part, equal, product, where
from .reverse import Derivation, reads


@dataclass(frozen=True)
class Rewrite:
    """One rewrite: the step of reverse mode it rewrites (`hook`: "rows", softmax's row sum;
    "sums", the parts of a cotangent; "running", cumsum's reverse) and the function that
    does, `run(derivation, plain, *context) -> rewritten`."""

    hook: str
    run: Callable

    @property
    def name(self) -> str:
        return self.run.__name__

    @property
    def guarantee(self) -> str:
        return (self.run.__doc__ or "").splitlines()[0]


def flash(d: Derivation, plain: Cot, node: Reduce) -> Cot:
    """softmax's row sum Σ_j A dA is Σ dO O where A is read once, by O = A V: product rule.

    FlashAttention's D = rowsum(dO ∘ O), where A = softmax_<j>(S) is read once, by O = A V
    (any product that sums j and keeps A's other indices); elsewhere `plain` as it is."""
    reader = single_reader(d, node)
    if reader is None:
        return plain
    a, (o, written) = d.eq.tensor, reader
    rename = dict(zip(written, a.indices))
    for extra in o.indices:
        if extra not in rename and extra in a.indices:
            rename[extra] = d.fresh_index(extra)
    axes = tuple(tuple(rename.get(i, i) for i in axis) for axis in o.layout)
    rows = Product((Ref(d.names[o], axes, None), Ref(o, axes, None)), (), None)
    return Cot(rows, frozenset(), frozenset(a.indices))


def single_reader(d: Derivation, node: Reduce) -> tuple[Tensor, tuple[Index, ...]] | None:
    """(O, how O = A V writes A) where the softmax A = `node` is read once, by a product
    that sums A's softmax indices and keeps its others, and O's cotangent is known; or None."""
    a = d.eq.tensor
    readers = [e for e in d.spec.equations if reads(e.rhs, a)]
    if node is not d.eq.rhs or a in d.spec.outputs or len(readers) != 1:
        return None
    reader = readers[0]
    rhs = reader.rhs
    if not isinstance(rhs, Product) or reader.tensor not in d.names:
        return None
    mine = [f for f in rhs.factors if isinstance(f, Ref) and f.tensor == a]
    if len(mine) != 1 or any(f is not mine[0] and reads(f, a) for f in rhs.factors):
        return None
    written = mine[0].written
    if not all(isinstance(i, Index) for i in written):
        return None
    over = [w for w, i in zip(written, a.indices) if i in node.over]
    rows = [w for w in written if w not in over]
    lhs = reader.tensor.indices
    if any(j not in rhs.summed for j in over) or any(r not in lhs for r in rows):
        return None
    return reader.tensor, written


def reverse_cumsum(d: Derivation, running: Cot, node: Reduce, g: Cot) -> Cot:
    """cumsum's cotangent, the sum over j' ≥ j, as flip, cumsum, flip: no cancellation.

    The reverse running sum as autograd computes it: the running sum of the cotangent
    read backwards along j, read backwards (flip, cumsum, flip; the total less the
    running sum cancels in the tail: 2.7 relative error in bfloat16 at N = 1024 where this
    gives autograd's 0.004)."""
    if not g.layout:  # a reference with a sign: named first
        g = d.materialize(g, "d" + d.eq.tensor.name, node.free)
    reversal = Reduce("cumsum", node.over, flipped(g.node, node), None)
    back = d.materialize(
        Cot(reversal, g.free, g.all), "d" + d.eq.tensor.name + "_rev", node.body.free
    )
    return Cot(flipped(back.node, node), g.free, g.all)


def flipped(ref: Ref, node: Reduce) -> Ref:
    """The reference read backwards along the cumsum's indices."""
    flip = {i: At(reversed_position(i, node.span), node.span) for i in node.over}
    return Ref(ref.tensor, tuple(tuple(flip.get(i, i) for i in axis) for axis in ref.axes), None)


def reversed_position(index: Index, span) -> Node:
    """The position `size - 1 - index`: a whole axis read backwards (a flip)."""
    return Field(index.size - 1 - index.symbol, (index,), span)


def stack(d: Derivation, parts: tuple[Part, ...], names: list[Index], tensor: Tensor):
    """Parts differing in one constant along one index are one product, cotangents stacked.

    Parts that differ only in their cotangent and in one constant along one index,
    summed as one product over that index, the cotangents stacked along it by a `where`
    chain: Σ_c where(B == c, dP_c X, 0) is (stack_B dP) X, and Σ_c dP_c W_<(μca)i> is
    (stack_B dP) W_<(μBa)i>; the plan then makes one contraction of what were several
    (mha's dW and dX: one matmul each, not three and their sum)."""
    groups: dict[tuple, list[tuple[int, Part]]] = {}
    for p in parts:
        found = stackable(d, p, names, tensor)
        if found:
            key, const = found
            groups.setdefault(key, []).append((const, p))
    merged: dict[int, Part] = {}
    for key, members in groups.items():
        if len(members) > 1 and len({c for c, _ in members}) == len(members):
            merged[id(members[0][1])] = stacked(d, key, members, tensor)
            merged |= {id(p): None for _, p in members[1:]}
    return tuple(merged.get(id(p), p) for p in parts if merged.get(id(p), p) is not None)


def stackable(d: Derivation, part: Part, names: list[Index], tensor: Tensor):
    """(what the parts of one stack share, this part's constant), or None: the part's
    cotangent is a product whose first factor is a named cotangent, and either the part
    writes one constant where the tensor has an index (dW's B) or, written plainly, the
    part's product reads one tensor at one constant (dX's W_<(μ0a)i>)."""
    cot = part.cot
    if len(cot.factors) < 2 or not cot.factors[0].layout:
        return None
    head, rest = cot.factors[0], cot.factors[1:]
    written = part.ref.written
    slots = [k for k, w in enumerate(written) if not isinstance(w, Index)]
    if any(isinstance(w, Index) and w != g for g, w in zip(names, written)):
        return None
    if len(slots) == 1 and isinstance(written[slots[0]], int):
        index = names[slots[0]]  # the index the tensor's cotangent is written with there
        if index in cot.all:
            return None
        key = ("slot", index, tuple(f.node for f in rest), head.free)
        return key, written[slots[0]]
    read = [(n, f) for n, f in enumerate(rest) if f.ref and constants(f.ref) == 1]
    if slots or len(read) != 1:
        return None
    n, f = read[0]
    k = next(k for k, w in enumerate(f.ref.written) if isinstance(w, int))
    index = f.ref.tensor.indices[k]
    if index in cot.all:
        return None
    others = tuple(g.node for g in rest if g is not f)
    key = ("read", index, n, f.ref.tensor, k, others, head.free, cot.free)
    return key, f.ref.written[k]


def stacked(d: Derivation, key: tuple, members: list[tuple[int, Part]], tensor: Tensor) -> Part:
    """One part for a group of `stackable` ones: their cotangents stacked along the index
    (an equation of its own), times what they share."""
    index = key[1]
    members = sorted(members, key=lambda m: m[0])
    heads = [p.cot.factors[0] for _, p in members]
    consts = [c for c, _ in members]
    whole = index.size == len(consts) and consts == list(range(len(consts)))
    chain = heads[-1].node if whole else ZERO
    for c, head in reversed(list(zip(consts, heads))[: -1 if whole else None]):
        chain = where(equal(index, c), head.node, chain)
    stems = [h.node.tensor.name.removeprefix("d") for h in heads]
    plain = all(s.isalpha() for s in stems) and len("".join(stems)) <= 8
    base = "d" + ("".join(stems) if plain else tensor.name + "_stack")  # dQKV
    order = [i for axis in heads[0].layout for i in axis]
    order.insert(1, index)
    free = heads[0].free | {index}
    once = ("stack", chain, tuple(order))
    if once not in d.once:  # dX and dW stack the same cotangents
        d.once[once] = d.materialize(Cot(chain, free, free), base, order)
    stack = d.once[once]
    first = members[0][1]
    if key[0] == "slot":
        whole_ref = Ref(first.ref.tensor, along(first.ref, index), first.ref.span)
        rest = list(first.cot.factors[1:])
        return Part(whole_ref, product([stack, *rest], frozenset(first.cot.free | {index})))
    rest = []
    for f in first.cot.factors[1:]:
        if f.ref is not None and constants(f.ref) == 1 and f.ref.tensor == key[3]:
            f = Cot(Ref(f.ref.tensor, along(f.ref, index), None), f.free | {index}, f.all | {index})
        rest.append(f)
    return Part(first.ref, product([stack, *rest], first.cot.free))


def along(ref: Ref, index: Index) -> tuple:
    """The reference's axes with its one constant replaced by `index`."""
    return tuple(tuple(index if isinstance(w, int) else w for w in axis) for axis in ref.axes)


def constants(ref: Ref) -> int:
    """How many constants (literal positions) a reference writes."""
    return sum(isinstance(w, int) for w in ref.written)


BACKWARD_REWRITES: tuple[Rewrite, ...] = (
    Rewrite("rows", flash),
    Rewrite("sums", stack),
    Rewrite("running", reverse_cumsum),
)
NAMES = tuple(r.name for r in BACKWARD_REWRITES)


def upto(name: str | None) -> tuple[Rewrite, ...]:
    """The rewrites up to and including `name` ("reverse": none; None: all), as
    `indexattn grad --dump-after` applies them; ValueError naming the choices."""
    if name is None:
        return BACKWARD_REWRITES
    if name != "reverse" and name not in NAMES:
        choices = ", ".join(("reverse", *NAMES))
        raise ValueError(f"no backward rewrite {name!r}; write one of: {choices}")
    return BACKWARD_REWRITES[: NAMES.index(name) + 1 if name in NAMES else 0]
