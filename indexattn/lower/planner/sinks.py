"""Attention sinks: a softmax times σ(L - x), with L the logsumexp of the same scores over the
same axis and x free of it, is the softmax with x as one more logit in its denominator,

    softmax_j(S) σ(L - x) = exp(S_j) / (Σ_k exp(S_k) + exp(x)),

which the planner computes as GPT-OSS's code does: the softmax over the scores with x as one
more column, that column dropped after. L itself is never computed where nothing else reads
it: torch.logsumexp's exp of masked (-inf) scores is several times slower than the softmax's,
and its backward more so (docs/decisions.md, "Attention sinks as one more column")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ... import ir
from ...ir import Equation, Index, Spec
from ...ir.einstein import signed
from .fusion import read_counts, renaming


@dataclass(frozen=True)
class Sink:
    """`softmax_<over>(scores) σ(lse - logit)`: what the softmax runs over, and the logsumexp
    term as written (a reference to its tensor, or the reduction itself)."""

    scores: ir.Node
    over: Index
    logit: ir.Node
    lse: ir.Node


def sink(node: ir.Node, defined: dict[str, Equation]) -> Sink | None:
    """The sink a product of a softmax and a sigmoid computes, or None."""
    if not isinstance(node, ir.Product) or node.summed or len(node.factors) != 2:
        return None
    soft = [f for f in node.factors if _one_axis(f, "softmax")]
    gate = [f for f in node.factors if isinstance(f, ir.Apply) and f.fn == "sigmoid"]
    if len(soft) != 1 or len(gate) != 1 or not isinstance(gate[0].args[0], ir.Sum):
        return None
    terms = [signed(t) for t in gate[0].args[0].terms]
    lse = [t for t, sign in terms if sign == 1]
    rest = tuple(t for t, sign in terms if sign == -1)
    softmax = soft[0]
    if len(lse) != 1 or _logsumexp(lse[0], softmax.over[0], defined) != softmax.body:
        return None
    logit = rest[0] if len(rest) == 1 else ir.Sum(rest, gate[0].span)
    rows = set(softmax.body.free) - {softmax.over[0]}  # one logit per row, no axes of its own
    if not set(logit.free) <= rows or (ir.batched(logit) and not ir.batched(softmax.body)):
        return None
    return Sink(softmax.body, softmax.over[0], logit, lse[0])


def absorbed(spec: Spec, defined: dict[str, Equation]) -> set[str]:
    """The logsumexps that only sinks read: their tensors are never computed."""
    found = (sink(node, defined) for eq in spec.equations for node in ir.walk(eq.rhs))
    sunk = Counter(s.lse.tensor.name for s in found if s and isinstance(s.lse, ir.Ref))
    read = read_counts(spec)
    return {name for name, n in sunk.items() if n == read[name]}


def _one_axis(node: ir.Node, fn: str) -> bool:
    return isinstance(node, ir.Reduce) and node.fn == fn and len(node.over) == 1


def _logsumexp(node: ir.Node, over: Index, defined: dict[str, Equation]) -> ir.Node | None:
    """What a logsumexp over `over` runs over: written here, or the right-hand side of a
    tensor read here that is one over a plain reference (renamed to the indices written here,
    its own axis to `over`); None for anything else."""
    if _one_axis(node, "logsumexp"):
        return node.body if node.over[0] == over else None
    if not isinstance(node, ir.Ref) or node.tensor.name not in defined:
        return None
    rhs, rename = defined[node.tensor.name].rhs, renaming(node)
    if not _one_axis(rhs, "logsumexp") or not isinstance(rhs.body, ir.Ref) or rename is None:
        return None
    if over in rename.values() or renaming(rhs.body) is None:
        return None
    rename[rhs.over[0]] = over
    axes = tuple(tuple(rename.get(i, i) for i in axis) for axis in rhs.body.axes)
    return ir.Ref(rhs.body.tensor, axes, rhs.body.span)
