"""Spec -> Spec: one shape of each computation before the planner matches anything, so that
two phrasings of one computation meet the same matcher. `REWRITES` is the order; each
rewrite returns a spec whose outputs are the same values (tests/lower/test_passes.py runs the
canonical spec of every shipped and random spec against the literal reading of the spec as
written). The spec a person wrote stays what LaTeX, counts of parameters and errors read;
only the planner reads the canonical one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial

import sympy

from ... import ir
from ...ir import Equation, Index, Spec, Tensor, printer
from ...notation.names import fresh
from ..program import numerics
from .fusion import contractions, linear_form, read_counts, renaming


@dataclass(frozen=True)
class Rewrite:
    """One rewrite of the canonical form: its name, its function and what it guarantees."""

    name: str
    run: Callable[[Spec], Spec]
    guarantees: str


def canonical(spec: Spec, rewrites: tuple[Rewrite, ...] | None = None) -> Spec:
    """`canonical(check(text, "mha"))` -> the spec the planner reads: every rewrite of
    `rewrites` (REWRITES) in order."""
    for rewrite in REWRITES if rewrites is None else rewrites:
        spec = rewrite.run(spec)
    return spec


# -- projections inside a larger product


def projections(spec: Spec) -> Spec:
    """A weight times one operand, read as a factor of a larger product (the whole of
    attention in one equation: `softmax(W_Q X W_K X / √d + M) W_V X`), becomes an equation
    of its own, `P = W X`, and the product reads P: the matcher then sees queries, keys and
    values as the separate equations would give them. Exact: Einstein summation over the
    weight's inner indices, which no other factor carries, may be done first."""
    names = _taken(spec)
    equations: list[Equation] = []
    tensors = list(spec.tensors)
    for eq in spec.equations:
        made: list[Equation] = []
        rhs = _mapped(eq.rhs, lambda node, made=made: _split(node, names, made))
        equations += [*made, replace(eq, rhs=rhs) if made else eq]
        tensors += [m.tensor for m in made]
    if len(equations) == len(spec.equations):
        return spec
    return replace(spec, tensors=tuple(tensors), equations=tuple(equations))


def _split(node: ir.Node, names: set[str], made: list[Equation]) -> ir.Node:
    """A product with each weight-times-operand pair among its factors read from an
    equation of its own (appended to `made`)."""
    if not isinstance(node, ir.Product):
        return node
    while (pair := _pair(node)) is not None:
        k, j, inner = pair
        weight, x = node.factors[k], node.factors[j]
        product = ir.Product((weight, x), inner, node.span, node.source)
        eq = _defined(product, weight, names)
        made.append(eq)
        read = ir.Ref(eq.tensor, eq.tensor.layout, node.span, (node.span,) * len(eq.indices))
        factors = [read if m == k else f for m, f in enumerate(node.factors) if m != j]
        summed = tuple(i for i in node.summed if i not in inner)
        node = ir.Product(tuple(factors), summed, node.span, node.source)
    return node


def _pair(node: ir.Product) -> tuple[int, int, tuple[Index, ...]] | None:
    """The first weight (a param or buffer) and operand among the factors whose shared
    indices are summed and carried by no other factor, and that `F.linear` computes, when
    some other factor than numbers remains; else None."""
    factors = node.factors
    for k, weight in enumerate(factors):
        if not isinstance(weight, ir.Ref) or weight.tensor.role not in ("param", "buffer"):
            continue
        for j, x in enumerate(factors):
            rest = [f for m, f in enumerate(factors) if m not in (k, j)]
            if j == k or not any(not isinstance(f, ir.Field) for f in rest):
                continue
            inner = tuple(i for i in weight.free if i in x.free)
            others = {i for f in rest for i in f.free}
            if not inner or not set(inner) <= set(node.summed) or others & set(inner):
                continue
            if linear_form(ir.Product((weight, x), inner, node.span)) is not None:
                return k, j, inner
    return None


