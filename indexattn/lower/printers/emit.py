"""Plan steps -> lines of Python, one operation per line: the general steps here, the fused
kernels' in `kernels_emit`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import sympy

from ... import ops
from ...ir import CONDITIONS, Index
from ..program.kinds import over
from ..program.numerics import cast
from ..program.steps import (
    Add,
    Cat,
    Choose,
    Contract,
    Convolve,
    Elementwise,
    Flip,
    Full,
    Fuse,
    Gather,
    Grid,
    Number,
    Operand,
    PrefixProduct,
    Reduction,
    Rename,
    Scatter,
    Slice,
    SoftmaxValues,
    Spans,
    Stack,
    Unfuse,
    Whole,
)
from .expressions import GridPrinter, ScalarPrinter, unwrapped, wrap
from .kernels_emit import safe_softmax
from .values import PRINTERS, Context, axes_comment, expand, prints, relayout


def lines_of(ctx: Context, step) -> list[str]:
    """The step's code, its last line commented with the axes of its result."""
    code = PRINTERS[type(step)](ctx, step)
    if isinstance(step, (Choose, Spans, SoftmaxValues)):
        return code if isinstance(code, list) else [code]
    code = code if isinstance(code, list) else [code]
    axes = _layout(step.tensor, step.out.batched) if isinstance(step, Fuse) else None
    last = max(k for k, line in enumerate(code) if not line.startswith("del "))
    code[last] += f"  # {axes or axes_comment(step.out)}"
    return code + cast(ctx, step)


@prints(Choose)
def step_Choose(ctx: Context, step: Choose) -> list[str]:
    """if/elif/else on the sizes; each branch ends in the choice's variable."""
    lines = ["# the contraction order with the fewest FLOPs at these sizes"]
    for k, branch in enumerate(step.branches):
        if k < len(step.conditions):
            condition = ctx.scalar(step.conditions[k])
            lines.append(f"{'elif' if k else 'if'} {unwrapped(condition)}:")
        else:
            lines.append("else:")
        steps = (*branch[:-1], replace(branch[-1], out=step.out))
        lines += ["    " + line for s in steps for line in lines_of(ctx, s)]
    return lines


@prints(Unfuse)
def step_Unfuse(ctx: Context, step: Unfuse) -> str:
    tensor = step.tensor
    source = ctx.pattern([a if len(a) > 1 else a[0] for a in tensor.layout], tensor.batched)
    target = ctx.pattern(step.out.dims, tensor.batched)
    lengths = [
        f"{ctx.names.axis(i)}={ctx.size(i)}"
        for axis in tensor.layout
        if len(axis) > 1
        for i in axis[:-1]
    ]
    ctx.use("rearrange")
    extra = "".join(", " + length for length in lengths)
    return f'{ctx.var(step.out)} = rearrange({tensor.ascii}, "{source} -> {target}"{extra})'


@prints(Grid)
def step_Grid(ctx: Context, step: Grid) -> list[str]:
    """A tensor of positions; printed into the module's constants function. Of the
    functions it applies (floor, exp, where, ...), all but the outermost are printed on
    lines of their own, one call a line."""
    dims = step.out.dims
    views = {}
    for k, index in enumerate(dims):
        if index.symbol in step.expr.free_symbols:
            ctx.needs.indices[index] = None
        name = ctx.names.index(index)
        shaped = [":" if j == k else "None" for j in range(len(dims))]
        view = name if len(dims) == 1 else f"{name}[{', '.join(shaped)}]"
        views[index.symbol] = sympy.Symbol(view, integer=True, nonnegative=True)
    ctx.needs.sizes |= step.expr.free_symbols & set(ctx.spec.sizes)
    if not ctx.positional:  # a table's function takes its positions: their lengths
        ctx.needs.sizes |= {s for i in dims for s in i.size.free_symbols}
    ctx.needs.scalars |= step.expr.free_symbols & ctx.scalar_symbols
    expr, lines = step.expr.xreplace({**ctx.symbols, **views}), []
    printer = GridPrinter(frozenset(views.values()), ScalarPrinter())
    for inner in printer.calls(expr)[:-1]:
        name = ctx.names.fresh(f"{ctx.var(step.out)}_{type(inner).__name__.lower()}")
        lines.append(f"{name} = {printer.doprint(inner)}")
        part = sympy.Symbol(name, integer=inner.is_integer, real=inner.is_real)
        expr, printer.indices = expr.xreplace({inner: part}), printer.indices | {part}
    code = printer.doprint(expr)
    ctx.use("torch", *printer.scalar.module_imports)
    if not all(i.symbol in step.expr.free_symbols for i in dims):  # sympy simplified some away
        shape = ", ".join(extent(ctx, i) for i in dims)
        kind = "torch.bool" if isinstance(step.expr, CONDITIONS) else "torch.float64"
        code = f"torch.as_tensor({code}, device=device, dtype={kind})"
        code = f"torch.broadcast_to({code}, ({shape},))"
    if step.index:
        code = f"{wrap(code)}.long()"  # float64 holds whole numbers exactly up to 2^53
    elif not isinstance(step.expr, CONDITIONS):
        code = f"{wrap(code)}.to({ctx.float_dtype()})"
    return [*lines, f"{ctx.var(step.out)} = {code}"]


