"""A spec run with its attention core on the printed Triton kernels: the other equations are
read literally (the oracle's interpreter, in torch, so autograd flows through them), the
core's equations are replaced by one call of the kernels, whose backward is theirs."""

from __future__ import annotations

import math

import torch

from ...ir import Spec
from ...ir.shapes import recipe, solve
from ...oracle.reference import Interpreter
from . import launch
from .core import COL, ROW, Core, Load, describe
from .emit import Kernels, generate
from .launch import Attention, Launch


def run(
    spec: Spec, /, *, training: bool = False, block: int | None = None, splits: int = 1, **kwargs
):
    """`run(spec, X=x, ...)` -> the spec's outputs, as the oracle's `evaluate` returns them.
    `block`: rows and keys per program (default `launch.BLOCK`, read per call); `splits`:
    the forward split over the keys in that many chunks (split-K, for decoding), combined
    after."""
    kernels = _kernels(spec)
    core = kernels.core
    arguments = {t.ascii: kwargs.pop(t.ascii) for t in spec.arguments}
    shapes = {name: tuple(value.shape) for name, value in arguments.items()}
    given = {name: value for name, value in kwargs.items() if name in spec.size_asciis}
    sizes = solve(spec, recipe(spec), shapes, given)
    given_scalars = {s.symbol: kwargs.get(s.ascii, s.value) for s in spec.scalars}
    scalars = {c: float(_detached(value)) for c, value in given_scalars.items()}
    like = arguments[spec.like.ascii]
    interpreter = Interpreter(sizes, scalars, like.dtype, like.device, training)
    held = {t.name: interpreter.unfuse(arguments[t.ascii], t) for t in spec.arguments}
    skipped = _skipped(spec, core)
    for eq in spec.equations:
        if eq.tensor.name in skipped:
            continue
        if eq is core.output:
            _no_dropout(core, {**sizes, **scalars}, training)
            held[eq.tensor.name] = (
                attend(kernels, held, {**sizes, **scalars}, block, splits, given_scalars),
                eq.indices,
            )
            continue
        held[eq.tensor.name] = (
            interpreter.align(interpreter.node(eq.rhs, held), eq.indices),
            eq.indices,
        )
    return tuple(interpreter.fuse(held[t.name][0], t) for t in spec.outputs)


def _detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


_CACHE: dict[int, Kernels] = {}


def _kernels(spec: Spec) -> Kernels:
    key = id(spec)
    if key not in _CACHE or _CACHE[key].core.spec is not spec:
        _CACHE[key] = generate(describe(spec))
    return _CACHE[key]


def _skipped(spec: Spec, core: Core) -> set[str]:
    """The covered tensors nothing else reads (nor the outputs): never computed."""
    covered = set(core.covered)
    readers: dict[str, set[str]] = {}
    for eq in spec.equations:
        for name in {r.tensor.name for r in _refs(eq.rhs)}:
            readers.setdefault(name, set()).add(eq.tensor.name)
    inside = covered | {core.output.tensor.name}
    outputs = {t.name for t in spec.outputs}
    return {n for n in covered if readers.get(n, set()) <= inside and n not in outputs}


def _refs(node):
    from ... import ir

    return ir.refs(node)


def _no_dropout(core: Core, values: dict, training: bool) -> None:
    why = refused_dropout(core, values, training)
    if why is not None:
        raise ValueError(f"the triton backend: {why}")


def refused_dropout(core: Core, values: dict, training: bool) -> str | None:
    """Why the kernels cannot run a call (values by symbol): dropout they do not print."""
    if core.dropout is not None and training and float(core.dropout.subs(values)) != 0:
        return (
            "dropout on the weights is not printed (no random numbers in the kernels yet); run "
            "with p=0 or in eval mode"
        )
    return None


def attend(
    kernels: Kernels,
    held: dict,
    values: dict,
    block: int | None = None,
    splits: int = 1,
    scalars: dict | None = None,
) -> torch.Tensor:
    """The core's output from the held values of its operands and loads, with axes
    (batch..., heads..., query, value width); `scalars`: the values given for the spec's
    scalars, tensors among them given their gradients by the kernels."""
    core = kernels.core
    q, k, v = (held[x.tensor.name][0] for x in (core.q, core.k, core.v))
    nq, nk = len(core.q.indices), len(core.k.indices)
    batch = torch.broadcast_shapes(
        q.shape[: q.dim() - nq], k.shape[: k.dim() - nk], v.shape[: v.dim() - nk]
    )
    heads = q.shape[q.dim() - nq : q.dim() - 2]
    q4, k4, v4 = (_four(t, batch, n) for t, n in ((q, nq), (k, nk), (v, nk)))
    shape = (math.prod(batch), q4.shape[1], q4.shape[2], k4.shape[2])
    sink = None
    if core.sink is not None:
        sink = _load(core, core.sink, held, batch, heads, shape)[..., 0]
    loads = [_load(core, x, held, batch, heads, shape) for _, x in kernels.loads]
    given = [(scalars or {}).get(c, 0.0) for c in kernels.scalars]
    learned = [t for t in (*loads, *given) if isinstance(t, torch.Tensor) and t.requires_grad]
    params = bool(learned) and torch.is_grad_enabled()
    block = launch.BLOCK if block is None else block
    launched = Launch(kernels, q4, k4, v4, sink, loads, values, block, splits, params)
    o = Attention.apply(launched, q4, k4, v4, sink, *loads, *given)
    return o.reshape(*batch, *heads, o.shape[2], o.shape[3])


def _four(t: torch.Tensor, batch, n: int) -> torch.Tensor:
    """[batch..., heads..., position, width] as [B, H, position, width]."""
    t = t.expand(*batch, *t.shape[t.dim() - n :])
    return t.reshape(math.prod(batch), -1, t.shape[-2], t.shape[-1])


def _load(core: Core, load: Load, held: dict, batch, heads, shape) -> torch.Tensor:
    """A load's values as a [B, H, N_Q, N_K] view: its axes moved to their places, size 1
    where it does not vary, then expanded."""
    value = held[load.tensor.name][0]
    n = len(load.at)
    places = [*(i.symbol for i in core.heads), ROW, COL]
    inner = value.shape[value.dim() - n :]
    value = value.expand(*batch, *inner) if value.dim() - n <= len(batch) else value
    order = sorted(range(n), key=lambda j: places.index(load.at[j]))
    value = value.permute(*range(len(batch)), *(len(batch) + j for j in order))
    have = [load.at[j] for j in order]
    full = [value.shape[len(batch) + have.index(p)] if p in have else 1 for p in places]
    value = value.reshape(*batch, *full)
    target = (*batch, *heads, shape[2], shape[3])
    return value.expand(target).reshape(shape)
