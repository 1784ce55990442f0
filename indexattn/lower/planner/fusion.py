"""IR patterns that one PyTorch call computes exactly: the attention core of
`F.scaled_dot_product_attention`, and products with a weight that `F.linear` computes.

Matching reads the structure of the equations (which index is contracted, which is
softmaxed, which tensor is used where), never names or axis orders; the planner turns a match
into steps. Anything that does not match exactly is left to the general steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import sympy
from sympy.logic.boolalg import to_nnf

from ... import ir
from ...ir import Equation, Index, Spec
from . import predicates

# -- projections: a product with a weight stored [out, in] or [in, out]


@dataclass(frozen=True)
class LinearForm:
    """`weight · x` over the weight's whole `inner` block (+ a bias shaped like its out block)."""

    weight: ir.Ref
    x: ir.Node
    bias: ir.Ref | None
    out_axes: int  # how many of the weight's axes hold its out indices
    transposed: bool  # the out block is last: [in, out]
    inner: tuple[Index, ...]  # the contracted indices, in the weight's order
    outer: tuple[Index | int, ...]  # the weight's out block, flat, as written

    @property
    def literal(self) -> int | None:
        """The flat position, in the out block, of the one literal it selects (or None)."""
        hits = [k for k, item in enumerate(self.outer) if isinstance(item, int)]
        return hits[0] if len(hits) == 1 else None

    @property
    def part(self) -> int | None:
        """The flat position, in the out block, of the one run of consecutive positions it
        reads (`[d_n + r]`: r from d_n on; or None): the rest of the block is indices."""
        hits = [k for k, item in enumerate(self.outer) if not isinstance(item, Index)]
        if len(hits) != 1 or not isinstance(self.outer[hits[0]], ir.At):
            return None
        declared = _declared_outer(self)[hits[0]]
        return hits[0] if shift(self.outer[hits[0]].value, declared) is not None else None

    @property
    def sliced(self) -> int | None:
        """Where the out block is sliced: the literal's or the part's flat position."""
        return self.literal if self.literal is not None else self.part

    def span(self) -> tuple[Index, sympy.Basic]:
        """A part's index and its first position along the declared one."""
        at = self.outer[self.part]
        return at.value.free[0], shift(at.value, _declared_outer(self)[self.part])


def linear_form(node: ir.Node) -> LinearForm | None:
    """`W_<(μa)i> X_<τi>` or `W_<(μa)i> X_<τi> + b_<(μa)>`: one weight whose contracted axes
    form its last (or first) block, times anything else, plus an optional matching bias."""
    product, bias = node, None
    if isinstance(node, ir.Sum) and len(node.terms) == 2:
        product, bias = node.terms
        if not isinstance(product, ir.Product):
            product, bias = bias, product
    if not isinstance(product, ir.Product) or len(product.factors) < 2:
        return None
    if bias is not None and not isinstance(bias, ir.Ref):
        return None
    for weight, x in _weight_and_rest(product):
        form = _weight_form(weight, x, product.summed)
        if form is not None and (bias is None or _fits_bias(form, bias)):
            return LinearForm(weight, x, bias, *form)
    return None


def _weight_and_rest(product: ir.Product):
    """Each factor against the others, multiplied elementwise first where they all carry the
    same indices (`W_<if> (silu(G_<τf>) U_<τf>)`: the gate times the up projection, then one
    product with W); others, whose elementwise product would be an outer one, are never split
    so."""
    factors = product.factors
    for k, weight in enumerate(factors):
        rest = factors[:k] + factors[k + 1 :]
        if len(rest) == 1:
            yield weight, rest[0]
        elif len({frozenset(f.free) for f in rest}) == 1 and rest[0].free:
            yield weight, ir.Product(rest, (), product.span)


def whole(form: LinearForm) -> bool:
    """The weight is used whole: no literal picks a slice of it."""
    return all(isinstance(i, Index) for i in form.outer)


