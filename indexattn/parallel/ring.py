"""Ring context parallelism, read off the notation: each rank keeps its queries, the key-side
blocks travel between ranks by P2P, and every reduction over a key index merges as the
sequence plan says (indexattn/parallel/sequence.py).

The equations are run by the literal interpreter (indexattn/oracle) on blocks: a tensor along
one sequence index is held for this rank's positions; a tensor along the query index and a key
index (scores, weights) is never held whole, only for one pair of tiles at a time; an equation
that reduces one over a key index is computed tile pair by tile pair and merged: a softmax by
its log-sum-exp (online, or with the row statistics of an earlier pass), sums added, maxima
compared. A cumsum along the sequence adds the totals of the chunks before (an exclusive scan
across ranks). Index variables read the global positions of each tile, so masks, rotary
angles and ALiBi distances are those of one process. A tile pair that a mask hides entirely
(read off the mask's condition, bounded on the tile's box) is not computed, and a rank whose
queries need nothing of another's keys receives nothing from it.

Imported only when used (`import indexattn.distributed`): it imports torch.distributed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import sympy
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils.checkpoint import checkpoint

from .. import ir
from ..errors import SpecError
from ..ir.boxes import holds_on_box
from ..ir.shapes import recipe, solve
from ..oracle.reference import LITERAL, Interpreter, lambdified
from .sequence import SequencePlan

INF = float("inf")
# differentiable all-gather along a new leading axis (renamed in torch 2.13)
_all_gather = (
    getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
)


# -- where each rank's positions lie


def chunks(length: int, world: int, zigzag: bool, dim: int = 1) -> list[list[tuple[int, int]]]:
    """Each rank's chunks of positions, [start, stop): one contiguous block, or (zig-zag, for a
    causal mask's balance) chunks r and 2w - 1 - r of 2w."""
    parts = 2 * world if zigzag else world
    if length % parts:
        how = f"{parts} equal chunks ({'2 per rank, zig-zag' if zigzag else 'one per rank'})"
        raise ValueError(
            f"a sequence of {length} positions (dim {dim}) does not split into {how}: "
            f"pad it to a multiple of {parts}"
        )
    c = length // parts
    if not zigzag:
        return [[(r * c, (r + 1) * c)] for r in range(world)]
    return [[(r * c, (r + 1) * c), ((parts - 1 - r) * c, (parts - r) * c)] for r in range(world)]


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


# -- which tile pairs a mask hides, read off its condition


def _seed(node: ir.Node) -> tuple[float, sympy.Basic] | None:
    """A pair tensor written as a mask: its hidden value (-inf or 0) and a condition on the
    positions under which it holds (sufficient, not necessary)."""
    if isinstance(node, ir.Field) and isinstance(node.expr, sympy.Piecewise):
        value, cond = node.expr.args[0]
        if value in (-sympy.oo, 0):
            return float(value), cond
    if isinstance(node, ir.Apply) and node.fn == "where":
        cond, yes, no = node.args
        for branch, holds in ((yes, _field_part(cond)), (no, None)):
            if isinstance(branch, ir.Field) and branch.expr in (-sympy.oo, 0):
                if holds is None and branch is no and isinstance(cond, ir.Field):
                    holds = sympy.Not(cond.expr)
                if holds is not None:
                    return float(branch.expr), holds
    return None


def _field_part(cond: ir.Node) -> sympy.Basic | None:
    """The part of a condition on positions alone: it implies the condition."""
    if isinstance(cond, ir.Field):
        return cond.expr
    if isinstance(cond, ir.Apply) and cond.fn == "or":
        parts = [p for p in map(_field_part, cond.args) if p is not None]
        return sympy.Or(*parts) if parts else None
    return None


LEAK = "leak"  # a hidden value reaches something it does not vanish in: no tile is skipped


class _Hiding:
    """Which reductions over a key index vanish where: each one's conditions."""

    def __init__(self, spec: ir.Spec, query: ir.Index, keys: set[ir.Index]) -> None:
        self.query, self.keys = query, keys
        self.hidden: dict[str, tuple[float, frozenset]] = {}
        self.sites: list[frozenset] = []  # per reduction over a key: the conditions it vanishes
        self.leak = False
        for eq in spec.equations:
            state = self.state(eq.rhs)
            if isinstance(state, tuple):
                if _is_pair(eq.indices, query, keys):
                    self.hidden[eq.tensor.name] = state
                else:
                    self.leak = True
            elif state == LEAK:
                self.leak = True

    def state(self, node: ir.Node):
        """None (clean or absorbed), LEAK, or (value, conditions): hidden there."""
        seed = _seed(node) if _is_pair(node.free, self.query, self.keys) else None
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
        over = set(getattr(node, "over", ()) or getattr(node, "summed", ())) & self.keys
        if over and self.query in _body_free(node):
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


