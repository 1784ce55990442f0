"""Ring context parallelism, read off the notation: each rank keeps its queries, the key-side
blocks travel between ranks by P2P, and every reduction over a key index merges as the
sequence plan says (indexattn/parallel/sequence.py).

The equations outside the tile pairs (projections, the output's) are run by the literal
interpreter (indexattn/oracle) on this rank's blocks; a tensor along the query index and a key
index (scores, weights) is never held whole, only for one pair of tiles at a time: each ring
pass's tile pairs run through the pass's compiled tile spec (tiles.py: the spec's own pair
equations compiled, at the tiles' global positions; where its core is SDPA's, one process's
flash kernel with its log-sum-exp, runtime/flash.py), which returns the pass's targets and the
tile's log-sum-exp, merged here: a softmax by its log-sum-exp (online), sums added, maxima
compared. Where the tile pairs run that kernel or the one-step softmax, the pass is one
autograd step (_KeptPass) whose backward tours the ring again, each tile pair's gradients made
from its rows' merged output and log-sum-exp (FlashAttention's ring backward): no rank keeps
another's blocks, and it receives them in runs of about an eighth (sequence.cuts), one run
held at a time, only the runs its tile pairs read (sequence.read_runs: not the keys a mask
leaves out); other passes are differentiated through checkpointed tile pairs and their
merge. A pass the tile spec cannot take is named in `tiles.plan_lines` (`count --ring`)
and evaluated tile pair by tile pair by the interpreter, slowly. A cumsum along the
sequence adds the totals of the chunks before (an exclusive scan across ranks). Index
variables read the global positions of each tile, so masks, rotary angles and ALiBi
distances are those of one process. A tile pair that a mask hides entirely (read off the
mask's condition, bounded on the tile's box: sequence.BlockMap) is not computed, and a rank
whose queries need nothing of another's keys receives nothing from it. The passes over the
keys are read off the notation once (sequence.ring_passes), and the count reads the same. In
low precision, tables are built in float32 or wider and tile pairs accumulate in float32, as
one process's kernels do.

Imported only when used (`import indexattn.distributed`): it imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import sympy
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils.checkpoint import checkpoint

from .. import ir
from ..errors import SpecError
from ..ir.shapes import recipe, solve
from ..oracle.reference import LITERAL, Interpreter
from ..runtime.compiled import broadcast
from .sequence import (
    CONTIGUOUS,
    ZIGZAG,
    BlockMap,
    Bounds,
    RingPass,
    SequencePlan,
    Tile,
    read_runs,
    ring_form,
    ring_passes,
    ring_work,
)
from .sequence import pair as _is_pair
from .tiles import FLOOR, TileCore, core, kept

INF = float("inf")
# differentiable all-gather along a new leading axis (renamed in torch 2.13)
_all_gather = (
    getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
)


# -- where each rank's positions lie


def chunks(length: int, world: int, zigzag: bool, dim: int = 1) -> list[list[tuple[int, int]]]:
    """Each rank's chunks of positions, [start, stop): one contiguous block, or (zig-zag, for a
    causal mask's balance) chunks r and 2w - 1 - r of 2w (sequence.Layout.spans)."""
    return (ZIGZAG if zigzag else CONTIGUOUS).spans(length, world, dim)


# -- log-sum-exp without NaN: a row of -inf only has -inf, and no NaN in its gradient


def lse(x: torch.Tensor, dims) -> torch.Tensor:
    """log Σ exp(x) over `dims`, kept: -inf for a fully masked row (torch's SDPA CPU op says
    0.0 there), and its gradient 0, not NaN."""
    top = x.detach().amax(dims, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.exp(x - top).sum(dims, keepdim=True)
    empty = total == 0
    return torch.where(empty, -INF, top + torch.log(torch.where(empty, 1.0, total)))


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == -INF, torch.zeros_like(x), x)


def _empty(x: torch.Tensor) -> torch.Tensor:
    """A compiled tile's log-sum-exp merged: -inf where no key was seen (tiles.FLOOR)."""
    return torch.where(x < -FLOOR / 10, -INF, x)


def merge_lse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return lse(torch.stack((a, b)), 0).squeeze(0)


# -- P2P: a block received at one step, linked to the block sent for autograd


