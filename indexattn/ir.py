"""Syntax -> meaning: indices with sympy sizes, tensors with roles, equations checked by the
rules of Einstein summation. Every later stage reads this, never the syntax tree."""

from __future__ import annotations

import difflib
import math
import unicodedata
from dataclasses import dataclass, field

import sympy

from .errors import Span, SpecError
from .notation import equation as unparse_equation
from .notation import parse
from .notation import syntax as ast
from .notation.names import ascii_name


@dataclass(frozen=True)
class Index:
    glyph: str
    ascii: str
    size: sympy.Expr  # a positive integer Symbol, or an Integer
    doc: str = field(default="", compare=False)
    symbol: sympy.Symbol = field(default=None, compare=False)  # its value as an index variable

    def __repr__(self) -> str:
        return self.glyph


@dataclass(frozen=True)
class Tensor:
    name: str
    ascii: str
    role: str  # input, param, buffer, derived
    layout: tuple[tuple[Index, ...], ...]  # one tuple per axis; several indices = a fused axis
    batched: bool  # carries the inputs' leading batch axes
    init: ast.Init | None = field(default=None, compare=False)
    doc: str = field(default="", compare=False)
    span: Span | None = field(default=None, compare=False)

    @property
    def indices(self) -> tuple[Index, ...]:
        return tuple(i for axis in self.layout for i in axis)

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return tuple(sympy.Mul(*(i.size for i in axis)) for axis in self.layout)

    @property
    def fused(self) -> bool:
        return any(len(axis) > 1 for axis in self.layout)

    def __repr__(self) -> str:
        return f"{self.name}_<{_layout_text(self.layout)}>"


@dataclass(frozen=True)
class Scalar:
    name: str
    ascii: str
    value: float
    symbol: sympy.Symbol
    doc: str = ""


# -- expressions


@dataclass(frozen=True)
class Field:
    """A tensor-free expression: numbers, sizes, scalars and index variables, as sympy."""

    expr: sympy.Basic
    free: tuple[Index, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Ref:
    """A tensor read with a layout; literals (ints) select slices."""

    tensor: Tensor
    axes: tuple[tuple[Index | int, ...], ...]
    span: Span = field(compare=False)
    spans: tuple[Span, ...] = field(compare=False, default=())  # one per index in `free`

    @property
    def free(self) -> tuple[Index, ...]:
        return tuple(i for axis in self.axes for i in axis if isinstance(i, Index))


@dataclass(frozen=True)
class Product:
    """Factors multiplied elementwise, summed over `summed` (Einstein)."""

    factors: tuple[Node, ...]
    summed: tuple[Index, ...]
    span: Span = field(compare=False)

    @property
    def free(self) -> tuple[Index, ...]:
        return _union(*(f.free for f in self.factors), minus=self.summed)


@dataclass(frozen=True)
class Sum:
    terms: tuple[Node, ...]
    span: Span = field(compare=False)

    @property
    def free(self) -> tuple[Index, ...]:
        return _union(*(t.free for t in self.terms))


@dataclass(frozen=True)
class Apply:
    """An elementwise function: exp ... abs, pow, where, dropout, comparisons, and/or/not."""

    fn: str
    args: tuple[Node, ...]
    span: Span = field(compare=False)

    @property
    def free(self) -> tuple[Index, ...]:
        return _union(*(a.free for a in self.args))


@dataclass(frozen=True)
class Reduce:
    """softmax, sum, max, min, mean or logsumexp over `over`."""

    fn: str
    over: tuple[Index, ...]
    body: Node
    span: Span = field(compare=False)

    @property
    def free(self) -> tuple[Index, ...]:
        return self.body.free if self.fn == "softmax" else _union(self.body.free, minus=self.over)


Node = Field | Ref | Product | Sum | Apply | Reduce


@dataclass(frozen=True)
class Equation:
    tensor: Tensor  # the left-hand side, with its layout
    indices: tuple[Index, ...]  # the left-hand side's indices, flat, as written
    rhs: Node
    text: str  # the equation re-printed from the syntax tree
    doc: str = ""


@dataclass(frozen=True)
class Spec:
    """A checked spec: what every later stage reads."""

    name: str
    title: str
    description: str
    indices: tuple[Index, ...]
    sizes: tuple[sympy.Symbol, ...]
    tensors: tuple[Tensor, ...]  # declared, then derived, in order
    scalars: tuple[Scalar, ...]
    equations: tuple[Equation, ...]
    outputs: tuple[Tensor, ...]

    def tensors_of(self, *roles: str) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role in roles)

    @property
    def arguments(self) -> tuple[Tensor, ...]:
        return self.tensors_of("input", "param", "buffer")


