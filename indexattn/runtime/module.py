"""A compiled spec as an nn.Module: params become nn.Parameters and buffers are registered
under the spec's own names (so state_dict keys are the spec's), initialised as declared.

Parameters and buffers live only in `_parameters` and `_buffers`, never as attributes set on
the instance, and scalars in `self.scalars`: a spec name such as `forward`, `to`, `spec` or
`train` is a state_dict key and cannot replace a method or an attribute of the module."""

from __future__ import annotations

import math

import sympy
import torch
from torch import nn

from .. import ir
from ..sizes import whole
from .compiled import CompiledSpec


class SpecModule(nn.Module):
    """The spec as a layer; `module.scalars` holds the scalars (p, w, ...) it calls with."""

    def __init__(self, spec: CompiledSpec, /, **kwargs) -> None:
        super().__init__()
        self.spec = spec
        ir_spec = spec.ir
        size_names = {a: s for s, a in ir_spec.size_names.items()}
        self.sizes = {
            k: whole(spec.name, k, kwargs.pop(k)) for k in list(kwargs) if k in size_names
        }
        values = {size_names[k]: v for k, v in self.sizes.items()}
        self.scalars = {s.ascii: float(kwargs.pop(s.ascii, s.value)) for s in ir_spec.scalars}
        buffers = {t.ascii: kwargs.pop(t.ascii, None) for t in ir_spec.tensors_of("buffer")}
        if kwargs:
            raise TypeError(f"{spec.name}.module() got unexpected keywords: {', '.join(kwargs)}")
        self._inputs = tuple(t.ascii for t in ir_spec.tensors_of("input"))
        # each argument of the function: the position of an input, or the name of a tensor held
        self._order = tuple(
            self._inputs.index(t.ascii) if t.role == "input" else t.ascii for t in ir_spec.arguments
        )
        for tensor in ir_spec.tensors_of("buffer"):
            data = buffers[tensor.ascii]
            shape = _shape(tensor, values, spec.name)
            kind = torch.long if tensor.dtype == "int" else None
            self._buffers[tensor.ascii] = (
                data if data is not None else torch.zeros(shape, dtype=kind)
            )
        for tensor in ir_spec.tensors_of("param"):
            param = nn.Parameter(torch.empty(_shape(tensor, values, spec.name)))
            _initialise(param, tensor, fan_in(ir_spec, tensor, values))
            self._parameters[tensor.ascii] = param

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        if not kwargs and len(args) == len(self._inputs) and all(map(_is_tensor, args)):
            # The common call, in few Python steps: its cost is per call, like a kernel launch.
            held = {**self._parameters, **self._buffers}
            tensors = [args[k] if isinstance(k, int) else held[k] for k in self._order]
            return self.spec._run(tensors, self.sizes, self.scalars, self.training)
        return self._forward(args, kwargs)

    def _forward(self, args: tuple, kwargs: dict):
        """Inputs by keyword, and wrong calls: every check of the spec's own call."""
        if len(args) > len(self._inputs):
            raise TypeError(
                f"{self.spec.name} takes {len(self._inputs)} inputs ({', '.join(self._inputs)}),"
                f" got {len(args)}"
            )
        kwargs.update(zip(self._inputs, args))
        kwargs.update({**self._parameters, **self._buffers})
        return self.spec(training=self.training, **self.sizes, **self.scalars, **kwargs)

    def extra_repr(self) -> str:
        return f"spec={self.spec.name}, " + ", ".join(f"{k}={v}" for k, v in self.sizes.items())


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _shape(tensor: ir.Tensor, values: dict, name: str) -> tuple[int, ...]:
    shape = [s.subs(values) for s in tensor.shape]
    missing = sorted({str(x) for s in shape for x in s.free_symbols})
    if missing:
        raise TypeError(
            f"{name}.module() needs the size{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} to build {tensor!r}: pass "
            + ", ".join(f"{m}=..." for m in missing)
        )
    return tuple(int(s) for s in shape)


def fan_in(spec: ir.Spec, tensor: ir.Tensor, values: dict) -> int:
    """nn.Linear's in_features: the size of a param's axes that its product sums over; a param
    summed over nothing (a bias) takes the fan-in of a weight in its equation, as nn.Linear's
    bias does."""
    for eq in spec.equations:
        if all(ref.tensor != tensor for ref in ir.refs(eq.rhs)):
            continue
        fans = [
            (f.tensor, set(p.summed) & set(f.tensor.indices))
            for p in ir.walk(eq.rhs)
            if isinstance(p, ir.Product)
            for f in p.factors
            if isinstance(f, ir.Ref) and f.tensor.role == "param"
        ]
        own = [fan for t, fan in fans if t == tensor and fan]
        known = [_size(fan, values) for _, fan in fans if fan and _known(fan, values)]
        return _size(own[0], values) if own else max(known, default=1)
    return 1


def _known(indices: set[ir.Index], values: dict) -> bool:
    return all(s in values for i in indices for s in i.size.free_symbols)


def _size(indices: set[ir.Index], values: dict) -> int:
    return int(sympy.Mul(*(i.size for i in indices)).subs(values))


def _initialise(param: nn.Parameter, tensor: ir.Tensor, fan: int) -> None:
    init = tensor.init
    with torch.no_grad():
        if init is None:
            bound = 1 / math.sqrt(fan) if fan > 0 else 0.0
            nn.init.uniform_(param, -bound, bound)
        elif init.kind == "normal":
            nn.init.normal_(param, *init.args)
        elif init.kind == "uniform":
            nn.init.uniform_(param, *init.args)
        else:
            nn.init.constant_(param, 0.0 if init.kind == "zeros" else 1.0)
