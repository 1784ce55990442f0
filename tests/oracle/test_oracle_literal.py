"""The oracle is literal: a running sum is added position by position, scalars are numbers,
batch axes are as the language says, and on small cases it equals plain Python loops."""

import math

import torch

import indexattn
from indexattn.oracle.reference import evaluate

PREFIX = """index τ : N
input X_<τ>
Y_<τ> = cumsum_<τ>(X_<τ>)
"""


def test_a_running_sum_keeps_an_inf_where_it_is():
    """x @ triu(ones) made 0·inf = NaN at every position before the inf."""
    spec = indexattn.compile_spec(PREFIX, name="prefix")
    x = torch.tensor([1.0, 2.0, math.inf, 3.0], dtype=torch.float64)
    (got,) = evaluate(spec.ir, X=x)
    assert got.tolist() == [1.0, 3.0, math.inf, math.inf]
    assert torch.equal(spec(X=x), got)


def test_twin_a_minus_inf_after_an_inf_is_nan_in_both():
    spec = indexattn.compile_spec(PREFIX, name="prefix")
    x = torch.tensor([1.0, math.inf, -math.inf], dtype=torch.float64)
    (got,) = evaluate(spec.ir, X=x)
    assert got[:2].tolist() == [1.0, math.inf] and got[2].isnan()


NARROW = """index τ : N
index a : d
input X_<τa>
input Y_<τa>
Z_<τa> = 2 Y_<τa>
W_<τa> = X_<τa> + Y_<τa>
output Z, W
"""


def test_an_output_of_a_narrower_input_carries_the_calls_batch():
    """Z reads only Y, which has no batch axes; the call's batch (2,) is X's."""
    spec = indexattn.compile_spec(NARROW, name="narrow")
    x, y = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    z, w = evaluate(spec.ir, X=x, Y=y)
    assert z.shape == (2, 3, 4) and w.shape == (2, 3, 4)
    for got, want in zip(spec(X=x, Y=y), (z, w)):
        assert torch.equal(got, want)


def test_twin_an_output_of_positions_keeps_its_own_axes():
    spec = indexattn.compile_spec(
        NARROW.replace("output Z, W", "M_<τa> = where(a > τ, 1, 0)\noutput Z, W, M"),
        name="narrow",
    )
    x, y = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    *_, m = evaluate(spec.ir, X=x, Y=y)
    assert m.shape == (3, 4)


ATTENTION = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
scalar w = 2
S_<ττ'> = Q_<τa> K_<τ'a> / sqrt(d) + where(τ' > τ or τ - τ' >= w, -inf, 0)
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
C_<τa> = cumsum_<τ>(O_<τa>)
output C
"""


def loops(q, k, v, w):
    """The spec above in plain Python: lists, math.exp, one position at a time."""
    n, d = len(q), len(q[0])
    out, running = [], [0.0] * d
    for t in range(n):
        keys = [s for s in range(n) if not (s > t or t - s >= w)]
        scores = {s: sum(q[t][a] * k[s][a] for a in range(d)) / math.sqrt(d) for s in keys}
        top = max(scores.values(), default=0.0)
        total = sum(math.exp(x - top) for x in scores.values())
        row = [sum(math.exp(scores[s] - top) / total * v[s][a] for s in keys) for a in range(d)]
        running = [r + x for r, x in zip(running, row)]
        out.append(running)
    return out


def test_the_oracle_equals_plain_loops():
    spec = indexattn.compile_spec(ATTENTION, name="loops")
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 3, dtype=torch.float64) for _ in range(3))
    (got,) = evaluate(spec.ir, Q=q, K=k, V=v, w=2)
    want = torch.tensor(loops(q.tolist(), k.tolist(), v.tolist(), 2), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_twin_another_window_differs_from_the_loops():
    spec = indexattn.compile_spec(ATTENTION, name="loops")
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 3, dtype=torch.float64) for _ in range(3))
    (got,) = evaluate(spec.ir, Q=q, K=k, V=v, w=3)
    want = torch.tensor(loops(q.tolist(), k.tolist(), v.tolist(), 2), dtype=torch.float64)
    assert not torch.allclose(got, want)
