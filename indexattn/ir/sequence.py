"""Which indices of a spec run along the sequence: what the passes block by rows and what the
derived backward keeps rather than computes again (a value over at most one of them)."""

from __future__ import annotations

from .nodes import Index, Spec


def sequence_indices(spec: Spec) -> set[Index]:
    """Indices whose sizes no parameter has: positions in the inputs, not widths or heads."""
    fixed = {
        s
        for t in spec.tensors_of("param", "buffer")
        for axis in t.layout
        for index in axis
        for s in index.size.free_symbols
    }
    indices = {i for t in spec.tensors for axis in t.layout for i in axis}
    indices |= {i for eq in spec.equations for i in eq.indices}
    return {i for i in indices if i.size.free_symbols and not i.size.free_symbols & fixed}
