"""Spec + plan + sizes -> the facts every rendering shows: indices, tensors with their shapes,
parameters per tensor and FLOPs per equation, symbolic and at the sizes. `str(report)` is the
table `indexattn count` prints; the PDF and the Markdown pages render the same values."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import sympy

from .. import ir
from ..lower.program.program import Program
from . import cost, latex
from .tables import (
    Cell,
    Equations,
    Formula,
    Math,
    Number,
    Shape,
    Table,
    TensorName,
    Text,
    grouped,
    show,
)

PAGE = 100  # columns of the table `indexattn count` prints
FORMULA_MIN = 24  # columns a formula keeps however long the names and numbers are


@dataclass(frozen=True)
class IndexRow:
    """Indices declared together: `τ, τ' : N`."""

    indices: tuple[ir.Index, ...]
    size: sympy.Expr
    value: int
    doc: str


@dataclass(frozen=True)
class TensorRow:
    tensor: ir.Tensor
    role: str  # input, param, buffer, derived, output
    axes: tuple[tuple[sympy.Expr, ...], ...]  # each axis: its indices' sizes, as written
    values: tuple[int, ...]


@dataclass(frozen=True)
class CountRow:
    """A param's elements, the FLOPs of one block of the plan, or a total."""

    expr: sympy.Expr
    value: int | sympy.Expr
    param: ir.Tensor | None = None
    equations: tuple[ir.Equation, ...] = ()  # the equations a FLOP row computes
    note: str = ""  # a block that computes no equation (the plan's note), or "total"


@dataclass(frozen=True)
class Report:
    spec: ir.Spec
    plan: Program
    sizes: dict  # size Symbol -> int
    indices: tuple[IndexRow, ...]
    tensors: tuple[TensorRow, ...]
    params: tuple[CountRow, ...]
    flops: tuple[CountRow, ...]

    def total(self, rows: tuple[CountRow, ...]) -> CountRow:
        expr = sympy.expand(sympy.Add(*(r.expr for r in rows)))
        return CountRow(expr, cost.evaluate(expr, self.sizes), note="total")

    def sizes_text(self) -> str:
        return ", ".join(f"{s} = {v}" for s, v in self.sizes.items())

    def __str__(self) -> str:
        groups = (
            ("parameters", param_table(self)),
            ("FLOPs of one forward pass, per batch element", flop_table(self)),
        )
        tables = [[[show(c, PLAIN) for c in row] for row in (*t.rows, t.total)] for _, t in groups]
        width = [max(len(row[k]) for table in tables for row in table) for k in range(3)]
        # the formulas take what the names and numbers leave of the page; longer ones wrap
        width[1] = min(width[1], max(FORMULA_MIN, PAGE - 8 - width[0] - width[2]))
        out = [self.spec.name + (" at" if self.sizes else "")]  # mha at N = 1024, d_m = 768
        pieces = [f"{size} = {value}," for size, value in self.sizes.items()]
        for piece in [*pieces[:-1], pieces[-1][:-1]] if pieces else []:
            fits = len(out[-1]) + 1 + len(piece) <= PAGE
            out[-1:] = [out[-1] + " " + piece] if fits else [out[-1], "  " + piece]
        for (title, _), table in zip(groups, tables):
            out += ["", title]
            for a, b, c in table:
                first, *more = _wrapped(b, width[1])
                out.append(f"  {a:<{width[0]}}  {first:<{width[1]}}  {c:>{width[2]}}".rstrip())
                out += [f"  {'':<{width[0]}}    {line}" for line in more]
        return "\n".join(out) + "\n"


def _wrapped(formula: str, width: int) -> list[str]:
    """A formula in lines of `width` columns, broken at spaces (between terms): the first,
    then the rest two columns further in, where they read as its continuation."""
    lines = textwrap.wrap(formula, width, break_long_words=False, break_on_hyphens=False)
    first, *rest = lines or [""]
    if not rest:  # fits: a column of "0" and "1" is narrower than the indent below
        return [first]
    return [first, *textwrap.wrap(" ".join(rest), width - 2, break_long_words=False)]


def index_table(report: Report) -> Table:
    rows = tuple(
        (
            Math(", ".join(latex.math_name(i.glyph) for i in row.indices)),
            Formula(row.size),
            Number(row.value),
            Text(row.doc),
        )
        for row in report.indices
    )
    return Table(("Index", "Range", "At sizes", "Description"), rows, wide=3)


def scalar_table(report: Report) -> Table:
    rows = tuple(
        (Math(latex.math_name(s.name)), Number(s.value), Text(s.doc)) for s in report.spec.scalars
    )
    return Table(("Scalar", "Default", "Description"), rows, wide=2)


