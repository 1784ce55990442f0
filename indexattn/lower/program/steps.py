"""The program's values: variables (named only when printed), operands and the step kinds.
Every value is frozen; what each kind is (reads, purity, views, ...) is in kinds.py."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ...ir import Index, Tensor


@dataclass(frozen=True)
class Var:
    """A variable of the generated code. `hint` says what it holds (a spec name, or
    `{tensor}_{what}` for a part of an equation); the code generator's name allocator turns
    hints into distinct identifiers. An argument's name is its hint, exactly."""

    id: int
    hint: str
    argument: bool = False

    def __str__(self) -> str:
        return self.hint if self.argument else f"{self.hint}#{self.id}"


@dataclass(frozen=True)
class Operand:
    """A variable with axes (..., *dims); `select` picks literal slices of its leading axes
    (None keeps an axis)."""

    var: Var
    dims: tuple[Index, ...]
    batched: bool
    select: tuple[int | sympy.Basic | None, ...] = ()


@dataclass(frozen=True)
class Number:
    """A tensor-free, index-free value: numbers, sizes and scalars."""

    expr: sympy.Basic


Arg = Operand | Number


@dataclass(frozen=True)
class Unfuse:
    """Split an argument's fused axes once: `rearrange(W, "(mu B a) i -> B mu a i", ...)`."""

    out: Operand
    tensor: Tensor


@dataclass(frozen=True)
class Grid:
    """A tensor of index variables, sizes and scalars only: `where(τ' > τ, -inf, 0)`. The
    generated module builds these in a function of their own, once per shape; positions
    (`index=True`) as whole numbers, never through the call's float dtype."""

    out: Operand
    expr: sympy.Basic
    index: bool = False


@dataclass(frozen=True)
class Gather:
    """`arg[..., positions, ...]`: along `axis`, the values at `positions`, whose indices take
    the axis's place. `where` names the reference for a ShapeError when out of range.
    `bounds`: for positions computed at call time from integer arguments, their whole-number
    form (ir.kinds.whole_form), which the runtime bounds against int64 on every call; such a
    gather is `index_select`, which refuses a position out of range (runtime/positions.py).
    `repeat`: c where the positions are floor(i / c) over an i of c times the axis's size,
    each value c times in a row (`repeat_interleave`, no index read; checked all the same)."""

    out: Operand
    arg: Operand
    axis: Index  # the declared index of the gathered axis
    positions: Operand  # integers
    where: str
    bounds: sympy.Basic | None = None
    repeat: sympy.Basic | None = None


@dataclass(frozen=True)
class Scatter:
    """`zeros.scatter_add_(...)`: `arg` summed over the axes of `positions` into the slots
    the positions name along `axis`, `sum_<J>(where(b == P_<J>, E, 0))` without the b × J
    tensor of the `where` (lower/planner/scatter.py). `out` has `axis` in the place of the first of
    the positions' axes in `arg`. A position outside `axis` adds into one more slot, cut off
    after: it adds nothing, as `b == P` is false for every b there."""

    out: Operand
    arg: Operand
    axis: Index  # the index the positions name slots of
    positions: Operand  # whole numbers (int64) over indices of `arg`, all summed


@dataclass(frozen=True)
class Flip:
    """`arg.flip(dim)`: along `axis`, the values in reverse order, which a gather at the
    positions size - 1 - i reads; `out` has i in the axis's place. Needs no positions."""

    out: Operand
    arg: Operand
    axis: Index  # the declared index of the reversed axis


@dataclass(frozen=True)
class Slice:
    """`arg[..., start:start + n, ...]`: along `axis`, the n values from `start` on, which a
    gather at the positions start + i reads (in range for every size); `out` has i in the
    axis's place. A view."""

    out: Operand
    arg: Operand
    axis: Index  # the declared index of the sliced axis
    start: sympy.Basic


