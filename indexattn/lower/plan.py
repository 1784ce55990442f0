"""IR -> ordered steps: how each equation is computed (fused kernels where the equations
mean exactly what they compute, einsum order from opt_einsum, fused axes split once, masks,
safe softmax). Steps are frozen values; codegen only prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import opt_einsum
import sympy

from .. import ir
from ..ir import Index, Spec, Tensor
from ..ir.shapes import Recipe, recipe
from .fusion import (
    AttentionMatch,
    LinearForm,
    ProjectionGroup,
    declared_outer,
    find_attention,
    linear_form,
    projection_groups,
)

# Sizes used to choose contraction orders when a spec leaves them symbolic.
PLANNING_SIZE = 64


@dataclass(frozen=True)
class Operand:
    """A tensor variable with axes (..., *dims); `select` picks literal slices of its
    leading axes (None keeps an axis)."""

    var: str
    dims: tuple[Index, ...]
    batched: bool
    select: tuple[int | None, ...] = ()


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
    """A tensor of index variables: `torch.where(tau_p > tau, -inf, 0.0)`, built once per
    shape (the generated module keeps the last one)."""

    out: Operand
    expr: sympy.Basic


@dataclass(frozen=True)
class Contract:
    """einsum over its operands, times a scale."""

    out: Operand
    args: tuple[Operand, ...]
    scale: sympy.Basic = sympy.S.One


@dataclass(frozen=True)
class Add:
    out: Operand
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Elementwise:
    out: Operand
    fn: str
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Reduction:
    out: Operand
    fn: str  # sum max min mean logsumexp softmax
    arg: Operand
    over: tuple[Index, ...]
    safe: bool = False  # softmax whose rows may be all -inf: zeros, not NaN


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


@dataclass(frozen=True)
class Split:
    """`Q, K, V = QKV.unbind(...)`: one result per value of the literal index `over`, each
    with the other axes of `arg` in their order."""

    outs: tuple[Operand, ...]
    arg: Operand
    over: Index

    @property
    def out(self) -> Operand:
        return self.outs[0]


@dataclass(frozen=True)
class Attention:
    """`F.scaled_dot_product_attention`: softmax over the key of q·k·scale + mask, times v.

    q, k, v and the mask are viewed with the given axes (heads first, merged into one axis);
    `out` comes back with its heads unmerged."""

    out: Operand
    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    q_dims: tuple[Index, ...]  # (heads..., query, width)
    k_dims: tuple[Index, ...]  # (key heads..., key, width)
    v_dims: tuple[Index, ...]  # (key heads..., key, value width)
    mask_dims: tuple[Index, ...]  # (heads..., query, key); the mask may lack some
    heads: int  # query head indices; 0 adds a unit axis, 2 or more are merged
    kv_heads: int
    scale: sympy.Basic
    causal: bool = False
    dropout: sympy.Basic | None = None

    @property
    def grouped(self) -> bool:
        """Several query heads share a key head: the kernel's enable_gqa."""
        return self.heads != self.kv_heads


Step = Unfuse | Grid | Contract | Add | Elementwise | Reduction | Fuse | Linear | Split | Attention


@dataclass(frozen=True)
class Block:
    """The steps of one equation (or of several that one kernel computes), headed by them;
    a block of no equation (the outputs put in their declared layouts) has a note instead."""

    equations: tuple[ir.Equation, ...]
    steps: tuple[Step, ...]
    note: str = ""

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(eq.text for eq in self.equations) or (self.note,)


@dataclass(frozen=True)
class Plan:
    spec: Spec
    sizes: Recipe
    blocks: tuple[Block, ...]
    results: tuple[Operand, ...]  # the outputs, in their declared layouts
    field_dtype: bool = field(default=False)  # whether device/dtype are needed

    def __str__(self) -> str:
        out = [f"plan for {self.spec.name}", str(self.sizes)]
        for block in self.blocks:
            out.extend(f"# {text}" for text in block.texts)
            out.extend(
                f"  {type(s).__name__}: {s.out.var} {_dims(s.out.dims)}" for s in block.steps
            )
        return "\n".join(out)


def _dims(dims: tuple[Index, ...]) -> str:
    return "(" + ", ".join(i.glyph for i in dims) + ")"


def plan(spec: Spec) -> Plan:
    """`plan(check(text, "mha"))` -> the steps the generated function takes."""
    return Planner(spec).plan()


