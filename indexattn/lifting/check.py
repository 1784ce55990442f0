"""The lifted spec against the module it came from: float64, by the literal interpreter of
the spec, at sequence lengths other than the example's (and the example's batch)."""

from __future__ import annotations

import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..oracle.reference import evaluate
from .errors import LiftError


def lengths(example: int) -> tuple[int, int]:
    """Two sequence lengths other than the example's."""
    return (example + 3, max(2, example - 1) if example > 2 else example + 5)


def check(lifted, module, inputs, sizes=()) -> None:
    """Raise LiftError where the spec read literally differs from the module in float64."""
    reference = copy.deepcopy(module).double().eval()
    spec = lifted.spec
    weights = {n: t for n, t in lifted.layer.state_dict().items()}
    names = [t.ascii for t in spec.ir.tensors if t.role == "input"]
    example = inputs[0].shape[1] if inputs[0].dim() >= 2 else None
    for n in sizes or (lengths(example) if example else (None,)):
        g = torch.Generator().manual_seed(n or 0)
        args = [_resized(x, n, g) for x in inputs]
        with torch.no_grad(), Float64():
            want = reference(*args)
            got = evaluate(
                spec.ir,
                **dict(zip(names, args)),
                **{k: v.double() for k, v in weights.items()},
                **lifted.sizes,
            )
        wants = want if isinstance(want, tuple) else (want,)  # (output, weights): each
        for out, expected in zip(got, wants):
            if not torch.allclose(out, expected, rtol=1e-9, atol=1e-9):
                error = (out - expected).abs().max().item()
                raise LiftError(
                    f"the lifted spec differs from the module by {error:.3g} at sequence "
                    f"length {n} (float64):\n{lifted.spec_text}"
                )


def _resized(x: torch.Tensor, n, g) -> torch.Tensor:
    shape = list(x.shape)
    if n is not None and len(shape) >= 2:
        shape[1] = n
    if x.is_floating_point():
        return torch.randn(shape, generator=g, dtype=torch.float64)
    return torch.randint(0, max(int(x.max()) + 1, 2), shape, generator=g).to(x.dtype)


LOWER = frozenset({torch.float32, torch.float16, torch.bfloat16})


class Float64(TorchDispatchMode):
    """The module run in float64 throughout: a cast to a lower precision (transformers'
    rotary tables and eager softmax in float32) stays float64, as the lifted spec reads a cast
    as no change. `with Float64(): module(x.double())`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") in LOWER:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)
