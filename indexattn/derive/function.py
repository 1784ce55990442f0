"""The derived backward on tensors: `gradients()` runs it once; `DerivedBackward` is a
torch.autograd.Function whose forward is the spec's keeping forward (its outputs, and the
values the backward reads rather than computing them again; in training, dropout's masks
drawn first) and whose backward is the derived backward, compiled like any spec.
`spec(..., backward="derived")` selects it; indexattn/derive/defaults.json says which
backward a call that names none runs."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import torch

from ..ir import Spec
from . import Derived, derive


class CompiledSpec(Protocol):
    """What the derived backward needs of a compiled spec (runtime/compiled.py's CompiledSpec,
    which calls `run`): named here so that derive never imports the runtime."""

    name: str
    text: str
    file: str
    ir: Spec
    arguments: tuple[str, ...]
    size_names: frozenset[str]

    def backward(self, *, training: bool = True, scalars: frozenset = frozenset()) -> CompiledSpec:
        """The derived backward, compiled like any spec."""

    def keeping(self, *, training: bool = True, scalars: frozenset = frozenset()) -> CompiledSpec:
        """The forward that also returns the values the derived backward reads."""

    def solve(self, tensors: Sequence[torch.Tensor], given: dict) -> dict:
        """The sizes of a call."""

    def _run(self, tensors: Sequence[torch.Tensor], given: dict, scalars: dict, training: bool):
        """The generated function on tensors in argument order."""


@functools.lru_cache(maxsize=64)
def compiled(
    spec: CompiledSpec, training: bool, learnt: frozenset = frozenset()
) -> tuple[Derived, CompiledSpec]:
    """The derivation of a spec and its backward, compiled once (SpecError where refused);
    `learnt`: the scalars whose gradients it also returns (tensor scalars that require grad)."""
    derived = derive(spec.ir, spec.text, spec.file, training=training, scalars=learnt)
    return derived, spec.backward(training=training, scalars=learnt)


@functools.lru_cache(maxsize=64)
def keeping(spec: CompiledSpec, training: bool, learnt: frozenset = frozenset()) -> CompiledSpec:
    """The forward that also returns the values its derived backward reads, compiled once."""
    return spec.keeping(training=training, scalars=learnt)


def learnt(scalars: dict) -> frozenset[str]:
    """The scalars of a call that are tensors requiring grad: their gradients are derived."""
    return frozenset(
        k for k, v in scalars.items() if isinstance(v, torch.Tensor) and v.requires_grad
    )


def forward(spec: CompiledSpec, training: bool, tensors, masks, given: dict, scalars: dict):
    """The outputs of the forward, and the values the derived backward keeps."""
    derived, _ = compiled(spec, training, learnt(scalars))
    kept = keeping(spec, training, learnt(scalars))
    out = kept._run([*tensors, *masks], wanted(spec, kept, tensors, given), scalars, training)
    out = out if isinstance(out, tuple) else (out,)
    outputs = spec.ir.outputs
    names = [t.name for t in (*outputs, *(t for t in derived.kept if t not in outputs))]
    found = dict(zip(names, out))
    return out[: len(outputs)], [found[t.name] for t in derived.kept]


def drawn(spec: CompiledSpec, training: bool, tensors, given: dict, scalars: dict) -> list:
    """Dropout's masks for a call in training, in the order the forward draws them, drawn as
    it draws them: F.dropout of ones of its argument's shape (0, or 1 / (1 - p))."""
    derived, _ = compiled(spec, training, learnt(scalars))
    if not derived.masks:
        return []
    sizes = spec.solve(tensors, given)
    ir = spec.ir
    values = {s: sizes[ir.size_ascii(s)] for s in ir.sizes if ir.size_ascii(s) in sizes}
    values |= {s.symbol: scalars.get(s.ascii, s.value) for s in ir.scalars}
    leading = [
        t.shape[: t.dim() - len(a.layout)] for t, a in zip(tensors, ir.arguments) if a.batched
    ]
    batch = torch.broadcast_shapes(*leading)
    like = next(t for t, a in zip(tensors, ir.arguments) if a.dtype == "float")
    masks = []
    for mask, rate in zip(derived.masks, derived.rates):
        shape = [int(size.subs(values)) for size in mask.shape]
        ones = torch.ones(
            (*(batch if mask.batched else ()), *shape), dtype=like.dtype, device=like.device
        )
        masks.append(torch.nn.functional.dropout(ones, float(rate.subs(values)), training=True))
    return masks


