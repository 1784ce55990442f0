"""Plan steps -> lines of Python, one operation per line. Names come from the module's
allocator; what each line needs (imports, sizes, device and dtype) is recorded as it is
printed, never recovered from the text."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from .. import ops
from ..ir import CONDITIONS, Index, Spec
from .naming import Names
from .printers import GridPrinter, ScalarPrinter, wrap
from .steps import (
    Add,
    Arg,
    Attention,
    Contract,
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
    Unfuse,
)


@dataclass
class Needs:
    """What printed lines use beyond their own variables."""

    imports: set[str] = field(default_factory=set)  # torch, F, math, einsum, rearrange
    sizes: set[sympy.Symbol] = field(default_factory=set)
    scalars: set[sympy.Symbol] = field(default_factory=set)
    indices: dict[Index, None] = field(default_factory=dict)  # positions, in first use
    device: bool = False
    dtype: bool = False


class Emitter:
    """Prints steps; `needs` accumulates what the printed lines use."""

    def __init__(self, spec: Spec, names: Names) -> None:
        self.spec, self.names, self.needs = spec, names, Needs()
        self.symbols = {s: sympy.Symbol(a) for s, a in spec.size_names.items()}
        self.symbols |= {s.symbol: sympy.Symbol(s.ascii) for s in spec.scalars}
        self.scalar_symbols = {s.symbol for s in spec.scalars}

    def lines(self, step) -> list[str]:
        """The step's code, its last line commented with the axes of its result."""
        code = getattr(self, "step_" + type(step).__name__)(step)
        code = code if isinstance(code, list) else [code]
        axes = _layout(step.tensor, step.out.batched) if isinstance(step, Fuse) else None
        return [*code[:-1], f"{code[-1]}  # {axes or _axes(step.out)}"]

    # -- values

    def use(self, *modules: str) -> None:
        self.needs.imports.update(modules)

    def scalar(self, expr: sympy.Basic) -> str:
        """A sizes-and-scalars expression, in the generated code's names."""
        self.needs.sizes |= expr.free_symbols & set(self.spec.sizes)
        self.needs.scalars |= expr.free_symbols & self.scalar_symbols
        printer = ScalarPrinter()
        code = printer.doprint(expr.xreplace(self.symbols))
        self.use(*printer.module_imports)
        return code

    def size(self, index: Index) -> str:
        return self.scalar(index.size)

    def number(self, expr: sympy.Basic) -> str:
        """A Python float: printed from its value when it is a number."""
        return repr(float(expr)) if expr.is_number else self.scalar(expr)

    def tensor_of(self, number: str) -> str:
        self.use("torch")
        self.needs.device = self.needs.dtype = True
        return f"torch.tensor({number}, device=device, dtype=dtype)"

    def var(self, operand: Operand) -> str:
        return self.names.var(operand.var)

    def ref(self, arg: Operand) -> str:
        name = self.var(arg)
        if not arg.select:
            return name
        lead = "..., " if arg.batched else ""
        picks = ", ".join(":" if s is None else str(s) for s in arg.select)
        return f"{name}[{lead}{picks}]"

    def arg(self, arg: Arg, dims: tuple[Index, ...]) -> str:
        """An argument aligned to `dims` for broadcasting (a number stays a number)."""
        if isinstance(arg, Number):
            return wrap(self.scalar(arg.expr))
        return expand(self.ref(arg), arg.dims, dims, arg.batched)

    def pattern(self, axes, batched: bool) -> str:
        """An einops pattern side: `... mu tau a`, `(mu B a) i`."""
        words = [
            "(" + " ".join(self.names.axis(i) for i in axis) + ")"
            if isinstance(axis, tuple)
            else self.names.axis(axis)
            for axis in axes
        ]
        return " ".join((["..."] if batched else []) + words)

    # -- steps

    def step_Unfuse(self, step: Unfuse) -> str:
        tensor = step.tensor
        source = self.pattern([a if len(a) > 1 else a[0] for a in tensor.layout], tensor.batched)
        target = self.pattern(step.out.dims, tensor.batched)
        lengths = [
            f"{self.names.axis(i)}={self.size(i)}"
            for axis in tensor.layout
            if len(axis) > 1
            for i in axis[:-1]
        ]
        self.use("rearrange")
        extra = "".join(", " + length for length in lengths)
        return f'{self.var(step.out)} = rearrange({tensor.ascii}, "{source} -> {target}"{extra})'

    def step_Grid(self, step: Grid) -> str:
        """A tensor of positions; printed into the module's constants function."""
        dims = step.out.dims
        views = {}
        for k, index in enumerate(dims):
            self.needs.indices[index] = None
            name = self.names.index(index)
            shaped = [":" if j == k else "None" for j in range(len(dims))]
            views[index.symbol] = sympy.Symbol(
                name if len(dims) == 1 else f"{name}[{', '.join(shaped)}]"
            )
        self.needs.sizes |= step.expr.free_symbols & set(self.spec.sizes)
        self.needs.sizes |= {s for i in dims for s in i.size.free_symbols}
        self.needs.scalars |= step.expr.free_symbols & self.scalar_symbols
        printer = GridPrinter(frozenset(views.values()), ScalarPrinter())
        code = printer.doprint(step.expr.xreplace({**self.symbols, **views}))
        self.use("torch", *printer.scalar.module_imports)
        if not all(i.symbol in step.expr.free_symbols for i in dims):  # sympy simplified some away
            shape = ", ".join(self.size(i) for i in dims)
            code = f"torch.broadcast_to(torch.as_tensor({code}, device=device), ({shape},))"
        if not isinstance(step.expr, CONDITIONS):
            code = f"{wrap(code)}.to(dtype)"
        return f"{self.var(step.out)} = {code}"

    def step_Contract(self, step: Contract) -> str:
        out = step.out
        if len(step.args) == 1:
            code = self.arg(step.args[0], out.dims)
        elif len(step.args) == 2 and not _summed(step):
            code = " * ".join(self.arg(a, out.dims) for a in step.args)
        else:
            code = self.matmul(step) or self.einsum(step)
        return f"{self.var(out)} = {code}{self.scaled(step.scale)}"

    def einsum(self, step: Contract) -> str:
        self.use("einsum")
        pattern = ", ".join(self.pattern(a.dims, a.batched) for a in step.args)
        pattern += " -> " + self.pattern(step.out.dims, step.out.batched)
        return f'einsum({", ".join(self.ref(a) for a in step.args)}, "{pattern}")'

    def matmul(self, step: Contract) -> str | None:
        """`a @ b` when the result is (batch..., m, n), a holds m and b holds n, and one index
        is summed: the two operands are viewed, not copied."""
        summed, out = _summed(step), step.out.dims
        if len(step.args) != 2 or len(summed) != 1 or len(out) < 2:
            return None
        a, b = step.args
        if out[-2] in b.dims and out[-1] in a.dims:
            a, b = b, a
        batch, (m, n), k = out[:-2], out[-2:], summed[0]
        if m in b.dims or n in a.dims or m not in a.dims or n not in b.dims:
            return None
        if any(i not in a.dims or i not in b.dims for i in batch) or a.batched != b.batched:
            return None  # torch.matmul would copy the operand it broadcasts; einsum does not
        left = expand(self.ref(a), a.dims, (*batch, m, k), a.batched)
        right = expand(self.ref(b), b.dims, (*batch, k, n), b.batched)
        return f"{wrap(left)} @ {wrap(right)}"

    def scaled(self, scale: sympy.Basic) -> str:
        if scale == 1:
            return ""
        numerator, denominator = scale.as_numer_denom()
        if numerator == 1:
            return f" / {wrap(self.scalar(denominator))}"
        return f" * {wrap(self.scalar(scale))}"

    def step_Add(self, step: Add) -> str:
        terms = [self.arg(a, step.out.dims) for a in step.args]
        return f"{self.var(step.out)} = {' + '.join(terms)}"

    def step_Rename(self, step: Rename) -> str:
        return f"{self.var(step.out)} = {self.arg(step.arg, step.out.dims)}"

    def step_Full(self, step: Full) -> str:
        return f"{self.var(step.out)} = {self.tensor_of(self.scalar(step.value.expr))}"

    def step_Elementwise(self, step: Elementwise) -> str:
        args = [self.arg(a, step.out.dims) for a in step.args]
        if step.fn == "where" and all(isinstance(x, Number) for x in step.args[1:]):
            args[1] = self.tensor_of(args[1])
        op = ops.lookup(step.fn)
        self.use(*op.imports)
        return f"{self.var(step.out)} = {op.torch.format(*args)}"

    def step_Reduction(self, step: Reduction) -> str | list[str]:
        out, arg = self.var(step.out), step.arg
        dims = tuple(arg.dims.index(i) - len(arg.dims) for i in step.over)
        dim = str(dims[0]) if len(dims) == 1 else str(dims)
        x = self.ref(arg)
        self.use("torch")
        if step.fn != "softmax" or (len(dims) == 1 and not step.safe):
            return f"{out} = {ops.REDUCTIONS[step.fn].torch.format(x=x, dim=dim)}"
        if len(dims) > 1:
            self.use("math")
            return [
                f"{out} = torch.logsumexp({x}, dim={dim}, keepdim=True)",
                f"{out} = torch.exp({x} - {out}.masked_fill({out} == -math.inf, 0.0))",
            ]
        return [
            "# rows that are -inf everywhere give 0, not NaN (values and gradients)",
            f"{out} = torch.ops.aten._safe_softmax.default({x}, {dim})",
        ]

    def step_Fuse(self, step: Fuse) -> str:
        out, arg = self.var(step.out), self.var(step.arg)
        if step.arg.dims == step.tensor.indices:
            return f"{out} = {arg}{_flatten(step.tensor.layout)}"
        self.use("rearrange")
        target = self.pattern(
            [a if len(a) > 1 else a[0] for a in step.tensor.layout], step.arg.batched
        )
        source = self.pattern(step.arg.dims, step.arg.batched)
        return f'{out} = rearrange({arg}, "{source} -> {target}")'

    def step_Linear(self, step: Linear) -> list[str]:
        out, x = self.var(step.out), step.x
        rest = tuple(i for i in x.dims if i not in step.inner)
        code = expand(self.ref(x), x.dims, rest + step.inner, x.batched)
        code += f".flatten({-len(step.inner)})" if len(step.inner) > 1 else ""
        lines = [] if code == self.ref(x) else [f"{out} = {code}  # {_axes(x, rest)}"]
        x_code = out if lines else code
        weight = _matrix(step.weight, step.out_axes, step.transposed)
        self.use("F")
        if step.bias is not None:
            bias = step.bias.ascii + (".flatten()" if len(step.bias.layout) > 1 else "")
            weight = weight + ".mT" if step.transposed else weight
            call = f"F.linear({x_code}, {weight}, {bias})"
        elif step.transposed:
            call = f"{wrap(x_code)} @ {weight}"
        else:
            call = f"F.linear({x_code}, {weight})"
        outer = step.out.dims[len(rest) :]
        if len(outer) > 1:
            call = wrap(call) + f".unflatten(-1, ({', '.join(self.size(i) for i in outer)}))"
        return [*lines, f"{out} = {call}"]

    def step_Split(self, step: Split) -> str:
        dims = step.arg.dims
        unbind = f"{self.ref(step.arg)}.unbind({dims.index(step.over) - len(dims)})"
        return f"{', '.join(self.var(o) for o in step.outs)} = {unbind}"

    def step_Attention(self, step: Attention) -> list[str]:
        out = self.var(step.out)
        args = [
            self.heads(step.q, step.q_dims, step.heads),
            self.heads(step.k, step.k_dims, step.kv_heads),
            self.heads(step.v, step.v_dims, step.kv_heads),
        ]
        if step.mask is not None:
            args.append(f"attn_mask={self.attention_mask(step)}")
        if step.dropout is not None:
            args.append(f"dropout_p={self.number(step.dropout)} if training else 0.0")
        if step.causal:
            args.append("is_causal=True")
        args.append(f"scale={self.number(step.scale)}")
        if step.grouped:
            args.append("enable_gqa=True")
        self.use("F")
        lines = [f"{out} = F.scaled_dot_product_attention({', '.join(args)})"]
        if step.heads == 0:
            lines.append(f"{out} = {out}.squeeze(-3)")
        elif step.heads > 1:
            sizes = ", ".join(self.size(i) for i in step.out.dims[-2 - step.heads : -2])
            lines.append(f"{out} = {out}.unflatten(-3, ({sizes}))")
        return lines

    def heads(self, arg: Operand, dims: tuple[Index, ...], heads: int) -> str:
        """(…, heads..., sequence, width), the heads as one axis, as the kernel wants."""
        code = relayout(self.ref(arg), arg.dims, dims)
        if heads == 0:
            return code + ".unsqueeze(-3)"
        return code + (f".flatten({-2 - heads}, -3)" if heads > 1 else "")

    def attention_mask(self, step: Attention) -> str:
        """The mask against (…, heads, query, key): a unit axis for heads it lacks."""
        mask = step.mask
        head = step.mask_dims[0] if step.heads == 1 else None
        target = (head, *step.mask_dims[-2:])
        return expand(self.ref(mask), mask.dims, target, mask.batched, keep=2)


