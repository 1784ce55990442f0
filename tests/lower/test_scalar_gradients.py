"""Every scalar may be a tensor and gets its gradient (issue 51): a function of a scalar in a
table (`exp(s)`), a root of one in the scores (Gemma 2's query_pre_attn_scalar), YaRN's
`log(max(factor, 1))`, a score scale handed to SDPA. Each gradient against finite
differences in float64, with its twin; and the printer never passes a scalar through
`math` or a builtin that reads it as a number, on every shipped spec."""

import ast
import math
from pathlib import Path

import pytest
import sympy
import torch

import indexattn
import indexattn.catalog
from indexattn.derive.rules import field_slope
from indexattn.oracle.verify import sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "specs").glob("**/*.attn"))

TABLE = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τ'a>
input V_<τ'a>
scalar s = 0.3
S_<ττ'> = Q_<τa> K_<τ'a> - exp(s) abs(τ - τ')
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""


def gradient(spec, name: str, value: float, backward: str = "autograd", inputs=None, **fixed):
    """(the scalar's gradient of a random projection of the outputs, or None; the same by
    central finite differences), at `value`, the other scalars at their defaults or `fixed`,
    `inputs` (a function of the drawn arguments) changing some of them."""
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    args |= inputs(args) if inputs else {}
    given = {k: v for k, v in sizes.items() if k in spec.required} | fixed
    for tensor in args.values():
        tensor.requires_grad_(tensor.is_floating_point())

    def loss(x):
        outs = spec(**args, **given, **{name: x}, backward=backward)
        outs = outs if isinstance(outs, tuple) else (outs,)
        weights = torch.Generator().manual_seed(1)
        return sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum() for o in outs)

    scalar = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    loss(scalar).backward()
    step = 1e-6 * max(1.0, abs(value))
    with torch.no_grad():
        fd = (loss(value + step) - loss(value - step)).item() / (2 * step)
    return (None if scalar.grad is None else scalar.grad.item()), fd


def shipped(name: str):
    return indexattn.compile_spec(indexattn.catalog.shipped(name))


CASES = {  # failed before: s.grad None (math.exp), dropped (math.sqrt), -1.1e-4 for 0.555
    "a function of a scalar in a table": (lambda: indexattn.compile_spec(TABLE), "s", 0.3),
    "query_pre_attn_scalar": (lambda: shipped("softcap_window"), "query_pre_attn_scalar", 256.0),
    "YaRN's factor": (lambda: shipped("models/llama3_yarn"), "factor", 4.0),
}


@pytest.mark.parametrize("case", CASES)
def test_a_tensor_scalar_gets_its_gradient(case):
    make, name, value = CASES[case]
    got, want = gradient(make(), name, value)
    assert got is not None and abs(want) > 1e-6
    assert got == pytest.approx(want, rel=1e-5)


def test_twin_a_scalar_read_only_by_a_window_gets_none():
    got, want = gradient(shipped("sliding_window"), "w", 2.5)
    assert got in (None, 0.0) and want == 0.0


# ------------------------------------------------- the derived backward of every kind of scalar

ROTARY_Q = """index τ, τ' : N
index j : d
input Q_<τj>
input K_<τ'j>
input V_<τ'j>
scalar offset = 0
θ_<τj> = (offset + τ) 10000^(-j / d)
S_<ττ'> = Q_<τj> cos(θ_<τj>) K_<τ'j>
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
O_<τj> = A_<ττ'> V_<τ'j>
output O
"""

DERIVED = {  # failed before: Double and Long; unknown function 'Heaviside'; Subs(Derivative(
    # ceil(...))); `index τ is not on the left` in doffset
    "rope_theta with integer positions": (lambda: shipped("layers/llama"), "rope_theta", 1e4),
    "YaRN's factor through max": (lambda: shipped("models/llama3_yarn"), "factor", 4.0),
    "YaRN's beta_fast through ceil": (lambda: shipped("models/llama3_yarn"), "beta_fast", 32.0),
    "a rotary offset on the queries": (lambda: indexattn.compile_spec(ROTARY_Q), "offset", 3.0),
}


