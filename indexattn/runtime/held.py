"""What `spec.module(...)` builds its parameters and buffers from, as plain data kept in the
compile cache (cache.py): each one's shape, dtype, initialiser and fan-in as size trees
(indexattn/sizes.py), so a module is built with no sympy. Built from the checked spec on a
cache miss by `held`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..sizes import Tree

if TYPE_CHECKING:
    import sympy

    from .. import ir


@dataclass(frozen=True)
class Held:
    """A param or buffer: what SpecModule makes of it."""

    ascii: str
    text: str  # `W_<(μa)i>`, as a message names it
    integer: bool  # an int buffer
    shape: tuple[Tree, ...]
    init: tuple[str, tuple[float, ...]] | None  # kind and arguments; None: nn.Linear's
    fans: tuple[Tree, ...]  # its own fan-in alone, else its equation's params' (largest known)


@dataclass(frozen=True)
class Layer:
    buffers: tuple[Held, ...]
    params: tuple[Held, ...]
    spelled: tuple[tuple[str, str], ...]  # each size's ASCII name and its name as written


def layer(spec: ir.Spec) -> Layer:
    """The params and buffers of a checked spec as plain data."""
    names = spec.size_names
    return Layer(
        buffers=tuple(_held(spec, t, names) for t in spec.tensors_of("buffer")),
        params=tuple(_held(spec, t, names) for t in spec.tensors_of("param")),
        spelled=tuple((a, str(s)) for s, a in names.items()),
    )


def _held(spec: ir.Spec, tensor: ir.Tensor, names: dict[sympy.Symbol, str]) -> Held:
    from ..ir.shapes import tree

    init = tensor.init
    return Held(
        ascii=tensor.ascii,
        text=repr(tensor),
        integer=tensor.dtype == "int",
        shape=tuple(tree(s, names) for s in tensor.shape),
        init=None if init is None else (init.kind, tuple(init.args)),
        fans=tuple(tree(fan, names) for fan in _fans(spec, tensor)),
    )


def _fans(spec: ir.Spec, tensor: ir.Tensor) -> list[sympy.Expr]:
    """nn.Linear's in_features: the size of a param's axes that its product sums over; a param
    summed over nothing (a bias) takes the largest fan-in of a weight in its equation whose
    sizes are known, as nn.Linear's bias does (none: 1)."""
    import sympy

    from .. import ir

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
        chosen = own[:1] or [fan for _, fan in fans if fan]
        return [sympy.Mul(*(i.size for i in fan)) for fan in chosen]
    return []
