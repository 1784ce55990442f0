"""Triton source for one attention core: a forward kernel (online softmax, or sigmoid weights,
keeping each row's logsumexp), and the backward as FlashAttention-2 computes it, the scores
recomputed from the kept row statistics: a kernel for each row's δ = dO·O (and the sink's
per-row share of its gradient), one for dK and dV (a program per block of keys and key head,
summing its group's query heads in order: no atomics), one for dQ.

Everything spec-dependent enters through `Core`: the score and its derivative in the product
Q·K (sympy's, of the parsed expressions), where the weights are zero, and the box test that
skips a block of keys (ir.boxes). Names are allocated here and nowhere else (`Names`);
numbers are re-printed from parsed values; no spec text reaches the source."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy.printing.str import StrPrinter

from ...ir.boxes import holds_on_box
from .core import COL, QK, ROW, Core, Load

# The box of one tile: its first and last query and key positions.
FIRST_ROW, LAST_ROW, FIRST_COL, LAST_COL = sympy.symbols(
    "first_row last_row first_col last_col", integer=True
)
# Every memory access a kernel makes, by name: `unmasked` drops the mask of those named (the
# twin of the guard-region test, which must catch it).
ACCESSES = (
    *("q", "k", "v", "o", "lse", "do", "delta", "dq", "dk", "dv", "load", "sink", "dsink"),
    *("dload", "dscalar"),
)
# The names the kernels' own template gives its values: never allocated.
_TEMPLATE_NAMES = frozenset(
    (
        "Q",
        "K",
        "V",
        "O",
        "LSE",
        "DO",
        "DELTA",
        "DQ",
        "DK",
        "DV",
        "SINK",
        "PART",
        "PART_M",
        "PART_L",
        "SPLITS",
        "CHUNK",
        "split",
        "part",
        "DSINK",
        "DLOADS",
        "DSCALARS",
        "PARAMS",
        *("sdl0", "sdl1", "sdl2", "sdl3", "sds0", "sds1", "sds2"),
        "b",
        "bh",
        "hq",
        "hk",
        "r",
        "start_m",
        "start_n",
        "offs_m",
        "offs_n",
        "offs_d",
        "offs_dv",
        "row",
        "col",
        "row_ok",
        "col_ok",
        "q",
        "k",
        "v",
        "o",
        "do",
        "qk",
        "s",
        "p",
        "dp",
        "ds",
        "dqk",
        "keep",
        "m_i",
        "l_i",
        "m_new",
        "m_use",
        "alpha",
        "acc",
        "lse",
        "delta",
        "dq",
        "dk",
        "dv",
        "l_safe",
        "sink_row",
        "dsink_row",
        "first_row",
        "last_row",
        "first_col",
        "last_col",
        "H",
        "HK",
        "N_Q",
        "N_K",
        "W_QK",
        "W_V",
        "N_REP",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_D",
        "BLOCK_DV",
        "ACC",
        "tl",
        "triton",
    )
)


class Names:
    """The one allocator of the names the printed source gives spec-dependent values: each
    key (a sympy expression, a load, a head index) gets a stem and a counter, never a name
    the kernels' own template uses."""

    def __init__(self) -> None:
        self.given: dict = {}
        self.counts: dict[str, int] = {}

    def __call__(self, key, stem: str) -> str:
        if key not in self.given:
            n = self.counts.get(stem, 0)
            self.counts[stem] = n + 1
            name = f"{stem}{n}"
            assert name not in _TEMPLATE_NAMES
            self.given[key] = name
        return self.given[key]


@dataclass(frozen=True)
class Kernels:
    """The printed source and what a launch passes besides the operands: each constant's
    argument name and its expression in the sizes and scalars, each load's name, each query
    head index's name (from the flat head number) with its size."""

    source: str
    core: Core
    constants: tuple[tuple[str, sympy.Expr], ...]
    loads: tuple[tuple[str, Load], ...]
    heads: tuple[tuple[str, sympy.Expr], ...]  # (name, size) innermost last
    graded: tuple[Load, ...]  # the loads whose gradient attention_dq writes when PARAMS
    scalars: tuple[sympy.Symbol, ...]  # the scalars the score reads: their row partials too

    @property
    def sink(self) -> bool:
        return self.core.sink is not None


