"""IR -> ordered steps: how each equation is computed (fused kernels where the equations
mean exactly what they compute, einsum order from opt_einsum, fused axes split once, masks,
safe softmax). Steps are frozen values holding unnamed variables; codegen names and prints
them."""

from __future__ import annotations

import itertools
import math
from dataclasses import fields, replace

import sympy

from ... import ir
from ...ir import Index, Spec, Tensor
from ...ir.einstein import signed
from ...ir.shapes import recipe
from ..program import numerics
from ..program.program import Block, Program
from ..program.steps import (
    Add,
    Arg,
    Cat,
    Elementwise,
    Full,
    Fuse,
    Grid,
    Linear,
    Number,
    Operand,
    Reduction,
    Rename,
    Split,
    Stack,
    Step,
    Unfuse,
    Var,
)
from . import decay, prefix, products
from .conv import convolve_rule
from .fusion import (
    LinearForm,
    declared_outer,
    direct,
    linear_form,
)
from .gathers import gather
from .kernels import Kernels
from .order import planning_count
from .products import Rule
from .scatter import scatter_positions, scatter_rule
from .sinks import absorbed
from .stacks import stack_form


class Planner:
    """Walks the equations in order; each becomes a block of steps (or joins a kernel's)."""

    def __init__(self, spec: Spec, backend: str = "auto") -> None:
        self.spec = spec
        self.ids = itertools.count()
        self.held: dict[str, Operand] = {}
        self.masked = {t.name: numerics.maskable(t) for t in spec.arguments}
        self.literals = _literal_positions(spec)
        self.fields = _field_references(spec)
        self.unread = _unread(spec, self.fields)
        self.wide = False  # planning an equation of a precision of its own
        self.steps: list[Step] = []  # the block being planned
        self.blocks: list[Block] = []  # the blocks planned before it
        self.order: tuple[Index, ...] = ()
        self.seen: dict[tuple, Operand] = {}  # steps planned so far, by what they compute
        self.kernels = Kernels(self, spec, backend)
        # prefix sums and decayed scores computed by chunks where they are read
        self.prefix = {**prefix.find(spec), **decay.find(spec)}
        self.defined = {eq.tensor.name: eq for eq in spec.equations}
        hidden = {eq.tensor.name for match in self.prefix.values() for eq in match.hidden}
        # planned in the block that reads them; logsumexps only sinks read, never
        self.later = self.unread | hidden | absorbed(spec, self.defined)

    def may_be_masked(self, node: ir.Node) -> bool:
        """Whether a value can hold -inf (lower/program/numerics.py)."""
        scalars = frozenset(s.symbol for s in self.spec.scalars)
        return numerics.may_be_neginf(node, self.masked, scalars)

    def var(self, hint: str) -> Var:
        return Var(next(self.ids), hint)

    def add(self, step: Step) -> Operand:
        """Appends a step, unless the same step was planned before: then its value is reused
        (the rotary tables of queries and keys, one position grid read twice)."""
        key = _signature(step)
        if key is not None and key in self.seen:
            return self.seen[key]
        self.steps.append(step)
        if key is not None:
            self.seen[key] = step.out
        return step.out

    def plan(self) -> Program:
        blocks = self.blocks
        for eq in self.spec.equations:
            if not self.kernels.skipped(eq) and eq.tensor.name not in self.later:
                self.steps = []
                equations = self.block(eq)
                blocks.append(Block(self.inlined(equations) + equations, tuple(self.steps)))
            self.masked[eq.tensor.name] = self.may_be_masked(eq.rhs)
        self.steps = []
        results = tuple(self.result(t) for t in self.spec.outputs)
        if self.steps:
            blocks.append(Block((), tuple(self.steps), "outputs in their declared layouts"))
        return Program(self.spec, recipe(self.spec), tuple(blocks), results, next(self.ids))

    @property
    def planned(self) -> tuple[Step, ...]:
        """Every step so far, in order: the blocks' before, then this block's."""
        return (*(s for block in self.blocks for s in block.steps), *self.steps)

    def inlined(self, equations: tuple[ir.Equation, ...]) -> tuple[ir.Equation, ...]:
        """The equations of position-only tensors and of products by chunks these read (with
        the equations only those read): they head the block too."""
        names = [
            ref.tensor.name
            for eq in equations
            for ref in ir.refs(eq.rhs)
            if ref.tensor.name in self.later
        ]
        found = [
            eq
            for name in dict.fromkeys(names)
            for eq in (self.prefix[name].hidden if name in self.prefix else (self.defined[name],))
        ]
        return tuple(dict.fromkeys(found))

    def ordered(self, dims: tuple[Index, ...]) -> tuple[Index, ...]:
        """Axes in the order of the left-hand side, so results need no transposes."""
        rank = {index: k for k, index in enumerate(self.order)}
        return tuple(sorted(dims, key=lambda i: rank.get(i, len(rank))))

    def block(self, eq: ir.Equation) -> tuple[ir.Equation, ...]:
        """Plans one equation, or the equations one kernel computes; returns them."""
        if eq.tensor.precision:
            self.precise(eq)
            return (eq,)
        kernel = self.kernels.block(eq)
        if kernel is not None:
            return kernel
        self.general(eq, eq.rhs)
        return (eq,)

    def precise(self, eq: ir.Equation) -> None:
        """An equation computed in a precision of its own (`A_<ττ'> : float32 = ...`): what
        it reads cast up, its steps in that precision (lower/program/numerics.py); no kernel takes
        it. The tensor is held wide: an equation in the call's dtype reads it cast down."""
        self.wide = True
        self.general(eq, numerics.widened(eq.rhs, eq.tensor.precision))
        self.wide = False

    def narrowed(self, tensor: Tensor, value: Operand) -> Operand:
        """A tensor held in a precision of its own, as an equation in the call's dtype (or
        the caller) reads it: cast to the call's dtype, once."""
        if not tensor.precision or self.wide:
            return value
        out = Operand(self.var(tensor.ascii + "_narrow"), value.dims, value.batched)
        return self.add(Elementwise(out, "narrow", (value,)))

    def general(self, eq: ir.Equation, rhs: ir.Node) -> None:
        """Plans `rhs` (the equation's right-hand side, or it with kernels' results read in
        place of their cores) with the general steps."""
        self.order = eq.indices
        self.assign(eq, self.as_tensor(self.node(rhs, eq.tensor.ascii), eq.tensor.ascii))

    def assign(self, eq: ir.Equation, value: Operand) -> None:
        """Names the value after the left-hand side, in its index order."""
        own = Var(value.var.id, eq.tensor.ascii)
        last = self.steps[-1] if self.steps else None
        mine = last is not None and not isinstance(last, Split) and last.out == value
        if mine and value.dims == eq.indices and not value.var.argument:
            renamed = replace(value, var=own)
            self.steps[-1] = replace(last, out=renamed)
            # a later equal step reuses the value under the name it now has: the last step's
            # own entry, the one that can hold it (each step makes a value of its own)
            key = _signature(last)
            if key is not None and self.seen.get(key) == value:
                self.seen[key] = renamed
            value = renamed
        if value.dims != eq.indices or value.var != own:
            value = self.add(
                Rename(Operand(self.var(eq.tensor.ascii), eq.indices, value.batched), value)
            )
        self.held[eq.tensor.name] = value

    def result(self, tensor: Tensor) -> Operand:
        value = self.narrowed(tensor, self.held[tensor.name])
        if not tensor.fused:
            return value
        out = Operand(self.var(tensor.ascii + "_out"), value.dims, value.batched)
        return self.add(Fuse(out, value, tensor))

    def as_tensor(self, value: Arg, hint: str) -> Operand:
        if isinstance(value, Operand):
            return value
        return self.add(Full(Operand(self.var(hint), (), False), value))

    def linear(self, form: LinearForm, hint: str) -> Operand:
        x = self.as_tensor(self.node(form.x, hint), hint)
        out = Operand(self.var(hint), self.kernels.linear_dims(form, x), x.batched)
        bias = form.bias.tensor if form.bias is not None else None
        pick = None
        if form.literal is not None:  # the rows of one value of the index leading the block
            pick = (form.outer[form.literal], declared_outer(form)[form.literal])
        return self.add(
            Linear(
                out, x, form.inner, form.weight.tensor, form.out_axes, bias, form.transposed, pick
            )
        )

    # -- nodes -> steps; each returns the value's operand

    def node(self, node: ir.Node, hint: str) -> Arg:
        return getattr(self, "node_" + type(node).__name__)(node, hint)

    def node_Field(self, node: ir.Field, hint: str) -> Arg:
        if not node.free:
            return Number(node.expr)
        return self.add(
            Grid(Operand(self.var(hint + "_grid"), self.ordered(node.free), False), node.expr)
        )

    def node_Ref(self, node: ir.Ref, hint: str) -> Arg:
        tensor = node.tensor
        positions = self.literals.get(tensor.name, ())
        if tensor.name not in self.held:
            self.held[tensor.name] = self.unfuse(tensor, positions)
        base = self.narrowed(tensor, self.held[tensor.name])
        chosen = [node.written[tensor.indices.index(d)] for d in base.dims]
        select = tuple(_selected(c) for c in chosen)
        while select and select[-1] is None:
            select = select[:-1]
        kept = [(d, c) for d, c in zip(base.dims, chosen) if _selected(c) is None]
        dims = tuple(c if isinstance(c, Index) else d for d, c in kept)
        value = Operand(base.var, dims, base.batched, select)
        for declared, at in ((d, c) for d, c in kept if isinstance(c, ir.At)):
            value = gather(self, value, declared, at, node, hint)
        return value

    def unfuse(self, tensor: Tensor, positions: tuple[int, ...]) -> Operand:
        flat = tensor.indices
        order = tuple(flat[p] for p in positions) + tuple(
            i for k, i in enumerate(flat) if k not in positions
        )
        if not tensor.fused and not positions:
            return Operand(Var(-1, tensor.ascii, argument=True), order, tensor.batched)
        out = Operand(self.var(tensor.ascii + "_split"), order, tensor.batched)
        return self.add(Unfuse(out, tensor))

    def node_Sum(self, node: ir.Sum, hint: str) -> Arg:
        stacked = stack_form(node)
        if stacked is not None:
            return self.stack(*stacked, node, hint)
        form = linear_form(node)
        if form is not None and form.bias is not None and direct(form):
            return self.linear(form, hint + "_proj")
        # Smallest tensors first, numbers last: `M + P + S` adds the masks once, not per head.
        terms = sorted(
            ((self.node(t, hint), sign) for t, sign in map(signed, node.terms)),
            key=lambda pair: _planning_elements(pair[0]),
        )
        args, signs = tuple(a for a, _ in terms), tuple(s for _, s in terms)
        out = Operand(self.var(hint + "_sum"), self.ordered(node.free), any(map(_batched, args)))
        return self.add(Add(out, args, signs if -1 in signs else ()))

    def node_Apply(self, node: ir.Apply, hint: str) -> Arg:
        stacked = stack_form(node)
        if stacked is not None:
            return self.stack(*stacked, node, hint)
        node = numerics.guarded(node)
        top = self.top_k(node, hint)
        if top is not None:
            return top
        args = tuple(self.node(arg, hint) for arg in node.args)
        out = Operand(
            self.var(f"{hint}_{_word(node.fn)}"), self.ordered(node.free), any(map(_batched, args))
        )
        return self.add(Elementwise(out, node.fn, args))

    def top_k(self, node: ir.Apply, hint: str) -> Operand | None:
        """A rank compared with a number, `rank_<j>(e) < k` (`<= k`, or either mirrored): the
        mask of the k largest along j, torch.topk's (lower/printers/emit.py), no order of all j."""
        for side, fn, more in ((0, "<", 0), (0, "<=", 1), (1, ">", 0), (1, ">=", 1)):
            rank = node.args[side] if node.fn == fn else None
            if isinstance(rank, ir.Reduce) and rank.fn == "rank":
                bound = self.node(node.args[1 - side], hint)
                if not isinstance(bound, Number):
                    return None
                body = self.as_tensor(self.node(rank.body, hint), hint)
                out = Operand(self.var(f"{hint}_top"), body.dims, body.batched)
                keep = Number(bound.expr + more)
                return self.add(Reduction(out, "rank", body, rank.over, below=keep))
        return None

    def stack(self, over: Index, parts: tuple[ir.Node, ...], node: ir.Node, hint: str) -> Arg:
        """A `where` chain on every value of `over`, or a sum of chains (lower/planner/stacks.py):
        its parts stacked."""
        values = tuple(self.as_tensor(self.node(p, hint), hint) for p in parts)
        batched = any(v.batched for v in values)
        out = Operand(self.var(hint + "_stack"), self.ordered(node.free), batched)
        return self.add(Stack(out, values, over))

    def node_Concat(self, node: ir.Concat, hint: str) -> Arg:
        parts = tuple(self.as_tensor(self.node(p, hint), hint) for p in node.parts)
        out = Operand(self.var(hint + "_cat"), self.ordered(node.free), parts[0].batched)
        return self.add(Cat(out, parts, node.over, node.along))

    def node_Product(self, node: ir.Product, hint: str) -> Arg:
        """The first rule of PRODUCT_RULES (products.py) that plans the product."""
        for rule in products.PRODUCT_RULES:
            found = rule.plan(self, node, hint)
            if found is not None:
                return found
        raise AssertionError("the last rule, contract, plans every product")

    def node_Reduce(self, node: ir.Reduce, hint: str) -> Arg:
        """The first rule of REDUCTION_RULES that plans the reduction."""
        for rule in REDUCTION_RULES:
            found = rule.plan(self, node, hint)
            if found is not None:
                return found
        raise AssertionError("the last rule, reduce, plans every reduction")


