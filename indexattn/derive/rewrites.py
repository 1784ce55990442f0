"""The rewrites of the derived backward, in the order they apply (as lower/passes' PASSES):
reverse mode proper (derive/reverse.py) writes each step plainly; each rewrite writes one
step otherwise, with what it keeps true. tests/test_derive_rewrites.py checks the backward
against the literal interpreter after each, on the shipped specs and random ones, and a
wrong rewrite planted in the list is caught and named."""

from __future__ import annotations

from .reverse import Rewrite

BACKWARD_REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        "guard",
        "branches",
        "guarded_branches",
        "a where's branch is differentiated at the finite value the forward evaluates it at "
        "where it is not chosen: equal values, and no 0 × inf",
    ),
    Rewrite(
        "flash",
        "rows",
        "flash",
        "softmax's row sum Σ_j A dA is Σ dO O where A is read once, by O = A V "
        "(FlashAttention's D): equal by the product rule",
    ),
    Rewrite(
        "stack",
        "sums",
        "regroup",
        "terms that differ in their cotangent and one constant along one index are one "
        "product over it, the cotangents stacked: the same sum, one contraction",
    ),
    Rewrite(
        "reverse_cumsum",
        "running",
        "flipped",
        "cumsum's cotangent is the running sum read backwards, read backwards: the same sum "
        "without the total's cancellation",
    ),
)
NAMES = tuple(r.name for r in BACKWARD_REWRITES)
