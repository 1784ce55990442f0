"""The attention core as one value, whatever its phrasing: `O = normalise_<key>(score(q·k),
keep) · factors · V`, read off the canonical spec by following the output's product with the
values back through the weights to the scores, with every derived tensor they read written
out in place (a soft cap in one equation or two, a mask added as a tensor, inline or as a
fill, a bias table read at bucket ids, a sink through logsumexp). Two phrasings of one
computation give equal `Core`s (tests/test_core.py): the score is a sympy expression of the
contraction's value `qk` (the sum over features of q·k, unscaled), of positions (`query`,
`key`), of the heads (`head0`, ...), of sizes and scalars, and of the tensors read there,
each a symbol (a tensor read at the scores' own indices: `D[key]`) or a function of the
positions it is read at (`bias(β, head0)`); the mask is the keep predicate on the same
symbols, split off the score (`where(hide, -inf, x)`, `x + where(hide, -inf, 0)`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
from sympy.logic.boolalg import to_nnf

from ... import ir
from ...ir import Equation, Index, Spec
from ...ops import lookup
from .fusion import _cores, read_counts, renaming
from .sinks import sink

QK = sympy.Symbol("qk")  # the contraction's value: Σ over features of q·k, unscaled


@dataclass(frozen=True)
class Core:
    """One attention core: what a backend computes (lower/passes/rows.py and spans.py block
    it, fusion.AttentionMatch names the part F.scaled_dot_product_attention takes)."""

    output: str = field(compare=False)  # the tensor O = A V, as the spec names it
    query: Index
    key: Index
    heads: tuple[Index, ...]  # the scores' other indices, in the scores' order
    # (q part, k part), their scales taken out: qk is the sum of their contractions
    products: tuple[tuple[ir.Node, ir.Node], ...] = field(compare=False)
    score: sympy.Basic  # of QK, positions, heads, sizes, scalars and reads
    keep: sympy.Basic  # where a key is seen (sympy.true: every key)
    normaliser: str  # "softmax", "sink" (a softmax with one more logit, `sink`)
    sink: sympy.Basic | None  # the sink's logit
    factors: tuple[str, ...]  # after the normaliser: "dropout(p)"
    reads: tuple[str, ...]  # what else the spec reads of the core: "weights", "logsumexp"

    @property
    def masked(self) -> bool:
        return self.keep is not sympy.true


def find_cores(spec: Spec) -> tuple[Core, ...]:
    """Every attention core of the (canonical) spec, in the order of its outputs' equations."""
    defined = {eq.tensor.name: eq for eq in spec.equations}
    reader = _Reader(defined, read_counts(spec))
    found = (reader.core(eq, node) for eq in spec.equations for node in _cores(eq.rhs))
    return tuple(c for c in found if c is not None)


class _NoCore(Exception):
    """A node the core's expression cannot hold (a reduction inside the scores, a concat)."""


