"""Low-precision error of a compiled spec at a start position: the same rounded numbers run in
float16 or bfloat16 and in float64. What tests/lower/test_tables.py and benchmarks/precision.py
measure."""

from __future__ import annotations

import torch

from ..runtime import CompiledSpec
from .verify import sample_arguments, sample_sizes

START = "offset"  # the scalar a rotary spec reads its first position from
POSITIONS = "P"  # the integer input a model spec reads its positions from


def positional(spec: CompiledSpec) -> bool:
    """Whether the spec's numbers depend on where the sequence starts."""
    return _has_start(spec) or _has_positions(spec)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got - want‖ / ‖want‖ over the entries where float64 is finite."""
    finite = torch.isfinite(want)
    got, want = got.detach().double(), want.detach()
    diff = (got - want)[finite]
    return float(diff.norm() / want[finite].norm().clamp_min(1e-300))


def error(
    spec: CompiledSpec,
    dtype: torch.dtype,
    start: int = 0,
    sizes: dict[str, int] | None = None,
    literal: bool = True,
    seed: int = 0,
) -> float:
    """The largest relative error over the outputs, `dtype` against float64 of the same rounded
    numbers, the sequence starting at `start`. The float64 side is the literal interpreter, or
    the compiled spec itself (`literal=False`: for long sequences)."""
    from .reference import evaluate

    sizes = sizes or sample_sizes(spec.ir, seed)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, (2,), dtype, seed)
    scalars = {START: start} if _has_start(spec) else {}
    if _has_positions(spec):
        p = args[POSITIONS]
        args[POSITIONS] = torch.arange(start, start + p.shape[-1]).expand(p.shape).contiguous()
    high = {k: v.double() if v.is_floating_point() else v for k, v in args.items()}
    got = _tuple(spec(**args, **given, **scalars))
    if literal:
        want = evaluate(spec.ir, **high, **given, **scalars)
    else:
        want = _tuple(spec(**high, **given, **scalars))
    return max(relative(g, w) for g, w in zip(got, want, strict=True))


def _has_start(spec: CompiledSpec) -> bool:
    return any(name == START for name, _ in spec.plain.scalars)


def _has_positions(spec: CompiledSpec) -> bool:
    return any(t.ascii == POSITIONS and t.dtype == "int" for t in spec.ir.arguments)


def _tuple(value) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)