def _defined(product: ir.Product, weight: ir.Ref, names: set[str]) -> Equation:
    """`P_<...> = W X`: its indices as attention reads them, the weight's rows in their
    order with the operand's own indices before the innermost (heads, positions, width)."""
    rows = [i for i in weight.free if i not in product.summed]
    own = [i for i in product.free if i not in rows]
    order = (*rows[:-1], *own, *rows[-1:])
    x = product.factors[1]
    name = fresh(f"{weight.tensor.ascii}_{_word(x)}", names)
    layout = tuple((i,) for i in order)
    tensor = Tensor(name, name, "derived", layout, ir.batched(product))
    text = f"{printer.ref(name, layout)} = {printer.text(product)}"
    return Equation(tensor, product, text)


def _word(node: ir.Node) -> str:
    """A name part for an operand: its tensor's, or `x` for an expression."""
    return node.tensor.ascii if isinstance(node, ir.Ref) else "x"


def _taken(spec: Spec) -> set[str]:
    """Every name a new tensor must not take: tensors', scalars', indices' and sizes'."""
    names = {n for t in spec.tensors for n in (t.name, t.ascii)}
    names |= {n for s in spec.scalars for n in (s.name, s.ascii)}
    names |= {n for i in spec.indices for n in (i.glyph, i.ascii)}
    return names | set(spec.size_asciis)


# -- index groups every use keeps together

Slot = tuple[str, int]  # a tensor's name and the flat position of the first of two indices
Pair = tuple[Index, Index]


def groups(spec: Spec) -> Spec:
    """Two indices that every use keeps side by side, in one order, and reads whole (the
    halves `(c j)` of a head written on the values and the output as on the rotated queries:
    `V_<gτcj>`, `O_<grτcj>`, `W_O_<i(grcj)>`) become one index of their product's size, as
    if written `a : 2 d_r`: the matcher then sees a head width, not two. Exact: where both
    lie in one axis, the merged index reads the same storage (the first index major);
    elsewhere the tensor is the spec's own (derived, not an output) and is stored so.
    A pair goes unmerged wherever one of its indices is read alone, at a computed position,
    in a number, or summed without the other."""
    slots = _slots(spec)
    merges = _merges(spec, slots)
    if not merges:
        return spec
    merged = {pair: _index(pair, _taken(spec)) for pairs in merges.values() for pair in pairs}
    kept = {slot for pairs in merges.values() for touched in pairs.values() for slot in touched}
    tensors = {t.name: _merged_tensor(t, kept, merged) for t in spec.tensors}
    equations = tuple(
        _merged_equation(eq, merges.get(k, {}), merged, tensors)
        for k, eq in enumerate(spec.equations)
    )
    return replace(
        spec,
        indices=(*spec.indices, *dict.fromkeys(merged.values())),
        tensors=tuple(tensors.values()),
        equations=equations,
        outputs=tuple(tensors[t.name] for t in spec.outputs),
    )


def _slots(spec: Spec) -> set[Slot]:
    """Where two indices side by side may become one: inside one axis, or (a derived tensor
    that is no output: its layout is the spec's own) in two axes of one index each."""
    outputs = {t.name for t in spec.outputs}
    found = set()
    for t in spec.tensors:
        free = t.role == "derived" and t.name not in outputs
        flat = 0
        for k, axis in enumerate(t.layout):
            found |= {(t.name, flat + m) for m in range(len(axis) - 1)}
            following = t.layout[k + 1] if k + 1 < len(t.layout) else ()
            if free and len(axis) == 1 and len(following) == 1:
                found.add((t.name, flat))
            flat += len(axis)
    return found


def _merges(spec: Spec, slots: set[Slot]) -> dict[int, dict[Pair, frozenset[Slot]]]:
    """Per equation, the pairs it merges and the slots each touches: the fixpoint where every
    slot kept is merged by every equation that reads or defines its tensor."""
    uses = [_uses(eq) for eq in spec.equations]
    users: dict[str, list[int]] = {}  # each tensor's equations: a slot is checked by those
    for k, used in enumerate(uses):
        for name in dict.fromkeys(name for name, _ in used):
            users.setdefault(name, []).append(k)
    while True:
        merges = {k: _pairs(eq, uses[k], slots) for k, eq in enumerate(spec.equations)}
        keep = {
            slot
            for slot in slots
            if all(_covered(uses[k], slot, merges[k]) for k in users.get(slot[0], ()))
        }
        keep -= {(name, p + 1) for name, p in keep if (name, p) in keep}  # overlaps
        if keep == slots:
            return {k: pairs for k, pairs in merges.items() if pairs}
        slots = keep


