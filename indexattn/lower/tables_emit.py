"""Prints the functions that make a table over two sequence indices at the positions given
(passes/tables.py): a block of rows against every key, or against the keys the block sees,
and the calls of them, wherever a block of the table is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import Index
from .kinds import reads
from .naming import Names
from .numerics import TABLE
from .program import Program
from .steps import Var

if TYPE_CHECKING:
    from .emit import Emitter


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


def table_functions(plan: Program, names: Names, main: Emitter) -> dict[Var, TableFunction]:
    """A function per table the rest of the program reads (those only other tables read are
    computed inside them), by the table's value."""
    from .codegen import comment  # both print the tables' calls: they import this module
    from .emit import Emitter

    wide = [s for s in plan.steps if s.out.var in plan.tables]
    read = {o.var for s in plan.steps if s.out.var not in plan.tables for o in reads(s)}
    out = {}
    for step in (s for s in wide if s.out.var in read):
        chain = _chain(wide, step.out.var)
        emitter = Emitter(plan.spec, names)
        emitter.needs.knobs, emitter.needs.helpers = main.needs.knobs, main.needs.helpers
        emitter.tables, emitter.cast, emitter.positional = True, main.cast, True
        body = []
        for block in plan.blocks:  # each block's steps under its equations
            steps = [s for s in block.steps if s in chain]
            body += [f"# {comment(text)}" for text in block.texts] if steps else []
            body += [line for s in steps for line in emitter.lines(s)]
        made = {s.out.var for s in chain}
        inputs = [o.var for s in chain for o in reads(s) if o.var not in made]
        inputs = tuple(names.var(v) for v in dict.fromkeys(inputs))
        needs, spec = emitter.needs, plan.spec
        keywords = tuple(a for s, a in spec.size_names.items() if s in needs.sizes)
        keywords += tuple(s.ascii for s in spec.scalars if s.symbol in needs.scalars)
        indices = tuple(needs.indices)
        name = names.fresh(f"{names.var(step.out.var)}_at")
        params = [*(names.index(i) for i in indices), *inputs, "*", *keywords, "device", "dtype"]
        doc = f'"""{names.var(step.out.var)} at the positions given: a block of rows."""'
        table = [f"table = {TABLE}  # docs/language.md, Numerics"] if needs.table else []
        lines = [doc, *table, *body, f"return {names.var(step.out.var)}"]
        text = "\n".join([f"def {name}({', '.join(params)}):", *("    " + x for x in lines)])
        main.needs.imports |= needs.imports
        out[step.out.var] = TableFunction(name, indices, inputs, keywords, step.out.dims, text)
    return out


def call(table: TableFunction, emitter: Emitter, pieces: dict[Index, str]) -> str:
    """The table at the positions of `pieces` (each index's slice; every position where an
    index has none), in a function whose lines `emitter` prints."""
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


def _chain(steps, var: Var):
    """The steps among `steps` the value needs, in order."""
    needed, out = {var}, []
    for step in reversed(steps):
        if step.out.var in needed:
            out.append(step)
            needed |= {o.var for o in reads(step)}
    return out[::-1]
