"""A ring pass's tile pair as a spec of its own, compiled: the spec's compiled core (the
blocked path on a CPU) on one query tile and one key tile at their global positions.

The tile spec is printed from the IR (indexattn.ir.printer): the query index ranges over the
tile's queries, every key index over the tile's keys; the tensors the pass reads along one
sequence index (keys and values, the query side, a row statistic) and the whole ones (a sink's
logit) are its inputs, each read at the key index its own input; the equations along both the
query and a key index (scores, masks, weights) are the spec's own; index variables read as
numbers are shifted by two scalars, the tiles' first global positions, so that masks and
positions are those of one process. Its outputs are the pass's targets on the tile pair and,
for a softmax merged online, the tile's log-sum-exp of its scores: what the ring merges.
A pass this form cannot take (a reduction other than a sum, log-sum-exp, max or min; a
softmax read non-linearly; a position computed from a tensor) has no core: the ring names it
in `plan_lines` and runs it through the literal interpreter (ring.py). Where the tile spec's
core is SDPA's (`FlashCore`), or its target softmax(scores) · V (`SoftmaxCore`), the ring
calls that faster form instead (runtime/flash.py).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import sympy
import torch

from .. import ir
from ..errors import SpecError
from ..ir.printer import field, text
from ..runtime.compiled import CompiledSpec, broadcast, compile_spec
from .sequence import (
    RingPass,
    SequencePlan,
    always,
    dropped,
    exact,
    hidden_where,
    pair,
    ring_form,
    ring_passes,
)

OFFSETS = ("ring_q0", "ring_k0")  # the tiles' first global positions: scalars of the tile spec
SIZES = ("ring_nq", "ring_nk")  # the tiles' lengths
LSE_OUT = "ring_lse"
ZERO = "ring_zero"  # a mask spec's float input along the key: its dtype and device
FLOOR = 1e30  # below any score, above float32's least: exp(-FLOOR - x) is 0
MERGED = ("sum", "logsumexp", "max", "min")


class TileSpec(CompiledSpec):
    """A tile spec, compiled: a pass calls it once per tile pair, at the tiles' positions
    (scalars), and keeps each kind of call solved, with its tables, for the next pairs and the
    backward's (a window's few distances, TileCore.given)."""

    shapes = 64


def _compiled(text: str, name: str) -> TileSpec:
    return compile_spec(text, name=name, kind=TileSpec)


class Refused(Exception):
    """Why a ring pass has no compiled tile core."""


@dataclasses.dataclass(frozen=True)
class Read:
    """One input of the tile spec: the ring's tensor `name`, cut to the query tile ("q"), to
    the key tile ("k") or passed whole (""), declared unfused as `tensor`."""

    name: str
    side: str
    tensor: ir.Tensor


class TileCore:
    """The compiled tile spec of one ring pass, and how the ring calls it."""

    def __init__(self, spec: ir.Spec, plan: SequencePlan, each: RingPass) -> None:
        glyphs = {i.glyph: i for i in spec.indices}
        self.spec, self.query = spec, glyphs[plan.over]
        self.keys = {glyphs[g] for g in plan.indices} - {self.query}
        self.pairs = {
            eq.tensor.name: eq for eq in spec.equations if pair(eq.indices, self.query, self.keys)
        }
        self.reads: dict[tuple, Read] = {}
        self.shift = {self.query.symbol: self.query.symbol + sympy.Symbol(OFFSETS[0])}
        self.shift.update({k.symbol: k.symbol + sympy.Symbol(OFFSETS[1]) for k in self.keys})
        self.targets = each.targets
        self.online = self._online(each)
        self.text = self._text()
        self.compiled = _compiled(self.text, f"{spec.name}_ring_tile")
        self.dropouts = tuple(
            n.args[1].expr if isinstance(n.args[1], ir.Field) else None
            for eq in self.compiled.ir.equations
            for n in ir.walk(eq.rhs)
            if isinstance(n, ir.Apply) and n.fn == "dropout"
        )  # each dropout's probability (None: computed from tensors)
        self.relative = _offsets_relative(self.compiled.ir)
        self.flash = flash_core(self)
        self.softmax = softmax_core(self) if self.flash is None else None

    # what the pass reads

    def _chain(self) -> list[ir.Equation]:
        """The pair equations the targets read, in the spec's order."""
        seen, stack = set(), list(self.targets)
        while stack:
            for r in ir.refs(stack.pop()):
                if r.tensor.name in self.pairs and r.tensor.name not in seen:
                    seen.add(r.tensor.name)
                    stack.append(self.pairs[r.tensor.name].rhs)
        return [eq for eq in self.spec.equations if eq.tensor.name in seen]

    def _online(self, each: RingPass) -> ir.Reduce | None:
        """The softmax merged online: the schedule's, or the one softmax a single target reads
        linearly whose statistics an earlier pass found (merged online all the same)."""
        for target in self.targets:
            if isinstance(target, ir.Reduce) and target.fn not in MERGED:
                raise Refused(f"{target.fn} over a key index merges only in the interpreter")
        found = [
            n
            for eq in self._chain()
            for n in ir.walk(eq.rhs)
            if isinstance(n, ir.Reduce) and n.fn == "softmax" and set(n.over) & self.keys
        ]
        found += [
            n
            for t in self.targets
            for n in ir.walk(t)
            if isinstance(n, ir.Reduce) and n.fn == "softmax"
        ]
        found = list(dict.fromkeys(found))
        if not found:
            return None
        if each.online is not None:
            return each.online
        from .sequence import _Schedule

        linear = _Schedule.linear
        if len(self.targets) == 1 and len(found) == 1:
            schedule = _Schedule.__new__(_Schedule)
            schedule.pairs = self.pairs
            if linear(schedule, self.targets[0], found[0]):
                return found[0]
        raise Refused("a softmax over the keys read other than linearly by one target")

    # the tile spec's text

    def _text(self) -> str:
        equations = [
            f"{eq.tensor.name}_<{_glyphs(eq.indices)}> = {text(self._node(eq.rhs))}"
            for eq in self._chain()
        ]
        outputs = []
        for n, target in enumerate(self.targets):
            outputs.append(f"ring_out{n}")
            value = (
                _lse(target.over, text(self._node(target.body)))
                if isinstance(target, ir.Reduce) and target.fn == "logsumexp"
                else text(self._node(target))
            )
            equations.append(f"ring_out{n}_<{_glyphs(target.free)}> = {value}")
        if self.online is not None:
            rest = [i for i in self.targets[0].free if i in self.online.body.free]
            rest = [i for i in rest if i not in self.online.over]
            body = text(self._node(self.online.body))
            equations.append(f"{LSE_OUT}_<{_glyphs(rest)}> = {_lse(self.online.over, body)}")
            outputs.append(LSE_OUT)
            self.lse_free = tuple(rest)
        lines = [self._index(i) for i in self.spec.indices]
        for read in self.reads.values():
            kind = " : int" if read.tensor.dtype == "int" else ""
            lines.append(f"input {read.tensor!r}{kind}")
        lines += [f"scalar {s.name} = {s.value!r}" for s in self.spec.scalars]
        lines += [f"scalar {size} = 0" for size in self._sequence_sizes()]  # read as numbers
        lines += [f"scalar {name} = 0" for name in OFFSETS]
        return "\n".join([*lines, *equations, "output " + ", ".join(outputs)]) + "\n"

    def _sequence_sizes(self) -> list[sympy.Symbol]:
        """The sizes of the sequence indices that no other index has (N in `- log(N)`): the
        tile spec's own sequence indices range over a tile, so each is a scalar there."""
        sequence = {self.query, *self.keys}
        sized = {s for i in self.spec.indices if i not in sequence for s in i.size.free_symbols}
        found = {s for i in sequence for s in i.size.free_symbols} - sized
        return sorted(found, key=str)

    def _index(self, index: ir.Index) -> str:
        if index == self.query:
            return f"index {index.glyph} : {SIZES[0]}"
        if index in self.keys:
            return f"index {index.glyph} : {SIZES[1]}"
        return f"index {index.glyph} : {field(index.size)}"

    def _node(self, node: ir.Node) -> ir.Node:
        """The node with its index variables at global positions and its tensors' reads the
        tile spec's inputs."""
        if isinstance(node, ir.Field):
            return dataclasses.replace(node, expr=node.expr.subs(self.shift, simultaneous=True))
        if isinstance(node, ir.Ref):
            return self._ref(node)
        inner = tuple(self._node(c) for c in ir.children(node))
        if isinstance(node, ir.Product):
            return dataclasses.replace(node, factors=inner)
        if isinstance(node, ir.Sum):
            return dataclasses.replace(node, terms=inner)
        if isinstance(node, ir.Apply):
            return dataclasses.replace(node, args=inner)
        if isinstance(node, ir.Reduce):
            return dataclasses.replace(node, body=inner[0])
        raise Refused(f"a {type(node).__name__.lower()} in a tile pair")

    def _ref(self, node: ir.Ref) -> ir.Ref:
        t = node.tensor
        if t.name in self.pairs:
            return node
        items = tuple(i for axis in node.axes for i in axis)
        if not all(isinstance(i, ir.Index) for i in items):
            raise Refused(f"{t.name} read at a literal or computed position")
        sides = {"q" if i == self.query else "k" for i in items if i in self.keys | {self.query}}
        if len(sides) > 1:
            raise Refused(f"{t.name} read along the query and a key index at once")
        side = next(iter(sides), "")
        key = (t.name, items)
        if key not in self.reads:
            name = f"{t.ascii}_ring{len(self.reads)}"
            layout = tuple((i,) for i in items)
            declared = ir.Tensor(name, name, "input", layout, t.batched, dtype=t.dtype)
            self.reads[key] = Read(t.name, side, declared)
        declared = self.reads[key].tensor
        return dataclasses.replace(node, tensor=declared, axes=declared.layout)

    def drops(self, values: dict, training: bool) -> bool:
        """Whether a call draws random numbers (made again, they would differ): in training,
        a dropout whose probability is not 0 at the call's sizes and scalars (by symbol)."""
        return training and any(_drawn(p, values) for p in self.dropouts)

    def given(self, sizes: dict, scalars: dict, q0: int, k0: int) -> dict:
        """The tile spec's sizes and scalars for one call (by ASCII name): the spec's, and the
        tiles' first global positions; where the tile spec reads them only as their distance
        (a window, causal, ALiBi), the distance: tile pairs as far apart are one kind of call,
        their tables made once (TileSpec)."""
        if self.relative:
            q0, k0 = q0 - k0, 0
        return {
            **self._fixed(tuple(sizes.items()), tuple(scalars.items())),
            OFFSETS[0]: q0,
            OFFSETS[1]: k0,
        }

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a few sizes per core, kept with it)
    def _fixed(self, sizes: tuple, scalars: tuple) -> dict:
        """The spec's sizes and scalars, by ASCII name (made once per call's sizes)."""
        sizes, scalars = dict(sizes), dict(scalars)
        found = {
            self.spec.size_ascii(i.size): int(i.size.subs(sizes))
            for i in self.spec.indices
            if i != self.query and i not in self.keys and isinstance(i.size, sympy.Symbol)
        }
        found.update({s.ascii: scalars[s.symbol] for s in self.spec.scalars})
        found.update({self.spec.size_ascii(s): int(sizes[s]) for s in self._sequence_sizes()})
        return found