def direct(form: LinearForm) -> bool:
    """`F.linear` reads the weight as it is stored: whole, or the block of rows that one
    literal leading its out block selects (`in_proj_weight_<(0μa)i>`, a view)."""
    return whole(form) or (not form.transposed and form.literal == 0)


def _weight_form(weight: ir.Node, x: ir.Node, summed: tuple[Index, ...]):
    if not isinstance(weight, ir.Ref) or weight.tensor.role not in ("param", "buffer"):
        return None
    if isinstance(x, ir.Field) or not summed or set(weight.free) & set(x.free) != set(summed):
        return None
    flags = [all(item in summed for item in axis) for axis in weight.axes]
    n = len(flags)
    for transposed in (False, True):
        k = flags.index(not transposed) if (not transposed) in flags else n
        if 0 < k < n and flags == [transposed] * k + [not transposed] * (n - k):
            first = [i for axis in weight.axes[:k] for i in axis]
            rest = [i for axis in weight.axes[k:] for i in axis]
            inner, outer = (first, rest) if transposed else (rest, first)
            if set(inner) == set(summed):
                return (n - k if transposed else k), transposed, tuple(inner), tuple(outer)
    return None


def _fits_bias(form: tuple, bias: ir.Ref) -> bool:
    """A bias read with exactly the weight's out block (same indices, literals and grouping)."""
    flat = tuple(item for axis in bias.axes for item in axis)
    return bias.tensor.role in ("param", "buffer") and not bias.tensor.batched and flat == form[3]


@dataclass(frozen=True)
class ProjectionGroup:
    """Equations that read the slices of one weight against one operand, together all of
    it: the values B = 0, 1, ... of an index (`W_<(μ0a)i>`, `W_<(μ1a)i>`, ...), or runs of
    positions end to end (`W_<(μ[n])l>`, `W_<(μ[d_n + r])l>`). One matrix product computes
    them all, and a split hands out the slices."""

    equations: tuple[Equation, ...]  # in the order of the slices along the weight
    forms: tuple[LinearForm, ...]

    @property
    def parts(self) -> tuple[Index, ...]:
        """Each run's index, in order ((): slices by literals)."""
        return () if self.forms[0].part is None else tuple(f.span()[0] for f in self.forms)


def projection_groups(spec: Spec) -> tuple[ProjectionGroup, ...]:
    """Every full set of slices of one weight against the same operand."""
    found: dict[tuple, list[tuple[Equation, LinearForm]]] = {}
    for eq in spec.equations:
        form = linear_form(eq.rhs)
        if form is not None and form.sliced is not None and isinstance(form.x, ir.Ref):
            found.setdefault(_signature(form), []).append((eq, form))
    groups = []
    for members in found.values():
        forms = [form for _, form in members]
        whole = _by_literal(forms) if forms[0].literal is not None else _end_to_end(forms)
        if whole is not None:
            order = sorted(range(len(members)), key=whole.__getitem__)
            groups.append(ProjectionGroup(*(tuple(members[k][j] for k in order) for j in (0, 1))))
    return tuple(groups)


def _by_literal(forms: list[LinearForm]) -> list | None:
    """Each slice's literal, where they are 0, 1, ... up to the index's size; else None."""
    values = [form.outer[form.literal] for form in forms]
    declared = _declared_outer(forms[0])[forms[0].literal]
    if declared.size.is_Integer and sorted(values) == list(range(int(declared.size))):
        return values
    return None


def _end_to_end(forms: list[LinearForm]) -> list | None:
    """Each run's rank along the weight, where the runs (two or more) lie end to end from 0
    to the end of the declared index at every size; else None. Chained from 0 (each start
    the previous end, proved by sympy): sizes need not be comparable (`d_r < d_e`)."""
    spans = [form.span() for form in forms]
    declared = _declared_outer(forms[0])[forms[0].part]
    order: list[int] = []
    at = sympy.S.Zero
    while len(order) < len(spans):
        following = [k for k, (_, start) in enumerate(spans) if sympy.expand(start - at) == 0]
        following = [k for k in following if k not in order]
        if len(following) != 1:
            return None
        order.append(following[0])
        at = spans[following[0]][1] + spans[following[0]][0].size
    if len(forms) < 2 or sympy.expand(at - declared.size) != 0:
        return None
    return [order.index(k) for k in range(len(spans))]


