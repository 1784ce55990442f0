"""Prints the functions that make a table over two sequence indices at the positions given
(passes/tables.py): a block of rows against every key, or against the keys the block sees,
and the calls of them, wherever a block of the table is read."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import sympy

from ...ir import Index
from ...ir.boxes import holds_on_box
from ..planner.predicates import table_keep
from ..program.steps import Gather, Grid, Reduction, Step, Var


@dataclass(frozen=True)
class TableFunction:
    """One table's function: its name, the indices whose positions it takes (in order), the
    constants it reads, its keywords (sizes and scalars), the table's own axes, its text and
    the steps it runs."""

    name: str
    indices: tuple[Index, ...]
    inputs: tuple[str, ...]
    keywords: tuple[str, ...]
    dims: tuple[Index, ...]
    text: str
    steps: tuple[Step, ...]  # the steps it runs (its chain)
    distance: bool = False  # made per call over the differences of its positions (by_distance)


def by_distance(steps, dims: tuple[Index, ...], indices: tuple[Index, ...]) -> bool:
    """Whether a table over (…, τ, τ') is made once a call as a row over the differences
    τ' − τ, each block gathered from it (T5's buckets: 2N − 1 of them, where a block of 128
    rows makes 128·N, seven comparisons each): where every grid of positions reads the two
    only through τ' − τ (a value read at one position, D_<[τ]>, does not), and some step
    costs more per entry than the gather (a sum, a gather). `indices`: those whose positions
    the table's function takes, which must be its last two axes."""
    if len(dims) < 2 or set(indices) != set(dims[-2:]):
        return False
    query, key = dims[-2:]
    shift = sympy.Dummy("shift")
    for step in steps:
        if isinstance(step, Grid):
            moved = step.expr.subs(key.symbol, query.symbol + shift)
            moved = moved.replace(  # τ < τ + shift: each comparison as a difference with 0
                lambda e: isinstance(e, sympy.core.relational.Relational),
                lambda e: e.func(e.lhs - e.rhs, 0),
            )
            if query.symbol in moved.free_symbols:
                return False
    return any(isinstance(s, (Reduction, Gather)) for s in steps)


def row_call(table: TableFunction, emitter) -> str:
    """The table's row over the differences of its positions: at the last query's position
    against positions 0 to n_q + n_k − 2, so that entry τ' − τ + n_q − 1 is the table at
    (τ, τ') (the query axis of length one)."""
    query, key = table.dims[-2:]
    n_q, n_k = emitter.size(query), emitter.size(key)
    emitter.use("torch")
    every = f"torch.arange({n_q} + {n_k} - 1, device=device, dtype=torch.float64)"
    return _call(table, emitter, {query: f"{emitter.names.index(query)}[-1:]", key: every})


def block_reads(table: TableFunction, emitter, var: Var) -> tuple[list[str], list[str]]:
    """What a function of one block that makes the table's block reads, besides positions,
    sizes, device and dtype, and the lines the spec's function prints before it: the
    table's row (made once for every block) where it is made by distance; else the tensors
    it reads and its scalars (a scalar may be a tensor). Passed to the block, never closed
    over, so that their gradients are made."""
    if table.distance:
        row = emitter.distance_row(var)
        return [row], [f"{row} = {row_call(table, emitter)}"]
    scalars = {s.ascii for s in emitter.spec.scalars}
    return [*table.inputs, *(name for name in table.keywords if name in scalars)], []


def call(table: TableFunction, emitter, pieces: dict[Index, str], row: str | None = None) -> str:
    """The table at the positions of `pieces` (each index's slice; every position where an
    index has none), in a function whose lines `emitter` (a Context) prints; a table made
    by distance gathered from its `row` (row_call), where given."""
    names = emitter.names
    positions = {
        i: names.index(i) + (f"[{pieces[i]}]" if i in pieces else "") for i in table.indices
    }
    if row is None or not pieces:
        return _call(table, emitter, positions)
    query, key = table.dims[-2:]
    for index in (query, key):
        emitter.needs.indices[index] = None
    offset = f"({emitter.size(query)} - 1)"  # printers.py imports torch: not here
    shift = f"({positions[key]}[None, :] - {positions[query]}[:, None]).long() + {offset}"
    return f"{row}[..., 0, {shift}]"


