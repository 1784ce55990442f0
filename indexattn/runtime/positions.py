"""Computed positions checked at call time: a gather out of range is a ShapeError naming the
tensor, the axis and the range of positions, never a silent wrap (negative positions) or a
raw IndexError. Positions built from sizes are checked once per shape, when built; positions
read from integer inputs, on every eager call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import ShapeError
from ..sizes import Tree, evaluate

if TYPE_CHECKING:
    from ..lower.program import Program
    from ..lower.steps import Var


@dataclass(frozen=True)
class Check:
    """Positions at `source` (a constant's place, or an argument's) must lie in [0, size)."""

    source: int
    size: Tree
    where: str


@dataclass(frozen=True)
class Positions:
    constants: tuple[Check, ...]
    arguments: tuple[Check, ...]

    def sizes(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The sizes the constants' checks compare with."""
        return tuple(evaluate(check.size, sizes) for check in self.constants)

    def check_constants(self, spec: str, built: tuple, sizes: dict[str, int]) -> None:
        for check in self.constants:
            _in_range(spec, check, built[check.source], sizes)

    def check_arguments(self, spec: str, tensors, sizes: dict[str, int]) -> None:
        for check in self.arguments:
            _in_range(spec, check, tensors[check.source], sizes)


def positions(plan: Program, held: tuple[Var, ...]) -> Positions:
    """The checks of every gather of a plan; `held`: the values the constants function
    returns, in order."""
    from ..ir.shapes import tree
    from ..lower.steps import Gather

    spec = plan.spec
    grids = list(held)
    arguments = [t.ascii for t in spec.arguments]
    constants, inputs = [], []
    for step in (s for s in plan.steps if isinstance(s, Gather)):
        var, size = step.positions.var, tree(step.axis.size, spec.size_names)
        if var in grids:
            constants.append(Check(grids.index(var), size, step.where))
        elif var.argument and not step.positions.select:
            inputs.append(Check(arguments.index(var.hint), size, step.where))
    return Positions(tuple(constants), tuple(inputs))


def _in_range(spec: str, check: Check, values: torch.Tensor, sizes: dict[str, int]) -> None:
    if values.numel() == 0:
        return
    size = evaluate(check.size, sizes)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= size:
        raise ShapeError(
            f"{spec}: {check.where}: positions {low} to {high} are out of range; this axis "
            f"has size {size}, so positions 0 to {size - 1}"
        )