class _Reader:
    def __init__(self, defined: dict[str, Equation], uses) -> None:
        self.defined, self.uses = defined, uses

    def resolve(self, node: ir.Node) -> tuple[ir.Node, dict[Index, Index], Equation | None]:
        """A derived tensor read at plain indices: its right-hand side and the renaming of
        its indices to those written here; any other node as it is."""
        if isinstance(node, ir.Ref) and node.tensor.name in self.defined:
            rename = renaming(node)
            if rename is not None:
                return self.defined[node.tensor.name].rhs, rename, self.defined[node.tensor.name]
        return node, {}, None

    def core(self, output: Equation, node: ir.Product) -> Core | None:
        if len(node.summed) != 1:
            return None
        for weights, values in (node.factors, node.factors[::-1]):
            found = self.normaliser(weights, node.summed[0])
            if found is not None:
                try:
                    return self.assemble(output, values, *found)
                except _NoCore:
                    return None
        return None

    def normaliser(self, node: ir.Node, summed: Index):
        """(scores node, its renaming, key, normaliser, sink node, factors, read names) where
        `node` is the weights of a core summed over `summed`; else None."""
        factors, read = [], []
        rhs, rename, eq = self.resolve(node)
        if isinstance(rhs, ir.Apply) and rhs.fn == "dropout":
            factors.append(f"dropout({rhs.args[1].expr})")
            read += ["weights"] if eq is not None and self.uses[eq.tensor.name] > 1 else []
            inner, more, eq = self.resolve(rhs.args[0])
            rhs, rename = inner, {k: rename.get(v, v) for k, v in more.items()}
        if eq is not None and self.uses[eq.tensor.name] > 1:
            read.append("weights")
        found = sink(rhs, self.defined)
        if found is not None:
            key = rename.get(found.over, found.over)
            lse = found.lse
            if isinstance(lse, ir.Ref) and self.uses[lse.tensor.name] > 1:
                read.append("logsumexp")
            return found.scores, rename, key, "sink", found.logit, tuple(factors), tuple(read)
        if isinstance(rhs, ir.Reduce) and rhs.fn == "softmax" and len(rhs.over) == 1:
            key = rename.get(rhs.over[0], rhs.over[0])
            return rhs.body, rename, key, "softmax", None, tuple(factors), tuple(read)
        return None

    def assemble(self, output, values, scores, rename, key, kind, logit, factors, read):
        if key not in values.free:
            return None
        body, inner, _ = self.resolve(scores)
        rename = {k: rename.get(v, v) for k, v in inner.items()} if inner else rename
        free = [rename.get(i, i) for i in body.free]
        query = next((i for i in free if i != key and i.size == key.size), None)
        if query is None:
            return None
        heads = tuple(i for i in free if i not in (query, key))
        roles = {query: sympy.Symbol("query"), key: sympy.Symbol("key")}
        roles |= {h: sympy.Symbol(f"head{n}") for n, h in enumerate(heads)}
        writer = _Writer(self, roles)
        score = writer.expr(body, rename)
        score = _one_contraction(score, writer.contractions)
        keep, score = split_mask(score)
        sunk = writer.expr(logit, rename) if logit is not None else None
        return Core(
            output=output.tensor.name,
            query=query,
            key=key,
            heads=heads,
            products=tuple(writer.products),
            score=score,
            keep=keep,
            normaliser=kind,
            sink=sunk,
            factors=factors,
            reads=read,
        )


class _Writer:
    """An elementwise IR node as a sympy expression (derived tensors written out)."""

    def __init__(self, reader: _Reader, roles: dict[Index, sympy.Symbol]) -> None:
        self.reader, self.roles = reader, roles
        self.contractions: list[sympy.Symbol] = []
        self.products: list[tuple[ir.Node, ir.Node]] = []

    def expr(self, node: ir.Node, rename: dict[Index, Index]) -> sympy.Basic:
        method = getattr(self, f"node_{type(node).__name__}", None)
        if method is None:
            raise _NoCore(type(node).__name__)
        return method(node, rename)

    def symbol(self, index: Index, rename: dict[Index, Index]) -> sympy.Basic:
        index = rename.get(index, index)
        return self.roles.get(index, index.symbol)

    def node_Field(self, node: ir.Field, rename) -> sympy.Basic:
        return node.expr.xreplace({i.symbol: self.symbol(i, rename) for i in node.free})

    def node_Ref(self, node: ir.Ref, rename) -> sympy.Basic:
        rhs, inner, eq = self.reader.resolve(node)
        if eq is not None:  # a derived tensor: written out, its indices named as read here
            return self.expr(rhs, {k: rename.get(v, v) for k, v in inner.items()})
        written = [item for axis in node.axes for item in axis]
        if all(isinstance(i, Index) for i in written):
            axes = ",".join(str(self.symbol(i, rename)) for i in written)
            return sympy.Symbol(f"{node.tensor.name}[{axes}]")
        args = [self.position(item, rename) for item in written]
        return sympy.Function(node.tensor.name)(*args)

    def position(self, item, rename) -> sympy.Basic:
        if isinstance(item, Index):
            return self.symbol(item, rename)
        if isinstance(item, int):
            return sympy.Integer(item)
        return self.expr(item.value, rename)

    def node_Sum(self, node: ir.Sum, rename) -> sympy.Basic:
        return sympy.Add(*(self.expr(t, rename) for t in node.terms))

    def node_Product(self, node: ir.Product, rename) -> sympy.Basic:
        if not node.summed:
            return sympy.Mul(*(self.expr(f, rename) for f in node.factors))
        fields = [f for f in node.factors if isinstance(f, ir.Field) and not f.free]
        rest = [f for f in node.factors if f not in fields]
        if len(rest) != 2:
            raise _NoCore("a contraction of other than two tensors")
        (scale_q, q), (scale_k, k) = (self.scaled(f, rename) for f in rest)
        symbol = sympy.Symbol(f"qk{len(self.contractions)}")
        self.contractions.append(symbol)
        self.products.append((q, k))
        return sympy.Mul(symbol, scale_q, scale_k, *(f.expr for f in fields))

    def scaled(self, part: ir.Node, rename) -> tuple[sympy.Basic, ir.Node]:
        """A part of the contraction as (a number, the part): the scale of queries or keys
        scaled by a number before the product (`Qs = Q / sqrt(d_k)`) comes out of it."""
        scale = sympy.S.One
        while True:
            rhs, _, eq = self.reader.resolve(part)
            if eq is None or not isinstance(rhs, ir.Product) or rhs.summed:
                return scale, part
            numbers = [f for f in rhs.factors if isinstance(f, ir.Field) and not f.free]
            others = [f for f in rhs.factors if f not in numbers]
            if len(others) != 1 or not numbers:
                return scale, part
            scale *= sympy.Mul(*(f.expr for f in numbers))
            part = others[0]

    def node_Reduce(self, node: ir.Reduce, rename) -> sympy.Basic:
        """A sum over indices of its own (T5's thresholds of a bucket): unevaluated."""
        if node.fn != "sum" or any(rename.get(i, i) in self.roles for i in node.over):
            raise _NoCore(f"{node.fn} inside the scores")
        limits = [(i.symbol, 0, i.size - 1) for i in node.over]
        return sympy.Sum(self.expr(node.body, rename), *limits)

    def node_Apply(self, node: ir.Apply, rename) -> sympy.Basic:
        if node.fn == "pow":
            return sympy.Pow(*(self.expr(a, rename) for a in node.args))
        op = lookup(node.fn)
        if op.sympy is None:
            raise _NoCore(node.fn)
        return op.sympy(*(self.expr(a, rename) for a in node.args))


