"""Scores in blocks of queries: where per-call steps hold tensors over two sequence indices
(the N×N scores of each head, and every elementwise step on them: soft-capping, sigmoid,
sinks), the steps from the scores to the values they produce over the queries alone (`A @ V`)
go into a function of their own, computed for all query positions at once on short
sequences, and for blocks of them on long ones.
Exact: a query's row of scores depends on that query alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import Index, Spec
from .emit import Emitter
from .hoist import operands
from .naming import Names
from .order import planning_count
from .printers import joined, wrap
from .steps import (
    Add,
    Cat,
    Contract,
    Elementwise,
    Gather,
    Linear,
    Operand,
    Reduction,
    Rename,
    Step,
    Var,
)

if TYPE_CHECKING:
    from .hidden import KeySpans

# Steps a block of rows computes exactly as all rows would (no step that reads a size as a
# shape, nor one that mixes rows).
ROW_WISE = (Contract, Add, Elementwise, Rename, Reduction, Gather, Cat, Linear)


@dataclass(frozen=True)
class Rows:
    """The steps computed per block of `row` positions, and what they read and give back."""

    row: Index
    chosen: frozenset[tuple[int, int]]  # (block, position among the block's per-call steps)
    last: int  # the block after whose steps the rows are computed
    inputs: tuple[Var, ...]  # read from outside, in order of first use
    sliced: dict[Var, tuple[int, int, bool]]  # inputs with row axes: (axis, of axes, batched)
    exit: Operand  # the one value read after the rows
    scores: Operand  # the widest value: its axes but `row` count the elements of one row


def find(spec: Spec, per_call: tuple[tuple[Step, ...], ...], read_after: set[Var]) -> Rows | None:
    """The rows, where per-call steps hold values over two sequence indices and the steps
    that compute from them can go row by row; else None (the plain steps stay)."""
    sequence = sequence_indices(spec)
    flat = [(b, k, s) for b, steps in enumerate(per_call) for k, s in enumerate(steps)]
    wide = [n for n, (_, _, s) in enumerate(flat) if len(sequence & set(s.out.dims)) >= 2]
    if not wide:
        return None
    held = {flat[n][2].out.var for n in wide}
    readers = [n for n, (_, _, s) in enumerate(flat) if any(o.var in held for o in operands(s))]
    if not readers:  # the scores are an output themselves
        return None
    for starts in (set(wide), {wide[0]}):  # every wide step (one core's several score
        chosen, inside = _chain(flat, starts, readers[-1])  # products), else the first core
        reads = {o.var for n, (_, _, s) in enumerate(flat) if n not in chosen for o in operands(s)}
        exits = [flat[n][2].out for n in chosen if flat[n][2].out.var in reads | read_after]
        if len(exits) == 1:
            break
    if len(exits) != 1 or len(sequence & set(exits[0].dims)) != 1:
        return None
    last = flat[chosen[-1]][0]  # the rows are computed after this block: none may read them before
    early = [s for n, (b, _, s) in enumerate(flat) if n not in chosen and b <= last]
    if any(o.var == exits[0].var for s in early for o in operands(s)):
        return None
    steps = [flat[n][2] for n in chosen]
    row = next(i for i in exits[0].dims if i in sequence)
    if not all(_row_wise(s, row) for s in steps):
        return None
    sliced = inputs_along(steps, inside, row)
    if sliced is None:
        return None
    inputs = tuple(dict.fromkeys(v for s in steps for v in _reads(s) if v not in inside))
    scores = max((s.out for s in steps), key=lambda o: planning_count(o.dims))
    where = frozenset((flat[n][0], flat[n][1]) for n in chosen)
    return Rows(row, where, last, inputs, sliced, exits[0], scores)


def _chain(flat: list, starts: set[int], end: int) -> tuple[list[int], set[Var]]:
    """The steps from the first start to `end` that are a start or read one chosen before."""
    chosen, inside = [], set()
    for n in range(min(starts), end + 1):
        step = flat[n][2]
        if n in starts or any(o.var in inside for o in operands(step)):
            chosen.append(n)
            inside.add(step.out.var)
    return chosen, inside


def sequence_indices(spec: Spec) -> set[Index]:
    """Indices whose sizes no parameter has: positions in the inputs, not widths or heads."""
    fixed = {
        s
        for t in spec.tensors_of("param", "buffer")
        for axis in t.layout
        for index in axis
        for s in index.size.free_symbols
    }
    indices = {i for t in spec.tensors for axis in t.layout for i in axis}
    indices |= {i for eq in spec.equations for i in eq.indices}
    return {i for i in indices if i.size.free_symbols and not i.size.free_symbols & fixed}


def _row_wise(step: Step, row: Index) -> bool:
    """The step's rows depend on the same rows of what it reads."""
    if not isinstance(step, ROW_WISE) or row not in step.out.dims:
        return False
    if isinstance(step, Reduction) and row in step.over:
        return False
    if isinstance(step, Linear) and row in step.inner:
        return False
    return not (isinstance(step, Cat) and step.over == row)


