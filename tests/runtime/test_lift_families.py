"""indexattn.lift of transformers' attention layers (tests/lift_families.py), called as their
model calls them: `lift(layer, x, position_embeddings=rotary, attention_mask=mask_function)`.
Each lifted spec equals its layer in float64 (values, gradients of the input and of every
weight) at two sequence lengths other than the example's, the mask function lifted as a
predicate; twins perturb one weight, and the mask (a later token, one outside the window);
for the families with a shipped spec, the lifted spec computes what the shipped one does;
the families the lifter cannot read are refused by op, graph node and source line."""

import copy

import pytest
import torch
from lift_families import FAMILIES, REFUSED, WIDTH, WINDOW, build, family

import indexattn
from indexattn.lifting import LiftError
from indexattn.lifting.calls import Call
from indexattn.lifting.check import Float64

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # torch.export of each layer: 3 to 10 s each

SHIPPED = {  # family -> specs/models/ (Gemma2's layer 0 is a sliding one)
    "llama": "llama3",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "gpt_neox": "gpt_neox",
    "gemma2": "gemma2_sliding",
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request):
    """(name, the layer as lift called it, in float64, the lifted module in float64)."""
    torch.manual_seed(0)
    layer, keywords = family(request.param)
    randomise(layer)
    lifted = indexattn.lift(layer, torch.randn(2, 6, WIDTH), **keywords)
    return request.param, Call(layer, keywords).double(), lifted.double()


def randomise(layer):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def run(module, x):
    x = x.clone().requires_grad_()
    with Float64():  # transformers' float32 rotary tables and eager softmax kept in float64
        y = module(x)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view(y.shape))
    return y.detach(), x.grad


def inputs(n, seed=None):
    gen = torch.Generator().manual_seed(n if seed is None else seed)
    return torch.randn(2, n, WIDTH, dtype=torch.float64, generator=gen)


@pytest.mark.parametrize("n", [4, 9])
def test_lifted_layer_equals_transformers_in_values_and_gradients(pair, n):
    name, module, lifted = pair
    module.zero_grad(), lifted.zero_grad()
    want, dx_want = run(module, inputs(n))
    got, dx = run(lifted, inputs(n))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dx, dx_want, rtol=1e-10, atol=1e-10)
    params, originals = dict(lifted.layer.named_parameters()), dict(module.layer.named_parameters())
    compared = [s for s in lifted.weights if s in params]
    assert len(compared) == len(originals), name  # every weight of the layer is a param
    for spec_name in compared:
        want_grad = originals[lifted.weights[spec_name]].grad
        torch.testing.assert_close(params[spec_name].grad, want_grad, rtol=1e-10, atol=1e-10)


def test_twin_one_perturbed_weight_is_seen(pair):
    _name, module, lifted = pair
    other = copy.deepcopy(module)
    with torch.no_grad():
        next(iter(other.parameters())).view(-1)[0] += 0.5
    x = inputs(5)
    assert not torch.allclose(run(lifted, x)[0], run(other, x)[0])
    torch.testing.assert_close(run(lifted, x)[0], run(module, x)[0])


def test_twin_the_mask_predicate_is_the_layers(pair):
    """The last token changed: causal, the earlier outputs stay; a token WINDOW back changed:
    a windowed layer's last output stays, a full one's moves."""
    name, module, lifted = pair
    x = inputs(7)
    later, early = x.clone(), x.clone()
    later[:, -1] += 1.0
    early[:, -1 - WINDOW] += 1.0
    assert torch.allclose(run(lifted, x)[0][:, :-1], run(lifted, later)[0][:, :-1])
    windowed = "sliding_window" in FAMILIES[name][2]
    last = [run(lifted, t)[0][:, -1] for t in (x, early)]
    assert torch.allclose(*last) == windowed, name
    torch.testing.assert_close(run(lifted, early)[0], run(module, early)[0])


@pytest.mark.parametrize("name", list(SHIPPED))
def test_lifted_spec_computes_what_the_shipped_spec_computes(name):
    from models_common import causal_mask, shifted
    from models_common import spec as shipped_spec

    from indexattn.transformers import from_transformers

    layer, keywords = family(name)
    randomise(layer)
    lifted = indexattn.lift(layer, torch.randn(2, 6, WIDTH), **keywords).double()
    shipped = from_transformers(layer.double(), shipped_spec(SHIPPED[name]))
    x, n = inputs(8), 8
    positions = shifted(n)[:1].expand(2, n)  # 0..n-1, as lift's positions
    want = shipped(x, positions, causal_mask(n, {})[:, 0])
    torch.testing.assert_close(lifted(x), want[0] if isinstance(want, tuple) else want)
    torch.testing.assert_close(lifted(x), run(lifted, x)[0])
    padded = shipped(x, positions, causal_mask(n, {1: 4})[:, 0])  # twin: key 4 of batch 1 hidden
    padded = padded[0] if isinstance(padded, tuple) else padded
    assert not torch.allclose(lifted(x)[1], padded[1])
    torch.testing.assert_close(lifted(x)[0], padded[0])


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_be_lifted_is_named_with_its_line(name):
    module, stem, fields, op = REFUSED[name]
    layer, keywords = build(module, stem, fields)
    with pytest.raises(LiftError) as caught:
        indexattn.lift(layer, torch.randn(2, 6, WIDTH), **keywords)
    message = str(caught.value)
    assert f"cannot lift {op}" in message and "(graph node " in message
    assert f"modeling_{module}.py" in message or "pytorch_utils.py" in message


def test_a_keyword_that_is_a_tensor_is_refused_with_what_to_write():
    layer, _ = family("llama")
    with pytest.raises(LiftError, match=r"position_embeddings=model\.rotary_emb"):
        indexattn.lift(layer, torch.randn(2, 6, WIDTH), attention_mask=torch.zeros(6, 6))
