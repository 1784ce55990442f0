"""The table model of a report: cells typed by what they show (text, math, a formula, a
number, a tensor, a shape, equations), so that each rendering (plain text, Markdown, TeX)
formats and escapes each type one way, in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from .. import ir


@dataclass(frozen=True)
class Text:
    """Words, from the spec (a description) or ours (a role)."""

    value: str


@dataclass(frozen=True)
class Math:
    """LaTeX math, already printed: index and scalar names."""

    tex: str


@dataclass(frozen=True)
class Formula:
    """A size or count in the size symbols."""

    expr: sympy.Basic


@dataclass(frozen=True)
class Number:
    """A value at the sizes: digits grouped; symbolic when a size has no value."""

    value: int | float | sympy.Basic


@dataclass(frozen=True)
class TensorName:
    tensor: ir.Tensor


@dataclass(frozen=True)
class Shape:
    """A tensor's axes, each the product of its indices' sizes (or values)."""

    axes: tuple[tuple[int | sympy.Basic, ...], ...]
    batched: bool  # led by the inputs' batch axes


@dataclass(frozen=True)
class Equations:
    """The equations a block of the plan computes, with their numbers in the spec."""

    equations: tuple[ir.Equation, ...]
    numbers: tuple[int, ...]


Cell = Text | Math | Formula | Number | TensorName | Shape | Equations


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    total: tuple[Cell, ...] = ()  # set apart below the rows
    wide: int = -1  # the column that takes the rest of the page's width

    def numeric(self, column: int) -> bool:
        """Whether a column holds numbers (set flush right)."""
        first = self.rows[0] if self.rows else self.total
        return bool(first) and isinstance(first[column], Number)


def show(cell: Cell, formats: dict[type, Callable[..., str]]) -> str:
    """A cell in one rendering: `formats` maps each cell type to its formatter."""
    return formats[type(cell)](cell)


def grouped(value, separator: str) -> str:
    """An integer (or a float that is one) with its digits in groups of three; "" otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}".replace(",", separator) if isinstance(value, int) else ""
