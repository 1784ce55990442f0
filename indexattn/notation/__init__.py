"""Spec text -> syntax tree with source spans: lexing, parsing and re-printing; no meaning yet."""

from .parser import parse
from .printer import equation, unparse

__all__ = ["equation", "parse", "unparse"]
