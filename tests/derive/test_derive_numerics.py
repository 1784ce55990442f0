"""The derived backward under the forward's numerics policy: ties of max and min split as
autograd splits them, hidden branches that overflow give finite gradients, the reverse
running sum without cancellation in bfloat16, tensor scalars, dropout's draws, precision
declarations. Each test is a defect found in the derived backward, with a twin that shows
the test can see it."""

from pathlib import Path

import torch

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def grads(spec, args: dict, mode: str, cotangent=None, **given) -> dict:
    """The gradients of Σ output · cotangent (ones by default) under one backward."""
    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    out = spec(**leaves, **given, backward=mode) if mode else spec(**leaves, **given)
    weight = torch.ones_like(out) if cotangent is None else cotangent.to(out.dtype)
    (out.float() * weight.float()).sum().backward()
    return {k: v.grad for k, v in leaves.items() if v.grad is not None}


def oracle_grads(spec, args: dict, cotangent=None, **given) -> dict:
    """The literal interpreter's gradients of the same loss."""
    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    out = reference.evaluate(spec.ir, **leaves, **given)[0]
    weight = torch.ones_like(out) if cotangent is None else cotangent.to(out.dtype)
    (out * weight).sum().backward()
    return {k: v.grad for k, v in leaves.items() if v.grad is not None}


# -- 1. ties of max_<j> and min_<j>

TIES = "index i : n\nindex j : m\ninput x_<ij>\ny_<i> = {}_<j>(x_<ij>)\noutput y\n"


def tied(fn: str) -> torch.Tensor:
    top = 2.0 if fn == "max" else -2.0
    return torch.tensor([[1.0, top, top], [3.0, 3.0, 3.0], [top, 0.5, -0.5]], dtype=torch.float64)


def test_tied_entries_of_max_and_min_split_the_gradient_as_autograd():
    for fn in ("max", "min"):
        spec = indexattn.compile_spec(TIES.format(fn), name=f"ties_{fn}")
        args = {"x": tied(fn)}
        derived = grads(spec, args, "derived")["x"]
        assert torch.equal(derived, grads(spec, args, "autograd")["x"])
        assert torch.equal(derived, oracle_grads(spec, args)["x"])
        assert derived[0, 1] == 0.5 and derived[1, 0] == 1 / 3


def test_twin_a_broken_tie_gives_one_entry_the_whole_gradient():
    spec = indexattn.compile_spec(TIES.format("max"), name="ties_max")
    x = tied("max")
    x[0, 2] -= 1e-3
    derived = grads(spec, {"x": x}, "derived")["x"]
    assert derived[0, 1] == 1 and derived[0, 2] == 0


# the bfloat16 fuzzer's find (tests/oracle/test_gradient_precision.py): an elementwise max or min
# whose arguments tie (inputs on a grid of halves) gave the derived backward and the oracle
# the whole gradient on one side, 0 on the other, where torch.maximum's autograd splits it

PAIR = "index i : n\ninput x_<i>\ny_<i> = {}(x_<i>, -0.5)\noutput y\n"


def test_tied_arguments_of_an_elementwise_max_and_min_split_the_gradient_as_autograd():
    x = torch.tensor([-0.5, 1.0, -2.0, -0.5], dtype=torch.float64)
    for fn in ("max", "min"):
        spec = indexattn.compile_spec(PAIR.format(fn), name=f"pair_{fn}")
        derived = grads(spec, {"x": x}, "derived")["x"]
        assert torch.equal(derived, grads(spec, {"x": x}, "autograd")["x"]), fn
        assert torch.equal(derived, oracle_grads(spec, {"x": x})["x"]), fn
        assert derived[0] == derived[3] == 0.5, fn


def test_twin_an_untied_argument_takes_the_whole_gradient_or_none():
    spec = indexattn.compile_spec(PAIR.format("max"), name="pair_max")
    x = torch.tensor([-0.5 + 1e-3, 1.0, -2.0, -0.5 - 1e-3], dtype=torch.float64)
    assert grads(spec, {"x": x}, "derived")["x"].tolist() == [1, 1, 0, 0]