def _uses(eq: Equation) -> list[tuple[str, tuple]]:
    """Each tensor the equation defines or reads, with its items as written, flat."""
    refs = [(r.tensor.name, r.written) for r in ir.refs(eq.rhs)]
    return [(eq.tensor.name, eq.indices), *refs]


def _covered(uses: list, slot: Slot, pairs: dict[Pair, frozenset[Slot]]) -> bool:
    """Whether every use of the slot's tensor in an equation is one of its merged pairs."""
    name, p = slot
    return all(
        slot in pairs.get(tuple(items[p : p + 2]), ()) for tensor, items in uses if tensor == name
    )


def _pairs(eq: Equation, uses: list, slots: set[Slot]) -> dict[Pair, frozenset[Slot]]:
    """The pairs of indices the equation writes side by side at slots only, always together."""
    found: dict[Pair, set[Slot]] = {}
    for tensor, items in uses:
        for p in range(len(items) - 1):
            u, v = items[p : p + 2]
            if (tensor, p) in slots and isinstance(u, Index) and isinstance(v, Index) and u != v:
                found.setdefault((u, v), set()).add((tensor, p))
    return {
        pair: frozenset(touched)
        for pair, touched in found.items()
        if _together(eq, uses, pair, touched)
    }


def _together(eq: Equation, uses: list, pair: Pair, touched: set[Slot]) -> bool:
    """Whether the equation writes the pair's indices only as the pair, at the slots
    `touched`, and reads them whole everywhere else."""
    u, v = pair
    for tensor, items in uses:
        for p, item in enumerate(items):
            if item == u and (tuple(items[p : p + 2]) != pair or (tensor, p) not in touched):
                return False
            if item == v and (p == 0 or items[p - 1] != u):
                return False
    return all(_whole(node, pair) for node in ir.walk(eq.rhs))


def _whole(node: ir.Node, pair: Pair) -> bool:
    """Whether a node reads the pair whole: neither index in a number or a computed
    position, both summed or reduced over or neither, no concatenation along either."""
    if isinstance(node, ir.Ref):
        positions = (i.free for i in node.written if isinstance(i, ir.At))
        return not any(set(pair) & set(free) for free in positions)
    if isinstance(node, ir.Field):
        return not set(pair) & set(node.free)
    return _both_or_neither(node, pair)


def _both_or_neither(node: ir.Node, pair: Pair) -> bool:
    """A sum or reduction over both indices of the pair or neither; a concatenation along
    neither."""
    if isinstance(node, ir.Concat):
        return not set(pair) & {node.over, *node.along}
    over = node.summed if isinstance(node, ir.Product) else getattr(node, "over", ())
    return len(set(pair) & set(over)) != 1


def _index(pair: Pair, names: set[str]) -> Index:
    """The index of a pair's product size: `cj`, or a fresh name."""
    u, v = pair
    name = fresh(u.ascii + v.ascii, names)
    symbol = sympy.Symbol(name, integer=True, nonnegative=True)
    return Index(name, name, u.size * v.size, f"{u.glyph} and {v.glyph} as one", symbol)


def _merged_items(items: tuple, merged: dict[Pair, Index]) -> list:
    out: list = []
    for item in items:
        if out and isinstance(item, Index) and (out[-1], item) in merged:
            out[-1] = merged[(out[-1], item)]
        else:
            out.append(item)
    return out


def _merged_set(indices: tuple[Index, ...], own: dict[Pair, Index]) -> tuple[Index, ...]:
    """Indices summed (or reduced) over, each pair's two as its one, in the first's place."""
    out = list(indices)
    for (u, v), index in own.items():
        if u in out:
            out[out.index(u)] = index
            out.remove(v)
    return tuple(out)


