"""Equations run inline, as einsum runs a string: `attend(EQUATIONS, **tensors)` declares what
the equations leave undeclared from the call itself, compiles once per text and kind of call.

Two caches, as einops keeps a pattern's recipe and then its shapes: the text is read once
(`reading`: which tensors it reads without defining, in which layout, which bare names may be
scalars), then compiled once per kind of call (which arguments are integer tensors, float
tensors or numbers); sizes are solved per shape by the compiled spec, as for any spec."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import lru_cache

from .errors import Span, SpecError
from .ir.implied import items, nodes
from .notation import parse, printer
from .notation import syntax as ast
from .ops import CONSTANTS

FILE = "<attend>"


@dataclass(frozen=True)
class Reading:
    """What a text of equations leaves to the call: the tensors it reads and does not define
    or declare (each with the first reference that shows its layout), and the bare names that
    are no index, size, scalar or constant (a number passed under one is a scalar)."""

    text: str
    at: int  # the line of the first equation: the declarations written go just above it
    inputs: tuple[tuple[str, ast.Ref], ...]
    free: frozenset[str]
    sizes: frozenset[str]  # sizes the text's own index lines name: a number passed is one


def attend(equations: str, /, **arguments):
    """The equations' last output (or those of an `output` line) on the tensors passed.

    Every index's range is read off the tensors; an input is any tensor the equations read
    but do not define; an integer tensor is an integer input; a Python number a scalar. Lines
    of the spec language (`index`, `input`, `scalar`, ...) are allowed and win.

    >>> import torch
    >>> q = k = v = torch.ones(2, 3, 4)
    >>> attend("O_<τc> = softmax_<τ'>(Q_<τa> K_<τ'a> / sqrt(n_a)) V_<τ'c>", Q=q, K=k, V=v).shape
    torch.Size([2, 3, 4])
    """
    reading = read(equations)
    kinds = tuple((name, _kind(value)) for name, value in arguments.items())
    return compiled(reading, kinds)(**arguments)


@lru_cache(maxsize=256)
def read(text: str) -> Reading:
    """A text of equations read once: parsed, its undeclared inputs and free names found."""
    doc = parse(text, "attend", FILE)
    defined = {s.lhs.name for s in doc.statements if isinstance(s, ast.Equation)}
    declared = {s.ref.name for s in doc.statements if isinstance(s, ast.TensorDecl)}
    named = {s.name for s in doc.statements if isinstance(s, ast.ScalarDecl)}
    sizes = {
        n.name
        for s in doc.statements
        if isinstance(s, ast.IndexDecl)
        for n in ast.walk(s.size)
        if isinstance(n, ast.Name)
    }
    layouts: dict[str, list[ast.Ref]] = {}
    glyphs, names = set(), []
    for stmt in doc.statements:
        for node in nodes(stmt):
            if isinstance(node, ast.Ref):
                glyphs |= {i.glyph for i in items(node)}
                if node.name not in defined | declared:
                    layouts.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.IndexName):
                glyphs.add(node.glyph)
            elif isinstance(node, ast.Name):
                names.append(node.name)
    inputs = tuple((name, _layout(name, refs, text)) for name, refs in layouts.items())
    free = frozenset(names) - glyphs - named - sizes - set(CONSTANTS)
    at = next((s.span.line for s in doc.statements if isinstance(s, ast.Equation)), len(text))
    return Reading(text, at, inputs, free, frozenset(sizes))


@lru_cache(maxsize=256)
def compiled(reading: Reading, kinds: tuple[tuple[str, str], ...]):
    """The spec of these equations for a call of these kinds: declarations written for what
    the call passes, then the equations as the user wrote them."""
    from .spec import compile_spec

    kind = dict(kinds)
    lines = []
    for name, ref in reading.inputs:
        if kind.get(name) not in ("int", "float"):
            raise TypeError(
                f"attend(): the equations read the tensor {name}; pass it: {name}=<tensor>"
            )
        lines.append(f"input {printer.ref(ref)}" + (" : int" if kind[name] == "int" else ""))
    lines += [f"scalar {n} = 0" for n, k in kinds if k == "number" and n in reading.free]
    above = reading.text.split("\n")
    text = "\n".join(above[: reading.at - 1] + lines + above[reading.at - 1 :])
    try:
        return compile_spec(text, name="attend")
    except SpecError as error:
        raise _moved(error, reading.at, len(lines), reading.text) from None


def _kind(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "float" if value.is_floating_point() or value.is_complex() else "int"
    return "number" if isinstance(value, numbers.Number) else type(value).__name__


def _layout(name: str, refs: list[ast.Ref], text: str) -> ast.Ref:
    """The first reference that names each axis by indices alone: the input's declaration."""
    for ref in refs:
        if all(isinstance(i, ast.IndexName) for i in items(ref, plain=False)):
            return ref
    raise SpecError(
        f"every reference to {name} selects a slice or a position, so its axes are not known",
        source=text,
        file=FILE,
        span=refs[0].span,
        hint=f"declare it on a line of its own: input {name}_<...> with an index for each axis.",
    )


def _moved(error: SpecError, at: int, lines: int, text: str) -> SpecError:
    """An error in the user's text, placed there: the declarations written above line `at`
    shift the lines below by `lines`; one in those declarations is told as it is."""
    if error.span is None or at <= error.span.line < at + lines:
        return error
    line = error.span.line - lines * (error.span.line >= at)
    span = Span(line, error.span.col, error.span.length)
    return SpecError(error.message, source=text, file=FILE, span=span, hint=error.hint)
