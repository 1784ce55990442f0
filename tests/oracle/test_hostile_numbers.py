"""Hostile numbers, round three: -inf from anywhere, integer inputs of any dtype, outputs a
caller writes into, NaN and infinite scalars, empty sizes. Each reproducer of
docs/robustness.md ("Numbers from anywhere") with its twin."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import indexattn
from indexattn.oracle.reference import evaluate
from indexattn.oracle.verify import sample_arguments, sample_sizes

# ----------------------------------------------------------------- -inf from anywhere

DEAD = """index τ, τ' : N
index a : d
input X_<τa>
param W_<ττ'>
param B_<ττ'>
scalar c = 0
S_<ττ'> = X_<τa> X_<τ'a> + {term}
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
output A
"""
TERMS = {
    "log of 0": ("log(W_<ττ'>)", {}, {}),
    "a scalar called with -inf": ("where(τ' >= τ, c, 0)", {"c": -math.inf}, {"c": -1e4}),
    "a param holding -inf": ("B_<ττ'>", {}, {}),
}


def dead_call(term: str, scalars: dict, hide: bool):
    """Row 0 hidden everywhere (when `hide`) by log 0, a -inf scalar or a -inf param."""
    spec = indexattn.compile_spec(DEAD.format(term=term), name="dead")
    torch.manual_seed(0)
    args = {"X": torch.randn(3, 2, dtype=torch.float64), "W": torch.rand(3, 3) + 0.5}
    args["W"] = args["W"].double()
    args["B"] = torch.zeros(3, 3, dtype=torch.float64)
    if hide:
        args["W"][0] = 0
        args["B"][0] = -math.inf
    return spec(**args, **scalars), evaluate(spec.ir, **args, **scalars)[0]


@pytest.mark.parametrize("name", TERMS)
def test_a_row_hidden_by_any_minus_inf_gives_zeros(name):
    term, scalars, _ = TERMS[name]
    got, want = dead_call(term, scalars, hide=True)
    assert torch.equal(got[0], torch.zeros(3, dtype=torch.float64)), got
    torch.testing.assert_close(got, want.expand_as(got), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", TERMS)
def test_twin_a_row_left_visible_has_weights(name):
    term, _, finite = TERMS[name]
    got, want = dead_call(term, finite, hide=False)
    torch.testing.assert_close(got.sum(-1), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(got, want.expand_as(got), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- integer inputs of any dtype

TABLE = """index τ : N
index p : V
index a : d
input P_<τ> : int
param T_<pa>
Y_<τa> = T_<[P_<τ>]a>
"""


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_any_integer_dtype_is_positions(dtype):
    """uint8 ids were read as a boolean mask (rows chosen by truthiness), int16 raised
    torch's IndexError."""
    spec = indexattn.compile_spec(TABLE, name="table")
    table = torch.randn(5, 2)
    ids = torch.tensor([3, 1, 0, 1])
    assert torch.equal(spec(P=ids.to(dtype), T=table), table[ids])


def test_twin_other_ids_read_other_rows():
    spec = indexattn.compile_spec(TABLE, name="table")
    table = torch.randn(5, 2)
    got = spec(P=torch.tensor([3, 1, 0, 1], dtype=torch.uint8), T=table)
    other = spec(P=torch.tensor([3, 1, 0, 2], dtype=torch.uint8), T=table)
    assert not torch.equal(got, other)


def test_bool_positions_are_refused_by_name():
    spec = indexattn.compile_spec(TABLE, name="table")
    with pytest.raises(indexattn.ShapeError, match=r"P is torch.bool.*P.long\(\)"):
        spec(P=torch.tensor([True, False, True]), T=torch.randn(5, 2))


COMPUTED = """index τ : N
index p : V
index a : d
input X_<τa>
input P_<τ> : int
param T_<pa>
D_<τ> = {position}
Y_<τa> = X_<τa> + T_<[D_<τ>]a>
"""


def computed_call(position: str, ids: list[int]):
    spec = indexattn.compile_spec(COMPUTED.format(position=position), name="computed")
    torch.manual_seed(0)
    table, x = torch.randn(8, 2), torch.randn(len(ids), 2)
    return spec(X=x, P=torch.tensor(ids), T=table), x, table


