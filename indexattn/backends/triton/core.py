"""The attention core a Triton kernel computes, read off a spec's equations: the operands, the
score as a sympy expression of one tile's symbols, where the weights are zero, the normaliser
and its sink. `describe` is the one narrow interface the kernel printer reads; anything it
cannot state is refused by name (`Refused`), with the reason."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ... import ir, ops
from ...errors import SpecError
from ...ir import Equation, Index, Spec
from ...lower.planner import sinks
from ...lower.planner.fusion import renaming

# The tile's own symbols: the product Q·K of one query and one key, their positions.
QK, ROW, COL = sympy.symbols("qk row col", real=True)


class Refused(SpecError):
    """A spec whose attention core the triton backend does not compute, and why."""


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads whole: its name and its indices, as the equation writes them
    (heads first, then the position, then the width)."""

    tensor: ir.Tensor
    indices: tuple[Index, ...]


@dataclass(frozen=True)
class Load:
    """A tensor the score or the mask reads element by element, at the tile's positions and
    heads: `symbol` stands for the value read; `at` is the tile symbol each of the tensor's
    indices is read at (ROW, COL or a query head's symbol)."""

    symbol: sympy.Symbol
    tensor: ir.Tensor
    at: tuple[sympy.Symbol, ...]


@dataclass(frozen=True)
class Core:
    """softmax or sigmoid over the key of `score`, zero where `hidden`, times the values.

    `score` and `hidden` read QK, ROW, COL, the query heads' symbols (`heads`), the loads'
    symbols, the spec's sizes and scalars. `sink`: a logit per query head (a load read at
    heads only) that joins the softmax's denominator. `key_heads`: the heads K and V share,
    a leading part of `heads` (the rest are the query heads of one group)."""

    spec: Spec
    normaliser: str  # "softmax" or "sigmoid"
    q: Operand
    k: Operand
    v: Operand
    output: Equation
    heads: tuple[Index, ...]
    key_heads: tuple[Index, ...]
    query: Index
    key: Index
    score: sympy.Expr
    hidden: sympy.Basic
    sink: Load | None
    loads: tuple[Load, ...]
    dropout: sympy.Basic | None  # the dropout probability, refused at a call where nonzero
    covered: tuple[str, ...]  # the tensors the kernel computes in place of their equations

    @property
    def group(self) -> tuple[Index, ...]:
        """The query heads within one group: those K and V do not carry."""
        return self.heads[len(self.key_heads) :]

    @property
    def symbols(self) -> frozenset:
        """The symbols that vary over a tile (everything else is fixed per call)."""
        return frozenset(
            {QK, ROW, COL, *(i.symbol for i in self.heads), *(x.symbol for x in self.loads)}
        )


def describe(spec: Spec) -> Core:
    """The spec's one attention core, or Refused saying why not."""
    defined = {eq.tensor.name: eq for eq in spec.equations}
    found = [eq for eq in spec.equations if _weighs(eq, defined)]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise _refuse(
            spec.equations[-1],
            f"{what} attention cores: the triton kernel takes one, softmax, softmax with a sink "
            "or sigmoid weights times the values (differential attention's difference of two "
            "softmaxes and linear attention are not printed)",
        )
    return _Reader(spec, found[0]).core()


def _weighs(eq: Equation, defined: dict[str, Equation]) -> bool:
    """The equation sums weights (a softmax, sigmoid or softmax with a sink over the index
    it sums) times one more factor."""
    rhs = eq.rhs
    if not isinstance(rhs, ir.Product) or len(rhs.summed) != 1 or len(rhs.factors) != 2:
        return False
    return any(_normalised(f, defined) for f in rhs.factors)


def _normalised(node: ir.Node, defined: dict[str, Equation]) -> bool:
    while isinstance(node, ir.Ref) and node.tensor.name in defined:
        node = defined[node.tensor.name].rhs
    if isinstance(node, ir.Apply) and node.fn in ("dropout", "where"):
        return _normalised(node.args[0 if node.fn == "dropout" else 2], defined)
    if isinstance(node, ir.Apply):
        return node.fn == "sigmoid"
    if isinstance(node, ir.Product):
        return sinks.sink(node, defined) is not None
    return isinstance(node, ir.Reduce) and node.fn == "softmax"