def extent(ctx: Context, index: Index) -> str:
    """How many positions of the index a grid spans: its size, or in a table's function
    (lower/printers/tables_emit.py) the positions it is given."""
    if not ctx.positional:
        return ctx.size(index)
    ctx.needs.indices[index] = None
    return f"{ctx.names.index(index)}.shape[0]"


@prints(Gather)
def step_Gather(ctx: Context, step: Gather) -> str:
    """Advanced indexing on one axis: the positions' axes take its place."""
    arg, k, n = step.arg, step.arg.dims.index(step.axis), len(step.arg.dims)
    positions = ctx.var(step.positions)
    if step.positions.batched:  # an unbatched table read at batched positions
        table = ctx.ref(arg) + (f".movedim({k}, 0)" if k else "")
        code = _selected(wrap(table), 0, positions, step.bounds is not None)
        return f"{ctx.var(step.out)} = {code}"
    first = step.out.dims.index(step.positions.dims[0]) if step.positions.dims else k
    order = [i for i in step.out.dims if i not in step.positions.dims]
    order.insert(first, step.axis)
    table, k = relayout(ctx.ref(arg), arg.dims, tuple(order)), first
    if step.bounds is not None:
        code = _selected(wrap(table), k - n if arg.batched else k, positions, True)
        return f"{ctx.var(step.out)} = {code}"
    if step.repeat is not None:  # each value `repeat` times in a row: no index read
        times = ctx.scalar(step.repeat)
        return f"{ctx.var(step.out)} = {wrap(table)}.repeat_interleave({times}, dim={k - n})"
    slots = ["...", positions, *[":"] * (n - k - 1)] if arg.batched else [":"] * k + [positions]
    return f"{ctx.var(step.out)} = {wrap(table)}[{', '.join(slots)}]"


@prints(Scatter)
def step_Scatter(ctx: Context, step: Scatter) -> list[str]:
    """`arg`, the positions' axes flattened into one, added into zeros at the slots the
    positions name (`scatter_add_`); a position outside the axis adds into one more slot,
    cut off after."""
    out, size, batched = step.out, ctx.size(step.axis), step.positions.batched
    name, k = ctx.var(out), out.dims.index(step.axis)
    slot, src = (ctx.names.fresh(f"{name}_{w}") for w in ("slot", "source"))
    note = f"a position outside {step.axis.glyph} adds into one slot more"
    lines = [f"{slot} = {scatter_slots(ctx, step)}  # {note}"]
    source = scatter_source(ctx, step)
    if source != ctx.var(step.arg):
        lines.append(f"{src} = {source}")
    else:
        src = source
    shape, dim = f"{src}.shape", k - len(out.dims)
    index = _aligned(slot, batched, k, len(out.dims) - k - 1)
    if batched:  # batched positions: the source broadcast to their batch
        shape = ctx.names.fresh(f"{name}_shape")
        lines.append(f"{shape} = torch.broadcast_shapes({index}.shape, {src}.shape)")
    added = f"{src}.expand({shape})" if batched else src
    zeros = f"{shape}[:{dim}] + ({ctx.scalar(step.axis.size + 1)},)"
    zeros += f" + {shape}[{dim + 1}:]" if dim < -1 else ""
    scatter = f"scatter_add_({dim}, {index}.expand({shape}), {added})"
    ctx.use("torch")
    return [*lines, f"{name} = {src}.new_zeros({zeros}).{scatter}.narrow({dim}, 0, {size})"]