def reduce_rule(planner, node: ir.Reduce, hint: str) -> Arg:
    body = planner.as_tensor(planner.node(node.body, hint), hint)
    safe = node.fn == "softmax" and planner.may_be_masked(node.body)
    # what the reduction leaves, in the body's order (`X.sum(dim=-1)` moves no axis)
    dims = body.dims if node.keeps else tuple(i for i in body.dims if i not in node.over)
    out = Operand(planner.var(f"{hint}_{node.fn}"), dims, body.batched)
    return planner.add(Reduction(out, node.fn, body, node.over, safe))


# The planner's rules for a reduction, in order: the first that applies plans it.
REDUCTION_RULES = (
    Rule("scatter", scatter_rule),  # scatter.py: a sum of where(b == P, E, 0)
    Rule("convolve", convolve_rule),  # conv.py: a kernel over shifted reads
    Rule("reduce", reduce_rule),  # the reduction over its axes
)


def _signature(step: Step) -> tuple | None:
    """What a step computes, its result's name aside; None for a step never shared (dropout
    draws anew each time)."""
    if isinstance(step, Elementwise) and step.fn == "dropout":
        return None
    values = tuple(getattr(step, f.name) for f in fields(step) if f.name != "out")
    return (type(step), step.out.dims, step.out.batched, *values)