def _offsets_relative(spec: ir.Spec) -> bool:
    """Whether the tile spec reads the tiles' first positions only as their difference: every
    number it computes from positions is a function of q0 − k0 (its fields are where they
    enter, TileCore._node)."""
    symbols = {s.ascii: s.symbol for s in spec.scalars}
    q0, k0 = (symbols[name] for name in OFFSETS)
    fields = {n.expr for eq in spec.equations for n in ir.walk(eq.rhs) if isinstance(n, ir.Field)}
    return all(_by_distance(e, q0, k0) for e in fields if e.free_symbols & {q0, k0})


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: its caches, per tile pair
class FlashCore:
    """A tile pair whose core one process runs through `F.scaled_dot_product_attention`
    (lower/planner/fusion.py's `find_attention` matches the tile spec's output, the log-sum-exp
    left out): run by the same kernel with its log-sum-exp (runtime/flash.py), the mask made
    from its keep predicate on the tiles' positions. Each operand: its tile spec input (ASCII
    name) and where its axes go, (heads, groups, position, features)."""

    q: tuple[str, tuple[int, ...]]
    k: tuple[str, tuple[int, ...]]
    v: tuple[str, tuple[int, ...]]
    groups: int  # axes of query heads that share a key head
    scale: sympy.Basic
    keep: sympy.Basic | None  # in the tile spec's τ, τ' and OFFSETS; None: every key seen
    positions: tuple[sympy.Symbol, sympy.Symbol]  # the tile spec's query and key symbols
    offsets: tuple[sympy.Symbol, sympy.Symbol]  # its OFFSETS' symbols
    out: tuple[int, ...]  # the target's axes in the kernel's (heads, groups, query, width)
    lse: tuple[int, ...]  # the tile log-sum-exp's in the kernel's (heads, groups, query)
    terms: Terms | None = None  # the scores' mask read from integer inputs (document ids)

    def __call__(self, given: dict, values: dict, at: dict) -> tuple:
        """(the target, the tile's log-sum-exp) of one tile pair: `given` the tile spec's
        inputs by ASCII name, `values` its sizes and scalars by symbol, `at` by ASCII name
        with the tiles' first positions (TileCore.given)."""
        from ..runtime.flash import attention_lse

        (q, k, v), lead = self.operands(given)
        out, lse = attention_lse(q, k, v, *self.arguments(given, values, at, q, k, lead))
        out, lse = out.reshape(*lead, *out.shape[-2:]), lse.reshape(*lead, lse.shape[-1])
        return _moved(out, self.out), _moved(lse, self.lse)

    def gradients(self, given: dict, values: dict, at: dict, rows: tuple) -> dict:
        """One tile pair's part of the gradients of its q, k and v (by ASCII name, each in
        its input's layout; an input read as two of them gets both), from the rows' merged
        output, log-sum-exp, the output's gradient and the log-sum-exp's (or None) (`rows`,
        in the target's and the tile log-sum-exp's layouts; runtime/flash.py,
        attention_grads), taken back through `operands` by hand (its broadcast summed, its
        axes moved back): no autograd graph per tile pair."""
        from ..runtime.flash import attention_grads, dense

        operands, lead = self.operands(given)
        out, lse, grad, grad_lse = rows
        out, grad = (_kernel(t, self.out, lead, 2) for t in (out, grad))
        lse, grad_lse = (
            None if t is None else _kernel(t, self.lse, lead, 1) for t in (lse, grad_lse)
        )
        q, k, v = (dense(t) for t in operands)
        arguments = self.arguments(given, values, at, q, k, lead)
        made = attention_grads(grad, q, k, v, out, lse, *arguments, grad_lse=grad_lse)
        found: dict = {}
        for (name, axes), g, groups in zip((self.q, self.k, self.v), made, (0, 1, 1)):
            g = _pulled(g, given[name], axes, lead, groups * self.groups)
            found[name] = found[name] + g if name in found else g  # K = V, or Q = K = V
        return found

    def operands(self, given: dict) -> tuple:
        """The kernel's q, k and v, (-1, 1, positions, features), from the tile spec's inputs,
        and the leading shape they were flattened from."""
        q, k, v = (_moved(given[name], axes) for name, axes in (self.q, self.k, self.v))
        k, v = (t[(..., *[None] * self.groups, slice(None), slice(None))] for t in (k, v))
        lead = broadcast([t.shape[:-2] for t in (q, k, v)])
        if self.terms is not None:  # ids with a batch the queries lack: the output has it
            heads = [1] * (len(self.q[1]) - 2)  # the axes after the batch: heads, groups
            lead = broadcast([lead, (*self.terms.batch(given), *heads)])
        operands = (t.expand(*lead, -1, -1).reshape(-1, 1, *t.shape[-2:]) for t in (q, k, v))
        return tuple(operands), lead

    def arguments(self, given: dict, values: dict, at: dict, q, k, lead) -> tuple:
        """The kernel's mask, causal flag and scale for one tile pair (`values` by symbol,
        `at` by ASCII name)."""
        keep = self.keep if self.terms is None else self.terms.constant(given)
        keep, scale = self.bound(keep, tuple(values.items()))
        if self.terms is not None and keep is None:
            tiles = (q.shape[-2], k.shape[-2])
            return self.terms(given, at, lead, q.dtype, tiles), False, scale
        q0, k0 = (at[name] for name in OFFSETS)
        mask, causal = self.mask(keep, q0, q.shape[-2], k0, k.shape[-2], q.dtype, q.device)
        return mask, causal, scale

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a few sizes per core, kept with it)
    def bound(self, keep: sympy.Basic | None, values: tuple) -> tuple:
        """The keep predicate at global positions (the tiles' offsets added) and the scale,
        at these sizes and scalars (by symbol)."""
        values = {k: exact(v) for k, v in values}
        if keep is not None:
            (q, k), (q0, k0) = self.positions, self.offsets
            keep = keep.subs(values).subs({q: q - q0, k: k - k0}, simultaneous=True)
        return keep, float(self.scale.subs(values))

    def mask(self, keep, q0: int, nq: int, k0: int, nk: int, dtype, device):
        """(additive mask or None, causal) for one tile pair: None where the keep predicate
        holds on the whole box (sequence.always, as the block map bounds it), causal where
        it is the lower triangle of a diagonal tile. A predicate of q − k alone (a window)
        is read at the tiles' distance: tile pairs as far apart share one mask."""
        if keep is None:
            return None, False
        if _relative(keep, self.positions):
            q0, k0 = q0 - k0, 0
        kind = _kind(keep, self.positions, q0, nq, k0, nk)
        if kind != "mask":
            return None, kind == "causal"
        if nq * nk > SHARED:
            return _additive(keep, self.positions, (q0, nq, k0, nk), dtype, device), False
        return _shared(keep, self.positions, (q0, nq, k0, nk), dtype, device), False


