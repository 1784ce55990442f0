"""Spec + plan + sizes -> the facts every rendering shows: indices, tensors with their shapes,
parameters per tensor and FLOPs per equation, symbolic and at the sizes. `str(report)` is the
table `indexattn count` prints; the PDF and the Markdown pages render the same values."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from ..lower.plan import Plan
from . import cost


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
    """A param's elements, or the FLOPs of one block of the plan."""

    label: str
    equations: tuple[ir.Equation, ...]  # the equations a FLOP row computes
    expr: sympy.Expr
    value: int | sympy.Expr


@dataclass(frozen=True)
class Report:
    spec: ir.Spec
    plan: Plan
    sizes: dict  # size Symbol -> int
    indices: tuple[IndexRow, ...]
    tensors: tuple[TensorRow, ...]
    params: tuple[CountRow, ...]
    flops: tuple[CountRow, ...]

    def total(self, rows: tuple[CountRow, ...]) -> CountRow:
        expr = sympy.expand(sympy.Add(*(r.expr for r in rows)))
        return CountRow("total", (), expr, cost.evaluate(expr, self.sizes))

    def sizes_text(self) -> str:
        return ", ".join(f"{s} = {v}" for s, v in self.sizes.items())

    def __str__(self) -> str:
        groups = (
            ("parameters", self.params),
            ("FLOPs of one forward pass, per batch element", self.flops),
        )
        tables = [
            [(r.label, str(r.expr), _number(r.value)) for r in (*rows, self.total(rows))]
            for _, rows in groups
        ]
        width = [max(len(row[k]) for table in tables for row in table) for k in range(3)]
        out = [f"{self.spec.name} at {self.sizes_text()}" if self.sizes else self.spec.name]
        for (title, _), table in zip(groups, tables):
            out += ["", title]
            out += [f"  {a:<{width[0]}}  {b:<{width[1]}}  {c:>{width[2]}}" for a, b, c in table]
        return "\n".join(out) + "\n"


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def report(spec: ir.Spec, plan: Plan, sizes: dict) -> Report:
    """`report(spec, plan, cost.sizes_for(spec))`: every row, symbolic and at the sizes."""
    return Report(
        spec,
        plan,
        sizes,
        index_rows(spec, sizes),
        tuple(_tensor_row(t, spec, sizes) for t in spec.tensors),
        tuple(CountRow(repr(t), (), n, cost.evaluate(n, sizes)) for t, n in cost.params(spec)),
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


def flop_rows(spec: ir.Spec, plan: Plan, sizes: dict) -> tuple[CountRow, ...]:
    """One row per block of the plan that computes something: the equations it implements."""
    rows = []
    for block, spent in cost.block_costs(plan):
        eqs = block.equations
        if not eqs and spent.total == 0:
            continue
        label = ", ".join(repr(eq.tensor) for eq in eqs) or block.note
        rows.append(CountRow(label, eqs, spent.total, cost.evaluate(spent.total, sizes)))
    return tuple(rows)
