"""The derived backward run on tensors: the gradient of every argument a cotangent reaches,
in the argument's own shape (a param's summed over the call's batch axes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import derive

if TYPE_CHECKING:
    from ..runtime import CompiledSpec


def gradients(
    spec: CompiledSpec, cotangents: tuple[torch.Tensor, ...], /, **kwargs
) -> dict[str, torch.Tensor]:
    """`gradients(spec, (dy,), X=x, W=w, ...)` -> {"X": dX, "W": dW, ...}: the derived
    backward of `spec` at the forward's arguments (keywords, as a call takes them), one
    cotangent per float output in `output` order. Arguments no cotangent reaches are absent
    (autograd's None)."""
    from ..runtime import compile_spec

    derived = derive(spec.ir, spec.text, spec.file)
    backward = compile_spec(derived.text, name=f"{spec.name}_backward")
    names = [t.ascii for t in backward.ir.tensors_of("input")[-len(derived.given) :]]
    given = {k: v for k, v in kwargs.items() if k in backward.arguments or k in backward.required}
    given |= {k: v for k, v in kwargs.items() if k in {s.ascii for s in spec.ir.scalars}}
    out = backward(**given, **dict(zip(names, cotangents)))
    out = out if isinstance(out, tuple) else (out,)
    return {
        t.ascii: grad.sum_to_size(kwargs[t.ascii].shape) for t, grad in zip(derived.reached, out)
    }
