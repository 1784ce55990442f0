"""The order in which a product of three or more tensors is contracted pairwise. For few
factors every order is costed in the size symbols; an order that costs no more than another
at every size (sizes are whole numbers >= 1) rules that one out, and where more than one is
left the generated code picks among them by the call's sizes. Beyond that, opt_einsum's bounded
searches at planning sizes, so that any spec plans in well under a second."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import opt_einsum
import sympy

from ...ir import Index
from ..program.steps import Contract, Operand

# Sizes used to choose contraction orders where a spec leaves them symbolic.
PLANNING_SIZE = 64
# opt_einsum's optimisers by the most factors each may take: a registry, first fit wins.
OPTIMISERS = ((5, "optimal"), (8, "branch-2"), (math.inf, "greedy"))
# The most factors whose every order is costed symbolically (3 orders for 3, 18 for 4).
SYMBOLIC_FACTORS = 4

Path = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Order:
    """A pairwise path (positions in the shrinking list of operands, each result going last)
    and its multiply-add count in the size symbols, as views/cost.py counts contractions."""

    path: Path
    cost: sympy.Expr


def planning_size(index: Index) -> int:
    return int(index.size) if index.size.is_Integer else PLANNING_SIZE


def planning_count(dims: tuple[Index, ...]) -> int:
    return math.prod(planning_size(i) for i in dims)


def optimiser(factors: int) -> str:
    return next(name for most, name in OPTIMISERS if factors <= most)


def orders(inputs: list[tuple[Index, ...]], output: tuple[Index, ...]) -> tuple[Order, ...]:
    """The orders worth taking, cheapest at planning sizes first: one where it is cheapest at
    every size, else the ones no other beats everywhere."""
    if len(inputs) > SYMBOLIC_FACTORS:
        path = tuple(map(tuple, pairwise(inputs, output)))
        return (Order(path, cost(inputs, output, path)),)
    every = [Order(p, cost(inputs, output, p)) for p in _paths(len(inputs))]
    useful = [o for o in every if not _outer(inputs, output, o.path)] or every
    sizes = {s: PLANNING_SIZE for o in useful for s in o.cost.free_symbols}
    useful.sort(key=lambda o: o.cost.subs(sizes))
    return tuple(
        o
        for k, o in enumerate(useful)
        if not any(_cheaper(b.cost, o.cost, j < k) for j, b in enumerate(useful) if j != k)
    )


def cost(inputs, output, path: Path) -> sympy.Expr:
    """2 per multiply-add of each contraction that sums an index, 1 per multiply of one that
    does not."""
    total = sympy.S.Zero
    for chosen, dims, _ in _steps(inputs, output, path):
        space = sympy.Mul(*(i.size for i in dict.fromkeys(i for c in chosen for i in c)))
        summed = {i for c in chosen for i in c} - set(dims)
        total += 2 * space if summed else space
    return sympy.expand(total)


def choice(orders: tuple[Order, ...]) -> tuple[sympy.Basic, ...]:
    """For each order but the last, when it is taken: it costs no more than any later one."""
    return tuple(
        sympy.And(*(_at_most(o.cost, later.cost) for later in orders[k + 1 :]))
        for k, o in enumerate(orders[:-1])
    )


def result_dims(chosen, pending, output) -> tuple[Index, ...]:
    """What one contraction keeps: the indices a later operand or the output still needs."""
    if not pending:
        return tuple(output)
    rest = {i for dims in pending for i in dims} | set(output)
    return tuple(dict.fromkeys(i for dims in chosen for i in dims if i in rest))


def pairwise(inputs: list[tuple[Index, ...]], output: tuple[Index, ...]) -> list[tuple[int, ...]]:
    """Pairs of positions in the shrinking list of operands (the result of each contraction
    goes last), as opt_einsum.contract_path gives them."""
    every = dict.fromkeys(i for dims in (*inputs, output) for i in dims)
    letters = {index: opt_einsum.get_symbol(k) for k, index in enumerate(every)}
    equation = ",".join("".join(letters[i] for i in dims) for dims in inputs)
    equation += "->" + "".join(letters[i] for i in output)
    shapes = [tuple(planning_size(i) for i in dims) for dims in inputs]
    path, _ = opt_einsum.contract_path(
        equation, *shapes, shapes=True, optimize=optimiser(len(inputs))
    )
    return path


def _paths(n: int):
    if n == 1:
        yield ()
        return
    for pair in itertools.combinations(range(n), 2):
        for rest in _paths(n - 1):
            yield (pair, *rest)


def _steps(inputs, output, path: Path):
    pending = [tuple(dims) for dims in inputs]
    for pair in path:
        chosen = [pending[k] for k in pair]
        pending = [dims for k, dims in enumerate(pending) if k not in pair]
        dims = result_dims(chosen, pending, output)
        yield chosen, dims, pending
        pending.append(dims)


def _outer(inputs, output, path: Path) -> bool:
    """Some contraction of the path multiplies operands without summing any index."""
    return any(
        not ({i for c in chosen for i in c} - set(dims))
        for chosen, dims, _ in _steps(inputs, output, path)
    )


def _cheaper(a: sympy.Expr, b: sympy.Expr, earlier: bool) -> bool:
    """a costs no more than b at every size >= 1 (and less somewhere, or comes earlier)."""
    if a == b:
        return earlier
    shift = {s: s + 1 for s in (a - b).free_symbols}
    difference = sympy.Poly(sympy.expand((b - a).xreplace(shift)), *shift)
    return all(c >= 0 for c in difference.coeffs())


def _at_most(a: sympy.Expr, b: sympy.Expr) -> sympy.Basic:
    """a <= b, without the factors of b - a that are positive at every size."""
    coefficient, factors = sympy.factor(b - a).as_coeff_mul()
    rest = sympy.Mul(*(f for f in factors if not f.is_positive)) * sympy.sign(coefficient)
    terms = sympy.Add.make_args(sympy.expand(rest))
    above = sympy.Add(*(t for t in terms if t.could_extract_minus_sign() is False))
    below = -sympy.Add(*(t for t in terms if t.could_extract_minus_sign()))
    return sympy.Le(below, above)


def prescale(planner, args: list[Operand], scale: sympy.Basic) -> list[Operand]:
    """The scale goes onto the smallest factor, before the product: Q / sqrt(d_k) keeps
    float16 scores from overflowing where (Q K) / sqrt(d_k) would not."""
    k = min(range(len(args)), key=lambda j: planning_count(args[j].dims))
    arg = args[k]
    out = Operand(
        planner.var(arg.var.hint.removesuffix("_split") + "_scaled"), arg.dims, arg.batched
    )
    return [*args[:k], planner.add(Contract(out, (arg,), scale)), *args[k + 1 :]]
