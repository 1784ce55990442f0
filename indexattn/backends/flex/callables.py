"""FlexAttention's callables of a spec, for FlexAttention users who want only those:
`spec.score_mod(**inputs)`, `spec.mask_mod(**inputs)`, `spec.block_mask(**sizes_and_inputs)`
(runtime/compiled.py) call `score_mod`, `mask_mod` and `block_mask` here."""

from __future__ import annotations

import functools
import math

import sympy

from ...ir import Spec
from . import core as _core
from . import masks, mods
from .core import Core


@functools.lru_cache(maxsize=64)
def cores_of(spec: Spec) -> tuple[Core, ...]:
    """The cores of the spec's canonical form (Refused, with the reason, where none)."""
    from ...lower.planner import canonical

    return _core.cores(canonical.canonical(spec))


def one_core(spec: Spec, which: int | None = None) -> Core:
    found = cores_of(spec)
    if which is None and len(found) > 1:
        last = len(found) - 1
        raise ValueError(
            f"{spec.name} has {len(found)} attention cores: say which, core=0 to {last}"
        )
    return found[which or 0]


def _values(spec: Spec, core: Core, given: dict) -> dict:
    """The spec's names -> values: the scalars' defaults, then what was given; tensors the core
    reads with their batch axes flattened into one (FlexAttention's b)."""
    values = {s.ascii: s.value for s in spec.scalars} | dict(given)
    for tensor in core.tensors:
        x = values.get(tensor.ascii)
        if x is not None and tensor.batched:
            own = sum(1 for _ in tensor.layout)
            values[tensor.ascii] = x.reshape(-1, *x.shape[x.dim() - own :])
    return values


def _function(source: mods.Source, values: dict):
    import torch

    namespace = {"torch": torch, "math": math}
    exec(compile(source.text, f"<indexattn {source.name}>", "exec"), namespace)
    missing = [name for _, name in source.keywords if name not in values]
    if missing:
        raise TypeError(f"{source.name} reads {', '.join(missing)}: pass {missing[0]}=...")
    return functools.partial(namespace[source.name], **source.bind(values))


def score_mod(spec: Spec, core: int | None = None, **values):
    """FlexAttention's `score_mod` of the spec's attention core: its score changes (caps,
    biases, slopes) at one score, the tensors it reads bound from `values`."""
    found = one_core(spec, core)
    return _function(mods.score_mod(spec, found), _values(spec, found, values))


def mask_mod(spec: Spec, core: int | None = None, **values):
    """FlexAttention's `mask_mod` of the spec's attention core (True: the key is seen)."""
    found = one_core(spec, core)
    return _function(mods.mask_mod(spec, found), _values(spec, found, values))


def block_mask(
    spec: Spec, core: int | None = None, *, BLOCK_SIZE: int = 128, device=None, **values
):
    """The spec's BlockMask at the sizes and inputs given, read off its mask's box bounds."""
    import torch

    found = one_core(spec, core)
    given = _values(spec, found, values)
    source, stats = mods.box(spec, found)
    reads = tuple((st.lo, st.hi, st.side, given[st.tensor]) for st in stats)
    device = device or (reads[0][3].device if reads else "cpu")
    n_q, n_kv = (_length(spec, found, i, given, stats) for i in (found.query, found.key))
    batch = max([x.shape[0] for *_, x in reads] or [1])
    keep_reads = found.keep.free_symbols if found.keep is not None else set()
    reads_head = any(i.symbol in keep_reads for i in found.head_indices)
    heads = (
        int(_size(spec, sympy.Mul(*(i.size for i in found.head_indices)), given))
        if reads_head
        else 1
    )
    keep = _function(mods.mask_mod(spec, found), given)
    box = _function(source, given | {n: None for st in stats for n in (st.lo, st.hi)})
    with torch.no_grad():
        return masks.build(
            keep,
            box,
            reads,
            batch=batch,
            heads=heads,
            n_q=n_q,
            n_kv=n_kv,
            block=BLOCK_SIZE,
            device=device,
        )


def _size(spec: Spec, expr: sympy.Basic, given: dict) -> int:
    names = dict(zip(spec.sizes, spec.size_asciis))
    missing = [names[s] for s in expr.free_symbols if names.get(s) not in given]
    if missing:
        raise TypeError(f"{spec.name}: pass the size {missing[0]}=...")
    return int(expr.xreplace({s: given[names[s]] for s in expr.free_symbols}))


def _length(spec: Spec, core: Core, index, given: dict, stats) -> int:
    """An index's length: its size given by name, else the length of a tensor read along it."""
    side = "q" if index == core.query else "k"
    for stat in stats:
        names = dict(zip(spec.sizes, spec.size_asciis))
        if stat.side == side and names.get(index.size) not in given:
            return given[stat.tensor].shape[-1]
    return _size(spec, index.size, given)
