"""Numbers stay finite where the mathematics is finite: fully masked rows give zeros (values and
gradients) on every code path and dtype, huge logits give a finite softmax, two finfo.min masks
never make NaN, and float16/bfloat16 agree with float64 within the dtype's tolerance."""

import inspect
import math
import re
from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import TOLERANCE, sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]

HEAD = """index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
input P_<ττ'>
input R_<ττ'>
param W_q_<(μa)i>
param W_k_<(μa)i>
param W_v_<(μa)i>
Q_<μτa> = W_q_<(μa)i> X_<τi>
K_<μτa> = W_k_<(μa)i> X_<τi>
V_<μτa> = W_v_<(μa)i> X_<τi>
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + P_<ττ'> + R_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
"""
# The same attention with the weights as an output (no fused kernel can return them) and
# without (a fused kernel may compute it): both code paths are held to the same rules.
PATHS = {"weights out": HEAD + "output O, A\n", "output only": HEAD + "output O\n"}


def attention(path: str, dtype: torch.dtype, fill: float, rows=(0,), n=5):
    spec = indexattn.compile_spec(PATHS[path], name=path.replace(" ", "_"))
    gen = torch.Generator().manual_seed(0)
    args = {
        name: (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5).to(dtype)
        for name, shape in (("X", (2, n, 8)), ("W_q", (8, 8)), ("W_k", (8, 8)), ("W_v", (8, 8)))
    }
    mask = torch.zeros(n, n, dtype=dtype)
    mask[list(rows)] = fill  # every key of these query rows is masked
    mask[1, 3] = fill  # and one entry of another row
    args["P"], args["R"] = mask.clone(), mask.clone()
    leaves = {k: v.requires_grad_() for k, v in args.items()}
    out = spec(**leaves, h=2)
    return spec, leaves, out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_a_fully_masked_row_gives_zeros_and_zero_gradients(path, dtype):
    _, leaves, outputs = attention(path, dtype, float("-inf"))
    for out in outputs:
        assert torch.all(torch.isfinite(out)), f"{path}: non-finite output in {dtype}"
        assert torch.all(out[:, :, 0] == 0), "the masked row must be zeros"
    sum(o.float().sum() for o in outputs).backward()
    for name, leaf in leaves.items():
        assert torch.all(torch.isfinite(leaf.grad)), f"{path}: NaN gradient of {name}"
    assert torch.all(leaves["P"].grad[0] == 0) and leaves["P"].grad[1, 3] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_two_finfo_min_masks_never_make_nan(path, dtype):
    _, leaves, outputs = attention(path, dtype, torch.finfo(dtype).min, rows=())
    for out in outputs:
        assert torch.all(torch.isfinite(out))
    sum(o.float().sum() for o in outputs).backward()
    assert all(torch.all(torch.isfinite(leaf.grad)) for leaf in leaves.values())


@pytest.mark.parametrize("path", PATHS)
def test_huge_logits_give_a_finite_softmax(path):
    spec = indexattn.compile_spec(PATHS[path], name="huge")
    x = torch.randn(2, 5, 8, dtype=torch.float32) * 100
    w = torch.randn(8, 8) * 10  # scores of order 1e4 and beyond
    zeros = torch.zeros(5, 5)
    out = spec(X=x, W_q=w, W_k=w, W_v=torch.eye(8), P=zeros, R=zeros, h=2)
    for o in out if isinstance(out, tuple) else (out,):
        assert torch.all(torch.isfinite(o))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_precision_agrees_with_float64(shipped, dtype):
    sizes = sample_sizes(shipped.ir, seed=0)
    given = {k: v for k, v in sizes.items() if k in shipped.required}
    exact = sample_arguments(shipped.ir, sizes, (2,), torch.float64, seed=0)
    # the float inputs in the low dtype; integer ones (document ids) stay integers
    low = {k: v.to(dtype) if v.is_floating_point() else v for k, v in exact.items()}
    rounded = {k: v.double() if v.is_floating_point() else v for k, v in low.items()}
    got = shipped(**low, **given)
    want = reference.evaluate(shipped.ir, **rounded, **given)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want):
        assert g.dtype == dtype
        scale = 1 + w.abs().max().item()
        error = (g.double() - w).abs().max().item() / scale
        assert error <= TOLERANCE[dtype], f"{shipped.name}: {error:.2e} in {dtype}"