@pytest.mark.parametrize("big", [2**62 + 1, 2**61])
def test_positions_computed_in_int64_are_checked_for_overflow(big):
    """4 P with P = 2^62 + 1 wrapped round to 4 and read T[4]; P = 2^61 wrapped to -2^63 and
    raised torch's IndexError."""
    with pytest.raises(indexattn.ShapeError, match=r"T_<pa>, axis 0 \(p\).*outside int64"):
        computed_call("4 P_<τ>", [0, big])


def test_twin_positions_computed_in_range_read_the_table():
    got, x, table = computed_call("4 P_<τ>", [0, 1])
    assert torch.equal(got, x + table[[0, 4]])


@pytest.mark.parametrize("ids", [[1, 0], [1, 9], [1, 2**62 + 1]])
def test_computed_positions_out_of_range_are_a_shape_error(ids):
    """P - 1 at P = 0 read T[-1] (indexing wraps a negative position); P = 9: torch's raw
    IndexError."""
    with pytest.raises(indexattn.ShapeError, match=r"T_<pa>, axis 0 \(p\) \(size 8"):
        computed_call("P_<τ> - 1", ids)


def test_twin_computed_positions_at_the_ends_of_the_axis():
    got, x, table = computed_call("P_<τ> - 1", [1, 8])
    assert torch.equal(got, x + table[[0, 7]])


# ------------------------------------------------------------ outputs a caller writes into

MASK_OUT = """index τ, τ' : N
index a, b : d
input X_<τa>
M_<ττ'> = where(τ' > τ, -inf, 0)
Y_<τa> = softmax_<τ'>(X_<τb> X_<τ'b> + M_<ττ'>) X_<τ'a>
output Y, M
"""


def write_into(outputs) -> None:
    with torch.no_grad():
        for out in outputs if isinstance(outputs, tuple) else (outputs,):
            out.add_(1) if out.is_floating_point() else out.fill_(1)


def test_every_shipped_output_may_be_written_into(shipped):
    """A returned mask was the tensor kept per shape: `M += pad` changed every later call."""
    sizes = sample_sizes(shipped.ir)
    given = {k: v for k, v in sizes.items() if k in shipped.required}
    args = sample_arguments(shipped.ir, sizes, (2,))
    first = shipped(**args, **given)
    kept = tuple(t.clone() for t in first) if isinstance(first, tuple) else first.clone()
    write_into(first)
    again = shipped(**args, **given)
    for a, k in zip(*(x if isinstance(x, tuple) else (x,) for x in (again, kept)), strict=True):
        assert torch.equal(a, k), shipped.name


def test_a_returned_mask_is_a_copy_of_the_kept_one():
    spec = indexattn.compile_spec(MASK_OUT, name="mask_out")
    x = torch.randn(4, 3)
    _, mask = spec(X=x)
    mask += 1
    assert spec(X=x)[1][0, 0] == 0


def test_twin_writing_the_kept_mask_is_seen_by_the_next_call():
    """The test above would see an alias: the kept tensor itself, written, changes calls."""
    spec = indexattn.compile_spec(MASK_OUT, name="mask_out")
    x = torch.randn(4, 3)
    spec(X=x)
    (kept,) = spec._constants.values()
    kept[0].add_(1)  # the constants function's mask
    assert spec(X=x)[1][0, 0] == 1


# ------------------------------------------------------------ the oracle takes any scalar


@pytest.mark.parametrize("offset", [0, 0.25, -math.inf])
def test_the_oracle_reads_scalars_as_numbers(offset):
    """0, 0.25 and -inf were refused by the size solver ("must be a positive whole number")."""
    spec = indexattn.compile_spec(
        "index τ : N\ninput X_<τ>\nscalar s = 1\nY_<τ> = X_<τ> + s\n", name="shift"
    )
    x = torch.randn(4, dtype=torch.float64)
    (got,) = evaluate(spec.ir, X=x, s=offset)
    assert torch.equal(got, x + offset)
    assert torch.equal(spec(X=x, s=offset), got)


# ------------------------------------------------------------- NaN and infinite scalars


def window_call(w: float):
    spec = indexattn.compile_spec("specs/sliding_window.attn")
    sizes = sample_sizes(spec.ir)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes)
    return spec, args, {**given, "w": w}