def _signature(form: LinearForm) -> tuple:
    """What equal slices share: tensors, the slice's place, and which axes pair up."""
    x_flat = [i for axis in form.x.axes for i in axis]
    w_flat = [i for axis in form.weight.axes for i in axis]
    pairs = tuple(w_flat.index(i) if i in w_flat else -1 for i in x_flat)
    bias = form.bias.tensor.name if form.bias else None
    kind = "literal" if form.literal is not None else "part"
    return (form.weight.tensor.name, kind, form.sliced, form.x.tensor.name, pairs, bias)


def shift(position: ir.Node, axis: Index) -> sympy.Basic | None:
    """The start k when `position` is i + k, k free of indices, and k to k + size(i) lies
    within the axis at every size (`[2 d_r + p]` over `p : d_p` on `a : 2 d_r + d_p`)."""
    if not isinstance(position, ir.Field) or len(position.free) != 1:
        return None
    index = position.free[0]
    start = sympy.expand(position.expr - index.symbol)
    if (
        start.has(*(i.symbol for i in position.free))
        or start.free_symbols - axis.size.free_symbols - index.size.free_symbols
    ):
        return None
    fits = (start.is_nonnegative, sympy.expand(axis.size - start - index.size).is_nonnegative)
    return start if all(fits) else None


def reversal(position: ir.Node, axis: Index) -> Index | None:
    """The index i when `position` is size - 1 - i along an axis of that size (a flip,
    `[1 - c]` on halves), else None."""
    if not isinstance(position, ir.Field) or len(position.free) != 1:
        return None
    index = position.free[0]
    if sympy.expand(index.size - axis.size) != 0:
        return None
    return index if sympy.expand(position.expr - (axis.size - 1 - index.symbol)) == 0 else None


def repetition(position: ir.Node, axis: Index) -> sympy.Basic | None:
    """c when `position` is floor(i / c) over an index i of c times the axis's size: each
    value read c times in a row (`[floor(τ' / ℓ)]` on `β : N / ℓ`), else None."""
    if not isinstance(position, ir.Field) or len(position.free) != 1:
        return None
    index = position.free[0]
    times = sympy.cancel(index.size / axis.size)
    if sympy.fraction(times)[1] != 1 or not times.is_positive:
        return None
    return times if position.expr == sympy.floor(index.symbol / times) else None


def _declared_outer(form: LinearForm) -> tuple[Index, ...]:
    """The weight's declared indices at the positions of the out block."""
    declared = form.weight.tensor.layout
    block = declared[-form.out_axes :] if form.transposed else declared[: form.out_axes]
    return tuple(i for axis in block for i in axis)


def declared_outer(form: LinearForm) -> tuple[Index, ...]:
    """The out block with each literal replaced by the declared index it selects from."""
    declared = _declared_outer(form)
    return tuple(w if isinstance(w, Index) else d for w, d in zip(form.outer, declared))


# -- the attention core


