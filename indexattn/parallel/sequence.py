"""IR -> a sequence plan: how a spec's sequence index couples positions, read off the notation.

Splitting one sequence over w ranks cuts every reduction that runs along it. Each one either
merges (softmax and logsumexp by their log-sum-exp, sum and mean by plain sums, max and min by
max and min, a cumsum by an exclusive scan of the state carried into each rank's block), or
cannot be split (a concat along the sequence, a row read at a shifted or literal position),
and then the plan names it. Positions read as numbers (a causal mask, rotary angles, ALiBi's
distance, T5's buckets) must be the global positions, and the plan lists where they are read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import sympy

from .. import ir
from ..errors import SpecError
from ..ir.boxes import holds_on_box
from ..ops import COMPARISONS, EXTREMUM, LSE, PREFIX, REDUCTIONS, SUM, lookup
from .shard import find_index, shard_plan

MERGES = {name: op.merge for name, op in REDUCTIONS.items() if op.merge}  # ops.py says each
WHY = {
    LSE: "each rank's row maximum and sum of exponentials, merged by log-sum-exp",
    SUM: "each rank's partial sum, added",
    EXTREMUM: "each rank's partial extremum, compared",
    PREFIX: "an exclusive scan across ranks: the state of the blocks before is carried in",
}


@dataclass(frozen=True)
class Layout:
    """Which positions each of w ranks holds: `contiguous`, one block (rank r has positions
    r N/w … (r + 1) N/w - 1), or `zigzag`, chunks r and 2w - 1 - r of 2w (a causal mask's
    work balanced). A value: `sequence_block` tags the blocks it cuts with theirs, and a
    split layer refuses a block of another layout by name. CONTIGUOUS is the default
    everywhere (context_parallel, sequence_block, context_parallel_model)."""

    name: str  # "contiguous" or "zigzag"

    def __str__(self) -> str:
        return "zig-zag" if self.name == "zigzag" else self.name

    @property
    def parts(self) -> int:
        return 2 if self.name == "zigzag" else 1

    def spans(self, length: int, world: int, dim: int = 1) -> list[list[tuple[int, int]]]:
        """Each rank's chunks of positions, [start, stop); ValueError when they do not divide."""
        parts = self.parts * world
        if length % parts:
            each = "2 per rank, zig-zag" if self.parts == 2 else "one per rank"
            how = f"{parts} equal chunks ({each})"
            raise ValueError(
                f"a sequence of {length} positions (dim {dim}) does not split into {how}: "
                f"pad it to a multiple of {parts}"
            )
        c = length // parts
        if self.parts == 1:
            return [[(r * c, (r + 1) * c)] for r in range(world)]
        return [
            [(r * c, (r + 1) * c), ((parts - 1 - r) * c, (parts - r) * c)] for r in range(world)
        ]

    def held(self, length: int, world: int) -> list[int]:
        """The positions of every rank's block, rank after rank: what joining the blocks in
        rank order (an all-gather, an all-to-all) holds."""
        return [p for spans in self.spans(length, world) for a, b in spans for p in range(a, b)]


CONTIGUOUS, ZIGZAG = Layout("contiguous"), Layout("zigzag")


@dataclass(frozen=True)
class Cut:
    """Which block of a sequence a tensor is: the one `sequence_block` cut in `layout` for
    rank `rank` of `world` (the ranks of the mesh it was given). A split layer refuses a block
    of another layout, or of another rank or mesh size than its own, by name."""

    layout: Layout
    rank: int
    world: int


LAYOUTS = {"contiguous": CONTIGUOUS, "zigzag": ZIGZAG, "zig-zag": ZIGZAG}


def layout_of(layout: Layout | str | None = None, zigzag: bool | None = None) -> Layout:
    """The layout named by `layout` (a Layout or its name) or by the older `zigzag=` flag;
    CONTIGUOUS when neither is given. ValueError for another name, or for both disagreeing."""
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout is 'contiguous' or 'zigzag', not {layout!r}")
        layout = LAYOUTS[layout]
    flag = None if zigzag is None else (ZIGZAG if zigzag else CONTIGUOUS)
    if layout is not None and flag is not None and layout != flag:
        raise ValueError(f"layout={layout.name!r} and zigzag={zigzag} disagree: pass one")
    return layout or flag or CONTIGUOUS


@dataclass(frozen=True)
class Merge:
    """One reduction along a sequence index and how its parts merge across ranks."""

    equation: str
    reduction: str  # as read: softmax_<τ'>, sum over τ'
    merge: str  # LSE, SUM, EXTREMUM or PREFIX


@dataclass(frozen=True)
class Position:
    """An equation that reads sequence positions (or the sequence length) as numbers: they
    must be the global ones on every rank."""

    equation: str
    reads: tuple[str, ...]


@dataclass(frozen=True)
class SequencePlan:
    """How a spec's sequence splits over ranks; `print(plan)` shows it.

    >>> import indexattn
    >>> plan = indexattn.compile_spec("specs/mha.attn").sequence_plan("τ")
    >>> plan.splittable, [m.merge for m in plan.merges]
    (True, ['log-sum-exp', 'sum'])
    """

    spec: str
    over: str  # the query index's glyph
    indices: tuple[str, ...]  # every sequence index: the query index and the key indices
    sizes: tuple[str, ...]  # their ranges' ASCII names
    merges: tuple[Merge, ...]
    positions: tuple[Position, ...]
    split: tuple[tuple[str, int], ...]  # each input (as written) and the axis it splits on
    blockers: tuple[str, ...]
    heads: str | None  # the head index Ulysses splits over, when the head plan allows one
    head_blockers: tuple[str, ...]  # why no head index serves, when none does

    @property
    def splittable(self) -> bool:
        return not self.blockers

    @property
    def ulysses(self) -> bool:
        """Whether the all-to-all strategy applies: it needs a head index to shard over."""
        return self.heads is not None and bool(self.split)

    def verdict(self) -> str:
        lines = []
        if self.blockers:
            lines.append(
                f"{self.spec}: its sequence cannot be split into blocks over ranks:\n"
                + "\n".join(f"  - {b}" for b in self.blockers)
            )
        else:
            lines.append(
                f"{self.spec}: its sequence {', '.join(self.indices)} splits into blocks; "
                "every reduction along it merges as listed."
            )
        if self.ulysses:
            lines.append(
                f"Ulysses: all-to-all from sequence blocks to head blocks over {self.heads}, "
                "each rank runs the whole sequence for its heads."
            )
        else:
            why = "; ".join(self.head_blockers) or "no input is split along the sequence"
            lines.append(f"Ulysses: no head index to trade the sequence for ({why}).")
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [
            f"Sequence plan of {self.spec} over {', '.join(self.indices)} "
            f"({', '.join(self.sizes)} positions, blocks of {'/w, '.join(self.sizes)}/w per rank)"
        ]
        lines += [f"  split  {t} along axis {a}" for t, a in self.split]
        width = max([len(m.equation) for m in self.merges] + [0])
        for m in self.merges:
            lines.append(f"  merge  {m.equation.ljust(width)}  {m.reduction}: {WHY[m.merge]}")
        for p in self.positions:
            lines.append(f"  global {p.equation}  reads {', '.join(p.reads)}")
        return "\n".join([*lines, self.verdict()])


