"""The `blocks` backend's printer: the rows' function (lower/program/passes/rows.py marks its
steps) and the lines of the spec's function that call it: once for all rows, or per block of
rows, each block over every key or over the keys the mask lets it see (passes/spans.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import ops
from ...ir import Index, Spec
from ...lower.printers import tables_emit
from ...lower.printers.emit import lines_of
from ...lower.printers.expressions import joined, tuple_text, wrap
from ...lower.printers.values import Context
from ...lower.program.program import KeySpans, Rows
from ...lower.program.steps import Elementwise, Operand, Step, Var


class RowsWriter:
    """Prints the rows' function, and the lines of the spec's function that call it: once
    for all rows, or per block of rows, whichever the sizes ask for."""

    def __init__(self, main: Context, rows: Rows, spans: KeySpans | None = None) -> None:
        spec, names = main.spec, main.names
        self.spec, self.names, self.rows, self.spans = spec, names, rows, spans
        self.main = main  # the spec's function's lines: where a table made per block is called
        self.emitter = Context(spec, names, main.needs.sharing(), blocked=main.blocked)
        self.function = names.fresh(names.function + "_rows")
        self.knob = names.fresh("BLOCK_SCORES")
        self.floor = names.fresh("BLOCK_ROWS")
        self.body: list[str] = []
        self.computed: list[str] = []  # the tensors of the equations whose steps are here
        self.dropout = False
        self.casts = False  # a precision's casts: the call's dtype is passed, not read off
        self.inputs = Inputs(rows, spans, main)

    def add(self, tensors: list[str], heading: list[str], steps: list[Step], drop=()) -> None:
        self.computed += tensors
        self.body += heading + [line for s in steps for line in lines_of(self.emitter, s)]
        self.body += self.names.dropped(drop)
        self.dropout |= any(isinstance(s, Elementwise) and s.fn == "dropout" for s in steps)
        self.casts |= any(
            isinstance(s, Elementwise) and ops.lookup(s.fn).kind == "cast" for s in steps
        )

    def keywords(self) -> list[str]:
        needs = self.emitter.needs
        out = [a for s, a in self.spec.size_names.items() if s in needs.sizes]
        out += [s.ascii for s in self.spec.scalars if s.symbol in needs.scalars]
        return out + (["training"] if self.dropout else []) + (["dtype"] if self.casts else [])

    def definition(self) -> str:
        """The knob, then the function."""
        inputs = [self.names.var(v) for v in self.rows.inputs]
        keywords = self.keywords()
        params = [*inputs, "*", *keywords] if keywords else inputs
        head = f"def {self.function}({', '.join(params)}):"
        doc = (
            f"# {', '.join(self.computed)} at some positions {self.rows.row.glyph}: all of "
            "them, or a block of them"
        )
        prologue, like = [], self.like()
        if self.casts:  # its inputs may be wider than the call: dtype is a keyword
            prologue = [f"device = {like}.device"] if self.emitter.needs.device else []
        elif self.emitter.needs.device or self.emitter.needs.dtype:
            prologue = [f"device, dtype = {like}.device, {like}.dtype"]
        exits = ", ".join(self.names.var(e.var) for e in self.rows.exits)
        lines = [doc, *prologue, *self.body, f"return {exits}"]
        knobs = _knobs(self.knob, self.floor, bool(self.rows.summed))
        lines = [*knobs, "", "", head, *("    " + line for line in lines)]
        return "\n".join(lines)

    def like(self) -> str:
        """The input whose device and dtype the rows compute in: the first that is not one of
        the spec's integer inputs (ids, positions: a backward's rows may read those first)."""
        ints = {t.ascii for t in self.spec.arguments if t.dtype == "int"}
        first = next(v for v in self.rows.inputs if not (v.argument and v.hint in ints))
        return self.names.var(first)

    def call(self) -> list[str]:
        """Lines of the spec's function: the rows at once, or in blocks."""
        rows, names, main = self.rows, self.names, self.main
        size, count = main.size(rows.row), names.fresh("rows")
        main.needs.sizes |= self.emitter.needs.sizes
        main.needs.scalars |= self.emitter.needs.scalars
        main.needs.dtype |= self.casts
        main.use("torch")
        per_row = " * ".join(self._per_row(main)) or "1"
        head = [
            f"# {', '.join(self.computed)}: by blocks of {rows.row.glyph} on long sequences",
            f"{count} = {main.runtime('block_rows')}({self.floor}, {self.knob} // ({per_row}))",
            f"if torch.compiler.is_compiling():  # one block: a graph that holds at every {size}",
            f"    {count} = {size}",
        ]
        whole = [*self.inputs.made({}), self._call(self.inputs.arguments({}))]
        if len(rows.exits) > 1:
            return head + self._parts(main, size, count, whole)
        if self.spans is None:
            return head + self._blocks(size, count, whole)
        return head + self._spans(main, size, count, whole)

    def _per_row(self, main: Context, keys: str | None = None) -> list[str]:
        """The factors of a row's scores: its batch, heads and keys (`keys`: a span's count)."""
        rows, key = self.rows, self.spans.hidden.key if keys else None
        per_row = [
            keys if i == key else wrap(main.size(i)) for i in rows.scores.dims if i != rows.row
        ]
        batch = _batch(self.spec)
        return ([batch] if batch and rows.scores.batched else []) + per_row

    def _blocks(self, size: str, count: str, whole: list[str]) -> list[str]:
        """Every key for every block of rows."""
        names, rows = self.names, self.rows
        start, end = names.fresh("t"), names.fresh("u")
        blocks, out = names.fresh("blocks"), names.var(rows.exits[0].var)
        function, call = self._by_blocks({rows.row: f"{start}:{end}"}, [start, end], blocks)
        return [
            f"if {count} >= {size}:",
            *_ending(whole, f"{out} = "),
            "else:",
            *("    " + line for line in function),
            f"    {blocks} = []",
            f"    for {start} in range(0, {size}, {count}):",
            f"        {blocks}.append(({start}, min({start} + {count}, {size})))",
            f"    {out} = {call}",
        ]

    def _spans(self, main: Context, size: str, count: str, whole: list[str]) -> list[str]:
        """Blocks of rows, each over the keys the mask lets any of them see (hidden.py)."""
        names, rows, spans = self.names, self.rows, self.spans
        q0, q1, k0, k1, start, blocks = (
            names.fresh(hint) for hint in ("q0", "q1", "k0", "k1", "t", "blocks")
        )
        out, read = names.var(rows.exits[0].var), names.var(spans.step.out.var)
        end = names.fresh("u")  # the block function's parameters: t, u, k0, k1
        cuts = {rows.row: f"{start}:{end}", spans.hidden.key: f"{k0}:{k1}"}
        function, call = self._by_blocks(cuts, [start, end, k0, k1], blocks)
        every = f"0, {size}, 0, {main.size(spans.hidden.key)}"  # every query and key
        return [  # one call where the blocks skip nothing, or the mask hides nothing
            f"if {count} >= {size} and {read} in (None, [({every}, True)]):",
            *_ending(whole, f"{out} = "),
            f"else:  # by blocks of {rows.row.glyph}, each over the keys the mask lets them see",
            *("    " + line for line in function),
            f"    {blocks} = []",
            f"    for {q0}, {q1}, {k0}, {k1}, _ in {read} or [({every}, False)]:",
            *("        " + line for line in self._span_rows(main, count, k0, k1)),
            f"        for {start} in range({q0}, {q1}, {count}):",
            f"            {blocks}.append(({start}, min({start} + {count}, {q1}), {k0}, {k1}))",
            f"    {out} = {call}",
        ]

    def _by_blocks(self, cuts: dict[Index, str], span: list[str], blocks: str):
        """The function of one block (its parameters: the names of `span`, then the tensors
        it reads), and the runtime's `by_blocks` call that runs it on each of `blocks`, each
        tensor cut to the block's rows and keys by `by_blocks` (so that the backward adds
        each block's gradients into one per tensor): the rows' inputs, the tensors the
        tables made by block read, and the scalars, which may be tensors (passed, never
        closed over: their gradients are made)."""
        tables = self.inputs.tables()
        function = self.names.fresh(self.names.function + "_block")
        inputs = self.rows.inputs
        tensors = {self.names.var(v): self.inputs.cut(v, cuts) for v in inputs if v not in tables}
        scalars = {s.ascii for s in self.spec.scalars}
        read, before = [name for name in self.keywords() if name in scalars], []
        for var in tables:
            more, lines = tables_emit.block_reads(self.emitter.blocked[var], self.main, var)
            read, before = read + more, before + lines
        tensors |= {name: "{}" for name in read if name not in tensors}
        arguments = [self.inputs.block(v) if v in tables else self.names.var(v) for v in inputs]
        lines = [
            *before,
            f"def {function}({', '.join([*span, *tensors])}):  # made again in the backward",
            *("    " + line for line in self.inputs.made(cuts)),
            f"    return {self._call(arguments)}",
        ]
        by_blocks = self.main.runtime("by_blocks")
        args = [function, blocks, tuple_text(tensors), tuple_text(tensors.values())]
        args += [f"dim={self._dim()}"] if self._dim() != -2 else []
        args += ["draws=training"] if self.dropout else []
        return lines, f"{by_blocks}({', '.join(args)})"

    def _parts(self, main: Context, size: str, count: str, whole: list[str]) -> list[str]:
        """Several exits: those over the rows joined, those that sum the rows away added up
        block by block (into the keys of the block, where the blocks skip keys)."""
        names, rows, spans = self.names, self.rows, self.spans
        outs = [names.var(e.var) for e in rows.exits]
        q0, q1, k0, k1, start, end = (names.fresh(h) for h in ("q0", "q1", "k0", "k1", "t", "u"))
        cuts = {rows.row: f"{start}:{end}"} | ({spans.hidden.key: f"{k0}:{k1}"} if spans else {})
        pieces = [names.fresh(out + "_part") for out in outs]
        lists = {e.var: names.fresh(out + "_blocks") for e, out in zip(rows.exits, outs)}
        joins = [e for e in rows.exits if e.var not in rows.summed]
        sums = [out for e, out in zip(rows.exits, outs) if e.var in rows.summed]
        loop = [f"{end} = min({start} + {count}, {q1})", *self.inputs.made(cuts)]
        loop += [f"{', '.join(pieces)} = {self._call(self.inputs.arguments(cuts), True)}"]
        for e, out, piece in zip(rows.exits, outs, pieces):
            if e.var not in rows.summed:
                loop.append(f"{lists[e.var]}.append({piece})")
            elif spans is not None and spans.hidden.key in e.dims:
                loop += _into_keys(main, spans.hidden.key, e, out, piece, k0, k1)
            else:
                loop.append(f"{out} = {piece} if {out} is None else {out}.add_({piece})")
        key = spans.hidden.key if spans else rows.row
        every = f"0, {size}, 0, {main.size(key)}"  # every query and key
        read = names.var(spans.step.out.var) if spans else "None"
        once = f"{read} in (None, [({every}, True)])" if spans else "True"
        return [
            f"if {count} >= {size} and {once}:",
            *_ending(whole, f"{', '.join(outs)} = "),
            f"else:  # by blocks of {rows.row.glyph}"
            + (", each over the keys they see" if spans else ""),
            f"    {', '.join(lists[e.var] for e in joins)} = {', '.join('[]' for _ in joins)}",
            f"    {' = '.join(sums)} = None",
            f"    for {q0}, {q1}, {k0}, {k1}, _ in {read} or [({every}, False)]:",
            *("        " + line for line in self._span_rows(main, count, k0, k1)),
            f"        for {start} in range({q0}, {q1}, {count}):",
            *("            " + line for line in loop),
            *(f"    {names.var(e.var)} = {joined(lists[e.var], self._dim(e))}" for e in joins),
        ]

    def _span_rows(self, main: Context, count: str, k0: str, k1: str) -> list[str]:
        """The rows of a block over a span's keys alone: the scores' budget spent on the keys
        the block reads, not on every key (a window's block of rows is then as long as the
        span, and writes its keys' gradients once)."""
        if self.spans is None:
            return []
        factors = " * ".join(self._per_row(main, f"({k1} - {k0})"))
        rows = main.runtime("block_rows")
        count = f"{count} = {rows}({self.floor}, {self.knob} // ({factors}))"
        return [count + "  # rows a block over these keys"]

    def _call(self, arguments: list[str], block: bool = False) -> str:
        """The rows' function on `arguments`; for one `block` of several, through the
        runtime's `recomputed`, so that autograd keeps a block's inputs, not its scores."""
        keywords = [f"{k}={k}" for k in self.keywords()]
        if not block:
            return f"{self.function}({', '.join(arguments + keywords)})"
        recomputed = self.main.runtime("recomputed")
        return f"{recomputed}({', '.join([self.function, *arguments, *keywords])})"

    def _dim(self, exit: Operand | None = None) -> int:
        exit = exit or self.rows.exits[0]
        return exit.dims.index(self.rows.row) - len(exit.dims)


