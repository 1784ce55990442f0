"""Values in generated code: names from the module's allocator, sizes and scalars printed
from sympy, operands aligned for broadcasting; what printed lines use (imports, sizes,
device and dtype) is recorded as they are printed, never recovered from the text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from ...ir import Index, Spec
from ...ir.shapes import quotients
from ..program.steps import Arg, Number, Operand
from .expressions import ScalarPrinter, wrap
from .naming import Names


@dataclass
class Needs:
    """What printed lines use beyond their own variables."""

    imports: set[str] = field(default_factory=set)  # torch, F, math, einsum, rearrange, rt
    sizes: set[sympy.Symbol] = field(default_factory=set)
    scalars: set[sympy.Symbol] = field(default_factory=set)
    indices: dict[Index, None] = field(default_factory=dict)  # positions, in first use
    device: bool = False
    dtype: bool = False
    table: bool = False  # the dtype tables are built in (lower/program/numerics.py)
    knobs: dict[str, tuple[str, str]] = field(default_factory=dict)  # hint: (name, its line)
    helpers: dict[str, tuple[str, str]] = field(default_factory=dict)  # hint: (name, its text)
    # the spec's own helpers (a table's box); what every module calls is the runtime's


# Each step kind's printer, by kind: `@prints(Kind)` on the emitter's method that prints it;
# `Emitter.lines` looks the kind up here and calls the printer with the emitter, whose values
# it prints, as its context (tests/lower/test_kinds.py: every kind has one).
PRINTERS: dict[type, Callable] = {}


def prints(kind: type) -> Callable[[Callable], Callable]:
    def register(printer: Callable) -> Callable:
        PRINTERS[kind] = printer
        return printer

    return register


class Values:
    """Prints values; `needs` accumulates what the printed lines use. What it prints into is
    fixed when it is made: the constants function (`tables`), a table's function
    (`positional`), and the values cast to the call's dtype where made (`cast`)."""

    def __init__(
        self,
        spec: Spec,
        names: Names,
        *,
        tables: bool = False,
        positional: bool = False,
        cast: frozenset = frozenset(),
    ) -> None:
        self.spec, self.names, self.needs = spec, names, Needs()
        # sizes are whole (printers.py prints floor(d_r / 2) as d_r // 2)
        whole = {"integer": True, "positive": True}
        self.symbols = {s: sympy.Symbol(a, **whole) for s, a in spec.size_names.items()}
        # real: a scalar is a Python float, never dynamic (printers.py prints its log by math)
        self.symbols |= {s.symbol: sympy.Symbol(s.ascii, real=True) for s in spec.scalars}
        self.scalar_symbols = {s.symbol for s in spec.scalars}
        # N / ℓ is whole (each call checks it divides: ir/shapes.py), so printed N // ℓ
        self.quotients = {q: sympy.floor(q) for q in quotients(spec)}
        self.tables = tables  # printing the constants function: floats in the tables' dtype
        self.cast = cast  # values cast to the call's dtype where made
        self.positional = positional  # printing a table's function: grids span the positions
        self.blocked: dict = {}  # the tables made per block: their functions (tables_emit.py)
        self.block_names: dict = {}  # the names of those tables' blocks, one per table
        self.distance_rows: dict = {}  # a table made by distance: the name of its row

    # -- values

    def use(self, *modules: str) -> None:
        self.needs.imports.update(modules)

    def scalar(self, expr: sympy.Basic, numbers: bool = False) -> str:
        """A sizes-and-scalars expression, in the generated code's names; with `numbers`,
        where only its value is read (printers.py: a tensor scalar then reads as a number)."""
        self.needs.sizes |= expr.free_symbols & set(self.spec.sizes)
        self.needs.scalars |= expr.free_symbols & self.scalar_symbols
        printer = ScalarPrinter(numbers)
        expr = expr.subs(self.quotients) if self.quotients else expr
        code = printer.doprint(expr.xreplace(self.symbols))
        self.use(*printer.module_imports)
        return code

    def size(self, index: Index) -> str:
        return self.scalar(index.size)

    def number(self, expr: sympy.Basic) -> str:
        """A Python float: printed from its value when it is a number."""
        return repr(float(expr)) if expr.is_number else self.scalar(expr)

    def knob(self, hint: str, value: int | str, note: str) -> str:
        """A module-level constant a reader may tune, named once per module."""
        if hint not in self.needs.knobs:
            name = self.names.fresh(hint)
            self.needs.knobs[hint] = (name, f"{name} = {value}  # {note}")
        return self.needs.knobs[hint][0]

    def runtime(self, name: str) -> str:
        """A function of the runtime every module imports (indexattn/runtime/lib.py), as the
        printed lines call it."""
        self.use("rt")
        return f"rt.{name}"

    def helper(self, text: Callable[..., str], hint: str, *others: str) -> str:
        """A module-level function of the spec's own the printed lines call (a table's box),
        named once per module, with the other module-level names it defines: `text(name,
        *others)` is its definition, with each name allocated."""
        if hint not in self.needs.helpers:
            name, *more = (self.names.fresh(h) for h in (hint, *others))
            self.needs.helpers[hint] = (name, text(name, *more))
        self.use("torch")
        return self.needs.helpers[hint][0]

    def tensor_of(self, number: str) -> str:
        """A number, or a 0-d tensor (a size's log, printers.py), as a tensor of the call's
        dtype: as_tensor takes both (torch.tensor warns on copying a tensor)."""
        self.use("torch")
        self.needs.device = self.needs.dtype = True
        return f"torch.as_tensor({number}, device=device, dtype={self.float_dtype()})"

    def float_dtype(self) -> str:
        """The dtype floats are made in: the tables' in the constants function, else the call's."""
        self.needs.table |= self.tables
        return "table" if self.tables else "dtype"

    def var(self, operand: Operand) -> str:
        return self.names.var(operand.var)

    def ref(self, arg: Operand) -> str:
        name = self.var(arg)
        if not arg.select:
            return name
        picks = [
            ":" if s is None else str(s) if isinstance(s, int) else self.scalar(s)
            for s in arg.select
        ]
        if arg.batched:  # after `...`, every axis that follows is written out
            rest = len(arg.dims) - arg.select.count(None)
            picks = ["...", *picks, *[":"] * rest]
        return f"{name}[{', '.join(picks)}]"

    def arg(self, arg: Arg, dims: tuple[Index, ...]) -> str:
        """An argument aligned to `dims` for broadcasting (a number stays a number)."""
        if isinstance(arg, Number):
            return wrap(self.scalar(arg.expr))
        return expand(self.ref(arg), arg.dims, dims, arg.batched)

    def pattern(self, axes, batched: bool) -> str:
        """An einops pattern side: `... mu tau a`, `(mu B a) i`."""
        words = [
            "(" + " ".join(self.names.axis(i) for i in axis) + ")"
            if isinstance(axis, tuple)
            else self.names.axis(axis)
            for axis in axes
        ]
        return " ".join((["..."] if batched else []) + words)

    # -- steps