SCORES = """index τ, τ' : N
index i : d
input X_<τi>
{mask}S_<ττ'> = X_<τi> X_<τ'i>{plus}
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
output A
"""


def test_scores_of_data_alone_take_the_plain_softmax():
    """Dot products of inputs cannot hide a whole row; an added input mask can (its twin)."""
    plain = indexattn.compile_spec(SCORES.format(mask="", plus=""), name="plain")
    masked = indexattn.compile_spec(
        SCORES.format(mask="input M_<ττ'>\n", plus=" + M_<ττ'>"), name="masked"
    )
    assert "torch.softmax(" in plain.source and "safe_softmax" not in plain.source
    assert "rt.safe_softmax(" in masked.source
    x = torch.randn(4, 3, dtype=torch.float64)
    hidden = torch.zeros(4, 4, dtype=torch.float64).index_fill_(0, torch.tensor([1]), -math.inf)
    assert masked(X=x, M=hidden)[1].eq(0).all()  # the row hidden everywhere gives zeros
    torch.testing.assert_close(plain(X=x), reference.evaluate(plain.ir, X=x)[0])


def _ops_run(call) -> set[str]:
    with torch.profiler.profile() as prof:
        call()
    return {event.key for event in prof.key_averages()}


def test_the_safe_softmax_runs_only_where_a_row_is_dead_and_both_agree():
    """Eager calls take the plain softmax unless some row is -inf everywhere; a traced call
    always takes the safe one. Where no row is dead the two agree bit for bit, values and
    gradients; where one is (the twin) only the safe one runs and the row gives zeros."""
    masked = indexattn.compile_spec(
        SCORES.format(mask="input M_<ττ'>\n", plus=" + M_<ττ'>"), name="masked"
    )
    x = torch.randn(4, 3, dtype=torch.float64)
    live = torch.zeros(4, 4, dtype=torch.float64).index_fill_(1, torch.tensor([2]), -math.inf)
    dead = live.index_fill(0, torch.tensor([1]), -math.inf)
    assert "aten::_safe_softmax" not in _ops_run(lambda: masked(X=x, M=live))
    assert "aten::_safe_softmax" in _ops_run(lambda: masked(X=x, M=dead))
    traced = torch.compile(lambda X, M: masked(X=X, M=M), backend="eager", fullgraph=True)
    got = []
    for call in (lambda X: masked(X=X, M=live), lambda X: traced(X, live)):
        leaf = x.clone().requires_grad_()
        out = call(leaf)
        (out * torch.arange(16.0, dtype=out.dtype).view(4, 4)).sum().backward()
        got.append((out, leaf.grad))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert masked(X=x, M=dead)[1].eq(0).all() and not masked(X=x, M=dead).isnan().any()


def _softmax_bytes(call) -> int:
    """What the softmax steps allocate, in bytes."""
    with torch.profiler.profile(profile_memory=True) as prof:
        call()
    events = prof.key_averages()
    return sum(e.self_cpu_memory_usage for e in events if e.key == "aten::_softmax")


MASKED = SCORES.format(mask="input M_<ττ'>\n", plus=" + M_<ττ'>")


@pytest.mark.parametrize("mask", ["", "input M_<ττ'>\n"], ids=["plain", "safe"])
def test_without_gradients_the_weights_overwrite_the_scores_and_agree_bit_for_bit(mask):
    """No gradient needed: the softmax writes over the fresh scores (nothing allocated), the
    same numbers as the softmax that allocates, which runs where a gradient is needed."""
    spec = indexattn.compile_spec(SCORES.format(mask=mask, plus=" + M_<ττ'>" if mask else ""))
    x = torch.randn(64, 3, dtype=torch.float64)
    m = torch.zeros(64, 64, dtype=torch.float64).index_fill_(1, torch.tensor([5]), -math.inf)
    args = {"X": x, "M": m} if mask else {"X": x}
    with torch.no_grad():
        assert _softmax_bytes(lambda: spec(**args)) == 0
        kept = spec(**args)
    leaf = x.clone().requires_grad_()
    assert _softmax_bytes(lambda: spec(**{**args, "X": leaf})) == 64 * 64 * 8  # the twin
    assert torch.equal(kept, spec(**{**args, "X": leaf}).detach())