@dataclass(frozen=True)
class Shift:
    """One convolved axis: the signal's declared `axis` read at `along + sign·offset + shift`."""

    axis: Index
    along: Index
    offset: Index
    sign: int
    shift: sympy.Expr

    @property
    def start(self) -> sympy.Expr:
        """Where the window of offsets begins, relative to `along`: the zeros padded before."""
        return self.shift if self.sign > 0 else self.shift - (self.offset.size - 1)


@dataclass(frozen=True)
class Convolve:
    """`F.conv1d`/`F.conv2d` of `arg` padded with zeros, one group per channel:
    `out[v] = Σ_o kernel[channels, o] arg[v + sign·o + shift]` along each shifted axis, zero
    where that read leaves the axis (lower/planner/conv.py). `out` has the axes of `arg` (the
    shifted ones named by the indices they are shifted along), the others first, then `channels`,
    then the shifted ones."""

    out: Operand
    arg: Operand
    kernel: Operand  # over `channels` and the shifts' offsets
    channels: tuple[Index, ...]  # one kernel each (heads)
    shifts: tuple[Shift, ...]


@dataclass(frozen=True)
class Whole:
    """Whole numbers computed in the call's float dtype made integer positions (`.long()`):
    a step of its own, so that positions from sizes alone are converted once per shape."""

    out: Operand
    arg: Operand


@dataclass(frozen=True)
class Contract:
    """einsum over its operands, times a scale; `into`: one operand scaled in place."""

    out: Operand
    args: tuple[Operand, ...]
    scale: sympy.Basic = sympy.S.One
    into: bool = False


@dataclass(frozen=True)
class Add:
    """A sum of terms; `signs` (when given) subtracts the terms marked -1; `into` (when
    given) is the term the others are added onto in place (lower/program/passes/inplace.py)."""

    out: Operand
    args: tuple[Arg, ...]
    signs: tuple[int, ...] = ()
    into: int | None = None


@dataclass(frozen=True)
class Elementwise:
    """An entry of the operator table applied elementwise (functions, pow, comparisons);
    `into`: a function written over its one argument (the table's in-place form)."""

    out: Operand
    fn: str
    args: tuple[Arg, ...]
    into: bool = False


@dataclass(frozen=True)
class Rename:
    """A value given the name and axis order of its left-hand side: a view, no arithmetic."""

    out: Operand
    arg: Operand


@dataclass(frozen=True)
class Full:
    """A number made a tensor of the call's dtype and device (an equation with no tensor)."""

    out: Operand
    value: Number


@dataclass(frozen=True)
class Reduction:
    """A reduction of the operator table over `over`: sums, maxima, logsumexp (the axes
    go), softmax and cumsum (they stay)."""

    out: Operand
    fn: str  # sum max min mean logsumexp softmax
    arg: Operand
    over: tuple[Index, ...]
    safe: bool = False  # softmax whose rows may be all -inf: zeros, not NaN
    sink: Operand | None = None  # softmax with one more logit per row in its denominator
    into: bool = False  # softmax written over its argument when nothing needs its gradient
    below: Number | None = None  # rank compared, `rank < k`: the mask of the k largest (topk)


@dataclass(frozen=True)
class Cat:
    """`torch.cat` of parts along `over`: each part's `along` index takes its place."""

    out: Operand
    parts: tuple[Operand, ...]
    over: Index
    along: tuple[Index, ...]


@dataclass(frozen=True)
class Stack:
    """`torch.stack` of parts along `over`, part c at position c: each part has the other
    axes of `out` (or broadcasts to them), none of them `over`."""

    out: Operand
    parts: tuple[Operand, ...]
    over: Index


@dataclass(frozen=True)
class Pad:
    """`arg` with zero features appended along `over` up to `width` where it is narrower (the
    same tensor where not): attention's values as wide as its queries and keys, which the
    kernel's fused path needs. `out` keeps the axes of `arg`."""

    out: Operand
    arg: Operand
    over: Index
    width: sympy.Basic


@dataclass(frozen=True)
class Fuse:
    """Merge a result's axes into the fused layout of its left-hand side."""

    out: Operand
    arg: Operand
    tensor: Tensor


