r"""Spec -> LaTeX: the equations as a paper prints them, by a subclass of sympy's LaTeX printer
(sympy prints sizes, numbers and counts; our `_print_<Node>` methods print tensor references
and operators), in plain ASCII that pdflatex accepts.

The equations are printed from the syntax tree the IR was checked from, so they read as
written: `Q K / sqrt(d_k) - m (τ - τ')` stays that, where the IR has folded the
constants into one sympy factor and reordered `τ' > τ` to `τ < τ'`. The IR supplies what the
syntax cannot: which indices each product sums, for the two options (contracted indices
raised on their second occurrence, explicit `\sum`). Templates and binding strengths of
functions and operators come from the operator table (indexattn/ops.py).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import ClassVar

import sympy
from sympy.printing.latex import LatexPrinter

from .. import ir
from ..errors import Span
from ..notation import syntax as ast
from ..notation.names import ACCENTS, GLYPH_TO_MACRO, ascii_name
from ..ops import ATOM, CONSTANTS, FUNCTIONS, OPERATORS, REDUCTIONS

# Greek capitals that LaTeX writes as Latin letters (there is no \Alpha).
LATIN_LOOKALIKE = dict(
    zip(
        "ΑΒΕΖΗΙΚΜΝΟΡΤΧο",
        "ABEZHIKMNOPTXo",
    )
)
# A fraction is set apart by its bar: it binds tighter than any operator, as printed.
FRACTION = ATOM - 1
TIMES = OPERATORS["*"].level


# -- names and text


def math_name(name: str) -> str:
    r"""A spec name in math mode: `d_k`, `W_O`, `\tilde{A}`, `\tau'`, `\mathit{c\_attn}`."""
    base = name.rstrip("'")
    head, _, sub = base.partition("_")
    if _is_glyph(head) and sub and "_" not in sub:
        script = _glyph(sub) if _is_glyph(sub) else _word(sub)
        text = _glyph(head) + "_" + (script if len(script) == 1 else "{" + script + "}")
    elif _is_glyph(base):
        text = _glyph(base)
    else:
        text = r"\mathit{" + r"\_".join(_word(w) for w in base.split("_")) + "}"
    return text + "'" * (len(name) - len(base))


def _is_glyph(text: str) -> bool:
    """One letter and its accents."""
    marks = unicodedata.normalize("NFD", text)
    return (
        bool(marks)
        and not any(unicodedata.combining(c) for c in marks[:1])
        and all(unicodedata.combining(c) for c in marks[1:])
    )


def _glyph(text: str) -> str:
    base, *marks = unicodedata.normalize("NFD", text)
    if base.isascii():
        out = base
    elif base in GLYPH_TO_MACRO:
        out = "\\" + GLYPH_TO_MACRO[base]
    elif base in LATIN_LOOKALIKE:
        out = LATIN_LOOKALIKE[base]
    else:
        return _fallback(text)
    for mark in marks:
        if mark not in ACCENTS:
            return _fallback(text)
        out = f"\\{ACCENTS[mark]}{{{out}}}"
    return out


def _fallback(text: str) -> str:
    """A character LaTeX has no glyph for: the ASCII name the generated code uses."""
    return r"\mathrm{" + ascii_name(text).replace("_", r"\_") + "}"


def _word(word: str) -> str:
    """A run of letters and digits; glyphs that are macros are braced so they cannot run on."""
    out = []
    for cluster in re.findall(
        r".[\u0300-\u036f\u20d0-\u20ff]*", unicodedata.normalize("NFC", word)
    ):
        glyph = _glyph(cluster)
        out.append(glyph if len(glyph) == 1 else "{" + glyph + "}")
    return "".join(out)


def text(value: str) -> str:
    r"""Any text in LaTeX's text mode, escaped so that it prints as itself and can never run a
    command: `\input` becomes `\textbackslash{}input`."""
    return "".join(_text_char(c) for c in unicodedata.normalize("NFC", value))


TEXT = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "#": r"\#",
    "%": r"\%",
    "_": r"\_",
    "^": r"\textasciicircum{}",
    "~": r"\textasciitilde{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': "''",
    "-": "-{}",
    "\n": " ",
    "\u00a0": "~",
    "\t": " ",
    "·": r"$\cdot$",
    "×": r"$\times$",
    "√": r"$\surd$",
    "≠": r"$\neq$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "≈": r"$\approx$",
    "→": r"$\rightarrow$",
    "←": r"$\leftarrow$",
    "−": "$-$",
    "–": "--",
    "—": "---",
    "‘": "`",
    "’": "'",
    "“": "``",
    "”": "''",
    "…": r"\ldots{}",
    "ᵀ": r"$^{\mathsf{T}}$",
    "²": "$^2$",
    "³": "$^3$",
    "′": "$'$",
}
TEXT_ACCENTS = {
    "tilde": "~",
    "hat": "^",
    "bar": "=",
    "dot": ".",
    "ddot": '"',
    "acute": "'",
    "grave": "`",
    "breve": "u",
    "check": "v",
}


def _text_char(ch: str) -> str:
    if ch in TEXT:
        return TEXT[ch]
    if " " <= ch <= "~":
        return ch
    base, *marks = unicodedata.normalize("NFD", ch)
    if (
        base.isascii()
        and base.isalpha()
        and marks
        and all(ACCENTS.get(m) in TEXT_ACCENTS for m in marks)
    ):
        out = base
        for mark in marks:
            out = f"\\{TEXT_ACCENTS[ACCENTS[mark]]}{{{out}}}"
        return out
    glyph = _glyph(ch) if ch.isprintable() and ch.isalpha() else ""
    if glyph and not glyph.startswith(r"\mathrm"):
        return f"${glyph}$"
    return r"\texttt{[U+" + f"{ord(ch):04X}" + "]}"


# -- which indices each product sums: the IR's products, at the syntax nodes they were built at


@dataclass(frozen=True)
class Context:
    """What the printer knows of one equation beyond its syntax."""

    sums: dict = field(default_factory=dict)  # syntax node -> indices its product sums
    raised: dict = field(default_factory=dict)  # syntax Ref -> glyphs written as superscripts
    constants: frozenset = frozenset()  # names that are constants here (pi, not a scalar pi)


def _context(eq: ir.Equation, spec: ir.Spec) -> Context:
    products = [n for n in ir.walk(eq.rhs) if isinstance(n, ir.Product) and n.summed]
    raised: dict[ast.Ref, set[str]] = {}
    for product in products:
        for index in product.summed:
            for ref in _later_occurrences(product, index):
                raised.setdefault(ref.source, set()).add(index.glyph)
    sums = {p.source: p.summed for p in products if p.source is not None}
    declared = {i.glyph for i in spec.indices} | {s.name for s in spec.scalars}
    return Context(sums, raised, frozenset(CONSTANTS) - declared - {str(s) for s in spec.sizes})


def _later_occurrences(product: ir.Product, index: ir.Index):
    """The references that carry a summed index after the factor that first carries it."""
    carriers = [f for f in product.factors if index in f.free]
    for factor in carriers[1:]:
        yield from _bound_refs(factor, index)


def _bound_refs(node: ir.Node, index: ir.Index):
    if isinstance(node, ir.Ref) and index in node.free:
        yield node
    if isinstance(node, ir.Reduce) and not node.keeps and index in node.over:
        return
    for child in ir.children(node):
        yield from _bound_refs(child, index)


# -- the printer


class SpecPrinter(LatexPrinter):
    r"""Syntax-tree nodes and sympy expressions -> LaTeX.

    >>> SpecPrinter().doprint(sympy.Symbol("d_k") * 4)
    '4 d_k'
    """

    _default_settings: ClassVar[dict] = {
        **LatexPrinter._default_settings,
        "raised": False,
        "sums": False,
    }

    def __init__(self, settings: dict | None = None, context: Context | None = None) -> None:
        super().__init__(settings)
        self.context = context or Context()

    def _print(self, expr, **kwargs) -> str:
        out = super()._print(expr, **kwargs)
        summed = self.context.sums.get(expr) if isinstance(expr, ast.Expr) else None
        if summed and self._settings["sums"]:
            return r"\sum_{" + _join(math_name(i.glyph) for i in summed) + "} " + out
        return out

    def _print_Symbol(self, expr, style: str = "plain") -> str:
        return math_name(expr.name)

    def level(self, node: ast.Expr) -> int:
        """How tightly a node binds as printed: its operands below this get brackets."""
        if isinstance(node, ast.Binary):
            return FRACTION if node.op == "/" else OPERATORS[node.op].level
        if isinstance(node, ast.Unary) and node.op != "+":
            return OPERATORS[UNARY[node.op]].level
        if isinstance(node, ast.Unary):  # printed as its operand alone
            return self.level(node.operand)
        if self._settings["sums"] and node in self.context.sums:
            return TIMES
        return ATOM

    def wrapped(self, node: ast.Expr, level: int) -> str:
        out = self._print(node)
        if self.level(node) < level:
            return rf"\left({out}\right)"
        return out

    # -- leaves

    def _print_Ref(self, node: ast.Ref) -> str:
        name = math_name(node.name)
        if "_" in name.replace(r"\_", ""):
            name = f"({name})"
        up = self.context.raised.get(node, set()) if self._settings["raised"] else set()
        runs: list[tuple[bool, list[str]]] = []
        for axis in node.axes:
            items = axis.items if isinstance(axis, ast.Group) else (axis,)
            glyphs = [i.glyph for i in items if isinstance(i, ast.IndexName)]
            raised = bool(glyphs) and all(g in up for g in glyphs)
            piece = _join(map(self._print, items))
            piece = f"({piece})" if isinstance(axis, ast.Group) else piece
            if runs and runs[-1][0] == raised:
                runs[-1][1].append(piece)
            else:
                runs.append((raised, [piece]))
        scripts = "{}".join(("^" if up else "_") + "{" + _join(p) + "}" for up, p in runs)
        return name + scripts

    def _print_IndexName(self, node: ast.IndexName) -> str:
        return math_name(node.glyph)

    def _print_Computed(self, node: ast.Computed) -> str:
        return "[" + self._print(node.expr) + "]"

    def _print_Literal(self, node: ast.Literal) -> str:
        return str(node.value)

    def _print_Num(self, node: ast.Num) -> str:
        value = node.value
        return self._print(sympy.Integer(value) if isinstance(value, int) else sympy.Float(value))

    def _print_Inf(self, node: ast.Inf) -> str:
        return r"\infty"

    def _print_Name(self, node: ast.Name) -> str:
        if node.name in self.context.constants:
            return self._print(CONSTANTS[node.name])
        return math_name(node.name)

    # -- operators

    def _print_Unary(self, node: ast.Unary) -> str:
        if node.op == "+":
            return self._print(node.operand)
        operand = self.wrapped(node.operand, self.level(node))
        return OPERATORS[UNARY[node.op]].latex.format(operand)

    def _print_Binary(self, node: ast.Binary) -> str:
        return getattr(
            self, "_binary_" + {"*": "times", "/": "over", "^": "power"}.get(node.op, "infix")
        )(node)

    def _binary_infix(self, node: ast.Binary) -> str:
        level = self.level(node)
        left, right = self.wrapped(node.left, level), self.wrapped(node.right, level + 1)
        return OPERATORS[node.op].latex.format(left, right)

    def _binary_times(self, node: ast.Binary) -> str:
        # A unary minus after juxtaposition is bracketed: `a (-b)`, never `a -b`.
        left = self.wrapped(node.left, TIMES)
        right = self.wrapped(node.right, OPERATORS["neg"].level + 1)
        if right[:1].isdigit():
            return left + r" \cdot " + right
        tensors = isinstance(_rightmost(node.left), ast.Ref) and isinstance(node.right, ast.Ref)
        return left + (r" \, " if tensors else " ") + right

    def _binary_over(self, node: ast.Binary) -> str:
        return OPERATORS["/"].latex.format(self._print(node.left), self._print(node.right))

    def _binary_power(self, node: ast.Binary) -> str:
        base = self._print(node.left)
        if isinstance(node.left, ast.Ref):
            base = "{" + base + "}"
        elif not isinstance(node.left, (ast.Name, ast.Num, ast.Inf)):
            base = rf"\left({base}\right)"
        return OPERATORS["^"].latex.format(base, self._print(node.right))

    def _print_Call(self, node: ast.Call) -> str:
        if node.func == "where" and _chained(node.args[2]):
            return self._cases(node)
        if not node.over:
            infix = node.func in INFIX  # `a \bmod b` needs its operands bracketed like a product's
            args = [self.wrapped(a, TIMES) if infix else self._print(a) for a in node.args]
            return FUNCTIONS[node.func].latex.format(*args)
        over = "_{" + _join(math_name(i.glyph) for i in node.over) + "}"
        head = REDUCTIONS[node.func].latex + over
        if node.func == "sum":
            return head + " " + self.wrapped(node.args[0], TIMES)
        return head + rf"\left({', '.join(map(self._print, node.args))}\right)"

    def _cases(self, node: ast.Expr) -> str:
        """A `where` whose otherwise is a `where` again: one cases environment, a row per
        condition (`dQKV = where(B == 0, dQ, where(B == 1, dK, dV))` has three rows), not
        cases nested in cases."""
        rows = []
        while _chained(node):
            condition, value, node = node.args
            rows.append(rf"{self._print(value)} & \text{{if }} {self._print(condition)}")
        rows.append(rf"{self._print(node)} & \text{{otherwise}}")
        return r"\begin{cases} " + r" \\ ".join(rows) + r" \end{cases}"


def _chained(node: ast.Expr) -> bool:
    return isinstance(node, ast.Call) and node.func == "where" and not node.over


UNARY = {"-": "neg", "not": "not"}  # a unary operator's entry in the operator table
INFIX = frozenset({"mod"})  # functions printed as an operator between their arguments


def _rightmost(node: ast.Expr) -> ast.Expr:
    """The last factor of a juxtaposition."""
    return _rightmost(node.right) if isinstance(node, ast.Binary) and node.op == "*" else node


def _join(pieces) -> str:
    """Subscript items, spaced as they must be: `\\mu\\tau a`, `(\\mu B a) i`, `i(\\mu a)`."""
    out = ""
    for piece in pieces:
        out += piece if not out or piece[:1] in "\\()" or out.endswith("(") else " " + piece
    return out


# -- equations


@dataclass(frozen=True)
class Equation:
    """One equation in LaTeX: its left-hand side, right-hand side and the spec's comment."""

    lhs: str
    rhs: str
    source: ir.Equation


