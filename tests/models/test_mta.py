"""Convolutions over positions (lower/planner/conv.py): a kernel over relative offsets read as the
papers write it, `sum_<pr>(where(τ >= p ..., θ_<μpr> S_<μ[τ - p][...]>, 0))`, compiles to one
grouped F.conv1d/F.conv2d and equals the literal reading and a hand-written conv in values and
gradients (float64); Multi-Token Attention (specs/mta.attn) against its hand-written module."""

import pytest
import sympy
import torch
from reference.mta import MTA_CASES, MTA_SIZES
from test_classic_variants import as_tuple, assert_all_close, assert_same_gradients, setup

import indexattn
from indexattn.ir import check
from indexattn.oracle.reference import evaluate

CASE = MTA_CASES[0]

HEAD = """
index τ, τ' : N
index μ : h
index a : d
index p : c_q
index r : c_k
input Q_<μτa>
input K_<μτa>
input V_<μτa>
param θ_<μpr>
S_<μττ'> = where(τ' > τ, 0, Q_<μτa> K_<μτ'a> / sqrt(d))
"""
TAIL = "\nO_<μτa> = softmax_<τ'>(C_<μττ'> + where(τ' > τ, -inf, 0)) V_<μτ'a>\n"
CONV2D = "C_<μττ'> = sum_<pr>(where(τ >= p and τ' >= r, θ_<μpr> S_<μ[τ - p][τ' - r]>, 0))"
EINSTEIN = "C_<μττ'> = θ_<μpr> where(τ >= p and τ' >= r, S_<μ[τ - p][τ' - r]>, 0)"
CENTRED = (
    "C_<μττ'> = sum_<pr>(where(τ >= p and r <= τ' + floor(c_k / 2) and τ' + floor(c_k / 2)"
    " < N + r, θ_<μpr> S_<μ[τ - p][τ' - r + floor(c_k / 2)]>, 0))"
)
AHEAD = "C_<μττ'> = sum_<pr>(where(τ + p < N and τ' + r < N, θ_<μpr> S_<μ[τ + p][τ' + r]>, 0))"
SHORT = """
index τ : N
index c : D
index k : w
input X_<τc>
param θ_<ck>
Y_<τc> = sum_<k>(where(τ >= k, θ_<ck> X_<[τ - k]c>, 0))
"""  # a causal depthwise convolution over the sequence (Mamba's short convolution)
# not a convolution: the condition hides more than the reads outside the sequence
NARROW = "C_<μττ'> = sum_<pr>(where(τ >= p + 1 and τ' >= r, θ_<μpr> S_<μ[τ - p][τ' - r]>, 0))"


def conv2d_reference(q, k, v, theta, centred=False):
    """MTA's core by hand: zero-masked scores, padded, grouped conv2d, -inf mask, softmax."""
    c_q, c_k = theta.shape[-2:]
    hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(hidden, 0)
    lead = c_k // 2 if centred else 0
    padded = torch.nn.functional.pad(scores, (c_k - 1 - lead, lead, c_q - 1, 0))
    mixed = torch.nn.functional.conv2d(
        padded.reshape(-1, *padded.shape[-3:]), theta.flip(-2, -1)[:, None], groups=len(theta)
    ).view(scores.shape)
    return torch.softmax(mixed.masked_fill(hidden, -torch.inf), dim=-1) @ v


def inputs(c_q=3, c_k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, 6, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    theta = torch.randn(2, c_q, c_k, generator=gen, dtype=torch.float64)
    return {"Q": q, "K": k, "V": v, "theta": theta}


def core(line):
    return indexattn.compile_spec(HEAD + line + TAIL, name="core")


def grads(out, args):
    leaves = [args[n] for n in ("Q", "theta")]
    return torch.autograd.grad((out * torch.cos(out)).sum(), leaves)


@pytest.mark.parametrize(
    "line, conv, centred",
    [(CONV2D, "F.conv2d", False), (EINSTEIN, "F.conv2d", False), (CENTRED, "F.conv2d", True)],
    ids=["sum", "einstein", "centred"],
)
def test_shifted_reads_are_one_conv2d_equal_to_the_hand_written_one_and_the_oracle(
    line, conv, centred
):
    spec = core(line)
    assert spec.source.count(conv) == 1 and "_at" not in spec.source
    args = {n: t.requires_grad_() for n, t in inputs(c_k=3).items()}
    got = spec(**args)
    want = conv2d_reference(*args.values(), centred=centred)
    literal = evaluate(check(HEAD + line + TAIL, "core"), **args)[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got, literal, atol=1e-12, rtol=0)
    for g, w in zip(grads(got, args), grads(want, args)):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)


def test_twin_one_kernel_tap_changed_differs():
    spec, args = core(CONV2D), inputs()
    twin = {**args, "theta": args["theta"].clone()}
    twin["theta"][1, 2, 0] += 0.1  # head 1, query offset 2, key offset 0
    assert (spec(**args) - spec(**twin)).abs().max() > 1e-3


def test_twin_centred_and_causal_keys_differ():
    args = inputs(c_k=3)
    assert (core(CONV2D)(**args) - core(CENTRED)(**args)).abs().max() > 1e-3


