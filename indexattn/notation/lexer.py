"""Spec text -> statements of tokens. Subscripts `_<...>` are lexed whole, so `<` in an
expression is always a comparison."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from ..errors import Span, SpecError
from .names import GREEK, normalise
from .syntax import Group, IndexName, Literal

NUMBER = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
DIGITS = frozenset("0123456789")
OPERATORS = (
    "**",
    "<=",
    ">=",
    "==",
    "!=",
    "+",
    "-",
    "*",
    "/",
    "^",
    "(",
    ")",
    "[",
    "]",
    ",",
    "=",
    "~",
    ":",
    "<",
    ">",
)
# A line that ends with one of these continues on the next line ...
TRAILING = frozenset(
    {
        "+",
        "-",
        "*",
        "/",
        "^",
        "**",
        "<",
        "<=",
        ">",
        ">=",
        "==",
        "!=",
        "=",
        ",",
        "~",
        ":",
        "and",
        "or",
        "not",
    }
)
# ... and so does a statement whose next line starts with one of these.
LEADING = frozenset({"+", "-", "*", "/", "^", "**"})


@dataclass(frozen=True)
class Bracket:
    """A computed position's tokens, `[...]` in a subscript, before the parser reads them."""

    tokens: tuple[Token, ...]
    span: Span


@dataclass(frozen=True)
class Token:
    kind: str  # NAME, REF, NUMBER, OP, END
    text: str
    span: Span
    value: object = None
    spaced: bool = True  # white space (or a line start) before the token


@dataclass(frozen=True)
class Lexed:
    statements: tuple[tuple[Token, ...], ...]
    comments: dict[int, str]  # line -> comment text


