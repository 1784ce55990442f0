"""Plan steps of the fused kernels -> Python: `F.linear`, `unbind`, and
`F.scaled_dot_product_attention` with the heads merged and the mask aligned."""

from __future__ import annotations

from functools import partial

from ..ir import Index
from . import tables_emit
from .printers import tuple_text, wrap
from .steps import Attention, Flex, Linear, Operand, Pad, SoftmaxValues, Spans, Split
from .values import axes_comment, expand, relayout


class KernelSteps:
    """The kernels' step printers; mixed into the Emitter, which supplies the values."""

    def step_Linear(self, step: Linear) -> list[str]:
        out, x = self.var(step.out), step.x
        rest = tuple(i for i in x.dims if i not in step.inner)
        code = expand(self.ref(x), x.dims, rest + step.inner, x.batched)
        code += f".flatten({-len(step.inner)})" if len(step.inner) > 1 else ""
        lines = [] if code == self.ref(x) else [f"{out} = {code}  # {axes_comment(x, rest)}"]
        x_code = out if lines else code
        pick = ""
        if step.pick is not None:  # its rows for one value of the leading index: a view
            value, index = step.pick
            pick = f".unflatten(0, ({self.size(index)}, -1))[{value}]"
        weight = _matrix(step.weight, step.out_axes, step.transposed) + pick
        self.use("F")
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
            call = wrap(call) + f".unflatten(-1, ({', '.join(self.size(i) for i in outer)}))"
        return [*lines, f"{out} = {call}"]

    def step_Split(self, step: Split) -> str:
        dims = step.arg.dims
        dim = dims.index(step.over) - len(dims)
        if step.parts:
            sizes = ", ".join(self.size(i) for i in step.parts)
            split = f"{self.ref(step.arg)}.split([{sizes}], dim={dim})"
        else:
            split = f"{self.ref(step.arg)}.unbind({dim})"
        return f"{', '.join(self.var(o) for o in step.outs)} = {split}"

    def step_Attention(self, step: Attention) -> list[str]:
        """The kernel's call; queries or keys of several parts are joined on lines before it."""
        out, joins = self.var(step.out), []
        inputs = [
            self.features(step.q, step.q_dims, step.widths, step.heads, step.packed),
            self.features(step.k, step.k_dims, step.widths, step.kv_heads),
        ]
        for k, (hint, parts) in enumerate((("queries", step.q), ("keys", step.k))):
            if len(parts) > 1:  # torch.cat: a line of its own
                name = self.names.fresh(hint)
                joins.append(f"{name} = {inputs[k]}")
                inputs[k] = name
        call = partial(self.attention_call, step, *inputs)
        made = self.mask_block(step, None)
        lines = [*joins, *made, f"{out} = {call()}"]
        if step.spans is not None:  # a loop, not a comprehension: that would close over
            spans = self.var(step.spans)  # the tensors, and torch.compile cannot trace their del
            hints = ("q0", "q1", "k0", "k1", "whole")
            names = [self.names.fresh(hint) for hint in hints]
            # in training, dropout draws one mask of every score, as the derived backward's
            # forward and an unblocked call draw it (blocks would each draw their own)
            whole = " or training" if step.dropout is not None else ""
            self.use("torch")
            lines = [
                *joins,
                f"if {spans} is None{whole}:",
                *("    " + line for line in lines[len(joins) :]),
                "else:  # by blocks of queries, each over the keys its mask lets it see",
                *("    " + line for line in self.attention_blocks(step, inputs, out, names)),
            ]
        if joins:  # freed as the kernel's own arguments would be
            lines.append(f"del {', '.join(j.split(' = ')[0] for j in joins)}")
        if step.cut:
            lines.append(f"{out} = {out}[..., :{self.size(step.v_dims[-1])}]")
        return lines + self.unmerged(step, out)

    def step_Flex(self, step: Flex) -> list[str]:
        """`flex_attention`, printed by the FlexAttention backend (backends/flex/emit.py)."""
        from ..backends.flex import emit

        return emit.lines(self, step) + self.unmerged(step, self.var(step.out))

    def unmerged(self, step: Attention, out: str) -> list[str]:
        """The kernel's result with its heads unmerged: the query heads run as rows
        (`packed`) out of the rows, then the heads merged into one axis out of that axis."""
        heads, packed, dims = step.heads - step.packed, step.packed, step.out.dims
        lines = []
        if packed:
            rows = ", ".join(self.size(i) for i in dims[-2 - packed : -1])
            lines.append(f"{out} = {out}.unflatten(-2, ({rows}))")
        if heads == 0:
            lines.append(f"{out} = {out}.squeeze({-3 - packed})")
        elif heads > 1:
            sizes = ", ".join(self.size(i) for i in dims[-2 - step.heads : -2 - packed])
            lines.append(f"{out} = {out}.unflatten({-3 - packed}, ({sizes}))")
        return lines

    def attention_blocks(self, step: Attention, inputs: list[str], out: str, block: list[str]):
        """The blocks of queries into `out` (`block`: the names of a block's first query,
        end, first key, end, whole), through the module's `by_blocks`: a function of one
        block, which makes the mask's block where it is a table made by blocks, recomputed in
        the backward with the block's scores (so autograd keeps no block's mask or weights);
        the queries, keys and values cut to the block by `by_blocks`, and every other tensor
        the block reads passed whole (never closed over: their gradients are made)."""
        spans = self.var(step.spans)
        q, k, v = (self.names.fresh(h) for h in ("q", "k", "v"))
        function = self.names.fresh(self.var(step.out) + "_block")
        values = self.heads(step.v, step.v_dims, step.kv_heads)
        tensors = [inputs[0], inputs[1], values]
        cuts = ['{-2: "q"}', '{-2: "k"}', '{-2: "k"}']
        params, before = [q, k, v], []
        if step.mask is not None:
            table = self.blocked.get(step.mask.var)
            read = [self.var(step.mask)]
            if table is not None:
                read, before = tables_emit.block_reads(table, self, step.mask.var)
            params += [name for name in read if name not in params]
            tensors += params[3:]
            cuts += ["{}"] * (len(params) - 3)
        by_blocks = self.helper(by_blocks_text, "by_blocks", "Blocks", "pieces")
        call = self.attention_call(step, q, k, block, v)
        return [
            *before,
            f"def {function}({', '.join([*block, *params])}):  # made again in the backward",
            *("    " + line for line in self.mask_block(step, block)),
            f"    return {call}",
            f"{out} = {by_blocks}({function}, {spans}, {tuple_text(tensors)}, {tuple_text(cuts)})",
        ]

    def attention_call(
        self, step: Attention, q: str, k: str, block: list | None = None, v: str | None = None
    ) -> str:
        """`F.scaled_dot_product_attention(...)`; for a block (the names of its first query,
        end, first key, end, and whether the mask changes nothing there; `q`, `k` and `v` cut
        to those queries and keys already), without the mask where it changes nothing, and
        with the mask cut to the block."""
        rows, keys = (f"{block[0]}:{block[1]}", f"{block[2]}:{block[3]}") if block else ("", "")
        args = [q, k, v or self.heads(step.v, step.v_dims, step.kv_heads)]
        if step.mask is not None and step.mask.var in self.blocked:  # made for the block
            mask = self.attention_mask(step, self.block_name(step.mask.var), q if v else "")
            args.append(f"attn_mask={f'None if {block[4]} else ' if block else ''}{mask}")
        elif step.mask is not None:
            mask = self.attention_mask(step, None, q if v else "")
            if block:  # as the kernel takes it, the mask ends in (query, key)
                mask = f"None if {block[4]} else {wrap(mask)}[..., {rows}, {keys}]"
            args.append(f"attn_mask={mask}")
        if step.dropout is not None:
            args.append(f"dropout_p={self.number(step.dropout)} if training else 0.0")
        if step.causal:
            args.append("is_causal=True")
        args.append(f"scale={self.number(step.scale)}")
        if step.grouped and not step.packed:
            args.append("enable_gqa=True")
        self.use("F")
        return f"F.scaled_dot_product_attention({', '.join(args)})"

    def mask_block(self, step: Attention, block: list | None) -> list[str]:
        """The line that makes the mask's block from its positions, where it is a table made
        by blocks (passes/tables.py): every position, or the block's queries and keys."""
        table = self.blocked.get(step.mask.var) if step.mask is not None else None
        if table is None:
            return []
        if block is None:
            return [f"{self.block_name(step.mask.var)} = {tables_emit.call(table, self, {})}"]
        q0, q1, k0, k1, whole = block
        pieces = dict(zip(table.dims[-2:], (f"{q0}:{q1}", f"{k0}:{k1}")))
        made = tables_emit.call(table, self, pieces, self.distance_rows.get(step.mask.var))
        return [f"{self.block_name(step.mask.var)} = None if {whole} else {made}"]

    def distance_row(self, var) -> str:
        """The name of a table's row over the differences of its positions (by_distance)."""
        if var not in self.distance_rows:
            self.distance_rows[var] = self.names.fresh(self.names.var(var) + "_row")
        return self.distance_rows[var]

    def block_name(self, var) -> str:
        """The name of a table's block in the spec's function, one per table."""
        if var not in self.block_names:
            self.block_names[var] = self.names.fresh(self.names.var(var) + "_block")
        return self.block_names[var]

    def step_Spans(self, step: Spans) -> list[str]:
        """The blocks of queries and their keys, read off the mask; off a table made by
        blocks (passes/tables.py), block by block from its positions."""
        self.use("math")
        text = partial(_key_spans, reads=self.host_reads())
        spans, out = self.helper(text, "key_spans", "QUERY_BLOCK"), self.var(step.out)
        table = self.blocked.get(step.mask.var)
        every = "" if self.tables else ", every_call=True"  # the spec's function's, per call
        if table is None:
            mask = self.ref(step.mask)
            return [f"{out} = {spans}({mask}, {step.hides!r}{every})  # blocks of queries"]
        query, key = table.dims[-2:]
        shape = f"({self.size(query)}, {self.size(key)})"
        if step.hides == "none":
            return [f"{out} = {spans}(None, 'none', {shape}, blocks=True)  # blocks of queries"]
        hints = (f"{out}_entries", f"{out}_box", "q_start", "q_end", "k_start", "k_end")
        entries, box, *block = (self.names.fresh(h) for h in hints)
        q0, q1, k0, k1 = block
        made = tables_emit.call(table, self, {query: f"{q0}:{q1}", key: f"{k0}:{k1}"})
        lines = [
            f"def {entries}({', '.join(block)}):  # the mask at these queries and keys",
            f"    return {made}",
        ]
        found = tables_emit.box_call(table, step.mask.var, step.hides, self, block)
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

    def step_SoftmaxValues(self, step: SoftmaxValues) -> str:
        """`W, O = softmax_values(S, V)` (passes/softmax_values.py): V viewed (…, key, width)."""
        weights, out = step.outs
        values, key = step.values, weights.dims[-1]
        shape = (*out.dims[:-2], key, out.dims[-1])
        args = [self.ref(step.scores), expand(self.ref(values), values.dims, shape, values.batched)]
        if step.dropout is not None:
            args += [f"p={self.number(step.dropout)}", "training=training"]
        args += [f"softmax={self.safe_softmax()}"] if step.safe else []
        if step.dropout is None:
            call = self.helper(_softmax_values, "softmax_values", "SoftmaxValues")
        else:
            text = partial(_softmax_values, dropout=True)
            call = self.helper(text, "softmax_dropout_values", "SoftmaxDropoutValues")
            self.use("F")
        made = f"{self.var(weights)}, {self.var(out)}"
        return f"{made} = {call}({', '.join(args)})  # {axes_comment(weights)}, {axes_comment(out)}"

    def step_Pad(self, step: Pad) -> list[str]:
        arg, out = self.ref(step.arg), self.var(step.out)
        missing = step.width - step.over.size
        after = len(step.arg.dims) - 1 - step.arg.dims.index(step.over)
        pad = f"F.pad({arg}, ({'0, 0, ' * after}0, {self.scalar(missing)}))"
        self.use("F")
        why = "# zero features up to the query/key width, so that the kernel takes its fused path"
        if missing.is_positive:
            return [why, f"{out} = {pad}"]
        narrower = f"{self.size(step.over)} < {self.scalar(step.width)}"
        return [why, f"{out} = {pad} if {narrower} else {arg}"]

    def safe_softmax(self) -> str:
        """The module's softmax for rows that may be -inf everywhere (the one place of the
        softmax policy: docs/performance.md, "Value-dependent branches")."""
        return self.helper(partial(_safe_softmax, reads=self.host_reads()), "safe_softmax")

    def host_reads(self) -> str:
        """The knob naming the devices where the module may branch on a tensor's values."""
        note = "devices whose values a call may read back: no synchronisation there"
        return self.knob("HOST_READS", '("cpu",)', note)

    def features(self, parts, lead: tuple[Index, ...], widths, heads: int, rows: int = 0) -> str:
        """Queries or keys as the kernel wants them: each part's features flattened, the
        parts side by side."""
        codes = [self.heads(p, (*lead, *w), heads, len(w), rows) for p, w in zip(parts, widths)]
        self.use("torch")
        return codes[0] if len(codes) == 1 else f"torch.cat([{', '.join(codes)}], dim=-1)"

    def heads(
        self, arg: Operand, dims: tuple[Index, ...], heads: int, width: int = 1, rows: int = 0
    ) -> str:
        """(…, heads..., sequence, width), the heads as one axis, as the kernel wants; the
        last `rows` heads merged into the sequence instead (Attention.packed)."""
        code = relayout(self.ref(arg), arg.dims, tuple(i for i in dims if i in arg.dims))
        code += f".flatten({-width})" if width > 1 else ""
        code = self.spread(code, arg, dims[: len(dims) - width])
        code += f".flatten({-2 - rows}, -2)" if rows else ""
        heads -= rows
        if heads == 0:
            return code + ".unsqueeze(-3)"
        return code + (f".flatten({-2 - heads}, -3)" if heads > 1 else "")

    def spread(self, code: str, arg: Operand, lead: tuple[Index, ...]) -> str:
        """`code`, laid out (…, lead..., features) but for the heads `arg` lacks, viewed
        over those heads (no copy): one rotary key for every head."""
        lacking = [k for k, i in enumerate(lead) if i not in arg.dims]
        if not lacking:
            return code
        for k in reversed(lacking):
            code += f".unsqueeze({k - len(lead) - 1})"
        sizes = [self.size(i) if k in lacking else "-1" for k, i in enumerate(lead)]
        batch = [f"*{self.ref(arg)}.shape[:-{len(arg.dims)}]"] if arg.batched else []
        return f"{code}.expand({', '.join([*batch, *sizes, '-1'])})"

    def attention_mask(self, step: Attention, made: str | None = None, q: str = "") -> str:
        """The mask against (…, heads, query, key): a unit axis for heads it lacks. The
        kernel's fused path takes a mask of two axes or of as many as the queries; any other
        goes the slow way. So a mask of positions without heads stays (query, key), an input
        mask without heads gains its head axis only when it comes with batch axes, and a mask
        of positions with heads is given the queries' batch axes (`q`: the kernel's queries,
        (…, heads, query, features), where the spec's are out of reach)."""
        mask = step.mask
        head = step.mask_dims[0] if step.heads == 1 else None
        target = (head, *step.mask_dims[-2:])
        ref = made or self.ref(mask)  # `made`: the mask's block, made from its positions
        code = expand(ref, mask.dims, target, mask.batched, keep=2)
        first = step.q[0]  # the queries' batch axes: those of any of their parts
        if not first.batched or (mask.batched and head in mask.dims):
            return code
        if head in mask.dims:
            batch = f"{q}.shape[:-3]" if q else f"{self.ref(first)}.shape[:-{len(first.dims)}]"
            return f"{code}.expand(*{batch}, -1, -1, -1)"
        if not mask.batched or not set(target[1:]) <= set(mask.dims):  # (…, key): no doubt
            return code
        plain = relayout(ref, mask.dims, target[1:])
        return f"{plain} if {wrap(plain)}.dim() == 2 else {code}"


