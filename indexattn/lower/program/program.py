"""The program: what the planner makes and every pass takes and returns, frozen and printable.
Blocks of steps (one per equation, or per kernel's equations), the results, and the regions
passes mark: the steps built once per shape (`constant`), the steps computed by blocks of
rows (`rows`), the mask's spans those blocks skip keys by (`spans`), the locals dropped after
each block (`Block.drop`), the constants over two sequence indices made per block from
positions (`tables`). Regions name steps by the value they make, never by position, and
every value a pass makes comes from the one allocator, `Program.fresh`."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ... import ir
from ...ir import Index, Spec
from ...ir.shapes import Recipe
from .kinds import made, reads, tensors
from .steps import Operand, Spans, Step, Var


@dataclass(frozen=True)
class Block:
    """The steps of one equation (or of several that one kernel computes), headed by them;
    a block of no equation (the outputs put in their declared layouts) has a note instead.
    `drop`: the locals the spec's function lets go of after the block."""

    equations: tuple[ir.Equation, ...]
    steps: tuple[Step, ...]
    note: str = ""
    drop: tuple[Var, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(eq.text for eq in self.equations) or (self.note,)


@dataclass(frozen=True)
class Rows:
    """The steps computed per block of `row` positions, and what they read and give back."""

    row: Index
    steps: frozenset[Var]  # the steps computed by rows, by the value each makes
    last: int  # the block after whose steps the rows are computed
    inputs: tuple[Var, ...]  # read from outside, in order of first use
    sliced: dict[Var, tuple[int, int, bool]]  # inputs with row axes: (axis, of axes, batched)
    exits: tuple[Operand, ...]  # the values read after the rows, in the order they are made
    scores: Operand  # the widest value: its axes but `row` count the elements of one row
    summed: frozenset[Var] = frozenset()  # exits that sum over `row`: the blocks' sum
    drop: tuple[tuple[Var, ...], ...] = ()  # per block: the rows' locals it reads last


@dataclass(frozen=True)
class Hidden:
    """The rows' key index, the mask that hides keys from rows, and which of its entries
    hide: "-inf" (a float mask), "true" or "false" (a boolean one, as `where` reads it),
    "0" (a float mask that multiplies).
    `keyed`: the rows' inputs with the key axis, each as (its place, its axes, batched)."""

    key: Index
    mask: Operand
    hides: str
    keyed: dict[Var, tuple[int, int, bool]]


@dataclass(frozen=True)
class KeySpans:
    """How the rows skip keys: the mask that hides them, and the step (one of the constants)
    that reads the blocks of rows and keys off it."""

    hidden: Hidden
    step: Spans


@dataclass(frozen=True)
class Program:
    """`plan(spec)` makes one; each pass of `lower.program.passes.PASSES` returns another."""

    spec: Spec
    sizes: Recipe
    blocks: tuple[Block, ...]
    results: tuple[Operand, ...]  # the outputs, in their declared layouts
    next_id: int  # the allocator: the id of the next fresh value
    constant: frozenset[Var] = frozenset()  # steps built once per shape, by what they make
    held: tuple[Var, ...] = ()  # the constants the spec's function reads, in order
    rows: Rows | None = None
    spans: KeySpans | None = None
    tables: frozenset[Var] = frozenset()  # constants over two sequence indices: by blocks

    def fresh(self, hint: str) -> tuple[Program, Var]:
        """A value no step of the program makes yet, and the program that has allocated it."""
        return replace(self, next_id=self.next_id + 1), Var(self.next_id, hint)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for block in self.blocks for s in block.steps)

    def region(self, step: Step) -> str:
        """Where the printed module computes the step: "constant", "table" (from positions,
        per block of rows, passes/tables.py), "rows" or "call"."""
        if step.out.var in self.tables:
            return "table"
        if step.out.var in self.constant:
            return "constant"
        if self.rows is not None and step.out.var in self.rows.steps:
            return "rows"
        return "call"

    def per_call(self, block: Block) -> tuple[Step, ...]:
        """The block's steps the spec's function computes (itself or by rows)."""
        return tuple(s for s in block.steps if s.out.var not in self.constant)

    def with_steps(self, steps: dict[Var, Step | None]) -> Program:
        """The program with the steps that make the given values replaced (None: removed)."""
        changed = set(steps)
        blocks = tuple(
            replace(b, steps=tuple(_swap(b.steps, steps))) if changed & _outs(b) else b
            for b in self.blocks
        )
        return replace(self, blocks=blocks)

    def __str__(self) -> str:
        out = [f"program {self.spec.name}", str(self.sizes)]
        for block in self.blocks:
            out.extend(f"# {text}" for text in block.texts)
            out.extend(f"  {self.line(s)}" for s in block.steps)
            if block.drop:
                out.append(f"  del {', '.join(map(str, block.drop))}")
        if self.rows is not None:
            inside = ", ".join(str(v) for v in sorted(self.rows.steps, key=lambda v: v.id))
            out.append(f"rows over {self.rows.row.glyph} after block {self.rows.last}: {inside}")
        if self.spans is not None:
            hidden = self.spans.hidden
            out.append(f"keys {hidden.key.glyph} skipped where {hidden.mask.var} is {hidden.hides}")
        if self.tables:
            by_blocks = ", ".join(str(v) for v in sorted(self.tables, key=lambda v: v.id))
            out.append(f"tables by blocks of rows, from positions: {by_blocks}")
        dims = {o.var: o.dims for s in self.steps for o in made(s)}
        sequence = ir.sequence_indices(self.spec)
        out.append("held: " + ", ".join(_held(v, dims[v], sequence) for v in self.held))
        out.append("results: " + ", ".join(str(r.var) for r in self.results))
        return "\n".join(out)

    def line(self, step: Step) -> str:
        """`[constant] Contract S#4 (μ, τ, τ') <- Q#2, K#3`, `in place` where it writes over
        what it reads."""
        region = self.region(step)
        into = getattr(step, "into", False)
        into = " in place" if into is not None and into is not False else ""
        outs = ", ".join(f"{o.var} {_dims(o.dims)}" for o in made(step))
        read = ", ".join(dict.fromkeys(map(str, [*(o.var for o in reads(step)), *tensors(step)])))
        where = "" if region == "call" else f"[{region}] "
        return f"{where}{type(step).__name__}{into}: {outs}" + (f" <- {read}" if read else "")

    def check(self) -> None:
        """Raises AssertionError where the program is malformed: a value made twice, a read
        of a value nothing makes, a region naming a step that is not there, an allocator
        behind the ids in use (torch inductor's `graph.lint()` between passes)."""
        made_by: set[Var] = set()
        for step in self.steps:
            for out in made(step):
                assert out.var not in made_by, f"{out.var} is made twice"
                made_by.add(out.var)
        for step in self.steps:
            for op in reads(step):
                assert op.var.argument or op.var in made_by, f"{op.var} is read, never made"
        outs = {s.out.var for s in self.steps}
        assert self.constant <= outs, f"constant steps missing: {set(self.constant) - outs}"
        assert self.tables <= outs, "a table made by blocks is made by no step"
        assert self.rows is None or self.rows.steps <= outs, "a step of the rows is missing"
        assert set(self.held) <= made_by, "a held value is made by no step"
        assert all(v.id < self.next_id for v in made_by), "fresh values behind the allocator"


def _outs(block: Block) -> set[Var]:
    return {s.out.var for s in block.steps}


def _swap(steps: tuple[Step, ...], new: dict[Var, Step | None]):
    for step in steps:
        if step.out.var not in new:
            yield step
        elif new[step.out.var] is not None:
            yield new[step.out.var]


def _held(var: Var, dims: tuple[Index, ...], sequence: set[Index]) -> str:
    """A value kept per shape and its axes, `N²` where it runs over two sequence indices
    (a table some step reads whole: passes/tables.py makes the others by blocks)."""
    wide = len(sequence & set(dims)) >= 2
    return f"{var} {_dims(dims)}" + (" N², read whole" if wide else "")


def _dims(dims: tuple[Index, ...]) -> str:
    return "(" + ", ".join(i.glyph for i in dims) + ")"
