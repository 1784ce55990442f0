"""IR/plan -> symbolic counts: learnable parameters, and floating-point operations counted
along the steps the generated code takes, each step kind costed by a registered function.

FLOPs are those of one forward pass in eval mode for one batch element (inputs without
leading batch axes), as sympy expressions in the size symbols:

- a contraction of two operands: 2 per multiply-add (2·M·N·K for a matrix product), over the
  pairwise path the plan took; a product that sums nothing: 1 per multiply; a scale
  (`/ sqrt(d_k)`): 1 per element of the result;
- softmax: 5 per element (max, subtract, exp, sum, divide), also when masked rows are guarded;
  logsumexp: 4 per element; sum, max, min, mean: 1 per element reduced;
- a scatter-add (`sum_<J>(where(b == P, E, 0))`): 1 per element of E and 3 per position (the
  test that it is in range);
- sums of terms: 1 per addition and element; elementwise functions, comparisons, `where`:
  1 per element; dropout: 0 (the identity in eval mode);
- masks and other index-variable fields: sympy's `count_ops` of the expression (at least 1)
  per element;
- a prefix sum read through a product, by chunks of C = 64 positions, N padded to whole
  chunks: per padded position, 2·d_a·d_b for the chunk's sum, 2·C·d_a for the scores,
  2·C·d_b for them times G, 2·d_a·d_b for H times the sum before, d_b to add the two;
  per chunk, d_a·d_b for the cumsum over chunks; keeping the scores up to the query, none;
- splitting and merging fused axes, renaming axes: 0 (they move data, no arithmetic).

A step kind without a registered cost raises: register one with `@step_cost.register`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch

import sympy

from ..ir import Index, Spec, Tensor
from ..ir.shapes import honouring
from ..lower.program.program import Block, Program
from ..lower.program.steps import (
    SCORE,
    Add,
    Attention,
    Cat,
    Choose,
    Contract,
    Convolve,
    Elementwise,
    Flex,
    Flip,
    Full,
    Fuse,
    Gather,
    Grid,
    Linear,
    Operand,
    Pad,
    PrefixProduct,
    Reduction,
    Rename,
    Scatter,
    Slice,
    SoftmaxValues,
    Spans,
    Split,
    Stack,
    Unfuse,
    Whole,
)
from ..ops import REDUCTIONS, lookup

SOFTMAX_PER_ELEMENT = REDUCTIONS["softmax"].flops

# Sizes for numbers in `indexattn count`, `latex --pdf` and `docs` when none are given:
# GPT-2 small (n_embd 768, n_head 12, head width 64, n_ctx 1024) under the names the shipped
# specs use; grouped-query heads as 4 groups of 3 (12 query heads). Any other size: 64.
DEFAULT_SIZES = {
    **dict.fromkeys(("N", "N_q", "N_kv", "L", "n_ctx", "T"), 1024),
    **dict.fromkeys(("d", "d_m", "d_model", "d_in", "d_out", "d_q", "d_c", "n_embd"), 768),
    **dict.fromkeys(("h", "n_head", "n_heads"), 12),
    **dict.fromkeys(("d_k", "d_v", "d_head"), 64),
    "h_kv": 4,
    "n_rep": 3,
}
FALLBACK_SIZE = 64
SIZES_NOTE = (
    "Numbers are at GPT-2 small sizes where the spec's sizes have those names (sequence "
    "1024, width 768, 12 heads of width 64; grouped-query heads as 4 groups of 3), else 64, "
    "unless given with --size NAME=VALUE."
)
FLOP_NOTE = (
    "FLOPs of one forward pass in eval mode, per batch element, along the steps the "
    "generated code takes: 2 per multiply-add, 5 per softmax element, 1 per element of "
    "other elementwise operations and sums, none for dropout and rearranging."
)


@dataclass(frozen=True)
class Cost:
    """FLOPs of one step: the matrix-product part (what torch's FlopCounterMode counts) and
    the rest."""

    matmul: sympy.Expr = sympy.S.Zero
    other: sympy.Expr = sympy.S.Zero

    @property
    def total(self) -> sympy.Expr:
        return sympy.expand(self.matmul + self.other)

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            sympy.expand(self.matmul + other.matmul), sympy.expand(self.other + other.other)
        )


# -- parameters


def param_count(spec: Spec) -> sympy.Expr:
    """The number of learnable numbers, in the size symbols.

    >>> from indexattn.ir import check
    >>> text = "index i, j : d\\ninput x_<i>\\nparam W_<ji>\\ny_<j> = W_<ji> x_<i>"
    >>> param_count(check(text, "linear"))
    d**2
    """
    return sympy.expand(sympy.Add(*(count for _, count in params(spec))))


def params(spec: Spec) -> tuple[tuple[Tensor, sympy.Expr], ...]:
    """Each param with its number of elements."""
    return tuple((t, sympy.Mul(*t.shape)) for t in spec.tensors_of("param"))


# -- FLOPs


def flops(plan: Program) -> sympy.Expr:
    """Floating-point operations of one forward pass, per batch element.

    >>> from indexattn.ir import check
    >>> from indexattn.lower.pipeline import plan as make_plan
    >>> text = "index i, j : d\\nindex t : n\\ninput x_<ti>\\nparam W_<ji>\\ny_<tj> = W_<ji> x_<ti>"
    >>> flops(make_plan(check(text, "linear")))
    2*d**2*n
    """
    return sum((cost for _, cost in block_costs(plan)), Cost()).total


def block_costs(plan: Program) -> tuple[tuple[Block, Cost], ...]:
    """The cost of each block of the plan (one equation, or several the plan computes
    together), in order."""
    return tuple((b, sum(map(step_cost, b.steps), Cost())) for b in plan.blocks)


@singledispatch
def step_cost(step) -> Cost:
    """The FLOPs of one plan step; step kinds register their own."""
    raise NotImplementedError(
        f"no FLOP count for the plan step kind {type(step).__name__}: register one in "
        "indexattn/views/cost.py with @step_cost.register"
    )


def elements(indices) -> sympy.Expr:
    """The number of elements spanned by some indices."""
    return sympy.Mul(*(i.size for i in indices))


def _size(operand: Operand) -> sympy.Expr:
    return elements(operand.dims)


@step_cost.register
def _(step: Contract) -> Cost:
    scale = _size(step.out) if step.scale != 1 else sympy.S.Zero
    if len(step.args) < 2:
        return Cost(other=scale)
    every: dict[Index, None] = dict.fromkeys(i for a in step.args for i in a.dims)
    space = elements(every)
    if set(every) - set(step.out.dims):
        return Cost(matmul=2 * (len(step.args) - 1) * space, other=scale)
    return Cost(other=(len(step.args) - 1) * space + scale)


@step_cost.register
def _(step: Choose) -> Cost:
    """The branch the sizes choose, as a piecewise count."""
    costs = [sum(map(step_cost, branch), Cost()) for branch in step.branches]
    conditions = (*step.conditions, sympy.true)
    return Cost(
        sympy.Piecewise(*((c.matmul, w) for c, w in zip(costs, conditions))),
        sympy.Piecewise(*((c.other, w) for c, w in zip(costs, conditions))),
    )


@step_cost.register
def _(step: Add) -> Cost:
    return Cost(other=(len(step.args) - 1) * _size(step.out))


@step_cost.register
def _(step: Elementwise) -> Cost:
    return Cost(other=lookup(step.fn).flops * _size(step.out))


@step_cost.register
def _(step: Reduction) -> Cost:
    """A softmax with a sink runs over one more column (lower/planner/sinks.py)."""
    size = _size(step.arg)
    if step.sink is not None:
        size = size / elements(step.over) * (elements(step.over) + 1)
    return Cost(other=REDUCTIONS[step.fn].flops * size)


@step_cost.register
def _(step: Spans) -> Cost:
    """One pass over the mask (`any` per block of queries); `Attention` counts every score,
    also those a block skips: how many it skips depends on the mask's values."""
    return Cost(other=_size(step.mask))


@step_cost.register
def _(step: Scatter) -> Cost:
    """An addition per element of what it adds, three comparisons per position (the range)."""
    return Cost(other=_size(step.arg) + 3 * _size(step.positions))


@step_cost.register
def _(step: Convolve) -> Cost:
    """A multiply-add per tap per result, as torch's FlopCounterMode counts a convolution."""
    taps = elements(s.offset for s in step.shifts)
    return Cost(matmul=2 * _size(step.out) * taps)


@step_cost.register
def _(step: Grid) -> Cost:
    return Cost(other=max(1, sympy.count_ops(step.expr)) * _size(step.out))


@step_cost.register(Cat)
@step_cost.register(Stack)
@step_cost.register(Pad)
@step_cost.register(Gather)
@step_cost.register(Flip)
@step_cost.register(Slice)
@step_cost.register(Whole)
@step_cost.register(Unfuse)
@step_cost.register(Fuse)
@step_cost.register(Split)
@step_cost.register(Rename)
@step_cost.register(Full)
def _(step) -> Cost:
    return Cost()


@step_cost.register
def _(step: Linear) -> Cost:
    bias = _size(step.out) if step.bias is not None else sympy.S.Zero
    return Cost(matmul=2 * _size(step.out) * elements(step.inner), other=bias)


@step_cost.register
def _(step: Attention) -> Cost:
    """Two matrix products (scores, weighted sum); per score: the scale, the mask added (none
    for is_causal, which only selects), the softmax; dropout is the identity in eval mode.
    Values padded to the features' width (`cut`) are multiplied at that width where wider."""
    scores = elements(step.q_dims) * elements(step.k_dims[-1:])
    features = sum(elements(w) for w in step.widths)
    values = elements(step.v_dims[-1:])
    values = sympy.Max(features, values) if step.cut else values
    matmul = 2 * scores * (features + values)
    per_score = 1 + (step.mask is not None) + SOFTMAX_PER_ELEMENT
    return Cost(matmul=matmul, other=per_score * scores)


@step_cost.register
def _(step: Flex) -> Cost:
    """As `Attention`'s, every score counted (the blocks a mask hides are skipped at run
    time), one more per score for the score's changes where it has any."""
    scores = elements(step.q_dims) * elements(step.k_dims[-1:])
    features = sum(elements(w) for w in step.widths)
    matmul = 2 * scores * (features + elements(step.v_dims[-1:]))
    per_score = 1 + (step.keep is not None) + (step.score != SCORE) + SOFTMAX_PER_ELEMENT
    return Cost(matmul=matmul, other=per_score * scores)


@step_cost.register
def _(step: SoftmaxValues) -> Cost:
    """The softmax's and the product's, as the steps it replaces (dropout: none)."""
    weights, out = step.outs
    scores = _size(weights)
    return Cost(matmul=2 * scores * out.dims[-1].size, other=SOFTMAX_PER_ELEMENT * scores)


@step_cost.register
def _(step: PrefixProduct) -> Cost:
    """The chunked algorithm as it runs, padding included (prefix.py); with a decay, the
    states carried by a product over the chunks and the decays multiplied in (its one chunk
    the whole sequence where that is shorter)."""
    chunk = step.chunk if step.rate is None else sympy.Min(step.chunk, step.over.size)
    chunks = sympy.ceiling(step.over.size / chunk)
    a, b = step.inner.size, step.out.dims[-1].size
    heads = elements(step.out.dims[:-2])
    matmul = 2 * heads * chunks * chunk * (2 * a * b + chunk * (a + b))
    if step.rate is None:
        other = heads * chunks * (chunk * b + REDUCTIONS["cumsum"].flops * a * b)
        return Cost(matmul=matmul, other=other)
    carry = 2 * heads * chunks * chunks * a * b
    other = heads * chunks * chunk * (chunk + 2 * a + b)
    return Cost(matmul=matmul + carry, other=other)


# -- sizes for numbers


def sizes_for(spec: Spec, given: dict[str, int] | None = None) -> dict[sympy.Symbol, int]:
    """A value for every size of the spec: the given ones (by spec or ASCII name), else the
    defaults above, raised where the spec's ranges ask (ir.shapes.honouring). Unknown names
    raise KeyError; given sizes that break a range, ValueError."""
    given = dict(given or {})
    by_name = size_names(spec)
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise KeyError(
            f"{spec.name} has no size {', '.join(unknown)}; its sizes are "
            + ", ".join(str(s) for s in spec.sizes)
        )
    values = {by_name[name]: int(value) for name, value in given.items()}
    chosen = {s: values.get(s, DEFAULT_SIZES.get(str(s), FALLBACK_SIZE)) for s in spec.sizes}
    return honouring(spec, chosen, {spec.size_ascii(s) for s in values})


def size_names(spec: Spec) -> dict[str, sympy.Symbol]:
    """Each size by its spec name and its ASCII name."""
    return {name: s for s, a in spec.size_names.items() for name in (str(s), a)}


def evaluate(expr: sympy.Expr, sizes: dict[sympy.Symbol, int]) -> int | sympy.Expr:
    """An integer at the sizes (scalars such as a window can stay symbolic)."""
    value = sympy.expand(sympy.sympify(expr).subs(sizes))
    return int(value) if value.is_Integer else value
