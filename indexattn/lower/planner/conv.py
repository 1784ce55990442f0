"""A learned kernel over relative offsets, written as the papers write it: a sum over offsets
of a kernel times a shifted read, zero where the read leaves its axis,
`sum_<pr>(where(τ >= p and τ' >= r, θ_<μpr> S_<μ[τ - p][τ' - r]>, 0))` (Multi-Token
Attention's key-query convolution). Read literally, that is a tensor over every position and
every offset (h × N × N × c_q × c_k); the planner pads the signal with zeros and calls
`F.conv1d` or `F.conv2d`, one group per channel (`Convolve`). Exact: a convolution sums the
same products, and the zeros it pads with are the reads the `where` hides (docs/decisions.md,
"Convolutions over positions")."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ... import ir
from ...ir import Index
from ...ir.boxes import comparisons, read_bounds
from ..program.steps import Arg, Convolve, Operand, Shift


@dataclass(frozen=True)
class ConvForm:
    kernel: ir.Ref
    signal: ir.Ref
    shifts: tuple[Shift, ...]


def conv_form(node: ir.Node) -> ConvForm | None:
    """The convolution a sum over offsets computes, or None: `sum_<o>(where(c, K S, 0))` or
    `K_<..o..> where(c, S, 0)` (the offsets summed by Einstein's rule), K a kernel read at
    plain indices, S read at `v ± o + c` along one or two axes, c true exactly where those
    reads are inside their axes."""
    parts = _parts(node)
    if parts is None:
        return None
    offsets, condition, factors = parts
    refs = [f for f in factors if isinstance(f, ir.Ref)]
    if len(factors) != 2 or len(refs) != 2:
        return None
    signal = next((r for r in refs if any(isinstance(i, ir.At) for i in r.written)), None)
    kernel = next((r for r in refs if r is not signal), None)
    if signal is None or not all(isinstance(i, Index) for i in kernel.written):
        return None
    shifts = _shifts(signal, offsets)
    if shifts is None or not _fits(kernel, signal, shifts, offsets):
        return None
    return ConvForm(kernel, signal, shifts) if _pads(condition, shifts) else None


def _unshifted(form: ConvForm) -> ir.Ref:
    """The signal read whole: each shifted position read at the index it is shifted along."""
    along = {s.axis: s.along for s in form.shifts}
    declared = iter(form.signal.tensor.indices)
    axes = []
    for axis in form.signal.axes:
        items = [(i, next(declared)) for i in axis]
        axes.append(tuple(along[d] if isinstance(i, ir.At) else i for i, d in items))
    return ir.Ref(form.signal.tensor, tuple(axes), form.signal.span)


def _parts(node: ir.Node) -> tuple[tuple[Index, ...], ir.Node, tuple[ir.Node, ...]] | None:
    """The offsets, the condition and the two factors, of either phrasing."""
    if isinstance(node, ir.Reduce) and node.fn == "sum" and _zeroed(node.body):
        condition, value = node.body.args[:2]
        if isinstance(value, ir.Product) and not value.summed:
            return node.over, condition, value.factors
        return None
    if isinstance(node, ir.Product) and node.summed and len(node.factors) == 2:
        zeroed = [f for f in node.factors if _zeroed(f)]
        if len(zeroed) == 1:
            other = next(f for f in node.factors if f is not zeroed[0])
            return node.summed, zeroed[0].args[0], (other, zeroed[0].args[1])
    return None


def _zeroed(node: ir.Node) -> bool:
    """`where(c, value, 0)`, c a condition on indices alone."""
    if not (isinstance(node, ir.Apply) and node.fn == "where"):
        return False
    condition, _, zero = node.args
    return (
        isinstance(condition, ir.Field)
        and isinstance(zero, ir.Field)
        and not zero.free
        and zero.expr == 0
    )


def _shifts(signal: ir.Ref, offsets: tuple[Index, ...]) -> tuple[Shift, ...] | None:
    """Each computed position of the signal as `along ± offset + shift`, one offset each."""
    declared = signal.tensor.indices
    found = []
    for k, item in enumerate(signal.written):
        if not isinstance(item, ir.At):
            continue
        shift = _shift(item.value, declared[k], offsets)
        if shift is None:
            return None
        found.append(shift)
    used = [s.offset for s in found]
    if not 1 <= len(found) <= 2 or sorted(used, key=str) != sorted(offsets, key=str):
        return None
    return tuple(found)


def _shift(value: ir.Node, axis: Index, offsets: tuple[Index, ...]) -> Shift | None:
    if not (isinstance(value, ir.Field) and len(value.free) == 2):
        return None
    offset = next((i for i in value.free if i in offsets), None)
    along = next((i for i in value.free if i not in offsets), None)
    if offset is None or along is None or along.size != axis.size:
        return None
    expr = sympy.expand(value.expr)
    sign = expr.coeff(offset.symbol)
    shift = sympy.expand(expr - sign * offset.symbol - along.symbol)
    if sign not in (1, -1) or shift.free_symbols & {offset.symbol, along.symbol}:
        return None
    return Shift(axis, along, offset, int(sign), shift)


def _fits(kernel: ir.Ref, signal: ir.Ref, shifts: tuple[Shift, ...], offsets) -> bool:
    """The kernel reads the offsets and channels the signal reads plainly; the signal reads
    each position it is shifted along nowhere else."""
    plain = [i for i in signal.written if isinstance(i, Index)]
    alongs = {s.along for s in shifts}
    channels = [i for i in kernel.written if i not in offsets]
    return (
        len(set(kernel.written)) == len(kernel.written)
        and set(offsets) <= set(kernel.written)
        and set(channels) <= set(plain)
        and not alongs & set(plain)
        and len(alongs) == len(shifts)
    )


def _pads(condition: ir.Field, shifts: tuple[Shift, ...]) -> bool:
    """Whether the condition is exactly the reads' being inside their axes: each of its
    comparisons one bound of a read, and each bound it lacks true for every index value."""
    atoms = comparisons(condition.expr)
    if atoms is None:
        return False
    said = []
    for s in shifts:
        read = s.along.symbol + s.sign * s.offset.symbol + s.shift
        highest = s.along.size - 1 + s.start + s.offset.size - 1
        lower, upper = read_bounds(read, s.axis.size)
        said += [(lower, s.start), (upper, s.axis.size - 1 - highest)]
    if not all(any(sympy.expand(a - b) == 0 for b, _ in said) for a in atoms):
        return False
    return all(
        any(sympy.expand(a - bound) == 0 for a in atoms) or bool(sympy.expand(least).is_nonnegative)
        for bound, least in said
    )


def convolve_rule(planner, node: ir.Node, hint: str) -> Arg | None:
    """One `F.conv1d`/`F.conv2d` where the sum is a convolution (`conv_form`)."""
    form = conv_form(node)
    if form is None:
        return None
    signal = planner.node(_unshifted(form), hint)
    kernel = planner.node(form.kernel, hint)
    offsets = tuple(s.offset for s in form.shifts)
    channels = tuple(i for i in kernel.dims if i not in offsets)
    alongs = tuple(s.along for s in form.shifts)
    rest = tuple(i for i in signal.dims if i not in (*channels, *alongs))
    out = Operand(planner.var(hint + "_conv"), (*rest, *channels, *alongs), signal.batched)
    return planner.add(Convolve(out, signal, kernel, channels, form.shifts))
