"""The literal interpreter: the oracle every generated kernel is tested against.

It reads the IR equation by equation with plain torch operations: every tensor is held with
one axis per index (fused axes split, literal slices selected), every product is one einsum,
every mask is materialised, softmax is written out. No fusion, no kernel choice, nothing
shared with the planner or the code generator; index-variable fields are evaluated by sympy's
own numpy printer on a float64 grid.
"""

from __future__ import annotations

import functools
import math
import operator
import string

import numpy as np
import sympy
import torch
import torch.nn.functional as F

from .. import ir
from ..ir import Index, Spec
from ..ir.shapes import recipe, solve

Value = tuple[torch.Tensor, tuple[Index, ...]]  # (..., one axis per index)


def evaluate(spec: Spec, /, *, training: bool = False, **kwargs) -> tuple[torch.Tensor, ...]:
    """`evaluate(check(text, "mha"), X=x, W=w, ...)` -> the outputs, read literally."""
    arguments = {t.ascii: kwargs.pop(t.ascii) for t in spec.arguments}
    shapes = {name: tuple(value.shape) for name, value in arguments.items()}
    given = {name: value for name, value in kwargs.items() if name in spec.size_asciis}
    sizes = solve(spec, recipe(spec), shapes, given)  # scalars are numbers, never sizes
    scalars = {s.symbol: float(kwargs.get(s.ascii, s.value)) for s in spec.scalars}
    like = arguments[spec.like.ascii]
    run = Interpreter(sizes, scalars, like.dtype, like.device, training)
    held = {t.name: run.unfuse(arguments[t.ascii], t) for t in spec.arguments}
    for eq in spec.equations:
        held[eq.tensor.name] = (run.align(run.node(eq.rhs, held), eq.indices), eq.indices)
    batch = torch.broadcast_shapes(
        *(held[t.name][0].shape[: -len(t.indices) or None] for t in spec.tensors_of("input"))
    )
    outputs = [run.fuse(held[t.name][0], t) for t in spec.outputs]
    reads = _reads_inputs(spec)
    return tuple(
        out.expand((*batch, *out.shape[out.dim() - len(t.shape) :])) if reads[t.name] else out
        for out, t in zip(outputs, spec.outputs)
    )


def _reads_inputs(spec: Spec) -> dict[str, bool]:
    """Per tensor, whether it reads an input: then it carries all of the call's batch axes,
    though the inputs it reads have narrower ones (or none); one that reads none (positions,
    params) has its own axes only."""
    reads = {t.name: t.role == "input" for t in spec.arguments}
    for eq in spec.equations:
        reads[eq.tensor.name] = any(reads[r.tensor.name] for r in ir.refs(eq.rhs))
    return reads