@dataclass(frozen=True)
class AttentionMatch:
    """`O = softmax_<key>(scale · Q·K + mask) · V`, equation by equation, or any of them written
    inline in the next (`A = softmax(Q K / sqrt(d) + M)`, `O = softmax(S) V`): one meaning.

    The core `node` (weights times values, summed over the key) is the output's right-hand
    side, a term of it, or two factors of a longer product there (`W_O A V`: the other
    factors are applied to the kernel's result). Indices are named as in the equation `at`
    that writes the scores, except `value_width` and `rename` (scores names -> output names),
    which belong to the output equation."""

    masks: tuple[Equation, ...]  # predicate masks that every use of reads in a core: absorbed
    booleans: tuple[Equation, ...]  # masks read at computed positions: `keep` reads each one's
    # keep, made as a boolean tensor of its own (`kept_tensor`)
    scores: Equation | None  # None: written inline in the softmax
    weights: Equation | None  # None: the softmax written inline in the output's product
    dropout: Equation | None
    output: Equation
    node: ir.Product
    q: tuple[ir.Node, ...]  # the queries, in parts whose features sit side by side
    k: tuple[ir.Node, ...]  # the keys, in the same parts
    v: ir.Node
    scale: sympy.Basic
    terms: tuple[ir.Node, ...]  # the additive terms of the scores (masks, biases)
    keep: sympy.Basic | ir.Node | None  # every term a predicate mask: where attention may go
    heads: tuple[Index, ...]  # shared by queries and keys
    groups: tuple[Index, ...]  # query heads that share a key head (grouped-query attention)
    query: Index
    key: Index
    widths: tuple[tuple[Index, ...], ...]  # the features each part of q and k contracts
    value_width: Index
    rename: tuple[tuple[Index, Index], ...]
    p: sympy.Basic | None  # dropout probability on the weights

    @property
    def chain(self) -> tuple[Equation, ...]:
        """The equations the kernel computes before the output's."""
        chain = (self.scores, self.weights, self.dropout)
        return self.masks + tuple(eq for eq in chain if eq is not None)

    @property
    def equations(self) -> tuple[Equation, ...]:
        return (*self.chain, self.output)

    @property
    def whole(self) -> bool:
        """The kernel computes the output's whole right-hand side."""
        return self.node is self.output.rhs

    @property
    def at(self) -> Equation:
        """The equation whose names the scores are written in."""
        return next(eq for eq in (self.scores, self.weights, self.output) if eq is not None)

    @property
    def order(self) -> tuple[Index, ...]:
        """The scores' axes in the order `at` writes them (the key last where `at` sums it)."""
        return tuple(dict.fromkeys((*self.at.indices, self.key)))

    @property
    def causal(self) -> bool:
        """The mask is exactly key > query, on one range: the kernel's is_causal."""
        q, k = self.query.symbol, self.key.symbol
        return (
            self.query.size == self.key.size
            and self.keep is not None
            and self.keep in (sympy.Le(k, q), sympy.Ge(q, k))
        )


def find_attention(spec: Spec) -> tuple[AttentionMatch, ...]:
    """Every attention core in the spec that the fused kernel computes exactly. A predicate
    mask read by several cores is absorbed by each (`is_causal` twice), and computed only
    where something else reads it too."""
    uses = read_counts(spec)
    defined = {eq.tensor.name: eq for eq in spec.equations}
    matcher = _Matcher(defined, uses)
    matches = (matcher.match(eq, node) for eq in spec.equations for node in _cores(eq.rhs))
    found = [m for m in matches if m is not None]
    absorbed = Counter(eq.tensor.name for m in found for eq in m.masks)
    whole_uses = {name for name, n in absorbed.items() if n == uses[name]}
    return tuple(
        replace(m, masks=tuple(eq for eq in m.masks if eq.tensor.name in whole_uses)) for m in found
    )


def read_counts(spec: Spec) -> Counter:
    counts: Counter = Counter(t.name for t in spec.outputs)
    for eq in spec.equations:
        counts.update(ref.tensor.name for ref in ir.refs(eq.rhs))
    return counts


def renaming(ref: ir.Ref) -> dict[Index, Index] | None:
    """The referenced tensor's left-hand indices -> the indices written in `ref`."""
    written = [i for axis in ref.axes for i in axis]
    if not all(isinstance(i, Index) for i in written):
        return None
    return dict(zip(ref.tensor.indices, written))


@dataclass(frozen=True)
class _Meaning:
    """What a node computes: a derived tensor read only here is its equation's right-hand side
    (`rename`: its indices -> the names written here); any other node is itself."""

    rhs: ir.Node
    rename: dict[Index, Index]
    eq: Equation | None

    def name(self, index: Index) -> Index:
        return self.rename.get(index, index)


