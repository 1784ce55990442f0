"""One error root for indexattn, and the caret rendering every spec error uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A place in a spec: 1-based line and column, and how many characters it covers."""

    line: int
    col: int
    length: int = 1

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


class IndexAttnError(Exception):
    """The root of every error indexattn raises on purpose."""


class SpecError(IndexAttnError, ValueError):
    """A mistake in a spec: names the file, line and column, quotes the line, says what to write."""

    def __init__(
        self,
        message: str,
        *,
        source: str = "",
        file: str = "<spec>",
        span: Span | None = None,
        hint: str = "",
    ) -> None:
        self.message, self.file, self.span, self.hint = message, file, span, hint
        super().__init__(render(message, source=source, file=file, span=span, hint=hint))


class ShapeError(IndexAttnError, ValueError):
    """A tensor whose shape does not fit the spec at call time."""


def render(message: str, *, source: str, file: str, span: Span | None, hint: str) -> str:
    """The message as a compiler prints it: place, the line, a caret under the place, a hint."""
    if span is None:
        head = f"{file}: error: {message}"
        return head + ("\n  " + hint.replace("\n", "\n  ") if hint else "")
    lines = source.split("\n")  # as the lexer counts lines: U+2028 is not a break
    text = lines[span.line - 1] if 0 < span.line <= len(lines) else ""
    shown = "".join(ch if ch.isprintable() else "?" for ch in text.rstrip("\r"))
    caret = " " * (span.col - 1) + "^" * max(1, min(span.length, len(shown) - span.col + 1))
    out = [f"{file}:{span}: error: {message}", "  " + shown, "  " + caret]
    if hint:
        out.append("  " + hint.replace("\n", "\n  "))
    return "\n".join(out)