def sequence_plan(
    spec: ir.Spec, over: str = "τ", keys: tuple[str, ...] = (), heads: str | None = None
) -> SequencePlan:
    """The plan of `spec` along the query index named `over`. Its key indices are the indices
    of the same range, those a softmax runs over, and any named in `keys` (a context σ).
    `heads` names the index Ulysses trades the sequence for; by default the first index that
    leads a fused param axis, or else is on a split input, and that the head plan shards."""
    query = find_index(spec, over)
    sequence = _sequence(spec, query, [find_index(spec, k) for k in keys])
    named = find_index(spec, heads) if heads is not None else None
    return _Reader(spec, query, sequence).plan(named)


def _sequence(spec: ir.Spec, query: ir.Index, named: list[ir.Index]) -> tuple[ir.Index, ...]:
    found = {query, *named}
    found |= {i for i in spec.indices if i.size == query.size}
    for eq in spec.equations:
        if query not in eq.tensor.indices:
            continue
        for node in ir.walk(eq.rhs):
            if isinstance(node, ir.Reduce) and node.fn in ("softmax", "logsumexp"):
                found |= set(node.over)
    if not isinstance(query.size, sympy.Symbol):
        raise SpecError(
            f"{spec.name}: the range of {query.glyph} is {query.size}, not a size symbol",
            hint=f"declare `index {query.glyph} : N` to split it over ranks",
        )
    return tuple(i for i in spec.indices if i in found)


class _Reader:
    def __init__(self, spec: ir.Spec, query: ir.Index, sequence: tuple[ir.Index, ...]) -> None:
        self.spec, self.query, self.sequence = spec, query, sequence
        self.seq = set(sequence)
        self.symbols = {i.symbol: i.glyph for i in sequence}
        self.symbols.update({i.size: str(i.size) for i in sequence})
        self.blockers: list[str] = []
        self.merges: list[Merge] = []
        self.positions: list[Position] = []

    def block(self, message: str) -> None:
        if message not in self.blockers:
            self.blockers.append(message)

    def plan(self, named: ir.Index | None) -> SequencePlan:
        split = tuple(self.argument(t) for t in self.spec.tensors_of("input"))
        for eq in self.spec.equations:
            self.equation(eq)
        heads, head_blockers = self.heads(named)
        sizes = tuple(dict.fromkeys(self.size_name(i.size) for i in self.sequence))
        return SequencePlan(
            self.spec.name,
            self.query.glyph,
            tuple(i.glyph for i in self.sequence),
            sizes,
            tuple(self.merges),
            tuple(self.positions),
            tuple(s for s in split if s is not None),
            tuple(self.blockers),
            heads,
            head_blockers,
        )

    def size_name(self, size: sympy.Expr) -> str:
        return self.spec.size_ascii(size) if size in self.spec.sizes else str(size)

    def argument(self, t: ir.Tensor) -> tuple[str, int] | None:
        axes = [k for k, group in enumerate(t.layout) if self.seq & set(group)]
        if not axes:
            return None
        for k in axes:
            if len(t.layout[k]) > 1:
                self.block(
                    f"{t!r}: the sequence shares its fused axis {k} with other indices: "
                    "pass it unfused"
                )
        return repr(t), axes[0]

    def equation(self, eq: ir.Equation) -> None:
        reads: dict[str, None] = {}
        for node in ir.walk(eq.rhs):
            if isinstance(node, ir.Field):
                reads.update(dict.fromkeys(self._numbers(node.expr)))
            elif isinstance(node, ir.Reduce):
                self.reduce(eq, node)
            elif isinstance(node, ir.Product):
                along = [i for i in node.summed if i in self.seq]
                if along:
                    self.merge(eq, f"sum over {''.join(i.glyph for i in along)}", SUM)
            elif isinstance(node, ir.Concat) and node.over in self.seq:
                self.block(f"{eq.text}: concat along {node.over.glyph}, the sequence")
            elif isinstance(node, ir.Ref):
                self.ref(eq, node)
        if reads:
            self.positions.append(Position(eq.text, tuple(reads)))

    def _numbers(self, expr: sympy.Basic) -> list[str]:
        return [self.symbols[s] for s in sorted(expr.free_symbols, key=str) if s in self.symbols]

    def reduce(self, eq: ir.Equation, node: ir.Reduce) -> None:
        along = [i for i in node.over if i in self.seq]
        if not along:
            return
        written = f"{node.fn}_<{''.join(i.glyph for i in node.over)}>"
        if node.fn not in MERGES:
            self.block(f"{eq.text}: {written} along the sequence has no merge across ranks")
            return
        self.merge(eq, written, MERGES[node.fn])

    def merge(self, eq: ir.Equation, written: str, kind: str) -> None:
        found = Merge(eq.text, written, kind)
        if found not in self.merges:
            self.merges.append(found)

    def ref(self, eq: ir.Equation, node: ir.Ref) -> None:
        """A sequence axis must be read at a sequence index: a literal or a computed position
        there reads a row another rank may hold."""
        for group, items in zip(node.tensor.layout, node.axes):
            for index, item in zip(group, items):
                if index not in self.seq or (isinstance(item, ir.Index) and item in self.seq):
                    continue
                what = item if isinstance(item, int) else "a computed position"
                self.block(
                    f"{eq.text}: {node.tensor.name} is read at {what} along {index.glyph}, "
                    "a row another rank may hold"
                )

    def heads(self, named: ir.Index | None) -> tuple[str | None, tuple[str, ...]]:
        """The index the head plan shards over: `named`, or the first candidate that shards."""
        spec = self.spec
        fused = [  # indices of fused param axes, those leading one first
            index
            for k in (0, 1)
            for t in spec.tensors_of("param", "buffer")
            for axis in t.layout
            if len(axis) > 1
            for index in (axis[:1] if k == 0 else axis[1:])
            if index not in self.seq and isinstance(index.size, sympy.Symbol)
        ]
        on_inputs = [
            i
            for t in spec.tensors_of("input")
            if self.seq & set(t.indices)
            for i in t.indices
            if i not in self.seq
        ]
        candidates = [named] if named else list(dict.fromkeys(fused or on_inputs))
        for index in candidates:
            if shard_plan(spec, index.glyph).shardable:
                return index.glyph, ()
        if not candidates:
            return None, ("no param has a fused head axis, no split input another index",)
        first = shard_plan(spec, candidates[0].glyph)  # why the likeliest head does not serve
        return None, first.blockers or (first.verdict().splitlines()[0],)


# -- communication, counted like FLOPs: elements sent per rank, per batch element

RANKS = sympy.Symbol("w", positive=True, integer=True)  # the ranks the sequence splits over


# -- the block map: which tile pairs a mask hides, and each rank's work


@dataclass(frozen=True)
class Tile:
    """Rows offset … offset + length - 1 of a rank's block: global positions start …"""

    offset: int
    start: int
    length: int

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.length, dtype=np.float64)