SHARED = 2**20  # a tile pair's mask of up to this many elements is kept for the next pairs


def _additive(keep: sympy.Basic, positions: tuple, box: tuple, dtype, device) -> torch.Tensor:
    """The tile pair's additive mask: 0 where its query sees the key, else −∞."""
    seen = torch.from_numpy(~_seen(keep, positions, *box)).to(device)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(seen, -torch.inf)


_shared = functools.lru_cache(maxsize=8)(_additive)  # a window's few distances, both passes


@functools.lru_cache(maxsize=256)
def _relative(keep: sympy.Basic, positions: tuple) -> bool:
    """Whether the keep predicate reads its query and key positions alone, and only as q − k
    (a window's, causal's)."""
    return keep.free_symbols <= set(positions) and _by_distance(keep, *positions)


@functools.lru_cache(maxsize=256)
def _by_distance(expr: sympy.Basic, a: sympy.Symbol, b: sympy.Symbol) -> bool:
    """Whether `expr` reads `a` and `b` only as a − b: with a = b + d, each comparison's sides
    differ by a function of d and the rest, comparisons aside, is free of b."""
    moved = expr.subs(a, b + sympy.Dummy("distance"))
    comparisons = moved.atoms(sympy.core.relational.Relational)
    if any(b in sympy.expand(c.lhs - c.rhs).free_symbols for c in comparisons):
        return False
    rest = moved.xreplace({c: sympy.Dummy() for c in comparisons})
    return b not in (sympy.expand(rest) if isinstance(rest, sympy.Expr) else rest).free_symbols


