"""The derived backward on tensors: `gradients()` runs it once; `DerivedBackward` is a
torch.autograd.Function whose forward is the spec's generated function and whose backward is
the derived backward, compiled like any spec. `spec(..., backward="derived")` selects it;
autograd's own backward is the default."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from . import Derived, derive

if TYPE_CHECKING:
    from ..runtime import CompiledSpec


@functools.lru_cache(maxsize=64)
def compiled(spec: CompiledSpec) -> tuple[Derived, CompiledSpec]:
    """The derivation of a spec and its backward, compiled once (SpecError where refused)."""
    from ..runtime import compile_spec

    derived = derive(spec.ir, spec.text, spec.file)
    return derived, compile_spec(derived.text, name=f"{spec.name}_backward")


def gradients(
    spec: CompiledSpec, cotangents: tuple[torch.Tensor, ...], /, **kwargs
) -> dict[str, torch.Tensor]:
    """`gradients(spec, (dy,), X=x, W=w, ...)` -> {"X": dX, "W": dW, ...}: the derived
    backward of `spec` at the forward's arguments (keywords, as a call takes them), one
    cotangent per float output in `output` order. Arguments no cotangent reaches are absent
    (autograd's None)."""
    scalars = {s.ascii: kwargs[s.ascii] for s in spec.ir.scalars if s.ascii in kwargs}
    tensors = [kwargs[name] for name in spec.arguments]
    given = {k: v for k, v in kwargs.items() if k in spec.size_names}
    return _backward(spec, tensors, cotangents, given, scalars)


def _backward(spec: CompiledSpec, tensors, cotangents, given: dict, scalars: dict) -> dict:
    """The derived cotangents of the arguments, each summed to its argument's shape."""
    derived, backward = compiled(spec)
    inputs = backward.ir.tensors_of("input")[-len(derived.given) :]
    sizes = spec.solve(tensors, given)
    arguments = dict(zip(spec.arguments, tensors))
    out = backward(
        **arguments,
        **dict(zip((t.ascii for t in inputs), cotangents)),
        **{k: v for k, v in sizes.items() if k in backward.required},
        **scalars,
    )
    out = out if isinstance(out, tuple) else (out,)
    return {
        t.ascii: grad.sum_to_size(arguments[t.ascii].shape) for t, grad in zip(derived.reached, out)
    }


def run(spec: CompiledSpec, tensors: list[torch.Tensor], given: dict, scalars: dict):
    """The forward on `tensors` (argument order), its backward the derived one."""
    compiled(spec)  # derived before the forward runs: a refusal is raised at the call
    out = DerivedBackward.apply(spec, given, scalars, *tensors)
    return out[0] if len(out) == 1 else out


class DerivedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: CompiledSpec, given: dict, scalars: dict, *tensors: torch.Tensor):
        ctx.spec, ctx.given, ctx.scalars = spec, given, scalars
        ctx.save_for_backward(*tensors)
        out = spec._run(tensors, given, scalars, False)
        out = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*(o for o in out if not o.is_floating_point()))
        return out

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        spec, tensors = ctx.spec, ctx.saved_tensors
        derived, _ = compiled(spec)
        outputs = list(spec.ir.outputs)
        cots = [cotangents[outputs.index(t)] for t in derived.given]
        found = _backward(spec, tensors, cots, ctx.given, ctx.scalars)
        wanted = ctx.needs_input_grad[3:]
        grads = [found.get(name) if w else None for name, w in zip(spec.arguments, wanted)]
        return (None, None, None, *grads)
