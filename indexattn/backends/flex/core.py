"""The attention core as FlexAttention reads it: the roles of `lower/fusion.py`'s match (queries,
keys, values, heads, groups, the query and key indices, the scale), the score's changes as one
sympy expression of the raw score `SCORE` (scale · q·k), and where a key is kept as another.

Both read positions (index symbols), sizes and scalars (their symbols) and tensors (`Read`:
a tensor at positions); `mods.py` prints them as `score_mod` and `mask_mod`, `masks.py` bounds
the keep per block. The walk inlines the derived tensors the scores read that are elementwise
in positions (a mask `M_<ττ'>`, raw scores `R`, ALiBi slopes `m_<μ>`): FlexAttention computes
them per score, never as a tensor over two sequence indices."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy.logic.boolalg import to_nnf

from ... import ir
from ...ir import Equation, Index, Spec
from ...lower.planner import fusion, predicates
from ...lower.program.steps import SCORE
from ...ops import lookup


class Read(sympy.Function):
    """A tensor at positions: `Read(k, p1, p2, ...)`, k the number of the tensor in the core's
    `reads`, p the positions along its axes (a fused axis: one flat position)."""


@dataclass(frozen=True)
class Core:
    """One attention core FlexAttention computes: softmax over the key of `score` (kept where
    `keep`), times the values."""

    match: fusion.AttentionMatch  # the roles; its `terms`, `keep` and `masks` are unused here
    score: sympy.Basic  # of SCORE, positions, sizes, scalars and Reads
    keep: sympy.Basic | None  # None: every key
    tensors: tuple[ir.Tensor, ...]  # the tensors `Read` numbers
    inlined: tuple[Equation, ...]  # derived tensors the core alone reads: computed inside it

    @property
    def chain(self) -> tuple[Equation, ...]:
        """The equations one call computes before the output's."""
        return tuple(dict.fromkeys((*self.inlined, *self.match.chain)))

    @property
    def output(self) -> Equation:
        return self.match.output

    @property
    def node(self) -> ir.Product:
        return self.match.node

    @property
    def whole(self) -> bool:
        return self.match.whole

    @property
    def head_indices(self) -> tuple[Index, ...]:
        """The query head indices, merged into FlexAttention's one head axis."""
        return self.match.heads + self.match.groups

    @property
    def query(self) -> Index:
        return self.match.query

    @property
    def key(self) -> Index:
        return self.match.key

    def reads_score(self) -> bool:
        return SCORE in self.score.free_symbols


class Refused(ValueError):
    """Why FlexAttention cannot compute a core (or a spec has none)."""


def cores(spec: Spec) -> tuple[Core, ...]:
    """Every attention core of the (canonical) spec that FlexAttention computes; Refused, with
    the reason, where a softmax times values is not one."""
    uses = fusion.read_counts(spec)
    defined = {eq.tensor.name: eq for eq in spec.equations}
    walk = _Walk(spec, defined, uses)
    found, why = [], []
    for eq in spec.equations:
        for node in fusion._cores(eq.rhs):
            try:
                core = walk.core(eq, node)
            except Refused as error:
                why.append(str(error))
                continue
            if core is not None:
                found.append(core)
    if not found:
        raise Refused(why[0] if why else "no softmax over keys times values (an attention core)")
    return tuple(found)


