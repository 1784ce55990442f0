"""IR -> symbolic counts: parameters (and, with the plan, floating-point operations)."""

from __future__ import annotations

import sympy

from .ir import Spec


def param_count(spec: Spec) -> sympy.Expr:
    """The number of learnable numbers, in the size symbols.

    >>> from indexattn.ir import check
    >>> text = "index i, j : d\\ninput x_<i>\\nparam W_<ji>\\ny_<j> = W_<ji> x_<i>"
    >>> param_count(check(text, "linear"))
    d**2
    """
    return sympy.expand(sympy.Add(*(sympy.Mul(*t.shape) for t in spec.tensors_of("param"))))
