"""Plan steps of the fused kernels -> Python: `F.linear`, `unbind`, padding, the blocks of
queries read off a mask, `softmax_values`; the attention core's call is its backend's
(`Attention`: backends/sdpa/emit.py; `Flex`: backends/flex/emit.py)."""

from __future__ import annotations

from ...backends.sdpa.emit import unmerged
from ..program.steps import Flex, Linear, Pad, SoftmaxValues, Spans, Split
from . import tables_emit
from .expressions import wrap
from .values import Context, axes_comment, expand, prints


@prints(Linear)
def step_Linear(ctx: Context, step: Linear) -> list[str]:
    out, x = ctx.var(step.out), step.x
    rest = tuple(i for i in x.dims if i not in step.inner)
    code = expand(ctx.ref(x), x.dims, rest + step.inner, x.batched)
    code += f".flatten({-len(step.inner)})" if len(step.inner) > 1 else ""
    lines = [] if code == ctx.ref(x) else [f"{out} = {code}  # {axes_comment(x, rest)}"]
    x_code = out if lines else code
    pick = ""
    if step.pick is not None:  # its rows for one value of the leading index: a view
        value, index = step.pick
        pick = f".unflatten(0, ({ctx.size(index)}, -1))[{value}]"
    weight = _matrix(step.weight, step.out_axes, step.transposed) + pick
    ctx.use("F")
    if step.bias is not None:
        bias = step.bias.ascii + (".flatten()" if len(step.bias.layout) > 1 else "") + pick
        weight = weight + ".mT" if step.transposed else weight
        call = f"F.linear({x_code}, {weight}, {bias})"
    elif step.transposed:
        call = f"{wrap(x_code)} @ {weight}"
    else:
        call = f"F.linear({x_code}, {weight})"
    outer = step.out.dims[len(rest) :]
    if len(outer) > 1:
        call = wrap(call) + f".unflatten(-1, ({', '.join(ctx.size(i) for i in outer)}))"
    return [*lines, f"{out} = {call}"]


@prints(Split)
def step_Split(ctx: Context, step: Split) -> str:
    dims = step.arg.dims
    dim = dims.index(step.over) - len(dims)
    if step.parts:
        sizes = ", ".join(ctx.size(i) for i in step.parts)
        split = f"{ctx.ref(step.arg)}.split([{sizes}], dim={dim})"
    else:
        split = f"{ctx.ref(step.arg)}.unbind({dim})"
    return f"{', '.join(ctx.var(o) for o in step.outs)} = {split}"


@prints(Flex)
def step_Flex(ctx: Context, step: Flex) -> list[str]:
    """`flex_attention`, printed by the FlexAttention backend (backends/flex/emit.py)."""
    from ...backends.flex import emit

    return emit.lines(ctx, step) + unmerged(ctx, step, ctx.var(step.out))


@prints(Spans)
def step_Spans(ctx: Context, step: Spans) -> list[str]:
    """The blocks of queries and their keys, read off the mask; off a table made by
    blocks (passes/tables.py), block by block from its positions."""
    spans, out = ctx.runtime("key_spans"), ctx.var(step.out)
    table = ctx.blocked.get(step.mask.var)
    every = "" if ctx.tables else ", every_call=True"  # the spec's function's, per call
    if table is None:
        mask = ctx.ref(step.mask)
        return [f"{out} = {spans}({mask}, {step.hides!r}{every})  # blocks of queries"]
    query, key = table.dims[-2:]
    shape = f"({ctx.size(query)}, {ctx.size(key)})"
    if step.hides == "none":
        return [f"{out} = {spans}(None, 'none', {shape}, blocks=True)  # blocks of queries"]
    hints = (f"{out}_entries", f"{out}_box", "q_start", "q_end", "k_start", "k_end")
    entries, box, *block = (ctx.names.fresh(h) for h in hints)
    q0, q1, k0, k1 = block
    made = tables_emit.call(table, ctx, {query: f"{q0}:{q1}", key: f"{k0}:{k1}"})
    lines = [
        f"def {entries}({', '.join(block)}):  # the mask at these queries and keys",
        f"    return {made}",
    ]
    found = tables_emit.box_call(table, step.mask.var, step.hides, ctx, block)
    told = ""
    if found is not None:
        call, values = found
        lines += [
            f"def {box}({', '.join([*block, *values])}):  # what its condition holds at all",
            f"    return {call}",
        ]
        told = f", box={box}" + (f", values=({', '.join(values)},)" if values else "")
    return [
        *lines,
        f"{out} = {spans}({entries}, {step.hides!r}, {shape}{every}, blocks=True{told})"
        "  # blocks of queries",
    ]


@prints(SoftmaxValues)
def step_SoftmaxValues(ctx: Context, step: SoftmaxValues) -> str:
    """`W, O = softmax_values(S, V)` (passes/softmax_values.py): V viewed (…, key, width)."""
    weights, out = step.outs
    values, key = step.values, weights.dims[-1]
    shape = (*out.dims[:-2], key, out.dims[-1])
    args = [ctx.ref(step.scores), expand(ctx.ref(values), values.dims, shape, values.batched)]
    if step.dropout is not None:
        args += [f"p={ctx.number(step.dropout)}", "training=training"]
    args += [f"softmax={safe_softmax(ctx)}"] if step.safe else []
    call = ctx.runtime("softmax_values")
    made = f"{ctx.var(weights)}, {ctx.var(out)}"
    return f"{made} = {call}({', '.join(args)})  # {axes_comment(weights)}, {axes_comment(out)}"


@prints(Pad)
def step_Pad(ctx: Context, step: Pad) -> list[str]:
    arg, out = ctx.ref(step.arg), ctx.var(step.out)
    missing = step.width - step.over.size
    after = len(step.arg.dims) - 1 - step.arg.dims.index(step.over)
    pad = f"F.pad({arg}, ({'0, 0, ' * after}0, {ctx.scalar(missing)}))"
    ctx.use("F")
    why = "# zero features up to the query/key width, so that the kernel takes its fused path"
    if missing.is_positive:
        return [why, f"{out} = {pad}"]
    narrower = f"{ctx.size(step.over)} < {ctx.scalar(step.width)}"
    return [why, f"{out} = {pad} if {narrower} else {arg}"]


def safe_softmax(ctx: Context) -> str:
    """The runtime's softmax for rows that may be -inf everywhere (the one place of the
    softmax policy: docs/performance.md, "Value-dependent branches")."""
    return ctx.runtime("safe_softmax")


def _matrix(weight, out_axes: int, transposed: bool) -> str:
    """A declared weight as a matrix: its out block and its in block each flattened."""
    n = len(weight.layout)
    first = n - out_axes if transposed else out_axes
    code = weight.ascii + (f".flatten({first})" if n - first > 1 else "")
    return code + (f".flatten(0, {first - 1})" if first > 1 else "")