class _Printer(StrPrinter):
    """sympy -> Triton expressions over tiles: names from `names`, functions as tl calls."""

    def __init__(self, names: dict) -> None:
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr):
        return self.names[expr]

    def _print_Integer(self, expr):
        return str(int(expr))

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Rational(self, expr):
        return f"({int(expr.p)} / {int(expr.q)})"

    def _print_NegativeInfinity(self, expr):
        return 'float("-inf")'

    def _print_Infinity(self, expr):
        return 'float("inf")'

    def _print_BooleanTrue(self, expr):
        return "True"

    def _print_BooleanFalse(self, expr):
        return "False"

    def _print_Pow(self, expr, rational=False):
        base, exp = expr.args
        if exp.is_Integer and 0 < abs(int(exp)) <= 4:
            product = " * ".join([f"({self._print(base)})"] * abs(int(exp)))
            return f"({product})" if exp > 0 else f"(1.0 / ({product}))"
        if exp == sympy.S.Half:
            return f"tl.sqrt({self._print(base)})"
        if base == sympy.E:
            return f"tl.exp({self._print(exp)})"
        if base.is_Number:  # a number's logarithm re-printed as a number
            return f"tl.exp(({self._print(exp)}) * {float(sympy.log(base))!r})"
        return f"tl.exp(({self._print(exp)}) * tl.log(({self._print(base)}) * 1.0))"

    def _print_exp(self, expr):
        return f"tl.exp({self._print(expr.args[0])})"

    def _print_log(self, expr):
        return f"tl.log({self._print(expr.args[0])})"

    def _print_tanh(self, expr):
        return f"(2.0 / (1.0 + tl.exp(-2.0 * ({self._print(expr.args[0])}))) - 1.0)"

    def _print_Abs(self, expr):
        return f"tl.abs({self._print(expr.args[0])})"

    def _print_floor(self, expr):
        return f"tl.floor(({self._print(expr.args[0])}) * 1.0)"

    def _print_Min(self, expr):
        return self._fold("tl.minimum", expr.args)

    def _print_Max(self, expr):
        return self._fold("tl.maximum", expr.args)

    def _fold(self, fn, args):
        text = self._print(args[0])
        for arg in args[1:]:
            text = f"{fn}({text}, {self._print(arg)})"
        return text

    def _print_Piecewise(self, expr):
        (value, cond), *rest = expr.args
        other = (
            self._print(rest[0][0])
            if len(rest) == 1 and rest[0][1] == sympy.true
            else (self._print(sympy.Piecewise(*rest)) if rest else "0.0")
        )
        return f"tl.where({self._print(cond)}, {self._print(value)}, {other})"

    def _print_Relational(self, expr):
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"

    def _print_And(self, expr):
        return "(" + " & ".join(self._print(a) for a in expr.args) + ")"

    def _print_Or(self, expr):
        return "(" + " | ".join(self._print(a) for a in expr.args) + ")"

    def _print_Not(self, expr):
        return f"(~{self._print(expr.args[0])})"