def scatter_source(ctx: Context, step: Scatter) -> str:
    """`arg` with the positions' axes side by side in the place of the result's axis,
    flattened into one."""
    arg, out = step.arg, step.out
    k = out.dims.index(step.axis)
    held = tuple(i for i in arg.dims if i in step.positions.dims)
    want = (*out.dims[:k], *held, *out.dims[k + 1 :])
    source = relayout(ctx.ref(arg), arg.dims, want)
    if len(held) == 1:
        return source
    start, end = k - len(want), k - len(want) + len(held) - 1
    return source + (f".flatten({start})" if end == -1 else f".flatten({start}, {end})")


def scatter_slots(ctx: Context, step: Scatter) -> str:
    """The positions in the order `arg` has their axes, flat, int64; one out of range
    made the size of the axis (the slot cut off)."""
    p, size = ctx.ref(step.positions), ctx.size(step.axis)
    held = tuple(i for i in step.arg.dims if i in step.positions.dims)
    code = f"torch.where(({p} >= 0) & ({p} < {size}), {p}, {size})"
    code = relayout(code, step.positions.dims, held)
    return code + (f".flatten({-len(held)})" if len(held) > 1 else "") + ".long()"


@prints(Flip)
def step_Flip(ctx: Context, step: Flip) -> str:
    dim = step.arg.dims.index(step.axis) - len(step.arg.dims)
    return f"{ctx.var(step.out)} = {wrap(ctx.ref(step.arg))}.flip({dim})"


@prints(Slice)
def step_Slice(ctx: Context, step: Slice) -> str:
    """A shifted read: the axis from `start`, to its end or to start + the index's size."""
    arg, k = step.arg, step.arg.dims.index(step.axis)
    stop = step.start + step.out.dims[k].size
    piece = (ctx.scalar(step.start) if step.start != 0 else "") + ":"
    piece += "" if sympy.expand(stop - step.axis.size) == 0 else ctx.scalar(stop)
    n = len(arg.dims)
    slots = ["...", piece, *[":"] * (n - k - 1)] if arg.batched else [":"] * k + [piece]
    return f"{ctx.var(step.out)} = {wrap(ctx.ref(arg))}[{', '.join(slots)}]"


@prints(Convolve)
def step_Convolve(ctx: Context, step: Convolve) -> list[str]:
    """The signal padded with the zeros the offsets reach, then one `F.conv1d`/`F.conv2d`
    with a group per channel; a subtracted offset is a flipped kernel (conv is a
    correlation)."""
    arg, out, n = step.arg, step.out, len(step.shifts)
    signal = relayout(ctx.ref(arg), arg.dims, out.dims)
    name = ctx.var(out)
    padded = ctx.names.fresh(f"{name}_pad")
    widths = []
    for s in reversed(step.shifts):  # F.pad lists the last axis first
        widths += [ctx.scalar(-s.start), ctx.scalar(s.offset.size - 1 + s.start)]
    offsets = tuple(s.offset for s in step.shifts)
    kernel = relayout(ctx.ref(step.kernel), step.kernel.dims, (*step.channels, *offsets))
    flipped = [k - n for k, s in enumerate(step.shifts) if s.sign < 0]
    shape = "reshape"  # a flip is a fresh tensor, which a view shapes
    if flipped:
        kernel, shape = f"{wrap(kernel)}.flip({', '.join(map(str, flipped))})", "view"
    groups = ctx.scalar(sympy.Mul(*(i.size for i in step.channels)))
    taps = ", ".join(ctx.size(i) for i in offsets)
    weight = ctx.names.fresh(f"{name}_kernel")
    batch = f"{padded}.view(-1, {groups}, *{padded}.shape[-{n}:])"
    grouped = f", groups={groups}" if groups != "1" else ""
    ctx.use("F")
    reach = " and ".join(s.along.glyph for s in step.shifts)
    return [
        f"{padded} = F.pad({signal}, ({', '.join(widths)}))  # zeros where {reach} reach out",
        f"{weight} = {wrap(kernel)}.{shape}({groups}, 1, {taps})",
        f"{name} = F.conv{n}d({batch}, {weight}{grouped}).view({wrap(signal)}.shape)",
        f"del {padded}, {weight}",
    ]