def _knobs(knob: str, floor: str, summed: bool) -> list[str]:
    """The rows' budgets, module-level constants a reader may tune: a backward (`summed`)
    holds four to nine tensors of the scores' size, and its blocks as few rows as its budget
    asks."""
    if summed:
        scores = f"{knob} = 2 ** 20  # on long sequences, scores per tensor, at most"
        rows = f"{floor} = 1  # rows a block holds at least"
    else:
        scores = f"{knob} = 2 ** 22  # on long sequences, scores held at once, at most"
        rows = f"{floor} = 64  # rows a block holds at least: its keys' gradients cost"
        rows += " a 64th of its work"
    return [scores + f" (but {floor} rows)", rows]


def _ending(lines: list[str], assign: str) -> list[str]:
    """Lines indented once, the last one assigned."""
    return ["    " + line for line in lines[:-1]] + ["    " + assign + lines[-1]]


@dataclass(frozen=True)
class Inputs:
    """The rows' inputs as a block reads them: cut along the rows, and along the keys where
    the blocks skip keys (`spans`); a table made per block (passes/tables.py) made from the
    block's positions in `main`, the spec's function, under a name of its own (`blocks`)."""

    rows: Rows
    spans: KeySpans | None
    main: Context
    blocks: dict = field(default_factory=dict)  # a table's block: its name

    def cut(self, var: Var, cuts: dict[Index, str]) -> str:
        """Where `by_blocks` cuts the input to a block: `{axis: "q" or "k"}`, the axis counted
        from the end when batched, else from the start."""
        found = self.axes(var, cuts)
        if not found:
            return "{}"
        _, count, batched = self.layout(var)
        which = {self.rows.row: "q"} | ({self.spans.hidden.key: "k"} if self.spans else {})
        axes = {(axis - count if batched else axis): which[i] for axis, i in found.items()}
        return "{" + ", ".join(f'{axis}: "{w}"' for axis, w in axes.items()) + "}"

    def axes(self, var: Var, pieces: dict[Index, str]) -> dict[int, Index]:
        """The axes of the input along which it is cut to `pieces`: its row axis and key axis
        (by their place in its layout), where `pieces` has one."""
        return {t[var][0]: i for t, i in self.found() if var in t and i in pieces}

    def layout(self, var: Var) -> tuple:
        """(axis, axes, batched) of an input cut along the rows or keys."""
        return next(table[var] for table, _ in self.found() if var in table)

    def found(self) -> list[tuple[dict, Index]]:
        """The inputs cut along the rows and along the keys (each by its layout), with the
        index each is cut along."""
        found = [(self.rows.sliced, self.rows.row)]
        return found + ([(self.spans.hidden.keyed, self.spans.hidden.key)] if self.spans else [])

    def made(self, pieces: dict[Index, str]) -> list[str]:
        """The lines that make the blocks of the tables the rows read (passes/tables.py),
        each from the positions of the pieces."""
        return [f"{self.block(v)} = {self.slice(v, pieces)}" for v in self.tables()]

    def arguments(self, pieces: dict[Index, str]) -> list[str]:
        """The rows' inputs cut to the pieces; a table's block by its name (`made`)."""
        tables = self.tables()
        return [self.block(v) if v in tables else self.slice(v, pieces) for v in self.rows.inputs]

    def tables(self) -> list[Var]:
        return [v for v in self.rows.inputs if v in self.main.blocked]

    def block(self, var: Var) -> str:
        if var not in self.blocks:
            self.blocks[var] = self.main.names.fresh(self.main.names.var(var) + "_block")
        return self.blocks[var]

    def slice(self, var: Var, pieces: dict[Index, str]) -> str:
        """The input cut to `pieces` along its row and key axes: counted from the end when
        batched (after `...`), else from the start."""
        name = self.main.names.var(var)
        cuts = {axis: pieces[i] for axis, i in self.axes(var, pieces).items()}
        made = self.main.blocked.get(var)
        if made is not None:  # a table made per block from its positions (passes/tables.py)
            own = {made.dims[axis]: piece for axis, piece in cuts.items()}
            return tables_emit.call(made, self.main, own, self.main.distance_rows.get(var))
        if not cuts:
            return name
        _, axes, batched = self.layout(var)
        kept = range(min(cuts), axes) if batched else range(max(cuts) + 1)
        items = (["..."] if batched else []) + [cuts.get(k, ":") for k in kept]
        return f"{name}[{', '.join(items)}]"


def _into_keys(main: Context, key: Index, exit: Operand, out: str, piece: str, k0: str, k1: str):
    """A block's part of a sum over the rows, over the keys it sees: added into them."""
    dim = exit.dims.index(key) - len(exit.dims)
    after = f" + {piece}.shape[{dim + 1}:]" if dim < -1 else ""
    shape = f"{piece}.shape[:{dim}] + ({main.size(key)},){after}"
    return [
        f"if {out} is None:",
        f"    {out} = {piece}.new_zeros({shape})",
        f"{out}.narrow({dim}, {k0}, {k1} - {k0}).add_({piece})",
    ]


def _batch(spec: Spec) -> str | None:
    """The number of batch elements, read from the first batched input."""
    first = next((t for t in spec.arguments if t.batched), None)
    if first is None:
        return None
    return f"{first.ascii}.shape[:-{len(first.layout)}].numel()"