def _merged_tensor(t: Tensor, kept: set[Slot], merged: dict[Pair, Index]) -> Tensor:
    """The tensor with its kept slots' pairs as one index (two axes of one index: one)."""
    flat = t.indices
    spots = sorted(p for name, p in kept if name == t.name)
    if not spots:
        return t
    layout, at = [], 0
    for axis in t.layout:
        items = list(axis)
        if at - 1 in spots and len(axis) == 1:  # the second of two axes of one index
            layout[-1] = (merged[(flat[at - 1], flat[at])],)
        else:
            pairs = {(flat[p], flat[p + 1]): merged[(flat[p], flat[p + 1])] for p in spots}
            layout.append(tuple(_merged_items(tuple(items), pairs)))
        at += len(axis)
    return replace(t, layout=tuple(layout))


def _merged_equation(
    eq: Equation, pairs: dict[Pair, frozenset[Slot]], merged: dict, tensors: dict[str, Tensor]
) -> Equation:
    """The equation over its pairs' merged indices, reading the merged tensors."""
    own = {pair: merged[pair] for pair in pairs}

    def fn(node: ir.Node) -> ir.Node:
        if isinstance(node, ir.Ref):
            return _merged_ref(node, tensors[node.tensor.name], own)
        if isinstance(node, ir.Product):
            return replace(node, summed=_merged_set(node.summed, own))
        if isinstance(node, ir.Reduce):
            return replace(node, over=_merged_set(node.over, own))
        return node

    rhs = _mapped(eq.rhs, fn)
    return replace(eq, tensor=tensors[eq.tensor.name], rhs=rhs)


def _merged_ref(ref: ir.Ref, tensor: Tensor, own: dict[Pair, Index]) -> ir.Ref:
    """A reference with its pairs merged, in the axes its tensor now has."""
    flat = _merged_items(ref.written, own)
    axes, at = [], 0
    for axis in tensor.layout:
        axes.append(tuple(flat[at : at + len(axis)]))
        at += len(axis)
    merged = replace(ref, tensor=tensor, axes=tuple(axes))
    return replace(merged, spans=(ref.span,) * len(merged.free))


# -- explicit sums of products


def sums(spec: Spec) -> Spec:
    """`sum_<τ'>(A_<μττ'> V_<μτ'a>)` is `A_<μττ'> V_<μτ'a>` summed over τ' by Einstein's rule:
    a sum of a product is a contraction, which the planner orders and the matcher reads as
    attention's values; a product of such products is one. Exact: the same sum of the same
    products."""
    equations = tuple(replace(eq, rhs=_mapped(eq.rhs, _contracted)) for eq in spec.equations)
    if equations == spec.equations:
        return spec
    return replace(spec, equations=equations)


def _contracted(node: ir.Node) -> ir.Node:
    if isinstance(node, ir.Product):
        return _flat(node)
    if not (isinstance(node, ir.Reduce) and node.fn == "sum"):
        return node
    body = node.body
    if not isinstance(body, ir.Product):
        return node
    return ir.Product(body.factors, (*body.summed, *node.over), node.span, body.source)


def _flat(node: ir.Product) -> ir.Product:
    """A product of products as one (`sum_<a>(Q K) / √d`), where no summed index of an
    inner product is an index of another factor or summed outside too."""
    taken = {i for f in node.factors for i in f.free} | set(node.summed)
    factors: list[ir.Node] = []
    summed = list(node.summed)
    for f in node.factors:
        if isinstance(f, ir.Product) and not set(f.summed) & taken:
            factors += f.factors
            summed += f.summed
            taken |= set(f.summed)
        else:
            factors.append(f)
    if len(factors) == len(node.factors):
        return node
    return ir.Product(tuple(factors), tuple(summed), node.span, node.source)


# -- softmax written out


