"""float16 and bfloat16: every shipped spec runs and stays close to the literal reading in
float64 of the same numbers; a scale is applied before the product it divides, so float16
scores do not overflow where the scaled result fits."""

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
