"""What a rule of reverse mode (derive/adjoints.py: a node kind's rule; derive/accumulate.py:
a tensor's cotangent summed and scattered) may ask of the walk that calls it (the Derivation
of derive/reverse.py): an interface, so that the walk imports its rules and no rule imports
the walk."""

from __future__ import annotations

from typing import Protocol

from ..errors import SpecError
from ..ir import Equation, Index, Node, Scalar, Tensor
from .cotangents import Cot, Part


class Written(Protocol):
    """The backward as it is written (reverse.py's Backward)."""

    equations: list
    masks: dict[int, Tensor]


class Walk(Protocol):
    eq: Equation | None  # the forward equation being differentiated
    out: Written
    parts: dict[Tensor, list[Part]]  # each tensor's cotangents, not yet summed
    names: dict[Tensor, Tensor]  # each tensor's cotangent, once summed
    taken: set[str]
    training: bool
    symbols: dict
    scalar_parts: dict[Scalar, list[Node]]

    def back(self, node: Node, cot: Cot) -> None: ...
    def into(self, node: Node, cot: Cot) -> Cot: ...
    def value(self, node: Node) -> Cot: ...
    def named(self, cot: Cot, node: Node) -> Cot: ...
    def materialize(self, cot: Cot, base: str, order) -> Cot: ...
    def needs(self, node: Node, among: set[Tensor] | None = None) -> bool: ...
    def precision(self) -> str: ...
    def rewritten(self, hook: str, plain, *context): ...
    def fresh(self, base: str) -> str: ...
    def fresh_index(self, index: Index) -> Index: ...
    def tensor(self, name: str, axes, role: str = "derived") -> Tensor: ...
    def refuse(self, what: str, node: Node, hint: str) -> SpecError: ...