def test_a_nan_scalar_is_refused_by_name():
    """w = nan hid every key (the mask is built from `w > τ - τ'`, the negation of what is
    written); read literally, `τ - τ' >= nan` is false and the causal keys stay."""
    spec, args, given = window_call(math.nan)
    with pytest.raises(indexattn.ShapeError, match="the scalar w is NaN"):
        spec(**args, **given)


def test_a_nan_scalar_held_by_a_module_is_refused_too():
    """The module's calls go past the spec's keyword call: the check is where each kind of
    call is prepared. The twin: the same module with a number runs."""
    spec = indexattn.compile_spec("sliding_window")
    module = spec.module(d_in=8, d_out=8, h=2, d_k=4, w=math.nan).eval()
    x = torch.randn(1, 5, 8)
    with pytest.raises(indexattn.ShapeError, match="the scalar w is NaN"):
        module(x)
    module.scalars["w"] = 2.0
    assert module(x).shape == (1, 5, 8)


@pytest.mark.parametrize("w", [math.inf, -math.inf, 2.0])
def test_twin_infinite_scalars_follow_the_literal_reading(w):
    spec, args, given = window_call(w)
    torch.testing.assert_close(spec(**args, **given), evaluate(spec.ir, **args, **given)[0])


# ------------------------------------------------------------------ RetNet's decay

RETNET = """index μ : h
index τ, τ' : N
index a : d
input X_<μτa>
param γ_<μ>
D_<μττ'> = where(τ' > τ, 0, γ_<μ>^({exponent}))
Y_<μτa> = D_<μττ'> X_<μτ'a>
"""


def decay(exponent: str):
    spec = indexattn.compile_spec(RETNET.format(exponent=exponent), name="retnet")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    gamma = (torch.rand(3, dtype=torch.float64) * 0.5 + 0.5).requires_grad_()
    got = spec(X=x, gamma=gamma)
    (grad,) = torch.autograd.grad(got.sum(), gamma)
    return got, grad, x, gamma


def test_retnet_decay_compiles_as_written():
    """`γ^(τ - τ')` raised sympy's "cannot determine truth value of Relational"."""
    got, grad, x, gamma = decay("τ - τ'")
    torch.testing.assert_close(got, _decayed(x, gamma.detach()))
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_twin_the_decay_the_other_way_differs():
    got, *_ = decay("τ' - τ")
    assert not torch.allclose(got, _decayed(*decay("τ - τ'")[2:]))


def _decayed(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """Y_τ = Σ_{τ' ≤ τ} γ^(τ - τ') X_τ', by plain loops."""
    gamma = gamma.detach()
    out = torch.zeros_like(x)
    for t in range(x.shape[-2]):
        for s in range(t + 1):
            out[..., t, :] += gamma[:, None] ** (t - s) * x[..., s, :]
    return out


RETENTION = """index μ : h
index τ, τ' : N
index a : d
input X_<μτa>
param λ_<μ>
D_<μττ'> = where(τ' > τ, 0, exp((τ - τ') λ_<μ>))
Y_<μτa> = D_<μττ'> X_<μτ'a>
"""


def literal_decay_gradient(n: int, dtype) -> torch.Tensor:
    """The gradient of λ (decays -0.2, -0.05) of Σ Y for Y = D X, the decay written straight
    into torch, both branches evaluated: finite in float64 up to (τ - τ') λ = 709."""
    torch.manual_seed(0)
    x = torch.randn(2, n, 3, dtype=torch.float64).to(dtype)
    lam = torch.tensor([-0.2, -0.05], dtype=dtype, requires_grad=True)
    tau = torch.arange(n, dtype=dtype)
    distance = tau[:, None] - tau[None, :]
    decay = torch.where(distance < 0, 0, torch.exp(distance * lam[:, None, None]))
    (grad,) = torch.autograd.grad(torch.einsum("mts,msa->mta", decay, x).sum(), lam)
    return grad


def test_retention_decay_has_a_finite_gradient_where_the_unused_branch_overflows():
    """exp((τ - τ') λ) above the diagonal overflows in float32 from N ≈ 450 (λ = -0.2): where's
    zero gradient times exp's inf was NaN. Each exp now reads 0 where where does not choose it;
    the gradient is the literal one, computed in float64 where nothing overflows."""
    spec = indexattn.compile_spec(RETENTION, name="retention")
    torch.manual_seed(0)
    x = torch.randn(2, 512, 3, dtype=torch.float64).float()
    lam = torch.tensor([-0.2, -0.05], requires_grad=True)
    (grad,) = torch.autograd.grad(spec(X=x, lambda_=lam).sum(), lam)
    want = literal_decay_gradient(512, torch.float64)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad.double(), want, rtol=1e-4, atol=0)