def _union(*groups: tuple[Index, ...], minus: tuple[Index, ...] = ()) -> tuple[Index, ...]:
    seen: dict[Index, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group))
    return tuple(i for i in seen if i not in minus)


def _layout_text(layout) -> str:
    def one(axis) -> str:
        text = "".join(str(i) if isinstance(i, int) else i.glyph for i in axis)
        return f"({text})" if len(axis) > 1 else text

    return "".join(one(axis) for axis in layout)


# -- checking


def check(source: str, name: str, file: str = "<spec>") -> Spec:
    """`check(text, "mha")` -> the Spec IR, or SpecError naming the first mistake."""
    return Checker(parse(source, name, file)).spec()


ELEMENTWISE_SYMPY = {
    "exp": sympy.exp,
    "log": sympy.log,
    "sqrt": sympy.sqrt,
    "tanh": sympy.tanh,
    "abs": sympy.Abs,
    "sigmoid": lambda x: 1 / (1 + sympy.exp(-x)),
    "relu": lambda x: sympy.Max(x, 0),
    "gelu": lambda x: x * (1 + sympy.erf(x / sympy.sqrt(2))) / 2,
}
COMPARE_SYMPY = {
    "<": sympy.Lt,
    "<=": sympy.Le,
    ">": sympy.Gt,
    ">=": sympy.Ge,
    "==": sympy.Eq,
    "!=": sympy.Ne,
}


