"""Scores by blocks of queries skip the keys a mask hides from a whole block only where the
rows' steps prove those keys add nothing (lower/program/passes/spans.py): a mask of -inf added
before a softmax, an exp or a sigmoid over the keys, or a `where` that puts 0 at the hidden entries.
Each phrasing below is compiled with a sliding window and run in blocks of two queries; it
equals the literal interpreter in values and gradients whether it skips keys or not, and it
skips them exactly where the proof holds (tanh(-inf) is -1, not 0: those keys count; 0 times
-inf is NaN, which the rows must make as the interpreter does; torch's rsqrt(-inf) is NaN and
sqrt's derivative at 0 infinite, whatever sympy says; a mask or score read transposed hides
other entries). The cases that must not skip each fail, in values or gradients, if they do."""

import itertools

import pytest
import torch

import indexattn
from indexattn.lower.program.passes import spans
from indexattn.oracle import reference
from indexattn.runtime import lib as rt

FRESH = itertools.count()
HEAD = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
param g_<a>  # a width of its own: the sequence is the one index no parameter has
scalar w = 3
M_<ττ'> = where(τ' > τ or τ - τ' >= w, -inf, 0)
S_<ττ'> = Q_<τa> g_<a> K_<τ'a>
"""
WHERE_SQRT = "where(τ' > τ or τ - τ' >= w, 0, sqrt(sigmoid(S_<ττ'> + M_<ττ'>)))"
WEIGHTS = {
    # the weights at each key, and whether the keys the mask hides from a block are skipped
    "softmax_<τ'>(4 tanh(S_<ττ'> / 4) + M_<ττ'>)": True,
    "sigmoid(S_<ττ'> + M_<ττ'>)": True,
    "exp(S_<ττ'> + M_<ττ'>) / 3": True,
    "where(τ' > τ or τ - τ' >= w, 0, sigmoid(S_<ττ'>))": True,
    "where(τ' <= τ and τ - τ' < w, sigmoid(S_<ττ'>), 0)": True,
    "tanh(S_<ττ'> + M_<ττ'>)": False,
    "softmax_<τ'>(4 tanh(S_<ττ'> / 4) + M_<ττ'>) + 1": False,
    "where(τ' > τ or τ - τ' >= w, 1, sigmoid(S_<ττ'>))": False,
    # 0 · -inf at hidden keys: NaN over all keys (so here, as in the literal interpreter)
    "sigmoid(S_<ττ'> + M_<ττ'>) (M_<ττ'> + 1)": False,
    # the same with S · -inf (±inf, not a finite number) an equation of its own
    "T_<ττ'> = S_<ττ'> M_<ττ'>\nsigmoid(S_<ττ'> + M_<ττ'>) T_<ττ'>": False,
    # rsqrt(-inf) is NaN in torch (sympy's 1/sqrt(-oo) is 0): the code's values count
    "rsqrt(exp(S_<ττ'>) + M_<ττ'>)": False,
    # sqrt(0) is 0, but its derivative is inf: the gradients are NaN over all keys
    "sqrt(sigmoid(S_<ττ'> + M_<ττ'>))": False,
    "sqrt(sigmoid(S_<ττ'> + M_<ττ'>) + 1)": False,
    # the mask read the other way round hides other entries
    "sigmoid(S_<ττ'> + M_<ττ'>) + sigmoid(S_<ττ'> + M_<τ'τ>)": False,
    "T_<ττ'> = S_<ττ'> + M_<ττ'>\nsigmoid(T_<ττ'>) + 0 sigmoid(T_<τ'τ>)": False,
    "T_<ττ'> = S_<ττ'> + M_<ττ'>\nsigmoid(T_<ττ'>)": True,
    # where on another mask picks either branch: a finite number or 0, finite
    "where(τ' > τ, 0, sigmoid(S_<ττ'> + M_<ττ'>))": True,
    "where(τ' > τ, -inf, sigmoid(S_<ττ'> + M_<ττ'>))": False,
    # the branch the mask drops: sqrt reads 1 there (lower/program/numerics.py, guarded), so its
    # gradient is 0, not 0 times sqrt's infinite derivative; the pass does not prove it
    WHERE_SQRT: False,
    # a decay, RetNet's, as a mask that multiplies: 0 where hidden, the exponent a polynomial
    # of positions (finite everywhere); or a factor of 0s and 1s times the decay
    "where(τ' > τ or τ - τ' >= w, 0, exp((τ' - τ) / 4)) S_<ττ'>": True,
    "C_<ττ'> = where(τ' > τ or τ - τ' >= w, 0, 1)\nC_<ττ'> exp((τ' - τ) / 4) S_<ττ'>": True,
    # the twin: not 0 where hidden, so the keys count
    "C_<ττ'> = where(τ' > τ or τ - τ' >= w, 0, 1)\n(C_<ττ'> + S_<ττ'>) exp((τ' - τ) / 4)": False,
}


def spec_text(weights: str) -> str:
    """The spec whose attention weights are `weights` (its last line; equations before)."""
    *before, last = weights.split("\n")
    equations = "".join(line + "\n" for line in before)
    return HEAD + equations + f"A_<ττ'> = {last}\nO_<τa> = A_<ττ'> V_<τ'a>\noutput O\n"


def compiled(weights: str, monkeypatch):
    spec = indexattn.compile_spec(spec_text(weights), name=f"hidden_{next(FRESH)}")
    monkeypatch.setattr(rt, "QUERY_BLOCK", 2)
    return spec


@pytest.mark.parametrize("weights", WEIGHTS)
def test_keys_are_skipped_where_they_add_nothing(weights, monkeypatch):
    spec = compiled(weights, monkeypatch)
    assert ("key_spans(" in spec.source) == WEIGHTS[weights]
    q, k, v = (torch.randn(10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = torch.rand(4, dtype=torch.float64, requires_grad=True)
    got = spec(Q=q, K=k, V=v, g=g)
    want = reference.evaluate(spec.ir, Q=q, K=k, V=v, g=g)[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0, equal_nan=True)
    grads = [torch.autograd.grad(o.sum(), (q, k, v, g)) for o in (got, want)]
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0, equal_nan=True)


def test_the_rows_run_once_per_block_of_queries(monkeypatch):
    """Five blocks of two queries: the first over its two keys, the others over four (a
    window of 3 reaches two keys back from the block's first query)."""
    spec = compiled("sigmoid(S_<ττ'> + M_<ττ'>)", monkeypatch)
    namespace = spec.function.__globals__
    rows = namespace[spec.function.__name__ + "_rows"]
    seen = []

    def record(*args):
        seen.append(tuple(tuple(a.shape) for a in args))
        return rows(*args)

    monkeypatch.setitem(namespace, rows.__name__, record)
    spec(**{name: torch.randn(10, 4) for name in "QKV"}, g=torch.rand(4))
    # K and V over the block's keys, the queries and the mask over its two rows
    first = sorted([(2, 4), (2, 4), (2, 2), (2, 4)])
    assert [sorted(shapes) for shapes in seen] == [first] + [
        sorted([(4, 4), (2, 4), (2, 4), (4, 4)])
    ] * 4


# the cases that read the mask or a score transposed: forced, no spans, or slices that do
# not fit
TRANSPOSED = {w for w in WEIGHTS if "<τ'τ>" in w}


# where evaluates a branch's sqrt only where chosen: skipping what it drops changes nothing
# (tests/oracle/test_hostile_numbers.py has the NaN this case was for)
SAFE_TO_FORCE = {WHERE_SQRT}


@pytest.mark.parametrize(
    "weights", [w for w, skips in WEIGHTS.items() if not skips and w not in SAFE_TO_FORCE]
)
def test_each_case_that_must_not_skip_differs_when_forced_to(weights, monkeypatch):
    """The rule's twin: with a pass that proves anything (and no disk cache to keep what it
    makes), each case that must go over every key skips keys, and then differs from the
    literal interpreter, in values or in gradients."""
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    monkeypatch.setattr(spans.Proof, "proves", lambda self, steps: True)
    spec = compiled(weights, monkeypatch)
    q, k, v = (torch.randn(10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = torch.rand(4, dtype=torch.float64, requires_grad=True)
    if weights in TRANSPOSED:
        if "key_spans(" in spec.source:
            with pytest.raises(RuntimeError, match="must match"):
                spec(Q=q, K=k, V=v, g=g)
        return
    assert "key_spans(" in spec.source
    runs = [spec(Q=q, K=k, V=v, g=g), reference.evaluate(spec.ir, Q=q, K=k, V=v, g=g)[0]]
    grads = [torch.autograd.grad(o.sum(), (q, k, v, g)) for o in runs]
    pairs = zip([runs[0], *grads[0]], [runs[1], *grads[1]], strict=True)
    assert not all(torch.allclose(a, b, atol=1e-12, rtol=0, equal_nan=True) for a, b in pairs)