@dataclass(frozen=True)
class _Chain:
    """From the output back to the scores: A = softmax(S), maybe Ã = dropout(A, p)."""

    scores: _Meaning
    weights: _Meaning
    dropped: _Meaning | None
    p: sympy.Basic | None

    def rename(self) -> dict[Index, Index]:
        """Scores names -> output names."""
        outer = self.dropped if self.dropped is not None else self.weights
        inner = self.weights if self.dropped is not None else None

        def output_name(i: Index) -> Index:
            i = self.scores.name(i)
            return outer.name(inner.name(i) if inner is not None else i)

        return {i: output_name(i) for i in self.scores.rhs.free}


class _Matcher:
    """Walks back from a core A V (an output equation's right-hand side, or part of it) through
    A = softmax(S), S = Q K s + M."""

    def __init__(self, defined: dict[str, Equation], uses: Counter) -> None:
        self.defined, self.uses = defined, uses

    def single(self, ref: ir.Node) -> Equation | None:
        """The equation of a derived tensor used by this one reference and nothing else."""
        if not isinstance(ref, ir.Ref) or ref.tensor.name not in self.defined:
            return None
        return self.defined[ref.tensor.name] if self.uses[ref.tensor.name] == 1 else None

    def meaning(self, node: ir.Node) -> _Meaning | None:
        if not isinstance(node, ir.Ref):
            return _Meaning(node, {}, None)
        eq, rename = self.single(node), renaming(node)
        return None if eq is None or rename is None else _Meaning(eq.rhs, rename, eq)

    def match(self, output: Equation, node: ir.Product) -> AttentionMatch | None:
        if len(node.summed) != 1:
            return None
        for ref, v in (node.factors, node.factors[::-1]):
            chain = self.chain(ref)
            if chain is not None:
                return self.core(output, node, v, chain)
        return None

    def chain(self, node: ir.Node) -> _Chain | None:
        """A (or dropout of A) with A = softmax over one index of S, S used only there."""
        weights, dropped, p = self.meaning(node), None, None
        if (
            weights is not None
            and isinstance(weights.rhs, ir.Apply)
            and weights.rhs.fn == "dropout"
        ):
            dropped, (inner, p_node) = weights, weights.rhs.args
            weights, p = self.meaning(inner), p_node.expr
        if weights is None or not isinstance(weights.rhs, ir.Reduce):
            return None
        if weights.rhs.fn != "softmax" or len(weights.rhs.over) != 1:
            return None
        scores = self.meaning(weights.rhs.body)
        return None if scores is None else _Chain(scores, weights, dropped, p)

    def core(self, output, node, v, chain: _Chain) -> AttentionMatch | None:
        """Index roles: the key is softmaxed and summed against V; the rest follow."""
        free = chain.scores.rhs.free
        key = {chain.scores.name(i): i for i in free}.get(chain.weights.rhs.over[0])
        rename = chain.rename()
        if key is None or node.summed != (rename[key],):
            return None
        parts = self.scores(chain.scores.rhs, key)
        if parts is None:
            return None
        return self.assemble((output, node), v, chain, rename, key, *parts)

    def scores(self, node: ir.Node, key: Index):
        """S = scale · Σ Q·K + terms: one or more products of two tensors, each contracted over
        its own features (several indices, as rotary's halves c j); the kernel takes all the
        features side by side as one axis."""
        parts, terms = [], []
        for term in node.terms if isinstance(node, ir.Sum) else (node,):
            found = contractions(term)
            parts += found
            terms += [] if found else [term]
        if not parts or len({scale for scale, _ in parts}) != 1:
            return None
        qs, ks = [], []
        for _, product in parts:
            if len(product.factors) != 2:
                return None
            q, k = product.factors if key not in product.factors[0].free else product.factors[::-1]
            if key in q.free or key not in k.free:
                return None
            qs.append(q)
            ks.append(k)
        widths = tuple(product.summed for _, product in parts)
        return tuple(qs), tuple(ks), parts[0][0], tuple(terms), widths

    def assemble(self, at, v, chain, rename, key, q, k, scale, terms, widths):
        q_free, k_free = _lead(q, widths), _lead(k, widths)
        heads = tuple(i for i in q_free if i in k_free)
        alone = [i for i in q_free if i not in k_free]
        if [i for i in k_free if i not in q_free] != [key] or not alone:
            return None
        query = _query(alone, key)
        groups = tuple(i for i in alone if i != query)
        if not (_spread_over(q, widths, (*heads, *groups)) and _spread_over(k, widths, heads)):
            return None
        value_width = [i for i in v.free if i not in rename.values()]
        v_heads = {i for i in v.free if i in rename.values()} - {rename[key]}
        if len(value_width) != 1 or v_heads != {rename[i] for i in heads}:
            return None
        if not _same_batching(*q, *k, v):
            return None
        keep, masks, booleans = self.masks(terms, (*heads, *groups, query, key), q[0])
        if keep is False:
            return None
        return AttentionMatch(
            masks=masks,
            booleans=booleans,
            scores=chain.scores.eq,
            weights=chain.weights.eq,
            dropout=chain.dropped.eq if chain.dropped is not None else None,
            output=at[0],
            node=at[1],
            q=q,
            k=k,
            v=v,
            scale=scale,
            terms=terms,
            keep=keep,
            heads=heads,
            groups=groups,
            query=query,
            key=key,
            widths=widths,
            value_width=value_width[0],
            rename=tuple(rename.items()),
            p=chain.p,
        )

    def masks(self, terms, allowed, q):
        """(keep predicate or None, absorbed mask equations, those read at computed positions);
        keep is False for no match."""
        if any(set(t.free) - set(allowed) or not t.free for t in terms):
            return False, (), ()
        head_count = len(allowed) - 2
        if head_count > 1 and any(set(t.free) - set(allowed[-2:]) for t in terms):
            return False, (), ()  # a per-head mask cannot follow heads merged into one axis
        if any(_batched(t) and not _batched(q) for t in terms):
            return False, (), ()
        keeps, absorbed, booleans = [], [], []
        for term in terms:
            keep, eq = self.predicate(term)
            if keep is None:
                return None, (), ()  # an additive mask: the terms are summed as they are
            keeps.append(keep)
            absorbed.extend([eq] if eq is not None else [])
            booleans.extend([eq] if isinstance(keep, ir.Ref) else [])
        if not all(isinstance(k, sympy.Basic) for k in keeps):
            joined = predicates.conjunction(keeps, allowed, q.span)
            return joined, tuple(absorbed), tuple(dict.fromkeys(booleans))
        return (to_nnf(sympy.And(*keeps)) if keeps else None), tuple(absorbed), ()

    def predicate(self, term: ir.Node):
        """where(cond, -inf, 0) (or its mirror), inline, as a tensor of positions (which other
        cores may read too), or as a mask that reads tensors (document ids) used only here;
        either read at computed positions, as its keep made boolean and read there."""
        if isinstance(term, ir.Field):
            return _keep(term.expr), None
        if isinstance(term, ir.Apply):
            return predicates.keep_of(term), None
        single = self.single(term)
        if single is not None and renaming(term) == {i: i for i in single.indices}:
            keep = predicates.keep_of(single.rhs)  # a mask that reads tensors, used only here
            if keep is not None:
                return keep, single
        eq = self.defined.get(term.tensor.name) if isinstance(term, ir.Ref) else None
        if eq is None or not (isinstance(eq.rhs, ir.Field) or eq is single):
            return None, None
        rename = renaming(term)
        if rename is None:  # read at computed positions: `M_<τ[floor(τ' / ℓ)]>`
            found = kept_node(eq) is not None
            return (ir.Ref(kept_tensor(eq), term.axes, term.span), eq) if found else (None, None)
        keep = _keep(eq.rhs.expr) if isinstance(eq.rhs, ir.Field) else None
        if keep is None:
            return None, None
        return keep.xreplace({a.symbol: b.symbol for a, b in rename.items()}), eq