def test_twin_the_literal_torch_reading_in_float32_gives_nan():
    """The same decay written straight into torch in float32: the NaN the generated code
    avoids."""
    assert literal_decay_gradient(512, torch.float32)[0].isnan()


POSITION_TERMS = ["τ", "τ'", "(τ - τ')", "(τ' - τ)", "N", "2", "(τ + 1)", "-1", "0.5"]
COMPARISONS = [">", ">=", "<", "==", "!="]


@st.composite
def position_powers(draw):
    """Powers, exponents and comparisons of positions, in a spec that compiles or not."""
    term = lambda: draw(st.sampled_from(POSITION_TERMS))  # noqa: E731
    base = draw(st.sampled_from(["γ_<μ>", "2", "0.5", term()]))
    op = draw(st.sampled_from(["+", "-", "*", "/", "^"]))
    exponent = f"(τ - τ') {op} {term()}" if draw(st.booleans()) else f"{term()} {op} (τ' - τ)"
    condition = (
        f"{draw(st.sampled_from(['τ', 'τ', term()]))} {draw(st.sampled_from(COMPARISONS))} {term()}"
    )
    value = draw(st.sampled_from([f"{base}^({exponent})", f"({exponent})^{term()}"]))
    value = value if "γ" in value else f"γ_<μ> {value}"
    return RETNET.replace("where(τ' > τ, 0, γ_<μ>^({exponent}))", f"where({condition}, 0, {value})")


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(position_powers())
def test_powers_of_positions_compile_or_raise_spec_errors(text):
    try:
        spec = indexattn.compile_spec(text, name="powers")
    except indexattn.SpecError:
        return
    x = torch.randn(2, 3, 4, 2, dtype=torch.float64)
    gamma = torch.rand(3, dtype=torch.float64) * 0.5 + 0.5
    got = spec(X=x, gamma=gamma)
    want = evaluate(spec.ir, X=x, gamma=gamma)[0]
    torch.testing.assert_close(got, want, equal_nan=True)


# ------------------------------------------------------------------------ empty sizes


def decode(cached: int, batch: tuple = (2,)):
    spec = indexattn.compile_spec("specs/kv_decode.attn")
    sizes = {**sample_sizes(spec.ir), "N_c": cached}
    args = sample_arguments(spec.ir, sizes, batch)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    return spec, args, given


def test_an_empty_cache_is_the_first_decode_step():
    """N_c = 0 was "expected size N_c, got 0"."""
    spec, args, given = decode(0)
    got = spec(**args, **given)
    for g, w in zip(got, evaluate(spec.ir, **args, **given), strict=True):
        torch.testing.assert_close(g, w)
    assert got[1].shape[-2] == args["X"].shape[-2]  # the keys are the new tokens' alone


def test_twin_one_cached_token_changes_the_output():
    spec, args, given = decode(1)
    empty = dict(args, Kc=args["Kc"][..., :0, :], Vc=args["Vc"][..., :0, :])
    assert not torch.allclose(spec(**args, **given)[0], spec(**empty, **given)[0])


def test_an_empty_batch_gives_empty_outputs():
    spec, args, given = decode(2, batch=(0,))
    assert all(out.shape[0] == 0 for out in spec(**args, **given))


def test_a_size_of_0_a_spec_cannot_compute_with_is_a_shape_error():
    """An empty sequence under a causal softmax: a ShapeError naming N, not torch's error."""
    spec = indexattn.compile_spec("specs/models/gpt2.attn")
    sizes = {**sample_sizes(spec.ir), "N": 0}
    given = {k: v for k, v in sizes.items() if k in spec.required}
    with pytest.raises(indexattn.ShapeError, match="the size N is 0"):
        spec(**sample_arguments(spec.ir, sizes, (2,)), **given)
