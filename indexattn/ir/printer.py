"""IR -> spec text: what the derived backward is written in, to be parsed and checked again.
Indices may be renamed on the way (a contraction transposes by renaming, never by a
transpose); tensor-free parts are printed from their sympy form in the language's spelling."""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter

from ..ops import lookup
from .einstein import denominator, signed
from .nodes import Apply, At, Concat, Field, Index, Node, Product, Reduce, Ref, Sum

Rename = dict[Index, str]  # an index -> the glyph it is written with


class FieldPrinter(StrPrinter):
    """sympy's spelling, where the language spells it differently."""

    def _print_Infinity(self, expr) -> str:
        return "inf"

    def _print_NegativeInfinity(self, expr) -> str:
        return "-inf"

    def _print_Piecewise(self, expr) -> str:
        (value, cond), *rest = expr.args
        other = sympy.Piecewise(*rest) if len(rest) > 1 or rest[0][1] is not sympy.true else None
        last = self._print(other) if other is not None else self._print(rest[0][0])
        return f"where({self._print(cond)}, {self._print(value)}, {last})"

    def _join(self, expr, word: str) -> str:
        return f" {word} ".join(f"({self._print(a)})" for a in expr.args)

    def _print_And(self, expr) -> str:
        return self._join(expr, "and")

    def _print_Or(self, expr) -> str:
        return self._join(expr, "or")

    def _print_Not(self, expr) -> str:
        return f"not ({self._print(expr.args[0])})"

    def _print_Relational(self, expr) -> str:
        op = {"==": "==", "!=": "!="}.get(expr.rel_op, expr.rel_op)
        return f"{self._side(expr.lhs)} {op} {self._side(expr.rhs)}"

    def _side(self, expr) -> str:
        """A side of a comparison, bracketed unless it is a name or a whole number."""
        written = self._print(expr)
        return written if expr.is_Symbol or (expr.is_Integer and expr >= 0) else f"({written})"

    def _call(self, name: str, expr) -> str:
        args = [self._print(a) for a in expr.args]
        while len(args) > 2:  # the language's min and max take two values
            args = [f"{name}({args[0]}, {args[1]})", *args[2:]]
        return f"{name}({', '.join(args)})"

    def _print_Min(self, expr) -> str:
        return self._call("min", expr)

    def _print_Max(self, expr) -> str:
        return self._call("max", expr)

    def _print_Pow(self, expr, rational=False) -> str:
        return super()._print_Pow(expr, rational).replace("**", "^")

    def _print_Mod(self, expr) -> str:
        return self._call("mod", expr)

    def _print_Abs(self, expr) -> str:
        return self._call("abs", expr)

    def _print_ceiling(self, expr) -> str:
        return self._call("ceil", expr)


FIELDS = FieldPrinter()


def field(expr: sympy.Basic, rename: Rename | None = None) -> str:
    """A tensor-free value, indices renamed."""
    if rename:
        expr = expr.subs({i.symbol: symbol(i, glyph) for i, glyph in rename.items()})
    return FIELDS.doprint(expr)


def symbol(index: Index, glyph: str) -> sympy.Symbol:
    """The index variable an index has when written `glyph`."""
    return sympy.Symbol(glyph, integer=True, nonnegative=True)


def ref(name: str, axes, rename: Rename | None = None) -> str:
    """`W_<(μ0a)i>` from axes of indices, literal ints and positions."""
    rename = rename or {}

    def item(i) -> str:
        if isinstance(i, Index):
            return rename.get(i, i.glyph)
        if isinstance(i, At):
            return "[" + text(i.value, rename) + "]"
        return str(i)

    def axis(items) -> str:
        inner = "".join(item(i) for i in items)
        return f"({inner})" if len(items) > 1 else inner

    return f"{name}_<{''.join(axis(a) for a in axes)}>"


def equation(target: Ref, value: Node, precision: str = "") -> str:
    """`target : precision = value`, as a spec writes an equation."""
    declared = f" : {precision}" if precision else ""
    return f"{text(target)}{declared} = {text(value)}"


