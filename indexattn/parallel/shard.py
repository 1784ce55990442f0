"""IR -> a sharding plan: which tensors split along a head index, which are replicated, where
the sums over heads must be all-reduced, and which layouts need a relayout first."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from ..errors import SpecError
from ..ir.nodes import layout_text
from ..notation.names import GREEK, normalise

# How a tensor is placed: the words the table prints.
SPLIT = "split"  # along one axis, a block of heads per rank (DTensor Shard)
REPLICATED = "replicated"  # whole on every rank (DTensor Replicate)
ONCE = "added once"  # replicated, but added to a sum over heads once, not once per rank
PARTIAL = "partial"  # no head index: each rank holds its heads' part of a sum (one all-reduce)
RELAYOUT = "relayout"  # has the head index, but not leading its axis: a copy first
BLOCKED = "blocked"

# Elementwise functions linear in their first argument: a partial sum may pass through them.
LINEAR = frozenset({"dropout", "neg"})


@dataclass(frozen=True)
class Row:
    """One tensor's placement; `axis` is the axis it splits along (SPLIT), `to` the layout
    that makes it shardable (RELAYOUT)."""

    tensor: str  # as written: W_<(μBa)i>
    ascii: str
    role: str  # input, param, buffer, derived, output
    placement: str
    why: str
    axis: int | None = None
    to: str | None = None
    sizes: str = ""  # the keywords relayout needs, e.g. B=3, mu=h
    shared: bool = False  # replicated and read by every rank's heads: gradients summed

    @property
    def cell(self) -> str:
        if self.placement == SPLIT and self.axis is not None:
            return f"split, axis {self.axis}"
        if self.placement == RELAYOUT:
            return f"relayout to <{self.to}>"
        return self.placement


@dataclass(frozen=True)
class ShardPlan:
    """How a spec shards over one index; `print(plan)` shows the table.

    >>> import indexattn
    >>> plan = indexattn.compile_spec("specs/mha.attn").shard_plan(over="μ")  # doctest: +SKIP
    >>> plan.shardable, plan.row("W").cell  # doctest: +SKIP
    (True, 'split, axis 0')
    """

    spec: str
    over: str  # the index glyph
    over_ascii: str
    size: str  # the ASCII name of its range, e.g. h
    rows: tuple[Row, ...]
    blockers: tuple[str, ...]  # why the spec cannot run as h/world heads per rank at all
    all_reduced: tuple[str, ...]  # outputs summed over the index: one all-reduce each

    @property
    def relayouts(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.placement == RELAYOUT)

    @property
    def shardable(self) -> bool:
        return not self.blockers and not self.relayouts

    def row(self, name: str) -> Row:
        """The row of a tensor by its ASCII name or its name as written."""
        for r in self.rows:
            if name in (r.ascii, r.tensor, r.tensor.split("_<")[0]):
                return r
        raise KeyError(f"{self.spec} has no tensor {name!r}")

    def verdict(self) -> str:
        """One paragraph: shardable, or what to do first."""
        if self.blockers:
            return f"{self.spec} cannot be sharded over {self.over}:\n" + "\n".join(
                f"  - {b}" for b in self.blockers
            )
        if self.relayouts:
            moves = "\n".join(
                f'  {r.tensor}: indexattn.relayout({r.ascii}, "<{_layout(r.tensor)}>", '
                f'"<{r.to}>", {r.sizes}); write {r.tensor.split("_<")[0]}_<{r.to}> in the spec '
                f"({self.over} first in every reference)"
                for r in self.relayouts
            )
            return (
                f"{self.spec} needs a relayout before it shards over {self.over}: {self.over} "
                f"must lead the fused axis it is on, so that each rank's heads are one "
                f"contiguous block.\n{moves}"
            )
        reduce = ", ".join(self.all_reduced) or "nothing"
        return (
            f"{self.spec} shards over {self.over}: each of w ranks holds {self.size}/w heads "
            f"and runs the same generated code at {self.size} = {self.size}/w; all-reduce after: "
            f"{reduce}."
        )

    def __str__(self) -> str:
        head = ("tensor", "role", "placement", "why")
        cells = [head] + [(r.tensor, r.role, r.cell, r.why) for r in self.rows]
        widths = [max(len(c[k]) for c in cells) for k in range(3)]
        lines = [
            f"Shard plan of {self.spec} over {self.over} ({self.size} heads, {self.size}/w "
            "per rank)"
        ]
        for c in cells:
            lines.append("  " + "  ".join(c[k].ljust(widths[k]) for k in range(3)) + "  " + c[3])
        return "\n".join([*lines, self.verdict()])


def _layout(written: str) -> str:
    return written.split("_<", 1)[1].rstrip(">")


def find_index(spec: ir.Spec, over: str) -> ir.Index:
    """The index `over` names: its glyph (`μ`), its macro (`\\mu`) or its ASCII name (`mu`)."""
    text = normalise(over.strip())
    if text.startswith("\\"):
        base = text[1:].rstrip("'")
        text = GREEK.get(base, base) + text[1 + len(base) :]
    for index in spec.indices:
        if text in (index.glyph, index.ascii):
            return index
    leading = {
        axis[0].glyph for t in spec.tensors_of("param") for axis in t.layout if len(axis) > 1
    }
    hint = f" (heads lead fused axes here: {', '.join(sorted(leading))})" if leading else ""
    raise SpecError(
        f"{spec.name} has no index '{over}' to shard over; its indices are "
        f"{', '.join(i.glyph for i in spec.indices)}{hint}",
        hint='name the head index by its letter, macro or ASCII name, e.g. over="μ", '
        '"\\\\mu" or "mu"; a grouped-query spec shards over its key/value group g.',
    )


def shard_plan(spec: ir.Spec, over: str) -> ShardPlan:
    """The plan of `spec` over the index named `over`; see ShardPlan."""
    return _Planner(spec, find_index(spec, over)).plan()


class _Planner:
    def __init__(self, spec: ir.Spec, over: ir.Index) -> None:
        self.spec, self.over = spec, over
        self.blockers: list[str] = []
        self.kinds: dict[ir.Tensor, str] = {}  # SPLIT, REPLICATED or PARTIAL, as computed
        self.once: dict[ir.Tensor, str] = {}  # argument -> the equation adding it once
        self.uses: dict[ir.Tensor, int] = {}  # an argument's reads, once-terms aside
        self.once_refs: set[int] = set()  # id() of the references added once
        self.deps: dict[ir.Tensor, frozenset[ir.Tensor]] = {}
        self.eq = ""

    def block(self, message: str) -> None:
        if message not in self.blockers:
            self.blockers.append(message)

    def plan(self) -> ShardPlan:
        spec, over = self.spec, self.over
        size = over.size
        if not isinstance(size, sympy.Symbol):
            self.block(
                f"the range of {over.glyph} is {size}, not a size symbol: declare "
                f"`index {over.glyph} : h` so that each rank can run at h/w"
            )
            size_name = str(size)
        else:
            size_name = spec.size_ascii(size)
            for other in spec.indices:
                if other != over and size in other.size.free_symbols:
                    self.block(
                        f"{size_name} is also the range of index {other.glyph}: a rank "
                        f"with {size_name}/w heads would shrink {other.glyph} too"
                    )
        for tensor in spec.arguments:
            self.kinds[tensor] = SPLIT if over in tensor.indices else REPLICATED
            self.deps[tensor] = frozenset({tensor})
        for eq in spec.equations:
            self.eq = eq.text
            self.kinds[eq.tensor] = kind = self.kind(eq.rhs)
            self.deps[eq.tensor] = frozenset().union(
                *(self.deps[r.tensor] for r in ir.refs(eq.rhs))
            )
            if kind == SPLIT and over not in eq.tensor.indices:
                self.block(f"{eq.text}: the right-hand side has {over.glyph} free")
        per_rank = self.per_rank()
        for t in self.once:
            if self.uses.get(t):
                self.block(
                    f"{t!r} is added once after the sum over {over.glyph} in "
                    f"{self.once[t]}, and used per head elsewhere: pass it twice"
                )
        for out in spec.outputs:
            mixed = {t for t in self.deps[out] if t in per_rank and t.role != "input"}
            if self.kinds[out] == REPLICATED and mixed:
                names = ", ".join(repr(t) for t in mixed)
                self.block(
                    f"the output {out!r} has no {over.glyph}, but is computed from "
                    f"{names}, which also feed the heads"
                )
        rows = tuple(self.row(t, per_rank) for t in spec.tensors)
        reduced = tuple(repr(t) for t in spec.outputs if self.kinds[t] == PARTIAL)
        return ShardPlan(
            spec.name, over.glyph, over.ascii, size_name, rows, tuple(self.blockers), reduced
        )

    def per_rank(self) -> set[ir.Tensor]:
        """Replicated arguments that feed a head-split or partial value: their gradients are
        summed over the ranks."""
        found: set[ir.Tensor] = set()
        for eq in self.spec.equations:
            if self.kinds[eq.tensor] in (SPLIT, PARTIAL):
                for ref in ir.refs(eq.rhs):
                    if id(ref) in self.once_refs:
                        continue
                    found |= {t for t in self.deps[ref.tensor] if self.kinds[t] == REPLICATED}
        return found

    def row(self, t: ir.Tensor, per_rank: set[ir.Tensor]) -> Row:
        over, written = self.over, repr(t)
        role = "output" if t in self.spec.outputs else t.role
        kind = self.kinds.get(t, REPLICATED)
        if kind == SPLIT and over not in t.indices:
            return Row(written, t.ascii, role, BLOCKED, f"{over.glyph} free on the right only")
        if kind == SPLIT:
            axis = next(k for k, group in enumerate(t.layout) if over in group)
            group = t.layout[axis]
            if group[0] != over:
                moved = (over, *tuple(i for i in group if i != over))
                to = layout_text((*t.layout[:axis], moved, *t.layout[axis + 1 :]))
                if t.role == "derived" and t not in self.spec.outputs:
                    why = f"computed per head (each rank at {self.size_text()})"
                    return Row(written, t.ascii, role, SPLIT, why)
                why = (
                    f"{over.glyph} is not first in {layout_text((group,))}: one "
                    f"rank's heads are not one block of axis {axis}"
                )
                sizes = ", ".join(f"{i.ascii}={i.size}" for i in group[:-1])
                return Row(written, t.ascii, role, RELAYOUT, why, axis, to, sizes)
            if t.role == "derived":
                why = f"computed per head (each rank at {self.size_text()})"
                if role == "output":
                    why += f"; gathered along axis {axis}"
            elif len(group) > 1:
                why = (
                    f"{over.glyph} leads ({''.join(i.glyph for i in group)}): contiguous "
                    "blocks of heads"
                )
            else:
                why = f"axis {axis} is {over.glyph}"
            if t.role == "param" and self.row_parallel(t):
                why += "; row-parallel (its product sums over " + over.glyph + ")"
            return Row(written, t.ascii, role, SPLIT, why, axis)
        if kind == PARTIAL:
            why = f"no {over.glyph}; a sum over {over.glyph} split over ranks"
            why += ": one all-reduce" if role == "output" else ", carried to the output"
            return Row(written, t.ascii, role, PARTIAL, why)
        if t in self.once and not self.uses.get(t):
            return Row(
                written,
                t.ascii,
                role,
                ONCE,
                f"no {over.glyph}; added after the sum over {over.glyph}: once in all",
            )
        if t in per_rank:
            why = f"no {over.glyph}; read by every rank's heads (gradient summed over ranks)"
            return Row(written, t.ascii, role, REPLICATED, why, shared=True)
        return Row(written, t.ascii, role, REPLICATED, f"no {over.glyph}")

    def size_text(self) -> str:
        size = self.over.size
        name = self.spec.size_ascii(size) if isinstance(size, sympy.Symbol) else str(size)
        return f"{name}/w"

    def row_parallel(self, t: ir.Tensor) -> bool:
        for eq in self.spec.equations:
            for node in ir.walk(eq.rhs):
                if (
                    isinstance(node, ir.Product)
                    and self.over in node.summed
                    and any(isinstance(f, ir.Ref) and f.tensor == t for f in node.factors)
                ):
                    return True
        return False

    # -- the kind of each value: SPLIT (has the index), REPLICATED, or PARTIAL

    def kind(self, node: ir.Node) -> str:
        over = self.over
        if isinstance(node, ir.Field):
            names = {over.symbol, over.size} & node.expr.free_symbols
            if names:
                what = ", ".join(sorted(str(n) for n in names))
                self.block(
                    f"{self.eq}: reads {what} as a number; on a rank with "
                    f"{self.size_text()} heads it would have another value"
                )
            return REPLICATED
        if isinstance(node, ir.Ref):
            return self.ref(node)
        kids = [self.kind(child) for child in ir.children(node)]
        if isinstance(node, ir.Product):
            return self.product(node, kids)
        if isinstance(node, ir.Sum):
            return self.sum(node, kids)
        if isinstance(node, ir.Reduce):
            if over in node.over:
                if node.fn != "sum":
                    self.block(
                        f"{self.eq}: {node.fn} over {over.glyph} needs every head on one rank"
                    )
                    return REPLICATED
                return PARTIAL
            if kids[0] == PARTIAL and node.fn != "sum":
                self.block(f"{self.eq}: {node.fn} of a partial sum over {over.glyph}")
            return kids[0]
        if isinstance(node, ir.Apply):
            if PARTIAL in kids:
                if node.fn not in LINEAR or kids.count(PARTIAL) > 1 or kids[0] != PARTIAL:
                    self.block(
                        f"{self.eq}: {node.fn} of a sum over {over.glyph} that each "
                        "rank holds only part of"
                    )
                return PARTIAL
            return SPLIT if SPLIT in kids else REPLICATED
        if isinstance(node, ir.Concat):
            if over == node.over or PARTIAL in kids:
                self.block(f"{self.eq}: concat along or of a sum over {over.glyph}")
            return SPLIT if SPLIT in kids else REPLICATED
        return REPLICATED

    def ref(self, node: ir.Ref) -> str:
        over, t = self.over, node.tensor
        for place, read in zip(t.indices, node.written):
            if place == over and read != over:
                what = f"the literal {read}" if isinstance(read, int) else f"{read!r}"
                self.block(
                    f"{self.eq}: {t.name} reads {what} where its layout has "
                    f"{over.glyph}: one rank does not hold every head"
                )
            elif place != over and read == over:
                self.block(f"{self.eq}: {t.name} reads {over.glyph} in the place of {place!r}")
        if t.role != "derived":
            self.uses[t] = self.uses.get(t, 0) + 1
        return self.kinds[t] if over in node.free or self.kinds[t] != SPLIT else REPLICATED

    def product(self, node: ir.Product, kids: list[str]) -> str:
        over = self.over
        if PARTIAL in kids:
            others = [k for k in kids if k != PARTIAL]
            if kids.count(PARTIAL) > 1 or SPLIT in others or over in node.summed:
                self.block(
                    f"{self.eq}: a partial sum over {over.glyph} multiplied by a value "
                    "that is not replicated"
                )
            return PARTIAL
        if over in node.summed:
            return PARTIAL
        return SPLIT if SPLIT in kids else REPLICATED

    def sum(self, node: ir.Sum, kids: list[str]) -> str:
        if PARTIAL not in kids:
            return SPLIT if SPLIT in kids else REPLICATED
        for term, kind in zip(node.terms, kids):
            if kind == SPLIT:
                self.block(f"{self.eq}: a sum over {self.over.glyph} added to a value per head")
            elif kind == REPLICATED:
                self.added_once(term)
        return PARTIAL

    def added_once(self, term: ir.Node) -> None:
        """A replicated term beside a partial sum: only an argument (times numbers) can be
        added once, by giving each rank its 1/w share (DTensor Partial)."""
        refs = list(ir.refs(term))
        fields = isinstance(term, ir.Product) and all(
            isinstance(f, (ir.Ref, ir.Field)) for f in term.factors
        )
        if (
            len(refs) == 1
            and refs[0].tensor.role != "derived"
            and (isinstance(term, ir.Ref) or fields)
        ):
            tensor = refs[0].tensor
            self.uses[tensor] -= 1  # counted by ref() just now, as a use per head
            self.once_refs.add(id(refs[0]))
            self.once.setdefault(tensor, self.eq)
            return
        self.block(
            f"{self.eq}: a term without {self.over.glyph} is added to a sum over "
            f"{self.over.glyph}, and every rank would add it: add it outside the "
            "module, or make it a single param or input"
        )
