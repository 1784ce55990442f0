"""Prints the functions that make a table over two sequence indices at the positions given
(passes/tables.py): a block of rows against every key, or against the keys the block sees,
and the calls of them, wherever a block of the table is read."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Index
from .kinds import reads
from .steps import Var


@dataclass(frozen=True)
class TableFunction:
    """One table's function: its name, the indices whose positions it takes (in order), the
    constants it reads, its keywords (sizes and scalars), and the table's own axes."""

    name: str
    indices: tuple[Index, ...]
    inputs: tuple[str, ...]
    keywords: tuple[str, ...]
    dims: tuple[Index, ...]
    text: str


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