def relayout(code: str, have: tuple, want: tuple) -> str:
    """`code` with axes (…, *have) viewed as (…, *want), a permutation: a transpose when two
    axes swap, else movedim."""
    if have == want:
        return code
    n = len(have)
    moved = [k for k in range(n) if have[k] != want[k]]
    if len(moved) == 2:
        return f"{code}.transpose({moved[0] - n}, {moved[1] - n})"
    for src, index in enumerate(have):
        rest = [i for i in have if i != index]
        dst = want.index(index)
        if (*rest[:dst], index, *rest[dst:]) == want:
            return f"{code}.movedim({src - n}, {dst - n})"
    source = tuple(range(-n, 0))
    return f"{code}.movedim({source}, {tuple(want.index(i) - n for i in have)})"


def expand(code: str, have: tuple, target: tuple, batched: bool, keep: int = 0) -> str:
    """`code` (…, *have) aligned to broadcast against (…, *target): permuted, with a unit
    axis where it lacks one; leading unit axes are left out when unbatched (all but `keep`)."""
    present = tuple(i for i in target if i in have)
    code = relayout(code, have, present)
    slots = [":" if i in have else "None" for i in target]
    if not batched:
        while len(slots) > keep and slots[0] == "None":
            slots.pop(0)
    if "None" not in slots:
        return code
    while not batched and slots[-1] == ":":
        slots.pop()
    return f"{code}[{'..., ' if batched else ''}{', '.join(slots)}]"


def axes_comment(out: Operand, dims: tuple[Index, ...] | None = None) -> str:
    """The axes in the spec's glyphs; `dims` (then a flattened group) when given."""
    glyphs = ", ".join(i.glyph for i in out.dims)
    if dims is not None:
        flat = "".join(i.glyph for i in out.dims if i not in dims)
        glyphs = ", ".join([*(i.glyph for i in dims), f"({flat})"])
    return "(…, " + glyphs + ")" if out.batched and glyphs else f"({glyphs})"