def _matrix(weight, out_axes: int, transposed: bool) -> str:
    """A declared weight as a matrix: its out block and its in block each flattened."""
    n = len(weight.layout)
    first = n - out_axes if transposed else out_axes
    code = weight.ascii + (f".flatten({first})" if n - first > 1 else "")
    return code + (f".flatten(0, {first - 1})" if first > 1 else "")


def _key_spans(name: str, knob: str, reads: str) -> str:
    """The module's function that reads a mask's blocks of queries and keys (`Spans`)."""
    return f'''{knob} = 128  # queries per kernel call where a mask hides whole blocks of keys


def {name}(mask, hides, shape=None, every_call=False, blocks=False, box=None, values=()):
    """Per block of {knob} queries: (first query, end, first key, end, whole), the keys the
    mask (..., query, key) lets any of them see, and whether it changes nothing there, so
    that the block runs without it. `mask`: a tensor, or a function of queries and keys
    (t, u, k, l) giving its entries there, of `shape` (query, key) in all (a table made by
    blocks, never whole). `hides`: the entries that hide a key ("-inf", "0", "true",
    "false"; "none", not read: every key for each block). `box`: with such a function, one
    of the same arguments telling what the mask's condition holds at all those entries (2:
    kept, the mask changing nothing; 1: kept; 0: hidden; None: it cannot tell), so that only
    the keys it cannot tell, at the edges of what a block sees, are read; `values`: tensors
    (..., position) the condition reads, given to `box` as functions of a first and last
    position giving their least and greatest entries there (by tiles of {knob}). One span of every
    query and key where the mask changes nothing anywhere; when traced, None; where blocks
    would skip less than a fifth of the scores, None, or with `blocks` every key for each
    block of queries. The values are read back at once: on every call (`every_call`, a mask
    of tensors), only on a device of {reads}, so that elsewhere a call never waits for the
    device (the kernel then runs on all keys, or with `blocks` every key for each block)."""
    if torch.compiler.is_compiling():  # one call, its shape traced: not a loop over it
        return None
    n_q, n_k = mask.shape[-2:] if shape is None else shape
    every = [(t, min(t + {knob}, n_q), 0, n_k, False) for t in range(0, n_q, {knob})]
    if n_q * n_k == 0:
        return every if blocks else None
    if hides == "none":  # a mask made by blocks that hides no key: every key for each block
        return every
    if every_call and (mask if shape is None else mask(0, 0, 0, 0)).device.type not in {reads}:
        return every if blocks else None

    if any(x.numel() == 0 for x in values):  # no entries at all: nothing to tell
        box = None
    if box is not None and values:  # their least and greatest by tiles, in one read
        tiles = [x.reshape(-1, x.shape[-1]).double() for x in values]
        tiles = [torch.cat([x, x[:, -1:].expand(-1, -x.shape[-1] % {knob})], -1) for x in tiles]
        tiles = [x.unflatten(-1, (-1, {knob})) for x in tiles]
        ends = torch.stack([e for x in tiles for e in (x.amin((0, 2)), x.amax((0, 2)))]).tolist()
        values = [
            lambda a, b, lo=lo, hi=hi: (min(lo[a // {knob} : b // {knob} + 1]),
                                        max(hi[a // {knob} : b // {knob} + 1]))
            for lo, hi in zip(ends[::2], ends[1::2])
        ]

    def told(t, u, k, l):  # the keys k:l in parts, each with what the condition holds there
        said = box(t, u, k, l, *values)
        if said is not None or l - k <= {knob}:
            return [(k, l, said)]
        half = k + max(1, (l - k) // (2 * {knob})) * {knob}  # at a tile's edge
        return told(t, u, k, half) + told(t, u, half, l)

    read, parts = [], []  # the counts read, and each block's parts: (first key, counts)
    for t in range(0, n_q, {knob}):
        u, told_apart, part = min(t + {knob}, n_q), [], []
        for k, l, said in [(0, n_k, None)] if box is None else told(t, u, 0, n_k):
            if said is None and told_apart and told_apart[-1][2] is None:
                k = told_apart.pop()[0]  # keys not told apart side by side: read at once
            told_apart.append((k, l, said))
        for k, l, said in told_apart:
            if said is not None:  # (seen, first seen, end, keys where it changes nothing)
                part.append((k, (int(said > 0), 0, l - k, (l - k) * (said == 2))))
                continue
            rows = mask(t, u, k, l) if shape is not None else mask[..., t:u, k:l]
            keep = rows != -math.inf if hides == "-inf" else rows != 0 if hides == "0" else rows
            keep = ~rows if hides == "true" else keep
            plain = rows == 0 if hides == "-inf" else keep  # where the mask changes nothing
            seen = keep.any(-2).reshape(-1, l - k).any(0).long()
            fit = plain.all(-2).reshape(-1, l - k).all(0)
            end = l - k - seen.flip(0).argmax()
            read.append(torch.stack([seen.amax(), seen.argmax(), end, fit.sum()]))
            part.append((k, len(read) - 1))
        parts.append(part)
    counts = torch.stack(read).tolist() if read else []
    spans, fits = [], []
    for t, part in zip(range(0, n_q, {knob}), parts):
        part = [(k, counts[c] if isinstance(c, int) else c) for k, c in part]
        seen = [(k + first, k + end) for k, (any_, first, end, _) in part if any_]
        k0, k1 = (seen[0][0], seen[-1][1]) if seen else (0, n_k)  # none seen: 0 to n_k
        fits.append(sum(count for _, (*_, count) in part))  # only keys a block sees can fit
        spans.append((t, min(t + {knob}, n_q), k0, k1, fits[-1] == k1 - k0))
    if all(count == n_k for count in fits):
        return [(0, n_q, 0, n_k, True)]
    kept = sum((u - t) * (k1 - k0) for t, u, k0, k1, _ in spans)
    return spans if kept <= 0.8 * n_q * n_k else every if blocks else None'''


