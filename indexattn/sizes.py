"""Shape rules as plain data, with no sympy and no torch: sizes read off argument axes, every
axis checked, ShapeError where one does not fit. Built by indexattn.ir.shapes.rules; kept as
they are in the compile cache (indexattn/runtime/cache.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ShapeError

Tree = int | str | tuple  # an integer, a size by ASCII name, or ("*" | "+" | "//" | "ceil", *parts)


@dataclass(frozen=True)
class Read:
    """A size read off an argument axis: `shape[axis] // divisor`."""

    size: str
    argument: int
    axis: int
    divisor: Tree
    offset: Tree
    where: str  # `W_<(μBa)i>, axis 0 (μBa)`
    message: str  # the start of the ShapeError when the axis does not fit
    multiple: str  # the divisor as written, for "(a multiple of h = 24)"


@dataclass(frozen=True)
class Check:
    """An argument axis whose size must equal `expected` at the solved sizes."""

    argument: int
    axis: int
    expected: Tree
    message: str
    literal: bool  # the expected size is a number as written


@dataclass(frozen=True)
class Quotient:
    """A range `N / ℓ` an index declares: its numerator must be a multiple of its denominator."""

    numerator: Tree
    denominator: Tree
    over: str  # the numerator as the spec writes it: `N`
    under: str  # the denominator: `ℓ`
    message: str  # `spec: index β ranges over N / ℓ, but`
    hint: str  # what to write instead


@dataclass(frozen=True)
class Rank:
    argument: int
    rank: int
    batched: bool
    message: str


@dataclass(frozen=True)
class Lead:
    """Two inputs whose declared layouts begin with the same index, `first` declaring more
    axes (Q_<grτa>, K_<gσa>): given at one rank, `first` with no batch axis, `second`'s
    first axis would be read as a batch and `first`'s as that index (sdpa's [batch, heads, N,
    d] given to both: the batch read as h_kv), so the call is refused (`message` + the
    shapes)."""

    first: int
    second: int
    first_rank: int
    second_rank: int
    message: str

    def check(self, shapes: Sequence[tuple[int, ...]]) -> None:
        x, y = shapes[self.first], shapes[self.second]
        if len(x) == len(y) == self.first_rank:  # `first` unbatched, `second` batched
            raise ShapeError(f"{self.message}{tuple(x)} and {tuple(y)}")


@dataclass(frozen=True)
class Rules:
    """Every shape check of a spec as plain data: sizes read from axes, then every axis
    checked. No sympy at call time, so under torch.compile each comparison is a guard."""

    spec: str
    required: tuple[str, ...]
    ranks: tuple[Rank, ...]
    reads: tuple[Read, ...]
    checks: tuple[Check, ...]
    quotients: tuple[Quotient, ...] = ()
    leads: tuple[Lead, ...] = ()

    def solve(self, shapes: Sequence[tuple[int, ...]], given: dict[str, int]) -> dict[str, int]:
        """Sizes by ASCII name from the arguments' shapes (in argument order) and the given
        sizes; ShapeError naming tensor, axis, expected and actual size where one differs."""
        given = {name: whole(self.spec, name, value) for name, value in given.items()}
        values: dict[str, int] = {}
        for name in self.required:
            if name not in given:
                raise ShapeError(
                    f"{self.spec}: the size {name} cannot be read from the shapes; "
                    f"pass it: {name}=..."
                )
            values[name] = given[name]
        for rank in self.ranks:
            shape = shapes[rank.argument]
            if len(shape) < rank.rank or (len(shape) != rank.rank and not rank.batched):
                raise ShapeError(f"{rank.message}{tuple(shape)}")
        for lead in self.leads:
            lead.check(shapes)
        for read in self.reads:
            self.read(read, shapes[read.argument][read.axis], values, given)
        for quotient in self.quotients:
            divide(quotient, values)
        for check in self.checks:
            actual = shapes[check.argument][check.axis]
            expected = evaluate(check.expected, values)
            if expected != actual:
                value = "" if check.literal else f" = {expected}"
                raise ShapeError(f"{check.message}{value}, got {actual}")
        return values

    def read(self, read: Read, actual: int, values: dict, given: dict) -> None:
        divisor, rest = evaluate(read.divisor, values), actual - evaluate(read.offset, values)
        if divisor == 0:
            raise ShapeError(
                f"{read.message}, got {actual}: {read.multiple} is 0 here, so the other factor "
                "of this axis cannot be read off it; pass it by keyword"
            )
        if rest % divisor != 0 or rest < 0:  # 0 is a size: an empty cache, an empty sequence
            multiple = (
                read.multiple if read.multiple == str(divisor) else f"{read.multiple} = {divisor}"
            )
            suffix = f" (a multiple of {multiple})" if divisor != 1 else ""
            raise ShapeError(f"{read.message}{suffix}, got {actual}")
        values[read.size] = rest // divisor
        told = given.get(read.size)
        if told is not None and told != values[read.size]:
            raise ShapeError(
                f"{self.spec}: {read.size} was given as {told}, but {read.where}"
                f" has size {actual}, which makes {read.size} = {values[read.size]}"
            )


def divide(quotient: Quotient, values: dict[str, int]) -> None:
    """A ShapeError quoting both sizes where a range `N / ℓ` is not a whole number."""
    numerator = evaluate(quotient.numerator, values)
    denominator = evaluate(quotient.denominator, values)
    if numerator % denominator:
        raise ShapeError(
            f"{quotient.message} {quotient.over} = {numerator} is not a multiple of "
            f"{quotient.under} = {denominator}; {quotient.hint}"
        )


def evaluate(node: Tree, values: dict[str, int]) -> int:
    if isinstance(node, str):  # the common case first: a size by name
        return values[node]
    if isinstance(node, int):
        return node
    parts = [evaluate(part, values) for part in node[1:]]
    if node[0] == "//":
        return parts[0] // parts[1]
    if node[0] == "ceil":
        return -(-parts[0] // parts[1])
    return math.prod(parts) if node[0] == "*" else sum(parts)


def names(node: Tree) -> set[str]:
    """The sizes a tree reads, by ASCII name."""
    if isinstance(node, int):
        return set()
    if isinstance(node, str):
        return {node}
    return set().union(*(names(part) for part in node[1:]))


def whole(spec: str, name: str, value) -> int:
    """A size as given by a caller: a positive whole number, never silently truncated."""
    if isinstance(value, bool) or not float(value).is_integer() or int(value) <= 0:
        raise ShapeError(f"{spec}: the size {name} must be a positive whole number, got {value!r}")
    return int(value)


def straight_line(rules: Rules):
    """`rules` as one function of the shapes alone: every rank, read, quotient and check of
    `Rules.solve` in one straight line of comparisons, no loop and no lookup. It returns the
    sizes where every one holds and the batched arguments have one batch (none to widen), or
    None: then `Rules.solve` runs and says what does not fit, in its words. A spec with a size
    no axis gives (one passed by keyword) has none: None always. Its source holds only numbers
    and the local names it allocates (`s0` an argument's shape, `v0` a size), never the
    spec's text."""
    slots = {size: f"v{k}" for k, size in enumerate(dict.fromkeys(r.size for r in rules.reads))}
    trees = [t for r in rules.reads for t in (r.divisor, r.offset)]
    trees += [t for q in rules.quotients for t in (q.numerator, q.denominator)]
    trees += [c.expected for c in rules.checks]
    read = set().union(*map(names, trees)) <= slots.keys()
    if rules.required or not read or not all(map(_printable, trees)):
        return lambda shapes: None
    namespace = {"NAMES": tuple(slots)}
    source = "\n".join(_lines(rules, slots))
    exec(compile(source, f"<the sizes of {rules.spec}>", "exec"), namespace)
    solve = namespace["solve"]

    def guarded(shapes: Sequence[tuple[int, ...]]) -> dict[str, int] | None:
        try:
            return solve(shapes)
        except (ArithmeticError, IndexError):  # as Rules.solve's: its words then
            return None

    return guarded


def _lines(rules: Rules, slots: dict[str, str]) -> list[str]:
    """`straight_line`'s function, line by line."""
    used = sorted({r.argument for r in (*rules.ranks, *rules.reads, *rules.checks)})
    lines = ["def solve(shapes):", *(f"    s{k} = shapes[{k}]" for k in used)]
    for rank in rules.ranks:
        fails = "<" if rank.batched else "!="
        lines.append(f"    if len(s{rank.argument}) {fails} {int(rank.rank)}: return None")
    batched = [r for r in rules.ranks if r.batched]
    batches = [f"s{r.argument}[: len(s{r.argument}) - {int(r.rank)}]" for r in batched]
    lines += [f"    if {batch} != {batches[0]}: return None" for batch in batches[1:]]
    for read in rules.reads:
        axis = f"s{read.argument}[{int(read.axis)}]"
        if (read.divisor, read.offset) == (1, 0):  # the axis is the size
            lines.append(f"    {slots[read.size]} = {axis}")
            continue
        lines += [
            f"    rest = {axis} - {_printed(read.offset, slots)}",
            f"    divisor = {_printed(read.divisor, slots)}",
            "    if divisor == 0 or rest < 0 or rest % divisor: return None",
            f"    {slots[read.size]} = rest // divisor",
        ]
    for q in rules.quotients:
        over, under = _printed(q.numerator, slots), _printed(q.denominator, slots)
        lines.append(f"    if {over} % {under}: return None")
    once = [r for r in rules.reads if [q.size for q in rules.reads].count(r.size) == 1]
    plain = {(r.argument, r.axis, r.size) for r in once if (r.divisor, r.offset) == (1, 0)}
    for check in rules.checks:
        if (check.argument, check.axis, check.expected) in plain:
            continue  # the very axis its size was read off, alone
        expected = _printed(check.expected, slots)
        lines.append(f"    if s{check.argument}[{int(check.axis)}] != {expected}: return None")
    return [*lines, f"    return dict(zip(NAMES, ({''.join(v + ', ' for v in slots.values())})))"]


PRINTED = {"*": " * ", "+": " + ", "//": " // "}  # a tree's operators, ceil aside


def _printable(node: Tree) -> bool:
    """Whether `_printed` can print a tree: integers, sizes and the operators it knows (a tree
    from a cache entry is data, never code)."""
    if isinstance(node, (int, str)):
        return True
    return (node[0] in PRINTED or node[0] == "ceil") and all(map(_printable, node[1:]))


def _printed(node: Tree, slots: dict[str, str]) -> str:
    """A tree as a Python expression over the sizes' local names (`evaluate`'s arithmetic)."""
    if isinstance(node, str):
        return slots[node]
    if isinstance(node, int):
        return str(int(node))
    parts = [_printed(part, slots) for part in node[1:]]
    if node[0] == "ceil":
        return f"(-(-{parts[0]} // {parts[1]}))"
    return "(" + PRINTED[node[0]].join(parts) + ")"