class _Walk:
    def __init__(self, spec: Spec, defined: dict, uses) -> None:
        self.spec, self.defined, self.uses = spec, defined, uses
        self.matcher = fusion._Matcher(defined, uses)

    def core(self, output: Equation, node: ir.Product) -> Core | None:
        if len(node.summed) != 1:
            return None
        for a, v in (node.factors, node.factors[::-1]):
            chain = self.matcher.chain(a)
            if chain is not None:
                return self.assemble(output, node, v, chain)
        return None

    def assemble(self, output, node, v, chain) -> Core | None:
        free = chain.scores.rhs.free
        key = {chain.scores.name(i): i for i in free}.get(chain.weights.rhs.over[0])
        rename = chain.rename()
        if key is None or node.summed != (rename[key],):
            return None
        inlined: list[Equation] = []
        body, parts = self.split(chain.scores.rhs, inlined)
        if not parts:
            raise Refused(f"{output.tensor.name}: its scores hold no product of queries and keys")
        if len({scale for scale, _ in parts}) != 1 or any(len(p.factors) != 2 for _, p in parts):
            raise Refused(f"{output.tensor.name}: the scores' products of queries and keys differ")
        qs, ks = [], []
        for _, product in parts:
            q, k = product.factors if key not in product.factors[0].free else product.factors[::-1]
            if key in q.free or key not in k.free:
                raise Refused(f"{output.tensor.name}: no query side in its scores' product")
            qs.append(q)
            ks.append(k)
        widths = tuple(p.summed for _, p in parts)
        scale = parts[0][0]
        match = self.matcher.assemble(
            (output, node), v, chain, rename, key, tuple(qs), tuple(ks), scale, (), widths
        )
        if match is None:
            raise Refused(f"{output.tensor.name}: its queries, keys and values are not one core")
        allowed = {*match.heads, *match.groups, match.query, match.key}
        reads: list[ir.Tensor] = []
        score, keep = self.masks(body)
        score_expr = self.sympy(score, reads, allowed, output)
        keep_expr = None
        if keep:
            keep_expr = to_nnf(sympy.And(*(self.sympy(k, reads, allowed, output) for k in keep)))
            if SCORE in keep_expr.free_symbols:
                raise Refused(f"{output.tensor.name}: its mask reads the scores")
        used = [eq for eq in inlined if self.uses[eq.tensor.name] == 1]
        return Core(match, score_expr, keep_expr, tuple(reads), tuple(used))

    # -- the score's body: the contraction as SCORE, derived elementwise tensors inlined

    def split(self, node: ir.Node, inlined: list) -> tuple[ir.Node, list]:
        """The node with its contraction of queries and keys replaced by SCORE, and that
        contraction's (scale, product) parts."""
        found = fusion.contractions(node)
        if found:
            return ir.Field(SCORE, (), node.span), found
        if isinstance(node, ir.Sum):
            terms, parts = [], []
            for term in node.terms:
                found = fusion.contractions(term)
                if found and not parts:
                    parts, term = found, ir.Field(SCORE, (), term.span)
                elif found:
                    parts += found
                    continue
                else:
                    term, inner = self.split(term, inlined)
                    if inner and parts:
                        raise Refused("the scores hold two products of queries and keys")
                    parts += inner
                terms.append(term)
            return (terms[0] if len(terms) == 1 else ir.Sum(tuple(terms), node.span)), parts
        if isinstance(node, ir.Ref):
            eq = self.defined.get(node.tensor.name)
            rename = fusion.renaming(node)
            plain = eq is not None and _elementwise(eq.rhs)  # inlined even where read again
            scores = (
                eq is not None and self.uses[node.tensor.name] == 1 and fusion.contractions(eq.rhs)
            )
            if rename is None or not (plain or scores):
                return node, []
            inlined.append(eq)
            return self.split(ir.renamed(eq.rhs, rename), inlined)
        if isinstance(node, ir.Apply | ir.Product):
            parts, children = [], []
            for child in ir.children(node):
                child, inner = self.split(child, inlined)
                if inner and parts:
                    raise Refused("the scores hold two products of queries and keys")
                parts += inner
                children.append(child)
            if isinstance(node, ir.Product):
                if node.summed and parts:
                    raise Refused("a sum over the scores' product")
                return ir.Product(tuple(children), node.summed, node.span), parts
            return ir.Apply(node.fn, tuple(children), node.span), parts
        return node, []

    def masks(self, body: ir.Node) -> tuple[ir.Node, list[ir.Node]]:
        """(the score's changes, the keep's parts): the additive terms that are 0/-inf masks,
        and fills `where(c, SCORE..., -inf)`, become keeps."""
        keep: list[ir.Node] = []
        terms = body.terms if isinstance(body, ir.Sum) else (body,)
        rest = []
        for term in terms:
            found = _kept(term)
            (keep if found is not None else rest).append(found if found is not None else term)
        if len(rest) == 1 and _fill(rest[0]) is not None:
            cond, value = _fill(rest[0])
            keep.append(cond)
            rest = [value]
        if not rest:
            rest = [ir.Field(SCORE, (), body.span)]
        score = rest[0] if len(rest) == 1 else ir.Sum(tuple(rest), body.span)
        return score, keep

    # -- IR -> sympy

    def sympy(self, node: ir.Node, reads: list, allowed: set, at: Equation) -> sympy.Basic:
        name = at.tensor.name
        if isinstance(node, ir.Field):
            if set(node.free) - allowed:
                raise Refused(f"{name}: its scores read an index the core does not run over")
            return node.expr
        if isinstance(node, ir.Ref):
            if set(node.free) - allowed:
                raise Refused(f"{name}: its scores read {node.tensor.name} over other indices")
            if node.tensor not in reads:
                reads.append(node.tensor)
            axes = [self.position(axis, reads, allowed, at) for axis in node.axes]
            return Read(sympy.Integer(reads.index(node.tensor)), *axes)
        if isinstance(node, ir.Sum):
            return sympy.Add(*(self.sympy(t, reads, allowed, at) for t in node.terms))
        if isinstance(node, ir.Product):
            if node.summed:
                raise Refused(f"{name}: a sum inside the scores' changes")
            return sympy.Mul(*(self.sympy(f, reads, allowed, at) for f in node.factors))
        if isinstance(node, ir.Apply):
            op = lookup(node.fn)
            if op.sympy is None or node.fn == "dropout":
                raise Refused(f"{name}: FlexAttention's score_mod cannot apply {node.fn}")
            return op.sympy(*(self.sympy(a, reads, allowed, at) for a in node.args))
        raise Refused(f"{name}: its scores hold a {type(node).__name__.lower()}")

    def position(self, axis, reads, allowed, at) -> sympy.Basic:
        """One axis's flat position: its indices (and literals, computed positions) in turn."""
        flat, layout = sympy.S.Zero, None
        for item in axis:
            if isinstance(item, Index):
                value, size = item.symbol, item.size
            elif isinstance(item, int):
                value, size = sympy.Integer(item), None
            else:
                value, size = self.sympy(item.value, reads, allowed, at), None
            if layout is not None and size is None:
                raise Refused(f"{at.tensor.name}: a fused axis read at computed positions")
            flat = flat * size + value if flat != 0 else value
            layout = size
        return flat


def _elementwise(node: ir.Node) -> bool:
    """Computed entry by entry from positions, sizes, scalars and tensors: no sum, no reduction."""
    if isinstance(node, ir.Reduce | ir.Concat):
        return False
    if isinstance(node, ir.Product) and node.summed:
        return False
    if isinstance(node, ir.Apply) and lookup(node.fn).sympy is None:
        return False
    return all(_elementwise(c) for c in ir.children(node))


def _kept(term: ir.Node) -> ir.Node | None:
    """Where a 0/-inf mask term keeps a key; None for any other term."""
    if isinstance(term, ir.Field):
        kept = fusion._keep(term.expr)
        return None if kept is None else ir.Field(kept, term.free, term.span)
    return predicates.keep_of(term) if isinstance(term, ir.Apply) else None


def _fill(node: ir.Node):
    """(cond, value) for `where(cond, value, -inf)`; None otherwise."""
    if not isinstance(node, ir.Apply) or node.fn != "where":
        return None
    cond, value, other = node.args
    if isinstance(other, ir.Field) and other.expr == -sympy.oo:
        return cond, value
    return None
