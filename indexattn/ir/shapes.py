"""Sizes from shapes: which size each argument axis determines (a recipe fixed per spec), and
checking real shapes against it with ShapeError."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from ..errors import ShapeError
from .nodes import Spec, Tensor


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
            if len(unknown) != 1:
                continue
            (symbol,) = unknown
            poly = sympy.Poly(size, symbol)
            if poly.degree() == 1:
                scale, offset = poly.coeff_monomial(symbol), poly.coeff_monomial(1)
                return Step(symbol, tensor, position - len(tensor.layout), scale, offset)
    return None


Tree = int | str | tuple  # an integer, a size by ASCII name, or ("*" | "+", *parts)


@dataclass(frozen=True)
class Read:
    """A size read off an argument axis: `shape[axis] // divisor`."""

    size: str
    argument: int
    axis: int
    divisor: Tree
    offset: Tree
    where: str  # `W_<(μBa)i>, axis 0 (μBa)`
    message: str  # the start of the ShapeError when the axis does not fit
    multiple: str  # the divisor as written, for "(a multiple of h = 24)"


@dataclass(frozen=True)
class Check:
    """An argument axis whose size must equal `expected` at the solved sizes."""

    argument: int
    axis: int
    expected: Tree
    message: str
    literal: bool  # the expected size is a number as written


@dataclass(frozen=True)
class Rank:
    argument: int
    rank: int
    batched: bool
    message: str


@dataclass(frozen=True)
class Rules:
    """Every shape check of a spec as plain data: sizes read from axes, then every axis
    checked. No sympy at call time, so under torch.compile each comparison is a guard."""

    spec: str
    required: tuple[str, ...]
    ranks: tuple[Rank, ...]
    reads: tuple[Read, ...]
    checks: tuple[Check, ...]

    def solve(self, shapes: Sequence[tuple[int, ...]], given: dict[str, int]) -> dict[str, int]:
        """Sizes by ASCII name from the arguments' shapes (in argument order) and the given
        sizes; ShapeError naming tensor, axis, expected and actual size where one differs."""
        given = {name: whole(self.spec, name, value) for name, value in given.items()}
        values: dict[str, int] = {}
        for name in self.required:
            if name not in given:
                raise ShapeError(
                    f"{self.spec}: the size {name} cannot be read from the shapes; "
                    f"pass it: {name}=..."
                )
            values[name] = given[name]
        for rank in self.ranks:
            shape = shapes[rank.argument]
            if len(shape) < rank.rank or (len(shape) != rank.rank and not rank.batched):
                raise ShapeError(f"{rank.message}{tuple(shape)}")
        for read in self.reads:
            self.read(read, shapes[read.argument][read.axis], values, given)
        for check in self.checks:
            actual = shapes[check.argument][check.axis]
            expected = evaluate(check.expected, values)
            if expected != actual:
                value = "" if check.literal else f" = {expected}"
                raise ShapeError(f"{check.message}{value}, got {actual}")
        return values

    def read(self, read: Read, actual: int, values: dict, given: dict) -> None:
        divisor, rest = evaluate(read.divisor, values), actual - evaluate(read.offset, values)
        if rest % divisor != 0 or rest <= 0:
            multiple = (
                read.multiple if read.multiple == str(divisor) else f"{read.multiple} = {divisor}"
            )
            suffix = f" (a multiple of {multiple})" if divisor != 1 else ""
            raise ShapeError(f"{read.message}{suffix}, got {actual}")
        values[read.size] = rest // divisor
        told = given.get(read.size)
        if told is not None and told != values[read.size]:
            raise ShapeError(
                f"{self.spec}: {read.size} was given as {told}, but {read.where}"
                f" has size {actual}, which makes {read.size} = {values[read.size]}"
            )


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
    return Rules(spec.name, tuple(names[s] for s in plan.required), ranks, reads, checks)


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
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return ("*", *[tree(expr.base, names)] * int(expr.exp))
    if expr.is_Mul or expr.is_Add:
        return ("*" if expr.is_Mul else "+", *(tree(a, names) for a in expr.args))
    raise TypeError(f"not a size expression: {expr}")


def evaluate(node: Tree, values: dict[str, int]) -> int:
    if isinstance(node, int):
        return node
    if isinstance(node, str):
        return values[node]
    parts = [evaluate(part, values) for part in node[1:]]
    return math.prod(parts) if node[0] == "*" else sum(parts)


def whole(spec: str, name: str, value) -> int:
    """A size as given by a caller: a positive whole number, never silently truncated."""
    if isinstance(value, bool) or not float(value).is_integer() or int(value) <= 0:
        raise ShapeError(f"{spec}: the size {name} must be a positive whole number, got {value!r}")
    return int(value)


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
