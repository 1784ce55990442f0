"""Syntax expressions -> IR nodes: names resolved, references checked against their
declarations, tensor-free parts folded into sympy Fields by the operator table's forms."""

from __future__ import annotations

import math
from dataclasses import replace

import sympy

from ..errors import Span
from ..notation import syntax as ast
from ..ops import CONSTANTS, FUNCTIONS, OPERATORS, REDUCTIONS
from .kinds import integer_tensors, kind
from .nodes import (
    Apply,
    At,
    Concat,
    Field,
    Index,
    Node,
    Product,
    Reduce,
    Ref,
    Sum,
    Tensor,
    batched,
    children,
    is_condition,
    layout_text,
    union,
)
from .scope import Scope


class Expressions:
    """Reads the right-hand sides of a spec against its scope."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.error = scope.error

    def expr(self, node: ast.Expr) -> Node:
        result = getattr(self, "expr_" + type(node).__name__)(node)
        constants = children(result) if isinstance(result, (Product, Sum)) else (result,)
        if any(
            isinstance(c, Field) and c.expr.has(sympy.zoo, sympy.nan, sympy.I) for c in constants
        ):
            raise self.error(
                "this value is not a real number",
                node.span,
                "look for a division by zero, log(0), the sqrt of a negative number or inf - inf;"
                " minus infinity is written -inf.",
            )
        return result

    def number(self, node: ast.Expr) -> Node:
        """An expression used as a value: a comparison is not one."""
        result = self.expr(node)
        if is_condition(result):
            raise self.error(
                "a comparison is used as a number here",
                node.span,
                "comparisons go in where(...) and and/or/not; for 1 where it holds and 0 where "
                "it does not, write where(condition, 1, 0).",
            )
        return result

    # -- leaves

    def expr_Num(self, node: ast.Num) -> Node:
        value = (
            sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(node.value)
        )
        return Field(value, (), node.span)

    def expr_Inf(self, node: ast.Inf) -> Node:
        return Field(sympy.oo, (), node.span)

    def expr_Name(self, node: ast.Name) -> Node:
        scope = self.scope
        scope.spelled(node.name, node.span)
        if node.name in scope.indices:
            index = scope.indices[node.name]
            return Field(index.symbol, (index,), node.span)
        if node.name in scope.scalars:
            return Field(scope.scalars[node.name].symbol, (), node.span)
        if node.name in scope.sizes:
            return Field(scope.sizes[node.name], (), node.span)
        if node.name in scope.tensors or node.name in scope.defined_later:
            raise self.error(
                f"{node.name} is a tensor: write it with its indices",
                node.span,
                f"write it as declared: {scope.tensors[node.name]!r}."
                if node.name in scope.tensors
                else f"e.g. {node.name}_<...>, or {node.name}_<> if it has no indices.",
            )
        if node.name in CONSTANTS:
            return Field(CONSTANTS[node.name], (), node.span)
        kind = "index" if node.name.endswith("'") else "name"
        raise self.error(
            f"unknown {kind} {node.name}",
            node.span,
            f"declare it (index {node.name} : SIZE, or scalar {node.name} = 1.0), "
            "or use a size that an index line names."
            + scope.suggest(node.name, [*scope.indices, *scope.scalars, *scope.sizes]),
        )

    def expr_Ref(self, node: ast.Ref) -> Node:
        tensor = self.scope.tensor(node)
        if len(node.axes) != len(tensor.layout):
            raise self.error(
                f"{node.name} has {len(tensor.layout)} axes, written here with {len(node.axes)}",
                node.span,
                f"write it as declared: {tensor!r}.",
            )
        seen: dict[str, Span] = {}
        axes, places = [], {}
        for written, declared in zip(node.axes, tensor.layout):
            items = self.group_items(written, declared, tensor)
            axis = []
            for item, want in zip(items, declared):
                axis.append(self.ref_item(item, want, tensor, seen, node))
                for index in axis[-1].free if isinstance(axis[-1], At) else axis[-1:]:
                    places.setdefault(index, item.span)
            axes.append(tuple(axis))
        ref = Ref(tensor, tuple(axes), node.span, (), node)
        self.no_diagonal(ref)
        return replace(ref, spans=tuple(places[i] for i in ref.free))

    def no_diagonal(self, ref: Ref) -> None:
        """An index both names an axis and moves a position along another: not yet."""
        plain = {i for i in ref.written if isinstance(i, Index)}
        for item in ref.written:
            both = [i for i in getattr(item, "free", ()) if i in plain]
            if both:
                raise self.error(
                    f"index {both[0].glyph} names an axis of {ref.tensor.name} and is in "
                    "the position [...] of another",
                    item.span,
                    f"declare a second index with the range of {both[0].glyph} for one of "
                    "the two places.",
                )

    def group_items(self, written: ast.Axis, declared: tuple[Index, ...], tensor: Tensor) -> tuple:
        items = written.items if isinstance(written, ast.Group) else (written,)
        if len(items) != len(declared) or isinstance(written, ast.Group) != (len(declared) > 1):
            want = layout_text((declared,))
            raise self.error(
                f"this axis of {tensor.name} is declared as {want}",
                written.span,
                f"write the axis as {want}, with the same grouping (indices may "
                "be renamed, or replaced by digits to select a slice).",
            )
        return items

    def ref_item(
        self, item, want: Index, tensor: Tensor, seen: dict[str, Span], node: ast.Ref
    ) -> Index | int | At:
        if isinstance(item, ast.Computed):
            return self.position(item, tensor)
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
        repeated(self.scope, item, seen, node)
        index = self.scope.index(item)
        if index.size != want.size:
            raise self.error(
                f"index {index.glyph} has range {index.size}, but {tensor.name} "
                f"has range {want.size} here (index {want.glyph})",
                item.span,
                f"use an index of range {want.size}, e.g. {want.glyph}.",
            )
        return index

    def position(self, item: ast.Computed, tensor: Tensor) -> At:
        """`[τ' - τ + N - 1]`: a whole number; from batched data only into unbatched tensors
        (an embedding table read at token ids)."""
        value = self.number(item.expr)
        if kind(value) != "int":
            raise self.error(
                "a position is a whole number",
                item.expr.span,
                "use whole numbers, indices, sizes and integer tensors, and round a "
                "division: floor(τ / C), not τ / C.",
            )
        if batched(value) and tensor.batched:
            raise self.error(
                f"positions read from batched data into {tensor.name}, which is batched too, "
                "are not supported yet",
                item.expr.span,
                "positions into inputs come from indices, sizes, params and buffers "
                "(docs/language.md).",
            )
        return At(value, item.span)

    # -- operators

    def expr_Unary(self, node: ast.Unary) -> Node:
        operand = (self.expr if node.op == "not" else self.number)(node.operand)
        if node.op == "+":
            return operand
        if node.op == "not":
            return self.logic("not", (operand,), node.span)
        return product((Field(sympy.Integer(-1), (), node.span), operand), node.span, node)

    def expr_Binary(self, node: ast.Binary) -> Node:
        operand = self.expr if node.op in ("and", "or") else self.number
        left, right = operand(node.left), operand(node.right)
        op = node.op
        if op in ("+", "-"):
            if op == "-":
                right = product(
                    (Field(sympy.Integer(-1), (), node.span), right), node.span, node.right
                )
            return fold((left, right), node.span, Sum)
        if op == "*":
            return product((left, right), node.span, node)
        if op == "/":
            return product((left, reciprocal(right, node.span)), node.span, node)
        if op == "^":
            if isinstance(left, Field) and isinstance(right, Field):
                power = self.power(left.expr, right.expr, node.span)
                return Field(power, union(left.free, right.free), node.span)
            return Apply("pow", (left, right), node.span)
        if OPERATORS[op].kind == "comparison":
            if isinstance(left, Field) and isinstance(right, Field):
                expr = OPERATORS[op].sympy(left.expr, right.expr)
                return Field(expr, union(left.free, right.free), node.span)
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
            if not is_condition(arg):
                raise self.error(
                    f"'{op}' joins comparisons, not values",
                    arg.span,
                    f"write e.g. a > 0 {op} b > 0." if op != "not" else "write e.g. not a > 0.",
                )
        if all(isinstance(a, Field) for a in args):
            expr = OPERATORS[op].sympy(*(a.expr for a in args))
            return Field(expr, union(*(a.free for a in args)), span)
        return Apply(op, args, span)

    # -- calls

    def expr_Call(self, node: ast.Call) -> Node:
        args = tuple(
            self.expr(arg) if node.func == "where" and k == 0 else self.number(arg)
            for k, arg in enumerate(node.args)
        )
        op = (REDUCTIONS if node.over else FUNCTIONS)[node.func]
        if not op.integers:
            for arg, written in zip(args, node.args):
                self.floats(node.func, arg, written)
        if node.over:
            over = tuple(self.scope.index(i) for i in node.over)
            if len(set(over)) != len(over):
                raise self.error(f"{node.func} names an index twice", node.span)
            if node.func == "concat":  # checked once Einstein summation has run in its parts
                return Concat(over[0], args, (), node.span)
            return Reduce(node.func, over, args[0], node.span)
        if node.func == "where":
            self.condition(args[0])
        if node.func == "dropout":
            self.probability(args[1])
        form = FUNCTIONS[node.func].sympy
        if form is not None and all(isinstance(a, Field) for a in args):
            expr = form(*(a.expr for a in args))
            return Field(expr, union(*(a.free for a in args)), node.span)
        return Apply(node.func, args, node.span)

    def floats(self, func: str, arg: Node, written: ast.Expr) -> None:
        """A function that needs floats, of integer tensors alone: torch would pick a dtype."""
        names = integer_tensors(arg)
        if names:
            raise self.error(
                f"{func} needs floats, and {', '.join(names)} holds integers",
                written.span,
                f"compare integers (where({names[0]}_<...> == ..., 0, -inf)), use them as "
                "positions ([...] in a subscript), or multiply them by a float first.",
            )

    def condition(self, cond: Node) -> None:
        if not is_condition(cond):
            raise self.error(
                "the first argument of where is a condition",
                cond.span,
                "write a comparison, e.g. where(τ' > τ, -inf, 0).",
            )

    def probability(self, p: Node) -> None:
        scalars = {s.symbol for s in self.scope.scalars.values()}
        if not isinstance(p, Field) or p.free or p.expr.free_symbols - scalars:
            raise self.error(
                "the dropout probability is a number or a scalar",
                p.span,
                "declare scalar p = 0.1 and write dropout(e, p).",
            )
        if p.expr.is_number and not 0 <= float(p.expr) < 1:
            raise self.error("a dropout probability is at least 0 and below 1", p.span)


def repeated(scope: Scope, item: ast.IndexName, seen: dict[str, Span], ref: ast.Ref) -> None:
    if item.glyph in seen:
        raise scope.error(
            f"index {item.glyph} appears twice in {ref.name}",
            item.span,
            "a tensor's axes need distinct indices; for a diagonal, declare "
            "a second index with the same range (index τ, τ' : N).",
        )
    seen[item.glyph] = item.span


# -- folding


def product(factors: tuple[Node, ...], span: Span, source: ast.Expr | None = None) -> Node:
    return fold(factors, span, Product, source)


def fold(parts: tuple[Node, ...], span: Span, kind: type, source: ast.Expr | None = None) -> Node:
    """Flattens nested products (or sums) and folds their tensor-free parts into one Field."""
    combine, identity = (sympy.Mul, 1) if kind is Product else (sympy.Add, 0)
    flat: list[Node] = []
    for part in parts:
        flat.extend(children(part) if isinstance(part, kind) else (part,))
    fields = [p for p in flat if isinstance(p, Field)]
    others = [p for p in flat if not isinstance(p, Field)]
    if fields:
        expr, free = combine(*(f.expr for f in fields)), union(*(f.free for f in fields))
        if not others:
            return Field(expr, free, span)
        if expr != identity:
            others.append(Field(expr, free, fields[0].span))
    if len(others) == 1:
        return others[0]
    if kind is Product:
        return Product(tuple(others), (), span, source)
    return Sum(tuple(others), span)


def reciprocal(node: Node, span: Span) -> Node:
    if isinstance(node, Field):
        return Field(1 / node.expr, node.free, node.span)
    return Apply("pow", (node, Field(sympy.Integer(-1), (), span)), node.span)
