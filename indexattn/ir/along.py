"""Concatenation along an index, checked: each part has one index in the new index's place,
the parts share every other index, and their ranges add up to the new one's."""

from __future__ import annotations

import sympy

from ..notation import syntax as ast
from .nodes import Concat, Index, Node, batched
from .scope import Scope


def concat(scope: Scope, node: ast.Call, over: Index, parts: tuple[Node, ...]) -> Concat:
    """`concat_<σ>(Kc_<μca>, Kn_<μτa>)` with `index σ : N_c + N`."""
    common = set.intersection(*(set(p.free) for p in parts))
    along = []
    for part, written in zip(parts, node.args):
        rest = [i for i in part.free if i not in common]
        if len(rest) != 1 or over in part.free:
            raise scope.error(
                f"each part of concat_<{over.glyph}> has one index in {over.glyph}'s place, "
                "besides the indices all parts share",
                written.span,
                "e.g. concat_<σ>(Kc_<μca>, Kn_<μτa>): c and τ run along σ, μ and a are shared.",
            )
        along.append(rest[0])
    total = sympy.Add(*(i.size for i in along))
    if sympy.simplify(total - over.size) != 0:
        raise scope.error(
            f"{over.glyph} has range {over.size}, but the parts add up to {total}",
            node.span,
            f"declare index {over.glyph} : {total}.",
        )
    if len({batched(p) for p in parts}) > 1:
        raise scope.error(
            "the parts of a concat all carry the inputs' batch axes, or none does",
            node.span,
            "concatenate tensors computed from the same inputs.",
        )
    return Concat(over, parts, tuple(along), node.span)
