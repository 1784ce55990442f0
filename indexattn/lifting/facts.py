"""Exported graph -> facts: every node read once, in order, by the rule registered for its op
(`RULES`), into values over atoms; products, softmaxes and values read twice become tensors of
the spec; views only regroup atoms; slices select by literals. What has no rule is a
LiftError naming the op, the node and the module's line."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import sympy
import torch

from .atoms import Atom, find, flat, group, leaves, same, split, unify, unify_lists
from .errors import LiftError, at_node
from .export import Exported
from .expr import Num, Op, Ref, Size, Softmax, Var, key, reads, substitute


@dataclass
class Value:
    """A tensor of the graph as the spec reads it: an expression, and its axes (each a group
    of atoms, row-major); `kind` float, bool or int; `const`: of positions and numbers alone;
    `hint`: a name for the tensor it may become."""

    expr: object
    axes: list
    kind: str = "float"
    const: bool = False
    hint: str = ""
    contracts: bool = False  # a product not yet a tensor (a projection): read once, inline

    def along(self, axes) -> Value:
        return replace(self, axes=axes)


@dataclass(frozen=True)
class Tensor:
    """A declared or derived tensor of the lifted spec: its role, its layout (groups of
    atoms), its dtype and, for params and buffers, the module's state_dict key."""

    name: str
    role: str
    layout: tuple
    dtype: str = "float"
    target: str = ""


@dataclass(frozen=True)
class Facts:
    """What the graph computes, as the spec will say it: its tensors in order, the equations
    (tensor, expression), the outputs, the batch atom and the sequence's size symbols."""

    tensors: tuple[Tensor, ...]
    equations: tuple[tuple[Tensor, object], ...]
    outputs: tuple[Tensor, ...]
    batch: tuple[int, ...]
    sequence: frozenset


RULES: dict[str, object] = {}


def rule(*names: str):
    """Registers the reading of the ops named (`aten.linear.default`, ...)."""

    def register(fn):
        for name in names:
            RULES[name] = fn
        return fn

    return register


def facts(exported: Exported) -> Facts:
    """`facts(export_module(module, x))` -> the Facts the spec text is printed from."""
    return Reader(exported).read()