class _Generator:
    def __init__(self, core: Core, unmasked: frozenset[str]) -> None:
        self.core, self.unmasked = core, unmasked
        self.allocate = Names()
        tile = {QK: "qk", ROW: "row", COL: "col"}
        tile.update({s: s.name for s in (FIRST_ROW, LAST_ROW, FIRST_COL, LAST_COL)})
        self.heads = [(self.allocate(i, "head"), i) for i in core.heads]
        tile.update({i.symbol: name for name, i in self.heads})
        self.loads = [(self.allocate(x.symbol, "load"), x) for x in core.loads]
        tile.update({x.symbol: name for name, x in self.loads})
        self.tile = frozenset(tile)
        self.names = tile
        self.constants: dict[sympy.Expr, str] = {}
        self.printer = _Printer(self.names)
        # d score / d x for each learnable thing the score reads: float loads, scalars
        self.graded = [
            (x, d)
            for _, x in self.loads
            if x.tensor.dtype != "int" and (d := sympy.diff(core.score, x.symbol)) != 0
        ]
        spec_scalars = [s.symbol for s in core.spec.scalars]
        self.scalars = [
            (c, sympy.diff(core.score, c)) for c in spec_scalars if c in core.score.free_symbols
        ]

    def print(self, expr: sympy.Basic) -> str:
        return self.printer.doprint(self._constants(expr))

    def _constants(self, expr: sympy.Basic) -> sympy.Basic:
        """Each largest part free of the tile's symbols, not a number, made an argument."""
        if (
            expr.is_Number
            or expr in (sympy.true, sympy.false)
            or (expr.has(sympy.oo, -sympy.oo) and not expr.args)
        ):
            return expr
        if not (expr.free_symbols & self.tile) and expr.free_symbols:
            if expr not in self.constants:
                name = self.allocate(expr, "c")
                self.constants[expr] = name
                self.names[sympy.Symbol(name)] = name
            return sympy.Symbol(self.constants[expr])
        if not expr.args:
            return expr
        return expr.func(*(self._constants(a) for a in expr.args), evaluate=False)

    # -- pieces every kernel shares

    def mask(self, access: str, mask: str, other: str = "") -> str:
        """`, mask=...` (and the value a masked load reads), or nothing for a dropped mask."""
        if access in self.unmasked:
            return ""
        return f", mask={mask}" + (f", other={other}" if other else "")

    def head_lines(self) -> list[str]:
        """Each query head index from the flat head number hq, innermost last."""
        lines, rest = [], "hq"
        for name, index in reversed(self.heads):
            size = self.print(index.size)
            lines.append(f"{name} = ({rest}) % {size}")
            rest = f"({rest}) // {size}"
        return lines

    def tile_lines(self) -> list[str]:
        """The loads, the score s and `keep` of the tile at (row, col)."""
        lines = [
            f"{name} = tl.load({name}_ptr + b * {name}_s0 + hq * {name}_s1 + row * {name}_s2 "
            f"+ col * {name}_s3{self.mask('load', 'row_ok & col_ok', '0')})"
            for name, _ in self.loads
        ]
        lines.append(f"s = ({self.print(self.core.score)}).to(ACC)")
        keep = "row_ok & col_ok"
        if self.core.hidden != sympy.false:
            keep += f" & (~{self.print(self.core.hidden)})"
        lines.append(f"keep = {keep}")
        return lines

    def skip(self) -> str | None:
        """The test, on the tile's box, that every weight in it is zero, or None."""
        box = {ROW: (FIRST_ROW, LAST_ROW), COL: (FIRST_COL, LAST_COL)}
        known = frozenset(self.core.spec.sizes) | {s.symbol for s in self.core.spec.scalars}
        known |= {i.symbol for i in self.core.heads}
        dead = holds_on_box(self.core.hidden, box, known)
        return None if dead == sympy.false else self.print(dead)

    def guarded(self, body: list[str]) -> list[str]:
        skip = self.skip()
        return body if skip is None else [f"if not ({skip}):", *("    " + line for line in body)]

    def signature(self, *operands: str, constexprs: tuple[str, ...] = ()) -> str:
        parts = [*operands]
        if self.core.sink is not None:
            parts += ["SINK", "sink_s0", "sink_s1", "sink_s2"]
        for name, _ in self.loads:
            parts += [f"{name}_ptr", *(f"{name}_s{k}" for k in range(4))]
        parts += ["CONSTANTS_"]
        parts += ["H", "HK", "N_Q", "N_K", "W_QK", "W_V", "N_REP"]
        parts += [f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV")]
        parts += [f"{k}: tl.constexpr" for k in ("ACC", *constexprs)]
        return ", ".join(parts)

    # -- the kernels

    def source(self) -> str:
        kernels = [self.forward(), self.forward(split=True), self.dkdv(), self.dq()]
        if self.core.normaliser == "softmax":
            kernels.insert(1, self.preprocess())
        text = "\n\n".join(kernels)
        constants = ", ".join(self.constants.values())
        return "import triton.language as tl\n\n\n" + text.replace(
            "CONSTANTS_", constants or "NO_CONSTANTS"
        )

    def _kernel(self, name: str, operands: tuple[str, ...], body: list[str], constexprs=()) -> str:
        head = f"def {name}({self.signature(*operands, constexprs=constexprs)}):"
        return "\n".join([head, *("    " + line if line else "" for line in body)]) + "\n"

    def _rows(self, loads: tuple[str, ...]) -> list[str]:
        lines = [
            "offs_m = start_m + tl.arange(0, BLOCK_M)",
            "row = offs_m[:, None]",
            "row_ok = row < N_Q",
        ]
        for what in loads:
            lines.append(self._row_load(what))
        return lines

    def _row_load(self, what: str) -> str:
        if what == "q":
            ptr, width, limit, strides = "Q", "offs_d", "W_QK", "sq"
        else:
            ptr, width, limit, strides = {"do": "DO", "o": "O"}[what], "offs_dv", "W_V", f"s{what}"
        mask = self.mask(what, f"row_ok & ({width}[None, :] < {limit})", "0.0")
        return (
            f"{what} = tl.load({ptr} + b * {strides}0 + hq * {strides}1 + row * {strides}2 "
            f"+ {width}[None, :] * {strides}3{mask})"
        )

    def _vector(self, what: str, ptr: str, other: str) -> str:
        mask = self.mask(what, "offs_m < N_Q", other)
        return f"{what} = tl.load({ptr} + b * s{what}0 + hq * s{what}1 + offs_m * s{what}2{mask})"

    def _keys(self) -> list[str]:
        kmask = self.mask("k", "(offs_n[:, None] < N_K) & (offs_d[None, :] < W_QK)", "0.0")
        vmask = self.mask("v", "(offs_n[:, None] < N_K) & (offs_dv[None, :] < W_V)", "0.0")
        return [
            "offs_n = start_n + tl.arange(0, BLOCK_N)",
            "col = offs_n[None, :]",
            "col_ok = col < N_K",
            f"k = tl.load(K + b * sk0 + hk * sk1 + offs_n[:, None] * sk2 + offs_d[None, :] * sk3"
            f"{kmask})",
            f"v = tl.load(V + b * sv0 + hk * sv1 + offs_n[:, None] * sv2 + offs_dv[None, :] * sv3"
            f"{vmask})",
        ]

    def _setup(self, program: str) -> list[str]:
        lines = [
            f"{program} = tl.program_id(0) * {'BLOCK_M' if program == 'start_m' else 'BLOCK_N'}",
            "bh = tl.program_id(1)",
            "offs_d = tl.arange(0, BLOCK_D)",
            "offs_dv = tl.arange(0, BLOCK_DV)",
        ]
        if program == "start_m":
            lines += ["b = bh // H", "hq = bh % H", "hk = hq // N_REP", *self.head_lines()]
        else:
            lines += ["b = bh // HK", "hk = bh % HK"]
        return lines

    def _box_rows(self) -> list[str]:
        return ["first_row = start_m", "last_row = tl.minimum(start_m + BLOCK_M, N_Q) - 1"]

    def _box_cols(self) -> list[str]:
        return ["first_col = start_n", "last_col = tl.minimum(start_n + BLOCK_N, N_K) - 1"]

    def _weights(self, stats: bool) -> list[str]:
        """p from s: the kept statistics (backward), or sigmoid."""
        if self.core.normaliser == "sigmoid":
            return ["p = tl.where(keep, 1.0 / (1.0 + tl.exp(-s)), 0.0)"]
        assert stats
        return ["p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)"]

    def _gradient(self) -> list[str]:
        """ds, the gradient of the score, then dqk, that of the product Q·K."""
        if self.core.normaliser == "sigmoid":
            ds = "ds = dp * p * (1.0 - p)"
        else:
            ds = "ds = p * (dp - delta[:, None])"
        derivative = sympy.diff(self.core.score, QK)
        return [ds, f"dqk = tl.where(keep, ds * ({self.print(derivative)}), 0.0)"]

    def _dot(self, a: str, b: str) -> str:
        return f'tl.dot({a}, {b}, input_precision="ieee", out_dtype=ACC)'

    def forward(self, split: bool = False) -> str:
        """The forward kernel; `split`: split-K, each program the keys of one chunk, its
        unnormalised sums and row statistics stored for `launch.combine`."""
        softmax = self.core.normaliser == "softmax"
        body = [*self._setup("start_m"), *self._box_rows(), *self._rows(("q",))]
        body.append("acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC)")
        if split:
            body += ["split = tl.program_id(2)", "part = b * SPLITS + split"]
        if softmax and self.core.sink is not None:
            first = "split == 0" if split else "offs_m >= 0"  # the sink joins one chunk's sums
            body += [
                self._vector("sink", "SINK", "0.0").replace("ssink", "sink_s"),
                f'm_i = tl.where({first}, sink.to(ACC), float("-inf"))',
                f"l_i = tl.where({first}, tl.full([BLOCK_M], 1.0, ACC), 0.0)",
            ]
        elif softmax:
            body += [
                'm_i = tl.full([BLOCK_M], float("-inf"), ACC)',
                "l_i = tl.zeros([BLOCK_M], ACC)",
            ]
        inner = [*self._keys(), f"qk = {self._dot('q', 'tl.trans(k)')}", *self.tile_lines()]
        if softmax:
            inner += [
                's = tl.where(keep, s, float("-inf"))',
                "m_new = tl.maximum(m_i, tl.max(s, 1))",
                'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)',
                "alpha = tl.exp(m_i - m_use)",
                "p = tl.exp(s - m_use[:, None])",
                "l_i = l_i * alpha + tl.sum(p, 1)",
                f"acc = acc * alpha[:, None] + {self._dot('p.to(v.dtype)', 'v')}",
                "m_i = m_new",
            ]
        else:
            inner += [*self._weights(False), f"acc += {self._dot('p.to(v.dtype)', 'v')}"]
        keys = "split * CHUNK, tl.minimum(split * CHUNK + CHUNK, N_K)" if split else "0, N_K"
        body += [f"for start_n in range({keys}, BLOCK_N):"]
        body += ["    " + line for line in [*self._box_cols(), *self.guarded(inner)]]
        body += self._partial_stores() if split else self._stores(softmax)
        outputs = (["PART", "PART_M", "PART_L"] if split else ["O", "LSE"])[: 1 + 2 * softmax]
        operands = ["Q", "K", "V", *outputs]
        name = "attention_forward_split" if split else "attention_forward"
        extra = ("SPLITS", "CHUNK") if split else ()
        return self._kernel(name, (*self._operands(operands, softmax), *extra), body)

    def _stores(self, softmax: bool) -> list[str]:
        lines = []
        if softmax:
            lines += [
                "l_safe = tl.where(l_i == 0.0, 1.0, l_i)",
                "acc = acc / l_safe[:, None]",
                'lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.log(l_safe))',
                f"tl.store(LSE + b * slse0 + hq * slse1 + offs_m * slse2, lse"
                f"{self.mask('lse', 'offs_m < N_Q')})",
            ]
        omask = self.mask("o", "row_ok & (offs_dv[None, :] < W_V)")
        lines.append(
            "tl.store(O + b * so0 + hq * so1 + row * so2 + offs_dv[None, :] * so3, "
            f"acc.to(O.dtype.element_ty){omask})"
        )
        return lines

    def _partial_stores(self) -> list[str]:
        omask = self.mask("o", "row_ok & (offs_dv[None, :] < W_V)")
        lines = [
            "tl.store(PART + part * spart0 + hq * spart1 + row * spart2 + offs_dv[None, :] "
            f"* spart3, acc{omask})"
        ]
        if self.core.normaliser == "softmax":
            mask = self.mask("lse", "offs_m < N_Q")
            for what, value in (("PART_M", "m_i"), ("PART_L", "l_i")):
                low = what.lower().replace("_", "")
                lines.append(
                    f"tl.store({what} + part * s{low}0 + hq * s{low}1 + offs_m * s{low}2, "
                    f"{value}{mask})"
                )
        return lines

    def _operands(self, names: list[str], softmax: bool) -> tuple[str, ...]:
        strides = {
            "Q": "sq",
            "K": "sk",
            "V": "sv",
            "O": "so",
            "DO": "sdo",
            "DQ": "sdq",
            "DK": "sdk",
            "DV": "sdv",
            "LSE": "slse",
            "DELTA": "sdelta",
            "DSINK": "sdsink",
            "PART": "spart",
            "PART_M": "spartm",
            "PART_L": "spartl",
        }
        parts = []
        for name in names:
            rank = 3 if name in ("LSE", "DELTA", "DSINK", "PART_M", "PART_L") else 4
            parts += [name, *(f"{strides[name]}{k}" for k in range(rank))]
        return tuple(parts)

    def preprocess(self) -> str:
        body = [*self._setup("start_m"), *self._rows(("o", "do"))]
        body += [
            "delta = tl.sum(o.to(ACC) * do.to(ACC), 1)",
            f"tl.store(DELTA + b * sdelta0 + hq * sdelta1 + offs_m * sdelta2, delta"
            f"{self.mask('delta', 'offs_m < N_Q')})",
        ]
        names = ["O", "DO", "DELTA"]
        if self.core.sink is not None:
            names += ["LSE", "DSINK"]
            body += [
                self._vector("lse", "LSE", 'float("inf")'),
                self._vector("sink", "SINK", "0.0").replace("ssink", "sink_s"),
                "dsink_row = -tl.exp(sink.to(ACC) - lse) * delta",
                f"tl.store(DSINK + b * sdsink0 + hq * sdsink1 + offs_m * sdsink2, dsink_row"
                f"{self.mask('dsink', 'offs_m < N_Q')})",
            ]
        return self._kernel("attention_preprocess", self._operands(names, True), body)

    def _row_stats(self) -> list[str]:
        if self.core.normaliser != "softmax":
            return []
        return [self._vector("lse", "LSE", 'float("inf")'), self._vector("delta", "DELTA", "0.0")]

    def dkdv(self) -> str:
        softmax = self.core.normaliser == "softmax"
        body = [*self._setup("start_n"), *self._box_cols(), *self._keys()]
        body += [
            "dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)",
            "dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=ACC)",
            "for r in range(0, N_REP):",
            "    hq = hk * N_REP + r",
            *("    " + line for line in self.head_lines()),
            "    for start_m in range(0, N_Q, BLOCK_M):",
        ]
        inner = [
            *self._rows(("q", "do")),
            *self._row_stats(),
            f"qk = {self._dot('q', 'tl.trans(k)')}",
            *self.tile_lines(),
            *self._weights(True),
            f"dv += {self._dot('tl.trans(p.to(do.dtype))', 'do')}",
            f"dp = {self._dot('do', 'tl.trans(v)')}",
            *self._gradient(),
            f"dk += {self._dot('tl.trans(dqk.to(q.dtype))', 'q')}",
        ]
        body += ["        " + line for line in [*self._box_rows(), *self.guarded(inner)]]
        kmask = self.mask("dk", "(offs_n[:, None] < N_K) & (offs_d[None, :] < W_QK)")
        vmask = self.mask("dv", "(offs_n[:, None] < N_K) & (offs_dv[None, :] < W_V)")
        body += [
            "tl.store(DK + b * sdk0 + hk * sdk1 + offs_n[:, None] * sdk2 + offs_d[None, :] * sdk3, "
            f"dk.to(DK.dtype.element_ty){kmask})",
            "tl.store(DV + b * sdv0 + hk * sdv1 + offs_n[:, None] * sdv2 + offs_dv[None, :] * sdv3"
            f", dv.to(DV.dtype.element_ty){vmask})",
        ]
        names = ["Q", "K", "V", "DO", "DK", "DV", *(["LSE", "DELTA"] if softmax else [])]
        return self._kernel("attention_dkdv", self._operands(names, softmax), body)

    def dq(self) -> str:
        """dQ, and with PARAMS the gradients of what else the score reads: each float load's
        per element (DLOADS, [loads, B·H, N_Q, N_K], any strides), each scalar's per row
        (DSCALARS, [scalars, B·H, N_Q], summed after in order: deterministic)."""
        softmax = self.core.normaliser == "softmax"
        body = [*self._setup("start_m"), *self._box_rows(), *self._rows(("q", "do"))]
        body += [*self._row_stats(), "dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)"]
        body += self._params(self._scalar_starts())
        inner = [
            *self._keys(),
            f"qk = {self._dot('q', 'tl.trans(k)')}",
            *self.tile_lines(),
            *self._weights(True),
            f"dp = {self._dot('do', 'tl.trans(v)')}",
            *self._gradient(),
            f"dq += {self._dot('dqk.to(k.dtype)', 'k')}",
            *self._params(self._param_tile()),
        ]
        body += ["for start_n in range(0, N_K, BLOCK_N):"]
        body += ["    " + line for line in [*self._box_cols(), *self.guarded(inner)]]
        mask = self.mask("dq", "row_ok & (offs_d[None, :] < W_QK)")
        body.append(
            "tl.store(DQ + b * sdq0 + hq * sdq1 + row * sdq2 + offs_d[None, :] * sdq3, "
            f"dq.to(DQ.dtype.element_ty){mask})"
        )
        body += self._params(self._scalar_stores())
        names = ["Q", "K", "V", "DO", "DQ", *(["LSE", "DELTA"] if softmax else [])]
        params = ("DLOADS", *(f"sdl{k}" for k in range(4)), "DSCALARS", "sds0", "sds1", "sds2")
        operands = (*self._operands(names, softmax), *params)
        return self._kernel("attention_dq", operands, body, ("PARAMS",))

    @staticmethod
    def _params(lines: list[str]) -> list[str]:
        return ["if PARAMS:", *("    " + line for line in lines)] if lines else []

    def _scalar_name(self, c: sympy.Symbol) -> str:
        return self.allocate(("dscalar", c), "dscalar")

    def _scalar_starts(self) -> list[str]:
        return [f"{self._scalar_name(c)} = tl.zeros([BLOCK_M], dtype=ACC)" for c, _ in self.scalars]

    def _param_tile(self) -> list[str]:
        """Each learnable thing's share of this tile: ds times d score / d it, where kept."""
        lines = []
        for j, (_, d) in enumerate(self.graded):
            at = f"{j} * sdl0 + bh.to(tl.int64) * sdl1 + row * sdl2 + col * sdl3"
            mask = self.mask("dload", "row_ok & col_ok")
            lines.append(
                f"tl.store(DLOADS + {at}, tl.where(keep, ds * ({self.print(d)}), 0.0){mask})"
            )
        for c, d in self.scalars:
            name = self._scalar_name(c)
            lines.append(f"{name} += tl.sum(tl.where(keep, ds * ({self.print(d)}), 0.0), 1)")
        return lines

    def _scalar_stores(self) -> list[str]:
        mask = self.mask("dscalar", "offs_m < N_Q")
        return [
            f"tl.store(DSCALARS + {j} * sds0 + bh * sds1 + offs_m * sds2, "
            f"{self._scalar_name(c)}{mask})"
            for j, (c, _) in enumerate(self.scalars)
        ]


def generate(core: Core, unmasked: frozenset[str] = frozenset()) -> Kernels:
    """The kernels of `core` (`unmasked`: accesses printed without their mask, for the
    guard-region test's twin only)."""
    assert unmasked <= set(ACCESSES), unmasked - set(ACCESSES)
    gen = _Generator(core, unmasked)
    source = gen.source()
    constants = tuple((name, expr) for expr, name in gen.constants.items())
    heads = tuple((name, index.size) for name, index in gen.heads)
    graded = tuple(x for x, _ in gen.graded)
    scalars = tuple(c for c, _ in gen.scalars)
    return Kernels(source, core, constants, tuple(gen.loads), heads, graded, scalars)