@prints(Whole)
def step_Whole(ctx: Context, step: Whole) -> str:
    return f"{ctx.var(step.out)} = {ctx.ref(step.arg)}.long()"


@prints(Contract)
def step_Contract(ctx: Context, step: Contract) -> str:
    out = step.out
    if step.into:  # lower/program/passes/inplace.py
        sign, value = scale_of(ctx, step.scale)
        method = "div_" if sign == "/" else "mul_"
        return written(ctx, step, f"{ctx.ref(step.args[0])}.{method}({value})")
    if len(step.args) == 1 and set(step.args[0].dims) <= set(out.dims):
        code = ctx.arg(step.args[0], out.dims)
    elif len(step.args) == 2 and not _summed(step):
        code = " * ".join(ctx.arg(a, out.dims) for a in step.args)
    else:
        code = matmul(ctx, step) or einsum(ctx, step)
    return f"{ctx.var(out)} = {code}{scaled(ctx, step.scale)}"


def einsum(ctx: Context, step: Contract) -> str:
    ctx.use("einsum")
    pattern = ", ".join(ctx.pattern(a.dims, a.batched) for a in step.args)
    pattern += " -> " + ctx.pattern(step.out.dims, step.out.batched)
    return f'einsum({", ".join(ctx.ref(a) for a in step.args)}, "{pattern}")'


def matmul(ctx: Context, step: Contract) -> str | None:
    """`a @ b` when the result is (batch..., m, n), a holds m and b holds n, and one index
    is summed: the two operands are viewed, not copied. With one free index, a product of
    a matrix and a vector."""
    summed, out = _summed(step), step.out.dims
    if len(step.args) != 2 or len(summed) != 1:
        return None
    a, b = step.args
    free = tuple(i for i in out if (i in a.dims) != (i in b.dims))
    batch, k = out[: len(out) - len(free)], summed[0]
    if not 0 < len(free) <= 2 or free != out[len(batch) :] or {*a.dims, *b.dims} != {*out, k}:
        return None
    if any(i not in a.dims or i not in b.dims for i in batch) or a.batched != b.batched:
        return None  # torch.matmul would copy the operand it broadcasts; einsum does not
    if free[-1] in a.dims:
        a, b = b, a  # b holds the last free index
    if len(free) == 1:
        return matvec(ctx, b, a, batch, (free[0], k))
    if free[0] not in a.dims:
        return None
    left = expand(ctx.ref(a), a.dims, (*batch, free[0], k), a.batched)
    right = expand(ctx.ref(b), b.dims, (*batch, k, free[1]), b.batched)
    return f"{wrap(left)} @ {wrap(right)}"


def matvec(ctx: Context, matrix: Operand, vector: Operand, batch: tuple, axes: tuple) -> str:
    """`(M @ v[..., :, None]).squeeze(-1)`: M's gradient then comes back in M's layout, where
    einsum may hand back a transposed one (slow in the elementwise backward that follows)."""
    left = expand(ctx.ref(matrix), matrix.dims, (*batch, *axes), matrix.batched)
    right = expand(ctx.ref(vector), vector.dims, (*batch, axes[1]), vector.batched)
    return f"({wrap(left)} @ {wrap(right)}[..., :, None]).squeeze(-1)"


def scaled(ctx: Context, scale: sympy.Basic) -> str:
    if scale == 1:
        return ""
    sign, value = scale_of(ctx, scale)
    return f" {sign} {wrap(value)}"


def scale_of(ctx: Context, scale: sympy.Basic) -> tuple[str, str]:
    """A scale as ("/", its denominator) where its numerator is 1, else ("*", itself)."""
    numerator, denominator = scale.as_numer_denom()
    if numerator == 1:
        return "/", ctx.scalar(denominator)
    return "*", ctx.scalar(scale)


