"""Syntax -> meaning: each statement of a Document read once against the spec's scope,
declarations into indices, sizes, tensors and scalars, equations into checked IR."""

from __future__ import annotations

from dataclasses import replace

import sympy

from ..errors import Span
from ..notation import equation as unparse_equation
from ..notation import parse
from ..notation import syntax as ast
from ..ops import CONSTANTS
from .einstein import Analysis
from .expressions import Expressions, repeated
from .implied import implied, size_name, written
from .kinds import integer_tensors, kind
from .nodes import (
    Equation,
    Field,
    Index,
    Node,
    Reduce,
    Scalar,
    Spec,
    Tensor,
    batched,
    children,
    is_condition,
)
from .scope import Scope


def check(source: str, name: str, file: str = "<spec>") -> Spec:
    """`check(text, "mha")` -> the Spec IR, or SpecError naming the first mistake."""
    return Checker(parse(source, name, file)).spec()


class Checker:
    """Walks a Document once, building the IR and raising SpecError at the first mistake."""

    def __init__(self, doc: ast.Document) -> None:
        self.doc, self.scope = doc, Scope(doc)
        self.expressions = Expressions(self.scope)
        self.error = self.scope.error
        self.equations: list[Equation] = []
        self.implied = implied(doc)  # indices a tensor's axis fixes, with no index line
        self.taken = written(doc) if self.implied else set()

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
        scope = self.scope
        if not self.equations:
            raise self.error(
                "a spec needs at least one equation", None, "write e.g. Y_<τi> = X_<τi>."
            )
        if not any(t.role != "derived" and t.dtype == "float" for t in scope.tensors.values()):
            raise self.error(
                "a spec needs at least one input, param or buffer of floats",
                None,
                "declare the data it works on, e.g. input X_<τi>; the first one sets the dtype.",
            )
        return Spec(
            self.doc.name,
            self.doc.title,
            self.doc.description,
            tuple(scope.indices.values()),
            tuple(scope.sizes.values()),
            tuple(scope.tensors.values()),
            tuple(scope.scalars.values()),
            tuple(self.equations),
            self.output_tensors(outputs),
            tuple(scope.size_asciis.values()),
        )

    def output_tensors(self, names: tuple[ast.Name, ...] | None) -> tuple[Tensor, ...]:
        if names is None:
            return (self.equations[-1].tensor,)
        out = []
        for name in names:
            tensor = self.scope.tensors.get(name.name)
            if tensor is None or tensor.role != "derived":
                raise self.error(
                    f"{name.name} is not defined by an equation",
                    name.span,
                    "an output names a tensor on the left of an equation."
                    + self.scope.suggest(name.name, self.scope.tensors),
                )
            if tensor in out:
                raise self.error(f"{name.name} is named twice", name.span)
            out.append(tensor)
        return tuple(out)

    # -- declarations

    def stmt_IndexDecl(self, stmt: ast.IndexDecl) -> None:
        scope = self.scope
        size = self.range_size(stmt.size)
        for name in stmt.names:
            scope.spelled(name.glyph, name.span)
            ascii = scope.claim(name.glyph, "an index", name.span)
            symbol = sympy.Symbol(name.glyph, integer=True, nonnegative=True)
            scope.indices[name.glyph] = Index(name.glyph, ascii, size, stmt.doc, symbol)

    def implied_family(self, at: ast.IndexName) -> None:
        """Indices with no index line whose family is first held alone on an axis here: they
        range over one size of their own, solved from that axis's length (ir/implied.py)."""
        size = self.scope.new_size(ast.Name(size_name(at.glyph, self.taken), at.span))
        for glyph in (g for g, where in self.implied.items() if where is at):
            ascii = self.scope.claim(glyph, "an index", at.span)
            symbol = sympy.Symbol(glyph, integer=True, nonnegative=True)
            self.scope.indices[glyph] = Index(glyph, ascii, size, "", symbol)

    def range_size(self, node: ast.Expr) -> sympy.Expr:
        """A range in size symbols: a new name declares a size."""
        if isinstance(node, ast.Num):
            return sympy.Integer(node.value)
        if isinstance(node, ast.Name):
            if node.name in self.scope.names and node.name not in self.scope.sizes:
                kind, where = self.scope.names[node.name]
                raise self.error(
                    f"{node.name} is {kind} (line {where.line}), not a size",
                    node.span,
                    "a range is written in sizes and whole numbers.",
                )
            return self.scope.sizes.get(node.name) or self.scope.new_size(node)
        if isinstance(node, ast.Call):  # ceil(N / ℓ), floor(N / ℓ): the parser allows no other
            return {"ceil": sympy.ceiling, "floor": sympy.floor}[node.func](
                self.range_size(node.args[0])
            )
        left, right = self.range_size(node.left), self.range_size(node.right)
        return {"+": left + right, "-": left - right, "*": left * right, "/": left / right}[node.op]

    def stmt_TensorDecl(self, stmt: ast.TensorDecl) -> None:
        for axis in stmt.ref.axes:
            if self.implied.get(getattr(axis, "glyph", None)) is axis:
                self.implied_family(axis)
        layout = self.layout(stmt.ref, "declaration")
        ascii = self.scope.claim(stmt.ref.name, "a tensor", stmt.ref.span)
        self.scope.tensors[stmt.ref.name] = Tensor(
            stmt.ref.name,
            ascii,
            stmt.role,
            layout,
            stmt.role == "input",
            stmt.init,
            stmt.doc,
            stmt.ref.span,
            stmt.dtype,
        )

    def stmt_ScalarDecl(self, stmt: ast.ScalarDecl) -> None:
        value = self.constant(stmt)
        ascii = self.scope.claim(stmt.name, "a scalar", stmt.span)
        self.scope.scalars[stmt.name] = Scalar(
            stmt.name, ascii, value, sympy.Symbol(stmt.name, real=True), stmt.doc
        )

    def constant(self, stmt: ast.ScalarDecl) -> float:
        """A scalar's value: numbers, π, inf and functions of them, folded to one float."""
        node = self.expressions.number(stmt.value)
        if isinstance(node, Field) and not node.expr.free_symbols:
            return float(node.expr)
        variable = (n for n in ast.walk(stmt.value) if _variable(n))
        where = next(variable, stmt.value)
        raise self.error(
            "a scalar's value is known before any call: numbers, π, inf and functions of them",
            where.span,
            f"write e.g. scalar {stmt.name} = 2 π; a value that depends on sizes or other "
            "scalars goes into the equations that use it.",
        )

    def layout(self, ref: ast.Ref, where: str) -> tuple[tuple[Index, ...], ...]:
        """The axes of a declaration or a left-hand side: indices and groups, no literals."""
        seen: dict[str, Span] = {}
        axes = []
        for axis in ref.axes:
            items = axis.items if isinstance(axis, ast.Group) else (axis,)
            for item in items:
                if isinstance(item, (ast.Literal, ast.Computed)):
                    what = "literal index" if isinstance(item, ast.Literal) else "position [...]"
                    does = "selects a slice" if isinstance(item, ast.Literal) else "selects"
                    raise self.error(
                        f"a {what} in a {where}",
                        item.span,
                        f"a {what.split()[0]} {does} where a tensor is used; "
                        "declare the axis with an index.",
                    )
                repeated(self.scope, item, seen, ref)
            axes.append(tuple(self.scope.index(item) for item in items))
        return tuple(axes)

    # -- equations

    def stmt_Equation(self, stmt: ast.Equation) -> None:
        lhs, scope = stmt.lhs, self.scope
        if lhs.name in scope.tensors:
            earlier = scope.tensors[lhs.name]
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
        indices = frozenset(i for axis in layout for i in axis)
        rhs = Analysis(scope, indices).top(self.expressions.number(stmt.rhs))
        self.check_lhs(lhs, layout, rhs)
        self.check_ranks(rhs, rhs)
        ascii = scope.claim(lhs.name, "a tensor", lhs.span)
        dtype = "int" if integer_tensors(rhs) else "float"
        whole = kind(rhs) == "int"
        if stmt.precision and whole:
            raise self.error(
                f"{lhs.name} holds whole numbers, computed exactly; a precision is for floats",
                lhs.span,
                f"remove ': {stmt.precision}'.",
            )
        tensor = Tensor(
            lhs.name, ascii, "derived", layout, batched(rhs), None, stmt.doc, lhs.span, dtype
        )
        tensor = replace(tensor, whole=whole, precision=stmt.precision)
        scope.tensors[lhs.name] = tensor
        self.equations.append(Equation(tensor, rhs, unparse_equation(stmt), stmt.doc, stmt))

    def check_ranks(self, node: Node, rhs: Node) -> None:
        """A rank is compared (`rank_<β>(P) < n`) or is an equation's whole right side: a
        place in an order has no gradient, and there nothing differentiates it."""
        if is_condition(node):
            return
        if isinstance(node, Reduce) and node.fn == "rank" and node is not rhs:
            over = "".join(i.glyph for i in node.over)
            raise self.error(
                "a rank is a place in an order, with no gradient: it is compared, or it is a "
                "tensor of its own",
                node.span,
                f"select by it, where(rank_<{over}>(...) < k, ...), or write it as its own "
                f"equation, R_<...> = rank_<{over}>(...).",
            )
        for child in children(node):
            self.check_ranks(child, rhs)

    def check_lhs(self, lhs: ast.Ref, layout, rhs: Node) -> None:
        items = [
            i for axis in lhs.axes for i in (axis.items if isinstance(axis, ast.Group) else (axis,))
        ]
        for index, item in zip((i for axis in layout for i in axis), items):
            if index not in rhs.free:
                raise self.error(
                    f"index {index.glyph} is on the left but not on the right",
                    item.span,
                    "every left-hand index must appear on the "
                    "right, in a tensor or as an index variable; to repeat a "
                    f"value along {index.glyph}, multiply by a tensor that "
                    "carries it.",
                )


def _variable(node: ast.Expr) -> bool:
    """A tensor, or a name that is not a constant (an index, a size or a scalar)."""
    return isinstance(node, ast.Ref) or (isinstance(node, ast.Name) and node.name not in CONSTANTS)
