"""sympy -> Python for the generated code: index-free expressions with `math`, expressions
over index variables with `torch`; floats re-printed from their values; every module a
printed expression uses is recorded, so imports follow from what was printed. Whole-number
arithmetic stays whole: floor(d_r / 2) prints as `d_r // 2`, ceiling as `(n + d - 1) // d`;
powers, `and`, `or`, `not` and `mod` of tensors print as operators, so that a line holds one
call at most (docs/rendering.md)."""

from __future__ import annotations

import math

import sympy
from sympy.core.function import Application
from sympy.logic.boolalg import BooleanFunction
from sympy.printing.pycode import PythonCodePrinter
from sympy.printing.pytorch import TorchPrinter


def float_text(expr) -> str:
    """A float re-printed from its value; one beyond float64 is an infinity, as in float64."""
    value = float(expr)
    return repr(value) if math.isfinite(value) else ("-" if value < 0 else "") + "math.inf"


def number_text(value: float) -> str:
    """A scalar's value as written: `128` for a whole number, `0.1` otherwise."""
    return str(int(value)) if float(value).is_integer() else float_text(value)


def inverse_root(expr: sympy.Expr) -> sympy.Expr | None:
    """r when `expr` is 1/sqrt(r) for a product r of positive whole numbers and whole powers
    of sizes: sympy's `sqrt(2)/(2*sqrt(d_r))` is `1/sqrt(2*d_r)`; None otherwise."""
    roots = [a for a in expr.args if a.is_Pow and a.exp.is_Rational and a.exp.q == 2]
    if not roots or expr.could_extract_minus_sign():
        return None
    r = 1 / expr**2
    factors = r.args if r.is_Mul else (r,)
    whole = all(
        f.is_Symbol or (f.is_Integer and f > 0) or (f.is_Pow and f.exp.is_Integer and f.exp > 0)
        for f in factors
    )
    return r if whole else None


def reads_scalar(expr: sympy.Basic) -> bool:
    """Whether `expr` reads a scalar (a real symbol; sizes are integers): a value a call may
    give as a tensor that requires its gradient."""
    return any(s.is_real and not s.is_integer for s in expr.free_symbols)