class Checker:
    """Walks a Document once, building the IR and raising SpecError at the first mistake."""

    def __init__(self, doc: ast.Document) -> None:
        self.doc = doc
        self.indices: dict[str, Index] = {}
        self.sizes: dict[str, sympy.Symbol] = {}
        self.tensors: dict[str, Tensor] = {}
        self.scalars: dict[str, Scalar] = {}
        self.names: dict[str, tuple[str, Span]] = {}  # spec name -> (kind, where)
        self.asciis: dict[str, str] = {}  # ascii name -> spec name
        self.spellings: dict[str, tuple[str, Span]] = {}  # name -> first spelling, where
        self.equations: list[Equation] = []
        self.defined_later = {s.lhs.name: s for s in doc.statements if isinstance(s, ast.Equation)}

    def error(self, message: str, span: Span | None, hint: str = "") -> SpecError:
        return SpecError(message, source=self.doc.source, file=self.doc.file, span=span, hint=hint)

    def spec(self) -> Spec:
        outputs: tuple[ast.Name, ...] | None = None
        for stmt in self.doc.statements:
            if isinstance(stmt, ast.OutputDecl):
                if outputs is not None:
                    raise self.error(
                        "a second output line",
                        stmt.span,
                        "name every output on one line: output Y, A.",
                    )
                outputs = stmt.names
            else:
                getattr(self, "stmt_" + type(stmt).__name__)(stmt)
        if not self.equations:
            raise self.error(
                "a spec needs at least one equation", None, "write e.g. Y_<τi> = X_<τi>."
            )
        if not any(t.role != "derived" for t in self.tensors.values()):
            raise self.error(
                "a spec needs at least one input, param or buffer",
                None,
                "declare the data it works on, e.g. input X_<τi>.",
            )
        return Spec(
            self.doc.name,
            self.doc.title,
            self.doc.description,
            tuple(self.indices.values()),
            tuple(self.sizes.values()),
            tuple(self.tensors.values()),
            tuple(self.scalars.values()),
            tuple(self.equations),
            self.output_tensors(outputs),
        )

    def output_tensors(self, names: tuple[ast.Name, ...] | None) -> tuple[Tensor, ...]:
        if names is None:
            return (self.equations[-1].tensor,)
        out = []
        for name in names:
            tensor = self.tensors.get(name.name)
            if tensor is None or tensor.role != "derived":
                raise self.error(
                    f"{name.name} is not defined by an equation",
                    name.span,
                    "an output names a tensor on the left of an equation."
                    + self.suggest(name.name, self.tensors),
                )
            if tensor in out:
                raise self.error(f"{name.name} is named twice", name.span)
            out.append(tensor)
        return tuple(out)

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

    # -- declarations

    def stmt_IndexDecl(self, stmt: ast.IndexDecl) -> None:
        if isinstance(stmt.size, ast.Num):
            size: sympy.Expr = sympy.Integer(stmt.size.value)
        else:
            size = self.sizes.get(stmt.size.name) or self.new_size(stmt.size)
        for name in stmt.names:
            self.spelled(name.glyph, name.span)
            ascii = self.claim(name.glyph, "an index", name.span)
            symbol = sympy.Symbol(name.glyph, integer=True, nonnegative=True)
            self.indices[name.glyph] = Index(name.glyph, ascii, size, stmt.doc, symbol)

    def new_size(self, name: ast.Name) -> sympy.Symbol:
        self.claim(name.name, "a size", name.span)
        symbol = sympy.Symbol(name.name, integer=True, positive=True)
        self.sizes[name.name] = symbol
        return symbol

    def stmt_TensorDecl(self, stmt: ast.TensorDecl) -> None:
        layout = self.layout(stmt.ref, "declaration")
        ascii = self.claim(stmt.ref.name, "a tensor", stmt.ref.span)
        self.tensors[stmt.ref.name] = Tensor(
            stmt.ref.name,
            ascii,
            stmt.role,
            layout,
            stmt.role == "input",
            stmt.init,
            stmt.doc,
            stmt.ref.span,
        )

    def stmt_ScalarDecl(self, stmt: ast.ScalarDecl) -> None:
        ascii = self.claim(stmt.name, "a scalar", stmt.span)
        self.scalars[stmt.name] = Scalar(
            stmt.name, ascii, stmt.value, sympy.Symbol(stmt.name, real=True), stmt.doc
        )

    def layout(self, ref: ast.Ref, where: str) -> tuple[tuple[Index, ...], ...]:
        """The axes of a declaration or a left-hand side: indices and groups, no literals."""
        seen: dict[str, Span] = {}
        axes = []
        for axis in ref.axes:
            items = axis.items if isinstance(axis, ast.Group) else (axis,)
            for item in items:
                if isinstance(item, ast.Literal):
                    raise self.error(
                        f"a literal index in a {where}",
                        item.span,
                        "a literal selects a slice where a tensor is used; "
                        "declare the axis with an index.",
                    )
                self.repeated(item, seen, ref)
            axes.append(tuple(self.index(item) for item in items))
        return tuple(axes)

    def repeated(self, item: ast.IndexName, seen: dict[str, Span], ref: ast.Ref) -> None:
        if item.glyph in seen:
            raise self.error(
                f"index {item.glyph} appears twice in {ref.name}",
                item.span,
                "a tensor's axes need distinct indices; for a diagonal, declare "
                "a second index with the same range (index τ, τ' : N).",
            )
        seen[item.glyph] = item.span

    def spelled(self, name: str, span: Span) -> None:
        """NFKC makes µ (micro sign) and μ (mu) one letter; a spec that mixes them is told."""
        line = self.doc.source.split("\n")[span.line - 1]
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
            raise self.error(
                f"index {item.glyph} is not declared",
                item.span,
                f"add a line: index {item.glyph} : SIZE." + self.suggest(item.glyph, self.indices),
            )
        return found

    # -- equations

    def stmt_Equation(self, stmt: ast.Equation) -> None:
        lhs = stmt.lhs
        if lhs.name in self.tensors:
            earlier = self.tensors[lhs.name]
            what = (
                "defined twice"
                if earlier.role == "derived"
                else f"an {earlier.role}"
                if earlier.role == "input"
                else f"a {earlier.role}"
            )
            raise self.error(
                f"{lhs.name} is {what}; a tensor is defined once",
                lhs.span,
                "give the new tensor its own name.",
            )
        layout = self.layout(lhs, "left-hand side")
        rhs = Analysis(self, frozenset(i for axis in layout for i in axis)).top(
            self.number(stmt.rhs)
        )
        indices = tuple(i for axis in layout for i in axis)
        self.check_lhs(lhs, indices, rhs)
        ascii = self.claim(lhs.name, "a tensor", lhs.span)
        tensor = Tensor(lhs.name, ascii, "derived", layout, _batched(rhs), None, stmt.doc, lhs.span)
        self.tensors[lhs.name] = tensor
        self.equations.append(Equation(tensor, indices, rhs, unparse_equation(stmt), stmt.doc))

    def check_lhs(self, lhs: ast.Ref, indices: tuple[Index, ...], rhs: Node) -> None:
        for index, item in zip(indices, _flat_items(lhs)):
            if index not in rhs.free:
                raise self.error(
                    f"index {index.glyph} is on the left but not on the right",
                    item.span,
                    "every left-hand index must appear on the "
                    "right, in a tensor or as an index variable; to repeat a "
                    f"value along {index.glyph}, multiply by a tensor that "
                    "carries it.",
                )

    # -- expressions: syntax -> IR nodes, folding tensor-free parts into sympy Fields

    def expr(self, node: ast.Expr) -> Node:
        result = getattr(self, "expr_" + type(node).__name__)(node)
        constants = children(result) if isinstance(result, (Product, Sum)) else (result,)
        if any(
            isinstance(c, Field) and c.expr.has(sympy.zoo, sympy.nan, sympy.I) for c in constants
        ):
            raise self.error(
                "this value is not a real number",
                node.span,
                "look for a division by zero, log(0), the sqrt of a negative number or inf - inf.",
            )
        return result

    def expr_Num(self, node: ast.Num) -> Node:
        value = (
            sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(node.value)
        )
        return Field(value, (), node.span)

    def expr_Inf(self, node: ast.Inf) -> Node:
        return Field(sympy.oo, (), node.span)

    def expr_Name(self, node: ast.Name) -> Node:
        self.spelled(node.name, node.span)
        if node.name in self.indices:
            index = self.indices[node.name]
            return Field(index.symbol, (index,), node.span)
        if node.name in self.scalars:
            return Field(self.scalars[node.name].symbol, (), node.span)
        if node.name in self.sizes:
            return Field(self.sizes[node.name], (), node.span)
        if node.name in self.tensors or node.name in self.defined_later:
            raise self.error(
                f"{node.name} is a tensor: write it with its indices",
                node.span,
                f"e.g. {node.name}_<...>.",
            )
        kind = "index" if node.name.endswith("'") else "name"
        raise self.error(
            f"unknown {kind} {node.name}",
            node.span,
            f"declare it (index {node.name} : SIZE, or scalar {node.name} = 1.0), "
            "or use a size that an index line names."
            + self.suggest(node.name, [*self.indices, *self.scalars, *self.sizes]),
        )

    def expr_Ref(self, node: ast.Ref) -> Node:
        tensor = self.tensor(node)
        if len(node.axes) != len(tensor.layout):
            raise self.error(
                f"{node.name} has {len(tensor.layout)} axes, written here with {len(node.axes)}",
                node.span,
                f"write it as declared: {tensor!r}.",
            )
        seen: dict[str, Span] = {}
        axes, spans = [], []
        for written, declared in zip(node.axes, tensor.layout):
            items = self.group_items(written, declared, tensor)
            axis = []
            for item, want in zip(items, declared):
                axis.append(self.ref_item(item, want, tensor, seen, node))
                if isinstance(item, ast.IndexName):
                    spans.append(item.span)
            axes.append(tuple(axis))
        return Ref(tensor, tuple(axes), node.span, tuple(spans))

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

    def group_items(self, written: ast.Axis, declared: tuple[Index, ...], tensor: Tensor) -> tuple:
        items = written.items if isinstance(written, ast.Group) else (written,)
        if len(items) != len(declared) or isinstance(written, ast.Group) != (len(declared) > 1):
            want = _layout_text((declared,))
            raise self.error(
                f"this axis of {tensor.name} is declared as {want}",
                written.span,
                f"write the axis as {want}, with the same grouping (indices may "
                "be renamed, or replaced by digits to select a slice).",
            )
        return items

    def ref_item(
        self, item, want: Index, tensor: Tensor, seen: dict[str, Span], node: ast.Ref
    ) -> Index | int:
        if isinstance(item, ast.Literal):
            if want.size.is_Integer and item.value >= int(want.size):
                raise self.error(
                    f"the literal {item.value} is out of range for "
                    f"{want.glyph}, which has range {want.size}",
                    item.span,
                    f"a literal must be smaller than the range of {want.glyph}: "
                    f"0 to {int(want.size) - 1}.",
                )
            return item.value
        self.repeated(item, seen, node)
        index = self.index(item)
        if index.size != want.size:
            raise self.error(
                f"index {index.glyph} has range {index.size}, but {tensor.name} "
                f"has range {want.size} here (index {want.glyph})",
                item.span,
                f"use an index of range {want.size}, e.g. {want.glyph}.",
            )
        return index

    def number(self, node: ast.Expr) -> Node:
        """An expression used as a value: a comparison is not one."""
        result = self.expr(node)
        if _is_condition(result):
            raise self.error(
                "a comparison is used as a number here",
                node.span,
                "comparisons go in where(...) and and/or/not; for 1 where it holds and 0 where "
                "it does not, write where(condition, 1, 0).",
            )
        return result

    def expr_Unary(self, node: ast.Unary) -> Node:
        operand = (self.expr if node.op == "not" else self.number)(node.operand)
        if node.op == "+":
            return operand
        if node.op == "not":
            return self.logic("not", (operand,), node.span)
        return _product((Field(sympy.Integer(-1), (), node.span), operand), node.span)

    def expr_Binary(self, node: ast.Binary) -> Node:
        operand = self.expr if node.op in ("and", "or") else self.number
        left, right = operand(node.left), operand(node.right)
        op = node.op
        if op in ("+", "-"):
            if op == "-":
                right = _product((Field(sympy.Integer(-1), (), node.span), right), node.span)
            return _sum((left, right), node.span)
        if op == "*":
            return _product((left, right), node.span)
        if op == "/":
            return _product((left, _reciprocal(right, node.span)), node.span)
        if op == "^":
            if isinstance(left, Field) and isinstance(right, Field):
                power = self.power(left.expr, right.expr, node.span)
                return Field(power, _union(left.free, right.free), node.span)
            return Apply("pow", (left, right), node.span)
        if op in COMPARE_SYMPY:
            if isinstance(left, Field) and isinstance(right, Field):
                expr = COMPARE_SYMPY[op](left.expr, right.expr)
                return Field(expr, _union(left.free, right.free), node.span)
            return Apply(op, (left, right), node.span)
        return self.logic(op, (left, right), node.span)

    def power(self, base: sympy.Expr, exponent: sympy.Expr, span: Span) -> sympy.Expr:
        """base^exponent, exact unless the exact number would be too large to hold."""
        if not (base.is_number and exponent.is_number) or base.is_zero:
            return base**exponent
        bits = abs(float(exponent)) * max(1.0, abs(math.log2(abs(float(base)))))
        if bits <= 4096:
            return base**exponent
        try:
            return sympy.Float(float(base) ** float(exponent))
        except (OverflowError, ZeroDivisionError, TypeError):
            raise self.error("this power is too large for a float", span) from None

    def logic(self, op: str, args: tuple[Node, ...], span: Span) -> Node:
        for arg in args:
            if not _is_condition(arg):
                raise self.error(
                    f"'{op}' joins comparisons, not values",
                    arg.span,
                    f"write e.g. a > 0 {op} b > 0." if op != "not" else "write e.g. not a > 0.",
                )
        if all(isinstance(a, Field) for a in args):
            fn = {"and": sympy.And, "or": sympy.Or, "not": sympy.Not}[op]
            return Field(fn(*(a.expr for a in args)), _union(*(a.free for a in args)), span)
        return Apply(op, args, span)

    def expr_Call(self, node: ast.Call) -> Node:
        args = tuple(
            self.expr(arg) if node.func == "where" and k == 0 else self.number(arg)
            for k, arg in enumerate(node.args)
        )
        if node.over:
            over = tuple(self.index(i) for i in node.over)
            if len(set(over)) != len(over):
                raise self.error(f"{node.func} names an index twice", node.span)
            return Reduce(node.func, over, args[0], node.span)
        if node.func == "where":
            return self.where(args, node)
        if node.func == "dropout":
            return self.dropout(args, node)
        if isinstance(args[0], Field):
            return Field(ELEMENTWISE_SYMPY[node.func](args[0].expr), args[0].free, node.span)
        return Apply(node.func, args, node.span)

    def where(self, args: tuple[Node, ...], node: ast.Call) -> Node:
        cond, a, b = args
        if not _is_condition(cond):
            raise self.error(
                "the first argument of where is a condition",
                cond.span,
                "write a comparison, e.g. where(τ' > τ, -inf, 0).",
            )
        if all(isinstance(x, Field) for x in args):
            expr = sympy.Piecewise((a.expr, cond.expr), (b.expr, True))
            return Field(expr, _union(cond.free, a.free, b.free), node.span)
        return Apply("where", args, node.span)

    def dropout(self, args: tuple[Node, ...], node: ast.Call) -> Node:
        body, p = args
        if (
            not isinstance(p, Field)
            or p.free
            or p.expr.free_symbols - {s.symbol for s in self.scalars.values()}
        ):
            raise self.error(
                "the dropout probability is a number or a scalar",
                p.span,
                "declare scalar p = 0.1 and write dropout(e, p).",
            )
        if p.expr.is_number and not 0 <= float(p.expr) < 1:
            raise self.error("a dropout probability is at least 0 and below 1", p.span)
        return Apply("dropout", (body, p), node.span)


