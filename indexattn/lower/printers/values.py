"""Values in generated code: names from the module's allocator, sizes and scalars printed
from sympy, operands aligned for broadcasting; what printed lines use (imports, sizes,
device and dtype) is recorded as they are printed, never recovered from the text."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

    def sharing(self) -> Needs:
        """Fresh needs for another function of the module: one module's knobs and helpers,
        whichever function's lines use them."""
        return Needs(knobs=self.knobs, helpers=self.helpers)


# Each step kind's printer, by kind: `@prints(Kind)` on a function `(context, step)`;
# `emit.lines` looks the kind up here and calls the printer with the `Context` of the function
# it prints into (tests/lower/test_kinds.py: every kind has one).
PRINTERS: dict[type, Callable] = {}


def prints(kind: type) -> Callable[[Callable], Callable]:
    def register(printer: Callable) -> Callable:
        PRINTERS[kind] = printer
        return printer

    return register


@dataclass(frozen=True)
class Context:
    """What a printer reads, fixed before printing: the spec, the module's names, what it
    prints into (the constants function: `tables`; a table's function: `positional`), the
    values cast to the call's dtype where made (`cast`) and the tables made per block
    (`blocked`: their functions, tables_emit.py). `needs` accumulates what the printed lines
    use; `block_names` and `distance_rows` the names allocated for those tables."""

    spec: Spec
    names: Names
    needs: Needs = field(default_factory=Needs)
    tables: bool = False
    positional: bool = False
    cast: frozenset = frozenset()
    blocked: Mapping = field(default_factory=dict)
    block_names: dict = field(default_factory=dict)  # a table's block: its name
    distance_rows: dict = field(default_factory=dict)  # a table made by distance: its row
    symbols: dict = field(init=False, repr=False)
    scalar_symbols: set = field(init=False, repr=False)
    quotients: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        spec, whole = self.spec, {"integer": True, "positive": True}
        # sizes are whole (printers.py prints floor(d_r / 2) as d_r // 2); a scalar is real, a
        # Python float, never dynamic (printers.py prints its log by math)
        symbols = {s: sympy.Symbol(a, **whole) for s, a in spec.size_names.items()}
        symbols |= {s.symbol: sympy.Symbol(s.ascii, real=True) for s in spec.scalars}
        object.__setattr__(self, "symbols", symbols)
        object.__setattr__(self, "scalar_symbols", {s.symbol for s in spec.scalars})
        # N / ℓ is whole (each call checks it divides: ir/shapes.py), so printed N // ℓ
        object.__setattr__(self, "quotients", {q: sympy.floor(q) for q in quotients(spec)})

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

    def distance_row(self, var) -> str:
        """The name of a table's row over the differences of its positions (by_distance)."""
        if var not in self.distance_rows:
            self.distance_rows[var] = self.names.fresh(self.names.var(var) + "_row")
        return self.distance_rows[var]

    def block_name(self, var) -> str:
        """The name of a table's block in the spec's function, one per table."""
        if var not in self.block_names:
            self.block_names[var] = self.names.fresh(self.names.var(var) + "_block")
        return self.block_names[var]

    def features(self, parts, lead: tuple[Index, ...], widths, heads: int, rows: int = 0) -> str:
        """Queries or keys as the kernel wants them: each part's features flattened, the
        parts side by side."""
        codes = [self.heads(p, (*lead, *w), heads, len(w), rows) for p, w in zip(parts, widths)]
        self.use("torch")
        return codes[0] if len(codes) == 1 else f"torch.cat([{', '.join(codes)}], dim=-1)"

    def heads(
        self, arg: Operand, dims: tuple[Index, ...], heads: int, width: int = 1, rows: int = 0
    ) -> str:
        """(…, heads..., sequence, width), the heads as one axis, as the kernel wants; the
        last `rows` heads merged into the sequence instead (Attention.packed)."""
        code = relayout(self.ref(arg), arg.dims, tuple(i for i in dims if i in arg.dims))
        code += f".flatten({-width})" if width > 1 else ""
        code = self.spread(code, arg, dims[: len(dims) - width])
        code += f".flatten({-2 - rows}, -2)" if rows else ""
        heads -= rows
        if heads == 0:
            return code + ".unsqueeze(-3)"
        return code + (f".flatten({-2 - heads}, -3)" if heads > 1 else "")

    def spread(self, code: str, arg: Operand, lead: tuple[Index, ...]) -> str:
        """`code`, laid out (…, lead..., features) but for the heads `arg` lacks, viewed
        over those heads (no copy): one rotary key for every head."""
        lacking = [k for k, i in enumerate(lead) if i not in arg.dims]
        if not lacking:
            return code
        for k in reversed(lacking):
            code += f".unsqueeze({k - len(lead) - 1})"
        sizes = [self.size(i) if k in lacking else "-1" for k, i in enumerate(lead)]
        batch = [f"*{self.ref(arg)}.shape[:-{len(arg.dims)}]"] if arg.batched else []
        return f"{code}.expand({', '.join([*batch, *sizes, '-1'])})"


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