@prints(Add)
def step_Add(ctx: Context, step: Add) -> str:
    terms = [ctx.arg(a, step.out.dims) for a in step.args]
    signs = step.signs or (1,) * len(terms)
    if step.into is None:
        return f"{ctx.var(step.out)} = {_summed_code(terms, signs)}"
    k = step.into
    target, terms, signs = terms[k], terms[:k] + terms[k + 1 :], signs[:k] + signs[k + 1 :]
    if len(terms) == 1 and signs[0] < 0:
        return written(ctx, step, f"{target}.sub_({unwrapped(terms[0])})")
    return written(ctx, step, f"{target}.add_({unwrapped(_summed_code(terms, signs))})")


@prints(Rename)
def step_Rename(ctx: Context, step: Rename) -> str:
    return f"{ctx.var(step.out)} = {ctx.arg(step.arg, step.out.dims)}"


@prints(Full)
def step_Full(ctx: Context, step: Full) -> str:
    return f"{ctx.var(step.out)} = {ctx.tensor_of(ctx.scalar(step.value.expr))}"


@prints(Elementwise)
def step_Elementwise(ctx: Context, step: Elementwise) -> str:
    op = ops.lookup(step.fn)
    args = [ctx.arg(a, step.out.dims) for a in step.args]
    if op.tensors:
        args = [ctx.tensor_of(c) if isinstance(a, Number) else c for a, c in zip(step.args, args)]
    elif step.fn == "where" and all(isinstance(x, Number) for x in step.args[1:]):
        args[1] = ctx.tensor_of(args[1])
    if step.fn == "where" and isinstance(step.args[0], Number):  # on sizes and scalars
        ctx.needs.device = True  # scalar_tensor: as_tensor cannot trace a SymBool
        args[0] = f"torch.scalar_tensor({args[0]}, dtype=torch.bool, device=device)"
    ctx.use(*op.imports)
    ctx.needs.dtype |= op.kind == "cast"  # to or from the call's dtype
    if step.into:  # lower/program/passes/inplace.py
        return written(ctx, step, op.inplace.format(*args))
    return f"{ctx.var(step.out)} = {op.torch.format(*args)}"


def written(ctx: Context, step, code: str) -> str:
    """A step that writes over the tensor it reads: a statement of its own where the
    result keeps the tensor's name (lower/printers/naming.py), else bound to its own."""
    name, target = ctx.var(step.out), ctx.var(over(step))
    return code if name == target else f"{name} = {code}"


@prints(Reduction)
def step_Reduction(ctx: Context, step: Reduction) -> str | list[str]:
    out, arg = ctx.var(step.out), step.arg
    dims = tuple(arg.dims.index(i) - len(arg.dims) for i in step.over)
    dim = str(dims[0]) if len(dims) == 1 else str(dims)
    x = ctx.ref(arg)
    ctx.use("torch")
    if step.sink is not None:
        return sink_softmax(ctx, step, out, x, dim)
    if step.fn == "softmax" and step.into and not step.safe:
        return [
            "# without gradients the weights overwrite the scores: no second N×N tensor",
            f"{out} = torch.softmax({x}, dim={dim}, out=None if torch.is_grad_enabled() else {x})",
        ]
    if step.fn == "rank" and step.below is not None:
        top_k = ctx.runtime("top_k")
        return f"{out} = {top_k}({x}, {ctx.scalar(step.below.expr)}, dim={dim})"
    if step.fn == "rank":  # the order, then each entry's place in it: one call a line
        order = ops.REDUCTIONS["rank"].torch.format(x=x, dim=dim)
        return [f"{out} = {order}", f"{out} = {out}.argsort(dim={dim})"]
    if step.fn != "softmax" or (len(dims) == 1 and not step.safe):
        return f"{out} = {ops.REDUCTIONS[step.fn].torch.format(x=x, dim=dim)}"
    if len(dims) > 1:
        ctx.use("math")
        return [
            f"{out} = torch.logsumexp({x}, dim={dim}, keepdim=True)",
            f"{out} = torch.exp({x} - {out}.masked_fill({out} == -math.inf, 0.0))",
        ]
    softmax = safe_softmax(ctx)  # rows that may be -inf everywhere: the policy's
    if not step.into:
        return f"{out} = {softmax}({x}, {dim})"
    return [
        "# without gradients the weights overwrite the scores: no second N×N tensor",
        f"{out} = {softmax}({x}, {dim}, overwrite=not torch.is_grad_enabled())",
    ]


