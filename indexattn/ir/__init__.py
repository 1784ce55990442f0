"""Syntax -> meaning: indices with sympy sizes, tensors with roles, equations checked by the
rules of Einstein summation. Every later stage reads this, never the syntax tree alone."""

from .check import check
from .nodes import (
    CONDITIONS,
    Apply,
    At,
    Concat,
    Equation,
    Field,
    Index,
    Node,
    Product,
    Reduce,
    Ref,
    Scalar,
    Spec,
    Sum,
    Tensor,
    batched,
    children,
    is_condition,
    refs,
    renamed,
    walk,
)
from .sequence import sequence_indices

__all__ = [
    "CONDITIONS",
    "Apply",
    "At",
    "Concat",
    "Equation",
    "Field",
    "Index",
    "Node",
    "Product",
    "Reduce",
    "Ref",
    "Scalar",
    "Spec",
    "Sum",
    "Tensor",
    "batched",
    "check",
    "children",
    "is_condition",
    "refs",
    "renamed",
    "sequence_indices",
    "walk",
]