def _refuse(eq: Equation, why: str) -> Refused:
    return Refused(f"the triton backend: {why}\n  in: {eq.text}")


class _Reader:
    """Reads back from `O = A V` through the weights and the scores, inlining each derived
    tensor it meets; `env` maps each index of the equation being read to its tile symbol."""

    def __init__(self, spec: Spec, output: Equation) -> None:
        self.spec, self.output = spec, output
        self.defined = {eq.tensor.name: eq for eq in spec.equations}
        self.loads: list[Load] = []
        self.covered: list[str] = []
        self.hidden: sympy.Basic = sympy.false
        self.dropout = None

    def refuse(self, why: str) -> Refused:
        return _refuse(self.output, why)

    def core(self) -> Core:
        rhs = self.output.rhs
        key = rhs.summed[0]
        weights, values = self._split(rhs.factors, key)
        v = self._operand(values)
        heads = self.output.indices[:-2]  # then the query, then the values' width
        env = {i: i.symbol for i in heads}
        env.update({self.output.indices[-2]: ROW, key: COL})
        normaliser, scores, sink = self._weights(weights, env)
        q, k, qk_env = self._scores_product(scores)
        score = self._score(scores)
        symbols = [i.symbol for i in heads]
        if [qk_env.get(i) for i in q.indices[:-1]] != [*symbols, ROW]:
            raise self.refuse("the queries are not read as Q_<(heads) query width>")
        key_heads = heads[: len(k.indices) - 2]
        if [qk_env.get(i) for i in k.indices[:-1]] != [*symbols[: len(key_heads)], COL]:
            raise self.refuse("the keys are not read as K_<(leading heads) key width>")
        if v.indices[:-1] != (*key_heads, key):
            raise self.refuse("the values are not read as V_<(the keys' heads) key width>")
        free = score.free_symbols | self.hidden.free_symbols
        allowed = {QK, ROW, COL, *symbols, *(x.symbol for x in self.loads)}
        allowed |= set(self.spec.sizes) | {s.symbol for s in self.spec.scalars}
        if not free <= allowed:
            raise self.refuse(f"the score reads {sorted(map(str, free - allowed))}")
        return Core(
            self.spec,
            normaliser,
            q,
            k,
            v,
            self.output,
            heads,
            key_heads,
            q.indices[-2],
            key,
            score,
            self.hidden,
            sink,
            tuple(self.loads),
            self.dropout,
            tuple(dict.fromkeys(self.covered)),
        )

    def _split(self, factors, key: Index):
        """(weights, values): the values are the factor that is a plain read of a tensor with
        the key and one feature index of its own."""
        for weights, values in (factors, factors[::-1]):
            if (
                isinstance(values, ir.Ref)
                and key in values.free
                and values.tensor.role != "derived"
            ) or (isinstance(values, ir.Ref) and not self._inlined(values, {key: COL})):
                return weights, values
        raise self.refuse("no values tensor V read plainly in the output's product")

    def _inlined(self, ref: ir.Ref, env: dict) -> bool:
        """A derived tensor the kernel computes in place, one value per tile element or per
        call (masks, scores, weights, slopes), not an operand it reads along one position
        only (queries, keys, values: projections, inputs)."""
        if ref.tensor.name not in self.defined:
            return False
        at = {env.get(i) for i in ref.free} & {ROW, COL}
        return len(at) != 1

    def _operand(self, ref: ir.Node) -> Operand:
        rename = renaming(ref) if isinstance(ref, ir.Ref) else None
        if rename is None:
            raise self.refuse("an operand read at computed positions")
        written = tuple(rename[i] for i in ref.tensor.indices)
        if len(set(written)) != len(written):
            raise self.refuse("an operand read with one index twice")
        return Operand(ref.tensor, written)

    # -- the weights: softmax, softmax with a sink, sigmoid; dropout, where(hidden, 0, ...)

    def _weights(self, node: ir.Node, env: dict):
        node, env = self._follow(node, env)
        if isinstance(node, ir.Apply) and node.fn == "dropout":
            self.dropout = self._sympy(node.args[1], env)
            return self._weights(node.args[0], env)
        if isinstance(node, ir.Apply) and node.fn == "where":
            value = self._sympy(node.args[1], env)
            if value != 0:
                raise self.refuse("where(...) on the weights with a value other than 0")
            self.hidden = sympy.Or(self.hidden, self._condition(node.args[0], env))
            return self._weights(node.args[2], env)
        if isinstance(node, ir.Reduce) and node.fn == "softmax" and node.over == (COL_INDEX(env),):
            return "softmax", (node.body, env), None
        found = sinks.sink(node, self.defined) if isinstance(node, ir.Product) else None
        if found is not None and found.over == COL_INDEX(env):
            if isinstance(found.lse, ir.Ref):
                self.covered.append(found.lse.tensor.name)
            return "softmax", (found.scores, env), self._sink(found.logit, env)
        if isinstance(node, ir.Apply) and node.fn == "sigmoid":
            return "sigmoid", (node.args[0], env), None
        raise self.refuse(
            "the weights are not softmax, softmax with a sink or sigmoid over the key "
            "(stick-breaking, top-k and other normalisers are not printed yet)"
        )

    def _sink(self, node: ir.Node, env: dict) -> Load:
        value = self._sympy(node, env)
        load = next((x for x in self.loads if x.symbol == value), None)
        if load is None or set(load.at) & {ROW, COL}:
            raise self.refuse("a sink that is not one learned logit per query head")
        self.loads.remove(load)
        return load

    def _follow(self, node: ir.Node, env: dict):
        """A read of a derived tensor (not an operand): its right-hand side, with `env` for
        its own indices."""
        while isinstance(node, ir.Ref) and self._inlined(node, env):
            rename = renaming(node)
            if rename is None:
                raise self.refuse(f"{node.tensor.name} read at computed positions")
            eq = self.defined[node.tensor.name]
            self.covered.append(eq.tensor.name)
            env = {i: env.get(rename[i], rename[i].symbol) for i in eq.tensor.indices}
            node = eq.rhs
        return node, env

    # -- the scores

    def _scores_product(self, scores):
        """The product Q·K inside the scores: the operands, and which tile symbol each of
        their indices is."""
        node, env = scores
        found = [(p, e) for p, e in self._walk(node, env) if _is_qk(p, e)]
        if len(found) != 1:
            raise self.refuse("the scores hold no single product Q K summed over a width")
        product, env = found[0]
        refs = [f for f in product.factors if isinstance(f, ir.Ref)]
        q, k = (self._operand(r) for r in refs)
        if ROW not in [env.get(i) for i in q.indices]:
            q, k = k, q
        self.qk = product
        return q, k, env

    def _walk(self, node: ir.Node, env: dict):
        node, env = self._follow(node, env)
        yield node, env
        for child in _children(node):
            yield from self._walk(child, env)

    def _score(self, scores) -> sympy.Expr:
        node, env = scores
        total = sympy.S.Zero
        for term in sympy.Add.make_args(self._sympy(node, env)):
            mask = _mask(term)
            if mask is None:
                if term.has(sympy.oo, -sympy.oo):
                    raise self.refuse("-inf in the scores other than an additive mask")
                total += term
            else:
                self.hidden = sympy.Or(self.hidden, mask)
        return total

    def _condition(self, node: ir.Node, env: dict) -> sympy.Basic:
        value = self._sympy(node, env)
        if not isinstance(value, sympy.logic.boolalg.Boolean):
            raise self.refuse("a where(...) whose condition is not a condition")
        return value

    def _sympy(self, node: ir.Node, env: dict) -> sympy.Basic:
        """The node as a sympy expression of the tile's symbols."""
        node, env = self._follow(node, env)
        if node is getattr(self, "qk", None):
            rest = [f for f in node.factors if not isinstance(f, ir.Ref)]
            return QK * sympy.Mul(*(self._sympy(f, env) for f in rest))
        if isinstance(node, ir.Field):
            return node.expr.subs({i.symbol: env[i] for i in node.free}, simultaneous=True)
        if isinstance(node, ir.Ref):
            return self._load(node, env)
        if isinstance(node, ir.Product) and not node.summed:
            return sympy.Mul(*(self._sympy(f, env) for f in node.factors))
        if isinstance(node, ir.Sum):
            return sympy.Add(*(self._sympy(t, env) for t in node.terms))
        if isinstance(node, ir.Apply):
            return _apply(node.fn, [self._sympy(a, env) for a in node.args], self)
        raise self.refuse(f"the scores read {type(node).__name__.lower()} {node}"[:200])

    def _load(self, ref: ir.Ref, env: dict) -> sympy.Symbol:
        rename = renaming(ref)
        tile = {ROW, COL} | {i.symbol for i in self.output.indices}
        if rename is None or any(env.get(rename[i]) not in tile for i in ref.tensor.indices):
            raise self.refuse(
                f"{ref.tensor.name} is read at computed positions (T5 buckets, tables): "
                "not printed yet"
            )
        at = tuple(env[rename[i]] for i in ref.tensor.indices)
        for load in self.loads:
            if load.tensor == ref.tensor and load.at == at:
                return load.symbol
        symbol = sympy.Symbol(f"load{len(self.loads)}", real=True)
        self.loads.append(Load(symbol, ref.tensor, at))
        return symbol


