"""Spec text -> syntax tree with source spans: lexing, parsing and re-printing; no meaning yet.

The parser is imported on first use: it reads the operator table, which needs sympy, and
`relayout` (imported with the package) needs only the lexer."""

__all__ = ["equation", "parse", "unparse"]


def __getattr__(name: str):
    if name == "parse":
        from .parser import parse

        return parse
    if name in ("equation", "unparse"):
        from . import printer

        return getattr(printer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