def sink_softmax(ctx: Context, step: Reduction, out: str, x: str, dim: str) -> list[str]:
    """The sink's logit as one more column of the scores; the softmax's is dropped."""
    sink = expand(ctx.ref(step.sink), step.sink.dims, step.arg.dims, step.sink.batched)
    first, kept = (
        ("[..., :1]", "[..., :-1]")
        if dim == "-1"
        else (
            f".narrow({dim}, 0, 1)",
            f".narrow({dim}, 0, {x}.shape[{dim}])",
        )
    )
    return [
        "# = exp(S) / (Σ exp(S) + exp(sink)): a softmax with the sink's logit as one more",
        "# column of each row, that column dropped after",
        f"{out} = torch.cat([{x}, {sink}.expand_as({x}{first})], dim={dim})",
        f"{out} = torch.softmax({out}, dim={dim}){kept}",
    ]


@prints(Cat)
def step_Cat(ctx: Context, step: Cat) -> str:
    """One torch.cat: each part viewed in the result's axis order, its own index in the
    place of the one it runs along."""
    out = step.out.dims
    parts = [
        expand(ctx.ref(p), p.dims, tuple(a if i == step.over else i for i in out), p.batched)
        for p, a in zip(step.parts, step.along)
    ]
    dim = out.index(step.over) - len(out)
    ctx.use("torch")
    return f"{ctx.var(step.out)} = torch.cat([{', '.join(parts)}], dim={dim})"


@prints(Stack)
def step_Stack(ctx: Context, step: Stack) -> str:
    """One torch.stack: each part viewed in the result's axis order without `over`; parts
    that lack an axis (or the batch) broadcast to one shape first."""
    rest = tuple(i for i in step.out.dims if i != step.over)
    parts = ", ".join(expand(ctx.ref(p), p.dims, rest, p.batched) for p in step.parts)
    same = all(set(p.dims) == set(rest) and p.batched == step.out.batched for p in step.parts)
    parts = f"[{parts}]" if same else f"torch.broadcast_tensors({parts})"
    dim = step.out.dims.index(step.over) - len(step.out.dims)
    ctx.use("torch")
    return f"{ctx.var(step.out)} = torch.stack({parts}, dim={dim})"


@prints(PrefixProduct)
def step_PrefixProduct(ctx: Context, step: PrefixProduct) -> list[str]:
    """The positions padded with zeros to whole chunks (they add nothing to the sums; their
    rows are cut off): per chunk, the causal scores within it times G, plus H times the
    sum at the chunk's start (an exclusive cumsum over the chunks' sums; with a decay, the
    chunks' states each decayed to the chunk that reads it). The number of chunks is a
    ceiling and the rows are cut off by a copy (`index_select` of the first rows:
    torch.export with a dynamic N needs no guard at a multiple of the chunk, which a view
    or its clone would, and unlike `narrow_copy` it has a derivative on every torch the
    requirement admits)."""
    ctx.use("torch", "F")
    hint, note = ("DECAY_CHUNK", "decayed") if step.rate is not None else ("CHUNK", "prefix")
    knob = ctx.knob(hint, step.chunk, f"positions per chunk of the {note} sums")
    chunks, pad = ctx.names.fresh("chunks"), ctx.names.fresh("pad")
    size, common = ctx.size(step.over), step.out.dims[:-2]
    glyphs = ["…"] * step.out.batched + [i.glyph for i in common] + [f"{step.over.glyph}/c"]
    ends = [(step.h, step.inner), (step.f, step.inner), (step.g, step.out.dims[-1])]
    lines = [
        f"{chunks} = ({size} + {knob} - 1) // {knob}",
        f"if torch.compiler.is_compiling():  # a chunk of padding more, two at least: a "
        f"graph that holds at every {size}",
        f"    {chunks} = ({size} + 2 * {knob} - 1) // {knob}",
    ]
    if step.rate is not None:  # one chunk: the sequence's length, so that no power of the
        chunk = ctx.names.fresh("chunk")  # decay goes beyond the sequence's (it may grow)
        lines.append(f"{chunk} = {knob} if {chunks} > 1 else {size}")
        knob = chunk
    lines.append(f"{pad} = {chunks} * {knob} - {wrap(size)}")
    h, f, g = (ctx.names.fresh(ctx.var(x) + "_chunks") for x, _ in ends)
    for name, (x, width) in zip((h, f, g), ends):
        (at,) = (i for i in x.dims if i not in (*common, width))  # its positions
        code = relayout(ctx.ref(x), x.dims, (*common, at, width))
        if step.rate is not None:  # read by two products each: laid out once, not per product
            code += ".contiguous()"
        axes = ", ".join([*glyphs, "c", width.glyph])
        padded = f"F.pad({code}, (0, 0, 0, {pad}))"
        lines.append(f"{name} = {padded}.unflatten(-2, ({chunks}, {knob}))  # ({axes})")
    outer = ", ".join([*glyphs, step.inner.glyph, step.out.dims[-1].glyph])
    square = ", ".join([*glyphs, "c", "c"])
    chunked = decayed if step.rate is not None else summed
    inside, whole = chunked(ctx, step, (h, f, g), (knob, chunks), (outer, square))
    rows = ctx.names.fresh("rows")
    return [
        *lines,
        *inside,
        f"{rows} = torch.arange({size}, device={whole}.device)",
        f"{ctx.var(step.out)} = {whole}.index_select(-2, {rows})",
    ]