def COL_INDEX(env: dict) -> Index:
    return next(i for i, s in env.items() if s == COL)


def _is_qk(node: ir.Node, env: dict) -> bool:
    """A product of two reads summed over one index, one read at the query, one at the key."""
    if not isinstance(node, ir.Product) or len(node.summed) != 1:
        return False
    refs = [f for f in node.factors if isinstance(f, ir.Ref)]
    at = [{env.get(i) for i in r.free} for r in refs]
    return len(refs) == 2 and {ROW, COL} <= at[0] | at[1] and not (ROW in at[0] and COL in at[0])


def _children(node: ir.Node):
    if isinstance(node, ir.Product):
        return node.factors
    if isinstance(node, ir.Sum):
        return node.terms
    if isinstance(node, ir.Apply):
        return node.args
    if isinstance(node, ir.Reduce):
        return (node.body,)
    return ()


_SYMPY_ONLY = {
    "-": lambda a, b: a - b,
    "/": lambda a, b: a / b,
    "neg": lambda a: -a,
    "^": sympy.Pow,
    "pow": sympy.Pow,
    "where": lambda c, a, b: sympy.Piecewise((a, c), (b, True)),
}


def _apply(fn: str, args: list, reader: _Reader) -> sympy.Basic:
    if fn in _SYMPY_ONLY:
        return _SYMPY_ONLY[fn](*args)
    op = ops.FUNCTIONS.get(fn) or ops.OPERATORS.get(fn)
    if op is None or op.sympy is None:
        raise reader.refuse(f"{fn}(...) in the scores: no kernel form")
    return op.sympy(*args)


def _mask(term: sympy.Basic) -> sympy.Basic | None:
    """The condition under which an additive term is -inf, where it is -inf there and 0
    elsewhere (`where(c, -inf, 0)` or `where(c, 0, -inf)`), else None."""
    if not isinstance(term, sympy.Piecewise) or len(term.args) != 2 or term.args[1][1] != True:  # noqa: E712
        return None
    (first, cond), (other, _) = term.args
    if (first, other) == (-sympy.oo, 0):
        return cond
    if (first, other) == (0, -sympy.oo):
        return sympy.Not(cond)
    return None