def kept_tensor(eq: Equation) -> ir.Tensor:
    """The boolean tensor of a mask's keep (no spec's tensor is named with spaces)."""
    return replace(eq.tensor, name=eq.tensor.name + " keep", ascii=eq.tensor.ascii + "_keep")


def kept_node(eq: Equation) -> ir.Node | None:
    """Where a 0/-inf mask's equation keeps a key, in its own indices; None for another."""
    if not isinstance(eq.rhs, ir.Field):
        return predicates.keep_of(eq.rhs)
    keep = _keep(eq.rhs.expr)
    if keep is None:
        return None
    free = tuple(i for i in eq.rhs.free if i.symbol in keep.free_symbols)
    return ir.Field(to_nnf(keep), free, eq.rhs.span)


def _cores(node: ir.Node) -> Iterator[ir.Product]:
    """Where an attention core may sit in a right-hand side: all of it, a term of a sum, or
    two factors of a longer product that alone carry an index summed there (the key): the
    sum over it is then theirs alone, the other factors applied to its result."""
    if isinstance(node, ir.Sum):
        for term in node.terms:
            yield from _cores(term)
    elif isinstance(node, ir.Product) and len(node.factors) == 2:
        yield node
    elif isinstance(node, ir.Product):
        frees = [f.free for f in node.factors]
        carriers = {i: tuple(k for k, free in enumerate(frees) if i in free) for i in node.summed}
        for pair in dict.fromkeys(c for c in carriers.values() if len(c) == 2):
            alone = tuple(i for i, c in carriers.items() if c == pair)
            yield ir.Product(tuple(node.factors[k] for k in pair), alone, node.span)


