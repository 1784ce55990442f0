"""The operator table: every function and operator of the spec language, once, with what each
stage needs of it. The parser reads names and arities, the checker the sympy form, the code
generator the torch template, the LaTeX printer its template and binding strength, the
counts its FLOPs. The literal interpreter keeps its own torch code (it is the oracle); a test
checks that it covers every entry.

Templates take the arguments in order as `{0}`, `{1}`, ...; a reduction's torch template
takes `{x}` and `{dim}`. A torch template names only `torch`, `F` and `math`, which the code
generator reserves and imports as each template declares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

ATOM = 10  # binds tighter than any operator: never bracketed


@dataclass(frozen=True)
class Op:
    """One function or operator: how each stage reads, computes, prints and counts it."""

    name: str  # as written in a spec: "exp", "softmax_<j>", "+", "<"
    kind: str  # function, reduction, arithmetic, comparison, logic
    arity: int
    torch: str  # the code template
    latex: str  # the LaTeX template
    flops: int  # per element of the result; a reduction: per element reduced
    sympy: Callable | None = None  # the tensor-free form; None: never folded into a Field
    imports: frozenset[str] = frozenset({"torch"})  # names the torch template uses
    level: int = ATOM  # binding strength as written: higher binds tighter
    tensors: bool = False  # the torch template needs tensors: numbers are made tensors first
    integers: bool = False  # maps whole numbers to whole numbers (floor, mod, max, where, ...)
    keeps: bool = False  # a reduction whose index stays free: softmax_<j>, cumsum_<j>, concat_<j>
    scan: bool = False  # a running reduction: entry j reads the entries up to j (cumsum_<j>)
    # how its parts over blocks of its index (one block a rank) merge into the whole
    # (parallel/sequence.py): LSE, SUM, EXTREMUM or PREFIX; None where they do not
    merge: str | None = None
    # the in-place form, for functions whose backward reads their result, not their argument
    inplace: str = ""

    @property
    def partial(self) -> bool:
        """Whether it may make inf or NaN of finite arguments (log 0, 1/0, a root of -1)."""
        return self.name in PARTIAL

    @property
    def condition(self) -> bool:
        """Whether its value is true/false rather than a number."""
        return self.kind in ("comparison", "logic")


def _sigmoid(x):
    return 1 / (1 + sympy.exp(-x))


def _gelu(x):
    return x * (1 + sympy.erf(x / sympy.sqrt(2))) / 2


def _gelu_tanh(x):
    """GELU's tanh approximation (Gemma, GPT-2's `gelu_new`), as torch's approximate="tanh"."""
    return x * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + GELU_TANH_CUBIC * x**3))) / 2


GELU_TANH_CUBIC = sympy.Rational(44715, 1000000)  # the approximation's coefficient of x³


def _rsqrt(x):
    return 1 / sympy.sqrt(x)


def _elu(x):
    return sympy.Piecewise((x, x > 0), (sympy.exp(x) - 1, True))


def _softplus(x):
    return sympy.log(1 + sympy.exp(x))


def _logsigmoid(x):
    return -sympy.log(1 + sympy.exp(-x))


# Named numbers: a spec may write them wherever a number goes (`2 π τ`, `scalar tp = 2 π`);
# a declaration of the same name wins. Printed by sympy's printers (`math.pi`, `\pi`).
CONSTANTS: dict[str, sympy.Expr] = {"π": sympy.pi, "pi": sympy.pi}


INTEGER_FUNCTIONS = frozenset({"floor", "ceil", "round", "sign", "abs", "min", "max", "mod"})


# Functions whose backward reads their result (tanh: 1 - y², exp: y, expm1: y + 1, ...): they
# may overwrite their argument, as torch's `tanh_` does under autograd, and nothing may overwrite
# their result (tests/oracle/test_ops.py checks the set against what torch's autograd saves).
INPLACE = frozenset({"exp", "expm1", "tanh", "sigmoid", "sqrt", "rsqrt", "relu"})

# Functions and operators that may make inf or NaN of finite numbers (exp's overflow aside).
PARTIAL = frozenset({"log", "log1p", "sqrt", "rsqrt", "mod", "/", "^", "pow"})


def _function(name: str, torch: str, latex: str, form, imports=("torch",), flops: int = 1) -> Op:
    integers = name in INTEGER_FUNCTIONS
    inplace = "{0}." + name + "_()" if name in INPLACE else ""
    return Op(
        name,
        "function",
        1,
        torch,
        latex,
        flops,
        form,
        frozenset(imports),
        integers=integers,
        inplace=inplace,
    )


