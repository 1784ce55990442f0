"""One tensor moved between two layouts of the same indices, written as in a spec: `<(Bμa)i>`."""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ShapeError, Span, SpecError
from ..notation.names import ascii_name, normalise

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Layout:
    """A layout as written (`<(Bμa)i>`), its axes (the index glyphs each fuses), and where
    each index is written, for carets."""

    text: str
    file: str
    axes: tuple[tuple[str, ...], ...]
    places: tuple[tuple[str, Span], ...]

    @property
    def glyphs(self) -> tuple[str, ...]:
        return tuple(glyph for axis in self.axes for glyph in axis)

    def error(self, glyph: str, message: str, hint: str) -> SpecError:
        span = dict(self.places)[glyph]
        return SpecError(message, source=self.text, file=self.file, span=span, hint=hint)

    def __str__(self) -> str:
        return self.text.strip()


def relayout(tensor: torch.Tensor, src: str, dst: str, /, **sizes: int) -> torch.Tensor:
    """The tensor stored in layout `src`, rearranged into layout `dst`.

    >>> import torch, indexattn
    >>> c_attn = torch.randn(768, 2304)  # GPT-2's Conv1D c_attn.weight: <i(Bμa)>
    >>> indexattn.relayout(c_attn, "<i(Bμa)>", "<(μBa)i>", B=3, mu=12).shape
    torch.Size([2304, 768])
    >>> w = torch.arange(6).reshape(6, 1)  # rows (Bμa) with B = 3, μ = 2, a = 1
    >>> indexattn.relayout(w, "<(Bμa)i>", "<(μBa)i>", B=3, mu=2).flatten().tolist()
    [0, 2, 4, 1, 3, 5]

    A layout is the subscript of a spec's tensor reference: one index per axis, a
    parenthesised group for a fused axis (row-major, as in einops), indices as letters,
    primed letters or macros (`<\\mu\\tau'a>`). Both layouts must name the same indices, each
    once; literals are not allowed (relayout moves axes, it does not slice). Leading axes
    of `tensor` beyond the layout are batch axes and pass through unchanged.

    A layout has no `index` lines, so sizes are keywords named after the *indices*: by
    their ASCII names (`mu=12`, `tau_p=5`) or their letters (`μ=12`). A fused axis tells the
    product of its indices' sizes; give all of them but one. Like `Tensor.reshape`, the
    result is a view where one is possible (call `.contiguous()` before saving it with a
    library that needs contiguous tensors).

    Raises SpecError for a malformed layout (with a caret under the place in the layout
    string), ShapeError for sizes that do not fit the tensor's shape, and TypeError for a
    keyword that names no index.
    """
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"relayout(): expected a torch.Tensor, got {type(tensor).__name__}")
    for layout in (src, dst):
        if not isinstance(layout, str):
            raise TypeError(f"relayout(): a layout is a str such as '<(Bμa)i>', not {layout!r}")
    source, target = parse_layout(src, "<src>"), parse_layout(dst, "<dst>")
    _same_indices(source, target)
    given = _given_sizes(source, sizes)
    shape = tuple(tensor.shape)
    split, perm, merged = _recipe(source, target, shape, tuple(sorted(given.items())))
    if split != shape:
        tensor = tensor.reshape(split)
    if perm != tuple(range(len(perm))):
        tensor = tensor.permute(perm)
    return tensor.reshape(merged)


@functools.lru_cache(maxsize=256)
def parse_layout(text: str, file: str = "<layout>") -> Layout:
    """`"<(Bμa)i>"` -> its axes, read by the spec lexer's own subscript reader (imported on
    first use: `import indexattn` should not pay for the parser's classes)."""
    from ..notation.lexer import Lexer
    from ..notation.syntax import Group, IndexName, Literal

    lexer = Lexer(text, file)
    start = len(text) - len(text.lstrip(" \t"))
    if not text.startswith("<", start):
        raise lexer.error(
            "expected '<' to open the layout",
            Span(1, start + 1),
            "a layout is written as the subscript of a tensor reference, e.g. '<(Bμa)i>'.",
        )
    lexer.pos = start + 1
    axes = lexer.subscript(Span(1, start + 1))
    after = len(text) - len(text[lexer.pos :].lstrip())  # the first character after '>'
    if after < len(text):
        raise lexer.error(
            "unexpected text after the layout's closing '>'", _span(text, after), "remove it."
        )
    glyphs: list[tuple[str, ...]] = []
    places: dict[str, Span] = {}
    for axis in axes:
        items = axis.items if isinstance(axis, Group) else (axis,)
        for item in items:
            if isinstance(item, Literal):
                raise lexer.error(
                    f"the literal {item.value} selects a slice, but relayout only moves axes",
                    item.span,
                    "name the index here, and slice the tensor before or after relayout.",
                )
            if item.glyph in places:
                raise lexer.error(
                    f"index {item.glyph} appears twice in this layout",
                    item.span,
                    "a layout names each index once: one index per axis or per part of a "
                    "fused axis.",
                )
            places[item.glyph] = item.span
        glyphs.append(tuple(item.glyph for item in items if isinstance(item, IndexName)))
    return Layout(text, file, tuple(glyphs), tuple(places.items()))