# -- 2. a hidden branch that overflows


def retention_args(dtype: torch.dtype, decay: float, n: int = 128) -> dict:
    generator = torch.Generator().manual_seed(0)
    d_m, h, d_k = 16, 2, 8

    def draw(*shape):
        return (torch.randn(*shape, generator=generator) * 0.3).to(dtype)

    weights = {k: draw(h * d_k, d_m) for k in ("W_Q", "W_K", "W_V")}
    return {
        "X": draw(n, d_m),
        **weights,
        "W_O": draw(d_m, h * d_k),
        "lambda_": torch.full((h,), decay, dtype=dtype),
    }


CASES = [(torch.float16, -0.1), (torch.bfloat16, -1.0), (torch.float32, -1.0)]


def test_retentions_decay_hidden_above_the_diagonal_gives_finite_gradients():
    """RetNet's decay exp((τ - τ') λ) overflows above the diagonal, where the `where` hides
    it: float16 at λ = -0.1 (inside its init range), bfloat16 and float32 at λ = -1. The
    derived gradients are finite and within the dtype's error of autograd's."""
    spec = indexattn.compile_spec("retention")
    for dtype, decay in CASES:
        args = retention_args(dtype, decay)
        wide = grads(spec, {k: v.double() for k, v in args.items()}, "autograd")
        derived = grads(spec, args, "derived")
        autograd = grads(spec, args, "autograd")
        for k, want in wide.items():
            assert torch.isfinite(derived[k]).all(), (dtype, decay, k)
            scale = want.abs().max()
            ours = (derived[k].double() - want).abs().max() / scale
            theirs = (autograd[k].double() - want).abs().max() / scale
            assert ours <= 2 * theirs + 1e-2, (dtype, decay, k, ours, theirs)


def test_twin_the_hidden_branch_does_overflow_in_each_case():
    """Each case's decay, evaluated over the whole grid in its dtype, holds an infinity: a
    slope read there unguarded gives 0 × inf = NaN."""
    for dtype, decay in CASES:
        tau = torch.arange(128, dtype=dtype)
        grid = torch.exp((tau[:, None] - tau[None, :]) * decay)
        assert torch.isinf(grid).any() and torch.isnan(grid * 0).any(), dtype


MAMBA = """
index μ : h
index τ, τ' : N
index a : d
input X_<μτa>
input A_<μτ>
C_<μτ> = cumsum_<τ>(A_<μτ>)
D_<μττ'> = where(τ' > τ, 0, exp(C_<μτ> - C_<μτ'>))
O_<μτa> = X_<μτb> X_<μτ'b> D_<μττ'> X_<μτ'a>
output O
""".replace("index a : d", "index a, b : d")


def test_a_mamba2_decay_of_cumsums_gives_finite_gradients():
    """exp of a difference of running sums of log decays under a causal where (Mamba-2's
    SSD): in float32 at a decay of -0.5 a step the hidden branch overflows from 180 keys on."""
    spec = indexattn.compile_spec(MAMBA, name="mamba2")
    generator = torch.Generator().manual_seed(1)
    args = {
        "X": torch.randn(2, 256, 4, generator=generator) * 0.3,
        "A": -0.5 - 0.1 * torch.rand(2, 256, generator=generator),
    }
    wide = grads(spec, {k: v.double() for k, v in args.items()}, "autograd")
    derived = grads(spec, args, "derived")
    for k, want in wide.items():
        assert torch.isfinite(derived[k]).all(), k
        assert (derived[k].double() - want).abs().max() / want.abs().max() < 1e-4, k
    hidden = args["A"].cumsum(-1)
    assert torch.isinf(torch.exp(hidden[:, :, None] - hidden[:, None, :])).any()  # the twin


# -- 3. the reverse running sum