def tiles(spans: list[tuple[int, int]], size: int) -> list[Tile]:
    found, offset = [], 0
    for start, stop in spans:
        for first in range(start, stop, size):
            length = min(size, stop - first)
            found.append(Tile(offset, first, length))
            offset += length
    return found


PIECES = 8  # a kept pass sends another rank's blocks in about this many pieces


def cuts(pairs: list[tuple[Tile, Tile]], length: int) -> list[tuple[int, int]]:
    """A block of `length` keys cut into runs [a, b) of about length / PIECES keys or more,
    each cut at a key tile's end or a multiple of length / PIECES where no pair's keys
    straddle it: every key tile or span lies in one run, keys no pair reads in runs of
    their own."""
    spans = [(k.offset, k.offset + k.length) for _, k in pairs]
    least = max(1, -(-length // PIECES))
    found, a = [], 0
    for c in sorted({end for span in spans for end in span} | set(range(least, length, least))):
        if least <= c - a and c < length and not any(o < c < e for o, e in spans):
            found.append((a, c))
            a = c
    return [*found, (a, length)]


def read_runs(pairs: list[tuple[Tile, Tile]], length: int) -> list[tuple[int, int]]:
    """`cuts`' runs that some tile pair reads: keys that no pair reads (those a window leaves
    out) are not sent."""
    starts = [k.offset for _, k in pairs]
    return [(a, b) for a, b in cuts(pairs, length) if any(a <= o < b for o in starts)]


@dataclass(frozen=True)
class _Ids:
    """The integer inputs a mask's condition compares: by the symbol of each read, the
    tensor's name and the sequence index it is read at."""

    sequence: frozenset
    found: dict


def _seed(node: ir.Node, ids: _Ids) -> tuple[float, sympy.Basic] | None:
    """A pair tensor written as a mask: its hidden value (-inf or 0) and a condition on the
    positions (and on the integer inputs it compares, entered in `ids`) under which it holds
    (sufficient, not necessary)."""
    if isinstance(node, ir.Field) and isinstance(node.expr, sympy.Piecewise):
        value, cond = node.expr.args[0]
        if value in (-sympy.oo, 0):
            return float(value), cond
    if isinstance(node, ir.Apply) and node.fn == "where":
        cond, yes, no = node.args
        for branch, holds in ((yes, _implied(cond, ids)), (no, None)):
            if isinstance(branch, ir.Field) and branch.expr in (-sympy.oo, 0):
                if holds is None and branch is no and isinstance(cond, ir.Field):
                    holds = sympy.Not(cond.expr)
                if holds is not None:
                    return float(branch.expr), holds
    return None


def _implied(cond: ir.Node, ids: _Ids, whole: bool = False) -> sympy.Basic | None:
    """A part of a condition that implies it, on positions and on comparisons of integer
    inputs read at a sequence index (`D_<τ> != D_<τ'>`: a symbol per read, entered in `ids`,
    bounded by tiles at run time): `or` keeps the parts it can name, `and` needs all; where
    `whole`, the condition itself, every part named (else None)."""
    if isinstance(cond, ir.Field):
        return cond.expr
    if not isinstance(cond, ir.Apply):
        return None
    parts = [_implied(c, ids, whole) for c in cond.args]
    if cond.fn == "or":
        named = [p for p in parts if p is not None]
        return None if not named or (whole and len(named) < len(parts)) else sympy.Or(*named)
    if cond.fn == "and":
        return None if None in parts else sympy.And(*parts)
    if cond.fn in COMPARISONS:
        terms = [_term(c, ids) for c in cond.args]
        return None if None in terms else lookup(cond.fn).sympy(*terms)
    return None


def hidden_where(node: ir.Node, sequence: frozenset, found: dict) -> sympy.Basic | None:
    """Where a mask of −∞ and 0 is −∞, exactly, as a predicate on positions and on the integer
    inputs its condition compares (a symbol per read, entered in `found`: the tensor's name
    and the sequence index it is read at); None where it is not such a mask, or a part of its
    condition cannot be named."""
    ids = _Ids(sequence, found)
    if isinstance(node, ir.Field):
        pieces = node.expr.args if isinstance(node.expr, sympy.Piecewise) else ()
        if len(pieces) == 2 and pieces[0][0] == -sympy.oo and pieces[1] == (0, True):
            return pieces[0][1]
        return sympy.false if node.expr == 0 else None
    if not (isinstance(node, ir.Apply) and node.fn == "where"):
        return None
    cond, yes, no = node.args
    values = tuple(b.expr if isinstance(b, ir.Field) else None for b in (yes, no))
    if values not in ((-sympy.oo, 0), (0, -sympy.oo)):
        return None
    holds = _implied(cond, ids, whole=True)
    return None if holds is None else holds if values[0] == -sympy.oo else sympy.Not(holds)


def _term(node: ir.Node, ids: _Ids) -> sympy.Expr | None:
    """A compared value: a field's expression, or an integer input along one sequence index
    read there (a symbol standing for its value there, entered in `ids`)."""
    if isinstance(node, ir.Field):
        return node.expr
    if isinstance(node, ir.Ref) and node.tensor.role == "input" and node.tensor.dtype == "int":
        (item,) = node.written if len(node.written) == 1 else (None,)
        if isinstance(item, ir.Index) and item in ids.sequence:
            symbol = sympy.Symbol(f"{node.tensor.name}_<{item.glyph}>", integer=True)
            ids.found[symbol] = (node.tensor.name, item)
            return symbol
    return None


INF = float("inf")
LEAK = "leak"  # a hidden value reaches something it does not vanish in: no tile is skipped


class _Hiding:
    """Which reductions over a key index vanish where: each one's conditions."""

    def __init__(self, spec: ir.Spec, query: ir.Index, keys: set[ir.Index]) -> None:
        self.query, self.keys = query, keys
        self.ids = _Ids(frozenset({query, *keys}), {})
        self.hidden: dict[str, tuple[float, frozenset]] = {}
        self.sites: list[frozenset] = []  # per reduction over a key: the conditions it vanishes
        self.leak = False
        for eq in spec.equations:
            state = self.state(eq.rhs)
            if isinstance(state, tuple):
                if pair(eq.indices, query, keys):
                    self.hidden[eq.tensor.name] = state
                else:
                    self.leak = True
            elif state == LEAK:
                self.leak = True

    def state(self, node: ir.Node):
        """None (clean or absorbed), LEAK, or (value, conditions): hidden there."""
        seed = _seed(node, self.ids) if pair(node.free, self.query, self.keys) else None
        if seed is not None:
            return seed[0], frozenset([seed[1]])
        if isinstance(node, ir.Ref):
            if any(isinstance(a, ir.At) for a in node.written):
                return None
            return self.hidden.get(node.tensor.name)
        states = [self.state(c) for c in ir.children(node)]
        if LEAK in states:
            return LEAK
        held = [s for s in states if isinstance(s, tuple)]
        over = node.over if isinstance(node, ir.Reduce) else getattr(node, "summed", ())
        over = set(over) & self.keys  # a concat's `over` joins, it does not reduce
        if over and self.query in body_free(node):
            return self.site(node, held)
        if not held:
            return None
        values = {v for v, _ in held}
        conds = frozenset().union(*(c for _, c in held))
        if isinstance(node, ir.Sum) and values == {-INF}:
            return -INF, conds
        if isinstance(node, ir.Product) and values == {0.0}:
            return 0.0, conds
        if isinstance(node, ir.Apply) and node.fn == "dropout" and states[0] and values == {0.0}:
            return 0.0, conds
        return LEAK

    def site(self, node: ir.Node, held: list):
        """A reduction over a key: where its contributions vanish (its site's conditions)."""
        values = {v for v, _ in held}
        conds = frozenset().union(*(c for _, c in held)) if held else frozenset()
        if isinstance(node, ir.Reduce) and node.fn == "softmax":
            return (0.0, conds) if values == {-INF} else (LEAK if held else None)
        kills = (
            (isinstance(node, ir.Product) and values == {0.0})
            or (isinstance(node, ir.Reduce) and node.fn == "logsumexp" and values == {-INF})
            or (isinstance(node, ir.Reduce) and node.fn == "sum" and values == {0.0})
        )
        if held and not kills:
            return LEAK
        self.sites.append(conds)
        return None


def _holds(cond: sympy.Basic, box: dict, shape: tuple) -> np.ndarray:
    """Where `cond` holds at every point of each box (False where it cannot tell): `box` maps
    each symbol to the arrays of its first and last values, one entry per box (a tile pair);
    the test on the box's ends (ir/boxes.py) is made once per condition and run on arrays
    (integer inputs' bounds as Python integers: compared exactly, whatever their size)."""
    order = tuple(sorted(box, key=str))
    found = _box_test(cond, order)(*(end for s in order for end in box[s]))
    return np.broadcast_to(np.asarray(found, dtype=bool), shape)


def always(cond: sympy.Basic, box: dict) -> bool:
    """Whether `cond` holds at every point of one box (each symbol's first and last value)."""
    ends = {
        s: (np.array([a], dtype=object), np.array([b], dtype=object)) for s, (a, b) in box.items()
    }
    return bool(_holds(cond, ends, (1,))[0])


@functools.cache
def _box_test(cond: sympy.Basic, order: tuple[sympy.Symbol, ...]):
    ends = {s: (sympy.Dummy(), sympy.Dummy()) for s in order}
    symbols = tuple(e for s in order for e in ends[s])
    return sympy.lambdify(symbols, holds_on_box(cond, ends), modules="numpy")


MIN_TILE = 128  # the blocked kernel's block of queries (runtime/lib.py QUERY_BLOCK)
MAX_TILE = 2048  # a tile pair's working set (its kernel's outputs and gradients, the merge's
# terms) is a few tiles of features: mha's chunk of 16384 at one rank held 12 MB more than
# tiles of 2048, which cost some 3 % more time (more tile pairs)
PAIR_SCORES = 32768  # a tile pair's own cost (its call, checkpoint, merge) in score elements:
# 2.8 ms against 0.084 µs a score, attention_sinks' compiled tile on this CPU (2 heads)


@dataclass(frozen=True)
class Bounds:
    """The least and greatest value of each integer input a mask compares, per `grain`
    positions of the whole sequence (index p // grain), as Python integers: exact."""

    grain: int
    least: dict  # tensor name -> list of ints
    greatest: dict

    def of(self, name: str, tiles: list[Tile]) -> tuple[np.ndarray, np.ndarray]:
        lo, hi, g = self.least[name], self.greatest[name], self.grain
        spans = [(t.start // g, -(-(t.start + t.length) // g)) for t in tiles]
        return (
            np.array([min(lo[a:b]) for a, b in spans], dtype=object),
            np.array([max(hi[a:b]) for a, b in spans], dtype=object),
        )


def exact(value):
    """A scalar as an exact number for the block map's bounds: a float 3.0 read as the rational
    3, so ⌊τ / C⌋ is ⌊τ / 3⌋, not ⌊0.333… τ⌋ (which puts position 3 in chunk 0)."""
    if isinstance(value, float) and math.isinf(value):
        return sympy.oo if value > 0 else -sympy.oo
    return sympy.Rational(value) if isinstance(value, (int, float)) else value


class BlockMap:
    """The block map of one split: each rank's tiles of every sequence index (its chunks in
    `layout`, cut into tiles of `tile` positions, or of the length chosen for the mask), the
    tile pairs a mask hides entirely, which rank's queries read which rank's keys, and each
    rank's work. `sizes` and `scalars` by symbol, as the interpreter holds them; `bounds` the
    integer inputs' (document ids'), read off a call's blocks (`ids`: what it reads), or
    None: positions alone, an upper bound on the work of a mask that reads them."""

    def __init__(
        self, spec, plan, sizes: dict, scalars: dict, world: int, layout, tile, bounds=None
    ) -> None:
        glyphs = {i.glyph: i for i in spec.indices}
        self.query = glyphs[plan.over]
        self.keys = {glyphs[g] for g in plan.indices} - {self.query}
        self.world, self.bounds = world, bounds
        self.blocks = {  # per sequence range: each rank's chunks
            i.size: layout.spans(int(i.size.subs(sizes)), world) for i in {self.query, *self.keys}
        }
        hiding = _Hiding(spec, self.query, self.keys)
        subs = {**sizes, **{k: exact(v) for k, v in scalars.items()}}
        self.sites = (  # per reduction over a key, the conditions under which it reads nothing
            None
            if hiding.leak or not hiding.sites or not all(hiding.sites)
            else [[c.subs(subs) for c in conds] for conds in hiding.sites]
        )
        self.ids = hiding.ids.found if self.sites is not None else {}
        self.given = tile
        self.made: dict[tuple, list[Tile]] = {}  # tiles_of's, and seen's pairs, made once
        self.pairs: dict[tuple[int, int], list[tuple[Tile, Tile]]] = {}
        self.tile = tile or self.choose()
        self.hidden, rows, cols = self.table(self.tile)
        self.row = {t.start: n for n, t in enumerate(rows)}
        self.col = {t.start: n for n, t in enumerate(cols)}
        self.ranks = [self.owners(self.query), self.owners(next(iter(self.keys), self.query))]
        self.need = [[self.needs(q, k) for k in range(world)] for q in range(world)]

    @property
    def chunk(self) -> int:
        return math.gcd(*(b - a for spans in self.blocks.values() for a, b in spans[0]))

    @property
    def grain(self) -> int:
        """The positions each bound of an integer input covers: every tile a multiple."""
        return math.gcd(self.chunk, self.given or MIN_TILE)

    def candidates(self) -> list[int]:
        """Tile lengths to choose from: powers of two from MIN_TILE up to MAX_TILE that divide
        a chunk, and the chunk where it is no longer (or where no power divides it)."""
        chunk, found = self.chunk, []
        size = MIN_TILE
        while size < chunk and size <= MAX_TILE:
            found += [size] if chunk % size == 0 else []
            size *= 2
        return [*found, chunk] if chunk <= MAX_TILE or not found else found

    def choose(self) -> int | None:
        """The tile length: for a mask that chooses (`masked`), the candidate whose scores and
        tile pairs (each PAIR_SCORES) cost least; else the longest candidate; None where
        that is a chunk."""
        sizes = self.candidates()
        if not self.masked():
            return max(sizes) if max(sizes) < self.chunk else None
        cost = {size: self.cost(size) for size in sizes}
        return min(cost, key=lambda size: (cost[size], -size))

    def masked(self) -> bool:
        """Whether the mask chooses the tile: it hides the keys far before a query (a window),
        or its integer inputs' bounds are known (documents)."""
        return self.sites is not None and (self.bounds is not None or self.reach())

    def reach(self) -> bool:
        """Whether the mask hides, by positions alone, the first key from the last query."""
        last = max(b for spans in self.blocks[self.query.size] for _, b in spans) - 1
        return bool(self._hidden([Tile(0, last, 1)], [Tile(0, 0, 1)])[0, 0])

    def cost(self, size: int) -> int:
        hidden, rows, cols = self.table(size)
        scores = np.outer([t.length for t in rows], [t.length for t in cols])
        return int((np.where(hidden, 0, scores + PAIR_SCORES)).sum())

    def table(self, size: int | None):
        """The tile pairs hidden, over every rank's query tiles by every rank's key tiles."""
        rows = [t for r in range(self.world) for t in self.cut(self.query, r, size)]
        key = next(iter(self.keys), self.query)
        cols = [t for r in range(self.world) for t in self.cut(key, r, size)]
        return self._hidden(rows, cols), rows, cols

    def _hidden(self, rows: list[Tile], cols: list[Tile]) -> np.ndarray:
        shape = (len(rows), len(cols))
        if self.sites is None or not rows or not cols:
            return np.zeros(shape, dtype=bool)
        column = {True: (slice(None), None), False: (None, slice(None))}

        def ends(tiles, side):
            first = np.array([t.start for t in tiles])
            return first[column[side]], (first + [t.length - 1 for t in tiles])[column[side]]

        box = {self.query.symbol: ends(rows, True)}
        box.update({key.symbol: ends(cols, False) for key in self.keys})
        for symbol, (name, index) in self.ids.items():
            if self.bounds is not None and name in self.bounds.least:
                side = index == self.query
                lo, hi = self.bounds.of(name, rows if side else cols)
                box[symbol] = (lo[column[side]], hi[column[side]])
        box = {s: tuple(np.broadcast_to(e, shape) for e in ends) for s, ends in box.items()}
        hidden = np.ones(shape, dtype=bool)
        for conds in self.sites:
            hidden &= np.logical_or.reduce([_holds(c, box, shape) for c in conds])
        return hidden

    def cut(self, index: ir.Index, rank: int, size: int | None) -> list[Tile]:
        spans = self.blocks[index.size][rank]
        return tiles(spans, size or spans[0][1] - spans[0][0])

    def tiles_of(self, index: ir.Index, rank: int) -> list[Tile]:
        if (index, rank) not in self.made:
            self.made[index, rank] = self.cut(index, rank, self.tile)
        return self.made[index, rank]

    def seen(self, rank: int, src: int) -> list[tuple[Tile, Tile]]:
        """The pairs of `rank`'s query tiles and `src`'s keys that no mask hides, query tile by
        query tile: each a key tile, or a span of them (`spans`)."""
        if (rank, src) not in self.pairs:
            rows = self.tiles_of(self.query, rank)
            cols = self.tiles_of(next(iter(self.keys), self.query), src)
            hidden = self.hidden[
                np.ix_([self.row[t.start] for t in rows], [self.col[t.start] for t in cols])
            ]
            pairs = [(rows[a], cols[b]) for a, b in zip(*np.nonzero(~hidden))]
            self.pairs[rank, src] = self.spans(rows, src, pairs)
        return self.pairs[rank, src]

    def spans(self, rows: list[Tile], src: int, pairs: list) -> list[tuple[Tile, Tile]]:
        """`pairs` with each query tile's key tiles that follow one another, in the block and
        in position, SPAN at most, cut to the keys its queries can see (by the mask's box
        test on units of a quarter tile) where that leaves some out: one tile pair of fewer
        keys where there were several (a window's diagonal tile and the one before it); a
        single key tile is cut alike. Where nothing is left out, the tiles stay apart (a
        causal diagonal tile keeps the kernel's causal flag)."""
        unit = self.unit
        if unit is None:
            return pairs
        units = self.cut(next(iter(self.keys), self.query), src, unit)
        at = {t.start: n for n, t in enumerate(units)}
        hidden = self._hidden(rows, units)
        row = {t.start: n for n, t in enumerate(rows)}
        found = []
        for q, run in _runs(pairs, (self.tile or self.chunk) * SPAN):
            first, last = at[run[0].start], at[run[-1].start] + -(-run[-1].length // unit)
            seen = np.nonzero(~hidden[row[q.start], first:last])[0]
            if not seen.size:  # hidden unit by unit, though not as a whole box
                continue
            a, b = units[first + seen[0]], units[first + seen[-1]]
            cut = Tile(a.offset, a.start, b.start + b.length - a.start)
            whole = sum(k.length for k in run)
            found += [(q, cut)] if cut.length < whole or len(run) == 1 else [(q, k) for k in run]
        return found

    @property
    def unit(self) -> int | None:
        """The keys a span is cut by: a quarter tile (a divisor of it), None where that is
        finer than 1/64 of the tile (a tile of a prime length), or there is no mask."""
        if self.sites is None or not self.keys:
            return None
        tile = self.tile or self.chunk
        unit = math.gcd(tile, max(1, tile // 4))
        return unit if unit * 64 >= tile else None

    def owners(self, index: ir.Index) -> np.ndarray:
        """The rank of each of the table's tiles along `index`."""
        return np.array([r for r in range(self.world) for _ in self.tiles_of(index, r)])

    def hides(self, q: Tile, k: Tile) -> bool:
        return bool(self.hidden[self.row[q.start], self.col[k.start]])

    def needs(self, q: int, k: int) -> bool:
        """Whether rank q's queries read anything of rank k's keys."""
        rows, cols = self.ranks
        return bool(self.keys) and bool((~self.hidden)[rows == q][:, cols == k].any())

    def sent(self, rank: int, runs: bool) -> int:
        """Key positions `rank` sends in one pass over the keys: to each rank whose queries
        read its keys, the runs they read (`read_runs`, where `runs`: a kept pass) or its
        whole block."""
        return sum(self._travel(dst, rank, runs) for dst in range(self.world) if dst != rank)

    def received(self, rank: int, runs: bool) -> int:
        """Key positions `rank` receives in one pass over the keys, as `sent` sends them."""
        return sum(self._travel(rank, src, runs) for src in range(self.world) if src != rank)

    def _travel(self, rank: int, src: int, runs: bool) -> int:
        """Key positions of `src`'s block that travel to `rank` in one pass."""
        if not self.need[rank][src]:
            return 0
        key = next(iter(self.keys), self.query)
        length = sum(b - a for a, b in self.blocks[key.size][src])
        if not runs:
            return length
        return sum(b - a for a, b in read_runs(self.seen(rank, src), length))

    def work(self, rank: int) -> int:
        """Score elements (tile pairs' query × key positions) that `rank` computes in one pass
        over every rank's keys: the pairs no mask hides, spans cut as `seen` cuts them."""
        if not self.keys:
            return 0
        pairs = (p for src in range(self.world) for p in self.seen(rank, src))
        return sum(q.length * k.length for q, k in pairs)


SPAN = 2  # key tiles a tile pair's span joins at most (BlockMap.spans)


def _runs(pairs: list, longest: int):
    """(query tile, its key tiles that follow one another in the block and in position,
    `longest` positions at most) for `pairs`, query tile by query tile."""
    runs: list = []
    for q, k in pairs:
        last = runs[-1][1][-1] if runs and runs[-1][0] == q else None
        if (
            last is not None
            and (k.offset, k.start) == (last.offset + last.length, last.start + last.length)
            and sum(t.length for t in runs[-1][1]) + k.length <= longest
        ):
            runs[-1][1].append(k)
        else:
            runs.append((q, [k]))
    return runs


def ring_work(spec: ir.Spec, plan: SequencePlan, sizes: dict, world: int, layout, tile=None):
    """Score elements each rank computes in one call of the ring (the tile pairs no mask hides,
    in every pass over the keys: a sink's statistics take a pass of their own; the backward
    recomputes them once more), at `sizes` (ASCII name -> value, scalars included): equal on
    every rank when the layout balances the mask. Tiles of `tile` positions, or those the
    block map chooses by positions alone; a mask that compares integer inputs (document ids)
    is counted by positions alone, an upper bound (a call's own is its `last_ring["work"]`)."""
    values = {s: sizes[a] for s, a in spec.size_names.items() if a in sizes}
    scalars = {s.symbol: float(sizes.get(s.ascii, s.value)) for s in spec.scalars}
    found = BlockMap(spec, plan, values, scalars, world, layout, tile)
    passes = sum(map(len, ring_passes(spec, plan).values()))
    return [passes * found.work(r) for r in range(world)]


# -- what is sent


@dataclass(frozen=True)
class Sent:
    """One collective of a Ulysses step and the elements each rank sends in it: a ring
    all-gather or reduce-scatter sends (w-1)/w of the whole, an all-to-all (w-1)/w of the
    rank's own part, an all-reduce twice (w-1)/w of the whole."""

    tensor: str  # as written
    collective: str  # all-to-all, all-gather, reduce-scatter, all-reduce
    phase: str  # forward, backward, gradient (a parameter's, once per step)
    elements: sympy.Expr  # in the spec's size symbols and w

    def at(self, sizes: dict[sympy.Symbol, int], ranks: int) -> int:
        value = sympy.expand(self.elements.subs({**sizes, RANKS: ranks}))
        return int(value) if value.is_Integer else value


SHARE = {
    "all-to-all": (RANKS - 1) / RANKS**2,  # of the whole: the own part is 1/w of it
    "all-gather": (RANKS - 1) / RANKS,
    "reduce-scatter": (RANKS - 1) / RANKS,
    "all-reduce": 2 * (RANKS - 1) / RANKS,
}
_BACKWARD = {"all-to-all": "all-to-all", "all-gather": "reduce-scatter"}
_BACKWARD["reduce-scatter"] = "all-gather"


def ulysses_sent(spec: ir.Spec, plan: SequencePlan) -> tuple[Sent, ...]:
    """What `indexattn.distributed.context_parallel` sends per rank in one training step
    (forward, backward, and the parameters' gradients made whole)."""
    if not plan.ulysses:
        raise SpecError(plan.verdict())
    rows = {r.ascii: r for r in shard_plan(spec, plan.heads).rows}
    seq = set(plan.indices)
    found: list[Sent] = []

    def add(t: ir.Tensor, collective: str, phase: str) -> None:
        whole = sympy.Mul(*t.shape)
        found.append(Sent(repr(t), collective, phase, sympy.factor(whole * SHARE[collective])))

    def both(t: ir.Tensor, collective: str, grad: bool) -> None:
        add(t, collective, "forward")
        if grad and collective in _BACKWARD:
            add(t, _BACKWARD[collective], "backward")

    for t in spec.tensors_of("input"):
        row, grad = rows[t.ascii], t.dtype != "int"
        if seq & {i.glyph for i in t.indices}:
            both(t, "all-to-all" if row.placement == "split" else "all-gather", grad)
        elif grad and row.placement == "split":  # passed whole, used by heads
            add(t, "all-gather", "backward")
        elif grad and (row.shared or row.placement == "added once"):  # passed whole
            add(t, "all-reduce", "backward")
    for t in spec.outputs:
        row = rows[t.ascii]
        along = bool(seq & {i.glyph for i in t.indices})
        if row.placement == "partial":
            both(t, "reduce-scatter" if along else "all-reduce", True)
        elif row.placement == "split":
            both(t, "all-to-all" if along else "all-gather", along)
    for t in spec.tensors_of("param"):
        row = rows[t.ascii]
        if row.placement == "split":
            add(t, "all-gather", "gradient")
        elif row.shared or row.placement == "added once":
            add(t, "all-reduce", "gradient")
    return tuple(found)


@dataclass(frozen=True)
class RingPass:
    """One pass of the ring over every rank's key tiles: the reductions over a key index it
    computes tile pair by tile pair (merged per query tile), the softmax it merges online by
    its log-sum-exp (None: every softmax it reads has its row statistics from a pass before),
    and the tensors it sends (read at a key index: each rank's block, to every rank)."""

    targets: tuple[ir.Node, ...]
    online: ir.Reduce | None
    travels: tuple[str, ...]  # tensor names, sorted
    # a logsumexp over the keys of the online softmax's scores, written in an equation of its
    # own: the pass's merged log-sum-exp is its value (attention sinks' L)
    statistic: ir.Reduce | None = None


def ring_passes(spec: ir.Spec, plan: SequencePlan) -> dict[str, tuple[RingPass, ...]]:
    """The ring's schedule, read off the notation (of `ring_form(spec, plan)`, which the ring
    runs): per equation (by tensor name) that reduces a tensor along the query and a key
    index, the passes run before it, in order. A softmax that the reduction reads linearly
    merges online; one it does not gets its row log-sum-exp from a pass of its own first,
    unless an equation before computed it. A logsumexp of the scores that a later pass
    merges online (attention sinks' `L_<grτ> = logsumexp_<τ'>(S_<grττ'>)`, with `σ(L − s)`
    taken out of the sum by ring_form) is that pass's statistic: the pass runs where the
    logsumexp is written, once."""
    return _Schedule(ring_form(spec, plan), plan).passes


@functools.lru_cache(maxsize=64)
def ring_form(spec: ir.Spec, plan: SequencePlan) -> ir.Spec:
    """The spec as the ring runs it: where a sum over a key index reads a weight tensor
    `A = softmax(S) · F` whose factors F are free of the key indices and read no tensor
    along the query and a key index (a sink's `σ(L − s)`), and nothing else reads A, F is
    taken out of the sum (`O = F · Σ softmax(S) V`, the same values), so that the pass
    merges the softmax online, through the kernel, without F's statistics first. Through a
    dropout of A (`Ã = dropout(A, p)`, A read only there) too: dropping A · F is dropping A
    times F, with the same draws."""
    glyphs = {i.glyph: i for i in spec.indices}
    query = glyphs[plan.over]
    keys = {glyphs[g] for g in plan.indices} - {query}
    pairs = {eq.tensor.name: n for n, eq in enumerate(spec.equations)}
    pairs = {k: n for k, n in pairs.items() if pair(spec.equations[n].indices, query, keys)}
    reads = [r.tensor.name for eq in spec.equations for r in ir.refs(eq.rhs)]
    outputs = {t.name for t in spec.outputs}
    equations = list(spec.equations)
    for n, eq in enumerate(spec.equations):
        weights = _weights(eq.rhs, pairs, keys)
        if (
            weights is None
            or weights.tensor.name in outputs
            or reads.count(weights.tensor.name) != 1
        ):
            continue
        m = _dropped(equations, pairs[weights.tensor.name], pairs, reads, outputs)
        split = _row_factors(equations[m], pairs, keys)
        if split is not None and weights.written == equations[m].indices:
            soft, rows = split
            equations[m] = dataclasses.replace(equations[m], rhs=soft)
            outer = ir.Product((*rows, eq.rhs), (), eq.rhs.span)
            equations[n] = dataclasses.replace(eq, rhs=outer)
    return dataclasses.replace(spec, equations=tuple(equations))


def dropped(eq: ir.Equation) -> ir.Ref | None:
    """The tensor a dropout equation drops, read with the equation's own indices
    (`Ã_<…> = dropout(A_<…>, p)`); None for another equation."""
    rhs = eq.rhs
    if not (isinstance(rhs, ir.Apply) and rhs.fn == "dropout"):
        return None
    ref = rhs.args[0]
    same = isinstance(ref, ir.Ref) and ref.written == eq.indices
    return ref if same else None


def _dropped(equations: list, m: int, pairs: dict, reads: list, outputs: set) -> int:
    """The equation of the weights a dropout at equation `m` drops (`dropped`), where they
    are a pair tensor read only there, as written; else `m`."""
    ref = dropped(equations[m])
    if ref is None or ref.tensor.name not in pairs:
        return m
    n = pairs[ref.tensor.name]
    alone = reads.count(ref.tensor.name) == 1 and ref.tensor.name not in outputs
    return n if equations[n].indices == equations[m].indices and alone else m


def _weights(node: ir.Node, pairs: dict, keys: set) -> ir.Ref | None:
    """The one pair tensor a product summed over a key index reads, or None."""
    if not (isinstance(node, ir.Product) and set(node.summed) & keys):
        return None
    found = [f for f in node.factors if isinstance(f, ir.Ref) and f.tensor.name in pairs]
    return found[0] if len(found) == 1 else None


def _row_factors(eq: ir.Equation, pairs: dict, keys: set) -> tuple | None:
    """(the softmax over a key index, the other factors) of a weight tensor's product, where
    the others are free of the key indices, read no pair tensor, and lose no axis of it."""
    node = eq.rhs
    if not (isinstance(node, ir.Product) and not node.summed):
        return None
    soft = [
        f
        for f in node.factors
        if isinstance(f, ir.Reduce) and f.fn == "softmax" and set(f.over) & keys
    ]
    rows = [f for f in node.factors if not any(f is g for g in soft)]
    if len(soft) != 1 or not rows or set(soft[0].free) != set(eq.indices):
        return None
    if any(set(f.free) & keys or any(r.tensor.name in pairs for r in ir.refs(f)) for f in rows):
        return None
    return soft[0], tuple(rows)


class _Schedule:
    def __init__(self, spec: ir.Spec, plan: SequencePlan) -> None:
        glyphs = {i.glyph: i for i in spec.indices}
        self.spec, self.query = spec, glyphs[plan.over]
        self.keys = {glyphs[g] for g in plan.indices} - {self.query}
        self.pairs = {
            eq.tensor.name: eq for eq in spec.equations if pair(eq.indices, self.query, self.keys)
        }
        self.stats: set[ir.Node] = set()  # the softmax bodies whose row statistics are known
        self.passes: dict[str, tuple[RingPass, ...]] = {}
        done: set[str] = set()  # equations whose pass ran as an earlier one's statistic
        for n, eq in enumerate(spec.equations):
            if eq.tensor.name in self.pairs or eq.tensor.name in done:
                continue  # computed tile pair by tile pair where read; or already
            held = {t.name for t in spec.arguments} | {e.tensor.name for e in spec.equations[:n]}
            fused = self.fused(eq, spec.equations[n + 1 :], held)
            if fused is not None:
                later, each = fused
                self.passes[eq.tensor.name] = (each,)
                self.stats.add(each.online.body)
                done.add(later)
                continue
            found: list[RingPass] = []
            targets = list(self.targets(eq.rhs))
            if targets:
                self.plan(targets, found)
                self.passes[eq.tensor.name] = tuple(found)

    def fused(self, eq: ir.Equation, after, held: set[str]) -> tuple[str, RingPass] | None:
        """Where `eq` is a logsumexp over the keys whose scores a later equation's one target
        merges online as a softmax (reading neither `eq`'s tensor nor other unknown
        statistics, nor a tensor not `held` yet): that equation's name, and the one pass
        that computes both."""
        stat = eq.rhs
        if not (
            isinstance(stat, ir.Reduce) and stat.fn == "logsumexp" and set(stat.over) <= self.keys
        ):
            return None
        if stat.body in self.stats:
            return None
        for later in after:
            if later.tensor.name in self.pairs:
                continue
            targets = list(self.targets(later.rhs))
            if len(targets) != 1:
                continue
            soft = list(dict.fromkeys(self.softmaxes(targets[0], set())))
            if [(s.body, s.over) for s in soft] != [(stat.body, stat.over)]:
                continue
            reached = self.reached(targets)
            if not self.linear(targets[0], soft[0]) or eq.tensor.name in reached:
                continue
            if not {n for n in reached if n not in self.pairs} <= held:
                continue
            travels = tuple(sorted(self.travelling(targets)))
            return later.tensor.name, RingPass(tuple(targets), soft[0], travels, stat)
        return None

    def reached(self, targets: list[ir.Node]) -> set[str]:
        """Every tensor the targets read, through the pair tensors."""
        found, stack = set(), list(targets)
        while stack:
            for ref in ir.refs(stack.pop()):
                if ref.tensor.name not in found:
                    found.add(ref.tensor.name)
                    if ref.tensor.name in self.pairs:
                        stack.append(self.pairs[ref.tensor.name].rhs)
        return found

    def targets(self, node: ir.Node):
        """The outermost reductions over a key index of a value along the query index."""
        over = node.over if isinstance(node, ir.Reduce) else getattr(node, "summed", ())
        over = set(over) & self.keys  # a concat's `over` joins, it does not reduce
        if (
            over
            and self.query in body_free(node)
            and not (isinstance(node, ir.Reduce) and node.fn == "softmax")
        ):
            if node.free and self.query not in node.free:
                raise SpecError(f"{self.spec.name}: a reduction over the query index of a pair")
            yield node
            return
        for child in ir.children(node):
            yield from self.targets(child)

    def softmaxes(self, node: ir.Node, seen: set) -> list[ir.Reduce]:
        found = []
        for sub in ir.walk(node):
            if isinstance(sub, ir.Reduce) and sub.fn == "softmax" and set(sub.over) & self.keys:
                found.append(sub)
            if isinstance(sub, ir.Ref) and sub.tensor.name in self.pairs:
                name = sub.tensor.name
                if name not in seen:
                    seen.add(name)
                    found += self.softmaxes(self.pairs[name].rhs, seen)
        return found

    def linear(self, node: ir.Node, target: ir.Reduce) -> bool | None:
        """Whether `node` is linear in the softmax `target` (None: it does not read it)."""
        if node == target:
            return True
        if isinstance(node, ir.Ref):
            eq = self.pairs.get(node.tensor.name)
            return None if eq is None else self.linear(eq.rhs, target)
        if isinstance(node, ir.Field):
            return None
        if isinstance(node, ir.Apply) and node.fn == "dropout":
            return self.linear(node.args[0], target)
        parts = [self.linear(c, target) for c in ir.children(node)]
        found = [p for p in parts if p is not None]
        if not found:
            return None
        return isinstance(node, ir.Product) and found == [True]

    def plan(self, targets: list[ir.Node], found: list[RingPass]) -> None:
        online = None
        for target in targets:
            unknown = list(
                dict.fromkeys(s for s in self.softmaxes(target, set()) if s.body not in self.stats)
            )
            if len(targets) == 1 and len(unknown) == 1 and self.linear(target, unknown[0]):
                online = unknown[0]
            elif unknown:  # statistics first: each softmax's row log-sum-exp
                stats = [ir.Reduce("logsumexp", s.over, s.body, s.span) for s in unknown]
                self.plan(stats, found)
        found.append(RingPass(tuple(targets), online, tuple(sorted(self.travelling(targets)))))
        for target in targets:
            if isinstance(target, ir.Reduce) and target.fn == "logsumexp":
                self.stats.add(target.body)

    def travelling(self, targets: list[ir.Node]) -> set[str]:
        """The tensors along one sequence index that the targets read at a key index."""
        found, seen, stack = set(), set(), list(targets)
        while stack:
            for ref in ir.refs(stack.pop()):
                name = ref.tensor.name
                if name in self.pairs and name not in seen:
                    seen.add(name)
                    stack.append(self.pairs[name].rhs)
                elif name not in self.pairs and self.keys & set(ref.written):
                    found.add(name)
        return found


def pair(indices, query: ir.Index, keys: set[ir.Index]) -> bool:
    """Whether a tensor along `indices` is along the query index and a key index."""
    return query in indices and bool(keys & set(indices))


def body_free(node: ir.Node) -> tuple[ir.Index, ...]:
    """The indices free in what a reduction (or a product's factors) runs over."""
    if isinstance(node, ir.Product):
        return tuple(i for f in node.factors for i in f.free)
    return node.body.free if isinstance(node, ir.Reduce) else node.free


def work_lines(spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int) -> list[str]:
    """Each rank's work on the ring, read off the block map (scalars at the spec's values), in
    each layout, the layout that balances it best and the tiles it cuts; none where the
    sequence's sizes are not all given, or do not divide. A mask that compares integer
    inputs (document ids) is counted by positions alone: an upper bound."""
    found = _layouts(spec, plan, sizes, ranks)
    if found is None:
        return []
    passes = sum(map(len, ring_passes(spec, plan).values()))
    lines = [
        f"Scores per rank in one call (query × key positions of the tile pairs no mask hides; "
        f"{passes} pass{'es' * (passes > 1)} over the keys, each recomputed once in the "
        "backward), by layout"
    ]
    for layout, (_, work) in found.items():
        cells = "  ".join(f"{w:,}" for w in work)
        lines.append(f"  {layout!s:<10}  {cells}  (max/mean {_balance(work):.2f})")
    best = _best(found)
    lines.append(f"  balanced by: {best} (layout={best.name!r})")
    return [*lines, *tile_lines(found[best][0])]


def balanced(spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int) -> Layout | None:
    """The layout that balances the ring's work over `ranks` best, read off the block map
    (contiguous where both balance it alike), as `count --ring` names it; None where the
    sequence's sizes are not all given (`sizes`: by symbol, scalars too)."""
    found = _layouts(spec, plan, sizes, ranks)
    return None if found is None else _best(found)


def position_map(spec: ir.Spec, plan, sizes: dict, world: int, layout, tile=None) -> BlockMap:
    """The block map of positions alone at `sizes` (by symbol; a scalar not among them at
    the spec's value): what the counts read."""
    scalars = {s.symbol: float(sizes.get(s.symbol, s.value)) for s in spec.scalars}
    return BlockMap(spec, plan, sizes, scalars, world, layout_of(layout), tile)


def _layouts(spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int) -> dict | None:
    """Each layout's block map and each rank's scores on it; None where they cannot be
    counted."""
    passes = sum(map(len, ring_passes(spec, plan).values()))
    found = {}
    for layout in (CONTIGUOUS, ZIGZAG):
        try:
            block_map = position_map(spec, plan, sizes, ranks, layout)
        except (TypeError, ValueError):
            return None
        found[layout] = (block_map, [passes * block_map.work(r) for r in range(ranks)])
    return found


def _balance(work: list[int]) -> float:
    return max(work) * len(work) / max(sum(work), 1)


def _best(found: dict) -> Layout:
    return min(found, key=lambda lay: (round(_balance(found[lay][1]), 2), lay != CONTIGUOUS))


def tile_lines(block_map: BlockMap) -> list[str]:
    """The tiles a block map cuts, and why; for a mask that reads integer inputs, that its
    work is an upper bound."""
    length = block_map.tile or block_map.chunk
    why = "a chunk" if block_map.tile is None else "chosen for the mask's window"
    if block_map.tile is not None and not block_map.masked():
        why = f"the longest up to {MAX_TILE:,} that divides a chunk"
    lines = [f"  tiles: {length:,} positions, {why} (tile= overrides)"]
    names = sorted({name for name, _ in block_map.ids.values()})
    if names:
        lines += [
            f"  an upper bound: the mask reads {', '.join(names)}, data, counted here by "
            "positions alone; each call",
            f"  bounds {', '.join(names)} per tile (one all-gather), chooses its tile from the "
            "bounds and skips the pairs they",
            "  hide: what it computed is in layer.last_ring['work'] and ['tile']",
        ]
    return lines