class Planner:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.taken = (
            {t.ascii for t in spec.tensors}
            | {i.ascii for i in spec.indices}
            | {s.ascii for s in spec.scalars}
            | set(spec.size_asciis)
        )
        self.held: dict[str, Operand] = {}
        self.masked: dict[str, bool] = {
            t.name: t.role in ("input", "buffer") for t in spec.arguments
        }
        self.literals = _literal_positions(spec)
        self.steps: list[Step] = []
        self.order: tuple[Index, ...] = ()
        self.attention = {m.output.tensor.name: m for m in find_attention(spec)}
        self.groups = {g.equations[0].tensor.name: g for g in projection_groups(spec)}
        self.skip = {eq.tensor.name for m in self.attention.values() for eq in m.equations}
        self.skip |= {eq.tensor.name for g in self.groups.values() for eq in g.equations[1:]}
        self.skip -= set(self.attention)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}{k}" if not base.endswith(tuple("0123456789")) else f"{base}_{k}"
        self.taken.add(name)
        return name

    def plan(self) -> Plan:
        blocks = []
        for eq in self.spec.equations:
            if eq.tensor.name not in self.skip:
                self.steps = []
                equations = self.block(eq)
                blocks.append(Block(equations, tuple(self.steps)))
            self.masked[eq.tensor.name] = _may_be_masked(eq.rhs, self.masked)
        self.steps = []
        results = tuple(self.result(t) for t in self.spec.outputs)
        if self.steps:
            blocks.append(Block((), tuple(self.steps), "outputs in their declared layouts"))
        grids = any(isinstance(s, Grid) for b in blocks for s in b.steps)
        return Plan(self.spec, recipe(self.spec), tuple(blocks), results, grids)

    def ordered(self, dims: tuple[Index, ...]) -> tuple[Index, ...]:
        """Axes in the order of the left-hand side, so results need no transposes."""
        rank = {index: k for k, index in enumerate(self.order)}
        return tuple(sorted(dims, key=lambda i: rank.get(i, len(rank))))

    def block(self, eq: ir.Equation) -> tuple[ir.Equation, ...]:
        """Plans one equation, or the equations one kernel computes; returns them."""
        name = eq.tensor.name
        if name in self.groups:
            return self.projections(self.groups[name])
        self.order = eq.indices
        if name in self.attention:
            match = self.attention[name]
            self.assign(eq, self.attend(match, eq.tensor.ascii))
            return match.equations
        self.assign(eq, self.as_tensor(self.node(eq.rhs, eq.tensor.ascii), eq.tensor.ascii))
        return (eq,)

    def assign(self, eq: ir.Equation, value: Operand) -> None:
        """Names the value after the left-hand side, in its index order."""
        last = self.steps[-1] if self.steps else None
        ours = last is not None and not isinstance(last, Split) and last.out == value
        if ours and value.dims == eq.indices:
            value = replace(value, var=eq.tensor.ascii)
            self.steps[-1] = replace(last, out=value)
        if value.dims != eq.indices or value.var != eq.tensor.ascii:
            out = Operand(eq.tensor.ascii, eq.indices, value.batched)
            self.steps.append(Elementwise(out, "align", (value,)))
            value = out
        self.held[eq.tensor.name] = value

    def result(self, tensor: Tensor) -> Operand:
        value = self.held[tensor.name]
        if not tensor.fused:
            return value
        out = Operand(self.fresh(tensor.ascii + "_out"), value.dims, value.batched)
        self.steps.append(Fuse(out, value, tensor))
        return out

    def as_tensor(self, value: Arg, name: str) -> Operand:
        if isinstance(value, Operand):
            return value
        out = Operand(self.fresh(name), (), False)
        self.steps.append(Elementwise(out, "full", (value,)))
        return out

    # -- fused kernels

    def projections(self, group: ProjectionGroup) -> tuple[ir.Equation, ...]:
        """One matrix product for all slices of a weight, split into the group's tensors."""
        eqs = group.equations
        self.order = eqs[0].indices
        first = group.forms[0]
        names = [eq.tensor.ascii for eq in eqs]
        fused = self.linear(first, ("" if all(len(n) == 1 for n in names) else "_").join(names))
        over = fused.dims[len(fused.dims) - len(first.outer) + first.literal]
        # Split first, then view each slice in its own order: the gradients of the slices
        # then stack straight into the layout of the product (no copy in the backward).
        kept = [k for k, i in enumerate(fused.dims) if i != over]
        outs = []
        for eq, form in zip(eqs, group.forms):
            names = self.linear_dims(form, self.node(form.x, eq.tensor.ascii))
            dims = tuple(names[k] for k in kept)
            var = eq.tensor.ascii if dims == eq.indices else self.fresh(eq.tensor.ascii)
            outs.append(Operand(var, dims, fused.batched))
        self.steps.append(Split(tuple(outs), fused, over))
        for eq, out in zip(eqs, outs):
            self.assign(eq, out)
        return eqs

    def linear_dims(self, form: LinearForm, x: Operand) -> tuple[Index, ...]:
        rest = tuple(i for i in x.dims if i not in form.inner)
        return rest + declared_outer(form)

    def linear(self, form: LinearForm, name: str) -> Operand:
        x = self.as_tensor(self.node(form.x, name), name)
        out = Operand(self.fresh(name), self.linear_dims(form, x), x.batched)
        bias = form.bias.tensor if form.bias is not None else None
        step = Linear(out, x, form.inner, form.weight.tensor, form.out_axes, bias, form.transposed)
        self.steps.append(step)
        return out

    def attend(self, match: AttentionMatch, name: str) -> Operand:
        self.order, scores = match.scores.indices, match.scores.tensor.ascii
        q, k = (self.as_tensor(self.node(n, scores), scores) for n in (match.q, match.k))
        mask = self.mask(match, scores)
        self.order = match.output.indices
        v = self.as_tensor(self.node(match.v, name), name)
        rename = dict(match.rename)
        heads = match.heads + match.groups
        out = (*(rename[i] for i in (*heads, match.query)), match.value_width)
        step = Attention(
            Operand(self.fresh(name), out, q.batched or k.batched or v.batched),
            q=q,
            k=k,
            v=v,
            mask=mask,
            q_dims=(*heads, match.query, match.width),
            k_dims=(*match.heads, match.key, match.width),
            v_dims=(*(rename[i] for i in match.heads), rename[match.key], match.value_width),
            mask_dims=(*heads, match.query, match.key),
            heads=len(heads),
            kv_heads=len(match.heads),
            scale=match.scale,
            causal=match.causal,
            dropout=match.p,
        )
        self.steps.append(step)
        return step.out

    def mask(self, match: AttentionMatch, name: str) -> Operand | None:
        """None for is_causal; a boolean grid for predicates; else the terms, summed."""
        if match.causal or not match.terms:
            return None
        if match.keep is not None:
            base = match.masks[0].tensor.ascii + "_keep" if match.masks else "keep"
            free = match.keep.free_symbols
            dims = tuple(i for i in self.order if i.symbol in free)
            out = Operand(self.fresh(base), dims, False)
            self.steps.append(Grid(out, match.keep))
            return out
        node = (
            match.terms[0] if len(match.terms) == 1 else ir.Sum(match.terms, match.scores.rhs.span)
        )
        return self.as_tensor(self.node(node, name), name)

    # -- nodes -> steps; each returns the value's operand

    def node(self, node: ir.Node, name: str) -> Arg:
        return getattr(self, "node_" + type(node).__name__)(node, name)

    def node_Field(self, node: ir.Field, name: str) -> Arg:
        if not node.free:
            return Number(node.expr)
        out = Operand(self.fresh(name), self.ordered(node.free), False)
        self.steps.append(Grid(out, node.expr))
        return out

    def node_Ref(self, node: ir.Ref, name: str) -> Arg:
        tensor = node.tensor
        positions = self.literals.get(tensor.name, ())
        if tensor.name not in self.held:
            self.held[tensor.name] = self.unfuse(tensor, positions)
        base = self.held[tensor.name]
        written = [i for axis in node.axes for i in axis]
        chosen = [written[tensor.indices.index(d)] for d in base.dims]
        select = tuple(c if isinstance(c, int) else None for c in chosen[: len(positions)])
        while select and select[-1] is None:
            select = select[:-1]
        dims = tuple(c for c in chosen if not isinstance(c, int))
        return Operand(base.var, dims, base.batched, select)

    def unfuse(self, tensor: Tensor, positions: tuple[int, ...]) -> Operand:
        flat = tensor.indices
        order = tuple(flat[p] for p in positions) + tuple(
            i for k, i in enumerate(flat) if k not in positions
        )
        if not tensor.fused and not positions:
            return Operand(tensor.ascii, order, tensor.batched)
        out = Operand(self.fresh(tensor.ascii + "_"), order, tensor.batched)
        self.steps.append(Unfuse(out, tensor))
        return out

    def node_Product(self, node: ir.Product, name: str) -> Arg:
        form = linear_form(node)
        if form is not None and _whole(form):
            return self.linear(form, name)
        scale = sympy.Integer(1)
        tensors: list[Operand] = []
        for factor in node.factors:
            value = self.node(factor, name)
            if isinstance(value, Number):
                scale = scale * value.expr
            else:
                tensors.append(value)
        if len(tensors) <= 2:
            return self.contract(tensors, node.free, scale, name)
        return self.contract_path(tensors, node, scale, name)

    def contract(
        self, args: list[Operand], dims: tuple[Index, ...], scale: sympy.Basic, name: str
    ) -> Operand:
        if scale != 1 and len(args) > 1:
            args = self.prescale(args, scale)
            scale = sympy.Integer(1)
        out = Operand(self.fresh(name), self.ordered(dims), any(a.batched for a in args))
        self.steps.append(Contract(out, tuple(args), scale))
        return out

    def prescale(self, args: list[Operand], scale: sympy.Basic) -> list[Operand]:
        """The scale goes onto the smallest factor, before the product: Q / sqrt(d_k) keeps
        float16 scores from overflowing where (Q K) / sqrt(d_k) would not."""
        k = min(range(len(args)), key=lambda j: _planning_count(args[j].dims))
        arg = args[k]
        out = Operand(self.fresh(arg.var.rstrip("_") + "_scaled"), arg.dims, arg.batched)
        self.steps.append(Contract(out, (arg,), scale))
        return [*args[:k], out, *args[k + 1 :]]

    def contract_path(
        self, args: list[Operand], node: ir.Product, scale: sympy.Basic, name: str
    ) -> Operand:
        """Pairwise contractions in the order opt_einsum chooses."""
        letters = {i: opt_einsum.get_symbol(k) for k, i in enumerate(node.free + node.summed)}
        inputs = ["".join(letters[i] for i in a.dims) for a in args]
        shapes = [tuple(_planning_size(i) for i in a.dims) for a in args]
        path, _ = opt_einsum.contract_path(
            ",".join(inputs) + "->" + "".join(letters[i] for i in node.free),
            *shapes,
            shapes=True,
            optimize="optimal",
        )
        pending = list(args)
        for pair in path:
            chosen = [pending[k] for k in pair]
            pending = [a for k, a in enumerate(pending) if k not in pair]
            rest = {i for a in pending for i in a.dims} | set(node.free)
            dims = tuple(dict.fromkeys(i for a in chosen for i in a.dims if i in rest))
            last = not pending
            pending.append(
                self.contract(
                    chosen, node.free if last else dims, scale if last else sympy.Integer(1), name
                )
            )
        return pending[0]

    def node_Sum(self, node: ir.Sum, name: str) -> Arg:
        form = linear_form(node)
        if form is not None and form.bias is not None and _whole(form):
            return self.linear(form, name)
        # Smallest tensors first, numbers last: `M + P + S` adds the masks once, not per head.
        args = sorted((self.node(term, name) for term in node.terms), key=_planning_elements)
        out = Operand(self.fresh(name), self.ordered(node.free), any(map(_batched, args)))
        self.steps.append(Add(out, tuple(args)))
        return out

    def node_Apply(self, node: ir.Apply, name: str) -> Arg:
        args = tuple(self.node(arg, name) for arg in node.args)
        out = Operand(self.fresh(name), self.ordered(node.free), any(map(_batched, args)))
        self.steps.append(Elementwise(out, node.fn, args))
        return out

    def node_Reduce(self, node: ir.Reduce, name: str) -> Arg:
        body = self.as_tensor(self.node(node.body, name), name)
        safe = node.fn == "softmax" and _may_be_masked(node.body, self.masked)
        free = node.free if node.fn == "softmax" else self.ordered(node.free)
        out = Operand(self.fresh(name), body.dims if node.fn == "softmax" else free, body.batched)
        self.steps.append(Reduction(out, node.fn, body, node.over, safe))
        return out


