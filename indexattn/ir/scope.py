"""The one namespace of a spec: every index, size, tensor and scalar by name, each claimed
once, with its ASCII name; lookups that say what to declare when a name is unknown."""

from __future__ import annotations

import difflib
import unicodedata

import sympy

from ..errors import Span, SpecError
from ..notation import syntax as ast
from ..notation.names import ascii_name
from .implied import grouped_in
from .nodes import Index, Scalar, Tensor


class Scope:
    """What a spec has declared or defined so far, and the mistakes of naming."""

    def __init__(self, doc: ast.Document) -> None:
        self.doc = doc
        self.lines = doc.source.split("\n")
        self.indices: dict[str, Index] = {}
        self.sizes: dict[str, sympy.Symbol] = {}
        self.size_asciis: dict[str, str] = {}
        self.tensors: dict[str, Tensor] = {}
        self.scalars: dict[str, Scalar] = {}
        self.names: dict[str, tuple[str, Span]] = {}  # spec name -> (kind, where)
        self.asciis: dict[str, str] = {}  # ascii name -> spec name
        self.spellings: dict[str, tuple[str, Span]] = {}  # name -> first spelling, where
        self.defined_later = {s.lhs.name: s for s in doc.statements if isinstance(s, ast.Equation)}

    def error(self, message: str, span: Span | None, hint: str = "") -> SpecError:
        return SpecError(message, source=self.doc.source, file=self.doc.file, span=span, hint=hint)

    def suggest(self, word: str, choices) -> str:
        close = difflib.get_close_matches(word, list(choices), n=1)
        return f" Did you mean {close[0]}?" if close else ""

    def claim(self, name: str, kind: str, span: Span) -> str:
        """Registers a name in the one namespace of the spec; returns its ASCII name."""
        if name in self.names:
            other, where = self.names[name]
            raise self.error(
                f"{name} is declared twice: as {other} at line {where.line}, and here as {kind}",
                span,
                "give each index, tensor, scalar and size its own name.",
            )
        ascii = ascii_name(name)
        if ascii in self.asciis:
            raise self.error(
                f"{name} and {self.asciis[ascii]} are both {ascii} in Python",
                span,
                "rename one of them.",
            )
        self.names[name] = (kind, span)
        self.asciis[ascii] = name
        return ascii

    def new_size(self, name: ast.Name) -> sympy.Symbol:
        self.size_asciis[name.name] = self.claim(name.name, "a size", name.span)
        symbol = sympy.Symbol(name.name, integer=True, positive=True)
        self.sizes[name.name] = symbol
        return symbol

    def spelled(self, name: str, span: Span) -> None:
        """NFKC makes µ (micro sign) and μ (mu) one letter; a spec that mixes them is told."""
        line = self.lines[span.line - 1]
        key = line[span.col - 1 : span.col - 1 + span.length]
        if key.startswith("\\"):  # \mu names μ whichever way μ is written elsewhere
            return
        first = self.spellings.setdefault(name, (key, span))
        if first[0] != key:
            raise self.error(
                f"{_codepoints(key)} here and {_codepoints(first[0])} at line {first[1].line} "
                "are one name after Unicode normalisation (NFKC)",
                span,
                f"write {name} the same way throughout.",
            )

    def index(self, item: ast.IndexName) -> Index:
        self.spelled(item.glyph, item.span)
        found = self.indices.get(item.glyph)
        if found is None:
            grouped = grouped_in(self.doc, item.glyph)
            fused = (
                f" ({grouped.ref.name}'s fused axis fixes only a product; an index alone on "
                "an axis of an input, param or buffer needs no line)"
                if grouped
                else ""
            )
            raise self.error(
                f"index {item.glyph} is not declared",
                item.span,
                f"add a line: index {item.glyph} : SIZE{fused}."
                + self.suggest(item.glyph, self.indices),
            )
        return found

    def tensor(self, node: ast.Ref) -> Tensor:
        if node.name in self.tensors:
            return self.tensors[node.name]
        if node.name in self.defined_later:
            line = self.defined_later[node.name].span.line
            raise self.error(
                f"{node.name} is used before it is defined (at line {line})",
                node.span,
                "move its equation above this one.",
            )
        raise self.error(
            f"tensor {node.name} is not declared",
            node.span,
            f"declare it (input {node.name}_<...> or param {node.name}_<...>), "
            "or define it by an equation above." + self.suggest(node.name, self.tensors),
        )


def _codepoints(text: str) -> str:
    """`µ` -> `µ (U+00B5 MICRO SIGN)`."""
    names = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in text if c != "'")
    return f"{text} ({names})"
