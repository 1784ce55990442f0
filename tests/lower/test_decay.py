"""Retention (specs/retention.attn): a causal decay γ^(τ - τ') times the scores, read through
the values, is computed by chunks of positions (lower/planner/decay.py, the step of
lower/planner/prefix.py with a rate), never as an N×N tensor: it equals the literal interpreter in
float64, values and gradients, when the sequence is several chunks and not a multiple of one, a
whole number of them, and shorter than one. In float32 at a length where exp(τ' |λ|) overflows, it
stays finite and equal to float64, where the same decay split into per-query and per-key factors
(the one way around a negative power that needs no chunks) overflows. Decays that are not
causal 0-masks times γ^(τ - τ') take the general steps and still equal the literal reading."""

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import indexattn
from indexattn.lower.program.steps import PrefixProduct
from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes
from indexattn.views import cost

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "retention.attn"
DECAY = "where(τ' > τ, 0, exp((τ - τ') λ_<μ>))"

CORE = """index μ : h
index τ, τ' : N
index a, b : d
input Q_<μτa>
input K_<μτa>
input V_<μτb>
param λ_<μ>
D_<μττ'> = where(τ' > τ, 0, exp((τ - τ') λ_<μ>))
R_<μττ'> = Q_<μτa> K_<μτ'a> D_<μττ'>
O_<μτb> = R_<μττ'> V_<μτ'b>
"""

# decays that are no causal 0-mask times γ^(τ - τ'): the general steps
UNCHUNKED = {
    "the square of the distance": CORE.replace("exp((τ - τ') λ_<μ>)", "exp((τ - τ')^2 λ_<μ>)"),
    "0 below the diagonal": CORE.replace("where(τ' > τ, 0", "where(τ' < τ, 0"),
    "the diagonal hidden too": CORE.replace("where(τ' > τ, 0", "where(τ' >= τ, 0"),
    "a decay per query": CORE.replace("exp((τ - τ') λ_<μ>)", "exp(τ λ_<μ>)"),
    "the decay read by another output": CORE + "output O, D\n",
    "the scores in a precision of their own": CORE.replace("R_<μττ'> =", "R_<μττ'> : float32 ="),
}


@pytest.fixture(scope="module")
def retention():
    return indexattn.compile_spec(SPEC)


def chunks(spec) -> list[PrefixProduct]:
    return [s for s in spec.program.steps if isinstance(s, PrefixProduct)]


def arguments(spec, n: int, seed: int = 0):
    sizes = {**sample_sizes(spec.ir), "N": n}
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, seed)
    args["lambda_"] = -args["lambda_"].abs()  # decays: nothing grows to e^200 at N = 260
    return args, given


def test_no_n_by_n_value_is_held(retention):
    (step,) = chunks(retention)
    assert step.rate is not None and not step.power
    assert all(not {"τ", "τ'"} <= {i.glyph for i in s.out.dims} for s in retention.plan.steps)
    assert "DECAY_CHUNK = 64" in retention.source


@pytest.mark.parametrize(
    "n, chunk",
    [(7, 3), (6, 3), (2, None), (130, None)],
    ids=["not-a-multiple", "whole-chunks", "shorter-than-one", "default-three-chunks"],
)
def test_chunked_equals_literal_in_values_and_gradients(retention, monkeypatch, n, chunk):
    if chunk is not None:
        monkeypatch.setitem(retention.function.__globals__, "DECAY_CHUNK", chunk)
    args, given = arguments(retention, n)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    twins = {k: v.clone().requires_grad_() for k, v in args.items()}
    got = retention(**leaves, **given)
    (want,) = reference.evaluate(retention.ir, **twins, **given)
    assert got.shape[-2] == n
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = torch.randn_like(want)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    for name in args:
        torch.testing.assert_close(leaves[name].grad, twins[name].grad, rtol=0, atol=1e-10)


def test_twin_a_wrong_carry_across_chunks_is_seen(retention, monkeypatch):
    """The chunks' states decayed by one step too few: the literal reading tells it apart."""
    source = retention.source.replace("[:, None] - 1 - R_hops", "[:, None] - R_hops")
    assert source != retention.source
    namespace = dict(retention.function.__globals__)
    exec(compile(source, "<twin>", "exec"), namespace)
    namespace["DECAY_CHUNK"] = 3
    args, given = arguments(retention, 7)
    (want,) = reference.evaluate(retention.ir, **args, **given)
    got = namespace["retention"](**args, **given)
    assert not torch.allclose(got, want)


def split_decay(q, k, v, lam):
    """exp((τ - τ') λ) as exp(τ λ) · exp(-τ' λ) on the queries and keys, then a causal mask:
    no chunks, and exp(-τ' λ) grows without bound."""
    tau = torch.arange(q.shape[-2], dtype=q.dtype)
    grow = torch.exp(-tau[:, None] * lam[:, None, None])
    scores = (q * torch.exp(tau[:, None] * lam[:, None, None])) @ (k * grow).transpose(-2, -1)
    return torch.tril(scores) @ v


def long_inputs(n: int, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, n, 4, dtype=torch.float64).to(dtype) for _ in range(3))
    return q, k, v, torch.tensor([-1.0, -0.01], dtype=dtype)


def test_long_sequences_stay_finite_in_float32():
    """N = 300 and λ = -1: exp(τ' |λ|) passes float32's largest (e^88); every power the
    chunks take is of a distance ≥ 0 times λ."""
    spec = indexattn.compile_spec(CORE, name="core")
    q, k, v, lam = long_inputs(300, torch.float32)
    lam.requires_grad_()
    got = spec(Q=q, K=k, V=v, lambda_=lam)
    (grad,) = torch.autograd.grad(got.sum(), lam)
    wide = {name: t.double() for name, t in zip("QKV", (q, k, v))}
    want = spec(**wide, lambda_=lam.detach().double())
    assert torch.isfinite(got).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_twin_the_decay_split_over_queries_and_keys_overflows_in_float32():
    out = split_decay(*long_inputs(300, torch.float32))
    assert not torch.isfinite(out).all()
    q, k, v, lam = long_inputs(40, torch.float64)  # short enough: the split is exact
    spec = indexattn.compile_spec(CORE, name="core")
    torch.testing.assert_close(spec(Q=q, K=k, V=v, lambda_=lam), split_decay(q, k, v, lam))


@pytest.mark.parametrize("twin", UNCHUNKED)
def test_other_decays_take_the_general_steps_and_equal_the_literal_reading(twin):
    spec = indexattn.compile_spec(UNCHUNKED[twin], name="t")
    assert chunks(spec) == []
    assert compare(spec, torch.float64, (2,)).ok


def test_the_core_alone_is_chunked_and_equal_to_the_literal_reading():
    spec = indexattn.compile_spec(CORE, name="core")
    assert len(chunks(spec)) == 1
    assert compare(spec, torch.float64, (2,)).ok


@pytest.mark.parametrize("n", [5, 150])
def test_flops_are_what_torch_counts(retention, n):
    """The chunked step's matrix products as counted (views/cost.py) against torch's count:
    one chunk of the whole sequence, and three chunks, the last ragged."""
    args, given = arguments(retention, n)
    with FlopCounterMode(display=False) as counter:
        retention(**{k: v[0] if k == "X" else v for k, v in args.items()}, **given)
    sizes = cost.sizes_for(retention.ir, {**sample_sizes(retention.ir), "N": n})
    matmul = sum((c for _, c in cost.block_costs(retention.plan)), cost.Cost()).matmul
    assert counter.get_total_flops() == cost.evaluate(matmul, sizes)