@dataclass(frozen=True)
class Linear:
    """`F.linear(x, weight, bias)`: x's `inner` axes (flattened) against a weight stored
    [out, in], or `x @ weight` for [in, out]; the out axis is unflattened into `out`'s last
    indices. Weight and bias are declared tensors, read whole without copies."""

    out: Operand
    x: Operand
    inner: tuple[Index, ...]  # contracted, in the weight's order
    weight: Tensor
    out_axes: int  # how many declared axes of the weight form its out block
    bias: Tensor | None = None
    transposed: bool = False
    pick: tuple[int, Index] | None = None  # one value of the index leading the out block


@dataclass(frozen=True)
class Split:
    """`Q, K, V = QKV.unbind(...)`: one result per value of the literal index `over`, each
    with the other axes of `arg` in their order; or, given `parts`, `Qn, Qr =
    Q.split([d_n, d_r], ...)`: one result per run of positions along `over`, each with its
    part's index in the place of `over`."""

    outs: tuple[Operand, ...]
    arg: Operand
    over: Index
    parts: tuple[Index, ...] = ()

    @property
    def out(self) -> Operand:
        return self.outs[0]


@dataclass(frozen=True)
class Attention:
    """`F.scaled_dot_product_attention`: softmax over the key of q·k·scale + mask, times v.

    q, k, v and the mask are viewed with the given axes (heads first, merged into one axis);
    `out` comes back with its heads unmerged. Queries and keys may come in parts, each with
    its own features (several indices, flattened): the parts are concatenated along them."""

    out: Operand
    q: tuple[Operand, ...]
    k: tuple[Operand, ...]
    v: Operand
    mask: Operand | None
    q_dims: tuple[Index, ...]  # (heads..., query)
    k_dims: tuple[Index, ...]  # (key heads..., key)
    widths: tuple[tuple[Index, ...], ...]  # the features of each part of q and k
    v_dims: tuple[Index, ...]  # (key heads..., key, value width)
    mask_dims: tuple[Index, ...]  # (heads..., query, key); the mask may lack some
    heads: int  # query head indices; 0 adds a unit axis, 2 or more are merged
    kv_heads: int
    scale: sympy.Basic
    causal: bool = False
    dropout: sympy.Basic | None = None
    cut: bool = False  # v was padded (`Pad`): the result is cut back to the value width
    spans: Operand | None = None  # blocks of queries and the keys each sees (`Spans`)

    @property
    def grouped(self) -> bool:
        """Several query heads share a key head: the kernel's enable_gqa."""
        return self.heads != self.kv_heads

    @property
    def packed(self) -> int:
        """How many query head axes no key head has that run as rows of queries: with no mask,
        a key head's query heads are more queries against its keys (one call on (…, key heads,
        query heads × queries, width), no enable_gqa; transformers' pack_gqa of a decode
        step). 0 where a mask or the causal flag tells the rows apart, or keys lead otherwise."""
        plain = self.mask is None and not self.causal and self.spans is None
        shared = self.q_dims[: self.kv_heads] == self.k_dims[: self.kv_heads]
        return self.heads - self.kv_heads if self.grouped and plain and shared else 0


SCORE = sympy.Symbol("score")  # in a Flex step's score: the raw score, scale · Σ q·k