def summed(ctx: Context, step: PrefixProduct, chunked, sizes, axes) -> tuple[list[str], str]:
    """A prefix sum's chunks: the lines, and the name of the result by chunks."""
    (h, f, g), (outer, square) = chunked, axes
    state, start = (ctx.names.fresh(f"{step.name}_{w}") for w in ("chunk", "start"))
    scores = ctx.names.fresh(f"{step.name}_scores")
    whole = ctx.names.fresh(f"{step.name}_chunked")
    return [
        f"{state} = {f}.transpose(-2, -1) @ {g}  # ({outer}): each chunk's sum",
        f"{start} = F.pad({state}, (0, 0, 0, 0, 1, 0))  # a zero sum before the first chunk",
        f"{start} = torch.cumsum({start}, dim=-3)[..., :-1, :, :]  "
        f"# ({outer}): {step.name} before each chunk",
        f"{scores} = torch.tril({h} @ {f}.transpose(-2, -1))  "
        f"# ({square}): within the chunk, up to the query",
        f"{whole} = ({scores} @ {g} + {h} @ {start}).flatten(-3, -2)",
    ], whole


def powers(ctx: Context, step: PrefixProduct) -> Callable[[str], str]:
    """The decay's power of an exponent's code: `exp(k * λ)` of a rate, `γ ** k` of a
    base, the rate aligned to (heads, 1, 1) against the chunks' (positions, positions)."""
    if isinstance(step.rate, Number):
        rate = wrap(ctx.scalar(step.rate.expr))
    else:
        target = (*step.out.dims[:-2], step.over, step.inner)
        rate = expand(ctx.ref(step.rate), step.rate.dims, target, step.rate.batched)
    if step.power:
        return lambda exponent: f"{rate} ** {wrap(exponent)}"
    return lambda exponent: f"torch.exp({exponent} * {rate})"