def _reads(step: Step) -> list[Var]:
    """The variables a step reads: its operands, and a product's weight and bias."""
    found = [o.var for o in operands(step)]
    if isinstance(step, Linear):
        tensors = (step.weight, step.bias) if step.bias is not None else (step.weight,)
        found += [Var(-1, t.ascii, argument=True) for t in tensors]
    return found


def inputs_along(steps: list[Step], inside: set[Var], index: Index):
    """Inputs read with the index's axis, each as (its place, its axes, batched); None when
    one input is read both with and without it, or with it on two axes (it would be needed
    sliced and whole, or sliced twice)."""
    sliced: dict[Var, tuple[int, int, bool]] = {}
    whole: set[Var] = set()
    for op in (o for s in steps for o in operands(s) if o.var not in inside):
        if index not in op.dims:
            whole.add(op.var)
            continue
        axes = axes_of(op)
        place = (axes.index(index), len(axes), op.batched)
        if sliced.setdefault(op.var, place) != place:
            return None
    return None if whole & set(sliced) else sliced


def axes_of(op: Operand) -> list[Index | None]:
    """The variable's own axes: a literal's selected axis as None."""
    dims = iter(op.dims)
    return [next(dims) if s is None else None for s in op.select] + list(dims)


class RowsWriter:
    """Prints the rows' function, and the lines of the spec's function that call it: once
    for all rows, or per block of rows, whichever the sizes ask for."""

    def __init__(self, spec: Spec, names: Names, rows: Rows, spans: KeySpans | None = None) -> None:
        self.spec, self.names, self.rows, self.spans = spec, names, rows, spans
        self.emitter = Emitter(spec, names)
        self.function = names.fresh(names.function + "_rows")
        self.knob = names.fresh("BLOCK_SCORES")
        self.body: list[str] = []
        self.computed: list[str] = []  # the tensors of the equations whose steps are here
        self.dropout = False

    def add(self, tensors: list[str], heading: list[str], steps: list[Step]) -> None:
        self.computed += tensors
        self.body += heading + [line for s in steps for line in self.emitter.lines(s)]
        self.dropout |= any(isinstance(s, Elementwise) and s.fn == "dropout" for s in steps)

    def keywords(self) -> list[str]:
        needs = self.emitter.needs
        out = [a for s, a in self.spec.size_names.items() if s in needs.sizes]
        out += [s.ascii for s in self.spec.scalars if s.symbol in needs.scalars]
        return out + (["training"] if self.dropout else [])

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
        prologue = []
        if self.emitter.needs.device or self.emitter.needs.dtype:
            prologue = [f"device, dtype = {inputs[0]}.device, {inputs[0]}.dtype"]
        lines = [doc, *prologue, *self.body, f"return {self.names.var(self.rows.exit.var)}"]
        knob = f"{self.knob} = 2 ** 22  # on long sequences, scores held at once, at most"
        return knob + "\n\n\n" + "\n".join([head, *("    " + line for line in lines)])

    def call(self, main: Emitter) -> list[str]:
        """Lines of the spec's function: the rows at once, or in blocks."""
        rows, names = self.rows, self.names
        size, count = main.size(rows.row), names.fresh("rows")
        main.needs.sizes |= self.emitter.needs.sizes
        main.needs.scalars |= self.emitter.needs.scalars
        main.use("torch")
        per_row = [wrap(main.size(i)) for i in rows.scores.dims if i != rows.row]
        batch = self._batch()
        per_row = ([batch] if batch and rows.scores.batched else []) + per_row
        head = [
            f"# {', '.join(self.computed)}: by blocks of {rows.row.glyph} on long sequences",
            f"{count} = max(1, {self.knob} // ({' * '.join(per_row) or '1'}))",
        ]
        whole = self._call([names.var(v) for v in rows.inputs])
        if self.spans is None:
            return head + self._blocks(size, count, whole)
        return head + self._spans(main, size, count, whole)

    def _blocks(self, size: str, count: str, whole: str) -> list[str]:
        """Every key for every block of rows."""
        names, rows = self.names, self.rows
        start, blocks, out = names.fresh("t"), names.fresh("blocks"), names.var(rows.exit.var)
        piece = f"{start}:{start} + {count}"
        parts = [self._slice(v, {rows.row: piece}) for v in rows.inputs]
        return [
            f"if {count} >= {size}:",
            f"    {out} = {whole}",
            "else:",
            f"    {blocks} = [",
            f"        {self._call(parts)}",
            f"        for {start} in range(0, {size}, {count})",
            "    ]",
            f"    {out} = torch.cat({blocks}, dim={self._dim()})",
        ]

    def _spans(self, main: Emitter, size: str, count: str, whole: str) -> list[str]:
        """Blocks of rows, each over the keys the mask lets any of them see (hidden.py)."""
        names, rows, spans = self.names, self.rows, self.spans
        q0, q1, k0, k1, start, end, blocks = (
            names.fresh(hint) for hint in ("q0", "q1", "k0", "k1", "t", "u", "blocks")
        )
        out, read = names.var(rows.exit.var), names.var(spans.step.out.var)
        cuts = {rows.row: f"{start}:{end}", spans.hidden.key: f"{k0}:{k1}"}
        parts = [self._slice(v, cuts) for v in rows.inputs]
        every = f"0, {size}, 0, {main.size(spans.hidden.key)}"  # every query and key
        return [  # one call where the blocks skip nothing, or the mask hides nothing
            f"if {count} >= {size} and {read} in (None, [({every}, True)]):",
            f"    {out} = {whole}",
            f"else:  # by blocks of {rows.row.glyph}, each over the keys the mask lets them see",
            f"    {blocks} = []",
            f"    for {q0}, {q1}, {k0}, {k1}, _ in {read} or [({every}, False)]:",
            f"        for {start} in range({q0}, {q1}, {count}):",
            f"            {end} = min({start} + {count}, {q1})",
            f"            {blocks}.append({self._call(parts)})",
            f"    {out} = {joined(blocks, self._dim())}",
        ]

    def _call(self, arguments: list[str]) -> str:
        keywords = [f"{k}={k}" for k in self.keywords()]
        return f"{self.function}({', '.join(arguments + keywords)})"

    def _dim(self) -> int:
        exit = self.rows.exit
        return exit.dims.index(self.rows.row) - len(exit.dims)

    def _slice(self, var: Var, pieces: dict[Index, str]) -> str:
        """The input cut to `pieces` along its row and key axes: counted from the end when
        batched (after `...`), else from the start."""
        name = self.names.var(var)
        found = [(self.rows.sliced, self.rows.row)]
        found += [(self.spans.hidden.keyed, self.spans.hidden.key)] if self.spans else []
        cuts = {table[var][0]: pieces[index] for table, index in found if var in table}
        if not cuts:
            return name
        _, axes, batched = next(table[var] for table, _ in found if var in table)
        kept = range(min(cuts), axes) if batched else range(max(cuts) + 1)
        items = (["..."] if batched else []) + [cuts.get(k, ":") for k in kept]
        return f"{name}[{', '.join(items)}]"

    def _batch(self) -> str | None:
        """The number of batch elements, read from the first batched input."""
        first = next((t for t in self.spec.arguments if t.batched), None)
        if first is None:
            return None
        return f"{first.ascii}.shape[:-{len(first.layout)}].numel()"
