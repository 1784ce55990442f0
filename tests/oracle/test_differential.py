"""A differential fuzzer: random attention specs (masks, softmax or an elementwise score
function, every function of ops.py, integer inputs read as positions, computed positions,
concatenation, prefix sums, batch axes) compiled and compared with the literal interpreter in
float64 (values and gradients) and in bfloat16 against float64. Bounded to a few seconds in the
suite; a longer run: docs/robustness.md."""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import indexattn
from indexattn import ops
from indexattn.oracle.reference import evaluate
from indexattn.oracle.verify import TOLERANCE, _error, sample_arguments, sample_sizes

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

EXAMPLES = int(os.environ.get("INDEXATTN_FUZZ_EXAMPLES", "15"))
# every function of the operator table, each written where its value is defined
WRAPS = {
    "exp": "exp({} / 4)",
    "log": "log({}^2 + 1)",
    "log1p": "log1p({}^2)",
    "sqrt": "sqrt({}^2 + 1)",
    "rsqrt": "rsqrt({}^2 + 1)",
    "min": "min({}, 0.5)",
    "max": "max({}, -0.5)",
    "mod": "mod({}, 3)",
    "clamp": "clamp({}, -1, 1)",
    "where": "where({0} > 0, {0}, 0)",
    "dropout": "dropout({}, 0.1)",
    **{
        name: f"{name}({{}})"
        for name, op in ops.FUNCTIONS.items()
        if op.arity == 1 and name not in ("exp", "log", "log1p", "sqrt", "rsqrt")
    },
}
STEPS = frozenset({"floor", "ceil", "round", "sign", "mod"})  # jumps: no bfloat16 comparison
MASKS = {
    "none": "",
    "causal": " + where({k} > τ, -inf, 0)",
    "window": " + where({k} > τ or τ - {k} >= w, -inf, 0)",
}


def test_every_function_of_the_table_is_drawn():
    assert set(WRAPS) == set(ops.FUNCTIONS)


@st.composite
def specs(draw):
    """A random spec, and the functions it applies."""
    fn = draw(st.sampled_from(sorted(WRAPS)))
    score = draw(st.sampled_from(["softmax", "sigmoid", "tanh"]))
    mask = draw(st.sampled_from(sorted(MASKS)))
    cache, table, relative, prefix = (draw(st.booleans()) for _ in range(4))
    key = "σ" if cache else "τ'"
    lines = ["index μ : h", "index τ, τ' : N", "index a : d", "scalar w = 2"]
    lines += ["index c : N_c", "index σ : N_c + N", "input Kc_<μca>"] if cache else []
    lines += ["index p : V", "input P_<τ> : int", "param T_<pa>"] if table else []
    lines += ["index r : 2 N - 1", "param E_<μr>"] if relative and not cache else []
    lines += ["input X_<μτa>", "input Y_<μτa>"]
    gather = " + T_<[P_<τ>]a>" if table else ""
    lines.append(f"F_<μτa> = {WRAPS[fn].format('X_<μτa>')}{gather}")
    if cache:
        lines.append("K_<μσa> = concat_<σ>(Kc_<μca>, Y_<μτa>)")
    else:
        lines.append("K_<μτ'a> = Y_<μτ'a>")
    bias = " + E_<μ[τ' - τ + N - 1]>" if relative and not cache else ""
    hide = MASKS[mask].format(k=key)
    if cache and mask != "none":
        hide = " + where(σ > N_c + τ, -inf, 0)"
    lines.append(f"S_<μτ{key}> = F_<μτa> K_<μ{key}a> / sqrt(d){hide}{bias}")
    if score == "softmax":
        lines.append(f"A_<μτ{key}> = softmax_<{key}>(S_<μτ{key}>)")
    else:  # a score function: hidden keys give 0 (sigmoid of -inf), or are kept out by where
        lines.append(f"A_<μτ{key}> = where(S_<μτ{key}> == -inf, 0, {score}(S_<μτ{key}>))")
    lines.append(f"O_<μτa> = A_<μτ{key}> K_<μ{key}a>")
    lines.append("C_<μτa> = cumsum_<τ>(O_<μτa>)" if prefix else "C_<μτa> = O_<μτa>")
    lines.append("output C, A")
    return "\n".join(lines) + "\n", fn