def _is_pair(indices, query: ir.Index, keys: set[ir.Index]) -> bool:
    return query in indices and bool(keys & set(indices))


def _body_free(node: ir.Node) -> tuple[ir.Index, ...]:
    if isinstance(node, ir.Product):
        return tuple(i for f in node.factors for i in f.free)
    return node.body.free if isinstance(node, ir.Reduce) else node.free


def always(cond: sympy.Basic, box: dict) -> bool:
    """Whether `cond` holds at every point of the box (False where it cannot tell): the test
    on the box's ends (ir/boxes.py), made once per condition, run on the box's numbers."""
    order = tuple(sorted(box, key=str))
    return bool(_box_test(cond, order)(*(end for s in order for end in box[s])))


@functools.cache
def _box_test(cond: sympy.Basic, order: tuple[sympy.Symbol, ...]):
    ends = {s: (sympy.Dummy(), sympy.Dummy()) for s in order}
    return lambdified(holds_on_box(cond, ends), tuple(e for s in order for e in ends[s]))


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


def merge_lse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return lse(torch.stack((a, b)), 0).squeeze(0)


# -- P2P: a block received at one step, linked to the block sent for autograd


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A contiguous buffer for what arrives in place of `t` (gloo receives into contiguous)."""
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


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
        step = ctx.step
        back = [_fresh(t) if t.is_floating_point() else None for t in step.mine]
        if not step.send:
            back = [None] * len(step.mine)
        floats = [k for k, t in enumerate(step.mine) if t.is_floating_point()]
        given = (
            [
                grads[k] if grads[k] is not None else torch.zeros_like(step.received[k])
                for k in floats
            ]
            if step.recv
            else []
        )
        works = step.post(given, [back[k] for k in floats] if step.send else [], reverse=True)
        for work in works:
            work.wait()
        return (None, g_token, *back)


class _Step:
    """One ring step s: this rank sends its blocks to rank r + s where that rank's queries
    read them, and receives those of rank r - s where its own queries read them."""

    def __init__(self, ring: _Ring, s: int, names: list[str], mine: list[torch.Tensor]) -> None:
        r, w = ring.rank, ring.world
        self.ring, self.s = ring, s
        self.src, self.dst = (r - s) % w, (r + s) % w
        self.recv, self.send = ring.need[r][self.src], ring.need[self.dst][r]
        self.names, self.mine = names, mine
        self.received = [_fresh(t) for t in mine] if self.recv else []
        ring.counts["received"][self.src] += sum(t.numel() for t in self.received)
        out = [t.detach() for t in mine] if self.send else []
        self.works = self.post(out, self.received, reverse=False)

    def post(self, out: list, into: list, reverse: bool) -> list:
        """isend `out` to the reader and irecv `into` from the owner (the other way round,
        for gradients, when `reverse`)."""
        ring = self.ring
        to, frm = (self.src, self.dst) if reverse else (self.dst, self.src)
        works = []
        for k, tensor in enumerate(out):
            works.append(
                dist.isend(tensor.contiguous(), ring.peer(to), ring.group, self.tag(k, reverse))
            )
            ring.counts["sent"] += tensor.numel()
        for k, tensor in enumerate(into):
            works.append(dist.irecv(tensor, ring.peer(frm), ring.group, self.tag(k, reverse)))
        return works

    def tag(self, k: int, reverse: bool) -> int:
        return 2 * (self.s * 64 + k) + reverse

    def arrive(self, token: torch.Tensor) -> tuple[torch.Tensor, dict]:
        for work in self.works:
            work.wait()
        token, *received = _Arrived.apply(self, token, *self.mine)
        return token, dict(zip(self.names, received))


# -- the interpreter on blocks


class _Ring(Interpreter):
    """One call of a ring-split spec on this rank."""

    def __init__(self, spec: ir.Spec, plan: SequencePlan, setup: dict) -> None:
        super().__init__(**setup["interpreter"])
        self.spec, self.plan = spec, plan
        self.group, self.rank, self.world = setup["group"], setup["rank"], setup["world"]
        self.zigzag, self.tile = setup["zigzag"], setup["tile"]
        glyphs = {i.glyph: i for i in spec.indices}
        self.query = glyphs[plan.over]
        self.keys = {glyphs[g] for g in plan.indices} - {self.query}
        self.sequence = {self.query, *self.keys}
        self.rows: dict[ir.Index, np.ndarray] = {}
        self.blocks = {  # per sequence range: each rank's chunks
            i.size: chunks(self.size(i), self.world, self.zigzag) for i in self.sequence
        }
        self.pairs = {
            eq.tensor.name: eq
            for eq in spec.equations
            if _is_pair(eq.indices, self.query, self.keys)
        }
        self.memo: dict[int, tuple] = {}  # targets merged, by the node's id
        self.stats: dict[ir.Node, tuple] = {}
        # inside a tile pair: its query and key tiles, the blocks visiting, the pair tensors
        # computed, the ids of the reductions merged
        self.pairing = None
        self.online: ir.Reduce | None = None
        self.tile_lse = None
        # elements sent (backward too), scores, elements received from each rank (forward)
        self.counts = {"sent": 0, "work": 0, "received": [0] * self.world}
        self.token = torch.zeros((), dtype=self.dtype, requires_grad=True)
        hiding = _Hiding(spec, self.query, self.keys)
        subs = {**self.sizes, **self.scalars}
        self.sites = (  # per reduction over a key, the conditions under which it reads nothing
            None
            if hiding.leak or not hiding.sites or not all(hiding.sites)
            else [[c.subs(subs) for c in conds] for conds in hiding.sites]
        )
        self.need = [[self.needs(q, k) for k in range(self.world)] for q in range(self.world)]

    # sizes and positions: this rank's block, or the tiles of a pair

    def size(self, index: ir.Index) -> int:
        if index in self.rows:
            return len(self.rows[index])
        return super().size(index)

    def fuse(self, tensor: torch.Tensor, decl: ir.Tensor) -> torch.Tensor:
        batch = tensor.shape[: tensor.dim() - len(decl.indices)]
        return tensor.reshape((*batch, *(math.prod(map(self.size, axis)) for axis in decl.layout)))

    def grid(self, index: ir.Index) -> np.ndarray:
        return self.rows[index] if index in self.rows else super().grid(index)

    def tiles_of(self, index: ir.Index, rank: int) -> list[Tile]:
        spans = self.blocks[index.size][rank]
        return tiles(spans, self.tile or spans[0][1] - spans[0][0])

    def own(self) -> None:
        """Every sequence index at this rank's block of its range."""
        self.rows = {
            i: np.concatenate(
                [Tile(0, a, b - a).positions for a, b in self.blocks[i.size][self.rank]]
            )
            for i in self.sequence
        }

    def hides(self, q: Tile, k: Tile) -> bool:
        if self.sites is None:
            return False
        box = {self.query.symbol: (q.start, q.start + q.length - 1)}
        for key in self.keys:
            box[key.symbol] = (k.start, k.start + k.length - 1)
        return all(any(always(c, box) for c in conds) for conds in self.sites)

    def needs(self, q: int, k: int) -> bool:
        """Whether rank q's queries read anything of rank k's keys."""
        keys = next(iter(self.keys), None)
        if keys is None:
            return False
        return any(
            not self.hides(a, b)
            for a in self.tiles_of(self.query, q)
            for b in self.tiles_of(keys, k)
        )

    def peer(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    # the interpreter's nodes, on blocks

    def node(self, node: ir.Node, held: dict) -> tuple:
        if self.pairing is None and id(node) in self.memo:
            return self.memo[id(node)]
        return super().node(node, held)

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
        targets = list(self.targets(eq.rhs))
        if targets:
            self.passes(targets, held)
        value = self.node(eq.rhs, held)
        held[eq.tensor.name] = (self.align(value, eq.indices), eq.indices)

    def targets(self, node: ir.Node):
        """The outermost reductions over a key index of a value along the query index."""
        over = set(getattr(node, "over", ()) or getattr(node, "summed", ())) & self.keys
        if (
            over
            and self.query in _body_free(node)
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

    def passes(self, targets: list[ir.Node], held: dict) -> None:
        online = None
        for target in targets:
            unknown = list(
                dict.fromkeys(s for s in self.softmaxes(target, set()) if s.body not in self.stats)
            )
            if len(targets) == 1 and len(unknown) == 1 and self.linear(target, unknown[0]):
                online = unknown[0]
            elif unknown:  # statistics first: each softmax's row log-sum-exp
                self.passes([ir.Reduce("logsumexp", s.over, s.body, s.span) for s in unknown], held)
        self.run(targets, online, held)

    def run(self, targets: list[ir.Node], online: ir.Reduce | None, held: dict) -> None:
        """One ring pass: every target over every key tile, merged per query tile."""
        travel = self.travelling(targets)
        names = sorted(travel)
        mine = [held[n][0] for n in names]
        keys = next(iter(self.keys))
        merged: dict = {}
        steps = [None, _Step(self, 1, names, mine)] if self.world > 1 else [None]
        for s in range(self.world):
            if s == 0:
                src, visiting = self.rank, dict(zip(names, mine))
            else:
                step = steps[s]
                if s + 1 < self.world:
                    steps.append(_Step(self, s + 1, names, mine))
                self.token, visiting = step.arrive(self.token)
                src = step.src
                if not step.recv:
                    continue
            for q in self.tiles_of(self.query, self.rank):
                for k in self.tiles_of(keys, src):
                    if self.hides(q, k):
                        continue
                    self.counts["work"] += q.length * k.length
                    pair = functools.partial(self.pair, targets, online, q, k, visiting, held)
                    parts = checkpoint(pair, use_reentrant=False)
                    self.merge(merged, q, targets, online, parts)
        for n, target in enumerate(targets):
            value = self.finish(n, target, merged)
            self.memo[id(target)] = value
            if isinstance(target, ir.Reduce) and target.fn == "logsumexp":
                self.stats[target.body] = value

    def pair(self, targets, online, q: Tile, k: Tile, visiting, held) -> tuple:
        saved = self.rows
        keys = {i: k.positions for i in self.keys}
        self.rows, self.online = {self.query: q.positions, **keys}, online
        self.pairing = (q, k, visiting, {}, {id(t) for t in targets})
        try:
            out = [self.align(super(_Ring, self).node(t, held), t.free) for t in targets]
            if online is not None:
                out.append(self.align(self.tile_lse, targets[0].free))
            return tuple(out)
        finally:
            self.rows, self.pairing, self.online = saved, None, None

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
        free, parts = target.free, []
        fn = target.fn if isinstance(target, ir.Reduce) else "sum"
        for q in self.tiles_of(self.query, self.rank):
            if (q.offset, n) in merged:
                parts.append(merged[q.offset, n][0])
                continue
            shape = [q.length if i == self.query else self.size(i) for i in free]
            fill = {"logsumexp": -INF, "max": -INF, "min": INF}.get(fn, 0.0)
            parts.append(torch.full(shape, fill, dtype=self.dtype, device=self.device))
        batch = torch.broadcast_shapes(*(p.shape[: p.dim() - len(free)] for p in parts))
        parts = [p.expand(*batch, *p.shape[p.dim() - len(free) :]) for p in parts]
        value = torch.cat(parts, free.index(self.query) - len(free))
        if fn == "mean":
            value = value / int(sympy.Mul(*(i.size for i in target.over)).subs(self.sizes))
        return value, free

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


# -- one call, and the schedule without one


def forward(spec: ir.Spec, plan: SequencePlan, arguments: dict, setup: dict) -> tuple:
    """The outputs of `spec` for this rank's blocks of `arguments` (by ASCII name), and the
    run (what it sent and computed). `setup`: group, rank, world, zigzag, tile, the module's
    sizes and scalars, training."""
    split = dict(plan.split)
    shapes = {}
    for t in spec.arguments:
        shape = list(arguments[t.ascii].shape)
        if repr(t) in split:  # the whole sequence's length, from this rank's block
            shape[len(shape) - len(t.layout) + split[repr(t)]] *= setup["world"]
        shapes[t.ascii] = tuple(shape)
    sizes = solve(spec, recipe(spec), shapes, setup["sizes"])
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
    for eq in spec.equations:
        run.equation(eq, held)
    batch = torch.broadcast_shapes(
        *(held[t.name][0].shape[: -len(t.indices) or None] for t in spec.tensors_of("input"))
    )
    outputs = []
    for t in spec.outputs:
        out = run.fuse(held[t.name][0], t)
        out = out.expand((*batch, *out.shape[out.dim() - len(t.shape) :]))
        outputs.append(out + 0 * run.token)  # every rank runs the ring steps' backward
    return tuple(outputs), run


def work(spec: ir.Spec, plan: SequencePlan, sizes: dict, world: int, zigzag: bool, tile=None):
    """Score elements each rank computes in one pass over the keys (the tile pairs no mask
    hides), at `sizes` (ASCII name -> value, scalars included): equal on every rank when the
    split balances the mask."""
    values = {s: sizes[a] for s, a in spec.size_names.items() if a in sizes}
    scalars = {s.symbol: float(sizes.get(s.ascii, s.value)) for s in spec.scalars}
    setup = {"group": None, "rank": 0, "world": world, "zigzag": zigzag, "tile": tile}
    interpreter = {"sizes": values, "scalars": scalars, "dtype": torch.float64}
    run = _Ring(
        spec, plan, {**setup, "interpreter": {**interpreter, "device": "cpu", "training": False}}
    )
    keys = next(iter(run.keys))
    return [
        sum(
            q.length * k.length
            for q in run.tiles_of(run.query, r)
            for src in range(world)
            for k in run.tiles_of(keys, src)
            if not run.hides(q, k)
        )
        for r in range(world)
    ]