CUMSUM = "index τ : N\nindex a : d\ninput x_<τa>\ny_<τa> = cumsum_<τ>(x_<τa>)\noutput y\n"


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest error relative to each entry."""
    return ((got.double() - want) / want).abs().max().item()


def test_the_reverse_running_sum_does_not_cancel_in_bfloat16():
    """cumsum's cotangent is the running sum of g from the end (autograd: flip, cumsum,
    flip); the total less the running sum cancels in the tail (2.7 relative error at
    N = 1024 in bfloat16, against autograd's 0.004)."""
    spec = indexattn.compile_spec(CUMSUM, name="cumsum")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 4, generator=generator, dtype=torch.float64)
    dy = torch.rand(1024, 4, generator=generator, dtype=torch.float64)
    want = grads(spec, {"x": x}, "autograd", dy)["x"]
    low = {"x": x.bfloat16()}
    derived = relative(grads(spec, low, "derived", dy.bfloat16())["x"], want)
    autograd = relative(grads(spec, low, "autograd", dy.bfloat16())["x"], want)
    assert derived <= 2 * autograd, (derived, autograd)


def test_twin_the_total_less_the_running_sum_cancels_at_these_figures():
    generator = torch.Generator().manual_seed(0)
    torch.randn(1024, 4, generator=generator, dtype=torch.float64)
    dy = torch.rand(1024, 4, generator=generator, dtype=torch.float64)
    want = dy.flip(0).cumsum(0).flip(0)
    g = dy.bfloat16()
    cancelled = g.sum(0) - g.cumsum(0) + g
    assert relative(cancelled, want) > 0.5


# -- 4. a scalar passed as a tensor


def softcap() -> tuple:
    spec = indexattn.compile_spec("softcap_window")
    sizes = sample_sizes(spec.ir)
    return spec, sample_arguments(spec.ir, sizes), {"h": sizes["h"], "w": 2}


def cap_gradient(mode: str, value: float) -> torch.Tensor:
    """The gradient of a learnable soft cap c (a 0-dim tensor that requires grad)."""
    spec, args, given = softcap()
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    c = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    spec(**leaves, **given, c=c, backward=mode).sum().backward()
    return c.grad


def test_a_tensor_scalar_that_requires_grad_gets_its_gradient_under_both_backwards():
    autograd = cap_gradient("autograd", 0.5)
    derived = cap_gradient("derived", 0.5)
    assert derived is not None and autograd.abs() > 1e-6
    assert torch.allclose(derived, autograd, rtol=1e-10, atol=1e-12)


def test_twin_another_cap_gives_another_gradient():
    assert not torch.allclose(cap_gradient("derived", 0.6), cap_gradient("autograd", 0.5))


def test_a_tensor_scalar_written_in_place_rebuilds_the_constants_it_feeds():
    """The window w builds the mask once per shape; `w.fill_(100)` (an optimizer's step
    does the same) must give the call with 100, not the mask of the old value."""
    spec, args, given = softcap()
    given.pop("w")
    w = torch.tensor(1.0, dtype=torch.float64)
    before = spec(**args, **given, w=w)
    w.fill_(100)
    assert torch.equal(spec(**args, **given, w=w), spec(**args, **given, w=100.0))
    assert not torch.allclose(before, spec(**args, **given, w=100.0))  # the twin


# -- 7. a precision declaration, honoured by the backward


def differential_finite(text: str, mode: str) -> bool:
    """Whether differential attention's gradients are finite in float16 at its default init
    (N = 512): its per-head RMSNorm's rsqrt slope, -ρ³ / 2, is 10⁷ there."""
    spec = indexattn.compile_spec(text, name="differential")
    torch.manual_seed(0)
    module = spec.module(d_m=64, h=2, d=16).half()
    x = torch.randn(1, 512, 64).half().requires_grad_()
    params = dict(module.named_parameters())
    spec(X=x, **params, h=2, backward=mode).float().sum().backward()
    return all(torch.isfinite(t.grad).all() for t in (x, *params.values()))


DIFFERENTIAL = (ROOT / "specs" / "differential.attn").read_text(encoding="utf-8")


def test_differential_in_float16_has_finite_gradients_under_both_backwards():
    """The shipped spec declares its statistic `ρ_<μτ> : float32`; the derived backward
    computes what it derives from ρ's equation in float32 too, as autograd does."""
    assert differential_finite(DIFFERENTIAL, "autograd")
    assert differential_finite(DIFFERENTIAL, "derived")


