"""Plan steps of the fused kernels -> Python: `F.linear`, `unbind`, and
`F.scaled_dot_product_attention` with the heads merged and the mask aligned."""

from __future__ import annotations

from functools import partial

from ...ir import Index
from ..program.steps import Attention, Flex, Linear, Operand, Pad, SoftmaxValues, Spans, Split
from . import tables_emit
from .expressions import tuple_text, wrap
from .values import Values, axes_comment, expand, prints, relayout


class KernelSteps(Values):
    """The kernels' step printers, over the values they print (the Emitter's base)."""

    @prints(Linear)
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

    @prints(Split)
    def step_Split(self, step: Split) -> str:
        dims = step.arg.dims
        dim = dims.index(step.over) - len(dims)
        if step.parts:
            sizes = ", ".join(self.size(i) for i in step.parts)
            split = f"{self.ref(step.arg)}.split([{sizes}], dim={dim})"
        else:
            split = f"{self.ref(step.arg)}.unbind({dim})"
        return f"{', '.join(self.var(o) for o in step.outs)} = {split}"

    @prints(Attention)
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

    @prints(Flex)
    def step_Flex(self, step: Flex) -> list[str]:
        """`flex_attention`, printed by the FlexAttention backend (backends/flex/emit.py)."""
        from ...backends.flex import emit

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
        end, first key, end, whole), through the runtime's `by_blocks`: a function of one
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
        by_blocks = self.runtime("by_blocks")
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
        scale = self.number(step.scale)
        if step.scale.free_symbols & self.scalar_symbols:  # a tensor scale multiplies q
            scale, q = wrap(scale), f"({q} * {wrap(scale)} if torch.is_tensor({scale}) else {q})"
            scale = f"1.0 if torch.is_tensor({scale}) else {scale}"
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
        args.append(f"scale={scale}")
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

    @prints(Spans)
    def step_Spans(self, step: Spans) -> list[str]:
        """The blocks of queries and their keys, read off the mask; off a table made by
        blocks (passes/tables.py), block by block from its positions."""
        spans, out = self.runtime("key_spans"), self.var(step.out)
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

    @prints(SoftmaxValues)
    def step_SoftmaxValues(self, step: SoftmaxValues) -> str:
        """`W, O = softmax_values(S, V)` (passes/softmax_values.py): V viewed (…, key, width)."""
        weights, out = step.outs
        values, key = step.values, weights.dims[-1]
        shape = (*out.dims[:-2], key, out.dims[-1])
        args = [self.ref(step.scores), expand(self.ref(values), values.dims, shape, values.batched)]
        if step.dropout is not None:
            args += [f"p={self.number(step.dropout)}", "training=training"]
        args += [f"softmax={self.safe_softmax()}"] if step.safe else []
        call = self.runtime("softmax_values")
        made = f"{self.var(weights)}, {self.var(out)}"
        return f"{made} = {call}({', '.join(args)})  # {axes_comment(weights)}, {axes_comment(out)}"

    @prints(Pad)
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
        """The runtime's softmax for rows that may be -inf everywhere (the one place of the
        softmax policy: docs/performance.md, "Value-dependent branches")."""
        return self.runtime("safe_softmax")

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