def _binary(name: str, torch: str, latex: str, form, tensors: bool = True) -> Op:
    return Op(name, "function", 2, torch, latex, 1, form, tensors=tensors, integers=True)


def _named(word: str) -> str:
    return r"\operatorname{{" + word + r"}}\left({0}\right)"


FUNCTIONS: dict[str, Op] = {
    op.name: op
    for op in (
        _function("exp", "torch.exp({0})", r"\exp\left({0}\right)", sympy.exp),
        _function("log", "torch.log({0})", r"\log\left({0}\right)", sympy.log),
        _function("sqrt", "torch.sqrt({0})", r"\sqrt{{{0}}}", sympy.sqrt),
        _function("tanh", "torch.tanh({0})", r"\tanh\left({0}\right)", sympy.tanh),
        _function("sigmoid", "torch.sigmoid({0})", _named("sigmoid"), _sigmoid),
        _function("relu", "torch.relu({0})", _named("ReLU"), lambda x: sympy.Max(x, 0)),
        _function("gelu", "F.gelu({0})", _named("GELU"), _gelu, ("F",)),
        _function(
            "gelu_tanh",
            'F.gelu({0}, approximate="tanh")',
            r"\operatorname{{GELU}}_{{\tanh}}\left({0}\right)",
            _gelu_tanh,
            ("F",),
        ),
        _function("silu", "F.silu({0})", _named("SiLU"), lambda x: x * _sigmoid(x), ("F",)),
        _function("abs", "torch.abs({0})", r"\left|{0}\right|", sympy.Abs),
        _function("cos", "torch.cos({0})", r"\cos\left({0}\right)", sympy.cos),
        _function("sin", "torch.sin({0})", r"\sin\left({0}\right)", sympy.sin),
        _function("floor", "torch.floor({0})", r"\left\lfloor {0} \right\rfloor", sympy.floor),
        _function("ceil", "torch.ceil({0})", r"\left\lceil {0} \right\rceil", sympy.ceiling),
        # half to even, as torch.round; sympy has no such rounding, so it is never folded
        _function("round", "torch.round({0})", _named("round"), None),
        _function("sign", "torch.sign({0})", _named("sgn"), sympy.sign),
        _function("rsqrt", "torch.rsqrt({0})", r"\frac{{1}}{{\sqrt{{{0}}}}}", _rsqrt),
        # contiguous first: under aot_autograd, elu's backward of a strided view (the
        # heads of a projection) is traced with other strides than its kernel makes, and a
        # dynamic-shape backward fails ("view size is not compatible"); free when contiguous
        _function("elu", "F.elu({0}.contiguous())", _named("ELU"), _elu, ("F",)),
        _function("softplus", "F.softplus({0})", _named("softplus"), _softplus, ("F",)),
        # log σ(x): the forget gates of the Forgetting Transformer, stable for large |x|
        _function(
            "logsigmoid",
            "F.logsigmoid({0})",
            r"\log\operatorname{{sigmoid}}\left({0}\right)",
            _logsigmoid,
            ("F",),
        ),
        _function(
            "log1p", "torch.log1p({0})", r"\log\left(1 + {0}\right)", lambda x: sympy.log(1 + x)
        ),
        _function(
            "expm1", "torch.expm1({0})", r"\left(e^{{{0}}} - 1\right)", lambda x: sympy.exp(x) - 1
        ),
        _function("erf", "torch.erf({0})", _named("erf"), sympy.erf),
        _binary("min", "torch.minimum({0}, {1})", r"\min\left({0}, {1}\right)", sympy.Min),
        _binary("max", "torch.maximum({0}, {1})", r"\max\left({0}, {1}\right)", sympy.Max),
        _binary(
            "mod", "torch.remainder({0}, {1})", r"\left({0} \bmod {1}\right)", sympy.Mod, False
        ),
        Op(
            "clamp",
            "function",
            3,
            "torch.clamp({0}, {1}, {2})",
            r"\operatorname{{clamp}}\left({0}, {1}, {2}\right)",
            1,
            lambda x, lo, hi: sympy.Min(sympy.Max(x, lo), hi),
            tensors=True,
            integers=True,
        ),
        Op(
            "where",
            "function",
            3,
            "torch.where({0}, {1}, {2})",
            r"\begin{{cases}} {1} & \text{{if }} {0} \\ {2} & \text{{otherwise}} \end{{cases}}",
            1,
            lambda c, a, b: sympy.Piecewise((a, c), (b, True)),
            integers=True,
        ),
        Op(
            "dropout",
            "function",
            2,
            "F.dropout({0}, {1}, training=training)",
            _named("dropout").replace("{0}", "{0}, {1}"),
            0,  # the identity in eval mode, where FLOPs are counted
            None,
            frozenset({"F"}),
        ),
    )
}