def test_twin_without_the_declaration_float16_overflows():
    undeclared = DIFFERENTIAL.replace("ρ_<μτ> : float32 =", "ρ_<μτ> =")
    assert undeclared != DIFFERENTIAL
    assert not differential_finite(undeclared, "autograd")


# -- 6. a FoX-style spec: the printer and the reverse running sum of a negated cotangent

FOX = """
index μ : h
index τ, τ' : N
index a : d
input X_<μτa>
input G_<μτ>
F_<μτ> = logsigmoid(G_<μτ>)
L_<μτ> = -cumsum_<τ>(F_<μτ>)
S_<μττ'> = X_<μτa> X_<μτ'a> + L_<μτ'> - L_<μτ> + where(τ' > τ, -inf, 0)
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> X_<μτ'a>
output O
"""


def fox_args() -> dict:
    generator = torch.Generator().manual_seed(4)
    return {
        "X": torch.randn(2, 3, 6, 4, generator=generator, dtype=torch.float64),
        "G": torch.randn(2, 3, 6, generator=generator, dtype=torch.float64) + 2,
    }


def test_a_fox_style_backward_compiles_and_equals_autograd_and_the_oracle():
    """The forget gate's log decay L = -cumsum(logsigmoid(G)), a bias between τ and τ': its
    backward crashed the code printer (IndexError in values.relayout: a sum of one
    negated operand, `sum_<τ>(-dL_<μτ>)`, was printed as a relayout)."""
    spec = indexattn.compile_spec(FOX, name="fox")
    cot = torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    derived = grads(spec, fox_args(), "derived", cot)
    autograd = grads(spec, fox_args(), "autograd", cot)
    oracle = oracle_grads(spec, fox_args(), cot)  # its own order of sums: 1e-7 from autograd's
    for k, g in autograd.items():
        assert torch.allclose(derived[k], g, rtol=1e-10, atol=1e-12), k
        assert torch.allclose(derived[k], oracle[k], rtol=1e-6, atol=1e-6), k


def test_twin_a_sum_of_one_negated_operand_is_printed_as_a_sum():
    text = (
        "index i : n\nindex j : m\ninput x_<ij>\ny_<ij> = sum_<j>(-x_<ij>) - cumsum_<j>(-x_<ij>)\n"
    )
    spec = indexattn.compile_spec(text + "output y\n", name="negated")
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(spec(x=x), -x.sum(-1, keepdim=True) + x.cumsum(-1))


# -- 5. dropout's draws where the forward runs by blocks of queries


def dropped(name: str, mode: str, seed: int) -> tuple[torch.Tensor, dict]:
    """A training call at N = 384 (key spans: three blocks of 128 queries), dropout at 0.3,
    after torch.manual_seed(seed): the output and the gradients of its sum."""
    spec = indexattn.compile_spec(name)
    sizes = sample_sizes(spec.ir)
    sizes["N"] = 384
    args = sample_arguments(spec.ir, sizes, (2,))
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    torch.manual_seed(seed)
    out = spec(**leaves, h=sizes["h"], p=0.3, training=True, backward=mode)
    out.sum().backward()
    return out.detach(), {k: v.grad for k, v in leaves.items()}


def test_dropout_draws_the_same_masks_under_both_backwards_by_blocks():
    """The plain forward ran sliding_window and alibi by blocks of queries, each block drawing
    its own mask, while the derived backward's forward drew one whole mask: outputs ~1.9
    apart after the same seed. In training the kernel now runs whole, as the derived one."""
    for name in ("sliding_window", "alibi"):
        out, grads_autograd = dropped(name, "autograd", 5)
        same, grads_derived = dropped(name, "derived", 5)
        assert torch.allclose(out, same, rtol=0, atol=1e-12), name
        for k, g in grads_autograd.items():
            assert torch.allclose(grads_derived[k], g, rtol=1e-9, atol=1e-12), (name, k)


def test_twin_another_seed_draws_other_masks():
    assert not torch.allclose(dropped("alibi", "autograd", 5)[0], dropped("alibi", "derived", 6)[0])