def softmaxes(spec: Spec) -> Spec:
    """A softmax written out is `softmax`: `exp(X - logsumexp_<k>(X))`, and `E / sum_<k>(E)`
    with `E = exp(X - max_<k>(X))` or `exp(X)` (inline, or an equation read only there), is
    `softmax_<k>(X)`, which the matcher reads as attention's weights, where every row keeps a
    key (`_sees_a_key`): there the two agree up to rounding (and softmax does not overflow
    where `exp(X)` would). A row that could lose every key is 0/0 written out, NaN, and zeros
    by softmax's policy: that form stays as written."""
    reads = read_counts(spec)
    defined = {eq.tensor.name: eq for eq in spec.equations}
    used: set[str] = set()
    masked = cache(partial(_masked_along, spec))

    def written(node: ir.Node) -> ir.Node:
        found = _exp_minus_logsumexp(node) or _normalised(node, defined, reads, used)
        if found is None or not _sees_a_key(spec, masked, defined, *found):
            return node
        return ir.Reduce("softmax", found[1], found[0], node.span)

    equations = tuple(replace(eq, rhs=_mapped(eq.rhs, written)) for eq in spec.equations)
    if equations == spec.equations:
        return spec
    spec = replace(spec, equations=equations)
    left = read_counts(spec)
    gone = {name for name in used if not left[name]}
    return replace(
        spec,
        tensors=tuple(t for t in spec.tensors if t.name not in gone),
        equations=tuple(eq for eq in spec.equations if eq.tensor.name not in gone),
    )


def _minus(node: ir.Node, fn: str) -> tuple[ir.Node, tuple[Index, ...]] | None:
    """For `X - fn_<k>(X)`: X and k."""
    if not isinstance(node, ir.Sum) or len(node.terms) != 2:
        return None
    x, negated = node.terms
    if not isinstance(negated, ir.Product) or len(negated.factors) != 2 or negated.summed:
        return None
    reduced, minus_one = negated.factors
    if not (isinstance(minus_one, ir.Field) and minus_one.expr == -1):
        return None
    if isinstance(reduced, ir.Reduce) and reduced.fn == fn and reduced.body == x:
        return x, reduced.over
    return None


def _exp_minus_logsumexp(node: ir.Node) -> tuple[ir.Node, tuple[Index, ...]] | None:
    if isinstance(node, ir.Apply) and node.fn == "exp":
        return _minus(node.args[0], "logsumexp")
    return None


def _normalised(node, defined, reads, used) -> tuple[ir.Node, tuple[Index, ...]] | None:
    """For `E / sum_<k>(E)` with E the exponential of X (or of X - max_<k>(X)): X and k."""
    if not isinstance(node, ir.Product) or len(node.factors) != 2 or node.summed:
        return None
    e, inverse = node.factors
    if not (isinstance(inverse, ir.Apply) and inverse.fn == "pow"):
        return None
    total, minus_one = inverse.args
    if not (isinstance(minus_one, ir.Field) and minus_one.expr == -1):
        return None
    if not (isinstance(total, ir.Reduce) and total.fn == "sum" and total.body == e):
        return None
    eq = defined.get(e.tensor.name) if isinstance(e, ir.Ref) else None
    if eq is not None and not (reads[e.tensor.name] == 2 and _plain(e)):
        return None
    exp = eq.rhs if eq is not None else e
    if not (isinstance(exp, ir.Apply) and exp.fn == "exp"):
        return None
    x, over = _minus(exp.args[0], "max") or (exp.args[0], total.over)
    if over != total.over:
        return None
    used.update([eq.tensor.name] if eq is not None else [])
    return x, over


def _sees_a_key(
    spec: Spec,
    masked: Callable[[Index], dict[str, bool]],
    defined: dict,
    x: ir.Node,
    over: tuple[Index, ...],
) -> bool:
    """Whether every row of x along `over` keeps a key that no mask hides, so that softmax
    and the written form agree: x can hold -inf only through masks on positions that never
    hide the key at the query's own position (`where(τ' > τ, -inf, 0)` keeps τ' = τ),
    reading derived tensors under their own index names (`masked`: `_masked_along` the key)."""
    if len(over) != 1:
        return False
    reached = [r for r in ir.refs(x) if r.tensor.name in defined]
    if not all(_plain(r) for r in reached):
        return False
    scalars = frozenset(s.symbol for s in spec.scalars)
    seen = _mapped(x, partial(_seen_diagonal, over[0]))
    return not numerics.may_be_neginf(seen, masked(over[0]), scalars)


