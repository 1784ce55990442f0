"""Tokens -> syntax tree, by recursive descent, so every message can say what was expected."""

from __future__ import annotations

import difflib

from .. import ops
from ..errors import Span, SpecError
from . import syntax as ast
from .lexer import Bracket, Token, lex

FUNCTIONS = ops.CALLABLE
DECLARATIONS = ("index", "input", "param", "buffer", "scalar", "output")
INITIALISERS = {"normal": 2, "uniform": 2, "zeros": 0, "ones": 0}
PRECISIONS = ("float32", "float64")  # A_<ττ'> : float32 = ...
COMPARISONS = ops.COMPARISONS
KEYWORDS = frozenset({"and", "or", "not", "inf"})
ROUNDINGS = frozenset({"ceil", "floor"})  # the functions a range may round a quotient by
# Said only of an indented line that starts with a value, where a continuation was likely meant.
CONTINUATION = (
    "\nIf this line continues the one above, end that line with an operator (+, -, *, /) or "
    "begin this one with one; an open bracket also carries a statement over."
)
MAX_DEPTH = 32  # parentheses, calls, signs and powers nested in one expression
MAX_TOKENS = 1000  # in one statement


def parse(source: str, name: str, file: str = "<spec>") -> ast.Document:
    """`parse("index i : n\\ninput x_<i>\\ny_<i> = x_<i>", "demo")` -> a Document."""
    lexed = lex(source, file)
    title, description, header_end = _header(source, lexed.comments)
    statements = []
    for tokens in lexed.statements:
        parser = StatementParser(tokens, source, file)
        doc = " ".join(
            lexed.comments[line]
            for line in parser.lines()
            if line in lexed.comments and line > header_end
        )
        statements.append(parser.statement(doc))
    return ast.Document(name, file, source, title, description, tuple(statements))


def _header(source: str, comments: dict[int, str]) -> tuple[str, str, int]:
    """The comment lines at the very top: title (first) and description (the rest)."""
    lines = []
    for number, text in enumerate(source.split("\n"), start=1):
        if not text.lstrip().startswith("#"):
            break
        lines.append(comments.get(number, ""))
    title = lines[0] if lines else ""
    return title, "\n".join(lines[1:]).strip("\n"), len(lines)


def cover(first: Span, last: Span) -> Span:
    if first.line != last.line:
        return first
    return Span(first.line, first.col, last.col + last.length - first.col)