def call(spec, dtype, seed):
    sizes = sample_sizes(spec.ir, seed)
    if "V" in sizes:  # positions read from P (0 or 1) need a table of at least two rows
        sizes["V"] = max(sizes["V"], 2)
    args = sample_arguments(spec.ir, sizes, (2,), dtype, seed)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    return args, given


def grads(outputs, args):
    floats = [t for t in args.values() if t.requires_grad]
    weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape) for o in outputs]
    total = sum((o.nan_to_num(0, 0, 0) * w).sum() for o, w in zip(outputs, weights))
    return torch.autograd.grad(total, floats, allow_unused=True)


@settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=list(HealthCheck))
@given(specs(), st.integers(0, 1))
def test_random_specs_equal_the_literal_reading(drawn, seed):
    text, fn = drawn
    spec = indexattn.compile_spec(text, name="fuzz")
    args, given = call(spec, torch.float64, seed)
    for t in args.values():
        t.requires_grad_(t.is_floating_point())
    got, want = spec(**args, **given), evaluate(spec.ir, **args, **given)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, equal_nan=True, msg=text)
    for g, w in zip(grads(got, args), grads(want, args), strict=True):
        if g is not None or w is not None:
            torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-7, equal_nan=True, msg=text)
    if fn in STEPS:
        return
    low, _ = call(spec, torch.bfloat16, seed)
    high = {k: v.double() if v.is_floating_point() else v for k, v in low.items()}
    for g, w in zip(spec(**low, **given), evaluate(spec.ir, **high, **given), strict=True):
        assert g.dtype == torch.bfloat16
        assert _error(g, w) <= TOLERANCE[torch.bfloat16], text


@pytest.mark.parametrize("fn", ["tanh", "floor"])
def test_twin_a_changed_function_is_seen(fn):
    """The fuzzer's comparison sees one function changed in the generated code."""
    text = (
        "index μ : h\nindex τ, τ' : N\nindex a : d\ninput X_<μτa>\ninput Y_<μτa>\n"
        f"F_<μτa> = {fn}(X_<μτa>)\nS_<μττ'> = F_<μτa> Y_<μτ'a>\n"
        "A_<μττ'> = softmax_<τ'>(S_<μττ'>)\nO_<μτa> = A_<μττ'> Y_<μτ'a>\n"
    )
    spec = indexattn.compile_spec(text, name="fuzz")
    other = indexattn.compile_spec(text.replace(f"{fn}(X", "sigmoid(X"), name="fuzz")
    args, given = call(spec, torch.float64, 0)
    assert not torch.allclose(other(**args, **given), evaluate(spec.ir, **args, **given)[0])


EXPM1 = (
    "index τ, τ' : N\nindex a : d\ninput X_<τa>\ninput Y_<τa>\n"
    "S_<ττ'> = {fn}(X_<τa>) Y_<τ'a> / sqrt(d)\nO_<τa> = softmax_<τ'>(S_<ττ'>) Y_<τ'a>\n"
)


@pytest.mark.parametrize("fn", ["expm1", "exp"])
def test_a_function_that_keeps_its_result_is_not_written_over(fn):
    """The fuzzer's find: expm1 keeps its result for the backward, and the scale after it
    wrote over it in place (autograd's "modified by an inplace operation")."""
    spec = indexattn.compile_spec(EXPM1.format(fn=fn), name="fuzz")
    args, given = call(spec, torch.float64, 0)
    for t in args.values():
        t.requires_grad_(True)
    got, want = grads((spec(**args, **given),), args), grads(evaluate(spec.ir, **args), args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_twin_expm1_and_exp_differ_in_their_gradients():
    args = None
    found = []
    for fn in ("expm1", "exp"):
        spec = indexattn.compile_spec(EXPM1.format(fn=fn), name="fuzz")
        args = args or call(spec, torch.float64, 0)[0]
        for t in args.values():
            t.requires_grad_(True)
        found.append(grads((spec(**args),), args)[1])
    assert not torch.allclose(*found)