@dataclass(frozen=True)
class Flex:
    """`flex_attention` (the FlexAttention backend, indexattn/backends/flex): softmax over the
    key of `score` (of the raw score scale·q·k, positions, sizes, scalars and the `tensors`
    read as `reads`), kept where `keep`, times v. q, k and v as `Attention` views them."""

    out: Operand
    q: tuple[Operand, ...]
    k: tuple[Operand, ...]
    v: Operand
    reads: tuple[Operand, ...]  # the tensors the score and keep read, in `tensors`' order
    q_dims: tuple[Index, ...]  # (heads..., query)
    k_dims: tuple[Index, ...]  # (key heads..., key)
    widths: tuple[tuple[Index, ...], ...]
    v_dims: tuple[Index, ...]  # (key heads..., key, value width)
    heads: int
    kv_heads: int
    scale: sympy.Basic
    score: sympy.Basic  # backends/flex/core.py's: of SCORE, positions and Reads
    keep: sympy.Basic | None
    tensors: tuple[Tensor, ...]  # what each Read reads
    dropout: sympy.Basic | None = None

    @property
    def grouped(self) -> bool:
        return self.heads != self.kv_heads

    @property
    def query(self) -> Index:
        return self.q_dims[-1]

    @property
    def key(self) -> Index:
        return self.k_dims[-1]

    @property
    def head_indices(self) -> tuple[Index, ...]:
        return self.q_dims[:-1]

    packed = 0  # query heads never run as rows: the mask tells them apart


@dataclass(frozen=True)
class Spans:
    """The blocks of queries a mask (…, query, key) lets the kernel run one by one, each on the
    keys any of its queries sees: `(first query, end, first key, end)` per block, read off the
    mask's values (for a table made by blocks, told from its condition where it can tell:
    lower/printers/tables_emit.py's `box_call`); None where blocks would skip too little, or when
    traced. `hides`: the
    entries that hide a key, "false" (a boolean mask that keeps where true), "true" (one that
    hides where true), "-inf" (a float mask added) or "0" (one that multiplies); "none": a
    mask made by blocks (passes/tables.py) not read, every key for each block of queries.
    `out` has no axes: it is a list of numbers, not a tensor."""

    out: Operand
    mask: Operand
    hides: str


@dataclass(frozen=True)
class SoftmaxValues:
    """`W, O = softmax_values(S, V)`: the weights W = softmax of the scores over their last
    axis (then dropout, where `dropout` is its probability) and their product O = W @ V, as
    one step of autograd: the backward adds W's own gradient (the weights are returned) into
    the product's and makes the scores' gradient in place. `values` is V viewed (…, key,
    width); `safe`: rows that are -inf everywhere give zeros, not NaN."""

    outs: tuple[Operand, Operand]  # the weights, the product
    scores: Operand
    values: Operand
    dropout: sympy.Basic | None
    safe: bool

    @property
    def out(self) -> Operand:
        return self.outs[1]


@dataclass(frozen=True)
class PrefixProduct:
    """`H_<τa> cumsum_<τ>(F_<τa> G_<τb>)_<τab>` summed over a, by chunks of `chunk` positions
    of τ (the same other axes on all three): within a chunk the causal scores H Fᵀ times G,
    plus H times the sum of F_<τa> G_<τb> over the chunks before. With a `rate`, each term
    is decayed by γ^(τ - τ') (retention, lower/planner/decay.py): γ = exp(rate), or rate itself
    where `power`; its axes are among the other axes. `out` is (…, τ, b) after those other
    axes; `name` is the prefix sum's (or the decayed scores'), which is never held."""

    out: Operand
    h: Operand
    f: Operand
    g: Operand
    over: Index
    inner: Index
    name: str
    chunk: int
    rate: Arg | None = None
    power: bool = False


@dataclass(frozen=True)
class Choose:
    """Steps chosen by the call's sizes: the first branch whose condition holds (the last
    branch otherwise); each branch's last step gives `out`. The contraction orders of one
    product, where none is the cheapest at every size."""

    out: Operand
    conditions: tuple[sympy.Basic, ...]  # one per branch but the last
    branches: tuple[tuple[Step, ...], ...]


Step = (
    Choose
    | Unfuse
    | Grid
    | Gather
    | Scatter
    | Flip
    | Slice
    | Convolve
    | Whole
    | Contract
    | Add
    | Elementwise
    | Rename
    | Full
    | Reduction
    | Cat
    | Stack
    | Pad
    | Fuse
    | Linear
    | Split
    | Attention
    | Flex
    | Spans
    | PrefixProduct
    | SoftmaxValues
)