def _one_contraction(score: sympy.Basic, parts: list[sympy.Symbol]) -> sympy.Basic:
    """The score with its contractions as one value QK, where it reads only their sum (the
    halves of a rotation, Q0·K0 + Q1·K1); else with the first as QK."""
    if not parts:
        raise _NoCore("no contraction")
    first, *rest = parts
    summed = score.xreplace({first: QK - sympy.Add(*rest)})
    summed = summed if not summed.has(*rest) else sympy.expand(summed)
    return summed if not summed.has(*rest) else score.xreplace({first: QK})


def split_mask(score: sympy.Basic) -> tuple[sympy.Basic, sympy.Basic]:
    """(where a key is seen, the score where it is): `where(c, -inf, x)` hides where c,
    `where(c, x, -inf)` where not c, and a term `where(c, -inf, 0)` of a sum where c."""
    hidden, body = _hidden(score)
    return predicate(sympy.Not(sympy.Or(*hidden))), body


def predicate(keep: sympy.Basic) -> sympy.Basic:
    """A condition in one form: negations pushed to the comparisons, and each comparison as
    a difference against 0, `<` or `<=` (`τ - τ' >= w` and `τ' <= τ - w` alike)."""
    flipped = {sympy.Gt: sympy.Lt, sympy.Ge: sympy.Le}
    found = {}
    for rel in to_nnf(keep).atoms(sympy.core.relational.Relational):
        kind = flipped.get(type(rel), type(rel))
        a, b = (rel.rhs, rel.lhs) if type(rel) in flipped else (rel.lhs, rel.rhs)
        difference = sympy.expand(a - b)
        if kind in (sympy.Eq, sympy.Ne):
            difference = min(difference, -difference, key=sympy.default_sort_key)
        found[rel] = kind(difference, 0, evaluate=False)
    return to_nnf(keep).xreplace(found)


def _hidden(expr: sympy.Basic) -> tuple[list[sympy.Basic], sympy.Basic]:
    if (
        isinstance(expr, sympy.Piecewise)
        and len(expr.args) == 2
        and expr.args[1].cond is sympy.true
    ):
        (first, cond), (second, _) = expr.args
        if first == -sympy.oo:
            more, body = _hidden(second)
            return [cond, *more], body
        if second == -sympy.oo:
            more, body = _hidden(first)
            return [sympy.Not(cond), *more], body
    if isinstance(expr, sympy.Add):
        hidden, terms = [], []
        for term in expr.args:
            more, body = _hidden(term)
            hidden += more
            terms.append(body)
        return hidden, sympy.Add(*terms)
    return [], expr