class Reader:
    def __init__(self, exported: Exported) -> None:
        self.exported = exported
        self.values: dict[object, object] = {}  # graph node -> its Value (or list, or None)
        self.tensors: list[Tensor] = []
        self.equations: list[tuple[Tensor, object]] = []
        self.batch: list[Atom] = []
        self.names: set[str] = set()
        self.widths: dict[str, list] = {}  # a product's tensor -> the atoms it contracted

    def read(self) -> Facts:
        graph = self.exported.program.graph_module.graph
        self.nodes(graph)
        named = {node.name: node for node in graph.nodes}
        outputs = []
        for k, name in enumerate(self.exported.outputs):
            value, base = self.values[named[name]], "Y" if k == 0 else f"Y{k}"
            last = self.equations[-1][0] if self.equations else None
            if last is not None and _is_whole(value, last) and base not in self.names:
                outputs.append(self.renamed(last, base))  # the last projection is the output
            else:
                outputs.append(self.materialise(value, base, force=True))
        read = {n for _, expr in self.equations for n in _ref_names(expr)}
        kept = [t for t in self.tensors if t.role not in ("param", "buffer") or t.name in read]
        return Facts(
            tuple(kept),
            tuple(self.equations),
            tuple(outputs),
            tuple(find(b).id for b in self.batch),
            frozenset(self.exported.sequence),
        )

    def nodes(self, graph) -> None:
        for node in graph.nodes:
            try:
                self.node(node)
            except LiftError as error:
                raise at_node(error, node) from None

    def node(self, node) -> None:
        if node.op == "placeholder":
            if node not in self.values:  # a region's are its operands
                self.values[node] = self.placeholder(node)
            return
        if node.op in ("output", "get_attr"):  # get_attr: a region's graph, read where called
            return
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, int, float, bool)) and not isinstance(val, torch.Tensor):
            return  # a size computed from sizes: the shapes say it
        name = str(node.target) if node.target is not operator.getitem else "getitem"
        fn = RULES.get(name)
        if fn is None:
            raise LiftError("no rule reads this op")
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        out = fn(self, node, *args, **kwargs)
        read_twice = isinstance(out, Value) and len(node.users) > 1
        only_selected = all(_selects(u) for u in node.users)
        if read_twice and not (only_selected or out.const or _cheap(out.expr)):
            out = self.materialised(out)  # a value read twice is a tensor, computed once
        self.values[node] = out

    def region(self, node, graph, operands) -> list:
        """A region's graph (no_grad, autocast) read inline, its placeholders the operands."""
        inner = [n for n in graph.nodes if n.op == "placeholder"]
        self.values.update(zip(inner, operands))
        self.nodes(graph)
        (out,) = [n for n in graph.nodes if n.op == "output"]
        return [self.arg(a) for a in out.args[0]]

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr":
                return getattr(self.exported.program.graph_module, a.target)
            return self.values.get(a, _symbolic(a))
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    # -- inputs, params, buffers

    def placeholder(self, node) -> Value:
        kind, target = self.exported.placeholders[node.name]
        shape = node.meta["val"].shape
        if kind == "input":
            atoms = [Atom(_size(s), "") for s in shape]
            if len(atoms) >= 2:
                atoms[0].hint = "batch"
                self.batch.append(atoms[0])
            hints = {len(shape) - 1: "i", 1: "τ"} if len(shape) >= 3 else {len(shape) - 1: "i"}
            for k, h in hints.items():
                atoms[k].hint = atoms[k].hint or h
            floating = node.meta["val"].is_floating_point()
            name = target.upper() if len(target) == 1 else target
            tensor = self.declare(name, "input", atoms, "float" if floating else "int")
            return Value(
                Ref(tensor.name, tuple((a,) for a in atoms)),
                [[a] for a in atoms],
                "float" if floating else "int",
            )
        data = self.exported.program.state_dict.get(target)
        if data is None:
            data = self.exported.program.constants.get(target)
        positional = _positional(data) if data is not None else None
        if positional is not None:  # a mask held as a buffer: its predicate over positions
            return positional
        atoms = [Atom(_size(s)) for s in shape]
        role = "param" if kind == "param" else "buffer"
        name = target.removeprefix("layer.").replace(".", "_")  # a Call's layer: its own names
        tensor = self.declare(name, role, atoms, target=target)
        return Value(Ref(tensor.name, tuple((a,) for a in atoms)), [[a] for a in atoms])

    def declare(self, name: str, role: str, atoms, dtype="float", target="") -> Tensor:
        name = self.fresh(name)
        tensor = Tensor(name, role, tuple((a,) for a in atoms), dtype, target or name)
        self.tensors.append(tensor)
        return tensor

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}{k}"
        self.names.add(name)
        return name

    # -- tensors of the spec's own

    def renamed(self, tensor: Tensor, name: str) -> Tensor:
        self.names.add(name)
        new = replace(tensor, name=name)
        self.tensors[self.tensors.index(tensor)] = new
        self.equations[-1] = (new, self.equations[-1][1])
        return new

    def materialised(self, value: Value, hint: str = "") -> Value:
        """The value as a tensor of the spec's own (a reference to it from now on)."""
        if isinstance(value.expr, Ref) and value.expr.derived:
            return replace(value, contracts=False)
        tensor = self.materialise(value, hint or value.hint or "T")
        slots = tuple((a,) for axis in tensor.layout for a in axis)
        return Value(Ref(tensor.name, slots, True), value.axes, value.kind, hint=value.hint)

    def transposed(self, value: Value) -> bool:
        """A value whose last axis runs along the sequence and the one before does not (Kᵀ)."""

        def along(axis):
            return any(a.size.free_symbols & self.exported.sequence for a in flat(axis))

        return len(value.axes) >= 2 and along(value.axes[-1]) and not along(value.axes[-2])

    def materialise(self, value: Value, base: str, force: bool = False) -> Tensor:
        """A derived tensor over the atoms the expression reads (one along which it is only
        broadcast is left to the reader, as `+ M_<ττ'>` is)."""
        read = reads(value.expr)
        atoms = [a for a in flat([a for axis in value.axes for a in axis]) if a.id in read]
        if force:
            missing = [
                a for a in flat([a for axis in value.axes for a in axis]) if a.id not in read
            ]
            if [a for a in missing if a.id not in {find(b).id for b in self.batch}]:
                raise LiftError("an output broadcast along an axis it does not read")
        tensor = Tensor(self.fresh(base), "derived", tuple((a,) for a in atoms), value.kind)
        self.tensors.append(tensor)
        self.equations.append((tensor, value.expr))
        return tensor


def _symbolic(node):
    val = node.meta.get("val")
    return _size(val) if isinstance(val, (torch.SymInt, int)) else None


def _size(s):
    if isinstance(s, torch.SymInt):
        return sympy.sympify(str(s.node.expr))
    return sympy.Integer(int(s))