class ScalarPrinter(PythonCodePrinter):
    """Index-free sympy -> Python: `1/math.sqrt(d_k)`; floats re-printed exactly. A function
    of a scalar, which a call may give as a tensor, is never `math`'s or a builtin (which
    would drop its gradient): torch's, of it as a tensor (`torch.exp(torch.as_tensor(s,
    ...))`), and its root a power (`s ** 0.5`), unless `numbers` (a box's test, which reads
    values only)."""

    def __init__(self, numbers: bool = False) -> None:
        super().__init__({"fully_qualified_modules": True})
        self.numbers = numbers

    def _print(self, expr, **kwargs) -> str:
        function = isinstance(expr, Application) and not isinstance(expr, BooleanFunction)
        if function and not isinstance(expr, sympy.Mod) and self._tensor(expr):
            self.module_imports["torch"].add("as_tensor")
            return ScalarTensors(self, expr)._print(expr)
        return super()._print(expr, **kwargs)

    def _tensor(self, expr) -> bool:
        return not self.numbers and reads_scalar(expr)

    def _print_Pow(self, expr, rational=False) -> str:
        if self._tensor(expr.base) and expr.exp in (sympy.S.Half, -sympy.S.Half):
            return f"{self.parenthesize(expr.base, 60)} ** {float(expr.exp)}"
        return super()._print_Pow(expr, rational)

    def _print_Float(self, expr) -> str:
        text = float_text(expr)
        if "math" in text:
            self.module_imports["math"].add("inf")
        return text

    def _print_Mul(self, expr) -> str:
        root = inverse_root(expr)
        if root is None:
            return super()._print_Mul(expr)
        if self._tensor(root):
            return f"1/{self.parenthesize(root, 60)} ** 0.5"
        return f"1/{self._module_format('math.sqrt')}({self._print(root)})"

    def _print_log(self, expr) -> str:
        """log of a size (an integer symbol) as a tensor: `math.log(N)` would fix a dynamic N
        under torch.export. Of numbers and scalars alone (real symbols: Python floats, never
        dynamic) it is math.log, so that
        floor or ceil of it stays a number (YaRN's `floor(d_r log(L / (2 π β)) / log(b))`)."""
        if not _size_log(expr):  # numbers and scalars (values.py)
            return f"{self._module_format('math.log')}({self._print(expr.args[0])})"
        self.module_imports["torch"].add("log")
        return f"torch.scalar_tensor({self._print(expr.args[0])}, dtype=torch.float64).log()"

    def doprint(self, expr, assign_to=None) -> str:
        code = super().doprint(expr, assign_to)
        return unwrapped(code) if isinstance(expr, sympy.floor | sympy.ceiling) else code

    def _print_floor(self, expr) -> str:
        return whole_division(self, expr) or self._rounded(expr, "floor")

    def _print_ceiling(self, expr) -> str:
        return whole_division(self, expr) or self._rounded(expr, "ceil")

    def _rounded(self, expr, name: str) -> str:
        """floor or ceil; of a log of a size (a tensor) with torch's, since Python's would read
        the tensor's value, which torch.compile and torch.export cannot trace (Bloom's
        `2^floor(log(h) / log(2))`)."""
        if any(_size_log(log) for log in expr.atoms(sympy.log)):
            return f"torch.{name}({self._print(expr.args[0])})"
        return f"{self._module_format('math.' + name)}({self._print(expr.args[0])})"

    def _print_Mod(self, expr) -> str:
        # sympy writes -2*Mod(r, 3) as -2*r % 3, which Python reads as (-2*r) % 3; and
        # Mod(τ + 2σ, 5) as τ + 2*σ % 5, which Python reads as τ + (2*σ % 5)
        return f"({wrap(self._print(expr.args[0]))} % {wrap(self._print(expr.args[1]))})"

    def _print_Infinity(self, expr) -> str:
        self.module_imports["math"].add("inf")
        return "math.inf"

    def _print_NegativeInfinity(self, expr) -> str:
        self.module_imports["math"].add("inf")
        return "-math.inf"


def _size_log(log: sympy.log) -> bool:
    """Whether a log reads a size (an integer symbol, printed as a tensor), not only numbers
    and scalars (real symbols)."""
    return any(s.is_integer for s in log.free_symbols)


class GridPrinter(TorchPrinter):
    """sympy over index variables -> torch; index-free parts go to a ScalarPrinter."""

    def __init__(self, indices: frozenset[sympy.Symbol], scalar: ScalarPrinter) -> None:
        super().__init__()
        self.indices, self.scalar = indices, scalar

    def _print(self, expr, **kwargs) -> str:
        if isinstance(expr, sympy.Basic) and not expr.free_symbols & self.indices:
            return self.scalar._print(expr)  # parenthesised by the caller, as sympy's own
        return super()._print(expr, **kwargs)

    def _print_Relational(self, expr) -> str:
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"

    def calls(self, expr: sympy.Basic) -> list[sympy.Basic]:
        """The parts of `expr` over index variables that print as a call (a function, not an
        operator: `and`, `mod`, a power, a whole division), innermost first."""
        found = []
        for node in sympy.postorder_traversal(expr):
            function = isinstance(node, Application) and not isinstance(node, BooleanFunction)
            if not function or isinstance(node, sympy.Mod) or not node.free_symbols & self.indices:
                continue
            if isinstance(node, sympy.floor | sympy.ceiling) and whole_division(self, node):
                continue
            found.append(node)
        return list(dict.fromkeys(found))

    def _print_Float(self, expr) -> str:
        return self.scalar._print_Float(expr)

    def _print_Mod(self, expr) -> str:
        return f"({wrap(self._print(expr.args[0]))} % {wrap(self._print(expr.args[1]))})"

    def _print_Pow(self, expr) -> str:
        return self._hprint_Pow(expr, sqrt="torch.sqrt")

    def _print_And(self, expr) -> str:
        return " & ".join(wrap(self._print(a)) for a in expr.args)

    def _print_Or(self, expr) -> str:
        return " | ".join(wrap(self._print(a)) for a in expr.args)

    def _print_Not(self, expr) -> str:
        return "~" + wrap(self._print(expr.args[0]))

    def _print_floor(self, expr) -> str:
        return whole_division(self, expr) or self._print_Function(expr)

    def _print_ceiling(self, expr) -> str:
        return whole_division(self, expr) or self._print_Function(expr)

    def _print_Min(self, expr) -> str:
        return self._extreme(expr, "minimum", "max")

    def _print_Max(self, expr) -> str:
        return self._extreme(expr, "maximum", "min")

    def _extreme(self, expr, pairwise: str, bound: str) -> str:
        """torch.minimum takes two tensors; a number bounds the result with clamp."""
        tensors = [a for a in expr.args if a.free_symbols & self.indices]
        code = self._print(tensors[0])
        for other in tensors[1:]:
            code = f"torch.{pairwise}({code}, {self._print(other)})"
        for number in (a for a in expr.args if not a.free_symbols & self.indices):
            code = f"torch.clamp({code}, {bound}={self._print(number)})"
        return code