class StatementParser:
    """Parses one statement's tokens."""

    def __init__(self, tokens: tuple[Token, ...], source: str, file: str) -> None:
        last = tokens[-1].span
        end = Token("END", "", Span(last.line, last.col + last.length, 1))
        self.tokens, self.pos, self.source, self.file = (*tokens, end), 0, source, file
        self.depth = 0
        if len(tokens) > MAX_TOKENS:
            raise self.error(
                f"a statement of more than {MAX_TOKENS} tokens",
                tokens[0].span,
                "split it into several equations.",
            )

    def nested(self, parse, *args):
        """Parses a nested part, refusing nesting deeper than any equation needs."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(
                f"an expression nested more than {MAX_DEPTH} levels deep",
                hint="name the inner parts in equations of their own.",
            )
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    def lines(self) -> range:
        return range(self.tokens[0].span.line, self.tokens[-1].span.line + 1)

    # -- helpers

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def at(self, *texts: str) -> bool:
        return self.tok.kind in ("OP", "NAME") and self.tok.text in texts

    def error(self, message: str, span: Span | None = None, hint: str = "") -> SpecError:
        return SpecError(
            message, source=self.source, file=self.file, span=span or self.tok.span, hint=hint
        )

    def expect(self, text: str, hint: str = "") -> Token:
        if not self.at(text):
            found = "the end of the line" if self.tok.kind == "END" else f"'{self.tok.text}'"
            raise self.error(f"expected '{text}', found {found}", hint=hint)
        return self.advance()

    def end(self) -> None:
        if self.tok.kind != "END":
            raise self.error(
                f"unexpected '{self.tok.text}' after a complete statement",
                hint="one statement per line: put what follows on a line of its own.",
            )

    # -- statements

    def statement(self, doc: str) -> ast.Statement:
        first = self.tok
        if first.kind == "NAME" and first.text in DECLARATIONS and not self.peek_is("="):
            self.advance()
            return getattr(self, "decl_" + first.text)(first.span, doc)
        if first.kind == "REF" and (self.peek_is("=") or self.peek_is(":")):
            lhs = self.reference(self.advance())
            precision = self.precision() if self.at(":") else ""
            self.expect("=", "write the equation after the precision: A_<ττ'> : float32 = ...")
            rhs = self.expression()
            self.end()
            return ast.Equation(lhs, rhs, doc, first.span, precision)
        raise self.error(
            "expected a declaration or an equation",
            hint="a statement starts with index, input, param, buffer, scalar "
            "or output, or is an equation NAME_<indices> = expression."
            + (CONTINUATION if first.span.col > 1 and self.starts_atom() else ""),
        )

    def precision(self) -> str:
        """`: float32` after an equation's left side: the tensor is computed in float32 or
        wider (docs/language.md, "Numerics")."""
        self.advance()
        tok = self.advance()
        if tok.kind != "NAME" or tok.text not in PRECISIONS:
            raise self.error(
                "expected float32 or float64 after ':'",
                tok.span,
                "write A_<ττ'> : float32 = ... to compute A in float32 (or in float64 in a "
                "float64 call).",
            )
        return tok.text

    def peek_is(self, text: str) -> bool:
        nxt = self.tokens[self.pos + 1]
        return nxt.kind == "OP" and nxt.text == text

    def decl_index(self, span: Span, doc: str) -> ast.IndexDecl:
        names = [self.index_name()]
        while self.at(","):
            self.advance()
            names.append(self.index_name())
        self.expect(":", "write the range after a colon: index τ : N.")
        size = self.range_size()
        self.end()
        return ast.IndexDecl(tuple(names), size, doc, span)

    def range_size(self) -> ast.Expr:
        """A size symbol, a positive whole number, or sums, products and quotients of them
        (N_c + N, N / ℓ, ceil(N / ℓ))."""
        size = self.arithmetic()
        for node in ast.walk(size):
            ok = isinstance(node, ast.Name) and node.name not in KEYWORDS and "'" not in node.name
            whole = isinstance(node, ast.Num) and isinstance(node.value, int)
            ok = ok or (whole and node.value > 0)
            ok = ok or (isinstance(node, ast.Binary) and node.op in "+-*/")
            ok = ok or (isinstance(node, ast.Call) and node.func in ROUNDINGS)
            if not ok:
                raise self.error(
                    "a range is a size symbol, a positive whole number, or sums, products and "
                    "quotients of them",
                    node.span,
                    "write e.g. index τ : N, index B : 3, index σ : N_c + N, index β : N / ℓ "
                    "or index β : ceil(N / ℓ).",
                )
        return size

    def index_name(self) -> ast.IndexName:
        tok = self.advance()
        letters = tok.text.rstrip("'")
        if tok.kind != "NAME" or len(letters) != 1 or not letters.isalpha():
            raise self.error(
                "an index is one letter, optionally with primes",
                tok.span,
                "write e.g. index τ, τ' : N (or \\tau, \\tau').",
            )
        return ast.IndexName(tok.text, tok.span)

    def decl_input(self, span: Span, doc: str) -> ast.TensorDecl:
        return self.tensor_decl("input", span, doc)

    def decl_param(self, span: Span, doc: str) -> ast.TensorDecl:
        return self.tensor_decl("param", span, doc)

    def decl_buffer(self, span: Span, doc: str) -> ast.TensorDecl:
        return self.tensor_decl("buffer", span, doc)

    def tensor_decl(self, role: str, span: Span, doc: str) -> ast.TensorDecl:
        if self.tok.kind != "REF":
            raise self.error(f"expected a tensor after '{role}'", hint=f"write e.g. {role} X_<τi>.")
        ref = self.reference(self.advance())
        dtype = self.element_type(role)
        init = None
        if self.at("~"):
            tilde = self.advance()
            if role != "param":
                article = "an" if role[0] in "aeiou" else "a"
                raise self.error(
                    f"only a param has an initialiser, not {article} {role}",
                    tilde.span,
                    "remove the '~ ...' part, or declare it as a param.",
                )
            init = self.initialiser()
        self.end()
        return ast.TensorDecl(role, ref, init, doc, span, dtype)

    def element_type(self, role: str) -> str:
        """`: int` after an input or a buffer: integer elements, kept as integers."""
        if not self.at(":"):
            return "float"
        colon = self.advance()
        tok = self.advance()
        if tok.kind != "NAME" or tok.text not in ("int", "float"):
            raise self.error(
                "expected an element type after ':'", tok.span, f"write {role} D_<τ> : int."
            )
        if tok.text == "int" and role == "param":
            raise self.error(
                "a param is learned, so its elements are floats",
                cover(colon.span, tok.span),
                "declare integer data as an input or a buffer: input D_<τ> : int.",
            )
        return tok.text

    def initialiser(self) -> ast.Init:
        tok = self.advance()
        if tok.kind != "NAME" or tok.text not in INITIALISERS:
            raise self.error(
                "unknown initialiser",
                tok.span,
                "write normal(mean, std), uniform(low, high), zeros or ones."
                + _suggest(tok.text, INITIALISERS),
            )
        args: list[float] = []
        if INITIALISERS[tok.text]:
            self.expect("(", f"write {tok.text}(a, b).")
            args.append(self.signed_number())
            while self.at(","):
                self.advance()
                args.append(self.signed_number())
            close = self.expect(")")
            if len(args) != INITIALISERS[tok.text]:
                raise self.error(
                    f"{tok.text} takes {INITIALISERS[tok.text]} numbers, not {len(args)}",
                    cover(tok.span, close.span),
                )
        return ast.Init(tok.text, tuple(args), tok.span)

    def signed_number(self) -> float:
        sign = -1.0 if self.at("-") else 1.0
        if self.at("-", "+"):
            self.advance()
        tok = self.advance()
        if tok.kind != "NUMBER":
            raise self.error("expected a number", tok.span)
        return sign * float(tok.value)  # type: ignore[arg-type]

    def decl_scalar(self, span: Span, doc: str) -> ast.ScalarDecl:
        tok = self.advance()
        if tok.kind != "NAME" or tok.text in KEYWORDS or "'" in tok.text:
            raise self.error("expected the scalar's name", tok.span, "write e.g. scalar p = 0.1.")
        self.expect("=", f"give the scalar a value: scalar {tok.text} = 0.1.")
        value = self.expression()
        self.end()
        return ast.ScalarDecl(tok.text, value, doc, tok.span)

    def decl_output(self, span: Span, doc: str) -> ast.OutputDecl:
        names = [self.output_name()]
        while self.at(","):
            self.advance()
            names.append(self.output_name())
        self.end()
        return ast.OutputDecl(tuple(names), span)

    def output_name(self) -> ast.Name:
        tok = self.advance()
        if tok.kind == "REF":
            raise self.error(
                "name the output without its indices", tok.span, f"write output {tok.text}."
            )
        if tok.kind != "NAME":
            raise self.error("expected a tensor name", tok.span, "write e.g. output Y, A.")
        return ast.Name(tok.text, tok.span)

    def reference(self, tok: Token) -> ast.Ref:
        name, axes = tok.value  # type: ignore[misc]
        return ast.Ref(name, tuple(self.axis(axis) for axis in axes), tok.span)

    def axis(self, axis):
        """A subscript slot as the lexer left it, with computed positions parsed."""
        if isinstance(axis, ast.Group):
            return ast.Group(tuple(self.axis(item) for item in axis.items), axis.span)
        if not isinstance(axis, Bracket):
            return axis
        inner = StatementParser(axis.tokens, self.source, self.file)
        inner.depth = self.depth
        expr = inner.nested(inner.expression)
        if inner.tok.kind != "END":
            raise inner.error(
                f"unexpected '{inner.tok.text}' in a position", hint="write one expression."
            )
        return ast.Computed(expr, axis.span)

    # -- expressions, loosest first

    def expression(self) -> ast.Expr:
        return self.disjunction()

    def disjunction(self) -> ast.Expr:
        left = self.conjunction()
        while self.at("or"):
            self.advance()
            right = self.conjunction()
            left = ast.Binary("or", left, right, cover(left.span, right.span))
        return left

    def conjunction(self) -> ast.Expr:
        left = self.negation()
        while self.at("and"):
            self.advance()
            right = self.negation()
            left = ast.Binary("and", left, right, cover(left.span, right.span))
        return left

    def negation(self) -> ast.Expr:
        if self.at("not"):
            tok = self.advance()
            operand = self.nested(self.negation)
            return ast.Unary("not", operand, cover(tok.span, operand.span))
        return self.comparison()

    def comparison(self) -> ast.Expr:
        left = self.arithmetic()
        if self.at(*COMPARISONS):
            op = self.advance().text
            right = self.arithmetic()
            left = ast.Binary(op, left, right, cover(left.span, right.span))
            if self.at(*COMPARISONS):
                raise self.error(
                    "comparisons do not chain", hint="join them with and: a < b and b < c."
                )
        return left

    def arithmetic(self) -> ast.Expr:
        left = self.term()
        while self.at("+", "-"):
            op = self.advance().text
            right = self.term()
            left = ast.Binary(op, left, right, cover(left.span, right.span))
        return left

    def term(self) -> ast.Expr:
        left = self.unary()
        while True:
            if self.at("*", "/"):
                op = self.advance().text
            elif self.starts_atom():
                op = "*"  # juxtaposition
            else:
                return left
            right = self.unary()
            left = ast.Binary(op, left, right, cover(left.span, right.span))

    def starts_atom(self) -> bool:
        tok = self.tok
        if tok.kind in ("NUMBER", "REF"):
            return True
        if tok.kind == "NAME":
            return tok.text not in ("and", "or", "not")
        return tok.kind == "OP" and tok.text == "("

    def unary(self) -> ast.Expr:
        if self.at("-", "+"):
            tok = self.advance()
            operand = self.nested(self.unary)
            return ast.Unary(tok.text, operand, cover(tok.span, operand.span))
        return self.power()

    def power(self) -> ast.Expr:
        base = self.atom()
        if self.at("^", "**"):
            self.advance()
            exponent = self.nested(self.unary)
            return ast.Binary("^", base, exponent, cover(base.span, exponent.span))
        return base

    def atom(self) -> ast.Expr:
        tok = self.tok
        if tok.kind == "NUMBER":
            self.advance()
            return ast.Num(tok.value, tok.span)  # type: ignore[arg-type]
        if tok.kind == "REF":
            return self.ref_or_reduction()
        if tok.kind == "NAME" and tok.text not in ("and", "or", "not"):
            return self.name_or_call()
        if self.at("("):
            self.advance()
            inner = self.nested(self.expression)
            self.expect(")", "close the parenthesis.")
            return inner
        found = "the end of the line" if tok.kind == "END" else f"'{tok.text}'"
        raise self.error(
            f"expected a value, found {found}",
            hint="a value is a tensor X_<...>, a number, a name, a function "
            "call or a parenthesised expression.",
        )

    def ref_or_reduction(self) -> ast.Expr:
        tok = self.advance()
        ref = self.reference(tok)
        if ref.name in ops.REDUCTIONS:
            if not self.at("("):
                raise self.error(
                    f"{ref.name}_<...> needs its argument",
                    tok.span,
                    f"write {ref.name}_<j>(expression).",
                )
            over = tuple(self.reduction_index(axis, ref) for axis in ref.axes)
            if not over:
                raise self.error(
                    f"{ref.name} needs an index to run over",
                    tok.span,
                    f"write {ref.name}_<j>(...).",
                )
            return self.call(ref.name, over, tok.span)
        if ref.name in FUNCTIONS and self.at("("):
            raise self.error(f"{ref.name} takes no subscript", tok.span, f"write {ref.name}(...).")
        if self.at("(") and not self.tok.spaced:  # `sofmax_<j>(`: asked only where it reads so
            typo = _suggest(ref.name, ops.REDUCTIONS)
            if typo:
                raise self.error(f"unknown function '{ref.name}'", tok.span, typo.strip())
        return ref

    def reduction_index(self, axis: ast.Axis, ref: ast.Ref) -> ast.IndexName:
        if not isinstance(axis, ast.IndexName):
            raise self.error(
                f"{ref.name} runs over plain indices, not groups or literals",
                axis.span,
                f"write {ref.name}_<j>(...) or {ref.name}_<jk>(...).",
            )
        return axis

    def name_or_call(self) -> ast.Expr:
        tok = self.advance()
        is_call = self.at("(") and (not self.tok.spaced or tok.text in FUNCTIONS)
        if not is_call:
            if tok.text == "inf":
                return ast.Inf(tok.span)
            return ast.Name(tok.text, tok.span)
        if tok.text in ops.REDUCTIONS and tok.text not in ops.FUNCTIONS:
            raise self.error(
                f"{tok.text} needs the index it runs over", tok.span, f"write {tok.text}_<j>(...)."
            )
        if tok.text not in FUNCTIONS:
            raise self.error(
                f"unknown function '{tok.text}'",
                tok.span,
                _suggest(tok.text, FUNCTIONS).strip()
                or f"known functions: {', '.join(sorted(FUNCTIONS))}. To "
                f"multiply, put a space: {tok.text} (...).",
            )
        return self.call(tok.text, (), tok.span)

    def call(self, func: str, over: tuple[ast.IndexName, ...], span: Span) -> ast.Call:
        self.expect("(")
        args = [self.nested(self.expression)]
        while self.at(","):
            self.advance()
            args.append(self.nested(self.expression))
        close = self.expect(")", f"close the call to {func}.")
        arity = (ops.REDUCTIONS if over else ops.FUNCTIONS)[func].arity
        if len(args) != arity:
            both = func in ops.REDUCTIONS and not over
            raise self.error(
                f"{func} takes {arity} argument{'s' if arity > 1 else ''}, not {len(args)}",
                cover(span, close.span),
                f"{func}_<j>(x) is the {func} over j; {func}(a, b) of two values." if both else "",
            )
        return ast.Call(func, over, tuple(args), cover(span, close.span))


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""
