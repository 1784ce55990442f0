"""float16 and bfloat16: every shipped spec runs and stays close to the literal reading in
float64 of the same numbers, called as a function and as a module moved to bfloat16
(module.to(torch.bfloat16): 8 bits of mantissa, 2^-8 ≈ 0.004 per rounding, a few roundings
deep), and a moved weight shows beyond that; a scale is applied before the product it
divides, so float16 scores do not overflow where the scaled result fits."""

import pytest
import torch

import indexattn
from indexattn.lower.program.steps import Contract
from indexattn.oracle import reference
from indexattn.oracle.verify import TOLERANCE, _error, sample_arguments, sample_sizes

LOW = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", LOW, ids=["f16", "bf16"])
def test_low_precision_equals_the_literal_reading_in_float64(shipped, dtype):
    sizes = sample_sizes(shipped.ir)
    given = {k: v for k, v in sizes.items() if k in shipped.required}
    args = sample_arguments(shipped.ir, sizes, (2,), dtype)
    got = shipped(**args, **given)
    got = got if isinstance(got, tuple) else (got,)
    want = reference.evaluate(shipped.ir, **{k: v.double() for k, v in args.items()}, **given)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert _error(g, w) <= TOLERANCE[dtype], shipped.name


SCORES = """index τ : N
index σ : L
index a : d_k
input Q_<τa>
input K_<σa>
input V_<σa>
S_<τσ> = Q_<τa> K_<σa> / sqrt(d_k)
A_<τσ> = softmax_<σ>(S_<τσ>)
O_<τa> = A_<τσ> V_<σa>
output O, A
"""


def test_float16_scores_do_not_overflow_before_the_scale():
    """Q·K = 64 · 40² = 102400 overflows float16 (max 65504); Q·K / 8 = 12800 does not."""
    spec = indexattn.compile_spec(SCORES, name="scores")
    scales = [s for s in spec.program.steps if isinstance(s, Contract) and len(s.args) == 1]
    assert [s.args[0].var.hint for s in scales if s.scale != 1] == ["Q"]  # not Q·K
    q = torch.full((3, 64), 40.0)
    k = torch.full((5, 64), 40.0)
    v = torch.randn(5, 64)
    out, weights = spec(Q=q.half(), K=k.half(), V=v.half())
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    want, _ = reference.evaluate(spec.ir, Q=q.double(), K=k.double(), V=v.double())
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=1e-2)


# -- the module moved to bfloat16 against itself in float64

MODULE_TOLERANCE = 0.02  # max |bf16 - f64| / (1 + max |f64|); float64 against itself gives 0


def run(spec, dtype, bump: bool = False, device="cpu"):
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64)
    module = spec.module(**sizes)
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    if bump:  # the twin: every entry of every parameter moved, far beyond bfloat16's error
        with torch.no_grad():  # (the last alone can be a small one: mta's kernel over scores)
            for weight in module.parameters():  # unevenly: softmax ignores a constant
                weight.add_(
                    torch.linspace(0, 2, weight.numel(), dtype=weight.dtype).view_as(weight)
                )
    module = module.to(device=device, dtype=dtype).eval()
    inputs = [args[t.ascii].to(device) for t in spec.ir.tensors_of("input")]
    out = module(*(x.to(dtype) if x.is_floating_point() else x for x in inputs))
    return (out[0] if isinstance(out, tuple) else out).double().cpu()


def error(got, want) -> float:
    return float((got - want).abs().max() / (1 + want.abs().max()))


def test_every_spec_runs_in_bfloat16_close_to_float64(shipped):
    want = run(shipped, torch.float64)
    got = run(shipped, torch.bfloat16)
    assert got.dtype == torch.float64 and error(got, want) < MODULE_TOLERANCE


def test_twin_a_moved_weight_shows_beyond_the_tolerance(shipped):
    if not list(shipped.module(**sample_sizes(shipped.ir)).parameters()):
        pytest.skip("no parameter to move (simple, sdpa)")
    want = run(shipped, torch.float64)
    assert error(run(shipped, torch.bfloat16, bump=True), want) > MODULE_TOLERANCE
