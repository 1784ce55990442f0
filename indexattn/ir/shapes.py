"""Sizes from shapes: which size each argument axis determines (a recipe fixed per spec), and
the shape rules of a spec as plain data (indexattn/sizes.py), checked at call time."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..sizes import Check, Lead, Quotient, Rank, Read, Rules, Tree
from .nodes import Apply, At, Field, Index, Ref, Spec, Tensor, children, refs


@dataclass(frozen=True)
class Step:
    """`size = (tensor.shape[axis] - offset) // scale`: axis counts from the end."""

    size: sympy.Symbol
    tensor: Tensor
    axis: int  # negative: batch axes come first
    scale: sympy.Expr  # in sizes already known
    offset: sympy.Expr = sympy.S.Zero


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]
    required: tuple[sympy.Symbol, ...]  # sizes no shape determines: the caller gives them

    def __str__(self) -> str:
        lines = [
            f"{s.size} = ({s.tensor.name}.shape[{s.axis}] - ({s.offset})) / ({s.scale})"
            for s in self.steps
        ]
        return "\n".join([*lines, f"given: {', '.join(map(str, self.required)) or '-'}"])


def recipe(spec: Spec) -> Recipe:
    """Solves sizes from argument axes in declaration order; what stays unknown is required."""
    known: set[sympy.Symbol] = set()
    steps: list[Step] = []
    required: list[sympy.Symbol] = []
    while len(known) < len(spec.sizes):
        step = _next_step(spec.arguments, known)
        if step is None:
            missing = next(s for s in spec.sizes if s not in known)
            required.append(missing)
            known.add(missing)
        else:
            steps.append(step)
            known.add(step.size)
    return Recipe(tuple(steps), tuple(required))


def _next_step(tensors: tuple[Tensor, ...], known: set[sympy.Symbol]) -> Step | None:
    """The first axis whose size is linear in one unknown size: scale · size + offset."""
    for tensor in tensors:
        for position, axis in enumerate(tensor.layout):
            size = sympy.expand(sympy.Mul(*(i.size for i in axis)))
            unknown = size.free_symbols - known
            if len(unknown) != 1 or not _polynomial(size):
                continue
            (symbol,) = unknown
            poly = sympy.Poly(size, symbol)
            if poly.degree() == 1:
                scale, offset = poly.coeff_monomial(symbol), poly.coeff_monomial(1)
                return Step(symbol, tensor, position - len(tensor.layout), scale, offset)
    return None


def _polynomial(size: sympy.Expr) -> bool:
    """Whether a size is read off an axis (N_c + N, (β λ) of N / ℓ · ℓ = N), not a quotient
    or a rounding, which the sizes it divides are read for and checked against."""
    return not size.has(sympy.floor, sympy.ceiling) and sympy.fraction(size)[1] == 1


def rules(spec: Spec, plan: Recipe) -> Rules:
    """The checks of `spec` as data, sizes read as `plan` says."""
    position = {t.name: k for k, t in enumerate(spec.arguments)}
    names = spec.size_names
    reads = tuple(
        Read(
            names[step.size],
            position[step.tensor.name],
            step.axis,
            tree(step.scale, names),
            tree(step.offset, names),
            _where(step.tensor, step.axis + len(step.tensor.layout)),
            _axis_text(spec, step.tensor, step.axis + len(step.tensor.layout)),
            str(step.scale),
        )
        for step in plan.steps
    )
    checks = tuple(
        Check(
            k,
            p - len(t.layout),
            tree(t.shape[p], names),
            _axis_text(spec, t, p),
            t.shape[p].is_Integer,
        )
        for k, t in enumerate(spec.arguments)
        for p in range(len(t.layout))
    )
    ranks = tuple(
        Rank(k, len(t.layout), t.batched, _rank_text(spec, t)) for k, t in enumerate(spec.arguments)
    )
    required = tuple(names[s] for s in plan.required)
    return Rules(spec.name, required, ranks, reads, checks, _quotients(spec), _leads(spec))


def _leads(spec: Spec) -> tuple[Lead, ...]:
    """The pairs of inputs whose layouts begin with the same index, the first declaring more
    axes and the second at least two (`Lead`: Q_<grτa> and K_<gσa>), each with the message
    that refuses them given at one rank, the first with no batch axis (a batch on both, or
    on one broadcast over the other's, is read as declared). Not a second of one
    axis (positions P_<τ>, ids D_<τ>): an unbatched causal M_<τσ> beside positions [batch, N]
    broadcasts, as it always has."""
    inputs = [(k, t) for k, t in enumerate(spec.arguments) if t.role == "input"]
    return tuple(
        Lead(k, j, len(x.layout), len(y.layout), _lead_text(spec, x, y))
        for k, x in inputs
        for j, y in inputs
        if x.layout[:1] == y.layout[:1] and len(x.layout) > len(y.layout) >= 2
    )


def _lead_text(spec: Spec, x: Tensor, y: Tensor) -> str:
    first = "".join(i.glyph for i in x.layout[0])
    size = x.shape[0]
    takes = ", ".join(map(str, x.shape))
    split = ""
    if set(x.layout[1]).isdisjoint(i for axis in y.layout for i in axis):  # heads (g r)
        split = (
            f" (from sdpa's [batch, heads, ...]: {x.ascii}.unflatten(1, ({size}, -1)), its"
            f" heads split as ({' '.join(i.glyph for i in x.layout[0] + x.layout[1])}))"
        )
    return (
        f"{spec.name}: {x!r} and {y!r} both begin with {first} ({size}), and {x.ascii} was given"
        f" no batch axis at the rank of {y.ascii}'s: {y.ascii}'s first axis would be read as a"
        f" batch and {x.ascii}'s as {size}. Give each its batch axes first, {x.ascii} as [*batch,"
        f" {takes}]{split} and {y.ascii} as [*batch, {', '.join(map(str, y.shape))}]; to"
        f" broadcast {x.ascii} over the batch on purpose, give it a leading axis of 1. Given: "
    )


def quotients(spec: Spec) -> dict[sympy.Expr, tuple[Index, ...]]:
    """The ranges `N / ℓ` the spec declares (not those it rounds, `ceil(N / ℓ)`), each with
    the indices that range over it: the sizes a call gives must divide exactly."""
    found: dict[sympy.Expr, tuple[Index, ...]] = {}
    for index in spec.indices:
        if sympy.fraction(sympy.together(index.size))[1] != 1:
            found[index.size] = (*found.get(index.size, ()), index)
    return found


def _quotients(spec: Spec) -> tuple[Quotient, ...]:
    out = []
    for size, indices in quotients(spec).items():
        over, under = sympy.fraction(sympy.together(size))
        glyphs = ", ".join(i.glyph for i in indices)
        out.append(
            Quotient(
                tree(over, spec.size_names),
                tree(under, spec.size_names),
                str(over),
                str(under),
                f"{spec.name}: index {glyphs} ranges over {over} / {under}, but",
                f"pass sizes that divide, or pad the last block and write "
                f"index {indices[0].glyph} : ceil({over} / {under}).",
            )
        )
    return tuple(out)


def solve(
    spec: Spec, plan: Recipe, shapes: dict[str, tuple[int, ...]], given: dict[str, int]
) -> dict[sympy.Symbol, int]:
    """Sizes by symbol from the shapes and the given sizes (both by ASCII name)."""
    found = rules(spec, plan).solve([shapes[t.ascii] for t in spec.arguments], given)
    return {s: found[a] for s, a in spec.size_names.items()}


def tree(expr: sympy.Expr, names: dict[sympy.Symbol, str]) -> Tree:
    """A size expression as plain data: integers, sizes, sums and products."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return names[expr]
    if isinstance(expr, sympy.floor | sympy.ceiling):
        over, under = sympy.fraction(sympy.together(expr.args[0]))
        kind = "//" if isinstance(expr, sympy.floor) else "ceil"
        return (kind, tree(over, names), tree(under, names))
    over, under = sympy.fraction(sympy.together(expr))
    if under != 1:  # N / ℓ: whole, as the call's sizes are checked to divide (Quotient)
        return ("//", tree(over, names), tree(under, names))
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return ("*", *[tree(expr.base, names)] * int(expr.exp))
    if expr.is_Mul or expr.is_Add:
        return ("*" if expr.is_Mul else "+", *(tree(a, names) for a in expr.args))
    raise TypeError(f"not a size expression: {expr}")


def _rank_text(spec: Spec, tensor: Tensor) -> str:
    what = "at least " if tensor.batched else ""
    symbolic = "(" + ", ".join(str(s) for s in tensor.shape) + ")"
    return (
        f"{spec.name}: {tensor!r} has {what}{len(tensor.layout)} axes {symbolic}, "
        "but the tensor given has shape "
    )


def _where(tensor: Tensor, position: int) -> str:
    glyphs = "".join(i.glyph for i in tensor.layout[position])
    return f"{tensor!r}, axis {position} ({glyphs})"


def _axis_text(spec: Spec, tensor: Tensor, position: int) -> str:
    where = _where(tensor, position)
    return f"{spec.name}: {where}: expected size {tensor.shape[position]}"


def relations(spec: Spec) -> tuple[sympy.Expr, ...]:
    """What the spec declares of its sizes, each an expression that must be at least 1: every
    index's range (`M - N` asks M > N), and every range past a slice the spec reads (`X_<5a>`
    asks N > 5, `W_<([h + 1]a)i>` asks J > h + 1)."""
    found = dict.fromkeys(sympy.expand(i.size) for i in spec.indices)
    for eq in spec.equations:
        for ref in refs(eq.rhs):
            for index, item in zip(ref.tensor.indices, ref.written):
                at = item if isinstance(item, int) else _fixed(item)
                if at is not None:
                    found[sympy.expand(index.size - at)] = None
        for ref in unguarded(eq.rhs):
            for index, item in zip(ref.tensor.indices, ref.written):
                last = _greatest(item)
                if last is not None:
                    found[sympy.expand(index.size - last)] = None
    return tuple(e for e in found if not e.is_number)


def unguarded(node) -> list:
    """The references outside every `where`, whose positions a condition may keep in range."""
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Apply) and node.fn == "where":
        return []
    return [r for c in children(node) for r in unguarded(c)]