def gradients(
    spec: CompiledSpec, cotangents: tuple[torch.Tensor, ...], /, *, training=True, **kwargs
) -> dict[str, torch.Tensor]:
    """`gradients(spec, (dy,), X=x, W=w, ...)` -> {"X": dX, "W": dW, ...}: the derived
    backward of `spec` at the forward's arguments (keywords, as a call takes them), one
    cotangent per float output in `output` order, and of each scalar passed as a tensor that
    requires grad. Arguments no cotangent reaches are absent (autograd's None).
    `training=False`: in eval mode (dropout is the identity)."""
    scalars = {s.ascii: kwargs[s.ascii] for s in spec.ir.scalars if s.ascii in kwargs}
    tensors = [kwargs[name] for name in spec.arguments]
    given = {k: v for k, v in kwargs.items() if k in spec.size_names}
    masks = drawn(spec, training, tensors, given, scalars)
    kept = forward(spec, training, tensors, masks, given, scalars)[1]
    return _backward(spec, training, tensors, kept + masks, cotangents, given, scalars)


def _backward(spec, training: bool, tensors, held, cotangents, given: dict, scalars: dict) -> dict:
    """The derived cotangents of the arguments (and of the learnt scalars), each summed to its
    argument's shape."""
    derived, backward = compiled(spec, training, learnt(scalars))
    inputs = backward.ir.tensors_of("input")[-len(derived.given) :]
    arguments = dict(zip(spec.arguments, tensors))
    out = backward(
        **arguments,
        **dict(zip((t.ascii for t in (*derived.kept, *derived.masks)), held)),
        **dict(zip((t.ascii for t in inputs), cotangents)),
        **wanted(spec, backward, tensors, given),
        **scalars,
    )
    out = out if isinstance(out, tuple) else (out,)
    values = arguments | scalars
    names = [t.ascii for t in (*derived.reached, *derived.scalars)]
    return {name: grad.sum_to_size(values[name].shape) for name, grad in zip(names, out)}


def wanted(spec: CompiledSpec, other: CompiledSpec, tensors, given: dict) -> dict:
    """The sizes `other` (the keeping forward, the backward) cannot read off its arguments,
    from the call's: its equations may read other sizes than the spec's (rope_partial's
    forward reads d_p off the weights and needs d_r; its keeping forward, which also returns
    Qp, reads d_r and needs d_p)."""
    sizes = spec.solve(tensors, given)
    return {k: v for k, v in sizes.items() if k in other.required}


def run(spec: CompiledSpec, tensors: list, given: dict, scalars: dict, training: bool):
    """The forward on `tensors` (argument order), its backward the derived one; the plain
    forward where no gradient will be asked for, and under torch.func's transforms (which
    would need the Function's `setup_context`: autograd's backward there)."""
    learning = sorted(learnt(scalars))
    wanted = [*tensors, *(scalars[k] for k in learning)]
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in wanted)
    if not recorded or _transformed():
        return spec._run(tensors, given, scalars, training)
    compiled(spec, training, learnt(scalars))  # derived before the forward: refusals raise here
    out = DerivedBackward.apply(spec, given, scalars, training, *wanted)
    return out[0] if len(out) == 1 else out


def _transformed() -> bool:
    """Whether a torch.func transform is on (torch has no public flag for it)."""
    return torch._C._are_functorch_transforms_active()


def again(spec: CompiledSpec, ctx, tensors, held) -> list:
    """What the forward kept, computed again from the inputs with autograd's record (a double
    backward differentiates through it), and the masks the forward drew, as they were."""
    masks = list(held[len(compiled(spec, ctx.training, learnt(ctx.scalars))[0].kept) :])
    return forward(spec, ctx.training, tensors, masks, ctx.given, ctx.scalars)[1] + masks


class DerivedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, given: dict, scalars: dict, training: bool, *tensors: torch.Tensor):
        ctx.spec, ctx.given, ctx.scalars, ctx.training = spec, given, scalars, training
        tensors = tensors[: len(spec.arguments)]  # then the learnt scalars, as in `scalars`
        masks = drawn(spec, training, tensors, given, scalars)
        out, kept = forward(spec, training, tensors, masks, given, scalars)
        ctx.save_for_backward(*tensors, *kept, *masks)
        ctx.mark_non_differentiable(*(o for o in out if not o.is_floating_point()))
        return out

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        spec, saved = ctx.spec, ctx.saved_tensors
        derived, _ = compiled(spec, ctx.training, learnt(ctx.scalars))
        tensors, held = saved[: len(spec.arguments)], saved[len(spec.arguments) :]
        if torch.is_grad_enabled():  # a double backward: what was kept, with its history
            held = again(spec, ctx, tensors, held)
        outputs = list(spec.ir.outputs)
        cots = [cotangents[outputs.index(t)] for t in derived.given]
        found = _backward(spec, ctx.training, tensors, held, cots, ctx.given, ctx.scalars)
        wanted = ctx.needs_input_grad[4:]
        names = [*spec.arguments, *sorted(learnt(ctx.scalars))]
        grads = [found.get(name) if w else None for name, w in zip(names, wanted)]
        return (None, None, None, None, *grads)