def _call(table: TableFunction, emitter, positions: dict[Index, str]) -> str:
    """The call of the table's function at `positions` (each index's)."""
    for index in table.indices:
        emitter.needs.indices[index] = None
    emitter.needs.device = emitter.needs.dtype = True
    for size, ascii in emitter.spec.size_names.items():
        if ascii in table.keywords:
            emitter.needs.sizes.add(size)
    for scalar in emitter.spec.scalars:
        if scalar.ascii in table.keywords:
            emitter.needs.scalars.add(scalar.symbol)
    keywords = [f"{k}={k}" for k in (*table.keywords, "device", "dtype")]
    args = [*(positions[i] for i in table.indices), *table.inputs, *keywords]
    return f"{table.name}({', '.join(args)})"


def box_call(table: TableFunction, var: Var, hides: str, emitter, block: list[str]):
    """The call, at the queries q0:q1 and keys k0:k1 of `block`, of the module's function that
    tells what the table's condition holds at all of those entries (ir/boxes.py: a test on
    the first and last positions of each, and on the least and greatest of a call's tensor
    read there), made once per table, and the tensors it reads (`key_spans` hands it each as
    a function of a first and last position: their least and greatest entries there); None
    where it tells nothing (a bias alone)."""
    kept = table_keep(table.steps, var, hides)
    if kept is None:
        return None
    names, spec = emitter.names, emitter.spec
    ends, reads = {}, {}  # reads: a tensor's (least, greatest) at positions, by its local name
    for index in table.dims[-2:]:
        ends[index.symbol] = _ends(names.index(index))
    for symbol, (arg, index) in kept.values.items():
        local = f"{emitter.var(arg)}_{names.index(index)}"
        ends[symbol], reads[local] = _ends(local), (emitter.var(arg), names.index(index))
    known = frozenset(spec.sizes) | {s.symbol for s in spec.scalars}
    tests = [(2 if kept.plain else 1, holds_on_box(kept.condition, ends, known))]
    tests.append((0, holds_on_box(sympy.Not(kept.condition), ends, known)))
    tests = [(value, test) for value, test in tests if test is not sympy.false]
    if not tests:
        return None
    used = {str(s).split("[")[0] for _, test in tests for s in test.free_symbols}
    reads = {local: read for local, read in reads.items() if local in used}
    inputs = list(dict.fromkeys(tensor for tensor, _ in reads.values()))
    read = sorted(set().union(*(t.free_symbols for _, t in tests)) & known, key=str)
    keywords = [emitter.scalar(s) for s in read]
    positions = [names.index(i) for i in table.dims[-2:]]
    head = [*positions, *inputs, *(["*", *keywords] if keywords else [])]
    lines = [
        f"{local} = {tensor}(*{at})  # least, greatest" for local, (tensor, at) in reads.items()
    ]
    tests = [(value, emitter.scalar(test, numbers=True)) for value, test in tests]
    text = partial(_box, table=names.var(var), head=head, lines=lines, tests=tests)
    name = emitter.helper(text, f"{names.var(var)}_box")
    q0, q1, k0, k1 = block
    args = [f"({q0}, {q1} - 1)", f"({k0}, {k1} - 1)", *inputs, *(f"{w}={w}" for w in keywords)]
    return f"{name}({', '.join(args)})", inputs


def _ends(name: str) -> tuple[sympy.Symbol, sympy.Symbol]:
    """The symbols of a pair's first and second: `tau[0]`, `tau[1]`."""
    return sympy.Symbol(f"{name}[0]"), sympy.Symbol(f"{name}[1]")


def _box(name: str, table: str, head: list[str], lines: list[str], tests) -> str:
    """The module's function that tells what a table's condition holds on a box of
    positions (`head`: its parameters, `lines`: the least and greatest of each tensor read
    there, `tests`: each answer and its condition)."""
    first, second = head[:2]
    out = [
        f"def {name}({', '.join(head)}):",
        f'    """What {table}\'s condition holds at every entry of positions {first}[0] to'
        f" {first}[1] by",
        f"    {second}[0] to {second}[1] (first and last): 2, kept and the mask changes"
        " nothing; 1, kept;",
        '    0, hidden; None where it cannot tell."""',
        *("    " + line for line in lines),
    ]
    for value, test in tests:
        if test == "True":
            return "\n".join([*out, f"    return {value}"])
        out += [f"    if {test}:", f"        return {value}"]
    return "\n".join([*out, "    return None"])