def _masked_along(spec: Spec, key: Index) -> dict[str, bool]:
    """Per tensor, whether it may hold -inf (lower/program/numerics.py decides), a mask that keeps
    the key at the query's position read as 0 (`_seen_diagonal`): once per key a spec's softmaxes
    run along, not once per softmax."""
    masked = {t.name: numerics.maskable(t) for t in spec.arguments}
    scalars = frozenset(s.symbol for s in spec.scalars)
    seen = partial(_seen_diagonal, key)
    for eq in spec.equations:
        masked[eq.tensor.name] = numerics.may_be_neginf(_mapped(eq.rhs, seen), masked, scalars)
    return masked


def _seen_diagonal(key: Index, node: ir.Node) -> ir.Node:
    """A mask `where(c, -inf, 0)` on positions that keeps the key at the query's position
    (c false at key = q, q another index of the key's size) as 0; any other node as it is."""
    if not isinstance(node, ir.Field) or key not in node.free:
        return node
    expr = node.expr
    if not (isinstance(expr, sympy.Piecewise) and len(expr.args) == 2):
        return node
    (hidden, cond), (kept, otherwise) = expr.args
    if not (hidden == -sympy.oo and kept == 0 and otherwise is sympy.true):
        return node
    for q in node.free:
        if q != key and q.size == key.size and cond.xreplace({key.symbol: q.symbol}) is sympy.false:
            return ir.Field(sympy.Integer(0), node.free, node.span)
    return node


# -- a softmax's argument: scores plus masks


def softmax_arguments(spec: Spec) -> Spec:
    """A softmax's argument, or a tensor read only as one whole, becomes one sum: scores
    plus additive masks. `where(c, -inf, x)` (masked_fill, as nanoGPT writes it) is
    `x + where(c, -inf, 0)`, and a term that reads scores defined once and read only here
    (`S = Q K / √d`, `A = softmax(S + M)`) is their definition, so that the matcher sees the
    shape `S = Q K / √d + M` that the fused kernel takes. Equal wherever x is finite or -inf;
    at a hidden key where x is +inf or NaN, the filled value is -inf and the sum NaN (the
    fused kernel, as torch's own SDPA, reads hidden scores as the sum)."""
    reads = read_counts(spec)
    whole = _read_whole(spec, reads)
    current: dict[str, Equation] = {}
    inlined: set[str] = set()
    for eq in spec.equations:
        argument = _Argument(current, reads, inlined)
        rhs = argument.rewrite(eq.rhs) if eq.tensor.name in whole else eq.rhs
        rhs = _mapped(rhs, argument.softmax)
        current[eq.tensor.name] = eq if rhs == eq.rhs else replace(eq, rhs=rhs)
    if all(current[eq.tensor.name] is eq for eq in spec.equations):
        return spec
    return replace(
        spec,
        tensors=tuple(t for t in spec.tensors if t.name not in inlined),
        equations=tuple(eq for name, eq in current.items() if name not in inlined),
    )


def _read_whole(spec: Spec, reads) -> set[str]:
    """Derived tensors read once, as the whole argument of a softmax, with their own indices."""
    found: set[str] = set()
    for eq in spec.equations:
        for node in ir.walk(eq.rhs):
            body = node.body if isinstance(node, ir.Reduce) and node.fn == "softmax" else None
            if isinstance(body, ir.Ref) and reads[body.tensor.name] == 1 and _plain(body):
                found.add(body.tensor.name)
    return found


def _plain(ref: ir.Ref) -> bool:
    """A derived tensor with no precision of its own, read with its own indices."""
    rename = renaming(ref)
    return (
        ref.tensor.role == "derived"
        and not ref.tensor.precision
        and rename is not None
        and all(a == b for a, b in rename.items())
    )