def test_without_gradients_a_dead_row_still_gives_zeros_and_nan_scores_still_nan():
    spec = indexattn.compile_spec(MASKED, name="masked")
    x = torch.randn(6, 3, dtype=torch.float64)
    dead = torch.zeros(6, 6, dtype=torch.float64).index_fill_(0, torch.tensor([1]), -math.inf)
    nan = torch.zeros(6, 6, dtype=torch.float64).index_fill_(0, torch.tensor([2]), math.nan)
    for mask in (dead, nan):
        with torch.no_grad():
            got = spec(X=x, M=mask)
        want = spec(X=x.clone().requires_grad_(), M=mask).detach()
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    with torch.no_grad():
        assert spec(X=x, M=dead)[1].eq(0).all() and spec(X=x, M=nan)[2].isnan().all()


def test_scores_passed_in_or_read_twice_are_never_overwritten():
    given = indexattn.compile_spec(
        "index τ, τ' : N\ninput S_<ττ'>\nA_<ττ'> = softmax_<τ'>(S_<ττ'>)\noutput A\n", name="given"
    )
    s = torch.randn(5, 5, dtype=torch.float64)
    before = s.clone()
    with torch.no_grad():
        given(S=s)
    assert torch.equal(s, before) and not _overwrites(given)
    read_twice = SCORES.format(mask="", plus="").replace("output A", "output A, S")
    twice = indexattn.compile_spec(read_twice, name="twice")
    with torch.no_grad():
        a, scores = twice(X=torch.randn(5, 3, dtype=torch.float64))
    assert not torch.equal(a, scores) and not _overwrites(twice)


def _overwrites(spec) -> bool:
    """Whether a softmax line of the spec's function may write over its scores."""
    lines = [line for line in spec.source.splitlines() if re.search(r"= [\w.]*softmax\(", line)]
    return any("out=" in line or "overwrite" in line for line in lines)


@pytest.mark.parametrize("mask", ["", "input M_<ττ'>\n"], ids=["plain", "safe"])
def test_the_softmax_over_the_scores_traces_without_gradients(mask):
    """torch.compile (fullgraph) and torch.export of the step that writes over the scores."""
    spec = indexattn.compile_spec(SCORES.format(mask=mask, plus=" + M_<ττ'>" if mask else ""))
    names = ("X", "M") if mask else ("X",)
    call = lambda *args: spec(**dict(zip(names, args)))  # noqa: E731
    x = torch.randn(6, 3, dtype=torch.float64)
    args = (x, torch.zeros(6, 6, dtype=torch.float64)) if mask else (x,)

    class Layer(torch.nn.Module):
        def forward(self, *args):
            return call(*args)

    with torch.no_grad():
        want = call(*args)
        traced = torch.compile(call, backend="eager", fullgraph=True)(*args)
        exported = torch.export.export(Layer(), args).module()(*args)
    torch.testing.assert_close(traced, want, rtol=0, atol=0)
    torch.testing.assert_close(exported, want, rtol=0, atol=0)


def test_a_safe_softmax_over_scores_mixed_across_heads_keeps_the_plain_path():
    """Whether a row is dead is asked by a reduction over the scores before they are written
    over: over talking heads' mixed scores (strided along the key) that costs more than it
    saves, so only scores laid out as a product's are written over (gpt2, the twin)."""
    mixed = indexattn.compile_spec(ROOT / "specs" / "talking_heads.attn")
    product = indexattn.compile_spec(ROOT / "specs" / "gpt2.attn").source
    assert not _overwrites(mixed) and "safe_softmax(" in mixed.source
    # the weights are returned: the softmax is the runtime's softmax_values'
    # (passes/softmax_values.py)
    assert "rt.softmax_values(S, V, p=" in product
    assert "weights = softmax(scores, -1, overwrite)" in inspect.getsource(rt.softmax_values)


def test_vmap_and_jvp_take_the_softmax_that_allocates():
    """torch.func's tensors do not require grad, but gradients are recorded: the plain path,
    which vmap batches and jvp differentiates."""
    spec = indexattn.compile_spec(SCORES.format(mask="", plus=""), name="plain")
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    batched = torch.func.vmap(lambda X: spec(X=X))(x)
    torch.testing.assert_close(batched, spec(X=x), rtol=0, atol=1e-15)
    _, tangent = torch.func.jvp(lambda X: spec(X=X), (x[0],), (torch.ones_like(x[0]),))
    assert torch.isfinite(tangent).all()
