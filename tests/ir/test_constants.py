"""Constants of the language: π, scalars given as constant expressions (`2 π`, `inf`),
index-free tensors (`m_<> = 0.1 log(N) + 1`), each against numbers computed by hand and
against the literal interpreter, with a twin that changes one thing. Generated code runs
without a warning."""

import math

import pytest
import torch

import indexattn
from indexattn.oracle.verify import compare

pytestmark = pytest.mark.filterwarnings("error")

HEAD = "index τ, τ' : N\nindex a : d\ninput X_<τa>\n"
X = torch.randn(2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
POSITIONS = torch.arange(6, dtype=torch.float64)[:, None]


def spec(body: str, name: str = "constants"):
    return indexattn.compile_spec(HEAD + body + "\n", name=name)


@pytest.mark.parametrize("pi", ["π", "pi", "\\pi"])
def test_pi_is_the_constant(pi):
    compiled = spec(f"Y_<τa> = cos(2 {pi} τ / N) X_<τa>")
    want = torch.cos(2 * math.pi * POSITIONS / 6) * X
    torch.testing.assert_close(compiled(X=X), want, rtol=0, atol=1e-14)
    assert compare(compiled).ok and "\\pi" in compiled.latex()
    twin = torch.cos(math.pi * POSITIONS / 6) * X  # π, not 2π
    assert (compiled(X=X) - twin).abs().max() > 0.1


def test_a_declared_pi_is_the_declaration():
    compiled = spec("scalar pi = 3\nY_<τa> = pi X_<τa>")
    torch.testing.assert_close(compiled(X=X), 3 * X, rtol=0, atol=0)
    assert (compiled(X=X) - math.pi * X).abs().max() > 0.1


def test_a_scalar_is_a_constant_expression_folded_once():
    compiled = spec("scalar tp = 2 π\nscalar s = 1 / sqrt(2)\nY_<τa> = tp s X_<τa>")
    assert dict(compiled.plain.scalars) == {"tp": 2 * math.pi, "s": math.sqrt(2) / 2}
    torch.testing.assert_close(compiled(X=X), 2 * math.pi / math.sqrt(2) * X)
    torch.testing.assert_close(compiled(X=X, tp=1.0), X / math.sqrt(2))  # a call sets it
    assert compiled.module(d=3).scalars == {"tp": 2 * math.pi, "s": math.sqrt(2) / 2}


def test_an_infinite_window_hides_nothing_until_it_is_set():
    compiled = spec(
        "scalar w = inf\n"
        "S_<ττ'> = X_<τa> X_<τ'a> + where(τ - τ' >= w or τ' > τ, -inf, 0)\n"
        "Y_<τa> = softmax_<τ'>(S_<ττ'>) X_<τ'a>"
    )
    assert "w=math.inf" in compiled.source
    causal = torch.full((6, 6), -math.inf, dtype=torch.float64).triu(1)
    want = torch.softmax(X @ X.transpose(-1, -2) + causal, -1) @ X
    torch.testing.assert_close(compiled(X=X), want)
    assert (compiled(X=X, w=2.0) - want).abs().max() > 1e-3  # a window of 2 differs
    assert compare(compiled).ok


def test_an_index_free_tensor_of_a_sizes_log_needs_no_copy_of_a_tensor():
    compiled = spec("m_<> = 0.1 log(N) + 1\nY_<τa> = m_<> X_<τa>")
    torch.testing.assert_close(compiled(X=X), (0.1 * math.log(6) + 1) * X)
    assert compare(compiled).ok and "torch.tensor(" not in compiled.source
    other = spec("m_<> = 0.2 log(N) + 1\nY_<τa> = m_<> X_<τa>", name="twin")
    assert (other(X=X) - compiled(X=X)).abs().max() > 0.05


def test_logsigmoid_is_stable_where_its_definition_overflows():
    compiled = spec("Y_<τa> = logsigmoid(X_<τa>)")
    x = torch.tensor([[-1000.0, -1.0, 0.0, 30.0]], dtype=torch.float64).T
    got = compiled(X=x)
    want = [[-1000.0, -math.log1p(math.e), -math.log(2), -math.log1p(math.exp(-30))]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64).T, rtol=1e-12, atol=0)
    assert torch.isinf(-torch.log1p(torch.exp(-x[0]))).all()  # what the plain formula gives