def _span(text: str, offset: int) -> Span:
    line_start = text.rfind("\n", 0, offset) + 1
    return Span(text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _same_indices(source: Layout, target: Layout) -> None:
    for this, other, role, other_role in (
        (source, target, "src", "dst"),
        (target, source, "dst", "src"),
    ):
        extra = [g for g in this.glyphs if g not in other.glyphs]
        if extra:
            raise this.error(
                extra[0],
                f"index {extra[0]} is in {role} but not in {other_role}, {other}",
                "relayout moves axes and cannot add or drop one: both layouts name the same "
                "indices.",
            )


def _given_sizes(layout: Layout, sizes: dict[str, object]) -> dict[str, int]:
    """Keyword sizes by index glyph: `mu=12` and `μ=12` both name μ."""
    names = {}
    for glyph in layout.glyphs:
        names[glyph] = names[ascii_name(glyph)] = glyph
    given: dict[str, int] = {}
    for key, value in sizes.items():
        glyph = names.get(key, names.get(normalise(key)))
        if glyph is None:
            listed = ", ".join(f"{ascii_name(g)}=..." for g in layout.glyphs)
            raise TypeError(
                f"relayout() got {key}={value!r}, but {key} is no index of {layout}: sizes "
                f"are named after the layout's indices ({listed})"
            )
        if glyph in given:
            raise TypeError(f"relayout() got the size of index {glyph} twice")
        if isinstance(value, bool):
            raise TypeError(f"relayout(): {key} must be a whole number, got {value!r}")
        try:
            size = operator.index(value)
        except TypeError:
            raise TypeError(f"relayout(): {key} must be a whole number, got {value!r}") from None
        if size < 1:
            raise ShapeError(f"relayout(): {key} = {size}, but a size must be positive")
        given[glyph] = size
    return given


@functools.lru_cache(maxsize=1024)
def _recipe(
    source: Layout, target: Layout, shape: tuple[int, ...], given: tuple[tuple[str, int], ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The split shape, the permutation and the merged shape that take source to target."""
    rank = len(source.axes)
    if len(shape) < rank:
        raise ShapeError(
            f"relayout: src {source} has {rank} axes (leading batch axes aside), but the tensor "
            f"has shape {shape}"
        )
    batch = shape[: len(shape) - rank]
    sizes = _solve(source, shape[len(batch) :], dict(given))
    order = source.glyphs
    split = batch + tuple(sizes[g] for g in order)
    perm = tuple(range(len(batch))) + tuple(len(batch) + order.index(g) for g in target.glyphs)
    merged = batch + tuple(math.prod(sizes[g] for g in axis) for axis in target.axes)
    return split, perm, merged


def _solve(layout: Layout, shape: tuple[int, ...], sizes: dict[str, int]) -> dict[str, int]:
    """Each index's size from the axes it is on and the given sizes, checked."""
    pending = list(enumerate(zip(layout.axes, shape)))
    while pending:
        left = []
        for position, (axis, actual) in pending:
            unknown = [g for g in axis if g not in sizes]
            known = math.prod(sizes[g] for g in axis if g in sizes)
            if not unknown and known != actual:
                raise ShapeError(_mismatch(layout, position, axis, actual, sizes))
            if len(unknown) == 1 and known > 0:
                if actual % known:
                    raise ShapeError(_not_a_multiple(layout, position, axis, actual, sizes))
                sizes[unknown[0]] = actual // known
            elif unknown:
                left.append((position, (axis, actual)))
        if len(left) == len(pending):
            position, (axis, actual) = left[0]
            unknown = [g for g in axis if g not in sizes]
            raise ShapeError(
                f"relayout: src {layout}, axis {position} ({''.join(axis)}) has size {actual} "
                f"= {_product(axis)}, which does not tell {', '.join(unknown)} apart: give all "
                f"but one of them ({', '.join(f'{ascii_name(g)}=...' for g in unknown)})"
            )
        pending = left
    return sizes


def _mismatch(layout, position, axis, actual, sizes) -> str:
    expected = math.prod(sizes[g] for g in axis)
    values = "·".join(str(sizes[g]) for g in axis)
    formula = f"{_product(axis)} = {values}" + (f" = {expected}" if len(axis) > 1 else "")
    return (
        f"relayout: src {layout}, axis {position} ({''.join(axis)}): expected size "
        f"{formula}, got {actual}"
    )


def _not_a_multiple(layout, position, axis, actual, sizes) -> str:
    known = [g for g in axis if g in sizes]
    divisor = math.prod(sizes[g] for g in known)
    values = "·".join(str(sizes[g]) for g in known)
    formula = f"{_product(known)} = {values}" + (f" = {divisor}" if len(known) > 1 else "")
    return (
        f"relayout: src {layout}, axis {position} ({''.join(axis)}) has size {actual}, "
        f"which is not a multiple of {formula}"
    )


def _product(glyphs) -> str:
    return "·".join(glyphs)