def _greatest(item) -> sympy.Expr | None:
    """The greatest position a gather at a polynomial of indices with non-negative
    coefficients reads (`[ℓ β + r]`: ℓ (nb - 1) + ℓ - 1, so the axis asks N ≥ ℓ nb); None
    for any other."""
    if not (isinstance(item, At) and item.free and isinstance(item.value, Field)):
        return None
    expr, symbols = item.value.expr, [i.symbol for i in item.free]
    if not expr.is_polynomial(*symbols):
        return None
    terms = sympy.Poly(expr, *symbols).coeffs()
    if not all(sympy.sympify(c).is_nonnegative for c in terms):
        return None
    return expr.subs({i.symbol: i.size - 1 for i in item.free})


def _fixed(item) -> sympy.Expr | None:
    """The position a computed position with no index selects (`[h + 1]`), else None."""
    if isinstance(item, At) and not item.free and isinstance(item.value, Field):
        return item.value.expr
    return None


def honouring(
    spec: Spec, sizes: dict[sympy.Symbol, int], fixed: set[str] = frozenset()
) -> dict[sympy.Symbol, int]:
    """`sizes` with the sizes not named in `fixed` (ASCII names) raised until every relation
    holds; a ValueError names the relation the fixed ones break."""
    sizes = dict(sizes)
    for relation in relations(spec):
        growing = [
            s
            for s in sorted(relation.free_symbols, key=str)
            if spec.size_ascii(s) not in fixed and sympy.diff(relation, s).is_positive is not False
        ]
        for _ in range(64):
            short = 1 - relation.subs(sizes)
            if short <= 0 or not growing:
                break
            for symbol in growing:
                sizes[symbol] += max(1, int(sympy.ceiling(short)))
        if 1 - relation.subs(sizes) > 0:
            named = (s for s in spec.sizes if spec.size_ascii(s) in fixed)
            given = ", ".join(f"{s} = {sizes[s]}" for s in named)
            raise ValueError(
                f"the sizes {given} leave {relation} < 1: it is the range of an index, or of an"
                " axis past the last position a read takes; give other sizes with --size"
            )
    for quotient in quotients(spec):
        _divisible(spec, quotient, sizes, fixed)
    return sizes


def _divisible(spec: Spec, quotient: sympy.Expr, sizes: dict, fixed: set[str]) -> None:
    """The numerator of a range `N / ℓ` raised to a multiple of its denominator, unless it is
    fixed; a ValueError names the range the fixed sizes leave fractional."""
    over, under = sympy.fraction(sympy.together(quotient))
    value, step = int(over.subs(sizes)), int(under.subs(sizes))
    if value % step == 0:
        return
    if over.is_Symbol and spec.size_ascii(over) not in fixed:
        sizes[over] = value + step - value % step
        return
    given = ", ".join(f"{s} = {sizes[s]}" for s in sorted(quotient.free_symbols, key=str))
    raise ValueError(
        f"the sizes {given} leave {over} / {under} fractional: it is the range of an index"
    )