class ScalarTensors(GridPrinter):
    """A function of scalars as torch's, each scalar made a tensor (a tensor stays itself,
    its gradient kept; a number becomes a float64 one)."""

    def __init__(self, scalar: ScalarPrinter, expr: sympy.Basic) -> None:
        scalars = {s for s in expr.free_symbols if reads_scalar(s)}
        super().__init__(frozenset(scalars), scalar)

    def _print_Symbol(self, expr) -> str:
        return f"torch.as_tensor({self.scalar._print(expr)}, dtype=torch.float64)"


def whole_division(printer, expr) -> str | None:
    """floor(n / d) as `(n // d)`, ceiling(n / d) as `((n + d - 1) // d)`, where n and d are
    whole and d is positive: exact where `math.floor` of a float quotient loses digits past
    2^53. Parenthesised, so that no neighbour binds into it (`-(d_r // 2)`); None otherwise."""
    numerator, denominator = expr.args[0].as_numer_denom()
    if not (numerator.is_integer and denominator.is_integer and denominator.is_positive):
        return None
    if denominator == 1:
        return None
    top = numerator + denominator - 1 if isinstance(expr, sympy.ceiling) else numerator
    return f"({wrap(printer._print(top))} // {wrap(printer._print(denominator))})"


def unwrapped(code: str) -> str:
    """Code without the parentheses around all of it: `(d_m <= d_k)` -> `d_m <= d_k`."""
    if code.startswith("(") and _closing(code, 0) == len(code) - 1:
        return code[1:-1]
    return code


def wrap(code: str) -> str:
    """Parenthesised unless it is a name, a number, a call or already parenthesised."""
    if _plain(code):
        return code
    head = _call_head(code)
    if head and _closing(code, head - 1) == len(code) - 1:
        return code
    return f"({code})"


def _plain(code: str) -> bool:
    body = code[1:] if code.startswith("-") else code
    return bool(body) and all(c.isalnum() or c in "_." for c in body)


def _call_head(code: str) -> int:
    """The position just after the `(` of a leading `name(`, or 0."""
    k = 0
    while k < len(code) and (code[k].isalnum() or code[k] in "_."):
        k += 1
    return k + 1 if k < len(code) and code[k] == "(" else 0


def _closing(code: str, start: int) -> int:
    """The position of the parenthesis that closes the one at `start`."""
    depth = 0
    for k in range(start, len(code)):
        depth += {"(": 1, ")": -1}.get(code[k], 0)
        if depth == 0:
            return k
    return -1


def joined(blocks: str, dim: int) -> str:
    """The list `blocks` of tensors as one along `dim`: the one block itself, uncopied."""
    return f"{blocks}[0] if len({blocks}) == 1 else torch.cat({blocks}, dim={dim})"


def tuple_text(items) -> str:
    """A tuple's text: `(a,)` for one item."""
    items = list(items)
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
