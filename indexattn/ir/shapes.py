"""Sizes from shapes: which size each argument axis determines (a recipe fixed per spec), and
checking real shapes against it with ShapeError."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..errors import ShapeError
from .nodes import Spec, Tensor


@dataclass(frozen=True)
class Step:
    """`size = tensor.shape[axis] // (product of divisors)`: axis counts from the end."""

    size: sympy.Symbol
    tensor: Tensor
    axis: int  # negative: batch axes come first
    divisors: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]
    required: tuple[sympy.Symbol, ...]  # sizes no shape determines: the caller gives them

    def __str__(self) -> str:
        lines = [
            f"{s.size} = {s.tensor.name}.shape[{s.axis}]" + "".join(f" / {d}" for d in s.divisors)
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
    for tensor in tensors:
        for position, axis in enumerate(tensor.layout):
            unknown = [i.size for i in axis if i.size.is_Symbol and i.size not in known]
            if len(set(unknown)) == 1 and len(unknown) == 1:
                divisors = tuple(i.size for i in axis if i.size is not unknown[0])
                return Step(unknown[0], tensor, position - len(tensor.layout), divisors)
    return None


def solve(
    spec: Spec, plan: Recipe, shapes: dict[str, tuple[int, ...]], given: dict[str, int]
) -> dict[sympy.Symbol, int]:
    """Sizes from the shapes of the arguments and the given sizes (both by ASCII name)."""
    given = {name: whole(spec.name, name, value) for name, value in given.items()}
    values: dict[sympy.Symbol, int] = {}
    for symbol in plan.required:
        if spec.size_ascii(symbol) not in given:
            raise ShapeError(
                f"{spec.name}: the size {symbol} cannot be read from the shapes; "
                f"pass it: {spec.size_ascii(symbol)}=..."
            )
        values[symbol] = given[spec.size_ascii(symbol)]
    for tensor in spec.arguments:
        _check_rank(spec, tensor, shapes[tensor.ascii])
    for step in plan.steps:
        actual = shapes[step.tensor.ascii][step.axis]
        divisor = int(sympy.Mul(*step.divisors).subs(values))
        if actual % divisor or actual == 0:
            raise ShapeError(_axis_message(spec, step.tensor, step.axis, actual, values))
        values[step.size] = actual // divisor
    for symbol in spec.sizes:
        value = given.get(spec.size_ascii(symbol))
        if value is not None and value != values[symbol]:
            raise ShapeError(
                f"{spec.name}: {symbol} was given as {value}, but the shapes say {values[symbol]}"
            )
    for tensor in spec.arguments:
        _check_axes(spec, tensor, shapes[tensor.ascii], values)
    return values


def whole(spec: str, name: str, value) -> int:
    """A size as given by a caller: a positive whole number, never silently truncated."""
    if isinstance(value, bool) or not float(value).is_integer() or int(value) <= 0:
        raise ShapeError(f"{spec}: the size {name} must be a positive whole number, got {value!r}")
    return int(value)


def _check_rank(spec: Spec, tensor: Tensor, shape: tuple[int, ...]) -> None:
    rank = len(tensor.layout)
    if len(shape) < rank or (len(shape) != rank and not tensor.batched):
        what = "at least " if tensor.batched else ""
        raise ShapeError(
            f"{spec.name}: {tensor!r} has {what}{rank} axes "
            f"{_symbolic(tensor)}, but the tensor given has shape {tuple(shape)}"
        )


def _check_axes(
    spec: Spec, tensor: Tensor, shape: tuple[int, ...], values: dict[sympy.Symbol, int]
) -> None:
    for position in range(len(tensor.layout)):
        axis = position - len(tensor.layout)
        if int(tensor.shape[position].subs(values)) != shape[axis]:
            raise ShapeError(_axis_message(spec, tensor, axis, shape[axis], values))


def _axis_message(
    spec: Spec, tensor: Tensor, axis: int, actual: int, values: dict[sympy.Symbol, int]
) -> str:
    position = axis + len(tensor.layout)
    glyphs = "".join(i.glyph for i in tensor.layout[position])
    expected = tensor.shape[position]
    known = expected.subs(values)
    if known.is_Integer:
        value = f" = {known}" if known != expected else ""
    else:  # only some factors are known: the axis must be a multiple of them
        part = sympy.Mul(*(f for f in expected.args if f.subs(values).is_Integer))
        number = part.subs(values)
        shown = f"{part} = {number}" if part != number else f"{number}"
        value = f" (a multiple of {shown})" if number != 1 else ""
    return (
        f"{spec.name}: {tensor!r}, axis {position} ({glyphs}): expected size "
        f"{expected}{value}, got {actual}"
    )


def _symbolic(tensor: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in tensor.shape) + ")"