@functools.lru_cache(maxsize=4096)
def _kind(keep: sympy.Basic, positions: tuple, q0: int, nq: int, k0: int, nk: int) -> str:
    """ "all" where the keep predicate holds on the tile pair's whole box, "causal" where it is
    the lower triangle of a diagonal tile, else "mask": read once per tile pair (a ring's
    backward asks again)."""
    q, k = positions
    if always(keep, {q: (q0, q0 + nq - 1), k: (k0, k0 + nk - 1)}):
        return "all"
    if nq != nk:
        return "mask"
    keys = np.arange(nk)[None, :]
    for start in range(0, nq, ROWS):  # by blocks of rows: a tile of 8192 is 64 MB a grid
        rows = min(ROWS, nq - start)
        seen = _seen(keep, positions, q0 + start, rows, k0, nk)
        if not np.array_equal(seen, keys <= np.arange(start, start + rows)[:, None]):
            return "mask"
    return "causal"


ROWS = 256  # rows of a tile pair's grid compared at once


def _seen(keep: sympy.Basic, positions: tuple, q0: int, nq: int, k0: int, nk: int):
    """Which keys each query of the tile pair sees: a boolean (nq, nk) array. Both grids are
    whole: numpy's logical_or.reduce, as lambdify writes `or`, stacks its terms, and a term of
    the keys alone (a prefix's k < P) would not stack beside one of both."""
    grids = np.broadcast_arrays(np.arange(q0, q0 + nq)[:, None], np.arange(k0, k0 + nk)[None, :])
    return np.broadcast_to(_grid(keep, positions)(*grids), (nq, nk))


