"""A core's score and keep (core.py) as the text of FlexAttention's callables: `score_mod(score,
b, h, q_idx, kv_idx)`, `mask_mod(b, h, q_idx, kv_idx)`, and the block test `box(q0, q1, k0, k1,
h, *ends)` that says, per block of queries × keys, whether the keep holds at all of it (full)
or at none (empty), read off the keep by `ir/boxes.py` on the blocks' first and last positions
and on the least and greatest ids a block reads. One printer for the generated module and for
`spec.mask_mod(...)`, `spec.score_mod(...)` and `spec.block_mask(...)`.

Each function takes what it reads after `*`: tensors by the spec's ASCII names, sizes and
scalars too; the caller binds them (a closure in the generated module, `functools.partial`
for the spec's callables)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ...ir import Spec
from ...ir.boxes import holds_on_box
from ...lower.printers.expressions import GridPrinter, ScalarPrinter
from ...lower.program.steps import SCORE
from .core import Core, Read

RESERVED = frozenset(
    {"b", "h", "q_idx", "kv_idx", "score", "q0", "q1", "k0", "k1"} | {"torch", "math"}
)
B, H, Q, K = (sympy.Symbol(n, integer=True) for n in ("b", "h", "q_idx", "kv_idx"))
Q0, Q1, K0, K1 = (sympy.Symbol(n, integer=True) for n in ("q0", "q1", "k0", "k1"))


@dataclass(frozen=True)
class Source:
    """A function's text, its name and the keywords it takes (tensors, sizes, scalars)."""

    name: str
    text: str
    keywords: tuple[tuple[str, str], ...]  # (its parameter, the spec's ASCII name)

    def bind(self, values: dict) -> dict:
        """The keywords it takes, from values by the spec's names."""
        return {param: values[name] for param, name in self.keywords}


@dataclass(frozen=True)
class Stat:
    """A tensor the block test reads at the queries' (or keys') own positions: the least and
    greatest of each block of them are its keywords `lo` and `hi`."""

    tensor: str
    side: str  # "q" or "k"
    lo: str
    hi: str


class _Printer(GridPrinter):
    """torch for what reads tensors (positions, scores, the blocks' ends), math for the rest."""

    def __init__(self, core: Core, tensors=frozenset()) -> None:
        super().__init__(frozenset({B, H, Q, K, SCORE, Q0, Q1, K0, K1, *tensors}), ScalarPrinter())
        self.core = core
        self.batched = {k: t.batched for k, t in enumerate(core.tensors)}

    def _print_Read(self, expr) -> str:
        number, *positions = expr.args
        tensor = self.core.tensors[int(number)]
        lead = ["b"] if self.batched[int(number)] else []
        at = [self._print(p) + (".long()" if p.has(Read) else "") for p in positions]
        return f"{keyword(tensor.ascii)}[{', '.join(lead + at)}]"


def keyword(ascii: str) -> str:
    """The parameter of a spec's name: FlexAttention's own names (b, h, ...) get a `_`."""
    return ascii + "_" if ascii in RESERVED else ascii


def _names(spec: Spec) -> dict[sympy.Symbol, sympy.Symbol]:
    """Sizes and scalars -> symbols named as the function's keywords."""
    names = {
        s: sympy.Symbol(keyword(a), positive=True) for s, a in zip(spec.sizes, spec.size_asciis)
    }
    names |= {s.symbol: sympy.Symbol(keyword(s.ascii), real=True) for s in spec.scalars}
    return names


def _keywords(spec: Spec, core: Core, exprs, extra=()) -> tuple[tuple[str, str], ...]:
    """(parameter, spec name) of every tensor, size and scalar the expressions read."""
    read = {int(r.args[0]) for e in exprs for r in e.atoms(Read)}
    found = [(keyword(t.ascii), t.ascii) for k, t in enumerate(core.tensors) if k in read]
    found += list(extra)
    spelled = {keyword(a): a for a in (*spec.size_asciis, *(s.ascii for s in spec.scalars))}
    symbols = sorted({str(s) for e in exprs for s in e.free_symbols}, key=str)
    found += [(name, spelled[name]) for name in symbols if name in spelled]
    return tuple(dict.fromkeys(found))