# How the parts of a reduction over blocks of its index merge into the whole (a record's
# `merge`; parallel/sequence.py and the ring read them).
LSE = "log-sum-exp"  # a running maximum and a sum of exponentials, rescaled when merged
SUM = "sum"  # partial sums added
EXTREMUM = "max/min"  # partial maxima (minima) compared
PREFIX = "prefix"  # an exclusive scan: the state carried in from the ranks before


def _reduction(
    name: str,
    torch: str,
    latex: str,
    flops: int = 1,
    arity: int = 1,
    keeps: bool = False,
    scan: bool = False,
    merge: str | None = None,
) -> Op:
    integers = name in ("sum", "max", "min", "cumsum", "cumprod", "concat", "rank")
    return Op(
        name,
        "reduction",
        arity,
        torch,
        latex,
        flops,
        integers=integers,
        keeps=keeps,
        scan=scan,
        merge=merge,
    )


REDUCTIONS: dict[str, Op] = {
    op.name: op
    for op in (
        # softmax keeps its index; its code is the planner's choice (safe or not, fused or not)
        _reduction(
            "softmax",
            "torch.softmax({x}, dim={dim})",
            r"\operatorname{softmax}",
            5,
            keeps=True,
            merge=LSE,
        ),
        # the running sum along an index, which stays free: causal linear attention
        _reduction(
            "cumsum",
            "torch.cumsum({x}, dim={dim})",
            r"\operatorname{cumsum}",
            keeps=True,
            scan=True,
            merge=PREFIX,
        ),
        # the running product along an index (a product of gates up to each position); its
        # parts over blocks of the index do not merge: no ring or Ulysses split reads it
        _reduction(
            "cumprod",
            "torch.cumprod({x}, dim={dim})",
            r"\operatorname{cumprod}",
            keeps=True,
            scan=True,
        ),
        # the parts one after another along an index: a KV cache and the new keys
        _reduction("concat", "torch.cat([{x}], dim={dim})", r"\operatorname{concat}", 0, 2, True),
        # each entry's place in descending order along an index (0: the largest; ties by
        # position), which stays free: NSA's top-n blocks are where(rank_<β>(P) < n, ...).
        # The template is the order; the printer takes its argsort again, the places.
        _reduction(
            "rank",
            "{x}.argsort(dim={dim}, descending=True, stable=True)",
            r"\operatorname{rank}",
            keeps=True,
        ),
        _reduction("sum", "{x}.sum(dim={dim})", r"\sum", merge=SUM),
        _reduction("max", "{x}.amax(dim={dim})", r"\max", merge=EXTREMUM),
        _reduction("min", "{x}.amin(dim={dim})", r"\min", merge=EXTREMUM),
        _reduction("mean", "{x}.mean(dim={dim})", r"\operatorname{mean}", merge=SUM),
        _reduction(
            "logsumexp",
            "torch.logsumexp({x}, dim={dim})",
            r"\operatorname{logsumexp}",
            4,
            merge=LSE,
        ),
    )
}


def _operator(name, kind, level, torch, latex, form, arity=2) -> Op:
    return Op(name, kind, arity, torch, latex, 1, form, frozenset(), level, integers=True)


OPERATORS: dict[str, Op] = {
    op.name: op
    for op in (
        _operator("or", "logic", 1, "{0} | {1}", r"{0} \lor {1}", sympy.Or),
        _operator("and", "logic", 2, "{0} & {1}", r"{0} \land {1}", sympy.And),
        _operator("not", "logic", 3, "~{0}", r"\lnot {0}", sympy.Not, arity=1),
        _operator("<", "comparison", 4, "{0} < {1}", "{0} < {1}", sympy.Lt),
        _operator("<=", "comparison", 4, "{0} <= {1}", r"{0} \leq {1}", sympy.Le),
        _operator(">", "comparison", 4, "{0} > {1}", "{0} > {1}", sympy.Gt),
        _operator(">=", "comparison", 4, "{0} >= {1}", r"{0} \geq {1}", sympy.Ge),
        _operator("==", "comparison", 4, "{0} == {1}", "{0} = {1}", sympy.Eq),
        _operator("!=", "comparison", 4, "{0} != {1}", r"{0} \neq {1}", sympy.Ne),
        _operator("+", "arithmetic", 5, "{0} + {1}", "{0} + {1}", sympy.Add),
        _operator("-", "arithmetic", 5, "{0} - {1}", "{0} - {1}", None),
        _operator("*", "arithmetic", 6, "{0} * {1}", "{0} {1}", sympy.Mul),
        _operator("/", "arithmetic", 6, "{0} / {1}", r"\frac{{{0}}}{{{1}}}", None),
        _operator("neg", "arithmetic", 7, "-{0}", "-{0}", None, arity=1),
        _operator("^", "arithmetic", 8, "{0} ** {1}", "{0}^{{{1}}}", None),
    )
}
# `^` between tensors is kept as the function pow (a Field folds it exactly instead).
POW = Op("pow", "arithmetic", 2, "{0} ** {1}", "{0}^{{{1}}}", 1, None, frozenset(), 8)

