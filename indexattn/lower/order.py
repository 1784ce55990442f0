"""The order in which a product of three or more tensors is contracted pairwise: opt_einsum's
exhaustive search for few factors, bounded searches beyond, so that any spec plans in well
under a second (exhaustive search is exponential in the number of factors)."""

from __future__ import annotations

import math

import opt_einsum

from ..ir import Index

# Sizes used to choose contraction orders where a spec leaves them symbolic.
PLANNING_SIZE = 64
# opt_einsum's optimisers by the most factors each may take: a registry, first fit wins.
OPTIMISERS = ((5, "optimal"), (8, "branch-2"), (math.inf, "greedy"))


def planning_size(index: Index) -> int:
    return int(index.size) if index.size.is_Integer else PLANNING_SIZE


def planning_count(dims: tuple[Index, ...]) -> int:
    return math.prod(planning_size(i) for i in dims)


def optimiser(factors: int) -> str:
    return next(name for most, name in OPTIMISERS if factors <= most)


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
