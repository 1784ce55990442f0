"""Generated code against the literal interpreter on random data: what `indexattn check` and
the test suite run for every spec."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from ..ir import Spec
from ..ir.shapes import honouring
from ..runtime import CompiledSpec
from . import reference

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2}


def sample_sizes(spec: Spec, seed: int = 0, fixed: dict[str, int] | None = None) -> dict[str, int]:
    """Small, pairwise different sizes, so that a swapped axis cannot go unnoticed, that honour
    what the spec declares of them (`index c : M - N` asks M > N; ir.shapes.relations); the
    sizes in `fixed` (by ASCII name) as given. A ValueError says which relation they break."""
    values = [3, 4, 5, 2, 6, 7, 8, 9] if seed % 2 == 0 else [5, 2, 3, 4, 7, 6, 9, 8]
    sizes = {
        name: values[k % len(values)] + 8 * (k // len(values))
        for k, name in enumerate(spec.size_asciis)
    }
    sizes.update(fixed or {})
    by_symbol = dict(zip(spec.sizes, spec.size_asciis))
    chosen = honouring(spec, {s: sizes[a] for s, a in by_symbol.items()}, set(fixed or ()))
    return {by_symbol[s]: v for s, v in chosen.items()}


def sample_arguments(
    spec: Spec,
    sizes: dict[str, int],
    batch: tuple[int, ...] = (),
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Random tensors for every input, param and buffer, inputs with leading `batch` axes."""
    generator = torch.Generator().manual_seed(seed)
    values = {s: sizes[a] for s, a in spec.size_names.items()}
    out = {}
    for tensor in spec.arguments:
        shape = tuple(int(sympy.sympify(s).subs(values)) for s in tensor.shape)
        shape = (*batch, *shape) if tensor.batched else shape
        if tensor.dtype == "int":  # 0 and 1: equal ids occur, and any axis takes them
            out[tensor.ascii] = torch.randint(0, 2, shape, generator=generator).to(device)
            continue
        data = torch.randn(shape, generator=generator, dtype=torch.float64) * 0.5
        out[tensor.ascii] = data.to(device=device, dtype=dtype)
    return out


@dataclass(frozen=True)
class Comparison:
    dtype: torch.dtype
    batch: tuple[int, ...]
    error: float  # max |generated - literal| / (1 + max |literal|), over all outputs

    @property
    def ok(self) -> bool:
        return self.error <= TOLERANCE[self.dtype]


def compare(
    spec: CompiledSpec,
    dtype: torch.dtype = torch.float64,
    batch: tuple[int, ...] = (),
    seed: int = 0,
    fixed: dict[str, int] | None = None,
) -> Comparison:
    """Runs the generated function and the literal interpreter on the same random data, at
    sample sizes (those in `fixed` as given)."""
    sizes = sample_sizes(spec.ir, seed, fixed)
    args = sample_arguments(spec.ir, sizes, batch, dtype, seed)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    generated = _tuple(spec(**args, **given))
    literal = reference.evaluate(spec.ir, **args, **given)
    return Comparison(dtype, batch, max(_error(g, r) for g, r in zip(generated, literal)))


def _tuple(value) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    got, want = got.double(), want.double()
    same = ((got == want) & torch.isinf(want)) | (got.isnan() & want.isnan())
    diff = torch.where(same, torch.zeros_like(got), (got - want).abs())
    finite = want[torch.isfinite(want)]
    scale = 1 + (finite.abs().max().item() if finite.numel() else 0.0)
    return float(diff.nan_to_num(float("inf")).max().item() / scale) if diff.numel() else 0.0