def _word(fn: str) -> str:
    """A function or operator as a part of a name: `exp`, `pow`, `less`, `and`."""
    words = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
    return words.get(fn, fn)


def _planning_elements(arg: Arg) -> float:
    return planning_count(arg.dims) if isinstance(arg, Operand) else math.inf


def _batched(arg: Arg) -> bool:
    return isinstance(arg, Operand) and arg.batched


def _literal_positions(spec: Spec) -> dict[str, tuple[int, ...]]:
    """For each tensor, the flat positions that some reference selects with a literal."""
    found: dict[str, set[int]] = {}
    for eq in spec.equations:
        for ref in ir.refs(eq.rhs):
            hits = {k for k, i in enumerate(ref.written) if _selected(i) is not None}
            if hits:
                found.setdefault(ref.tensor.name, set()).update(hits)
    return {name: tuple(sorted(hits)) for name, hits in found.items()}


def _selected(item) -> int | sympy.Basic | None:
    """The position a literal, or a computed position with no index, selects; else None."""
    if isinstance(item, int):
        return item
    if isinstance(item, ir.At) and not item.free:
        return item.value.expr
    return None


def _field_references(spec: Spec) -> dict[ir.Ref, ir.Field]:
    """References, inside positions, to tensors defined by a tensor-free equation, as that
    equation's field in the reference's indices: a position `[β_<ττ'>]` is built as whole
    numbers, not read from β's values in the call's float dtype."""
    fields = {eq.tensor.name: eq for eq in spec.equations if isinstance(eq.rhs, ir.Field)}
    found = {}
    for ref in _position_refs(spec):
        if ref.tensor.name in fields and all(isinstance(i, Index) for i in ref.written):
            source = fields[ref.tensor.name]
            rename = {a.symbol: b.symbol for a, b in zip(source.indices, ref.written)}
            found[ref] = ir.Field(source.rhs.expr.xreplace(rename), ref.free, ref.span)
    return found


def _position_refs(spec: Spec):
    """References read as whole numbers only: in computed positions, a scatter's positions."""
    for eq in spec.equations:
        for ref in ir.refs(eq.rhs):
            for at in (i for i in ref.written if isinstance(i, ir.At)):
                yield from ir.refs(at.value)
        for positions in scatter_positions(eq.rhs):
            yield from ir.refs(positions)


def _unread(spec: Spec, fields: dict[ir.Ref, ir.Field]) -> set[str]:
    """Tensors read only as positions built from their fields: never computed as values."""
    read = {
        ref.tensor.name for eq in spec.equations for ref in ir.refs(eq.rhs) if ref not in fields
    }
    return {eq.tensor.name for eq in spec.equations} - read - {t.name for t in spec.outputs}