def _selects(node) -> bool:
    return node.target is operator.getitem or str(node.target) in (
        "aten.select.int",
        "aten.slice.Tensor",
    )


def _positional(data: torch.Tensor) -> Value | None:
    """A buffer that is a causal mask (its last two axes lower-triangular ones, or a bool
    tril), as the predicate of positions it is: 1 where τ' <= τ."""
    if data.dim() < 2 or data.shape[-1] != data.shape[-2] or data.shape[-1] < 2:
        return None
    square = data.reshape(-1, *data.shape[-2:])
    tril = torch.ones(data.shape[-2:], dtype=data.dtype, device=data.device).tril()
    if not all(torch.equal(square[k], tril) for k in range(square.shape[0])):
        return None
    rows, cols = Atom(data.shape[-2]), Atom(data.shape[-1])
    expr = Op("where", (Op(">", (Var(cols), Var(rows))), Num(0.0), Num(1.0)))
    axes = [[Atom(1)] for _ in range(data.dim() - 2)] + [[rows], [cols]]
    return Value(expr, axes, "float", const=True)


# -- the rules


def _axis(value: Value, dim: int) -> int:
    return dim % len(value.axes)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@rule(
    "aten.contiguous.default",
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.to.dtype",
    "aten.to.dtype_layout",
    "aten.to.device",
    "aten._to_copy.default",
    "aten.type_as.default",
)
def _same(reader, node, x, *args, **kwargs):
    return x


@rule("wrap_with_set_grad_enabled")
def _no_grad(reader, node, enabled, graph, *operands):
    return reader.region(node, graph.graph, operands)


@rule("wrap_with_autocast")
def _autocast(reader, node, device, dtype, enabled, cache, graph, *operands):
    return reader.region(node, graph.graph, operands)


@rule("aten._assert_tensor_metadata.default")
def _nothing(reader, node, *args, **kwargs):
    return None


@rule("aten.dropout.default")
def _dropout(reader, node, x, p, train):
    if train and p:
        raise LiftError("dropout in training mode: lift the module in eval mode (module.eval())")
    return x