class Interpreter:
    def __init__(
        self, sizes: dict, scalars: dict, dtype: torch.dtype, device: torch.device, training: bool
    ) -> None:
        self.sizes, self.scalars = sizes, scalars
        self.dtype, self.device, self.training = dtype, device, training

    def size(self, index: Index) -> int:
        return int(index.size.subs(self.sizes))

    def unfuse(self, tensor: torch.Tensor, decl: ir.Tensor) -> Value:
        flat = decl.indices
        batch = tensor.shape[: tensor.dim() - len(decl.layout)]
        return tensor.reshape((*batch, *(self.size(i) for i in flat))), flat

    def fuse(self, tensor: torch.Tensor, decl: ir.Tensor) -> torch.Tensor:
        batch = tensor.shape[: tensor.dim() - len(decl.indices)]
        return tensor.reshape((*batch, *(int(s.subs(self.sizes)) for s in decl.shape)))

    def align(self, value: Value, target: tuple[Index, ...]) -> torch.Tensor:
        """The value with axes (..., *target): permuted, and size 1 where it lacks an index."""
        tensor, have = value
        batch = tensor.dim() - len(have)
        order = [batch + have.index(i) for i in target if i in have]
        tensor = tensor.permute((*range(batch), *order))
        shape = list(tensor.shape[:batch]) + [self.size(i) if i in have else 1 for i in target]
        return tensor.reshape(shape)

    def node(self, node: ir.Node, held: dict[str, Value]) -> Value:
        return getattr(self, type(node).__name__.lower())(node, held)

    def ref(self, node: ir.Ref, held: dict[str, Value]) -> Value:
        tensor, _ = held[node.tensor.name]
        written = node.written
        if tensor.dim() < len(written):  # a tensor with no axes
            return tensor, node.free
        picks = [self.pick(i) for i in written]
        tensor = tensor[(Ellipsis, *(slice(None) if p is None else p for p in picks))]
        items = [i for i, p in zip(written, picks) if p is None]
        for k in reversed(range(len(items))):  # from the last, so earlier places stay put
            if isinstance(items[k], ir.At):
                positions, dims = self.position(items[k], held)
                axis = tensor.dim() - len(items) + k
                if positions.dim() > len(dims):  # batched positions into a table: lead
                    tensor, axis = tensor.movedim(axis, 0), 0
                    items = [*items[k : k + 1], *items[:k], *items[k + 1 :]]
                    k = 0
                chosen = tensor.index_select(axis, positions.flatten())
                tensor = chosen.unflatten(axis, positions.shape)
                items[k : k + 1] = dims
        return tensor, tuple(items)

    def pick(self, item) -> int | None:
        """The one position a literal or an index-free computed position selects."""
        if isinstance(item, int):
            return item
        if isinstance(item, ir.At) and not item.free:
            return int(item.value.expr.subs(self.sizes))
        return None

    def position(self, at: ir.At, held: dict[str, Value]) -> Value:
        """Whole-number positions, in float64 before they are rounded, whatever the dtype."""
        if isinstance(at.value, ir.Field):
            saved, self.dtype = self.dtype, torch.float64
            try:
                values, dims = self.field(at.value, held)
            finally:
                self.dtype = saved
        else:
            values, dims = self.node(at.value, held)
        if values.is_floating_point():
            values = values.double().round()
        return values.long(), dims

    def field(self, node: ir.Field, held: dict[str, Value]) -> Value:
        expr = node.expr.subs({**self.sizes, **self.scalars})
        symbols = [i.symbol for i in node.free]
        grids = np.meshgrid(*(self.grid(i) for i in node.free), indexing="ij")
        result = np.asarray(lambdified(expr, tuple(symbols))(*grids))
        result = np.broadcast_to(result, tuple(self.size(i) for i in node.free))
        dtype = torch.bool if result.dtype == np.bool_ else self.dtype
        return torch.as_tensor(result.copy(), device=self.device).to(dtype), node.free

    def grid(self, index: Index) -> np.ndarray:
        """The values an index variable takes, in float64: 0 … size - 1."""
        return np.arange(self.size(index), dtype=np.float64)

    def product(self, node: ir.Product, held: dict[str, Value]) -> Value:
        values = [self.node(f, held) for f in node.factors]
        letters = dict(zip(node.free + node.summed, string.ascii_letters))
        inputs = ",".join("..." + "".join(letters[i] for i in have) for _, have in values)
        output = "..." + "".join(letters[i] for i in node.free)
        return torch.einsum(f"{inputs}->{output}", *(t for t, _ in values)), node.free

    def sum(self, node: ir.Sum, held: dict[str, Value]) -> Value:
        total = None
        for term in node.terms:
            value = self.align(self.node(term, held), node.free)
            total = value if total is None else total + value
        return total, node.free

    def apply(self, node: ir.Apply, held: dict[str, Value]) -> Value:
        from ..lower.program.numerics import guarded

        # read loop by loop, where(c, a, b) is `a if c else b`: the branch not chosen is not
        # evaluated, so neither its overflow nor its gradient (0 times inf) counts
        node = guarded(node)
        args = [self.align(self.node(a, held), node.free) for a in node.args]
        return ELEMENTWISE[node.fn](self, *args), node.free

    def concat(self, node: ir.Concat, held: dict[str, Value]) -> Value:
        """Each part with its own index last, joined along it."""
        shared = node.free[1:]
        parts = [
            self.align(self.node(part, held), (*shared, along))
            for part, along in zip(node.parts, node.along)
        ]
        rank = len(shared) + 1  # the batch axes before them broadcast, as in any other node
        batch = torch.broadcast_shapes(*(part.shape[:-rank] for part in parts))
        parts = [part.expand(*batch, *part.shape[-rank:]) for part in parts]
        return torch.cat(parts, dim=-1), (*shared, node.over)

    def reduce(self, node: ir.Reduce, held: dict[str, Value]) -> Value:
        body = self.align(self.node(node.body, held), node.body.free)
        dims = tuple(node.body.free.index(i) - len(node.body.free) for i in node.over)
        return LITERAL[node.fn](body, dims), node.free


@functools.lru_cache(maxsize=1024)
def lambdified(expr: sympy.Basic, symbols: tuple[sympy.Symbol, ...]):
    """`expr` as a numpy function of `symbols`, made once (sympy.lambdify takes milliseconds)."""
    return sympy.lambdify(symbols, expr, modules="numpy")


def running(x: torch.Tensor, dim: int, combine=operator.add) -> torch.Tensor:
    """Σ (or Π, with `operator.mul`) over positions up to each position along `dim`, taken
    one at a time (an inf stays put)."""
    rows, total, out = x.movedim(dim, 0), None, []
    for row in rows:
        total = row if total is None else combine(total, row)
        out.append(total)
    return torch.stack(out).movedim(0, dim) if out else x