def _safe_softmax(name: str, reads: str) -> str:
    """The module's softmax for rows that may be -inf everywhere: the softmax policy."""
    return f'''def {name}(scores, dim=-1, overwrite=False):
    """softmax over `dim` where a row may be -inf everywhere: such a row gives zeros, not NaN
    (values and gradients); `overwrite`: the weights may be written over the scores. On a
    device of {reads}, reading a value back costs no synchronisation: the plain softmax
    runs, and aten's safe one only where a row is dead (it costs 1.3-3.7x the plain one).
    Elsewhere, when traced and under torch.func, nothing branches on the scores' values."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return torch.ops.aten._safe_softmax.default(scores, dim)
    if scores.device.type not in {reads}:
        if torch.is_grad_enabled() and scores.requires_grad:
            return torch.ops.aten._safe_softmax.default(scores, dim)
        # a dead row's maximum taken as 0, so that exp makes it 0, and its sum, 0, taken as
        # 1; a live row's sum is at least 1 (its maximum's exp)
        top = scores.amax(dim, keepdim=True)
        top = top.masked_fill_(top.isneginf(), 0.0)
        weights = (scores.sub_(top) if overwrite else scores - top).exp_()
        total = weights.sum(dim, keepdim=True)
        return weights.div_(total.masked_fill_(total == 0, 1.0))
    if overwrite:
        if scores.amax(dim).isneginf().any():
            return torch.ops.aten._safe_softmax.default(scores, dim)
        return torch.softmax(scores, dim=dim, out=scores)
    weights = torch.softmax(scores, dim=dim)
    if weights.select(dim, 0).isnan().any():  # a dead row is NaN throughout, a live one not
        weights = torch.ops.aten._safe_softmax.default(scores, dim)
    return weights'''