def contractions(term: ir.Node) -> list[tuple[sympy.Basic, ir.Product]]:
    """A term of the scores as (scale, product of tensors contracted over some indices)
    pairs: `Q K / s`, or `(Q0 K0 + Q1 K1) / s` distributed; [] for any other term."""
    if not isinstance(term, ir.Product):
        return []
    fields = [f for f in term.factors if isinstance(f, ir.Field)]
    rest = tuple(f for f in term.factors if not isinstance(f, ir.Field))
    if any(f.free for f in fields):
        return []
    scale = sympy.Mul(*(f.expr for f in fields))
    if term.summed:
        return [(scale, ir.Product(rest, term.summed, term.span))]
    if len(rest) != 1 or not isinstance(rest[0], ir.Sum):
        return []
    inner = [contractions(t) for t in rest[0].terms]
    if not all(inner):
        return []
    return [(scale * s, product) for found in inner for s, product in found]


def _lead(parts: tuple[ir.Node, ...], widths) -> tuple[Index, ...]:
    """The indices the parts of the queries (or keys) carry besides their features, together."""
    return tuple(dict.fromkeys(i for n, w in zip(parts, widths) for i in n.free if i not in w))


def _spread_over(parts: tuple[ir.Node, ...], widths, heads: tuple[Index, ...]) -> bool:
    """Each part carries every index of the parts together, or lacks only heads: one rotary
    key for all heads is that key viewed over them (MLA). A part that lacks the sequence, or
    whose features another part carries as a free index, does not join the others."""
    lead = set(_lead(parts, widths))
    if lead & {i for w in widths for i in w}:
        return False
    return all(lead - set(n.free) <= set(heads) for n in parts)


def _query(alone: list[Index], key: Index) -> Index:
    """Of the indices only queries carry, the sequence: the one ranging like the key, or the
    last one."""
    alike = [i for i in alone if i.size == key.size]
    return alike[0] if len(alike) == 1 else alone[-1]


def _same_batching(*nodes: ir.Node) -> bool:
    return len({_batched(n) for n in nodes}) == 1


def _batched(node: ir.Node) -> bool:
    return any(ref.tensor.batched for ref in ir.refs(node))


def _keep(expr: sympy.Basic) -> sympy.Basic | None:
    """For where(cond, -inf, 0): not cond; for where(cond, 0, -inf): cond; else None."""
    if not isinstance(expr, sympy.Piecewise) or len(expr.args) != 2:
        return None
    (first, cond), (second, otherwise) = expr.args
    if otherwise is not sympy.true:
        return None
    if first == -sympy.oo and second == 0:
        return sympy.Not(cond)
    if first == 0 and second == -sympy.oo:
        return cond
    return None