def _codepoints(text: str) -> str:
    """`µ` -> `µ (U+00B5 MICRO SIGN)`."""
    names = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in text if c != "'")
    return f"{text} ({names})"


def _flat_items(ref: ast.Ref) -> list[ast.IndexName]:
    out = []
    for axis in ref.axes:
        out.extend(axis.items if isinstance(axis, ast.Group) else (axis,))
    return out


CONDITIONS = (
    sympy.core.relational.Relational,
    sympy.logic.boolalg.BooleanFunction,  # And, Or, Not
    sympy.logic.boolalg.BooleanAtom,  # true, false
)  # not sympy's Boolean: every Symbol is one


def _is_condition(node: Node) -> bool:
    if isinstance(node, Field):
        return isinstance(node.expr, CONDITIONS)
    return isinstance(node, Apply) and node.fn in (*COMPARE_SYMPY, "and", "or", "not")


def _product(factors: tuple[Node, ...], span: Span) -> Node:
    return _fold(factors, span, Product, sympy.Mul, 1)


def _sum(terms: tuple[Node, ...], span: Span) -> Node:
    return _fold(terms, span, Sum, sympy.Add, 0)


def _fold(parts: tuple[Node, ...], span: Span, kind: type, combine, identity: int) -> Node:
    """Flattens nested products (or sums) and folds their tensor-free parts into one Field."""
    flat: list[Node] = []
    for part in parts:
        flat.extend(children(part) if isinstance(part, kind) else (part,))
    fields = [p for p in flat if isinstance(p, Field)]
    others = [p for p in flat if not isinstance(p, Field)]
    if fields:
        expr, free = combine(*(f.expr for f in fields)), _union(*(f.free for f in fields))
        if not others:
            return Field(expr, free, span)
        if expr != identity:
            others.append(Field(expr, free, fields[0].span))
    if len(others) == 1:
        return others[0]
    return Product(tuple(others), (), span) if kind is Product else Sum(tuple(others), span)