def _softmax_values(name: str, function: str, dropout: bool = False) -> str:
    """The module's function for `SoftmaxValues`, and the autograd Function it runs; with
    `dropout`, on the weights before the product (the same draws as F.dropout)."""
    kept = "kept" if dropout else "weights"
    inputs = "p, training, " if dropout else ""
    params = "p=0.0, training=False, " if dropout else ""
    saved = "weights, kept, keep, values" if dropout else "weights, values"
    nones = "None, None, None" if dropout else "None"
    what = "dropout(softmax(S), p)" if dropout else "softmax(S)"
    draw, undraw, plain, redraw = _DROPOUT if dropout else ("",) * 4
    return f'''class {function}(torch.autograd.Function):
    """W = {what} over the last axis, and O = W @ V, as one step:
    the backward adds W's own gradient into the product's and makes the scores' gradient in
    place, one tensor of their size where autograd's steps make three."""

    @staticmethod
    def forward(ctx, scores, values, {inputs}softmax):
        weights = torch.softmax(scores, dim=-1) if softmax is None else softmax(scores){draw}
        ctx.set_materialize_grads(False)
        ctx.save_for_backward({saved})
        return {kept}, {kept} @ values

    @staticmethod
    def backward(ctx, grad_{kept}, grad_out):
        if torch.is_grad_enabled():  # create_graph=True
            raise RuntimeError(
                "{name}: no second derivative (its backward works in place); "
                "differentiate twice under torch.func, which runs the plain steps"
            )
        {saved} = ctx.saved_tensors
        grad_values = None
        if grad_out is not None and ctx.needs_input_grad[1]:
            grad_values = {kept}.mT @ grad_out
        if grad_out is None and grad_{kept} is None or not ctx.needs_input_grad[0]:
            return None, grad_values, {nones}
        if grad_out is None:
            grad = grad_{kept}.clone(memory_format=torch.contiguous_format)
        else:
            grad = grad_out @ values.mT
            grad = grad if grad_{kept} is None else grad.add_(grad_{kept}){undraw}
        grad.mul_(weights)  # the softmax's: W (g - sum(W g))
        grad.addcmul_(weights, grad.sum(-1, keepdim=True), value=-1)
        return grad, grad_values, {nones}


def {name}(scores, values, {params}softmax=None):
    """{what} over the last axis, and its product with the values:
    with gradients, one autograd step ({function}); else the plain steps.
    `softmax`: the module's safe one, where rows may be -inf everywhere (zeros, not NaN)."""
    traced = torch.compiler.is_compiling()  # torch.compile fuses the plain steps itself
    # vmap, grad: their own autograd, and no branch on a tensor's values
    transformed = torch._C._are_functorch_transforms_active()
    plain = (
        traced
        or transformed
        or not torch.is_grad_enabled()
        or not (scores.requires_grad or values.requires_grad)
        or torch.is_autocast_enabled(scores.device.type)  # the backward would mix dtypes{plain}
    )
    if not plain:
        return {function}.apply(scores, values, {inputs}softmax)
    overwrite = not (torch.is_grad_enabled() or traced)  # the weights over the scores
    if softmax is not None:
        weights = softmax(scores, -1, overwrite)
    else:
        weights = torch.softmax(scores, dim=-1, out=scores if overwrite else None){redraw}
    return weights, weights @ values'''


