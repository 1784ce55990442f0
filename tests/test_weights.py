"""Returned softmax weights times the values, as one autograd step (lower/weights.py): where
a spec returns its weights, `softmax_values` computes them and their product with V, and its
backward makes the scores' gradient in place. Each phrasing equals the literal interpreter in
values and in gradients (through the product alone, the weights alone, or both), draws
F.dropout's masks in train mode, and a near miss keeps autograd's own steps, as exact."""

import itertools

import pytest
import torch

import indexattn
from indexattn.oracle import reference

FRESH = itertools.count()
HEAD = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
scalar p = 0.25
M_<ττ'> = where(τ' > τ, -inf, 0)
S_<ττ'> = Q_<τa> K_<τ'a>
"""
CASES = {
    # equations after the scores, and the helper the module calls (None: autograd's steps)
    "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nO_<τa> = A_<ττ'> V_<τ'a>\noutput O, A": "softmax_values(",
    "A_<ττ'> = softmax_<τ'>(S_<ττ'> + M_<ττ'>)\nO_<τa> = A_<ττ'> V_<τ'a>\noutput O, A": (
        "softmax_values(A_sum, V, safe=True)"
    ),
    "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nD_<ττ'> = dropout(A_<ττ'>, p)\nO_<τa> = D_<ττ'> V_<τ'a>\n"
    "output O, D": "softmax_dropout_values(S, V, p=p, training=training)",
    # near misses: the softmax over the queries; the weights read by a second product
    "A_<ττ'> = softmax_<τ>(S_<ττ'>)\nO_<τa> = A_<ττ'> V_<τ'a>\noutput O, A": None,
    "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nO_<τa> = A_<ττ'> V_<τ'a>\nR_<τa> = A_<ττ'> K_<τ'a>\n"
    "output O, R, A": None,
}


def compiled(equations: str):
    return indexattn.compile_spec(HEAD + equations + "\n", name=f"weights_{next(FRESH)}")


def inputs(n: int = 6, d: int = 4) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {x: torch.randn(2, n, d, dtype=torch.float64, requires_grad=True) for x in "QKV"}


def helpers(spec) -> set[str]:
    return {n for n in ("softmax_values", "softmax_dropout_values") if f"def {n}(" in spec.source}


@pytest.mark.parametrize("equations", CASES)
@pytest.mark.parametrize("through", ["product", "weights", "both"])
def test_values_and_gradients_equal_the_literal(equations, through):
    spec = compiled(equations)
    helper = CASES[equations]
    assert helper in spec.source if helper else not helpers(spec)
    x = inputs()
    got, want = spec(**x), reference.evaluate(spec.ir, **x)
    used = {"product": [0], "weights": [len(got) - 1], "both": range(len(got))}[through]
    cotangents = [torch.randn_like(got[k]) for k in used]
    grads = []
    for outs in (got, want):
        torch.testing.assert_close(outs[0], want[0], rtol=0, atol=1e-12)
        loss = sum((outs[k] * c).sum() for k, c in zip(used, cotangents))
        grads.append(torch.autograd.grad(loss, list(x.values()), materialize_grads=True))
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_train_mode_draws_the_masks_of_f_dropout():
    """The same seed, the same dropped weights as the interpreter's F.dropout; the twin: a
    second draw drops others."""
    equations = next(e for e, h in CASES.items() if h and "dropout" in h)
    spec, x = compiled(equations), inputs(n=16)
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        got = spec(**x, training=True)
        torch.manual_seed(seed)
        want = reference.evaluate(spec.ir, training=True, **x)
        grads = [torch.autograd.grad(sum(o.sum() for o in r), x["Q"]) for r in (got, want)]
        for g, w in zip([*got, *grads[0]], [*want, *grads[1]], strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
        runs.append(got[1])
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_the_autograd_step_runs_only_where_gradients_are_needed():
    """With inputs that require grad, the weights come from the one autograd step; without
    gradients, from the plain steps (the weights written over the scores): both equal the
    literal interpreter."""
    spec = compiled(next(iter(CASES)))
    x = inputs()
    _, weights = spec(**x)
    assert type(weights.grad_fn).__name__ == "SoftmaxValuesBackward"
    with torch.no_grad():
        _, plain = spec(**x)
    assert plain.grad_fn is None
    want = reference.evaluate(spec.ir, **x)[1]
    for got in (weights, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_row_hidden_everywhere_gives_zeros_and_finite_gradients():
    """The safe softmax through the autograd step: a row whose keys are all hidden is zeros,
    not NaN, and its gradients are finite."""
    text = HEAD.replace("where(τ' > τ, -inf, 0)", "where(τ' > τ or τ == 0, -inf, 0)")
    safe = next(e for e, h in CASES.items() if h and "safe" in h)
    spec = indexattn.compile_spec(text + safe, name="weights_dead")
    x = inputs()
    out, weights = spec(**x)
    assert torch.equal(weights[:, 0], torch.zeros_like(weights[:, 0]))
    grads = torch.autograd.grad(out.sum() + weights.sum(), list(x.values()))
    assert all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out, reference.evaluate(spec.ir, **x)[0], rtol=0, atol=1e-12)