@dataclass(frozen=True)
class _Argument:
    """Rewrites one softmax argument; `inlined` collects the definitions it reads in place."""

    current: dict[str, Equation]
    reads: Counter
    inlined: set[str]

    def softmax(self, node: ir.Node) -> ir.Node:
        if isinstance(node, ir.Reduce) and node.fn == "softmax":
            body = self.rewrite(node.body)
            return node if body == node.body else replace(node, body=body)
        return node

    def rewrite(self, node: ir.Node) -> ir.Node:
        terms = _terms(_filled(node))
        if len(terms) == 1:
            return terms[0]
        out: list[ir.Node] = []
        for term in terms:
            found = self.scores(term)
            if found is None:
                out.append(term)
                continue
            eq, numbers = found
            self.inlined.add(eq.tensor.name)
            out += [_scaled(t, numbers) for t in _terms(self.rewrite(eq.rhs))]
        return ir.Sum(tuple(out), node.span)

    def scores(self, term: ir.Node) -> tuple[Equation, tuple[ir.Field, ...]] | None:
        """The definition a term reads, where it is scores read only here, and the numbers
        that scale it there (`S / √d`, where S is one product)."""
        numbers: tuple[ir.Field, ...] = ()
        if isinstance(term, ir.Product) and not term.summed:
            numbers = tuple(f for f in term.factors if isinstance(f, ir.Field) and not f.free)
            rest = [f for f in term.factors if not (isinstance(f, ir.Field) and not f.free)]
            term = rest[0] if len(rest) == 1 else None
        if not isinstance(term, ir.Ref) or self.reads[term.tensor.name] != 1 or not _plain(term):
            return None
        eq = self.current.get(term.tensor.name)
        if eq is None or not any(contractions(t) for t in _terms(eq.rhs)):
            return None
        return None if numbers and len(_terms(eq.rhs)) != 1 else (eq, numbers)


def _scaled(term: ir.Node, numbers: tuple[ir.Field, ...]) -> ir.Node:
    """A term times numbers, one product."""
    if not numbers:
        return term
    if isinstance(term, ir.Product):
        return ir.Product((*numbers, *term.factors), term.summed, term.span, term.source)
    return ir.Product((*numbers, term), (), term.span)


def _filled(node: ir.Node) -> ir.Node:
    """`where(c, -inf, x)` as `x + where(c, -inf, 0)` (and its mirror), x filled in turn."""
    if not isinstance(node, ir.Apply) or node.fn != "where":
        return node
    cond, first, second = node.args
    for hidden, x, values in ((first, second, (-sympy.oo, 0)), (second, first, (0, -sympy.oo))):
        if isinstance(hidden, ir.Field) and hidden.expr == -sympy.oo and x.free:
            mask = _mask(cond, *values, node.span)
            return ir.Sum((*_terms(_filled(x)), mask), node.span)
    return node


def _mask(cond: ir.Node, then: sympy.Basic, otherwise: sympy.Basic, span) -> ir.Node:
    if isinstance(cond, ir.Field):
        return ir.Field(sympy.Piecewise((then, cond.expr), (otherwise, True)), cond.free, span)
    numbers = tuple(ir.Field(sympy.sympify(n), (), span) for n in (then, otherwise))
    return ir.Apply("where", (cond, *numbers), span)


def _terms(node: ir.Node) -> tuple[ir.Node, ...]:
    return node.terms if isinstance(node, ir.Sum) else (node,)


# -- walking


def _mapped(node: ir.Node, fn: Callable[[ir.Node], ir.Node]) -> ir.Node:
    """The node with `fn` applied to every node below it, children first; a node whose
    children all come back as they were is kept (and what it has cached, its free indices)."""
    if isinstance(node, ir.Reduce):
        body = _mapped(node.body, fn)
        return fn(node if body is node.body else replace(node, body=body))
    name = _PARTS.get(type(node))
    if name is not None:
        parts = getattr(node, name)
        mapped = tuple(_mapped(p, fn) for p in parts)
        if any(new is not old for new, old in zip(mapped, parts)):
            node = replace(node, **{name: mapped})
    return fn(node)


_PARTS = {ir.Product: "factors", ir.Sum: "terms", ir.Apply: "args", ir.Concat: "parts"}


REWRITES = (
    Rewrite("sums", sums, "a sum of a product is a contraction"),
    Rewrite("softmaxes", softmaxes, "a softmax written out is softmax"),
    Rewrite(
        "groups",
        groups,
        "two indices every use keeps side by side, read whole, are one index",
    ),
    Rewrite(
        "softmax_arguments",
        softmax_arguments,
        "a softmax's argument is one sum of scores and additive masks",
    ),
    Rewrite(
        "projections",
        projections,
        "a weight times one operand inside a larger product is an equation of its own",
    ),
)
