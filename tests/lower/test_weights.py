"""Softmax weights times the values outside the kernel, as one autograd step
(lower/program/passes/softmax_values.py): where a spec returns its weights, `softmax_values`
computes them and their product with V, and its backward makes the scores' gradient in place. Each
phrasing equals the literal interpreter in values and in gradients (through the product alone,
the weights alone, or both) and draws F.dropout's masks in train mode; near misses that would
compute something else if fused keep autograd's own steps; where the step cannot run
(torch.func, autocast, a second derivative) the plain steps run or an error says so."""

import itertools

import pytest
import torch

import indexattn
from indexattn.lower.program.steps import SoftmaxValues
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments

FRESH = itertools.count()


def spec_text(equations: str, queries: str = "Q_<τa>", values: str = "V_<τa>") -> str:
    return f"""index τ, τ' : N
index a : d
index B : 2
input {queries}
input K_<τa>
input {values}
scalar p = 0.25
M_<ττ'> = where(τ' > τ, -inf, 0)
{equations}
"""


SCORES = "S_<ττ'> = Q_<τa> K_<τ'a>\n"
CORE = "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nO_<τa> = A_<ττ'> V_<τ'a>\n"
TWIN = CORE.replace("A_", "W_").replace("O_", "P_").replace("S_", "T_")
DROPPED = "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nD_<ττ'> = dropout(A_<ττ'>, p)\nO_<τa> = D_<ττ'> V_<τ'a>"
CASES = {
    # the spec, and the fused steps of its program (none: autograd's own steps)
    "returned": (spec_text(SCORES + CORE + "output O, A"), ["plain"]),
    "masked": (
        spec_text(SCORES + CORE.replace("(S_<ττ'>)", "(S_<ττ'> + M_<ττ'>)") + "output O, A"),
        ["safe"],
    ),
    "dropout": (
        spec_text(SCORES + DROPPED + "\noutput O, D"),
        ["dropout"],
    ),
    "two cores": (
        spec_text(SCORES + CORE + "T_<ττ'> = K_<τa> Q_<τ'a>\n" + TWIN + "output O, A, P, W"),
        ["plain", "plain"],
    ),
    # near misses, each wrong if fused: the softmax over the queries; values that carry the
    # query; one head of the weights (a literal) into the dropout
    "over the queries": (spec_text(SCORES + CORE.replace("_<τ'>(", "_<τ>(") + "output O, A"), []),
    "values with the query": (
        spec_text(
            SCORES + "A_<ττ'> = softmax_<τ'>(S_<ττ'>)\nO_<τa> = A_<ττ'> V_<ττ'a>\noutput O, A",
            values="V_<ττ'a>",
        ),
        [],
    ),
    "one head dropped": (
        spec_text(
            "S_<Bττ'> = Q_<Bτa> K_<τ'a>\nA_<Bττ'> = softmax_<τ'>(S_<Bττ'>)\n"
            "D_<ττ'> = dropout(A_<1ττ'>, p)\nO_<τa> = D_<ττ'> V_<τ'a>\noutput O, D",
            queries="Q_<Bτa>",
        ),
        [],
    ),
}


def fused(spec) -> list[str]:
    """The program's softmax-times-values steps: "dropout", "safe" (rows that are -inf
    everywhere give 0) or "plain"."""
    steps = [s for s in spec.program.steps if isinstance(s, SoftmaxValues)]
    return ["dropout" if s.dropout is not None else "safe" if s.safe else "plain" for s in steps]


def compiled(name: str):
    return indexattn.compile_spec(CASES[name][0], name=f"weights_{next(FRESH)}")


def inputs(spec, n: int = 6) -> dict[str, torch.Tensor]:
    values = sample_arguments(spec.ir, {"N": n, "d": 4}, (2,), torch.float64, seed=0)
    return {name: value.requires_grad_() for name, value in values.items()}


def outputs_and_grads(outs, x, cotangents):
    loss = sum((o * c).sum() for o, c in zip(outs, cotangents) if c is not None)
    return [*outs, *torch.autograd.grad(loss, list(x.values()), materialize_grads=True)]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("through", ["first", "last", "all"])