@pytest.mark.parametrize("case", DERIVED)
def test_the_derived_backward_gets_every_scalar_gradient(case):
    make, name, value = DERIVED[case]
    spec = make()
    got, want = gradient(spec, name, value, "derived")
    assert got == pytest.approx(want, rel=1e-5, abs=1e-9)
    assert got == pytest.approx(gradient(spec, name, value)[0], rel=1e-6, abs=1e-12)


def test_twin_positions_at_zero_make_the_rotary_base_flat():
    """At position 0 every angle is 0 whatever the base: the base's gradient vanishes."""
    spec, zero = shipped("layers/llama"), lambda args: {"P": torch.zeros_like(args["P"])}
    assert gradient(spec, "rope_theta", 1e4, "derived", zero) == pytest.approx((0, 0), abs=1e-12)


def test_a_slope_left_unevaluated_refuses_by_the_scalars_name(monkeypatch):
    """No function of the language leaves sympy's derivative unevaluated today (the rules
    above close every one), so the refusal is reached by making the rule give up: the error
    names the scalar as the user wrote it and says what to pass instead, never backward text."""
    from indexattn.derive import rules

    monkeypatch.setattr(rules, "field_slope", lambda expr, symbol: None)
    spec = indexattn.compile_spec(TABLE.replace("s = 0.3", "s = 0.35"), name="table_refused")
    with pytest.raises(indexattn.SpecError) as caught:
        gradient(spec, "s", 0.35, "derived")
    text = str(caught.value)
    assert "no derived backward for the scalar s" in text and "pass s as a float" in text
    assert "Derivative" not in text and "Heaviside" not in text


def test_twin_the_same_scalar_with_its_rule_is_derived():
    spec = indexattn.compile_spec(TABLE.replace("s = 0.3", "s = 0.36"), name="table_ruled")
    got, want = gradient(spec, "s", 0.35, "derived")
    assert got == pytest.approx(want, rel=1e-5) and abs(want) > 1e-3


@pytest.mark.parametrize(
    "expr, at, want",  # max's kink takes one half, as torch.maximum's gradient on a tie
    [
        ("log(Max(1, x))", 2.0, 0.5),
        ("log(Max(1, x))", 0.5, 0.0),
        ("Max(1, x)", 1.0, 0.5),
        ("ceiling(3*x) + x", 0.7, 1.0),
        ("Abs(x)", -2.0, -1.0),
        ("Mod(7, x)", 3.0, -2.0),
    ],
)
def test_piecewise_functions_have_slopes(expr, at, want):
    x = sympy.Symbol("x", real=True)
    slope = field_slope(sympy.sympify(expr, locals={"x": x}), x)
    assert float(slope.subs(x, at)) == pytest.approx(want)


def test_integer_positions_summed_against_floats():
    """Failed before: `expected m1 and m2 to have the same dtype` (P summed against X)."""
    spec = indexattn.compile_spec(
        "index τ : N\nindex i : d\ninput P_<τ> : int\ninput X_<τi>\nY_<i> = P_<τ> X_<τi>\n"
    )
    p, x = torch.tensor([7, 3, -5]), torch.randn(3, 2, dtype=torch.float64)
    before = spec(P=p, X=x)
    torch.testing.assert_close(before, p.double() @ x)
    p[1] = 4  # one position one further: the sum gains that row of X
    torch.testing.assert_close(spec(P=p, X=x) - before, x[1])


SCALES = ["gqa_core", "gqa_causal_core", "gqa_unmasked_core"]


@pytest.mark.parametrize("name", SCALES)
@pytest.mark.parametrize("backward", ["autograd", "derived"])
def test_a_tensor_score_scale_scales_the_scores(name, backward):
    """Failed before: `scaled_dot_product_attention(): argument 'scale' must be float`."""
    got, want = gradient(shipped(name), "scaling", 0.3, backward)
    assert got == pytest.approx(want, rel=1e-5) and abs(want) > 1e-3


