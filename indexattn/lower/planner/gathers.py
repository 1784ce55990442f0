"""Reads at positions (`K_<μ[τ - p]>`, `B_<[β_<ττ'>]>`): a flip or a shifted slice where the
positions reverse or shift a whole axis, else a gather at whole-number positions. Functions
of the planner (plan.py's), which they plan into."""

from __future__ import annotations

from ... import ir
from ...ir import Index
from ...ir.kinds import integer_tensors, whole_form
from ..program.steps import Flip, Gather, Grid, Operand, Slice, Whole
from .fusion import repetition, reversal, shift


def gather(planner, value: Operand, axis: Index, at: ir.At, node: ir.Ref, hint: str) -> Operand:
    field = planner.fields.get(at.value, at.value)
    flipped, start = reversal(field, axis), shift(field, axis)
    if flipped is not None or start is not None:
        index = flipped or field.free[0]
        dims = tuple(index if d == axis else d for d in value.dims)
        if flipped is not None:
            out = Operand(planner.var(f"{node.tensor.ascii}_flip"), dims, value.batched)
            return planner.add(Flip(out, value, axis))
        out = Operand(planner.var(f"{node.tensor.ascii}_part"), dims, value.batched)
        return planner.add(Slice(out, value, axis, start))
    positions = whole_positions(planner, at, hint)
    integer = at.value in planner.fields or isinstance(at.value, ir.Field)
    where = f"{node.tensor!r}, axis {node.tensor.indices.index(axis)} ({axis.glyph})"
    dims = _gathered(value, axis, positions, planner.ordered)
    out = Operand(planner.var(f"{node.tensor.ascii}_at"), dims, value.batched or positions.batched)
    bounds = None
    if not integer and not positions.var.argument and integer_tensors(at.value):
        equations = {eq.tensor.name: eq.rhs for eq in planner.spec.equations}
        bounds = whole_form(at.value, equations)
    repeat = None if positions.batched else repetition(field, axis)
    return planner.add(Gather(out, value, axis, positions, where, bounds, repeat))


def whole_positions(planner, at: ir.At, hint: str) -> Operand:
    """Positions as integers: whole numbers computed in the call's float dtype made so."""
    positions = _positions(planner, at, hint)
    integer = at.value in planner.fields or isinstance(at.value, ir.Field)
    if integer or integer_tensors(at.value):
        return positions
    out = Operand(planner.var(positions.var.hint + "_pos"), positions.dims, positions.batched)
    return planner.add(Whole(out, positions))


def _positions(planner, at: ir.At, hint: str) -> Operand:
    """Whole numbers to gather at: a grid of positions, or integer data."""
    field = planner.fields.get(at.value, at.value)
    if isinstance(field, ir.Field):
        out = Operand(planner.var(hint + "_pos"), planner.ordered(field.free), False)
        return planner.add(Grid(out, field.expr, index=True))
    return planner.as_tensor(planner.node(at.value, hint + "_pos"), hint + "_pos")


def _gathered(value: Operand, axis: Index, positions: Operand, ordered) -> tuple[Index, ...]:
    """The axes of a gather: the positions' in the axis's place, unbatched tables ordered as
    the equation wants them when the positions' axes stay together there (the table is
    viewed that way first, so the result needs no copy to be put in order: an attention
    bias gathered straight into (heads, query, key))."""
    k = value.dims.index(axis)
    rest = value.dims[:k] + value.dims[k + 1 :]
    if positions.batched:  # batch axes lead: the positions' axes come first
        return positions.dims + rest
    wanted = ordered(rest + positions.dims)
    start = wanted.index(positions.dims[0]) if positions.dims else k
    if wanted[start : start + len(positions.dims)] == positions.dims:
        return wanted
    return value.dims[:k] + positions.dims + value.dims[k + 1 :]