@functools.lru_cache(maxsize=64)
def _grid(keep: sympy.Basic, positions: tuple):
    return sympy.lambdify(positions, keep, modules="numpy")


@dataclasses.dataclass(frozen=True, eq=False)
class Terms:
    """The additive mask of a FlashCore's scores where it reads integer inputs (document ids,
    `where(D_<τ> != D_<τ'>, -inf, 0)`): the tile spec's equations up to its terms, compiled,
    their sum on the tile pair's (query, key) grid."""

    compiled: object  # the mask's spec, compiled (indexattn.runtime.compiled.CompiledSpec)
    inputs: tuple[tuple[str, int], ...]  # the tile spec's inputs it reads: ASCII name, indices
    # which keys a query sees, on positions (as FlashCore.keep) and a symbol per integer
    # input read, by ASCII name; None where a term is not a mask of −∞ and 0 named whole
    keep: sympy.Basic | None = None
    ids: tuple[tuple[sympy.Symbol, str], ...] = ()

    def constant(self, given: dict) -> sympy.Basic | None:
        """The keep predicate on positions alone where each integer input the mask reads is
        one number over its tile (a tile pair inside one document): that number put in; else
        None."""
        if self.keep is None:
            return None
        values = []
        for symbol, name in self.ids:
            least, greatest = (int(v) for v in torch.aminmax(given[name]))
            if least != greatest:
                return None
            values.append((symbol, least))
        return _put(self.keep, tuple(values))

    def batch(self, given: dict) -> tuple[int, ...]:
        """The batch axes of the inputs the mask reads (theirs broadcast together)."""
        return broadcast([given[n].shape[: given[n].dim() - k] for n, k in self.inputs])

    def __call__(self, given: dict, at: dict, lead: tuple, dtype, tiles: tuple[int, int]):
        """The kernel's mask for one tile pair, (pairs, 1, queries, keys) in `dtype`, its
        batch axes broadcast over `lead` (the operands' axes before position and features),
        `tiles` the query and key tiles' lengths (a mask may read one side alone); None where
        it hides nothing and adds nothing."""
        zero = next(iter(given.values())).new_zeros((), dtype=dtype)  # the mask's dtype
        reads = {n: given[n] for n, _ in self.inputs}
        lengths = dict(zip(SIZES, tiles))
        mask = self.compiled(**reads, **{ZERO: zero.expand(tiles[1])}, **at, **lengths)
        if not bool(mask.any()):
            return None
        batch = mask.dim() - 2
        mask = mask.reshape(*mask.shape[:batch], *[1] * (len(lead) - batch), *mask.shape[-2:])
        return mask.expand(*lead, *mask.shape[-2:]).reshape(-1, 1, *mask.shape[-2:])


def _terms(tile: TileCore, m) -> Terms:
    """The Terms of a matched core's scores (lower/planner/fusion.py's match `m`), or Refused:
    a 2-d mask of the query and the key, read from integer inputs alone (the kernel gives no
    gradient to a mask)."""
    spec = tile.compiled.ir
    if any(not set(t.free) <= {m.query, m.key} for t in m.terms):
        raise Refused("a mask along more than the query and the key")
    needed = list(dict.fromkeys(eq for t in m.terms for eq in _reaching(spec, t)))
    lines, inputs = _sub_spec(tile, needed, m.terms)
    if any(t.dtype != "int" for t in inputs):
        raise Refused("a mask read from float tensors, which the kernel cannot differentiate")
    terms = " + ".join(text(t) for t in m.terms)
    key = m.key.glyph
    lines.insert(len(lines) - len(needed), f"input {ZERO}_<{key}>")  # a spec's dtype: a float's
    lines += [
        f"ring_mask_<{_glyphs((m.query, m.key))}> = {terms} + {ZERO}_<{key}>",
        "output ring_mask",
    ]
    try:
        compiled = _compiled("\n".join(lines) + "\n", f"{tile.spec.name}_ring_mask")
    except SpecError as why:
        raise Refused(str(why).splitlines()[0]) from why
    reads = tuple((t.ascii, len(t.indices)) for t in inputs)
    return Terms(compiled, reads, *_named_keep(spec, m))


def _named_keep(spec: ir.Spec, m) -> tuple[sympy.Basic | None, tuple]:
    """Which keys a query sees where every term of the scores is a mask of −∞ and 0 named
    whole (sequence.hidden_where), on positions and the integer inputs' symbols, with those
    symbols by ASCII name; (None, ()) otherwise."""
    eqs, found, hidden = {eq.tensor.name: eq for eq in spec.equations}, {}, []
    for term in m.terms:
        while isinstance(term, ir.Ref) and term.tensor.name in eqs:
            if term.written != eqs[term.tensor.name].indices:
                return None, ()
            term = eqs[term.tensor.name].rhs
        hidden.append(hidden_where(term, frozenset({m.query, m.key}), found))
    if None in hidden:
        return None, ()
    ascii = {t.name: t.ascii for t in spec.tensors_of("input")}
    return sympy.Not(sympy.Or(*hidden)), tuple((s, ascii[n]) for s, (n, _) in found.items())