def decayed(ctx: Context, step: PrefixProduct, chunked, sizes, axes) -> tuple[list[str], str]:
    """A decay's chunks: within a chunk the scores times γ^(t - s) (t ≥ s, 0 above);
    each chunk's state Σ_s γ^(C - 1 - s) F_sᵀ G_s; chunk c reads the states of the chunks
    c' before it, decayed by γ^(C (c - 1 - c')), at its row t times γ^(t + 1). Every
    power has an exponent ≥ 0 (clamped where the other side of a `where` is unused), so
    none overflows."""
    (h, f, g), (knob, chunks), (outer, square) = chunked, sizes, axes
    power = powers(ctx, step)
    words = ("steps", "gap", "ahead", "within", "into", "hops", "back", "carry", "scores")
    t, gap, ahead, within, into, hops, back, carry, scores, rows = (
        ctx.names.fresh(f"{step.name}_{w}") for w in (*words, "rows")
    )
    state, start = (ctx.names.fresh(f"{step.name}_{w}") for w in ("chunk", "start"))
    whole = ctx.names.fresh(f"{step.name}_chunked")
    made = f"device={f}.device, dtype={f}.dtype"
    return [
        f"{t} = torch.arange({knob}, {made})  # positions within a chunk",
        f"{gap} = {t}[:, None] - {t}[None, :]",
        f"{ahead} = {gap}.clamp(min=0)  # the other side of the where: never a negative power",
        f"{within} = {power(ahead)}",
        f"{within} = torch.where({gap} >= 0, {within}, 0)  # the decay within a chunk",
        f"{into} = {power(f'({knob} - 1 - {t})[:, None]')}  # from each key to its chunk's end",
        f"{state} = ({f} * {into}.unsqueeze(-3)).transpose(-2, -1) @ {g}  "
        f"# ({outer}): each chunk's state",
        f"{hops} = torch.arange({chunks}, {made})",
        f"{hops} = {hops}[:, None] - 1 - {hops}[None, :]",
        f"{back} = {hops}.clamp(min=0)",
        f"{carry} = {power(f'{back} * {knob}')}",
        f"{carry} = torch.where({hops} >= 0, {carry}, 0)  # each state to the chunks after it",
        f"{start} = ({carry} @ {state}.flatten(-2)).unflatten(-1, {state}.shape[-2:])  "
        f"# ({outer}): {step.name} before each chunk",
        f"{scores} = {h} @ {f}.transpose(-2, -1)",
        f"{scores} = {scores} * {within}.unsqueeze(-3)  # ({square}): within the chunk",
        f"{rows} = {power(f'({t} + 1)[:, None]')}  # from each chunk's start to each query",
        f"{whole} = {scores} @ {g} + ({h} * {rows}.unsqueeze(-3)) @ {start}",
        f"{whole} = {whole}.flatten(-3, -2)",
    ], whole


@prints(Fuse)
def step_Fuse(ctx: Context, step: Fuse) -> str:
    out, arg = ctx.var(step.out), ctx.var(step.arg)
    if step.arg.dims == step.tensor.indices:
        return f"{out} = {arg}{_flatten(step.tensor.layout)}"
    ctx.use("rearrange")
    target = ctx.pattern([a if len(a) > 1 else a[0] for a in step.tensor.layout], step.arg.batched)
    source = ctx.pattern(step.arg.dims, step.arg.batched)
    return f'{out} = rearrange({arg}, "{source} -> {target}")'


def _summed_code(terms: list[str], signs: tuple[int, ...]) -> str:
    code = ("-" if signs[0] < 0 else "") + terms[0]
    for term, sign in zip(terms[1:], signs[1:]):
        code += f" {'-' if sign < 0 else '+'} {term}"
    return code


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


def _summed(step: Contract) -> list[Index]:
    seen = [i for a in step.args for i in a.dims]
    return [i for i in dict.fromkeys(seen) if seen.count(i) > 1 and i not in step.out.dims]


def _layout(tensor, batched: bool) -> str:
    """A declared layout in the spec's glyphs: `(…, τ, (μa))`."""
    axes = ["".join(i.glyph for i in axis) for axis in tensor.layout]
    axes = [f"({a})" if len(axis) > 1 else a for a, axis in zip(axes, tensor.layout)]
    return "(" + ", ".join((["…"] if batched else []) + axes) + ")"


def _aligned(index: str, batched: bool, before: int, after: int) -> str:
    """Flat positions with unit axes before and after theirs, to expand against a source with
    `before` axes before the flattened ones and `after` after (batch axes lead)."""
    slots = ["None"] * (before if batched else 0) + [":"] + ["None"] * after
    if slots == [":"]:
        return index
    return f"{index}[{'..., ' if batched else ''}{', '.join(slots)}]"


def _selected(table: str, dim: int, positions: str, computed: bool) -> str:
    """`table` read at `positions` along `dim`. Positions computed at call time are read by
    `index_select`, which refuses a negative position that indexing would wrap round."""
    if not computed:
        return f"{table}[{positions}]"
    flat = f"{table}.index_select({dim}, {positions}.flatten())"
    return f"{flat}.unflatten({dim}, {positions}.shape)"