def text(node: Node, rename: Rename | None = None) -> str:
    """The node as the language writes it; `h_<node.free> = text(node)` defines its value."""
    rename = rename or {}
    if isinstance(node, Field):
        return field(node.expr, rename)
    if isinstance(node, Ref):
        return ref(node.tensor.name, node.axes, rename)
    if isinstance(node, Product):
        minus = [f for f in node.factors if isinstance(f, Field) and f.expr == -1]
        rest = " ".join(factor(f, rename) for f in node.factors if f not in minus)
        return "-" * (len(minus) % 2) + rest
    if isinstance(node, Sum):
        out = ""
        for k, (term, sign) in enumerate(signed(t) for t in node.terms):
            joint = ("-" if sign < 0 else "") if k == 0 else (" - " if sign < 0 else " + ")
            out += joint + summand(term, rename)
        return out
    if isinstance(node, Reduce):
        over = "".join(rename.get(i, i.glyph) for i in node.over)
        return f"{node.fn}_<{over}>({text(node.body, rename)})"
    if isinstance(node, Concat):
        parts = ", ".join(text(p, rename) for p in node.parts)
        return f"concat_<{rename.get(node.over, node.over.glyph)}>({parts})"
    return apply(node, rename)


def apply(node: Apply, rename: Rename) -> str:
    if node.fn == "pow":
        base, exponent = (factor(a, rename) for a in node.args)
        return f"{base}^{exponent}"
    op = lookup(node.fn)
    args = [(side if op.kind == "comparison" else factor)(a, rename) for a in node.args]
    if op.kind == "function":
        return f"{node.fn}({', '.join(text(a, rename) for a in node.args)})"
    if op.arity == 1:
        return f"{node.fn} {args[0]}"
    return f" {node.fn} ".join(args)


def side(node: Node, rename: Rename) -> str:
    """A side of a comparison: a name or a whole number as it is, else as a factor."""
    return text(node, rename) if atom(node) else factor(node, rename)


def summand(node: Node, rename: Rename) -> str:
    """A term of a sum: a product binds tighter than + and -, so it is bracketed only where
    it carries a sign of its own; a name or a whole number as it is."""
    if isinstance(node, Product):
        written = text(node, rename)
        return f"({written})" if written.startswith("-") else written
    return side(node, rename)


def atom(node: Node) -> bool:
    """A name or a whole number of no sign: never bracketed as a side or a term."""
    if not isinstance(node, Field):
        return False
    return node.expr.is_Symbol or (node.expr.is_Integer and node.expr >= 0)


def factor(node: Node, rename: Rename) -> str:
    """A node as a factor, bracketed unless it is a reference or a call. A denominator is
    written `(x)^(-1)`, which the checker reads as a fraction's denominator again."""
    if denominator(node):
        return f"({text(node.args[0], rename)})^(-1)"
    written = text(node, rename)
    if isinstance(node, (Ref, Reduce, Concat)):
        return written
    if isinstance(node, Apply) and lookup(node.fn).kind == "function" and node.fn != "pow":
        return written
    return f"({written})"


def spec_text(spec) -> str:
    """A checked spec as the language writes it, from its IR (its sizes, arguments, scalars,
    equations and outputs): the canonical form's dump (`indexattn compile --dump-after
    canonical`). Comments and the spec's own spelling of numbers are not kept."""
    lines = [f"index {i.glyph} : {field(i.size)}" for i in spec.indices]
    lines += [f"{t.role} {t!r}" + (" : int" if t.dtype == "int" else "") for t in spec.arguments]
    lines += [f"scalar {s.name} = {s.value!r}" for s in spec.scalars]
    for eq in spec.equations:
        precision = f" : {eq.tensor.precision}" if eq.tensor.precision else ""
        lines.append(f"{eq.tensor!r}{precision} = {text(eq.rhs)}")
    lines.append("output " + ", ".join(t.name for t in spec.outputs))
    return "\n".join(lines)