@functools.lru_cache(maxsize=256)
def _put(keep: sympy.Basic, values: tuple) -> sympy.Basic:
    return keep.subs(dict(values))


def _sub_spec(tile: TileCore, needed: list, nodes) -> tuple[list[str], list[ir.Tensor]]:
    """The tile spec's declarations (indices, scalars) and the inputs that `needed`
    equations and `nodes` read, as lines of a spec of their own, then those equations; and
    those inputs."""
    spec = tile.compiled.ir
    names = {r.tensor.ascii for eq in needed for r in ir.refs(eq.rhs)}
    names |= {r.tensor.ascii for node in nodes for r in ir.refs(node)}
    inputs = [t for t in spec.tensors_of("input") if t.ascii in names]
    lines = [ln for ln in tile.text.splitlines() if not ln.startswith(("input", "output"))]
    lines = [ln for ln in lines if "=" not in ln or ln.startswith("scalar")]
    lines += [f"input {t!r}" + (" : int" if t.dtype == "int" else "") for t in inputs]
    lines += [f"{eq.tensor.name}_<{_glyphs(eq.indices)}> = {text(eq.rhs)}" for eq in needed]
    return lines, inputs


def flash_core(tile: TileCore) -> FlashCore | None:
    """The tile's core as one process's SDPA kernel takes it, or None: an online-merged
    pass of one target that is softmax(scale · q·k + masks of positions or integer inputs) · v,
    as written, one feature axis, a dropout only as TileCore.drops allows."""
    from ..lower.planner.fusion import find_attention

    if tile.online is None or len(tile.targets) != 1:
        return None
    spec = tile.compiled.ir
    core = dataclasses.replace(
        spec,
        equations=tuple(eq for eq in spec.equations if eq.tensor.name != LSE_OUT),
        outputs=tuple(t for t in spec.outputs if t.name != LSE_OUT),
    )
    found = [m for m in find_attention(core) if m.output.tensor.name == "ring_out0"]
    if len(found) != 1:
        return None
    m = found[0]
    keep = m.keep if isinstance(m.keep, sympy.Basic) else None
    plain = m.whole and len(m.q) == 1 and len(m.widths[0]) == 1  # dropout: TileCore.drops
    if not plain or not _refs(m.q[0], m.k[0], m.v):
        return None
    name = dict(m.rename)
    heads, rows, width = list(m.heads), [*m.heads, *m.groups, m.query], m.widths[0][0]
    kernel = [name.get(i, i).glyph for i in rows]
    target = _target_glyphs(tile)
    lse = [i.glyph for i in tile.lse_free]
    try:
        return FlashCore(
            q=_operand(m.q[0], [*rows, width]),
            k=_operand(m.k[0], [*heads, m.key, width]),
            v=_operand(m.v, [*(name[i] for i in heads), name[m.key], m.value_width]),
            groups=len(m.groups),
            scale=m.scale,
            keep=keep,
            positions=(m.query.symbol, m.key.symbol),
            offsets=tuple(next(s.symbol for s in spec.scalars if s.name == o) for o in OFFSETS),
            out=_order([*kernel, m.value_width.glyph], target),
            lse=_order(kernel, lse),
            terms=_terms(tile, m) if m.terms and keep is None else None,
        )
    except Refused:
        return None