def test_twin_a_float_score_scale_is_the_kernels_own():
    spec = shipped("gqa_core")
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    a = spec(**args, **given, scaling=0.3)
    b = spec(**args, **given, scaling=torch.tensor(0.3, dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert (spec(**args, **given, scaling=0.4) - a).abs().max() > 1e-3


# ---------------------------------------------------- no scalar read through math or builtins

NUMBERS = {"float", "int", "round", "max", "min", "pow"}  # builtins that read a tensor's value


def numbers_of_scalars(spec) -> list[str]:
    """The calls of the generated module that read a scalar as a number (`math.*`, float, max,
    ...), outside a box's test (which reads values only: tables_emit.box_call)."""
    names = {s.ascii for s in spec.ir.scalars}
    found = []
    for function in ast.parse(spec.source).body:
        if not isinstance(function, ast.FunctionDef) or function.name.endswith("_box"):
            continue
        for node in ast.walk(function):
            f = node.func if isinstance(node, ast.Call) else None
            of_math = isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "math"
            if not (of_math or (isinstance(f, ast.Name) and f.id in NUMBERS)):
                continue
            read = {n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)}
            if read & names:
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT / "specs")) for p in SHIPPED])
def test_no_scalar_is_read_as_a_number(path):
    assert numbers_of_scalars(indexattn.compile_spec(path)) == []


def test_twin_the_check_finds_a_scalar_read_by_math():
    spec = indexattn.compile_spec(TABLE, name="t")
    planted = type("Planted", (), {"ir": spec.ir, "source": "def f(s):\n    return math.exp(s)\n"})
    assert numbers_of_scalars(planted) == ["math.exp(s)"]
    assert math.isfinite(gradient(spec, "s", 0.3)[1])


# ------------------------------------- every float scalar of every shipped spec, against FD


def smooth(spec, name: str, value: float) -> tuple[float | None, float] | None:
    """(autograd's gradient, finite differences) at `value`, or None where the outputs jump
    there (a window's edge, a switch such as `attention_factor > 0`): differences at two steps
    that disagree."""
    got, fd = gradient(spec, name, value)
    step = 1e-6 * max(1.0, abs(value))
    again = gradient(spec, name, value + step / 4)[1]
    return None if abs(fd - again) > 1e-4 * max(1.0, abs(fd)) else (got, fd)


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT / "specs")) for p in SHIPPED])
def test_every_float_scalar_gets_its_gradient(path, record_property):
    """Each scalar of the spec, at its default (plus a quarter where that is whole, off a
    window's edge), a tensor that requires grad: autograd's gradient is the finite
    differences', or the scalar is a dropout rate and is refused by its name (failed before:
    torch's `dropout(): argument 'p' must be float, not Tensor`). The counts are recorded
    (docs/robustness.md)."""
    spec = indexattn.compile_spec(path)
    counts = {"checked": 0, "jumps": 0, "refused": 0}
    for name, default in spec.plain.scalars:
        value = float(default) + (0.25 if float(default) == int(float(default)) else 0.0)
        try:
            found = smooth(spec, name, value)
        except TypeError as error:
            assert f"the scalar {name} is a dropout probability" in str(error)
            counts["refused"] += 1
            continue
        if found is None:
            counts["jumps"] += 1
            continue
        got, fd = found
        assert (got or 0.0) == pytest.approx(fd, rel=1e-4, abs=1e-6), name
        counts["checked"] += 1
    record_property("scalars", counts)


def test_a_float_dropout_rate_runs_where_a_tensor_one_is_refused():
    spec = shipped("gpt2")
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    torch.testing.assert_close(spec(**args, **given, p=0.1), spec(**args, **given, p=0.0))
    with pytest.raises(TypeError, match="the scalar p is a dropout probability"):
        spec(**args, **given, p=torch.tensor(0.1))
