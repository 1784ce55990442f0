"""A compiled spec as an nn.Module: params become nn.Parameters and buffers are registered
under the spec's own names (so state_dict keys are the spec's), initialised as declared.

Parameters and buffers live only in `_parameters` and `_buffers`, never as attributes set on
the instance, and scalars in `self.scalars`: a spec name such as `forward`, `to`, `spec` or
`train` is a state_dict key and cannot replace a method or an attribute of the module.

Built from the spec's plain data (held.py), never its IR: on a compile-cache hit, no sympy."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from ..sizes import evaluate, names, whole
from .cache import Plain
from .held import Held


class Runs(Protocol):
    """What a layer needs of its compiled spec (compiled.py's CompiledSpec, which builds it)."""

    name: str
    plain: Plain

    def _run(self, tensors: Sequence[torch.Tensor], given: dict, scalars: dict, training: bool):
        """The generated function on tensors in argument order."""

    def _module_markdown(self, parameters: int, sizes: dict[str, int]) -> str:
        """A layer's page in a notebook (indexattn/spec.py's CompiledSpec)."""


class SpecModule(nn.Module):
    """The spec as a layer; `module.scalars` holds the scalars (p, w, ...) it calls with."""

    def __init__(self, spec: Runs, /, **kwargs) -> None:
        super().__init__()
        self.spec = spec
        plain, layer = spec.plain, spec.plain.layer
        self.sizes = {
            k: whole(spec.name, k, kwargs.pop(k)) for k in list(kwargs) if k in plain.sizes
        }
        self.scalars = {s: float(kwargs.pop(s, value)) for s, value in plain.scalars}
        buffers = {t.ascii: kwargs.pop(t.ascii, None) for t in layer.buffers}
        if kwargs:
            raise TypeError(f"{spec.name}.module() got unexpected keywords: {', '.join(kwargs)}")
        held = {t.ascii for t in (*layer.buffers, *layer.params)}
        self._inputs = tuple(a for a in plain.arguments if a not in held)
        # each argument of the function: the position of an input, or the name of a tensor held
        self._order = tuple(a if a in held else self._inputs.index(a) for a in plain.arguments)
        spelled = dict(layer.spelled)
        for tensor in layer.buffers:
            data = buffers[tensor.ascii]
            shape = _shape(tensor, self.sizes, spelled, spec.name)
            kind = torch.long if tensor.integer else None
            self._buffers[tensor.ascii] = (
                data if data is not None else torch.zeros(shape, dtype=kind)
            )
        for tensor in layer.params:
            param = nn.Parameter(torch.empty(_shape(tensor, self.sizes, spelled, spec.name)))
            _initialise(param, tensor, fan_in(tensor, self.sizes))
            self._parameters[tensor.ascii] = param
        self.register_load_state_dict_pre_hook(_dotted_keys)
        self._sign()

    def _sign(self) -> None:
        """`module.forward` with the inputs by name, so that inspect.signature, IDEs and
        torch.export's dynamic shapes (`{"X": {1: Dim("N")}}`) see them: the class's forward
        (whatever class the module has become: sharded, fully_shard's), bound with the
        spec's signature. Not pickled: rebuilt on loading."""
        forward = functools.partial(_class_forward, self)
        inputs = [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self._inputs
        ]
        scalars = [
            inspect.Parameter(s, inspect.Parameter.KEYWORD_ONLY, default=v)
            for s, v in self.scalars.items()
        ]
        forward.__signature__ = inspect.Signature(inputs + scalars)  # type: ignore[attr-defined]
        self.__dict__["forward"] = forward

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("forward", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._sign()

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
        scalars = self._call_scalars(kwargs)
        return self.spec(training=self.training, **self.sizes, **scalars, **kwargs)

    def _call_scalars(self, kwargs: dict) -> dict:
        """The scalars of one call, taken out of `kwargs`: a scalar given to this call wins
        over the module's, for this call only."""
        return {**self.scalars, **{s: kwargs.pop(s) for s in self.scalars if s in kwargs}}

    def _repr_markdown_(self) -> str:
        """In a notebook: the spec's title, description and equations, then the parameters
        this module holds, counted, and the spec's formula for them (indexattn.spec's
        CompiledSpec writes it: the runtime imports no view)."""
        count = sum(p.numel() for p in self.parameters())
        return self.spec._module_markdown(count, self.sizes)

    def extra_repr(self) -> str:
        return f"spec={self.spec.name}, " + ", ".join(f"{k}={v}" for k, v in self.sizes.items())


def _class_forward(module: SpecModule, /, *args, **kwargs):
    return type(module).forward(module, *args, **kwargs)


def _dotted_keys(module: SpecModule, state: dict, prefix: str, *args) -> None:
    """load_state_dict: a layer's own keys (q_proj.weight) load as the spec's names, dots made
    underscores (q_proj_weight), as a spec's ASCII names spell them."""
    for key in [k for k in state if k.startswith(prefix) and "." in k[len(prefix) :]]:
        name = key[len(prefix) :].replace(".", "_")
        if name in module._parameters or name in module._buffers:
            state[prefix + name] = state.pop(key)


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _shape(tensor: Held, values: dict, spelled: dict, name: str) -> tuple[int, ...]:
    missing = sorted({spelled[x] for s in tensor.shape for x in names(s) if x not in values})
    if missing:
        raise TypeError(
            f"{name}.module() needs the size{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} to build {tensor.text}: pass "
            + ", ".join(f"{m}=..." for m in missing)
        )
    return tuple(evaluate(s, values) for s in tensor.shape)


def fan_in(tensor: Held, values: dict) -> int:
    """nn.Linear's in_features, at the given sizes (see held.py)."""
    known = [evaluate(fan, values) for fan in tensor.fans if names(fan) <= values.keys()]
    return max(known, default=1)


def _initialise(param: nn.Parameter, tensor: Held, fan: int) -> None:
    with torch.no_grad():
        if tensor.init is None:
            bound = 1 / math.sqrt(fan) if fan > 0 else 0.0
            nn.init.uniform_(param, -bound, bound)
            return
        kind, args = tensor.init
        if kind == "normal":
            nn.init.normal_(param, *args)
        elif kind == "uniform":
            nn.init.uniform_(param, *args)
        else:
            nn.init.constant_(param, 0.0 if kind == "zeros" else 1.0)