class SoftmaxCore:
    """A tile pair whose target is softmax_<τ'>(scores) · V, its core not SDPA's (a soft cap):
    the scores by a tile spec of their own (the tile spec's equations up to them, compiled),
    then the softmax, its product and the log-sum-exp in one step (runtime/flash.py,
    `softmax_values_lse`: one exponential of the scores, no second pass for the statistic)."""

    def __init__(self, tile: TileCore, body: ir.Node, values: ir.Ref, key: ir.Index) -> None:
        spec, free = tile.compiled.ir, body.free
        heads = [i for i in free if i != key and i.glyph != tile.query.glyph]
        rows = [*heads, next(i for i in free if i.glyph == tile.query.glyph)]
        width = [a[0] for a in values.axes if a[0] not in free]
        if len(width) != 1 or not {a[0] for a in values.axes} - {*width} <= {*heads, key}:
            raise Refused("values with an axis the scores lack")
        needed = _reaching(spec, body)
        lines, _ = _sub_spec(tile, needed, [body])
        written = isinstance(body, ir.Ref) and any(eq.tensor == body.tensor for eq in needed)
        if written and body.written == body.tensor.indices:
            lines.append(f"output {body.tensor.name}")  # the scores as their equation writes
        else:
            lines += [f"ring_scores_<{_glyphs(free)}> = {text(body)}", "output ring_scores"]
        self.text = "\n".join(lines) + "\n"
        self.compiled = _compiled(self.text, f"{tile.spec.name}_ring_scores")
        self.inputs = {t.ascii for t in self.compiled.ir.tensors_of("input")}
        self.scores = _order([i.glyph for i in free], [*(i.glyph for i in rows), key.glyph])
        present = {a[0].glyph for a in values.axes}
        self.values = (
            values.tensor.ascii,
            _order(
                [a[0].glyph for a in values.axes],
                [*(h.glyph for h in heads if h.glyph in present), key.glyph, width[0].glyph],
            ),
        )
        self.units = tuple(slice(None) if h.glyph in present else None for h in heads)
        self.out = _order([*(i.glyph for i in rows), width[0].glyph], _target_glyphs(tile))
        self.lse = _order([i.glyph for i in rows], [i.glyph for i in tile.lse_free])

    def __call__(self, given: dict, at: dict, training: bool) -> tuple:
        """(the target, the tile's log-sum-exp) of one tile pair: `given` the tile spec's
        inputs by ASCII name, `at` its sizes and scalars (TileCore.given)."""
        from ..runtime.flash import softmax_values_lse

        scores = self.compiled(
            **{n: t for n, t in given.items() if n in self.inputs}, **at, training=training
        )
        name, axes = self.values
        values = _moved(given[name], axes)[(..., *self.units, slice(None), slice(None))]
        out, lse = softmax_values_lse(_moved(scores, self.scores), values)
        return _moved(out, self.out), _moved(lse, self.lse)

    def backward(self, given: dict, at: dict, training: bool, rows: tuple) -> tuple:
        """What to differentiate for one tile pair's part of the gradients, and its
        gradients, from the rows' merged output O, log-sum-exp L and the output's gradient
        dO (`rows`, in the target's and the tile log-sum-exp's layouts, and the log-sum-exp's
        gradient dL, or None: it enters D as D − dL): the scores made
        again under autograd, P = exp(S − L), and (P V, Σ P) against (dO, −D),
        D = rowsum(dO ∘ O), whose gradients are dV = Pᵀ dO and dS = P ∘ (dO Vᵀ − D)."""
        from ..runtime.flash import seen_rows

        out, lse, grad, grad_lse = rows
        out, grad = (_moved(t, _inverse(self.out)) for t in (out, grad))
        lse = seen_rows(_moved(lse, _inverse(self.lse)))
        with torch.enable_grad():
            scores = self.compiled(
                **{n: t for n, t in given.items() if n in self.inputs}, **at, training=training
            )
            name, axes = self.values
            values = _moved(given[name], axes)[(..., *self.units, slice(None), slice(None))]
            weights = (_moved(scores, self.scores) - lse.unsqueeze(-1)).exp()
            outputs = (weights @ values, weights.sum(-1))
        row = (grad * out).sum(-1)
        if grad_lse is not None:  # the log-sum-exp read too: D − dL
            row = row - _moved(grad_lse, _inverse(self.lse))
        return outputs, (grad.sum_to_size(outputs[0].shape), -row.sum_to_size(outputs[1].shape))


def softmax_core(tile: TileCore) -> SoftmaxCore | None:
    """The tile's target as softmax_<τ'>(scores) · V (V a tile input read plainly), merged
    online by that softmax's log-sum-exp; or None."""
    if tile.online is None or len(tile.targets) != 1:
        return None
    spec = tile.compiled.ir
    eqs = {eq.tensor.name: eq for eq in spec.equations}
    node = eqs["ring_out0"].rhs
    if not (isinstance(node, ir.Product) and len(node.factors) == 2 and len(node.summed) == 1):
        return None
    if not all(isinstance(f, ir.Ref) for f in node.factors):
        return None  # a factor computed in place (a reduction), not a tensor the tile holds
    weights, values = node.factors if node.factors[0].tensor.name in eqs else node.factors[::-1]
    if not (
        _refs(weights, values) and weights.tensor.name in eqs and values.tensor.name not in eqs
    ):
        return None
    weights = _undropped(eqs, weights)  # a dropout's: a call that draws none (drops)
    if weights is None:
        return None
    soft, key = eqs[weights.tensor.name].rhs, node.summed[0]
    if not (isinstance(soft, ir.Reduce) and soft.fn == "softmax" and soft.over == (key,)):
        return None
    try:
        return SoftmaxCore(tile, soft.body, values, key)
    except Refused:
        return None


def _undropped(eqs: dict, weights: ir.Ref) -> ir.Ref | None:
    """The weights, read as their equation writes them; through a dropout
    (`Ã = dropout(A, p)`, sequence.dropped) to the weights it drops; None where they are
    read otherwise."""
    eq = eqs[weights.tensor.name]
    if weights.written != eq.indices:
        return None
    ref = dropped(eq)
    if ref is None:
        return weights
    return _undropped(eqs, ref) if ref.tensor.name in eqs else None


def _reaching(spec: ir.Spec, node: ir.Node) -> list[ir.Equation]:
    """The equations `node` reads, directly or not, in the spec's order."""
    eqs = {eq.tensor.name: eq for eq in spec.equations}
    seen, stack = set(), [node]
    while stack:
        for r in ir.refs(stack.pop()):
            if r.tensor.name in eqs and r.tensor.name not in seen:
                seen.add(r.tensor.name)
                stack.append(eqs[r.tensor.name].rhs)
    return [eq for eq in spec.equations if eq.tensor.name in seen]


def _target_glyphs(tile: TileCore) -> list[str]:
    return [i.glyph for i in tile.targets[0].free]