def _head(head: list[str], keywords) -> str:
    return ", ".join([*head, *(["*", *(p for p, _ in keywords)] if keywords else [])])


def _positions(core: Core) -> dict[sympy.Symbol, sympy.Basic]:
    """The core's indices in FlexAttention's: the query, the key, the merged heads unravelled."""
    found = {core.query.symbol: Q, core.key.symbol: K}
    heads = core.head_indices
    for k, index in enumerate(heads):
        after = sympy.Mul(*(i.size for i in heads[k + 1 :]))
        value = sympy.floor(H / after) if k == 0 else sympy.Mod(sympy.floor(H / after), index.size)
        found[index.symbol] = value if len(heads) > 1 else H
    return found


def _text(spec: Spec, core: Core, expr: sympy.Basic, name: str, head: list[str]) -> Source:
    expr = expr.xreplace(_positions(core)).xreplace(_names(spec))
    body = _Printer(core).doprint(expr)
    if expr.free_symbols & {B, H, Q, K, SCORE} == set() and not expr.has(Read):
        body = f"torch.full_like(q_idx, {body}, dtype=torch.bool)" if "score" not in head else body
    keywords = _keywords(spec, core, [expr])
    lines = [f"def {name}({_head(head, keywords)}):", f"    return {body}"]
    return Source(name, "\n".join(lines), keywords)


def score_mod(spec: Spec, core: Core, name: str = "score_mod") -> Source:
    return _text(spec, core, core.score, name, ["score", "b", "h", "q_idx", "kv_idx"])


def mask_mod(spec: Spec, core: Core, name: str = "mask_mod") -> Source:
    keep = sympy.true if core.keep is None else core.keep
    return _text(spec, core, keep, name, ["b", "h", "q_idx", "kv_idx"])


def box(spec: Spec, core: Core, name: str = "mask_box") -> tuple[Source, tuple[Stat, ...]]:
    """The block test: `(full, empty)` at blocks of queries q0..q1 by keys k0..k1 (first and
    last, tensors that broadcast), with the least and greatest of each tensor the keep reads
    at the queries' or keys' own positions (`Stat`); a part it cannot tell is False (the
    block is then read entry by entry)."""
    keep = (sympy.true if core.keep is None else core.keep).xreplace(_names(spec))
    query, key = core.query.symbol, core.key.symbol
    ends = {query: (Q0, Q1), key: (K0, K1)}
    stats: list[Stat] = []
    values = {}
    for read in keep.atoms(Read):
        number, *positions = read.args
        side = {query: "q", key: "k"}.get(positions[-1]) if len(positions) == 1 else None
        if side is None:
            continue
        tensor = core.tensors[int(number)].ascii
        lo, hi = (sympy.Symbol(f"{keyword(tensor)}_{side}_{e}", integer=True) for e in ("lo", "hi"))
        stats.append(Stat(tensor, side, str(lo), str(hi)))
        symbol = sympy.Dummy(integer=True)
        values[read] = symbol
        ends[symbol] = (lo, hi)
    keep = keep.xreplace(values)
    known = frozenset(s for s in keep.free_symbols if s not in ends) - {query, key}
    heads = {i.symbol: _positions(core)[i.symbol] for i in core.head_indices}
    full = holds_on_box(keep, ends, known)
    empty = holds_on_box(sympy.Not(keep), ends, known)
    tests = [test.xreplace(heads) for test in (full, empty)]
    printer = _Printer(core, {e for pair in ends.values() for e in pair})
    codes = [printer.doprint(test) for test in tests]
    keywords = _keywords(spec, core, tests, [(n, n) for st in stats for n in (st.lo, st.hi)])
    lines = [
        f"def {name}({_head(['q0', 'q1', 'k0', 'k1', 'h'], keywords)}):",
        f"    return {codes[0]}, {codes[1]}",
    ]
    return Source(name, "\n".join(lines), keywords), tuple(stats)