def _reciprocal(node: Node, span: Span) -> Node:
    if isinstance(node, Field):
        return Field(1 / node.expr, node.free, node.span)
    return Apply("pow", (node, Field(sympy.Integer(-1), (), span)), node.span)


def _batched(node: Node) -> bool:
    if isinstance(node, Ref):
        return node.tensor.batched
    if isinstance(node, Field):
        return False
    return any(_batched(child) for child in children(node))


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Product):
        return node.factors
    if isinstance(node, Sum):
        return node.terms
    if isinstance(node, Apply):
        return node.args
    if isinstance(node, Reduce):
        return (node.body,)
    return ()


def refs(node: Node):
    """Every tensor reference in a node, depth first in the order written."""
    if isinstance(node, Ref):
        yield node
    for child in children(node):
        yield from refs(child)


class Analysis:
    """Einstein summation, top-down: which indices each product sums, and the mistakes."""

    def __init__(self, checker: Checker, lhs: frozenset[Index]) -> None:
        self.checker, self.lhs = checker, lhs

    def top(self, node: Node) -> Node:
        node = self.visit(node, self.lhs)
        for index in node.free:
            if index not in self.lhs:
                raise self.once(index, node)
        return node

    def once(self, index: Index, node: Node) -> SpecError:
        return self.checker.error(
            f"index {index.glyph} is not on the left and appears only once",
            locate(node, index),
            f"Einstein summation sums an index that appears in two factors. To sum over "
            f"{index.glyph}, write sum_<{index.glyph}>(...); to keep it, add it to the left; "
            f"to pick one slice, write a digit in its place.",
        )

    def visit(self, node: Node, keep: frozenset[Index]) -> Node:
        if isinstance(node, (Field, Ref)):
            return node
        if isinstance(node, Product):
            return self.product(node, keep)
        if isinstance(node, Reduce):
            return self.reduce(node, keep)
        new = tuple(self.visit(child, keep) for child in children(node))
        return Sum(new, node.span) if isinstance(node, Sum) else Apply(node.fn, new, node.span)

    def product(self, node: Product, keep: frozenset[Index]) -> Node:
        factors = []
        for k, factor in enumerate(node.factors):
            siblings = frozenset(
                i for j, other in enumerate(node.factors) if j != k for i in visible(other)
            )
            factors.append(self.visit(factor, keep | siblings))
        counts: dict[Index, int] = {}
        for factor in factors:
            for index in factor.free:
                counts[index] = counts.get(index, 0) + 1
        for index, count in counts.items():
            if count == 1 and index not in keep:
                raise self.once(index, node)
        summed = tuple(i for i, c in counts.items() if c > 1 and i not in keep)
        return Product(tuple(factors), summed, node.span)

    def reduce(self, node: Reduce, keep: frozenset[Index]) -> Node:
        body = self.visit(node.body, keep | frozenset(node.over))
        for index in node.over:
            if index not in body.free:
                raise self.checker.error(
                    f"{node.fn} over {index.glyph}, which is not free in its argument",
                    node.span,
                    f"{node.fn}_<{index.glyph}> needs {index.glyph} among the "
                    "indices of what it is applied to.",
                )
        return Reduce(node.fn, node.over, body, node.span)


def visible(node: Node) -> frozenset[Index]:
    """Every index a node mentions and does not bind: what its siblings must not sum away."""
    if isinstance(node, (Field, Ref)):
        return frozenset(node.free)
    inner = frozenset(i for child in children(node) for i in visible(child))
    return (
        inner - frozenset(node.over) if isinstance(node, Reduce) and node.fn != "softmax" else inner
    )


def locate(node: Node, index: Index) -> Span:
    """Where an index is written inside a node (for carets)."""
    if isinstance(node, Ref):
        return next((s for i, s in zip(node.free, node.spans) if i == index), node.span)
    if isinstance(node, Field):
        return node.span
    for child in children(node):
        if index in visible(child):
            return locate(child, index)
    return node.span