class Lexer:
    """Reads one spec; `lex()` returns its statements and comments or raises SpecError."""

    def __init__(self, source: str, file: str) -> None:
        self.src, self.file = source, file
        self.pos, self.line, self.line_start = 0, 1, 0
        self.tokens: list[Token | None] = []  # None marks a line break outside brackets
        self.comments: dict[int, str] = {}
        self.depth: list[Token] = []

    def error(self, message: str, span: Span, hint: str = "") -> SpecError:
        return SpecError(message, source=self.src, file=self.file, span=span, hint=hint)

    def here(self, length: int = 1) -> Span:
        return Span(self.line, self.pos - self.line_start + 1, length)

    def lex(self) -> Lexed:
        spaced = True
        while self.pos < len(self.src):
            ch = self.src[self.pos]
            if ch == "\n":
                self.newline()
                spaced = True
            elif ch in " \t\r\f\v":
                self.pos += 1
                spaced = True
            elif ch == "#":
                self.comment()
            else:
                self.tokens.append(self.token(spaced))
                spaced = False
        if self.depth:
            opener = self.depth[-1]
            raise self.error(
                f"'{opener.text}' is never closed",
                opener.span,
                f"add the matching '{')' if opener.text == '(' else ']'}'.",
            )
        self.tokens.append(None)
        return Lexed(self.join(), self.comments)

    def newline(self) -> None:
        if not self.depth:
            self.tokens.append(None)
        self.pos += 1
        self.line += 1
        self.line_start = self.pos

    def comment(self) -> None:
        end = self.src.find("\n", self.pos)
        end = len(self.src) if end < 0 else end
        self.comments[self.line] = self.src[self.pos + 1 : end].strip()
        self.pos = end

    def token(self, spaced: bool) -> Token:
        ch = self.src[self.pos]
        if ch == "\\" or _starts_name(ch):
            return self.name(spaced)
        if ch in DIGITS or (ch == "." and self.src[self.pos + 1 : self.pos + 2] in DIGITS):
            return self.number(spaced)
        for op in OPERATORS:
            if self.src.startswith(op, self.pos):
                return self.operator(op, spaced)
        raise self.error(
            f"unexpected character {_describe(ch)}",
            self.here(),
            "a spec holds names, numbers, subscripts _<...> and + - * / ^ "
            "( ) , = ~ : < > comparisons; anything else goes after a '#'.",
        )

    def operator(self, op: str, spaced: bool) -> Token:
        tok = Token("OP", op, self.here(len(op)), op, spaced)
        self.pos += len(op)
        if op in "([":
            self.depth.append(tok)
        elif op in ")]":
            if not self.depth:
                raise self.error(
                    f"'{op}' closes nothing",
                    tok.span,
                    "remove it, or add the opening bracket it belongs to.",
                )
            opener = self.depth.pop()
            if (opener.text, op) not in {("(", ")"), ("[", "]")}:
                raise self.error(
                    f"expected '{')' if opener.text == '(' else ']'}' to close the "
                    f"'{opener.text}' opened at column {opener.span.col}",
                    tok.span,
                )
        return tok

    def number(self, spaced: bool) -> Token:
        match = NUMBER.match(self.src, self.pos)
        assert match is not None
        text, span = match.group(0), self.here(match.end() - match.start())
        self.pos = match.end()
        try:
            value: int | float = int(text) if text.isdigit() else float(text)
        except ValueError:
            raise self.error(f"the number {text[:20]}... has too many digits", span) from None
        if value in (float("inf"), float("-inf")) or (isinstance(value, int) and value > 2**63):
            raise self.error("this number is too large", span, "write inf for infinity.")
        return Token("NUMBER", text, span, value, spaced)

    def name(self, spaced: bool) -> Token:
        start_col, start = self.pos - self.line_start + 1, self.pos
        if self.src[self.pos] == "\\":
            glyph = self.macro()
        else:
            while self.pos < len(self.src) and _continues_name(self.src[self.pos]):
                self.pos += 1
            glyph = normalise(self.src[start : self.pos])
            if not glyph.isidentifier():
                raise self.error(
                    f"{glyph!r} is not a name", Span(self.line, start_col, self.pos - start)
                )
        if glyph.endswith("_") and self.src.startswith("<", self.pos):
            return self.reference(glyph[:-1], start, start_col, spaced)
        glyph += self.primes()
        return Token("NAME", glyph, Span(self.line, start_col, self.pos - start), glyph, spaced)

    def macro(self) -> str:
        span = self.here()
        match = re.compile(r"\\([A-Za-z]+)").match(self.src, self.pos)
        glyph = GREEK.get(match.group(1)) if match else None
        if glyph is None:
            word = match.group(0) if match else "\\"
            raise self.error(
                f"unknown index macro {word}",
                Span(span.line, span.col, len(word)),
                "write a Greek letter's name (\\mu, \\tau, \\Delta) or the letter itself.",
            )
        self.pos = match.end()
        return glyph

    def primes(self) -> str:
        start = self.pos
        while self.src.startswith("'", self.pos):
            self.pos += 1
        return "'" * (self.pos - start)

    def reference(self, name: str, start: int, start_col: int, spaced: bool) -> Token:
        self.pos += 1  # the "<"
        opened = Span(self.line, self.pos - self.line_start, 1)
        if not name:
            raise self.error(
                "a subscript needs a name before '_<'",
                opened,
                "write the tensor's name, e.g. X_<τi>.",
            )
        axes = self.subscript(opened)
        span = Span(opened.line, start_col, self.pos - start if opened.line == self.line else 1)
        return Token("REF", name, span, (name, axes), spaced)

    def subscript(self, opened: Span) -> tuple:
        axes: list = []
        group: list | None = None
        group_span = opened
        while True:
            if self.pos >= len(self.src):
                raise self.error(
                    "expected '>' to close this index list",
                    opened,
                    "write the indices and a closing '>', e.g. X_<τi>.",
                )
            ch, span = self.src[self.pos], self.here()
            target = axes if group is None else group
            if ch == ">":
                if group is not None:
                    raise self.error(
                        f"expected ')' to close the index group opened at column {group_span.col}",
                        span,
                        "close the group inside the list, e.g. W_<(μa)i>.",
                    )
                self.pos += 1
                return tuple(axes)
            if ch == "\n":
                self.newline_in_subscript()
            elif ch in " \t\r":
                self.pos += 1
            elif ch == "(":
                if group is not None:
                    raise self.error(
                        "index groups do not nest", span, "write one flat group, e.g. (μBa)."
                    )
                group, group_span = [], span
                self.pos += 1
            elif ch == ")":
                if group is None:
                    raise self.error("')' closes no index group", span)
                if not group:
                    raise self.error(
                        "an empty index group",
                        group_span,
                        "put the fused indices inside, e.g. (μa).",
                    )
                self.pos += 1
                axes.append(
                    Group(
                        tuple(group), Span(span.line, group_span.col, span.col - group_span.col + 1)
                    )
                )
                group = None
            elif ch in DIGITS:
                self.pos += 1
                target.append(Literal(int(ch), span))
            elif ch == "[":
                target.append(self.bracket(span))
            elif ch == "\\" or ch.isalpha():
                target.append(self.index_name(ch, span))
            else:
                raise self.error(
                    f"unexpected character {_describe(ch)} in the index list "
                    f"opened at column {opened.col}",
                    span,
                    "indices are single letters (μ, τ', a), \\macros (\\mu) or "
                    "digits (literal slices); close the list with '>'.",
                )

    def bracket(self, opened: Span) -> Bracket:
        """`[τ' - τ + N - 1]`: the tokens of a computed position, parsed by the parser."""
        self.pos += 1
        tokens: list[Token] = []
        base, spaced = len(self.depth), True
        while not (self.src.startswith("]", self.pos) and len(self.depth) == base):
            if self.pos >= len(self.src) or self.src[self.pos] == "\n":
                raise self.error(
                    f"expected ']' to close the position opened at column {opened.col}",
                    opened,
                    "write the position on one line, e.g. E_<μ[τ' - τ + N - 1]>.",
                )
            if self.src[self.pos] in " \t\r":
                self.pos, spaced = self.pos + 1, True
                continue
            tokens.append(self.token(spaced))
            spaced = False
        self.pos += 1
        span = Span(opened.line, opened.col, self.pos - self.line_start - opened.col + 1)
        if not tokens:
            raise self.error("an empty position", span, "write an index expression, e.g. [τ - 1].")
        return Bracket(tuple(tokens), span)

    def newline_in_subscript(self) -> None:
        self.pos += 1
        self.line += 1
        self.line_start = self.pos

    def index_name(self, ch: str, span: Span) -> IndexName:
        if ch == "\\":
            glyph = self.macro()
        else:
            self.pos += 1
            while self.pos < len(self.src) and unicodedata.combining(self.src[self.pos]):
                self.pos += 1
            glyph = normalise(self.src[span.col - 1 + self.line_start : self.pos])
        if len(glyph) != 1 or not glyph.isalpha():
            raise self.error(
                f"{glyph!r} is not one letter",
                span,
                "an index is one letter; write its letters as separate indices.",
            )
        glyph += self.primes()
        return IndexName(
            glyph, Span(span.line, span.col, self.pos - self.line_start - span.col + 1)
        )

    def join(self) -> tuple[tuple[Token, ...], ...]:
        """Physical lines -> statements, by the continuation rules of the language."""
        out: list[tuple[Token, ...]] = []
        current: list[Token] = []
        following: Token | None = None
        for tok in reversed(self.tokens):  # each line break learns the token after it
            if tok is None:
                current.append(following)  # type: ignore[arg-type]
            else:
                following = tok
        after = iter(reversed(current))
        current = []
        for tok in self.tokens:
            if tok is not None:
                current.append(tok)
            elif not _continues(current, next(after)):
                out.append(tuple(current))
                current = []
        return tuple(stmt for stmt in out if stmt)


def _continues(current: list[Token], nxt: Token | None) -> bool:
    if not current:
        return False
    if current[-1].kind in ("OP", "NAME") and current[-1].text in TRAILING:
        return True
    return nxt is not None and nxt.kind == "OP" and nxt.text in LEADING


def _starts_name(ch: str) -> bool:
    return ch == "_" or ch.isidentifier()


def _continues_name(ch: str) -> bool:
    return ch == "_" or ("a" + ch).isidentifier()


def _describe(ch: str) -> str:
    if ch.isprintable():
        return repr(ch)
    return f"U+{ord(ch):04X} ({unicodedata.name(ch, 'a control character').lower()})"


def lex(source: str, file: str = "<spec>") -> Lexed:
    """`lex("index τ : N")` -> statements of tokens, and the comments by line."""
    return Lexer(source, file).lex()