def equations(spec: ir.Spec, *, raised: bool = False, sums: bool = False) -> tuple[Equation, ...]:
    """Every equation of a spec, printed.

    >>> from indexattn.ir import check
    >>> text = "index i, j : d\\ninput x_<i>\\nparam W_<ji>\\ny_<j> = W_<ji> x_<i>"
    >>> (eq,) = equations(check(text, "t"))
    >>> eq.lhs, eq.rhs
    ('y_{j}', 'W_{j i} \\\\, x_{i}')
    """
    settings = {"raised": raised, "sums": sums}
    out = []
    for eq in spec.equations:
        printer = SpecPrinter(settings, _context(eq, spec))
        out.append(Equation(printer._print(eq.source.lhs), printer._print(eq.source.rhs), eq))
    return tuple(out)


def latex(
    spec: ir.Spec, *, raised: bool = False, sums: bool = False, environment: str = "align"
) -> str:
    r"""The equations in one amsmath environment (`align`, or `aligned` inside `$$`),
    ready for `\begin{document}`."""
    lines = [f"  {eq.lhs} &= {eq.rhs}" for eq in equations(spec, raised=raised, sums=sums)]
    return f"\\begin{{{environment}}}\n" + " \\\\\n".join(lines) + f"\n\\end{{{environment}}}\n"


def formula(expr: sympy.Basic) -> str:
    """A count or size expression in the spec's own names: `4 d_k d_m h + d_m`."""
    return SpecPrinter().doprint(expr)


def tensor(t: ir.Tensor) -> str:
    """A tensor with its declared layout: `(W_O)_{i(\\mu a)}`."""
    axes = tuple(
        ast.Group(tuple(_index_name(i) for i in axis), NOWHERE)
        if len(axis) > 1
        else _index_name(axis[0])
        for axis in t.layout
    )
    return SpecPrinter()._print(ast.Ref(t.name, axes, NOWHERE))


NOWHERE = Span(0, 0, 0)


def _index_name(index: ir.Index) -> ast.IndexName:
    return ast.IndexName(index.glyph, NOWHERE)