def test_values_and_gradients_equal_the_literal(name, through):
    spec = compiled(name)
    assert fused(spec) == CASES[name][1]
    x = inputs(spec)
    got, want = spec(**x), reference.evaluate(spec.ir, **x)
    used = {"first": [0], "last": [len(got) - 1], "all": range(len(got))}[through]
    cotangents = [torch.randn_like(o) if k in used else None for k, o in enumerate(want)]
    for g, w in zip(*(outputs_and_grads(o, x, cotangents) for o in (got, want)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_train_mode_draws_the_masks_of_f_dropout():
    """The same seed, the same dropped weights as the interpreter's F.dropout, and the same
    gradients of Q, K and V; the twin: a second draw drops others. p = 1 drops everything."""
    spec = compiled("dropout")
    every = indexattn.compile_spec(
        CASES["dropout"][0].replace("scalar p = 0.25", "scalar p = 1"), name="weights_p1"
    )
    runs = []
    for seed, chosen in ((1, spec), (1, spec), (2, spec), (1, every)):
        x = inputs(chosen, n=16)
        results = []
        for literal in (False, True):
            torch.manual_seed(seed)
            run = (lambda **k: reference.evaluate(chosen.ir, **k)) if literal else chosen  # noqa: B023
            outs = run(**x, training=True)
            results.append(outputs_and_grads(outs, x, [torch.ones_like(o) for o in outs]))
        for g, w in zip(*results, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
        runs.append(results[0][1])
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert not runs[3].any()


def test_the_autograd_step_runs_only_where_gradients_are_needed():
    """With inputs that require grad, the weights come from the one autograd step; without
    gradients, or with inputs that do not require them, from the plain steps: all equal the
    literal interpreter."""
    spec = compiled("returned")
    x = inputs(spec)
    runs = {"grad": spec(**x)[1]}
    with torch.no_grad():
        runs["no_grad"] = spec(**x)[1]
    runs["detached"] = spec(**{k: v.detach() for k, v in x.items()})[1]
    assert type(runs["grad"].grad_fn).__name__ == "SoftmaxValuesBackward"
    assert runs["no_grad"].grad_fn is None and runs["detached"].grad_fn is None
    want = reference.evaluate(spec.ir, **x)[1]
    for got in runs.values():
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_torch_func_and_autocast_take_the_plain_steps():
    """torch.func.grad (whose inputs require grad) and vmap differentiate and batch the plain
    steps; under autocast the plain steps run (the step's backward would mix dtypes)."""
    spec = compiled("masked")
    x = inputs(spec)
    q, k, v = (t.detach() for t in x.values())

    def loss(q):
        out, weights = spec(Q=q, K=k, V=v)
        return out.sum() + (weights * weights).sum()

    want = torch.autograd.grad(loss(x["Q"]), x["Q"])[0]
    torch.testing.assert_close(torch.func.grad(loss)(q), want, rtol=0, atol=1e-12)
    batched = torch.func.vmap(lambda q, k, v: spec(Q=q, K=k, V=v)[0])(q, k, v)
    torch.testing.assert_close(batched, spec(Q=q, K=k, V=v)[0], rtol=0, atol=1e-12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, weights = spec(**{n: t.float() for n, t in x.items()})
    assert weights.grad_fn is not None and type(weights.grad_fn).__name__ != "SoftmaxValuesBackward"


def test_a_second_derivative_is_refused_not_wrong():
    """The backward works in place: create_graph raises and names the way that works,
    torch.func, whose hessian equals the plain steps' (the twin: the interpreter's)."""
    spec = compiled("dropout")
    x = inputs(spec)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(spec(**x)[0].sum(), x["Q"], create_graph=True)
    q, k, v = (t.detach() for t in x.values())
    hessians = [
        torch.func.hessian(lambda q: run(Q=q, K=k, V=v)[0].sum())(q)  # noqa: B023
        for run in (spec, lambda **a: reference.evaluate(spec.ir, **a))
    ]
    torch.testing.assert_close(*hessians, rtol=0, atol=1e-10)
    assert hessians[0].abs().max() > 0


def test_a_row_hidden_everywhere_gives_zeros_and_the_literal_gradients():
    """The safe softmax through the autograd step: a row whose keys are all hidden is zeros,
    not NaN, and its gradients are the interpreter's."""
    text = CASES["masked"][0].replace("where(τ' > τ, -inf, 0)", "where(τ' > τ or τ == 0, -inf, 0)")
    spec = indexattn.compile_spec(text, name="weights_dead")
    assert "softmax_values(" in spec.source
    x = inputs(spec)
    got, want = spec(**x), reference.evaluate(spec.ir, **x)
    assert not got[1][:, 0].any()
    cotangents = [torch.randn_like(o) for o in want]
    for g, w in zip(*(outputs_and_grads(o, x, cotangents) for o in (got, want)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