@rule("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
def _view(reader, node, x, shape):
    sizes = [_size(s) for s in node.meta["val"].shape]
    atoms = [a for axis in x.axes for a in axis]
    axes = group(atoms, sizes)
    if len(axes) > len(x.axes):  # heads split off a width: the head and its width
        for k, axis in enumerate(axes):
            for atom in flat(axis):
                if not atom.hint:
                    atom.hint = "a" if k == len(axes) - 1 else "μ"
    return x.along(axes)


@rule("aten.unflatten.int")
def _unflatten(reader, node, x, dim, sizes):
    d = _axis(x, dim)
    parts = group(x.axes[d], [_size(s) if not _number(s) else s for s in sizes])
    for axis, hint in zip(parts, ("B",) if len(parts) == 2 else ()):
        if len(axis) == 1 and not find(axis[0]).hint:
            find(axis[0]).hint = hint
    return x.along(x.axes[:d] + parts + x.axes[d + 1 :])


@rule("aten.transpose.int")
def _transpose(reader, node, x, a, b):
    axes = list(x.axes)
    a, b = _axis(x, a), _axis(x, b)
    axes[a], axes[b] = axes[b], axes[a]
    return x.along(axes)


@rule("aten.t.default")
def _t(reader, node, x):
    return _transpose(reader, node, x, 0, 1)


@rule("aten.numpy_T.default")
def _numpy_t(reader, node, x):
    return x.along(list(reversed(x.axes)))


@rule("aten.permute.default")
def _permute(reader, node, x, dims):
    return x.along([x.axes[d] for d in dims])


@rule("aten.unsqueeze.default")
def _unsqueeze(reader, node, x, dim):
    d = dim % (len(x.axes) + 1)
    return x.along([*x.axes[:d], [Atom(1)], *x.axes[d:]])


@rule("aten.squeeze.dim", "aten.squeeze.dims")
def _squeeze(reader, node, x, dims):
    dims = {d % len(x.axes) for d in (dims if isinstance(dims, (list, tuple)) else [dims])}
    axes = [a for k, a in enumerate(x.axes) if k not in dims or flat(a)]
    return x.along(axes)


@rule("aten.expand.default")
def _expand(reader, node, x, sizes):
    shape = [_size(s) for s in node.meta["val"].shape]
    axes = [[Atom(1)] for _ in range(len(shape) - len(x.axes))] + list(x.axes)
    out = []
    for k, (axis, size) in enumerate(zip(axes, shape)):
        if not flat(axis) and not same(size, 1):  # a broadcast: repeat_kv's r
            fresh = Atom(size, "r")
            if k > 0 and len(flat(axes[k - 1])) == 1:
                find(flat(axes[k - 1])[0]).hint = "g"
            out.append([fresh])
        else:
            out.append(axis)
    return x.along(out)


@rule("aten.repeat_interleave.self_int")
def _repeat_interleave(reader, node, x, repeats, dim=None, output_size=None):
    """Each entry of an axis repeated `repeats` times (GQA's kv heads): the axis (g r), r
    broadcast."""
    if dim is None:
        raise LiftError("a repeat_interleave of the flattened tensor: give dim")
    d = _axis(x, dim)
    atoms = flat(x.axes[d])
    if len(atoms) == 1:
        find(atoms[0]).hint = find(atoms[0]).hint or "g"
    repeated = [*x.axes[d], Atom(sympy.Integer(repeats), "r")]
    return x.along([*x.axes[:d], repeated, *x.axes[d + 1 :]])


@rule("aten.linear.default")
def _linear(reader, node, x, weight, bias=None):
    x = _operand(reader, x)
    unify_lists(x.axes[-1], weight.axes[1])
    expr = Op("*", (weight.expr, x.expr))
    if bias is not None:
        unify_lists(bias.axes[0], weight.axes[0])
        expr = Op("+", (expr, bias.expr))
    (out,) = weight.axes[0]
    if not find(out).hint:  # the model's width again, or a head's
        inner = sympy.Mul(*[a.size for a in flat(x.axes[-1])])
        find(out).hint = "i" if same(find(out).size, inner) else "a"
    hint = str(weight.expr.name).removesuffix("_weight") if isinstance(weight.expr, Ref) else ""
    return Value(expr, [*x.axes[:-1], weight.axes[0]], hint=_tensor_name(hint), contracts=True)


def _tensor_name(hint: str) -> str:
    """Q, K, V for projections named so (q_proj, query, ...), else the module's own name."""
    last = hint.split("_")[-2] if hint.endswith("_proj") else hint.rsplit("_", 1)[-1]
    return {"q": "Q", "query": "Q", "k": "K", "key": "K", "v": "V", "value": "V"}.get(last, "")


@rule("aten.matmul.default", "aten.bmm.default")
def _matmul(reader, node, a, b):
    a, b = _operand(reader, a), _operand(reader, b, reader.transposed(b))
    b = _renamed(b, a.axes[:-1], b.axes[-2])  # one sequence contracted against itself: τ''
    unify_lists(a.axes[-1], b.axes[-2])
    batch = _broadcast_axes(a.axes[:-2], b.axes[:-2])
    b = _renamed(b, a.axes[:-1], b.axes[-1])  # queries and keys of one sequence: τ and τ'
    hint = "O" if isinstance(a.expr, Ref) and a.expr.name.startswith("A") else "S"
    value = Value(Op("*", (a.expr, b.expr)), [*batch, a.axes[-2], b.axes[-1]])
    out = reader.materialised(value, hint)
    reader.widths[out.expr.name] = flat(a.axes[-1])
    return out


def _operand(reader, x: Value, transposed: bool = False) -> Value:
    """A factor of a product as a tensor of its own (rotated queries: Qr), unless it is one;
    one read transposed (keys as Kᵀ) is written in its own order, K_<μτa>."""
    if (isinstance(x.expr, Ref) and not x.contracts) or x.const:
        return x
    names = [n for n in _ref_names(x.expr)]
    base = x.hint or ((names[0] + "r") if names else "T")
    if transposed:
        turned = reader.materialised(x.along([*x.axes[:-2], x.axes[-1], x.axes[-2]]), base)
        return turned.along(x.axes)
    return reader.materialised(x, base)


def _ref_names(expr):
    if isinstance(expr, Ref):
        yield expr.name
    elif isinstance(expr, Op):
        for a in expr.args:
            yield from _ref_names(a)
    elif isinstance(expr, Softmax):
        yield from _ref_names(expr.arg)


@rule("aten.outer.default")
def _outer(reader, node, a, b):
    return Value(Op("*", (a.expr, b.expr)), a.axes + b.axes, const=a.const and b.const, hint="θ")


def _renamed(b: Value, kept_axes, axis) -> Value:
    """b with the atoms of its axis that a's kept axes also read renamed (τ -> τ'): one
    sequence read as queries and as keys is two indices."""
    taken = {leaf.id for ax in kept_axes for leaf in flat(ax)}
    mapping = {}
    for leaf in flat(axis):
        if leaf.id in taken:
            mapping[leaf.id] = Atom(leaf.size, leaf.hint)
    if not mapping:
        return b
    axes = [[mapping.get(leaf.id, leaf) for leaf in flat(ax)] or ax for ax in b.axes]
    return replace(b, expr=substitute(b.expr, mapping), axes=axes)


def _broadcast_axes(*lists):
    """Axes broadcast from the right: those of one size unified, units taking the other's."""
    n = max(len(axes) for axes in lists)
    padded = [[[Atom(1)]] * (n - len(axes)) + list(axes) for axes in lists]
    out = []
    for column in zip(*padded):
        real = [axis for axis in column if flat(axis)]
        for other in real[1:]:
            unify_lists(real[0], other)
        out.append(real[0] if real else column[0])
    return out


def _elementwise(op: str, *values, kind="float", reader=None):
    if reader is not None:  # a projection read by an elementwise step: a tensor first
        values = tuple(
            _operand(reader, v) if isinstance(v, Value) and v.contracts else v for v in values
        )
    tensors = [v for v in values if isinstance(v, Value)]
    axes = _broadcast_axes(*(v.axes for v in tensors))
    args = tuple(v.expr if isinstance(v, Value) else Num(float(v)) for v in values)
    const = all(v.const for v in tensors)
    return Value(Op(op, args), axes, kind, const)


def _table(make, ops: dict) -> None:
    """Registers `make(what)` as the reading of each op named: one table per kind of op."""
    for name, what in ops.items():
        RULES[name] = make(*what) if isinstance(what, tuple) else make(what)


def _binary(op):
    def read(reader, node, a, b, *args, alpha=1, **kwargs):
        if alpha != 1:
            b = _elementwise("*", b, alpha, reader=reader) if isinstance(b, Value) else b * alpha
        if op in "*/" and _number(b) and b == 1:
            return a  # attention_scaling 1.0: no factor
        scaled = _scale(reader, op, a, b)
        return scaled or _elementwise(op, a, b, reader=reader)

    return read


_table(
    _binary,
    {
        "aten.add.Tensor": "+",
        "aten.sub.Tensor": "-",
        "aten.mul.Tensor": "*",
        "aten.div.Tensor": "/",
        "aten.pow.Tensor_Scalar": "^",
        "aten.pow.Tensor_Tensor": "^",
    },
)


@rule("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(reader, node, a, b, alpha=1):
    return _elementwise("-", b, a, reader=reader)


def _compare(op):
    def read(reader, node, a, b):
        return _fold(op, a, b) or _elementwise(op, a, b, kind="bool", reader=reader)

    return read


_table(
    _compare,
    {
        f"aten.{name}.{kind}": op
        for name, op in {
            "eq": "==",
            "ne": "!=",
            "lt": "<",
            "le": "<=",
            "gt": ">",
            "ge": ">=",
        }.items()
        for kind in ("Scalar", "Tensor")
    },
)


def _function(fn):
    def read(reader, node, x, *args, **kwargs):
        return _elementwise(fn, x, reader=reader)

    return read


_table(
    _function,
    {
        "aten.neg.default": "neg",
        "aten.exp.default": "exp",
        "aten.log.default": "log",
        "aten.sqrt.default": "sqrt",
        "aten.rsqrt.default": "rsqrt",
        "aten.tanh.default": "tanh",
        "aten.sigmoid.default": "sigmoid",
        "aten.cos.default": "cos",
        "aten.sin.default": "sin",
        "aten.relu.default": "relu",
        "aten.silu.default": "silu",
        "aten.abs.default": "abs",
        "aten.logical_not.default": "not",
        "aten.bitwise_not.default": "not",
    },
)


@rule("aten.masked_fill.Scalar")
def _masked_fill(reader, node, x, mask, value):
    return _elementwise("where", mask, value, x, reader=reader)


@rule("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(reader, node, cond, a, b):
    return _elementwise("where", cond, a, b, reader=reader)


@rule("aten.softmax.int", "aten._softmax.default")
def _softmax(reader, node, x, dim, *args):
    x = _operand(reader, x) if x.contracts else x
    axis = flat(x.axes[_axis(x, dim)])
    if len(axis) != 1:
        raise LiftError("a softmax over an axis of several indices")
    return reader.materialised(Value(Softmax(axis[0], x.expr), x.axes), "A")


@rule("aten.arange.default", "aten.arange.start")
def _arange(reader, node, *args, **kwargs):
    if len(args) > 1 and args[0] != 0:
        raise LiftError("positions that do not start at 0")
    atom = Atom(_size(node.meta["val"].shape[0]))
    return Value(Var(atom), [[atom]], const=True)


@rule("aten.full.default")
def _full(reader, node, size, value, **kwargs):
    atoms = [Atom(_size(s)) for s in node.meta["val"].shape]
    kind = "bool" if node.meta["val"].dtype is torch.bool else "float"
    return Value(Num(float(value)), [[a] for a in atoms], kind, const=True)


@rule("aten.ones_like.default", "aten.zeros_like.default", "aten.full_like.default")
def _like(reader, node, x, value=None, **kwargs):
    if value is None:
        value = 1.0 if "ones" in str(node.target) else 0.0
    kind = "bool" if node.meta["val"].dtype is torch.bool else "float"
    return Value(Num(float(value)), x.axes, kind, const=True)


@rule("aten.ones.default", "aten.zeros.default")
def _ones(reader, node, size, **kwargs):
    return _full(reader, node, size, 1.0 if "ones" in str(node.target) else 0.0)


@rule("aten.new_ones.default", "aten.new_zeros.default")
def _new(reader, node, x, size, **kwargs):
    return _ones(reader, node, size)


def _logical(op: str, unit: float):
    """`a & b`, `a | b` of predicates; the unit (and_masks' new_ones, or_masks' new_zeros)
    left out."""

    def read(reader, node, a, b):
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Value) and x.const and not x.axes and key(x.expr) == key(Num(unit)):
                return y
        return _elementwise(op, a, b, kind="bool", reader=reader)

    return read


_table(
    _logical,
    {
        "aten.bitwise_and.Tensor": ("and", 1.0),
        "aten.logical_and.default": ("and", 1.0),
        "aten.__and__.Tensor": ("and", 1.0),
        "aten.__or__.Tensor": ("or", 0.0),
        "aten.bitwise_or.Tensor": ("or", 0.0),
        "aten.logical_or.default": ("or", 0.0),
    },
)


@rule("aten.triu.default", "aten.tril.default")
def _triangle(reader, node, x, diagonal=0):
    rows, cols = flat(x.axes[-2]), flat(x.axes[-1])
    if len(rows) != 1 or len(cols) != 1:
        raise LiftError("a triangle of axes of several indices")
    upper = "triu" in str(node.target)
    plain = {(True, 0): ">=", (True, 1): ">", (False, 0): "<=", (False, -1): "<"}
    if (upper, diagonal) in plain:  # τ' > τ: above the diagonal
        keep = Op(plain[upper, diagonal], (Var(cols[0]), Var(rows[0])))
    else:
        distance = Op("-", (Var(cols[0]), Var(rows[0])))
        keep = Op(">=" if upper else "<=", (distance, Num(float(diagonal))))
    if x.kind == "bool" and key(x.expr) == key(Num(1.0)):  # a triangle of True: the predicate
        return Value(keep, x.axes, "bool", x.const)
    return Value(Op("where", (keep, x.expr, Num(0.0))), x.axes, x.kind, x.const)


@rule("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default")
def _split(reader, node, x, size, dim=0):
    d = _axis(x, dim)
    parts = [_size(v.shape[d]) for v in node.meta["val"]]
    if any(not same(p, parts[0]) for p in parts):
        raise LiftError("a split into parts of unequal sizes")
    count, part = group(x.axes[d], [len(parts), parts[0]])
    count = flat(count)
    if len(count) != 1:
        raise LiftError("a split of an axis of several indices")
    find(count[0]).hint = find(count[0]).hint or "B"
    names = "QKV" if len(parts) == 3 else ""
    return [
        replace(_select_at(x, d, count[0], k, [part]), hint=names[k] if names else x.hint)
        for k in range(len(parts))
    ]


@rule("aten.unbind.int")
def _unbind(reader, node, x, dim=0):
    d = _axis(x, dim)
    return [_select(reader, node, x, d, k) for k in range(len(node.meta["val"]))]


@rule("getitem")
def _getitem(reader, node, items, k):
    return items[k]


@rule("aten.select.int")
def _select(reader, node, x, dim, index):
    d = _axis(x, dim)
    atoms = flat(x.axes[d])
    if len(atoms) != 1:
        raise LiftError("a select on an axis of several indices")
    k = index % int(atoms[0].size)
    out = _select_at(x, d, atoms[0], k, [])
    return replace(out, hint="QKV"[k]) if atoms[0].size == 3 and atoms[0].hint == "B" else out


def _select_at(x: Value, d: int, atom: Atom, k: int, replacement) -> Value:
    expr = substitute(x.expr, {find(atom).id: k})
    return replace(x, expr=expr, axes=x.axes[:d] + replacement + x.axes[d + 1 :])


@rule("aten.slice.Tensor")
def _slice(reader, node, x, dim=0, start=None, end=None, step=1):
    d = _axis(x, dim)
    axis = flat(x.axes[d])
    size = sum(int(a.size) for a in axis) if all(a.size.is_Integer for a in axis) else None
    new = _size(node.meta["val"].shape[d])
    start = 0 if start is None else start
    if step != 1:
        raise LiftError("a slice with a step")
    if same(new, sympy.Mul(*[a.size for a in axis])):
        return x  # the whole axis
    if x.const and start == 0 and len(axis) == 1:  # positions read to a shorter length
        fresh = Atom(new)
        expr = substitute(x.expr, {axis[0].id: fresh})
        return replace(x, expr=expr, axes=[*x.axes[:d], [fresh], *x.axes[d + 1 :]])
    whole = sympy.Mul(*[a.size for a in axis])
    if size is None or not whole.is_Integer or not new.is_Integer or int(whole) % int(new):
        raise LiftError("a slice that is no equal part of its axis")
    if not isinstance(start, int) or start % int(new):
        raise LiftError("a slice that is no equal part of its axis")
    count, part = group(axis, [int(whole) // int(new), new])
    count = flat(count)
    if len(count) != 1:
        raise LiftError("a slice of an axis of several indices")
    find(count[0]).hint = find(count[0]).hint or "c"
    for a in flat(part):
        find(a).hint = find(a).hint or "j"
    return _select_at(x, d, count[0], start // int(new), [part])


@rule("aten.cat.default")
def _cat(reader, node, parts, dim=0):
    d = dim % len(parts[0].axes)
    axes = _broadcast_axes(*([*p.axes[:d], *p.axes[d + 1 :]] for p in parts))
    parts = [_operand(reader, p) if p.contracts else p for p in parts]
    for p in parts[1:]:
        unify_lists(parts[0].axes[d], p.axes[d])
    inner = parts[0].axes[d]
    for a in flat(inner):
        find(a).hint = find(a).hint or "j"
    c = Atom(len(parts), "c")
    exprs = [p.expr for p in parts]
    hint = "C"
    if all(key(e) == key(exprs[0]) for e in exprs):
        expr, hint = exprs[0], parts[0].hint  # one value repeated: read along c as it is
    else:
        expr = _rotated(exprs, c) or _chain(exprs, c)
    out = [*axes[:d], [c, *inner], *axes[d:]]
    return Value(expr, out, parts[0].kind, all(p.const for p in parts), hint)


def _chain(exprs, c: Atom):
    expr = exprs[-1]
    for k in range(len(exprs) - 2, -1, -1):
        expr = Op("where", (Op("==", (Var(c), Num(float(k)))), exprs[k], expr))
    return expr


def _rotated(exprs, c: Atom):
    """rotate_half's cat((-x2, x1)) of the halves x1 = x[c = 0], x2 = x[c = 1]:
    (2c - 1) x[1 - c]."""
    if len(exprs) != 2 or not (isinstance(exprs[0], Op) and exprs[0].op == "neg"):
        return None
    first, second = exprs[0].args[0], exprs[1]
    if not (isinstance(first, Ref) and isinstance(second, Ref) and first.name == second.name):
        return None
    slots_a = [s for axis in first.axes for s in axis]
    slots_b = [s for axis in second.axes for s in axis]
    differ = [k for k, (a, b) in enumerate(zip(slots_a, slots_b)) if _slot_key(a) != _slot_key(b)]
    if len(differ) != 1 or (slots_a[differ[0]], slots_b[differ[0]]) != (1, 0):
        return None
    position = Op("-", (Num(1.0), Var(c)))
    axes, k = [], 0
    for axis in second.axes:
        items = []
        for s in axis:
            items.append(("pos", position) if k == differ[0] else s)
            k += 1
        axes.append(tuple(items))
    sign = Op("-", (Op("*", (Num(2.0), Var(c))), Num(1.0)))
    return Op("*", (sign, Ref(second.name, tuple(axes), second.derived)))


def _slot_key(s):
    return ("atom", find(s).id) if isinstance(s, Atom) else s


@rule("aten.scaled_dot_product_attention.default")
def _sdpa(
    reader,
    node,
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
):
    if dropout_p:
        raise LiftError("attention dropout: lift the module in eval mode")
    q, k, v = _operand(reader, q), _operand(reader, k), _operand(reader, v)
    k_axes, v_axes = list(k.axes), list(v.axes)
    if enable_gqa:
        heads_q, heads_k = flat(q.axes[-3]), flat(k.axes[-3])
        if len(heads_q) == 1 and len(heads_k) == 1 and not same(heads_q[0].size, heads_k[0].size):
            g, r = split(heads_q[0], heads_k[0].size)
            r.hint, find(heads_k[0]).hint = "r", "g"
            unify(g, heads_k[0])
            k_axes[-3] = v_axes[-3] = q.axes[-3]
    scores = _matmul(reader, node, q, Value(k.expr, [*k_axes[:-2], k_axes[-1], k_axes[-2]]))
    keys = flat(scores.axes[-1])[0]
    width = reader.widths[scores.expr.name]
    if scale is None:  # 1 / sqrt of the width contracted
        arg = Op("/", (scores.expr, Op("sqrt", (Size(tuple(width)),))))
    else:
        arg = _scale(reader, "*", scores, scale).expr
    if is_causal:
        hidden = Op(">", (Var(keys), Var(flat(scores.axes[-2])[0])))
        arg = Op("+", (arg, Op("where", (hidden, Num(-math.inf), Num(0.0)))))
    if attn_mask is not None:
        _elementwise("+", scores, attn_mask)  # unifies the mask's axes with the scores'
        term = attn_mask.expr
        if attn_mask.kind == "bool":
            term = Op("where", (attn_mask.expr, Num(0.0), Num(-math.inf)))
        arg = Op("+", (arg, term))
    weights = reader.materialised(Value(Softmax(keys, arg), scores.axes), "A")
    (position,) = flat(v_axes[-2])  # the values are read at the keys' positions
    expr = substitute(v.expr, {position.id: keys})
    return _matmul(reader, node, weights, Value(expr, [*v_axes[:-2], [keys], v_axes[-1]]))


__all__ = ["RULES", "Facts", "Tensor", "facts", "leaves"]


def _scale(reader, op: str, a, b) -> Value | None:
    """Scores times 1/sqrt(d) or over sqrt(d), d the width they contracted, as `/ sqrt(d_k)`;
    any other number as it is."""
    if not (isinstance(a, Value) and isinstance(a.expr, Ref) and _number(b) and op in "*/"):
        return None
    width = reader.widths.get(a.expr.name)
    if width is None:
        return Value(Op(op, (a.expr, Num(float(b)))), a.axes) if op == "*" else None
    root = math.sqrt(float(sympy.Mul(*[w.size for w in width])))
    if math.isclose(b, 1 / root if op == "*" else root, rel_tol=1e-12):
        return Value(Op("/", (a.expr, Op("sqrt", (Size(tuple(width)),)))), a.axes)
    return Value(Op(op, (a.expr, Num(float(b)))), a.axes)


def _fold(op: str, a, b) -> Value | None:
    """`where(c, 0, 1) == 0` as c: a buffer's mask compared with a number."""
    if not (op in ("==", "!=") and isinstance(a, Value) and _number(b)):
        return None
    expr = a.expr
    if not (
        isinstance(expr, Op)
        and expr.op == "where"
        and all(isinstance(x, Num) for x in expr.args[1:])
    ):
        return None
    hits = [(x.value == b) == (op == "==") for x in expr.args[1:]]
    if hits == [True, False]:
        return replace(a, expr=expr.args[0], kind="bool")
    if hits == [False, True]:
        return replace(a, expr=Op("not", (expr.args[0],)), kind="bool")
    return None


def _cheap(expr) -> bool:
    """A function of one tensor or position (cos θ): written where it is read, not kept."""
    return isinstance(expr, Op) and len(expr.args) == 1 and isinstance(expr.args[0], (Ref, Var))


def _is_whole(value: Value, tensor: Tensor) -> bool:
    """The value is the tensor read whole, in its own order."""
    if not (isinstance(value.expr, Ref) and value.expr.name == tensor.name and value.expr.derived):
        return False
    read = [find(s).id for axis in value.expr.axes for s in axis if isinstance(s, Atom)]
    axes = [a.id for a in flat([a for axis in value.axes for a in axis])]
    return read == [a for a in axes if a in read] and len(read) == len(
        [s for axis in value.expr.axes for s in axis]
    )