def _fresh(t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A contiguous buffer for what arrives in place of `t` (gloo receives into contiguous)."""
    return torch.zeros(t.shape, dtype=dtype or t.dtype, device=t.device)


class _Arrived(torch.autograd.Function):
    """Identity on the blocks received at one ring step; its backward sends their gradients
    back to their owner and receives the gradients of this rank's blocks from the rank that
    read them. A scalar token chains the steps so that every rank runs their backwards, in
    the same order (gloo's send waits for its receive)."""

    @staticmethod
    def forward(ctx, step, token, *mine):
        ctx.step = step
        return (token.clone(), *step.received)

    @staticmethod
    def backward(ctx, g_token, *grads):
        return (None, g_token, *ctx.step.returned(list(grads)))


class _Step:
    """One ring step s: this rank sends its blocks to rank r + s where that rank's queries
    read them, and receives those of rank r - s where its own queries read them (counted as
    received in the forward, not when a backward sends them again)."""

    def __init__(
        self, ring: _Ring, s: int, names: list[str], mine: list[torch.Tensor], counted=True
    ) -> None:
        r, w = ring.rank, ring.world
        self.ring, self.s = ring, s
        self.src, self.dst = (r - s) % w, (r + s) % w
        self.recv, self.send = ring.need[r][self.src], ring.need[self.dst][r]
        self.names, self.mine = names, mine
        self.floats, self.dtypes = [t.is_floating_point() for t in mine], [t.dtype for t in mine]
        self.shapes = [t.shape for t in mine]  # a block received is the shape of our own
        self.received = [_fresh(t) for t in mine] if self.recv else []
        if counted:
            ring.counts["received"][self.src] += sum(t.numel() for t in self.received)
        out = [t.detach() for t in mine] if self.send else []
        self.works = self.post(out, self.received, reverse=False)

    def post(self, out: list, into: list, reverse: bool) -> list:
        """isend `out` to the reader and irecv `into` from the owner (the other way round,
        for gradients, when `reverse`), posted as one batch."""
        ring = self.ring
        to, frm = (self.src, self.dst) if reverse else (self.dst, self.src)
        ops = [
            dist.P2POp(dist.isend, t.contiguous(), ring.peer(to), ring.group, self.tag(k, reverse))
            for k, t in enumerate(out)
        ]
        ring.counts["sent"] += sum(t.numel() for t in out)
        ops += [
            dist.P2POp(dist.irecv, t, ring.peer(frm), ring.group, self.tag(k, reverse))
            for k, t in enumerate(into)
        ]
        # one batch, so that NCCL (which ignores tags) pairs each send with its receive
        return dist.batch_isend_irecv(ops) if ops else []

    def tag(self, k: int, reverse: bool) -> int:
        return 2 * (self.s * 64 + k) + reverse

    def wait(self) -> dict:
        """The blocks received, by name."""
        for work in self.works:
            work.wait()
        self.works = []  # a work holds its buffers
        return dict(zip(self.names, self.received))

    def arrive(self, token: torch.Tensor) -> tuple[torch.Tensor, dict]:
        self.wait()
        token, *received = _Arrived.apply(self, token, *self.mine)
        return token, dict(zip(self.names, received))

    def returned(self, grads: list, dtype=None) -> list:
        """The gradients of the blocks received (`grads`, by block; None: 0) sent back to
        their owner, and those of this rank's blocks received from the rank that read them,
        in `dtype` (or theirs; None for an integer block, or where that rank read nothing)."""
        floats = [k for k, f in enumerate(self.floats) if f]
        device = self.ring.device
        given = [
            grads[k]
            if grads[k] is not None
            else torch.zeros(self.shapes[k], dtype=dtype or self.dtypes[k], device=device)
            for k in (floats if self.recv else [])
        ]
        back = [_fresh(self.mine[k], dtype) for k in floats] if self.send else []
        for work in self.post(given, back, reverse=True):
            work.wait()
        found = [None] * len(self.floats)
        for k, grad in zip(floats, back):
            found[k] = grad
        return found


def _tour(ring: _Ring, names: list[str], mine: list[torch.Tensor], counted=True):
    """None (this rank's own blocks), then each ring step, each posted a step ahead of its
    use, so that its transfer overlaps the tile pairs of the step before. Closed early (a
    tile pair raised, as it does on every rank alike where the error is the spec's own), the
    step posted ahead is finished first (`_drained`)."""
    ahead = _Step(ring, 1, names, mine, counted) if ring.world > 1 else None
    try:
        yield None
        for s in range(2, ring.world + 1):
            step, ahead = ahead, _Step(ring, s, names, mine, counted) if s < ring.world else None
            yield step
    finally:
        _drained(ahead)


def _drained(ahead: _Step | None) -> None:
    """A step posted ahead of its use, finished where its use never came: a transfer left
    posted would be waited for for ever by the rank that posted its other end, or read by
    the same ring's next call (whose steps have the same tags)."""
    if ahead is not None:
        ahead.wait()


def _narrow(t: torch.Tensor, axis: int, run: tuple[int, int]) -> torch.Tensor:
    return t.narrow(axis, run[0], run[1] - run[0])


class _Piece(_Step):
    """Piece p of ring step s of a kept pass (_Kept): this rank's keys `out` (a run of its
    block, sequence.cuts) to rank r + s, which reads them, and the run `into` of rank r - s's keys
    from it (None: no such piece); their gradients go back the other way (`returned`)."""

    def __init__(self, ring: _Ring, at: tuple, names: list[str], mine: list, axes: list) -> None:
        s, self.p, self.out, self.into, counted = at
        r, w = ring.rank, ring.world
        self.ring, self.s, self.names = ring, s, names
        self.src, self.dst = (r - s) % w, (r + s) % w
        self.recv, self.send = self.into is not None, self.out is not None
        self.floats, self.dtypes = [t.is_floating_point() for t in mine], [t.dtype for t in mine]
        self.mine = [_narrow(t, a, self.out) for t, a in zip(mine, axes)] if self.send else []
        self.shapes = []
        if self.recv:  # a run of the other rank's block: the shape of one of ours
            self.shapes = [_narrow(t, a, self.into).shape for t, a in zip(mine, axes)]
        self.received = [
            torch.zeros(shape, dtype=t.dtype, device=t.device)
            for shape, t in zip(self.shapes, mine)
        ]
        if counted:
            ring.counts["received"][self.src] += sum(t.numel() for t in self.received)
        self.works = self.post([t.detach() for t in self.mine], self.received, reverse=False)

    def tag(self, k: int, reverse: bool) -> int:
        return 2 * ((self.s * 64 + self.p) * 64 + k) + reverse


def _pieces(ring: _Ring, names: list[str], mine: list, axes: list, counted: bool):
    """A kept pass's tour: (None, this rank's tile pairs with its own keys, its blocks by
    name), then each piece of each ring step (the _Piece, this rank's tile pairs with the
    run it brings, their key tiles shifted to the run, the run by name; none where it brings
    nothing), each posted a piece ahead of its use. Every piece's transfers are finished,
    those that bring nothing too (gloo drops a send whose work is not waited on), and the
    one posted ahead where the tour is closed early."""
    r = ring.rank
    plan, pairs = _planned(ring, mine[0].shape[axes[0]], counted) if mine else ([], {})
    ahead = _Piece(ring, plan[0], names, mine, axes) if plan else None
    try:
        yield None, ring.seen(r, counted), dict(zip(names, mine))
        for n in range(len(plan)):
            piece = ahead
            ahead = _Piece(ring, plan[n + 1], names, mine, axes) if n + 1 < len(plan) else None
            visiting, (a, b) = piece.wait(), piece.into or (0, 0)
            shifted = [
                (q, Tile(k.offset - a, k.start, k.length))
                for q, k in pairs[piece.s]
                if a <= k.offset < b
            ]
            yield piece, shifted, visiting
            piece.received = []  # the run's blocks freed as its use ends
    finally:  # closed early: the piece posted ahead finished (_drained)
        _drained(ahead)


def _planned(ring: _Ring, length: int, counted: bool) -> tuple[list, dict]:
    """A kept pass's pieces, step by step and run by run: (step, piece, the run of this
    rank's block sent or None, the run received or None, counted), cut alike by the rank
    that sends and the rank that receives (`read_runs`, of the global block map); and this rank's
    tile pairs with each step's keys."""
    r, w = ring.rank, ring.world
    plan, pairs = [], {}
    for s in range(1, w):
        src, dst = (r - s) % w, (r + s) % w
        into = read_runs(ring.map.seen(r, src), length) if ring.need[r][src] else []
        out = read_runs(ring.map.seen(dst, r), length) if ring.need[dst][r] else []
        pairs[s] = ring.seen(src, counted) if into else []
        for p in range(max(len(into), len(out))):
            runs = [(run[p] if p < len(run) else None) for run in (out, into)]
            plan.append((s, p, *runs, counted))
    return plan, pairs


class _KeptPass(torch.autograd.Function):
    """One ring pass of a softmax core (tiles.FlashCore, tiles.SoftmaxCore) as one autograd
    step, FlashAttention's ring: the forward keeps no graph, only each row's merged output
    and log-sum-exp; the backward tours the ring again, each tile pair's gradients made from
    those rows (runtime/flash.py), the partial gradients of the blocks received sent back to
    their owner. `tensors`: the pass's query-side and whole reads, then the travelling
    blocks; the token chains it with the ring's other steps, as _Arrived does."""

    @staticmethod
    def forward(ctx, kept, token, *tensors):
        value, rows_lse = kept.forward(tensors)
        ctx.kept = kept
        ctx.save_for_backward(value, rows_lse, *tensors)
        ctx.set_materialize_grads(False)
        return token.clone(), value, rows_lse

    @staticmethod
    def backward(ctx, g_token, g_value, g_lse):
        value, rows_lse, *tensors = ctx.saved_tensors
        if g_value is None:
            g_value = torch.zeros_like(value)
        grads = ctx.kept.backward(tensors, (value, rows_lse, g_value, g_lse))
        return (None, g_token, *grads)


# -- the interpreter on blocks


class _Ring(Interpreter):
    """One call of a ring-split spec on this rank."""

    def __init__(self, spec: ir.Spec, plan: SequencePlan, setup: dict) -> None:
        super().__init__(**setup["interpreter"])
        self.spec, self.plan = spec, plan
        self.group, self.rank, self.world = setup["group"], setup["rank"], setup["world"]
        self.layout, self.tile = setup["layout"], setup["tile"]
        glyphs = {i.glyph: i for i in spec.indices}
        self.query = glyphs[plan.over]
        self.keys = {glyphs[g] for g in plan.indices} - {self.query}
        self.sequence = {self.query, *self.keys}
        self.rows: dict[ir.Index, np.ndarray] = {}
        self.lengths: dict[ir.Index, int] = {}  # the other indices' sizes, read once
        sizes, scalars = tuple(self.sizes.items()), tuple(self.scalars.items())
        self.map = _block_map(spec, plan, sizes, scalars, self.world, self.layout, self.tile)
        self.blocks, self.need = self.map.blocks, self.map.need
        self.pairs = {
            eq.tensor.name: eq
            for eq in spec.equations
            if _is_pair(eq.indices, self.query, self.keys)
        }
        self.schedule = ring_passes(spec, plan)  # its nodes' ids key the merged values
        self.memo: dict[int, tuple] = {}  # targets merged, by the node's id
        self.stats: dict[ir.Node, tuple] = {}
        # inside a tile pair: its query and key tiles, the blocks visiting, the pair tensors
        # computed, the ids of the reductions merged
        self.pairing = None
        self.online: ir.Reduce | None = None
        self.tile_lse = None
        # elements sent (backward too), scores, elements received from each rank (forward);
        # the tile length, and the integer inputs' bounds sent (read_ids)
        self.counts = {"sent": 0, "work": 0, "received": [0] * self.world}
        self.counts |= {"tile": self.map.tile or self.map.chunk, "bounds": 0}
        self.token = torch.zeros((), dtype=self.dtype, device=self.device, requires_grad=True)
        # bfloat16 and float16 as one process computes them (docs/language.md): tables (values
        # of positions, sizes, scalars and integer inputs alone) built and held in float32 or
        # wider, cast to the working dtype where data reads them; tile pairs and their merges
        # accumulated in float32 or wider, as a fused kernel does, cast back when merged
        self.wide = torch.promote_types(self.dtype, torch.float32)
        self.working, self.reading_data = self.dtype, False
        self.tables = {t.name for t in spec.tensors_of("input", "buffer") if t.dtype == "int"}
        for eq in spec.equations:
            if all(r.tensor.name in self.tables for r in ir.refs(eq.rhs)):
                self.tables.add(eq.tensor.name)
        self.table_nodes: dict[ir.Node, bool] = {}
        self.values = {**self.sizes, **self.scalars}  # by symbol: what tile cores bind
        self.drawn: dict[TileCore, bool] = {}  # whether each pass's dropout draws this call

    # sizes and positions: this rank's block, or the tiles of a pair

    def size(self, index: ir.Index) -> int:
        if index in self.rows:
            return len(self.rows[index])
        if index not in self.lengths:
            self.lengths[index] = super().size(index)
        return self.lengths[index]

    def fuse(self, tensor: torch.Tensor, decl: ir.Tensor) -> torch.Tensor:
        batch = tensor.shape[: tensor.dim() - len(decl.indices)]
        return tensor.reshape((*batch, *(math.prod(map(self.size, axis)) for axis in decl.layout)))

    def grid(self, index: ir.Index) -> np.ndarray:
        return self.rows[index] if index in self.rows else super().grid(index)

    def tiles_of(self, index: ir.Index, rank: int) -> list[Tile]:
        return self.map.tiles_of(index, rank)

    def own(self) -> None:
        """Every sequence index at this rank's block of its range."""
        self.rows = {
            i: np.concatenate(
                [Tile(0, a, b - a).positions for a, b in self.blocks[i.size][self.rank]]
            )
            for i in self.sequence
        }

    def read_ids(self, held: dict) -> None:
        """The block map with the integer inputs its mask compares (document ids) bounded per
        grain of positions on every rank (an all-gather of each one's bounds, in int64:
        exact), its tile chosen from them where `tile=` does not say: tile pairs between
        documents are skipped, and a rank whose queries read nothing of another's keys
        receives nothing from it."""
        reads = dict(sorted({name: index.size for name, index in self.map.ids.values()}.items()))
        if not reads or any(held[n][0].numel() == 0 for n in reads):
            return
        grain, least, greatest = self.map.grain, {}, {}
        for name, size in reads.items():
            mine = _bounds(held[name][0], grain)  # (blocks, 2)
            every = [mine] * self.world
            if self.world > 1:
                every = [torch.empty_like(mine) for _ in range(self.world)]
                dist.all_gather(every, mine, group=self.group)
                self.counts["bounds"] += mine.numel() * (self.world - 1)
            least[name], greatest[name] = _global(every, self.blocks[size], grain)
        setup = (self.spec, self.plan, self.sizes, self.scalars, self.world, self.layout)
        self.map = BlockMap(*setup, self.tile, Bounds(grain, least, greatest))
        self.need, self.counts["tile"] = self.map.need, self.map.tile or self.map.chunk

    def peer(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    # the interpreter's nodes, on blocks

    def node(self, node: ir.Node, held: dict) -> tuple:
        if self.pairing is None and id(node) in self.memo:
            return self.memo[id(node)]
        table, reader = self.table(node), self.reading_data
        self.reading_data = not table
        try:
            tensor, indices = super().node(node, held)
        finally:
            self.reading_data = reader
        if table and reader and tensor.is_floating_point():  # a table that data reads
            tensor = tensor.to(self.working)
        return tensor, indices

    def table(self, node: ir.Node) -> bool:
        if node not in self.table_nodes:
            self.table_nodes[node] = all(r.tensor.name in self.tables for r in ir.refs(node))
        return self.table_nodes[node]

    def field(self, node: ir.Field, held: dict) -> tuple:
        saved, self.dtype = self.dtype, torch.promote_types(self.dtype, torch.float32)
        try:
            return super().field(node, held)
        finally:
            self.dtype = saved

    def ref(self, node: ir.Ref, held: dict) -> tuple:
        name = node.tensor.name
        if self.pairing is None:
            return super().ref(node, held)
        q, k, visiting, cache, _ = self.pairing
        if name in self.pairs:
            if name not in cache:
                eq = self.pairs[name]
                cache[name] = (self.align(self.node(eq.rhs, held), eq.indices), eq.indices)
            if tuple(node.written) != self.pairs[name].indices:
                raise SpecError(
                    f"{self.spec.name}: {node.tensor!r} is read with other indices than it is "
                    "written with; the ring reads a pair tensor as written",
                    hint="write the reading with the same indices",
                )
            return super().ref(node, {name: cache[name]})
        tensor, indices = held[name]
        batch = tensor.dim() - len(indices)
        for axis, (declared, item) in enumerate(zip(indices, node.written)):
            if declared not in self.sequence:
                continue
            tile, source = (q, tensor) if item == self.query else (k, visiting[name])
            tensor = source.narrow(batch + axis, tile.offset, tile.length)
        if tensor.is_floating_point() and name not in self.tables:  # accumulated wide
            tensor = tensor.to(self.wide)
        return super().ref(node, {name: (tensor, indices)})

    def reduce(self, node: ir.Reduce, held: dict) -> tuple:
        over = set(node.over) & self.sequence
        if not over:
            return super().reduce(node, held)
        if self.pairing is not None and node.fn == "softmax" and over <= self.keys:
            return self.softmax(node, held)
        if self.pairing is not None and id(node) not in self.pairing[4]:
            raise SpecError(
                f"{self.spec.name}: {node.fn} over {', '.join(i.glyph for i in over)} inside "
                "a tensor along both the query and a key index has no ring merge",
                hint="give the reduction its own equation",
            )
        body = self.align(self.node(node.body, held), node.body.free)
        dims = tuple(node.body.free.index(i) - len(node.body.free) for i in node.over)
        if self.pairing is not None:  # one tile pair's part of a target, merged in `merge`
            if node.fn == "logsumexp":
                return lse(body, dims).squeeze(dims), node.free
            return LITERAL["sum" if node.fn == "mean" else node.fn](body, dims), node.free
        if node.fn == "cumsum":
            return self.prefix(body, dims[0], node.over[0]), node.free
        return self.gathered(LITERAL[node.fn](body, dims), node.fn), node.free

    def product(self, node: ir.Product, held: dict) -> tuple:
        value = super().product(node, held)
        if self.pairing is None and set(node.summed) & self.sequence:
            return self.gathered(value[0], "sum"), value[1]
        return value

    def softmax(self, node: ir.Reduce, held: dict) -> tuple:
        body = self.align(self.node(node.body, held), node.body.free)
        dims = tuple(node.body.free.index(i) - len(node.body.free) for i in node.over)
        rest = tuple(i for i in node.body.free if i not in node.over)
        if node == self.online:
            total = lse(body, dims)
            self.tile_lse = (total.squeeze(dims), rest)
        elif node.body in self.stats:
            tensor, indices = self.stats[node.body]
            q = self.pairing[0]
            axis = tensor.dim() - len(indices) + indices.index(self.query)
            row = (tensor.narrow(axis, q.offset, q.length), indices)
            total = self.align(row, node.body.free)
        else:
            raise AssertionError("a softmax without its statistics or an online merge")
        return torch.exp(body - _finite(total)), node.free

    # across ranks: gathered reductions and the exclusive scan

    def gathered(self, value: torch.Tensor, fn: str) -> torch.Tensor:
        """A reduction along this rank's block finished over every rank's (equal) blocks."""
        if self.world == 1:
            return value
        parts = _all_gather(value.unsqueeze(0), 0, self.group)
        if fn == "logsumexp":
            return lse(parts, 0).squeeze(0)
        return {"sum": torch.sum, "mean": torch.mean}.get(
            fn, torch.amax if fn == "max" else torch.amin
        )(parts, 0)

    def prefix(self, body: torch.Tensor, axis: int, index: ir.Index) -> torch.Tensor:
        """cumsum along this rank's chunks, each plus the totals of every chunk before it."""
        mine = self.blocks[index.size][self.rank]
        pieces = body.split([b - a for a, b in mine], axis)
        totals = torch.stack([p.sum(axis) for p in pieces])
        every = _all_gather(totals[None], 0, self.group) if self.world > 1 else [totals]
        starts = [a for spans in self.blocks[index.size] for a, _ in spans]
        flat = [t for ranks in every for t in ranks.unbind(0)]
        out = []
        for (a, _), piece in zip(mine, pieces):
            before = [t for s, t in zip(starts, flat) if s < a]
            carry = sum(before[1:], before[0]) if before else torch.zeros_like(totals[0])
            out.append(piece.cumsum(axis) + carry.unsqueeze(axis))
        return torch.cat(out, axis)

    # the ring passes

    def equation(self, eq: ir.Equation, held: dict) -> None:
        if eq.tensor.name in self.pairs:
            return  # computed tile pair by tile pair where read
        for each in self.schedule.get(eq.tensor.name, ()):
            self.run(each, held)
        value = self.align(self.node(eq.rhs, held), eq.indices)
        # a block held in its own axes' order: einsum returns a permuted view (a projection's
        # heads, features, positions), and the kernel would copy every tile cut from it
        held[eq.tensor.name] = (value.contiguous(), eq.indices)

    def run(self, each: RingPass, held: dict) -> None:
        """One ring pass: every target over every key tile, merged per query tile."""
        targets, online, names = list(each.targets), each.online, list(each.travels)
        tile = core(self.spec, self.plan, each)
        if kept(tile, self.values, self.training):
            return _Kept(self, tile, each).run(held)
        mine = [held[n][0] for n in names]
        online = tile.online if isinstance(tile, TileCore) else online
        merged: dict = {}
        with contextlib.closing(_tour(self, names, mine)) as tour:  # closed on an error too
            for step in tour:
                src, visiting = self.rank, dict(zip(names, mine))
                if step is not None:
                    self.token, visiting = step.arrive(self.token)
                    src = step.src
                    if not step.recv:
                        continue
                for q, k in self.seen(src):
                    if isinstance(tile, TileCore):
                        pair = functools.partial(self.compiled, tile, q, k, visiting, held)
                    else:
                        pair = functools.partial(self.pair, targets, online, q, k, visiting, held)
                    self.merge(merged, q, targets, online, checkpoint(pair, use_reentrant=False))
        for n, target in enumerate(targets):
            value, free = self.finish(n, target, merged)
            if isinstance(tile, TileCore) and getattr(target, "fn", None) == "logsumexp":
                value = _empty(value)
            self.memo[id(target)] = (value.to(self.dtype), free)
            if isinstance(target, ir.Reduce) and target.fn == "logsumexp":
                self.stats[target.body] = (value, free)  # as merged: float32 or wider
        if each.statistic is not None:
            self.statistic(each, self.merged_lse(each, merged))

    def merged_lse(self, each: RingPass, merged: dict) -> torch.Tensor:
        """The online pass's merged log-sum-exp, this rank's rows, aligned as its target
        (size 1 on the axes it lacks)."""
        free, rows = each.targets[0].free, _lse_indices(each)
        parts = [merged.get((q.offset, 0), (None, None))[1] for q in self.tiles()]
        return self.joined(parts, free, -INF, [i for i in free if i not in rows])

    def unaligned(self, each: RingPass, lse: torch.Tensor) -> tuple:
        """merged_lse's rows (or their gradient) without the axes they lack, and their
        indices: (tensor, indices)."""
        free, rows = each.targets[0].free, _lse_indices(each)
        units = tuple(n - len(free) for n, i in enumerate(free) if i not in rows)
        return lse.squeeze(units), tuple(i for i in free if i in rows)

    def statistic(self, each: RingPass, lse_rows: torch.Tensor) -> None:
        """The pass's merged log-sum-exp (merged_lse's) as the value of the logsumexp it
        stands for, and as its scores' statistics."""
        value = self.align(self.unaligned(each, lse_rows), each.statistic.free)
        self.memo[id(each.statistic)] = (value.to(self.dtype), each.statistic.free)
        self.stats[each.statistic.body] = (value, each.statistic.free)

    def seen(self, src: int, counted=True):
        """This rank's query tiles and rank `src`'s key tiles, each pair no mask hides
        (counted as computed, where `counted`: the forward)."""
        pairs = self.map.seen(self.rank, src)
        if counted:
            self.counts["work"] += sum(q.length * k.length for q, k in pairs)
        return pairs

    def pair(self, targets, online, q: Tile, k: Tile, visiting, held) -> tuple:
        saved = self.rows
        keys = {i: k.positions for i in self.keys}
        self.rows, self.online = {self.query: q.positions, **keys}, online
        self.pairing = (q, k, visiting, {}, {id(t) for t in targets})
        self.working, self.reading_data = self.wide, True
        try:
            out = [self.align(super(_Ring, self).node(t, held), t.free) for t in targets]
            if online is not None:
                out.append(self.align(self.tile_lse, targets[0].free))
            return tuple(out)
        finally:
            self.rows, self.pairing, self.online = saved, None, None
            self.working, self.reading_data = self.dtype, False

    def given(self, tile: TileCore, q: Tile, k: Tile, visiting, held, wide=True, leaves=None):
        """The tile spec's inputs for one tile pair (by ASCII name), cut to its tiles; data
        in float32 or wider where `wide`. `leaves`, where given, gets each float input's cut
        as a leaf that autograd differentiates to (by ASCII name: the leaf, its read, the
        axis cut)."""
        given = {}
        for read in tile.reads.values():
            tensor = visiting[read.name] if read.side == "k" else held[read.name][0]
            axis = None
            if read.side:
                cut = q if read.side == "q" else k
                axis = next(n for n, i in enumerate(read.tensor.indices) if i in self.sequence)
                axis += tensor.dim() - len(read.tensor.indices)
                tensor = tensor.narrow(axis, cut.offset, cut.length)
            if leaves is not None and tensor.is_floating_point():
                tensor = tensor.detach().requires_grad_()
                leaves[read.tensor.ascii] = (tensor, read, axis)
            if wide and tensor.is_floating_point() and read.name not in self.tables:
                tensor = tensor.to(self.wide)
            given[read.tensor.ascii] = tensor
        return given

    def compiled(self, tile: TileCore, q: Tile, k: Tile, visiting, held) -> tuple:
        """One tile pair through the pass's compiled tile spec (tiles.py): its targets and,
        merged online, its log-sum-exp, aligned as the targets are."""
        given, at = (
            self.given(tile, q, k, visiting, held),
            tile.given(self.sizes, self.scalars, q.start, k.start),
        )
        if tile not in self.drawn:  # read once per pass, not per tile pair
            self.drawn[tile] = tile.drops(self.values, self.training)
        if tile.softmax is not None and not self.drawn[tile]:  # scores, softmax, statistic
            out, lse_tile = tile.softmax(given, at, self.training)
            return out, self.aligned(tile, lse_tile)
        out = tile.compiled(**given, **at, training=self.training)
        out = out if isinstance(out, tuple) else (out,)
        if tile.online is None:
            return out
        return (*out[:-1], self.aligned(tile, out[-1]))

    def flashed(self, tile: TileCore, q: Tile, k: Tile, visiting, held) -> tuple:
        """One tile pair through one process's SDPA kernel with its log-sum-exp (tiles.py,
        FlashCore): in the call's dtype, as one process calls it (the kernel accumulates in
        float32), merged in float32 or wider."""
        given = self.given(tile, q, k, visiting, held, wide=False)
        at = tile.given(self.sizes, self.scalars, q.start, k.start)  # the tiles' positions
        out, lse_tile = tile.flash(given, self.values, at)
        return out.to(self.wide), self.aligned(tile, lse_tile.to(self.wide))

    def aligned(self, tile: TileCore, lse_tile: torch.Tensor) -> torch.Tensor:
        """The tile's log-sum-exp with unit axes where the target has axes it lacks."""
        for n, index in enumerate(tile.targets[0].free):  # the targets' axes (a subset, in order)
            if index not in tile.lse_free:
                lse_tile = lse_tile.unsqueeze(n - len(tile.targets[0].free))
        return lse_tile

    def merge(self, merged: dict, q: Tile, targets, online, parts: tuple) -> None:
        for n, target in enumerate(targets):
            value, key = parts[n], (q.offset, n)
            if key not in merged:
                merged[key] = (value, parts[-1] if online is not None else None)
                continue
            acc, top = merged[key]
            if online is not None:
                new = merge_lse(top, parts[-1])
                scale_old, scale_new = (
                    torch.exp(top - _finite(new)),
                    torch.exp(parts[-1] - _finite(new)),
                )
                merged[key] = (acc * scale_old + value * scale_new, new)
            elif isinstance(target, ir.Reduce) and target.fn == "logsumexp":
                merged[key] = (merge_lse(acc, value), None)
            elif isinstance(target, ir.Reduce) and target.fn in ("max", "min"):
                pick = torch.maximum if target.fn == "max" else torch.minimum
                merged[key] = (pick(acc, value), None)
            else:
                merged[key] = (acc + value, None)

    def finish(self, n: int, target: ir.Node, merged: dict) -> tuple:
        """A target's merged tiles joined along the query index into this rank's block; a
        tile that read no key at all holds the reduction of nothing."""
        free = target.free
        fn = target.fn if isinstance(target, ir.Reduce) else "sum"
        fill = {"logsumexp": -INF, "max": -INF, "min": INF}.get(fn, 0.0)
        parts = [merged.get((q.offset, n), (None,))[0] for q in self.tiles()]
        value = self.joined(parts, free, fill)
        if fn == "mean":
            value = value / int(sympy.Mul(*(i.size for i in target.over)).subs(self.sizes))
        return value, free

    def tiles(self) -> list[Tile]:
        return self.tiles_of(self.query, self.rank)

    def joined(self, parts: list, free: tuple, fill: float, units=()) -> torch.Tensor:
        """Per query tile values along `free` (None: `fill`, for a tile that read no key)
        joined along the query index; `units`: the axes held as 1."""
        shapes = [1 if i in units else self.size(i) for i in free]
        at = free.index(self.query)
        parts = [
            p
            if p is not None
            else torch.full(
                [q.length if n == at else s for n, s in enumerate(shapes)],
                fill,
                dtype=self.wide,
                device=self.device,
            )
            for p, q in zip(parts, self.tiles())
        ]
        batch = broadcast([p.shape[: p.dim() - len(free)] for p in parts])
        parts = [p.expand(*batch, *p.shape[p.dim() - len(free) :]) for p in parts]
        return torch.cat(parts, at - len(free))


class _Kept:
    """A ring pass whose tile pairs run through a softmax core that makes its gradients from
    each row's merged output and log-sum-exp (tiles.FlashCore, tiles.SoftmaxCore), run as
    one autograd step (_KeptPass): a rank keeps its own blocks and these rows, and receives
    each other rank's blocks once in the forward and once more in the backward, never all
    at once."""

    def __init__(self, ring: _Ring, tile: TileCore, each: RingPass) -> None:
        self.ring, self.tile, self.each, self.names = ring, tile, each, list(each.travels)
        reads = tile.reads.values()
        self.sides = list(dict.fromkeys(r.name for r in reads if r.side != "k"))
        self.target = each.targets[0]  # this spec's node (tile may be an equal spec's)
        self.indices: dict[str, tuple] = {}

    def run(self, held: dict) -> None:
        ring, names = self.ring, self.names
        self.indices = {n: held[n][1] for n in [*self.sides, *names]}
        tensors = [held[n][0] for n in [*self.sides, *names]]
        ring.token, value, lse_rows = _KeptPass.apply(self, ring.token, *tensors)
        ring.memo[id(self.target)] = (value.to(ring.dtype), self.target.free)
        if self.each.statistic is not None:
            ring.statistic(self.each, lse_rows)

    def split(self, tensors) -> tuple[dict, list]:
        """The held query-side and whole tensors (as the ring holds them), and the blocks
        that travel."""
        sides = len(self.sides)
        held = {n: (t, self.indices[n]) for n, t in zip(self.sides, tensors[:sides])}
        return held, list(tensors[sides:])

    def forward(self, tensors) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the target and their log-sum-exp (aligned as the target,
        float32 or wider), merged over every key tile."""
        ring, tile = self.ring, self.tile
        held, mine = self.split(tensors)
        merged: dict = {}
        pair = ring.flashed if tile.flash is not None else ring.compiled
        tour = _pieces(ring, self.names, mine, self.axes(mine), True)
        with contextlib.closing(tour):  # closed on an error too
            for _, pairs, visiting in tour:
                for q, k in pairs:
                    parts = pair(tile, q, k, visiting, held)
                    ring.merge(merged, q, [self.target], tile.online, parts)
        return ring.finish(0, self.target, merged)[0], ring.merged_lse(self.each, merged)

    def axes(self, mine: list) -> list[int]:
        """The key axis of each travelling block."""
        sequence = self.ring.sequence
        found = []
        for name, t in zip(self.names, mine):
            indices = self.indices[name]
            axis = next(a for a, i in enumerate(indices) if i in sequence)
            found.append(axis + t.dim() - len(indices))
        return found

    def backward(self, tensors, rows: tuple) -> list:
        """The gradients of `tensors` from the target's: the ring toured again, piece by
        piece, each tile pair's gradients made from the `rows`' output, log-sum-exp, and
        their gradients (the log-sum-exp's None where nothing reads it); each run received
        gets its gradients summed here, then sent back to its owner, and this rank's runs'
        arrive from the rank that read them."""
        ring, wide = self.ring, self.ring.wide
        held, mine = self.split(tensors)
        sums = {n: _fresh(t, wide) for n, (t, _) in held.items() if t.is_floating_point()}
        ours: list = []
        axes = self.axes(mine)
        with contextlib.closing(_pieces(ring, self.names, mine, axes, False)) as tour:
            for piece, pairs, visiting in tour:
                blocks = {n: _fresh(t, wide) for n, t in visiting.items() if t.is_floating_point()}
                for q, k in pairs:
                    self.pair(q, k, visiting, held, rows, sums, blocks)
                back, visiting = [blocks.get(n) for n in self.names], None
                if piece is None:  # this rank's own blocks (the first step): their sums start
                    ours = back
                    continue
                piece.received = []  # their gradients made: freed before those of ours arrive
                for n, found in enumerate(piece.returned(back, wide)):
                    if found is not None:
                        _narrow(ours[n], axes[n], piece.out).add_(found)
        made = [sums.get(n) for n in self.sides] + ours
        return [None if g is None else g.to(t.dtype) for g, t in zip(made, tensors)]

    def pair(self, q: Tile, k: Tile, visiting, held, rows, sums, blocks) -> None:
        """One tile pair's gradients added: the query-side and whole inputs' into `sums`,
        the visiting blocks' into `blocks`, at the tiles' positions."""
        ring, tile, leaves = self.ring, self.tile, {}
        free = self.target.free
        axis = -len(free) + free.index(ring.query)
        out, lse, grad, grad_lse = (
            None if t is None else t.narrow(axis, q.offset, q.length) for t in rows
        )
        lse, grad_lse = (
            None if t is None else ring.unaligned(self.each, t)[0] for t in (lse, grad_lse)
        )
        rows = (out, lse, grad, grad_lse)
        with torch.enable_grad():
            given = ring.given(tile, q, k, visiting, held, tile.flash is None, leaves)
        at = tile.given(ring.sizes, ring.scalars, q.start, k.start)
        if tile.flash is not None:  # the kernel's gradients, taken back by hand
            found = tile.flash.gradients(given, ring.values, at, rows)
        else:
            outputs, grads = tile.softmax.backward(given, at, ring.training, rows)
            wrt = [leaf for leaf, _, _ in leaves.values()]
            found = dict(zip(leaves, torch.autograd.grad(outputs, wrt, grads, allow_unused=True)))
        for name, (leaf, read, cut) in leaves.items():
            made = found.get(name)
            if made is None:
                continue
            into = blocks[read.name] if read.side == "k" else sums[read.name]
            if cut is not None:
                start = (k if read.side == "k" else q).offset
                into = into.narrow(cut, start, leaf.shape[cut])
            into.add_(made)


def _lse_indices(each: RingPass) -> set[ir.Index]:
    """The indices of an online pass's log-sum-exp: its softmax's, less those it runs over."""
    return set(each.online.body.free) - set(each.online.over)


def _bounds(ids: torch.Tensor, grain: int) -> torch.Tensor:
    """The least and greatest of integer inputs along their last axis (every batch element),
    per `grain` positions: (blocks, 2), int64."""
    flat = ids.reshape(-1, ids.shape[-1]).long().unflatten(-1, (-1, grain))
    return torch.stack((flat.amin((0, 2)), flat.amax((0, 2))), -1)


def _global(every: list[torch.Tensor], spans: list, grain: int) -> tuple[list, list]:
    """An integer input's bounds per grain of the whole sequence, in position order, from
    every rank's (blocks of its chunks, in its order), as Python integers."""
    starts = [p for ranks in spans for a, b in ranks for p in range(a, b, grain)]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    rows = torch.cat(every).tolist()  # every rank's blocks, rank after rank
    return [rows[n][0] for n in order], [rows[n][1] for n in order]


# -- one call, and the schedule without one


@functools.lru_cache(maxsize=64)
def _sizes(spec: ir.Spec, shapes: tuple, given: tuple) -> dict:
    """A call's sizes by symbol from its global shapes and the sizes given (by ASCII name),
    solved once per kind of call (with the recipe, 36 ms a call at N = 32768)."""
    return solve(spec, recipe(spec), dict(shapes), dict(given))


@functools.lru_cache(maxsize=16)
def _block_map(spec, plan, sizes: tuple, scalars: tuple, world: int, layout, tile) -> BlockMap:
    """The block map of positions alone, made once per kind of call (31 ms a call, mostly
    choosing the tile, at N = 32768 and W = 4); a call's document ids make its own
    (`_Ring.read_ids`)."""
    return BlockMap(spec, plan, dict(sizes), dict(scalars), world, layout, tile)


def forward(spec: ir.Spec, plan: SequencePlan, arguments: dict, setup: dict) -> tuple:
    """The outputs of `spec` for this rank's blocks of `arguments` (by ASCII name), and the
    run (what it sent and computed). `setup`: group, rank, world, layout, tile, the module's
    sizes and scalars, training."""
    spec = ring_form(spec, plan)  # a sink's row factor out of the sum (sequence.ring_form)
    split = dict(plan.split)
    shapes = {}
    for t in spec.arguments:
        shape = list(arguments[t.ascii].shape)
        if repr(t) in split:  # the whole sequence's length, from this rank's block
            shape[len(shape) - len(t.layout) + split[repr(t)]] *= setup["world"]
        shapes[t.ascii] = tuple(shape)
    sizes = dict(_sizes(spec, tuple(shapes.items()), tuple(setup["sizes"].items())))
    scalars = {s.symbol: float(setup["scalars"].get(s.ascii, s.value)) for s in spec.scalars}
    like = arguments[spec.like.ascii]
    run = _Ring(
        spec,
        plan,
        {
            **setup,
            "interpreter": {
                "sizes": sizes,
                "scalars": scalars,
                "dtype": like.dtype,
                "device": like.device,
                "training": setup["training"],
            },
        },
    )
    run.own()
    held = {t.name: run.unfuse(arguments[t.ascii], t) for t in spec.arguments}
    run.read_ids(held)
    for eq in spec.equations:
        run.equation(eq, held)
    batch = torch.broadcast_shapes(
        *(held[t.name][0].shape[: -len(t.indices) or None] for t in spec.tensors_of("input"))
    )
    outputs = []
    for t in spec.outputs:
        out = run.fuse(held[t.name][0], t)
        out = out.expand((*batch, *out.shape[out.dim() - len(t.shape) :]))
        if out.is_floating_point():  # a table returned: in the call's dtype
            out = out.to(run.dtype)
        outputs.append(out + 0 * run.token)  # every rank runs the ring steps' backward
    return tuple(outputs), run


def work(spec: ir.Spec, plan: SequencePlan, sizes: dict, world: int, zigzag: bool, tile=None):
    """Score elements each rank computes in one call (indexattn.sequence.ring_work), on
    zig-zag or contiguous blocks."""
    return ring_work(spec, plan, sizes, world, ZIGZAG if zigzag else CONTIGUOUS, tile)