def rank(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Each entry's place in descending order along `dim`, 0 the largest: the entries greater
    than it and the equal ones before it, counted, by comparing every pair."""
    x = x.movedim(dim, -1)
    order = torch.arange(x.shape[-1], device=x.device)
    before = order[None, :] < order[:, None]  # [i, j]: j is before i
    other, this = x[..., None, :], x[..., :, None]
    ahead = (other > this) | ((other == this) & before)
    return ahead.sum(dim=-1).movedim(-1, dim)


def softmax(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)); a row of -inf only gives zeros, a row of nothing
    nothing."""
    if x.numel() == 0:
        return x
    top = x.amax(dim=dims, keepdim=True)
    top = torch.where(top == -torch.inf, torch.zeros_like(top), top)
    e = torch.exp(x - top)
    total = e.sum(dim=dims, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _either(a: torch.Tensor, b: torch.Tensor, first, second) -> torch.Tensor:
    """a where `first`, b where `second`; at a tie of floats their mean, whose gradient is
    split evenly between them, as torch.minimum's and torch.maximum's."""
    tie = (a + b) / 2 if a.is_floating_point() or b.is_floating_point() else a
    return torch.where(first, a, torch.where(second, b, tie))


# Each reduction of ops.REDUCTIONS but concat (a node of its own), computed literally: `d` the
# dims of the reduced indices, one for those that keep their index.
LITERAL = {
    "softmax": softmax,
    "cumsum": lambda x, d: running(x, d[0]),
    "cumprod": lambda x, d: running(x, d[0], operator.mul),
    "rank": lambda x, d: rank(x, d[0]),
    "sum": lambda x, d: x.sum(dim=d),
    "max": lambda x, d: x.amax(dim=d),
    "min": lambda x, d: x.amin(dim=d),
    "mean": lambda x, d: x.mean(dim=d),
    "logsumexp": lambda x, d: torch.logsumexp(x, dim=d),
}

ELEMENTWISE = {
    "exp": lambda self, x: torch.exp(x),
    "log": lambda self, x: torch.log(x),
    "sqrt": lambda self, x: torch.sqrt(x),
    "tanh": lambda self, x: torch.tanh(x),
    "sigmoid": lambda self, x: torch.sigmoid(x),
    "relu": lambda self, x: torch.relu(x),
    "gelu": lambda self, x: F.gelu(x),
    # as written: x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2, not torch's approximate="tanh"
    "gelu_tanh": lambda self, x: (
        x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) / 2
    ),
    "silu": lambda self, x: x * torch.sigmoid(x),
    "cos": lambda self, x: torch.cos(x),
    "sin": lambda self, x: torch.sin(x),
    "floor": lambda self, x: torch.floor(x),
    "ceil": lambda self, x: torch.ceil(x),
    "round": lambda self, x: torch.round(x),
    "sign": lambda self, x: torch.sign(x),
    "rsqrt": lambda self, x: 1 / torch.sqrt(x),
    "elu": lambda self, x: torch.where(x > 0, x, torch.expm1(x)),
    "softplus": lambda self, x: torch.log1p(torch.exp(x)),
    "logsigmoid": lambda self, x: torch.clamp(x, max=0) - torch.log1p(torch.exp(-torch.abs(x))),
    "log1p": lambda self, x: torch.log(1 + x),
    "expm1": lambda self, x: torch.exp(x) - 1,
    "erf": lambda self, x: torch.erf(x),
    "min": lambda self, a, b: _either(a, b, a < b, a > b),
    "max": lambda self, a, b: _either(a, b, a > b, a < b),
    "mod": lambda self, a, b: a - b * torch.floor(a / b),
    "clamp": lambda self, x, lo, hi: torch.where(x < lo, lo, torch.where(x > hi, hi, x)),
    "abs": lambda self, x: torch.abs(x),
    "pow": lambda self, x, y: torch.pow(x, y),
    "where": lambda self, c, a, b: torch.where(c, a, b),
    "dropout": lambda self, x, p: F.dropout(x, float(p.reshape(-1)[0]), self.training),
    "<": lambda self, a, b: a < b,
    "<=": lambda self, a, b: a <= b,
    ">": lambda self, a, b: a > b,
    ">=": lambda self, a, b: a >= b,
    "==": lambda self, a, b: a == b,
    "!=": lambda self, a, b: a != b,
    "and": lambda self, a, b: a & b,
    "or": lambda self, a, b: a | b,
    "not": lambda self, a: ~a,
}
