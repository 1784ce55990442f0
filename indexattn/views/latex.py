r"""Spec -> LaTeX: the equations as a paper prints them, by a subclass of sympy's LaTeX printer
(sympy prints sizes, numbers and counts; our `_print_<Node>` methods print tensor references
and operators), in plain ASCII that pdflatex accepts.

The equations are printed from their syntax tree, re-parsed from the IR's canonical text, so
they read as written: `Q K / sqrt(d_k) - m (τ - τ')` stays that, where the IR has folded the
constants into one sympy factor and reordered `τ' > τ` to `τ < τ'`. The IR supplies what the
syntax cannot: which indices each product sums, for the two options (contracted indices
raised on their second occurrence, explicit `\sum`).
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
from ..notation import parse
from ..notation import syntax as ast
from ..notation.names import ACCENTS, GLYPH_TO_MACRO, ascii_name

# Greek capitals that LaTeX writes as Latin letters (there is no \Alpha).
LATIN_LOOKALIKE = dict(
    zip(
        "ΑΒΕΖΗΙΚΜΝΟΡΤΧο",
        "ABEZHIKMNOPTXo",
    )
)
FUNCTIONS = {
    "exp": r"\exp\left({}\right)",
    "log": r"\log\left({}\right)",
    "tanh": r"\tanh\left({}\right)",
    "sqrt": r"\sqrt{{{}}}",
    "abs": r"\left|{}\right|",
    "sigmoid": r"\operatorname{{sigmoid}}\left({}\right)",
    "relu": r"\operatorname{{ReLU}}\left({}\right)",
    "gelu": r"\operatorname{{GELU}}\left({}\right)",
    "dropout": r"\operatorname{{dropout}}\left({}, {}\right)",
    "where": r"\begin{{cases}} {1} & \text{{if }} {0} \\ {2} & \text{{otherwise}} \end{{cases}}",
}
REDUCTIONS = {
    "softmax": r"\operatorname{softmax}",
    "max": r"\max",
    "min": r"\min",
    "mean": r"\operatorname{mean}",
    "logsumexp": r"\operatorname{logsumexp}",
}
OPERATORS = {
    "+": " + ",
    "-": " - ",
    "<": " < ",
    "<=": r" \leq ",
    ">": " > ",
    ">=": r" \geq ",
    "==": " = ",
    "!=": r" \neq ",
    "and": r" \land ",
    "or": r" \lor ",
}
# Binding strength as printed: a fraction is set apart by its bar; an atom by its brackets.
LEVEL = {"or": 1, "and": 2, "not": 3, "cmp": 4, "+": 5, "-": 5, "*": 6, "neg": 7, "^": 8}
FRACTION, ATOM = 9, 10


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


# -- which indices each product sums (from the IR), located in the syntax tree


Signature = tuple  # (frozenset of reference ranks, frozenset of nested product signatures)
NOTHING: Signature = (frozenset(), frozenset())


def _merge(parts) -> Signature:
    refs, nested = set(), set()
    for r, n in parts:
        refs |= r
        nested |= n
    return frozenset(refs), frozenset(nested)


@dataclass
class Context:
    """What the printer knows of one equation beyond its syntax."""

    ranks: dict = field(default_factory=dict)  # syntax Ref -> its place among the references
    sums: dict = field(default_factory=dict)  # syntax node -> indices its product sums
    raised: frozenset = frozenset()  # (rank, glyph): an index written as a superscript


def _context(eq: ir.Equation, tree: ast.Expr) -> Context:
    """Products are matched to the syntax by what they read: the references they own (not
    through a nested product) and their nested products, both sides built the same way as the
    checker builds products (flattening `*`, `/` and unary minus; `a - b` negates b)."""
    refs = sorted(ir.refs(eq.rhs), key=lambda r: (r.span.line, r.span.col))
    ir_rank = {r.span: k for k, r in enumerate(refs)}
    products: dict[Signature, ir.Product] = {}
    _ir_own(eq.rhs, ir_rank, products)
    context = Context(ranks={r: k for k, r in enumerate(_ast_refs(tree))})
    chains: dict[ast.Expr, Signature] = {}
    _ast_own(tree, context.ranks, chains)
    for node, signature in chains.items():
        if signature in products and products[signature].summed:
            context.sums[node] = products[signature].summed
    context.raised = frozenset(
        (ir_rank[ref.span], index.glyph)
        for product in products.values()
        for index in product.summed
        for ref in _later_occurrences(product, index)
    )
    return context


def _ir_own(node: ir.Node, rank: dict, products: dict) -> Signature:
    if isinstance(node, ir.Ref):
        return frozenset({rank[node.span]}), frozenset()
    parts = [_ir_own(child, rank, products) for child in ir.children(node)]
    if not isinstance(node, ir.Product):
        return _merge(parts)
    signature = _merge(parts)
    products[signature] = node
    return frozenset(), frozenset({signature})


def _later_occurrences(product: ir.Product, index: ir.Index):
    """The references that carry a summed index after the factor that first carries it."""
    carriers = [f for f in product.factors if index in f.free]
    for factor in carriers[1:]:
        yield from _bound_refs(factor, index)


def _bound_refs(node: ir.Node, index: ir.Index):
    if isinstance(node, ir.Ref) and index in node.free:
        yield node
    if isinstance(node, ir.Reduce) and node.fn != "softmax" and index in node.over:
        return
    for child in ir.children(node):
        yield from _bound_refs(child, index)


def _ast_children(node: ast.Expr) -> tuple:
    if isinstance(node, ast.Binary):
        return (node.left, node.right)
    if isinstance(node, ast.Unary):
        return (node.operand,)
    if isinstance(node, ast.Call):
        return node.args
    return ()


def _ast_refs(node: ast.Expr):
    if isinstance(node, ast.Ref):
        yield node
    for child in _ast_children(node):
        yield from _ast_refs(child)


def _is_chain(node: ast.Expr) -> bool:
    return (isinstance(node, ast.Binary) and node.op in "*/") or (
        isinstance(node, ast.Unary) and node.op == "-"
    )


def _ast_own(node: ast.Expr, rank: dict, chains: dict) -> Signature:
    if isinstance(node, ast.Ref):
        return frozenset({rank[node]}), frozenset()
    if _is_chain(node):
        return _product(node, _merge(_factors(node, rank, chains)), chains)
    if isinstance(node, ast.Binary) and node.op == "-":
        right = _ast_own(node.right, rank, chains)
        if not _is_chain(node.right):
            right = _product(node.right, right, chains)
        return _merge([_ast_own(node.left, rank, chains), right])
    return _merge(_ast_own(child, rank, chains) for child in _ast_children(node))


def _product(node: ast.Expr, own: Signature, chains: dict) -> Signature:
    """A product the checker builds here, unless it reads no tensor (then it is a constant)."""
    if own == NOTHING:
        return NOTHING
    chains[node] = own
    return frozenset(), frozenset({own})


def _factors(node: ast.Expr, rank: dict, chains: dict) -> list[Signature]:
    if isinstance(node, ast.Unary):
        inner = [node.operand]
    else:
        inner = [node.left] + ([node.right] if node.op == "*" else [])
    out = [
        _merge(_factors(x, rank, chains)) if _is_chain(x) else _ast_own(x, rank, chains)
        for x in inner
    ]
    if isinstance(node, ast.Binary) and node.op == "/":
        out.append(_ast_own(node.right, rank, chains))
    return out


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
            if node.op == "/":
                return FRACTION
            return LEVEL.get(node.op, LEVEL["cmp"])
        if isinstance(node, ast.Unary):
            return LEVEL["neg"] if node.op == "-" else LEVEL["not"]
        if self._settings["sums"] and node in self.context.sums:
            return LEVEL["*"]
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
        rank = self.context.ranks.get(node)
        up = {g for r, g in self.context.raised if r == rank} if self._settings["raised"] else set()
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

    def _print_Literal(self, node: ast.Literal) -> str:
        return str(node.value)

    def _print_Num(self, node: ast.Num) -> str:
        value = node.value
        return self._print(sympy.Integer(value) if isinstance(value, int) else sympy.Float(value))

    def _print_Inf(self, node: ast.Inf) -> str:
        return r"\infty"

    def _print_Name(self, node: ast.Name) -> str:
        return math_name(node.name)

    # -- operators

    def _print_Unary(self, node: ast.Unary) -> str:
        if node.op == "+":
            return self._print(node.operand)
        sign = "-" if node.op == "-" else r"\lnot "
        return sign + self.wrapped(node.operand, self.level(node))

    def _print_Binary(self, node: ast.Binary) -> str:
        return getattr(
            self, "_binary_" + {"*": "times", "/": "over", "^": "power"}.get(node.op, "infix")
        )(node)

    def _binary_infix(self, node: ast.Binary) -> str:
        level = self.level(node)
        left, right = self.wrapped(node.left, level), self.wrapped(node.right, level + 1)
        return left + OPERATORS[node.op] + right

    def _binary_times(self, node: ast.Binary) -> str:
        # A unary minus after juxtaposition is bracketed: `a (-b)`, never `a -b`.
        left = self.wrapped(node.left, LEVEL["*"])
        right = self.wrapped(node.right, LEVEL["neg"] + 1)
        if right[:1].isdigit():
            return left + r" \cdot " + right
        tensors = isinstance(_rightmost(node.left), ast.Ref) and isinstance(node.right, ast.Ref)
        return left + (r" \, " if tensors else " ") + right

    def _binary_over(self, node: ast.Binary) -> str:
        return rf"\frac{{{self._print(node.left)}}}{{{self._print(node.right)}}}"

    def _binary_power(self, node: ast.Binary) -> str:
        base = self._print(node.left)
        if isinstance(node.left, ast.Ref):
            base = "{" + base + "}"
        elif not isinstance(node.left, (ast.Name, ast.Num, ast.Inf)):
            base = rf"\left({base}\right)"
        return f"{base}^{{{self._print(node.right)}}}"

    def _print_Call(self, node: ast.Call) -> str:
        args = [self._print(a) for a in node.args]
        if not node.over:
            return FUNCTIONS[node.func].format(*args)
        over = "_{" + _join(math_name(i.glyph) for i in node.over) + "}"
        if node.func == "sum":
            return r"\sum" + over + " " + self.wrapped(node.args[0], LEVEL["*"])
        return REDUCTIONS[node.func] + over + rf"\left({args[0]}\right)"


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
        tree = parse(eq.text, spec.name).statements[0]
        printer = SpecPrinter(settings, _context(eq, tree.rhs))
        out.append(Equation(printer._print(tree.lhs), printer._print(tree.rhs), eq))
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