# the dropout's pieces: its draw in the forward, its mask in the backward, the plain steps
# for p = 1 (F.dropout's zeros, without a draw), and F.dropout in the plain steps
_DROPOUT = (
    """
        kept, keep = weights, None
        if training and p > 0:
            kept, keep = torch.native_dropout(weights, p, True)  # F.dropout's draws
        ctx.p = p""",
    """
        if keep is not None:
            grad.mul_(keep).div_(1 - ctx.p)""",
    """
        or training and p >= 1  # F.dropout's zeros, without a draw""",
    """
    weights = F.dropout(weights, p, training=training)""",
)


def recomputed_text(name: str) -> str:
    """The module's function that runs one block (of rows, of queries), recomputed in the
    backward."""
    return f'''def {name}(function, *args, **kwargs):
    """function(*args, **kwargs) for one block of rows or queries. Under autograd its scores
    and weights are made again in the backward rather than saved (torch.utils.checkpoint),
    so that a training step holds one block's at a time, never every row's; the random
    state is replayed, so dropout draws the same mask. Traced, or without gradients: the
    call."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return function(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)'''


def by_blocks_text(name: str, function: str, pieces: str) -> str:
    """The module's function that runs a block function over blocks of queries (or rows) and
    joins the results, and the autograd Function and the cutting it runs."""
    return f'''def {pieces}(tensors, cuts, span):
    """Each tensor cut to a block, along each axis its cut names: to the span's queries
    ("q": span[0]:span[1]) or keys ("k": span[2]:span[3]). Views: nothing is copied."""
    out = []
    for tensor, cut in zip(tensors, cuts):
        for axis, which in cut.items():
            start, end = span[0:2] if which == "q" else span[2:4]
            tensor = tensor.narrow(axis, start, end - start)
        out.append(tensor)
    return out


class {function}(torch.autograd.Function):
    """The blocks of `{name}` as one autograd step. The forward keeps no block's scores; the
    backward makes each block again from its pieces (under the forward's autocast) and adds
    its gradients into one per tensor (float32 or wider), at the queries and keys the block
    read, as FlashAttention's backward accumulates dK and dV: no block makes a gradient the
    size of a whole tensor, as autograd's own backward of a slice does (work that grows as
    blocks times N)."""

    @staticmethod
    def forward(ctx, block, spans, cuts, dim, draws, *values):
        tensors = [v for v in values if torch.is_tensor(v)]  # the others: numbers
        ctx.kind = next((t.device.type for t in tensors if t.device.type != "cpu"), "cuda")
        kind = tensors[0].device.type
        ctx.autocast = kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
        outs, ctx.states = [], []
        for span in spans:
            if draws:  # the random state the block draws from, replayed in the backward
                devices = torch.utils.checkpoint.get_device_states(*tensors)
                ctx.states.append((torch.get_rng_state(), devices))
            outs.append(block(*span, *{pieces}(values, cuts, span)))
        ctx.block, ctx.spans, ctx.cuts, ctx.dim = block, spans, cuts, dim
        ctx.sizes = [out.shape[dim] for out in outs]
        ctx.tensors = [k for k, v in enumerate(values) if torch.is_tensor(v)]
        ctx.values = [None if torch.is_tensor(v) else v for v in values]
        ctx.save_for_backward(*tensors)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True
            raise RuntimeError(
                "{name}: no second derivative (its backward adds into its gradients in place); "
                "differentiate twice under torch.func, which runs the plain blocks"
            )
        values, needs = list(ctx.values), ctx.needs_input_grad[5:]
        for k, tensor in zip(ctx.tensors, ctx.saved_tensors):
            values[k] = tensor
        kept = [v for v, n in zip(values, needs) if n]  # those whose gradients are made
        wide = [torch.promote_types(v.dtype, torch.float32) for v in kept]
        sums = [v.new_zeros(v.shape, dtype=w) for v, w in zip(kept, wide)]  # float32 or wider
        into, made = [cut for cut, n in zip(ctx.cuts, needs) if n], [False] * len(kept)
        leaves, start = [v.detach() if torch.is_tensor(v) else v for v in values], 0
        kind, autocast, dtype = ctx.autocast
        for k, (span, size) in enumerate(zip(ctx.spans, ctx.sizes)):
            cut = {pieces}(leaves, ctx.cuts, span)
            cut = [p.requires_grad_() if n else p for p, n in zip(cut, needs)]
            state = ctx.states[k] if ctx.states else None  # as the forward drew, if it drew
            devices = state[1][0] if state else []
            with torch.random.fork_rng(devices, state is not None, device_type=ctx.kind):
                if state is not None:
                    torch.set_rng_state(state[0])
                    torch.utils.checkpoint.set_device_states(*state[1], device_type=ctx.kind)
                with torch.enable_grad(), torch.autocast(kind, dtype, autocast):
                    out = ctx.block(*span, *cut)
            if out.requires_grad:
                part = grad.narrow(ctx.dim, start, size)
                wanted = [p for p, n in zip(cut, needs) if n]
                found = torch.autograd.grad(out, wanted, part, allow_unused=True)
                for j, (total, got) in enumerate(zip({pieces}(sums, into, span), found)):
                    if got is not None:
                        total.add_(got)
                        made[j] = True
            start += size
        sums = iter(s.to(v.dtype) if m else None for s, m, v in zip(sums, made, kept))
        return None, None, None, None, None, *(next(sums) if n else None for n in needs)


def {name}(block, spans, tensors, cuts, dim=-2, draws=False):
    """block(*span, *pieces) at each span (first query, end, first key, end, ...), joined
    along `dim`: each tensor cut to the span as `cuts` says ({pieces}); a number (a scalar,
    which may be a tensor too) passed as it is. Under autograd one step ({function}) whose
    backward makes each block again (`draws`: dropout's draws replayed), so that a training
    step holds one block's scores at a time; under torch.func (its own autograd), traced
    (never by blocks) and without gradients, the blocks."""
    grads = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad for t in tensors)
    plain = torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling()
    if grads and not plain:
        return {function}.apply(block, spans, cuts, dim, draws, *tensors)
    outs = [block(*span, *{pieces}(tensors, cuts, span)) for span in spans]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim)'''
