"""Spec -> Spec: one shape of each computation before the planner matches anything, so that
two phrasings of one computation meet the same matcher. `REWRITES` is the order; each
rewrite returns a spec whose outputs are the same values (tests/test_passes.py runs the
canonical spec of every shipped and random spec against the literal reading of the spec as
written). The spec a person wrote stays what LaTeX, counts of parameters and errors read;
only the planner reads the canonical one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .. import ir
from ..derive import printer
from ..ir import Equation, Index, Spec, Tensor
from ..notation.names import fresh
from .fusion import linear_form


@dataclass(frozen=True)
class Rewrite:
    """One rewrite of the canonical form: its name, its function and what it guarantees."""

    name: str
    run: Callable[[Spec], Spec]
    guarantees: str


def canonical(spec: Spec) -> Spec:
    """`canonical(check(text, "mha"))` -> the spec the planner reads: every rewrite in order."""
    for rewrite in REWRITES:
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


# -- walking


def _mapped(node: ir.Node, fn: Callable[[ir.Node], ir.Node]) -> ir.Node:
    """The node with `fn` applied to every node below it, children first."""
    if isinstance(node, ir.Product):
        node = replace(node, factors=tuple(_mapped(f, fn) for f in node.factors))
    elif isinstance(node, ir.Sum):
        node = replace(node, terms=tuple(_mapped(t, fn) for t in node.terms))
    elif isinstance(node, ir.Apply):
        node = replace(node, args=tuple(_mapped(a, fn) for a in node.args))
    elif isinstance(node, ir.Reduce):
        node = replace(node, body=_mapped(node.body, fn))
    elif isinstance(node, ir.Concat):
        node = replace(node, parts=tuple(_mapped(p, fn) for p in node.parts))
    return fn(node)


REWRITES = (
    Rewrite(
        "projections",
        projections,
        "a weight times one operand inside a larger product is an equation of its own",
    ),
)
