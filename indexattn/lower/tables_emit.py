"""Prints the functions that make a table over two sequence indices at the positions given
(passes/tables.py): a block of rows against every key, or against the keys the block sees,
and the calls of them, wherever a block of the table is read."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import sympy

from ..ir import Index
from ..ir.boxes import holds_on_box
from .kinds import reads
from .predicates import table_keep
from .steps import Step, Var


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


def call(table: TableFunction, emitter, pieces: dict[Index, str]) -> str:
    """The table at the positions of `pieces` (each index's slice; every position where an
    index has none), in a function whose lines `emitter` (an Emitter) prints."""
    for index in table.indices:
        emitter.needs.indices[index] = None
    emitter.needs.device = emitter.needs.dtype = True
    for size, ascii in emitter.spec.size_names.items():
        if ascii in table.keywords:
            emitter.needs.sizes.add(size)
    for scalar in emitter.spec.scalars:
        if scalar.ascii in table.keywords:
            emitter.needs.scalars.add(scalar.symbol)
    names = emitter.names
    positions = [names.index(i) + (f"[{pieces[i]}]" if i in pieces else "") for i in table.indices]
    keywords = [f"{k}={k}" for k in (*table.keywords, "device", "dtype")]
    return f"{table.name}({', '.join([*positions, *table.inputs, *keywords])})"


def chain(steps, var: Var):
    """The steps among `steps` the value needs, in order."""
    needed, out = {var}, []
    for step in reversed(steps):
        if step.out.var in needed:
            out.append(step)
            needed |= {o.var for o in reads(step)}
    return out[::-1]


def box_call(table: TableFunction, var: Var, hides: str, emitter, block: list[str]) -> str | None:
    """The call, at the queries q0:q1 and keys k0:k1 of `block`, of the module's function that
    tells what the table's condition holds at all of those entries (ir/boxes.py: a test on
    the first and last positions of each), made once per table; None where it tells nothing
    (a table of values a call makes, a bias alone)."""
    found = table_keep(table.steps, var, hides)
    if found is None:
        return None
    keep, plain = found
    names, spec = emitter.names, emitter.spec
    positions = [names.index(i) for i in table.dims[-2:]]
    ends = {
        i.symbol: (sympy.Symbol(f"{p}[0]"), sympy.Symbol(f"{p}[1]"))
        for i, p in zip(table.dims[-2:], positions)
    }
    known = frozenset(spec.sizes) | {s.symbol for s in spec.scalars}
    tests = [(2 if plain else 1, holds_on_box(keep, ends, known))]
    tests.append((0, holds_on_box(sympy.Not(keep), ends, known)))
    tests = [(value, test) for value, test in tests if test is not sympy.false]
    if not tests:
        return None
    read = sorted(set().union(*(t.free_symbols for _, t in tests)) & known, key=str)
    keywords = [emitter.scalar(s) for s in read]
    text = partial(
        _box,
        table=names.var(var),
        positions=positions,
        keywords=keywords,
        tests=[(value, emitter.scalar(test)) for value, test in tests],
    )
    name = emitter.helper(text, f"{names.var(var)}_box")
    q0, q1, k0, k1 = block
    args = [f"({q0}, {q1} - 1)", f"({k0}, {k1} - 1)", *(f"{w}={w}" for w in keywords)]
    return f"{name}({', '.join(args)})"


def _box(name: str, table: str, positions: list[str], keywords: list[str], tests) -> str:
    """The module's function that tells what a table's condition holds on a box of
    positions."""
    params = ", ".join([*positions, *(["*", *keywords] if keywords else [])])
    lines = [
        f"def {name}({params}):",
        f'    """What {table}\'s condition holds at every entry of positions {positions[0]}[0]'
        f" to {positions[0]}[1]",
        f"    by {positions[1]}[0] to {positions[1]}[1], from those alone: 2, kept and the mask"
        " changes nothing;",
        '    1, kept; 0, hidden; None where it cannot tell."""',
    ]
    for value, test in tests:
        if test == "True":
            return "\n".join([*lines, f"    return {value}"])
        lines += [f"    if {test}:", f"        return {value}"]
    return "\n".join([*lines, "    return None"])