def _refs(*nodes) -> bool:
    """Each a tile input read plainly (every axis one index)."""
    return all(
        isinstance(n, ir.Ref) and all(len(a) == 1 and isinstance(a[0], ir.Index) for a in n.axes)
        for n in nodes
    )


def _order(have: list, want: list) -> tuple[int, ...]:
    """Where each of `want` sits in `have` (the same glyphs in another order)."""
    if sorted(have) != sorted(want):
        raise Refused(f"axes {have} are not {want}")
    return tuple(have.index(g) for g in want)


def _operand(ref: ir.Ref, order: list) -> tuple[str, tuple[int, ...]]:
    """The input's ASCII name and where each axis of `order` sits in it."""
    return ref.tensor.ascii, _order([a[0].glyph for a in ref.axes], [i.glyph for i in order])


def _moved(t: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """t's last axes taken in `order` (_order's), the batch axes before them kept."""
    lead = t.dim() - len(order)
    return t.permute(*range(lead), *(lead + j for j in order))


def _pulled(g: torch.Tensor, t: torch.Tensor, axes: tuple, lead, groups: int) -> torch.Tensor:
    """A kernel operand's gradient `g`, (-1, 1, positions, features), as the gradient of the
    input `t` it was made from (FlashCore.operands: t's axes moved, `groups` unit axes of
    query heads put in, broadcast to `lead` and flattened): summed over what was broadcast,
    in t's layout."""
    moved = _moved(t, axes).shape
    shape = (*moved[:-2], *[1] * groups, *moved[-2:])
    g = g.reshape(*lead, *g.shape[-2:]).sum_to_size(shape)
    return _moved(g.reshape(moved), _inverse(axes))


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    """The order that _moved takes back: _moved(_moved(t, order), _inverse(order)) is t."""
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def _kernel(t: torch.Tensor, order: tuple[int, ...], lead, tail: int) -> torch.Tensor:
    """A tile's rows in the target's layout (`order`, _moved's) in the kernel's: (-1, 1,
    *its last `tail` axes), its leading axes broadcast to `lead` and flattened."""
    t = _moved(t, _inverse(order))
    return t.expand(*lead, *t.shape[t.dim() - tail :]).reshape(-1, 1, *t.shape[t.dim() - tail :])


def _lse(over, body: str) -> str:
    """A tile's log-sum-exp, its scores floored at -FLOOR: a row of the tile that sees no key
    has a finite one, whose gradient is 0 (torch.logsumexp's is NaN at a row of -inf); the
    ring reads a merged value below -FLOOR / 10 as -inf (ring.py, `_empty`)."""
    return f"logsumexp_<{_glyphs(over)}>(max({body}, -{FLOOR:g}))"


def _glyphs(indices) -> str:
    return "".join(i.glyph for i in indices)


def plan_lines(spec: ir.Spec, plan: SequencePlan) -> list[str]:
    """How the ring evaluates each pass's tile pairs: the compiled tile spec, or the literal
    interpreter and why (slow: its tile pairs are counted as any others)."""
    lines = ["Tile pairs of each ring pass (indexattn/parallel/tiles.py)"]
    spec, values = ring_form(spec, plan), defaults(spec)
    for name, passes in ring_passes(spec, plan).items():
        for each in passes:
            found = core(spec, plan, each)
            what = (
                "compiled tile spec"
                + (", its core on SDPA's kernel" if found.flash is not None else "")
                + (", its softmax and log-sum-exp in one step" if found.softmax else "")
                + (
                    " where it draws no dropout"
                    if kept(found, {}, False) and found.dropouts
                    else ""
                )
                + ", merged by "
                + ("its log-sum-exp" if found.online is not None else "its reductions' merges")
                + (
                    ", its gradients from the rows' output and log-sum-exp"
                    if kept(found, values)
                    else ""
                )
                if isinstance(found, TileCore)
                else f"literal interpreter, slow ({found})"
            )
            if each.statistic is not None:
                what += f"; {name} is its log-sum-exp"
            lines.append(f"  {name} over {', '.join(each.travels)}: {what}")
    return lines


def kept(tile: TileCore | str, values: dict, training=True) -> bool:
    """Whether a pass's tile pairs make their gradients from each row's merged output and
    log-sum-exp (a FlashCore or SoftmaxCore drawing no random numbers at these sizes and
    scalars, by symbol, when `training`): the ring keeps no block another rank sent, and
    sends it once more in the backward (ring.py, _Kept)."""
    cores = isinstance(tile, TileCore) and (tile.flash, tile.softmax) != (None, None)
    return cores and not tile.drops(values, training)


def _drawn(p: sympy.Basic | None, values: dict) -> bool:
    """Whether a dropout of probability `p` (None: read from tensors) draws at `values`."""
    if p is None:
        return True
    p = p.subs(values)
    return not p.is_number or float(p) != 0


def defaults(spec: ir.Spec) -> dict:
    """The spec's scalars at the values it declares, by symbol: what a count assumes."""
    return {s.symbol: exact(s.value) for s in spec.scalars}


@functools.lru_cache(maxsize=64)
def core(spec: ir.Spec, plan: SequencePlan, each: RingPass) -> TileCore | str:
    """The pass's compiled tile core, made once; or why it has none."""
    try:
        return TileCore(spec, plan, each)
    except (Refused, SpecError) as why:
        return str(why).splitlines()[0]