def relayout(code: str, have: tuple, want: tuple) -> str:
    """`code` with axes (…, *have) viewed as (…, *want), a permutation: a transpose when two
    axes swap, else movedim."""
    if have == want:
        return code
    n = len(have)
    moved = [k for k in range(n) if have[k] != want[k]]
    if len(moved) == 2:
        return f"{code}.transpose({moved[0] - n}, {moved[1] - n})"
    for src, index in enumerate(have):
        rest = [i for i in have if i != index]
        dst = want.index(index)
        if (*rest[:dst], index, *rest[dst:]) == want:
            return f"{code}.movedim({src - n}, {dst - n})"
    source = tuple(range(-n, 0))
    return f"{code}.movedim({source}, {tuple(want.index(i) - n for i in have)})"


def expand(code: str, have: tuple, target: tuple, batched: bool, keep: int = 0) -> str:
    """`code` (…, *have) aligned to broadcast against (…, *target): permuted, with a unit
    axis where it lacks one; leading unit axes are left out when unbatched (all but `keep`)."""
    present = tuple(i for i in target if i in have)
    code = relayout(code, have, present)
    slots = [":" if i in have else "None" for i in target]
    if not batched:
        while len(slots) > keep and slots[0] == "None":
            slots.pop(0)
    if "None" not in slots:
        return code
    while not batched and slots[-1] == ":":
        slots.pop()
    return f"{code}[{'..., ' if batched else ''}{', '.join(slots)}]"