def tensor_table(report: Report) -> Table:
    rows = tuple(
        (
            TensorName(row.tensor),
            Text(row.role),
            Shape(row.axes, row.tensor.batched),
            Shape(tuple((v,) for v in row.values), row.tensor.batched),
            Text(row.tensor.doc),
        )
        for row in report.tensors
    )
    return Table(("Tensor", "Role", "Shape", "At sizes", "Description"), rows, wide=4)


def param_table(report: Report) -> Table:
    rows = tuple(_count_cells(report, r) for r in report.params)
    total = _count_cells(report, report.total(report.params))
    return Table(("Parameter", "Elements", "At sizes"), rows, total, wide=1)


def flop_table(report: Report) -> Table:
    rows = tuple(_count_cells(report, r) for r in report.flops)
    total = _count_cells(report, report.total(report.flops))
    return Table(("Equations", "FLOPs", "At sizes"), rows, total, wide=1)


def _count_cells(report: Report, row: CountRow) -> tuple[Cell, ...]:
    return (_subject(report, row), Formula(row.expr), Number(row.value))


def _subject(report: Report, row: CountRow) -> Cell:
    if row.param is not None:
        return TensorName(row.param)
    if row.equations:
        numbers = tuple(report.spec.equations.index(eq) + 1 for eq in row.equations)
        return Equations(row.equations, numbers)
    return Text(row.note)


PLAIN = {  # a cell as plain text, for `indexattn count`
    Text: lambda cell: cell.value,
    TensorName: lambda cell: repr(cell.tensor),
    Equations: lambda cell: ", ".join(repr(eq.tensor) for eq in cell.equations),
    Formula: lambda cell: str(cell.expr),
    Number: lambda cell: grouped(cell.value, ",") or str(cell.value),
}


def report(spec: ir.Spec, plan: Program, sizes: dict) -> Report:
    """`report(spec, plan, cost.sizes_for(spec))`: every row, symbolic and at the sizes."""
    return Report(
        spec,
        plan,
        sizes,
        index_rows(spec, sizes),
        tuple(_tensor_row(t, spec, sizes) for t in spec.tensors),
        tuple(CountRow(n, cost.evaluate(n, sizes), t) for t, n in cost.params(spec)),
        flop_rows(spec, plan, sizes),
    )


def index_rows(spec: ir.Spec, sizes: dict) -> tuple[IndexRow, ...]:
    rows: list[IndexRow] = []
    for index in spec.indices:
        last = rows[-1] if rows else None
        if last and last.size == index.size and last.doc == index.doc:
            rows[-1] = IndexRow((*last.indices, index), last.size, last.value, last.doc)
        else:
            rows.append(IndexRow((index,), index.size, cost.evaluate(index.size, sizes), index.doc))
    return tuple(rows)


def _tensor_row(tensor: ir.Tensor, spec: ir.Spec, sizes: dict) -> TensorRow:
    role = "output" if tensor in spec.outputs else tensor.role
    axes = tuple(tuple(i.size for i in axis) for axis in tensor.layout)
    return TensorRow(tensor, role, axes, tuple(cost.evaluate(n, sizes) for n in tensor.shape))


def flop_rows(spec: ir.Spec, plan: Program, sizes: dict) -> tuple[CountRow, ...]:
    """One row per block of the plan that computes something: the equations it implements."""
    rows = []
    written = _written(spec, plan.spec)
    for block, spent in cost.block_costs(plan):
        eqs = tuple(dict.fromkeys(written[eq.tensor.name] for eq in block.equations))
        if not eqs and spent.total == 0:
            continue
        value = cost.evaluate(spent.total, sizes)
        rows.append(CountRow(spent.total, value, equations=eqs, note=block.note))
    return tuple(rows)


def _written(spec: ir.Spec, planned: ir.Spec) -> dict[str, ir.Equation]:
    """Each equation the plan computes (of the canonical form, lower/planner/canonical.py), as the
    spec's own equation it comes from: a rewritten equation is the one of its tensor, an
    equation the canonical form made is the written one that reads it (counted there)."""
    own = {eq.tensor.name: eq for eq in spec.equations}
    later = reversed(planned.equations)  # the first reader wins
    readers = {ref.tensor.name: eq.tensor.name for eq in later for ref in ir.refs(eq.rhs)}
    found = {}
    for eq in planned.equations:
        name = eq.tensor.name
        while name not in own:
            name = readers[name]
        found[eq.tensor.name] = own[name]
    return found