def _whole(form: LinearForm) -> bool:
    """The weight is used whole: no literal picks a slice of it."""
    return all(isinstance(i, Index) for i in form.outer)


def _planning_count(dims: tuple[Index, ...]) -> int:
    return math.prod(_planning_size(i) for i in dims)


def _planning_elements(arg: Arg) -> float:
    return _planning_count(arg.dims) if isinstance(arg, Operand) else math.inf


def _batched(arg: Arg) -> bool:
    return isinstance(arg, Operand) and arg.batched


def _planning_size(index: Index) -> int:
    return int(index.size) if index.size.is_Integer else PLANNING_SIZE


def _literal_positions(spec: Spec) -> dict[str, tuple[int, ...]]:
    """For each tensor, the flat positions that some reference selects with a literal."""
    found: dict[str, set[int]] = {}
    for eq in spec.equations:
        for ref in ir.refs(eq.rhs):
            written = [i for axis in ref.axes for i in axis]
            hits = {k for k, i in enumerate(written) if isinstance(i, int)}
            if hits:
                found.setdefault(ref.tensor.name, set()).update(hits)
    return {name: tuple(sorted(hits)) for name, hits in found.items()}


def _may_be_masked(node: ir.Node, masked: dict[str, bool]) -> bool:
    """Whether a value can hold -inf: an inf written in the spec, or data passed in."""
    if isinstance(node, ir.Field):
        return bool(node.expr.has(sympy.oo, -sympy.oo))
    if isinstance(node, ir.Ref):
        return masked.get(node.tensor.name, False)
    return any(_may_be_masked(child, masked) for child in ir.children(node))
