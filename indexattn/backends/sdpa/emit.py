"""The `sdpa` backend's printer: an `Attention` step (lower/program/steps.py) -> the call of
`F.scaled_dot_product_attention`, the heads merged and the mask aligned; where the mask lets
blocks of queries skip keys (`spans`), by blocks of queries through the runtime's `by_blocks`."""

from __future__ import annotations

from functools import partial

from ...lower.printers import tables_emit
from ...lower.printers.expressions import tuple_text, wrap
from ...lower.printers.values import Context, expand, prints, relayout
from ...lower.program.steps import Attention


@prints(Attention)
def step_Attention(ctx: Context, step: Attention) -> list[str]:
    """The kernel's call; queries or keys of several parts are joined on lines before it."""
    out, joins = ctx.var(step.out), []
    inputs = [
        ctx.features(step.q, step.q_dims, step.widths, step.heads, step.packed),
        ctx.features(step.k, step.k_dims, step.widths, step.kv_heads),
    ]
    for k, (hint, parts) in enumerate((("queries", step.q), ("keys", step.k))):
        if len(parts) > 1:  # torch.cat: a line of its own
            name = ctx.names.fresh(hint)
            joins.append(f"{name} = {inputs[k]}")
            inputs[k] = name
    call = partial(attention_call, ctx, step, *inputs)
    made = mask_block(ctx, step, None)
    lines = [*joins, *made, f"{out} = {call()}"]
    if step.spans is not None:  # a loop, not a comprehension: that would close over
        spans = ctx.var(step.spans)  # the tensors, and torch.compile cannot trace their del
        hints = ("q0", "q1", "k0", "k1", "whole")
        names = [ctx.names.fresh(hint) for hint in hints]
        # in training, dropout draws one mask of every score, as the derived backward's
        # forward and an unblocked call draw it (blocks would each draw their own)
        whole = " or training" if step.dropout is not None else ""
        ctx.use("torch")
        lines = [
            *joins,
            f"if {spans} is None{whole}:",
            *("    " + line for line in lines[len(joins) :]),
            "else:  # by blocks of queries, each over the keys its mask lets it see",
            *("    " + line for line in attention_blocks(ctx, step, inputs, out, names)),
        ]
    if joins:  # freed as the kernel's own arguments would be
        lines.append(f"del {', '.join(j.split(' = ')[0] for j in joins)}")
    if step.cut:
        lines.append(f"{out} = {out}[..., :{ctx.size(step.v_dims[-1])}]")
    return lines + unmerged(ctx, step, out)


def unmerged(ctx: Context, step: Attention, out: str) -> list[str]:
    """The kernel's result with its heads unmerged: the query heads run as rows
    (`packed`) out of the rows, then the heads merged into one axis out of that axis."""
    heads, packed, dims = step.heads - step.packed, step.packed, step.out.dims
    lines = []
    if packed:
        rows = ", ".join(ctx.size(i) for i in dims[-2 - packed : -1])
        lines.append(f"{out} = {out}.unflatten(-2, ({rows}))")
    if heads == 0:
        lines.append(f"{out} = {out}.squeeze({-3 - packed})")
    elif heads > 1:
        sizes = ", ".join(ctx.size(i) for i in dims[-2 - step.heads : -2 - packed])
        lines.append(f"{out} = {out}.unflatten({-3 - packed}, ({sizes}))")
    return lines


def attention_blocks(ctx: Context, step: Attention, inputs: list[str], out: str, block: list[str]):
    """The blocks of queries into `out` (`block`: the names of a block's first query,
    end, first key, end, whole), through the runtime's `by_blocks`: a function of one
    block, which makes the mask's block where it is a table made by blocks, recomputed in
    the backward with the block's scores (so autograd keeps no block's mask or weights);
    the queries, keys and values cut to the block by `by_blocks`, and every other tensor
    the block reads passed whole (never closed over: their gradients are made)."""
    spans = ctx.var(step.spans)
    q, k, v = (ctx.names.fresh(h) for h in ("q", "k", "v"))
    function = ctx.names.fresh(ctx.var(step.out) + "_block")
    values = ctx.heads(step.v, step.v_dims, step.kv_heads)
    tensors = [inputs[0], inputs[1], values]
    cuts = ['{-2: "q"}', '{-2: "k"}', '{-2: "k"}']
    params, before, read = [q, k, v], [], []
    if step.mask is not None:
        table = ctx.blocked.get(step.mask.var)
        read = [ctx.var(step.mask)]
        if table is not None:
            read, before = tables_emit.block_reads(table, ctx, step.mask.var)
    scales = sorted(step.scale.free_symbols & ctx.scalar_symbols, key=str)  # maybe tensors
    for name in [*read, *(ctx.number(s) for s in scales)]:
        if name not in params:
            params.append(name)
    tensors += params[3:]
    cuts += ["{}"] * (len(params) - 3)
    by_blocks = ctx.runtime("by_blocks")
    call = attention_call(ctx, step, q, k, block, v)
    return [
        *before,
        f"def {function}({', '.join([*block, *params])}):  # made again in the backward",
        *("    " + line for line in mask_block(ctx, step, block)),
        f"    return {call}",
        f"{out} = {by_blocks}({function}, {spans}, {tuple_text(tensors)}, {tuple_text(cuts)})",
    ]