# What a spec may call by name: min and max are both, the reductions min_<j>(x) and max_<j>(x)
# and the elementwise min(a, b) and max(a, b).
CALLABLE = frozenset(FUNCTIONS) | frozenset(REDUCTIONS)
COMPARISONS = tuple(name for name, op in OPERATORS.items() if op.kind == "comparison")


# The casts the planner adds around a tensor computed in a precision of its own (`A_<ττ'> :
# float32 = ...`, lower/program/numerics.py): never written in a spec, no FLOPs. `dtype` is the
# call's.
CASTS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("float32", "cast", 1, "{0}.to(torch.promote_types(dtype, torch.float32))", "{0}", 0),
        Op("float64", "cast", 1, "{0}.double()", "{0}", 0),
        Op("narrow", "cast", 1, "{0}.to(dtype)", "{0}", 0),
    )
}


def lookup(name: str) -> Op:
    """The entry of a function, reduction or operator the IR names (`pow` included)."""
    if name == "pow":
        return POW
    return FUNCTIONS.get(name) or CASTS.get(name) or OPERATORS[name]


# -- derivatives

# The partial derivative of each elementwise function with respect to each argument, in the
# language's own notation: the arguments are x, y, z in order; "0": no gradient flows (integer
# rounding is flat almost everywhere). indexattn/derive reads these to write a spec's
# backward; a test compares each with sympy's derivative of the `sympy` form above.
# Reductions, `where` (the chosen branch gets the cotangent) and `dropout` (times its mask,
# drawn by the forward and handed to the backward) are derived structurally there.
DERIVATIVES: dict[str, tuple[str, ...]] = {
    "exp": ("exp(x)",),
    "log": ("1 / x",),
    "sqrt": ("1 / (2 sqrt(x))",),
    "rsqrt": ("-rsqrt(x)^3 / 2",),
    "tanh": ("1 - tanh(x)^2",),
    "sigmoid": ("sigmoid(x) (1 - sigmoid(x))",),
    "relu": ("where(x > 0, 1, 0)",),
    # gelu(x) = x Φ(x), Φ(x) = (1 + erf(x / √2)) / 2, Φ'(x) = exp(-x² / 2) / √(2π)
    "gelu": ("(1 + erf(x / sqrt(2))) / 2 + x exp(-x^2 / 2) / sqrt(2 π)",),
    # gelu_tanh(x) = x (1 + tanh(u)) / 2, u = √(2/π) (x + 0.044715 x³)
    "gelu_tanh": (
        "(1 + tanh(sqrt(2 / π) (x + 0.044715 x^3))) / 2 + x (1 - tanh(sqrt(2 / π) (x + 0.044715"
        " x^3))^2) sqrt(2 / π) (1 + 0.134145 x^2) / 2",
    ),
    "silu": ("sigmoid(x) (1 + x (1 - sigmoid(x)))",),
    "elu": ("where(x > 0, 1, exp(x))",),
    "softplus": ("sigmoid(x)",),
    "logsigmoid": ("sigmoid(-x)",),
    "log1p": ("1 / (1 + x)",),
    "expm1": ("exp(x)",),
    "erf": ("2 exp(-x^2) / sqrt(π)",),
    "abs": ("sign(x)",),
    "sign": ("0",),
    "cos": ("-sin(x)",),
    "sin": ("cos(x)",),
    "floor": ("0",),
    "ceil": ("0",),
    "round": ("0",),
    # a tie split evenly between the arguments, as torch.minimum's autograd and the literal
    # interpreter (the mean of the two where they are equal)
    "min": ("where(x < y, 1, where(x == y, 0.5, 0))", "where(x < y, 0, where(x == y, 0.5, 1))"),
    "max": ("where(x > y, 1, where(x == y, 0.5, 0))", "where(x > y, 0, where(x == y, 0.5, 1))"),
    "mod": ("1", "-floor(x / y)"),
    "clamp": (
        "where(x < y or x > z, 0, 1)",
        "where(x < y, 1, 0)",
        "where(x < y, 0, where(x > z, 1, 0))",
    ),
    "pow": ("y x^(y - 1)", "x^y log(x)"),
}
