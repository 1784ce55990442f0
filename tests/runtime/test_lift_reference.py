"""indexattn.lift of the hand-written reference modules (tests/reference/, the modules the
shipped specs are checked against): each lifted spec equals its module in float64, values and
gradients of every input and weight, at two sequence lengths other than the example's; a twin
perturbs one weight and sees it."""

import copy

import pytest
import torch
from reference import cases, modern_a, modern_b

import indexattn
from indexattn.lifting.check import Float64, _resized

pytestmark = pytest.mark.slow  # torch.export of each module

ALL = cases.CASES + cases.SDPA_CASES + modern_a.MODERN_A_CASES + modern_b.MODERN_B_CASES
LIFTED = [
    "simple",
    "single_head",
    "causal_head",
    "mha_separate",
    "mha_math",
    "gpt2",
    "concat_heads_proj",
    "sdpa",
    "cross",
    "sliding_window",
    "mqa",
    "gqa",
    "softcap_window",
    "prefix_lm",
    "gated_output",
]
CASES = {f"{c.spec}-{type(c.build(c.sizes)).__name__}": c for c in ALL if c.spec in LIFTED}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):
    case = CASES[request.param]
    torch.manual_seed(0)
    module = case.build(case.sizes).eval()
    example = [v.float() if v.is_floating_point() else v for v in case.inputs(case.sizes).values()]
    lifted = indexattn.lift(module, *example)
    return module.double(), lifted.double(), example


def run(module, inputs):
    inputs = [x.clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
    with Float64():
        out = module(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        sum(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view(y.shape).mul(y).sum()
            for y in outs).backward()  # fmt: skip
    return [y.detach() for y in outs], [x.grad for x in inputs if x.is_floating_point()]


@pytest.mark.parametrize("n", [4, 9])
def test_lifted_reference_module_equals_it(pair, n):
    module, lifted, example = pair
    gen = torch.Generator().manual_seed(n)
    inputs = [_resized(x, n, gen) for x in example]
    module.zero_grad(), lifted.zero_grad()
    (want, dx_want), (got, dx) = run(module, inputs), run(lifted, inputs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dx, dx_want, rtol=1e-10, atol=1e-10)
    params, originals = dict(lifted.layer.named_parameters()), dict(module.named_parameters())
    for spec_name, target in lifted.weights.items():
        if spec_name in params and target in originals:
            torch.testing.assert_close(params[spec_name].grad, originals[target].grad)


def test_twin_one_perturbed_weight_is_seen(pair):
    module, lifted, example = pair
    if not list(module.parameters()):
        pytest.skip("a module of no weights (sdpa, simple)")
    inputs = [_resized(x, 5, torch.Generator().manual_seed(5)) for x in example]
    other = copy.deepcopy(module)
    with torch.no_grad():
        next(iter(other.parameters())).view(-1)[0] += 0.5
    assert not torch.allclose(run(lifted, inputs)[0][0], run(other, inputs)[0][0])
