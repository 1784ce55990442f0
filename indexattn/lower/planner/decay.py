"""Causal decays multiplying scores that are read only through values (RetNet's retention):
`R_<ττ'> = Q_<τa> K_<τ'a> D_<ττ'>` with D = γ^(τ - τ') at or below the diagonal and 0
above it, read only as `R_<ττ'> V_<τ'b>`, is computed by chunks of τ (lower/planner/prefix.py): no
N×N tensor, and no power of γ with a negative exponent, so nothing overflows that the
literal reading keeps. The decay may be written `where(τ' > τ, 0, exp((τ - τ') λ))`, a
factor `where(τ' > τ, 0, 1)` times the exponential, or a power `γ^(τ - τ')`, inline or in
equations of their own that nothing else reads."""

from __future__ import annotations

import sympy

from ... import ir
from ...ir import Index, Spec
from .prefix import Chunked, numerator, readers


def find(spec: Spec) -> dict[str, Chunked]:
    """The decayed scores to compute by chunks, by their tensors' names."""
    outputs = {t.name for t in spec.outputs}
    read = readers(spec)
    defined = {eq.tensor.name: eq for eq in spec.equations}
    # tensors read once, no output, in the call's dtype: the chunks may take them
    private = {
        name: eq
        for name, eq in defined.items()
        if name not in outputs and len(read.get(name, [])) == 1 and not eq.tensor.precision
    }
    found = {}
    for name, eq in private.items():
        match = _match(eq, *read[name][0], private)
        if match is not None:
            found[name] = match
    return found


def _match(eq: ir.Equation, parent: ir.Node, ref: ir.Ref, private: dict) -> Chunked | None:
    """The decayed scores, when `eq` is `Q K D` (numbers aside) summed over the width of Q
    and K, and `parent` sums it with values over the keys."""
    rhs, reader = eq.rhs, numerator(parent)
    if not isinstance(rhs, ir.Product) or len(rhs.summed) != 1 or reader is None:
        return None
    if ref.written != eq.indices or len(reader.summed) != 1:
        return None
    (inner,), (key,) = rhs.summed, reader.summed
    numbers = [f for f in rhs.factors if isinstance(f, ir.Field) and not f.free]
    q = [f for f in rhs.factors if inner in f.free and key not in f.free]
    k = [f for f in rhs.factors if inner in f.free and key in f.free]
    rest = [f for f in rhs.factors if inner not in f.free and not any(f is n for n in numbers)]
    if len(q) != 1 or len(k) != 1 or not rest:
        return None
    (q,), (k,) = q, k
    g = next(factor for factor in reader.factors if factor is not ref)
    overs, widths = set(q.free) - set(k.free) - {inner}, set(g.free) - set(eq.indices)
    if len(overs) != 1 or len(widths) != 1:
        return None
    (over,), (width,) = overs, widths
    common = set(eq.indices) - {over, key}
    shapes = [(q, over, inner), (k, key, inner), (g, key, width)]
    if not all(set(x.free) == common | {a, b} for x, a, b in shapes):
        return None
    decay = _decay(rest, over, key, private)
    if decay is None or not set(decay[1].free) <= common:
        return None
    hidden, rate, power = decay
    h = ir.Product((q, *numbers), (), rhs.span) if numbers else q
    return Chunked((*hidden, eq), h, k, g, over, inner, width, rate, power)


def _decay(factors: list[ir.Node], over: Index, key: Index, private: dict):
    """The equations the decay reads that only it reads, its rate and whether it is a power,
    when the factors are a causal 0-mask times one decay; else None."""
    hidden, values, masked = [], [], False
    pending = list(factors)
    while pending:
        node = pending.pop(0)
        opened = _opened(node, over, key, private)
        if opened is not None:
            equations, inside, mask = opened
            hidden += equations
            pending += inside
            masked |= mask
        else:
            values.append(node)
    if not masked or len(values) > 1:
        return None
    span = factors[0].span
    found = _rate(values[0], over, key) if values else (ir.Field(sympy.Integer(0), (), span), False)
    return None if found is None else (tuple(dict.fromkeys(hidden)), *found)