def _flatten(layout: tuple[tuple[Index, ...], ...]) -> str:
    """Views that merge each group of `layout`, from axes already in its order: left to
    right, as counting from the end leaves the places of the later groups unchanged."""
    code, left = "", sum(map(len, layout))
    for axis in layout:
        if len(axis) > 1:
            end = -left + len(axis) - 1
            code += f".flatten({-left})" if end == -1 else f".flatten({-left}, {end})"
        left -= len(axis)
    return code


def _matrix(weight, out_axes: int, transposed: bool) -> str:
    """A declared weight as a matrix: its out block and its in block each flattened."""
    n = len(weight.layout)
    first = n - out_axes if transposed else out_axes
    code = weight.ascii + (f".flatten({first})" if n - first > 1 else "")
    return code + (f".flatten(0, {first - 1})" if first > 1 else "")


def _summed(step: Contract) -> list[Index]:
    seen = [i for a in step.args for i in a.dims]
    return [i for i in dict.fromkeys(seen) if seen.count(i) > 1 and i not in step.out.dims]


def _axes(out: Operand, dims: tuple[Index, ...] | None = None) -> str:
    """The axes in the spec's glyphs; `dims` (then a flattened group) when given."""
    glyphs = ", ".join(i.glyph for i in out.dims)
    if dims is not None:
        flat = "".join(i.glyph for i in out.dims if i not in dims)
        glyphs = ", ".join([*(i.glyph for i in dims), f"({flat})"])
    return "(…, " + glyphs + ")" if out.batched and glyphs else f"({glyphs})"


def _layout(tensor, batched: bool) -> str:
    """A declared layout in the spec's glyphs: `(…, τ, (μa))`."""
    axes = ["".join(i.glyph for i in axis) for axis in tensor.layout]
    axes = [f"({a})" if len(axis) > 1 else a for a, axis in zip(axes, tensor.layout)]
    return "(" + ", ".join((["…"] if batched else []) + axes) + ")"