def test_reads_ahead_are_one_conv2d_unflipped():
    spec = core(AHEAD)
    assert "F.conv2d" in spec.source and ".flip(" not in spec.source
    args = {n: t.requires_grad_() for n, t in inputs().items()}
    got = spec(**args)
    literal = evaluate(check(HEAD + AHEAD + TAIL, "core"), **args)[0]
    torch.testing.assert_close(got, literal, atol=1e-12, rtol=0)
    for g, w in zip(grads(got, args), grads(literal, args)):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)


def test_a_causal_depthwise_convolution_is_one_conv1d_equal_to_the_hand_written_one():
    spec = indexattn.compile_spec(SHORT, name="short")
    assert spec.source.count("F.conv1d") == 1
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    theta = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    got = spec(X=x, theta=theta)
    padded = torch.nn.functional.pad(x.transpose(-2, -1), (2, 0))
    want = torch.nn.functional.conv1d(padded, theta.flip(-1)[:, None], groups=4)
    want = want.transpose(-2, -1)
    literal = evaluate(check(SHORT, "short"), X=x, theta=theta)[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got, literal, atol=1e-12, rtol=0)
    for g, w in zip(grads(got, {"Q": x, "theta": theta}), grads(want, {"Q": x, "theta": theta})):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
    twin = theta.detach().clone()
    twin[2, 1] += 0.1
    assert (spec(X=x, theta=twin) - got).abs().max() > 1e-3


def test_a_condition_that_hides_more_is_no_convolution_and_still_its_literal_reading():
    spec = core(NARROW)
    assert "conv" not in spec.source
    args = inputs()
    literal = evaluate(check(HEAD + NARROW + TAIL, "core"), **args)[0]
    torch.testing.assert_close(spec(**args), literal, atol=1e-12, rtol=0)
    assert (spec(**args) - core(CONV2D)(**args)).abs().max() > 1e-3


def test_the_derived_backward_equals_autograd():
    spec = core(CONV2D)
    args = {n: t.requires_grad_() for n, t in inputs().items()}
    derived = grads(spec(**args, backward="derived"), args)
    autograd = grads(spec(**args, backward="autograd"), args)
    for g, w in zip(derived, autograd):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)


def test_counts_the_convolution_per_tap():
    """2 FLOPs per tap per score, as torch's FlopCounterMode counts conv2d."""
    flops = core(CONV2D).flops()
    sizes = {s: s.name for s in flops.free_symbols}
    taps = {s: n for s, n in sizes.items() if n in ("c_q", "c_k")}
    n, h, c_q, c_k = (next(s for s, m in sizes.items() if m == k) for k in ("N", "h", "c_q", "c_k"))
    assert sympy.expand(flops).coeff(c_q).coeff(c_k) == 2 * n**2 * h and len(taps) == 2


def test_mta_equals_its_hand_written_module():
    ref, spec_module, args = setup(CASE, CASE.build)
    want = as_tuple(ref(*args.values()))
    got = as_tuple(spec_module(*args.values()))
    assert_all_close(got, want)
    assert_same_gradients(CASE, want, got, args, ref, spec_module, same_keys=True)


def test_mta_twin_one_kernel_tap_changed_differs():
    ref, spec_module, args = setup(CASE, CASE.build)
    with torch.no_grad():
        ref.theta[0, 1, 2] += 0.1
    assert (ref(*args.values()) - spec_module(*args.values())).abs().max() > 1e-4


def test_mta_counts():
    spec = indexattn.compile_spec("mta")
    count = sympy.sympify(CASE.count)
    value = spec.param_count().subs({s: MTA_SIZES[str(s)] for s in spec.param_count().free_symbols})
    assert value == count.subs(MTA_SIZES)
    with torch.device("meta"):
        built = CASE.build(MTA_SIZES)
    assert sum(p.numel() for p in built.parameters()) == value


def test_without_the_convolve_rules_the_same_spec_is_its_gathers_equal_in_value(monkeypatch):
    from indexattn.lower.planner import plan, products

    args = inputs()
    want = core(CONV2D)(**args)
    rules = [r for r in products.PRODUCT_RULES if r.name != "convolve"]
    monkeypatch.setattr(products, "PRODUCT_RULES", tuple(rules))
    monkeypatch.setattr(plan, "REDUCTION_RULES", plan.REDUCTION_RULES[::2])  # scatter, reduce
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    spec = indexattn.compile_spec(HEAD + CONV2D + TAIL, name="gathers")
    assert "conv" not in spec.source and "_at" in spec.source
    torch.testing.assert_close(spec(**args), want, atol=1e-12, rtol=0)


def test_latex_writes_the_papers_sum_over_offsets_of_shifted_scores():
    latex = core(CONV2D).latex()
    line = next(x for x in latex.splitlines() if x.strip().startswith("C_"))
    assert r"\sum_{p r}" in line and r"\theta_{\mu p r} \, S_{\mu [\tau - p] [\tau' - r]}" in line
    assert r"\tau \geq p \land \tau' \geq r" in line