def _opened(node: ir.Node, over: Index, key: Index, private: dict):
    """What a factor of the decay is made of: (equations it reads, its factors, whether it
    hides the keys after the query), or None for a factor that is one value."""
    if isinstance(node, ir.Ref) and node.tensor.name in private:
        eq = private[node.tensor.name]
        if node.written == eq.indices and eq.tensor.role == "derived":
            return [eq], [eq.rhs], False
    if isinstance(node, ir.Product) and not node.summed:
        return [], list(node.factors), False
    if isinstance(node, ir.Apply) and node.fn == "where":
        cond, yes, no = node.args
        if isinstance(cond, ir.Field) and _zero(yes) and _after(cond.expr, over, key):
            return [], [no], True
        if isinstance(cond, ir.Field) and _zero(no) and _after(~cond.expr, over, key):
            return [], [yes], True
    if isinstance(node, ir.Field) and isinstance(node.expr, sympy.Piecewise):
        (zero, when), (value, otherwise) = node.expr.args[0], node.expr.args[-1]
        if len(node.expr.args) == 2 and zero == 0 and otherwise == sympy.true:
            free = tuple(i for i in node.free if i.symbol in value.free_symbols)
            return [], [ir.Field(value, free, node.span)], _after(when, over, key)
    if isinstance(node, ir.Field) and node.expr == 1:
        return [], [], False
    return None


def _zero(node: ir.Node) -> bool:
    return isinstance(node, ir.Field) and node.expr == 0


def _after(cond: sympy.Basic, over: Index, key: Index) -> bool:
    """Whether a condition on whole numbers holds exactly where the key is after the query
    (`τ' > τ`, `τ' >= τ + 1`, `τ < τ'`, ...)."""
    if not isinstance(cond, sympy.core.relational._Inequality):
        return False
    strict = isinstance(cond, sympy.StrictGreaterThan | sympy.StrictLessThan)
    gap = cond.gts - cond.lts - (1 if strict else 0)  # the condition: gap >= 0
    return sympy.expand(gap - (key.symbol - over.symbol - 1)) == 0


def _rate(node: ir.Node, over: Index, key: Index) -> tuple[ir.Node, bool] | None:
    """A decay's rate per step of τ - τ' and whether it is a power: `exp((τ - τ') λ)` gives
    λ, `γ^(τ - τ')` gives γ (not its log: γ may be 0 or negative); None for other values."""
    positions = {over, key}
    if isinstance(node, ir.Field):
        return _field_rate(node, over, key)
    if isinstance(node, ir.Apply) and node.fn == "pow":
        base, exponent = node.args
        linear = isinstance(exponent, ir.Field) and _per_step(exponent, over, key) == 1
        return (base, True) if linear and not positions & set(base.free) else None
    if not (isinstance(node, ir.Apply) and node.fn == "exp"):
        return None
    (arg,) = node.args
    factors = arg.factors if isinstance(arg, ir.Product) and not arg.summed else (arg,)
    gaps = [f for f in factors if positions & set(f.free)]
    if len(gaps) != 1 or not isinstance(gaps[0], ir.Field):
        return None
    per_step = _per_step(gaps[0], over, key)
    if per_step is None:
        return None
    rest = [f for f in factors if f is not gaps[0]]
    if per_step != 1 or not rest:
        rest.append(ir.Field(per_step, (), gaps[0].span))
    return (rest[0] if len(rest) == 1 else ir.Product(tuple(rest), (), arg.span)), False


def _field_rate(node: ir.Field, over: Index, key: Index) -> tuple[ir.Node, bool] | None:
    """The rate of a decay of numbers, sizes and scalars alone: `exp((τ' - τ) / 10)`."""
    expr, span = node.expr, node.span
    if isinstance(expr, sympy.exp):
        per_step = _per_step(ir.Field(expr.args[0], node.free, span), over, key)
        return None if per_step is None else (ir.Field(per_step, (), span), False)
    if isinstance(expr, sympy.Pow) and not expr.base.free_symbols & {over.symbol, key.symbol}:
        linear = _per_step(ir.Field(expr.exp, node.free, span), over, key) == 1
        return (ir.Field(expr.base, (), span), True) if linear else None
    return None


def _per_step(field: ir.Field, over: Index, key: Index) -> sympy.Basic | None:
    """c where the field is c (τ - τ') with c free of the positions, else None."""
    c = sympy.cancel(field.expr / (over.symbol - key.symbol))
    return None if c.free_symbols & {over.symbol, key.symbol} else c