def attention_call(
    ctx, step: Attention, q: str, k: str, block: list | None = None, v: str | None = None
) -> str:
    """`F.scaled_dot_product_attention(...)`; for a block (the names of its first query,
    end, first key, end, and whether the mask changes nothing there; `q`, `k` and `v` cut
    to those queries and keys already), without the mask where it changes nothing, and
    with the mask cut to the block."""
    rows, keys = (f"{block[0]}:{block[1]}", f"{block[2]}:{block[3]}") if block else ("", "")
    scale = ctx.number(step.scale)
    if step.scale.free_symbols & ctx.scalar_symbols:  # a tensor scale multiplies q
        scale, q = wrap(scale), f"({q} * {wrap(scale)} if torch.is_tensor({scale}) else {q})"
        scale = f"1.0 if torch.is_tensor({scale}) else {scale}"
    args = [q, k, v or ctx.heads(step.v, step.v_dims, step.kv_heads)]
    if step.mask is not None and step.mask.var in ctx.blocked:  # made for the block
        mask = attention_mask(ctx, step, ctx.block_name(step.mask.var), q if v else "")
        args.append(f"attn_mask={f'None if {block[4]} else ' if block else ''}{mask}")
    elif step.mask is not None:
        mask = attention_mask(ctx, step, None, q if v else "")
        if block:  # as the kernel takes it, the mask ends in (query, key)
            mask = f"None if {block[4]} else {wrap(mask)}[..., {rows}, {keys}]"
        args.append(f"attn_mask={mask}")
    if step.dropout is not None:
        args.append(f"dropout_p={ctx.number(step.dropout)} if training else 0.0")
    if step.causal:
        args.append("is_causal=True")
    args.append(f"scale={scale}")
    if step.grouped and not step.packed:
        args.append("enable_gqa=True")
    ctx.use("F")
    return f"F.scaled_dot_product_attention({', '.join(args)})"


def mask_block(ctx: Context, step: Attention, block: list | None) -> list[str]:
    """The line that makes the mask's block from its positions, where it is a table made
    by blocks (passes/tables.py): every position, or the block's queries and keys."""
    table = ctx.blocked.get(step.mask.var) if step.mask is not None else None
    if table is None:
        return []
    if block is None:
        return [f"{ctx.block_name(step.mask.var)} = {tables_emit.call(table, ctx, {})}"]
    q0, q1, k0, k1, whole = block
    pieces = dict(zip(table.dims[-2:], (f"{q0}:{q1}", f"{k0}:{k1}")))
    made = tables_emit.call(table, ctx, pieces, ctx.distance_rows.get(step.mask.var))
    return [f"{ctx.block_name(step.mask.var)} = None if {whole} else {made}"]


def attention_mask(ctx: Context, step: Attention, made: str | None = None, q: str = "") -> str:
    """The mask against (…, heads, query, key): a unit axis for heads it lacks. The
    kernel's fused path takes a mask of two axes or of as many as the queries; any other
    goes the slow way. So a mask of positions without heads stays (query, key), an input
    mask without heads gains its head axis only when it comes with batch axes, and a mask
    of positions with heads is given the queries' batch axes (`q`: the kernel's queries,
    (…, heads, query, features), where the spec's are out of reach)."""
    mask = step.mask
    head = step.mask_dims[0] if step.heads == 1 else None
    target = (head, *step.mask_dims[-2:])
    ref = made or ctx.ref(mask)  # `made`: the mask's block, made from its positions
    code = expand(ref, mask.dims, target, mask.batched, keep=2)
    first = step.q[0]  # the queries' batch axes: those of any of their parts
    if not first.batched or (mask.batched and head in mask.dims):
        return code
    if head in mask.dims:
        batch = f"{q}.shape[:-3]" if q else f"{ctx.ref(first)}.shape[:-{len(first.dims)}]"
        return f"{code}.expand(*{batch}, -1, -1, -1)"
    if not mask.batched or not set(target[1:]) <= set(mask.dims):  # (…, key): no doubt
        return code
    plain = relayout(ref, mask.dims, target[1:])
    return f"{plain} if {wrap(plain)}.dim() == 2 else {code}"
