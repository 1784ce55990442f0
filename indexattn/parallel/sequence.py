"""IR -> a sequence plan: how a spec's sequence index couples positions, read off the notation.

Splitting one sequence over w ranks cuts every reduction that runs along it. Each one either
merges (softmax and logsumexp by their log-sum-exp, sum and mean by plain sums, max and min by
max and min, a cumsum by an exclusive scan of the state carried into each rank's block), or
cannot be split (a concat along the sequence, a row read at a shifted or literal position),
and then the plan names it. Positions read as numbers (a causal mask, rotary angles, ALiBi's
distance, T5's buckets) must be the global positions, and the plan lists where they are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from ..errors import SpecError
from ..ops import EXTREMUM, LSE, PREFIX, REDUCTIONS, SUM
from .shard import find_index, shard_plan

MERGES = {name: op.merge for name, op in REDUCTIONS.items() if op.merge}  # ops.py says each
WHY = {
    LSE: "each rank's row maximum and sum of exponentials, merged by log-sum-exp",
    SUM: "each rank's partial sum, added",
    EXTREMUM: "each rank's partial extremum, compared",
    PREFIX: "an exclusive scan across ranks: the state of the blocks before is carried in",
}


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


_SHARE = {
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
        found.append(Sent(repr(t), collective, phase, sympy.factor(whole * _SHARE[collective])))

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


def ring_travels(spec: ir.Spec, plan: SequencePlan) -> tuple[ir.Tensor, ...]:
    """The tensors along one sequence index that the ring sends: those read at a key index
    in a tensor along the query and a key index, or in a reduction over a key index."""
    query, keys = plan.over, set(plan.indices) - {plan.over}
    pairs = set()
    for eq in spec.equations:
        glyphs = {i.glyph for i in eq.indices}
        if query in glyphs and keys & glyphs:
            pairs.add(eq.tensor.name)
    scanned = []
    for eq in spec.equations:
        for node in ir.walk(eq.rhs):
            over = {i.glyph for i in getattr(node, "over", ()) or getattr(node, "summed", ())}
            if eq.tensor.name in pairs or (
                over & keys and isinstance(node, ir.Reduce | ir.Product)
            ):
                scanned.append(node)
    found = {
        ref.tensor: None
        for node in scanned
        for ref in ir.refs(node)
        if ref.tensor.name not in pairs
        and keys & {i.glyph for i in ref.written if isinstance(i, ir.Index)}
    }
    return tuple(found)


def ring_sent(spec: ir.Spec, plan: SequencePlan) -> tuple[Sent, ...]:
    """What the ring (`context_parallel(..., strategy="ring")`) sends per rank in one training
    step, every rank's keys read by every other (a causal mask under zig-zag chunks): each
    travelling block to w - 1 ranks, its gradient back; parameters' gradients summed. A mask
    that hides whole blocks sends less; a softmax whose statistics need their own pass (a
    sink's logsumexp) sends its scores' inputs once more."""
    if not plan.splittable:
        raise SpecError(plan.verdict())
    found = []
    for t in ring_travels(spec, plan):
        block = sympy.Mul(*t.shape) * (RANKS - 1) / RANKS
        found.append(Sent(repr(t), "send/recv", "forward", sympy.factor(block)))
        if t.dtype != "int":
            found.append(Sent(repr(t), "send/recv", "backward", sympy.factor(block)))
    split = dict(plan.split)
    for t in spec.tensors_of("param", "input"):
        if t.dtype != "int" and repr(t) not in split:
            whole = sympy.Mul(*t.shape) * _SHARE["all-reduce"]
            phase = "gradient" if t.role == "param" else "backward"
            found.append(Sent(repr(t), "all-reduce", phase, sympy.factor(whole)))
    return tuple(found)


def sent_table(
    spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int, strategy: str = "ulysses"
) -> str:
    """`indexattn count SPEC --context W [--ring]`: what each rank sends in one training
    step."""
    ring = strategy == "ring"
    if not (plan.splittable if ring else plan.ulysses):
        raise SpecError(plan.verdict())
    rows = ring_sent(spec, plan) if ring else ulysses_sent(spec, plan)
    cells = [
        (s.tensor, s.collective, s.phase, str(s.elements), f"{s.at(sizes, ranks):,}") for s in rows
    ]
    widths = [max(len(c[k]) for c in cells) for k in range(5)]
    lines = [
        f"Elements sent per rank in one training step, {', '.join(plan.indices)} split over "
        f"w = {ranks} ranks ({'ring' if ring else f'Ulysses over {plan.heads}'}); per batch "
        "element, gradients of parameters once per step"
    ]
    for c in cells:
        lines.append(
            "  " + "  ".join(c[k].ljust(widths[k]) for k in range(4)) + "  " + c[4].rjust(widths[4])
        )
    per_item = sum(s.at(sizes, ranks) for s in rows if s.phase != "gradient")
    once = sum(s.at(sizes, ranks) for s in rows if s.phase == "gradient")
    lines.append(
        f"  total: {per_item:,} per batch element ({_bytes(per_item * 4)} in float32), "
        f"and {once:,} per step ({_bytes(once * 4)})"
    )
    return "\n".join(lines) + "\n"


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"
