"""indexattn.lift: hand-written attention modules lifted to specs that equal them in float64,
values and gradients (inputs and weights), at sequence lengths other than the example's; each
equality with a twin that perturbs one weight or the mask and sees the difference; what cannot
be lifted named by op, graph node and source line."""

import copy

import pytest
import torch
from lift_modules import CausalSelfAttention, MultiHead, RotaryGQA, SelfMHA
from torch import nn

import indexattn
from indexattn.lifting import LiftError

pytestmark = pytest.mark.slow  # torch.export of each module

MODULES = {
    "nanogpt": (lambda: CausalSelfAttention(flash=False), 16),
    "nanogpt_flash": (lambda: CausalSelfAttention(flash=True), 16),
    "torch_mha": (SelfMHA, 12),
    "heads": (MultiHead, 12),
    "rotary_gqa": (RotaryGQA, 16),
}


def lifted_pair(name, seed=0):
    make, width = MODULES[name]
    torch.manual_seed(seed)
    module = make().eval()
    lifted = indexattn.lift(module, torch.randn(2, 6, width))
    return module.double(), lifted.double(), width


def run(module, x):
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view(y.shape))
    return y.detach(), x.grad


@pytest.fixture(scope="module", params=list(MODULES))
def pair(request):
    return request.param, *lifted_pair(request.param)


@pytest.mark.parametrize("n", [3, 11])
def test_lifted_equals_module_in_values_and_gradients(pair, n):
    name, module, lifted, width = pair
    module.zero_grad(), lifted.zero_grad()
    x = torch.randn(3, n, width, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    want, dx_want = run(module, x)
    got, dx = run(lifted, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dx, dx_want, rtol=1e-10, atol=1e-10)
    params = dict(lifted.layer.named_parameters())
    originals = dict(module.named_parameters())
    assert params, name
    for spec_name, target in lifted.weights.items():
        if spec_name in params:
            torch.testing.assert_close(params[spec_name].grad, originals[target].grad)


def test_twin_one_weight_perturbed_is_seen(pair):
    _name, module, lifted, width = pair
    x = torch.randn(2, 5, width, dtype=torch.float64)
    other = copy.deepcopy(module)
    first = next(iter(other.parameters()))
    with torch.no_grad():
        first.view(-1)[0] += 0.5
    assert not torch.allclose(lifted(x), other(x))
    torch.testing.assert_close(lifted(x), module(x))


def test_twin_the_causal_mask_matters():
    # a later token changed: the causal lift keeps the earlier outputs, the plain heads do not
    for name, causal in (("nanogpt", True), ("rotary_gqa", True), ("heads", False)):
        module, lifted, width = lifted_pair(name)
        x = torch.randn(1, 7, width, dtype=torch.float64)
        later = x.clone()
        later[:, -1] += 1.0
        same = torch.allclose(lifted(x)[:, :-1], lifted(later)[:, :-1])
        assert same == causal, name
        torch.testing.assert_close(lifted(later), module(later))


def test_lifted_spec_reads_like_the_shipped_mha():
    _, lifted, _ = lifted_pair("nanogpt_flash")
    text = lifted.spec_text
    assert "Q_<μτa> = c_attn_weight_<(0μa)i> X_<τi> + c_attn_bias_<(0μa)>" in text
    assert "softmax_<τ'>(S_<μττ'> / sqrt(d_k) + where(τ' > τ, -inf, 0))" in text
    assert lifted.spec.ir.tensors  # the compiled spec: LaTeX, counts, as any spec
    assert "softmax" in lifted.spec.latex()


def test_rotary_lifts_to_halves_and_positions():
    _, lifted, _ = lifted_pair("rotary_gqa")
    text = lifted.spec_text
    assert "Q_<grτ[1 - c]j>" in text and "θ_<τj> = τ inv_freq_<j>" in text
    assert "q_proj_weight_<(grcj)i>" in text  # the weight in its own layout, heads (g r)


class Sorting(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cumsum(self.proj(x), dim=1)


def test_what_cannot_be_lifted_is_named_with_its_line():
    with pytest.raises(LiftError) as caught:
        indexattn.lift(Sorting(), torch.randn(2, 5, 4))
    message = str(caught.value)
    assert "aten.cumsum.default" in message and "graph node cumsum" in message
    assert "test_lift.py" in message and "torch.cumsum(self.proj(x), dim=1)" in message


def test_the_command_line_prints_the_lifted_spec(capsys, tmp_path):
    from indexattn.cli import main

    here = __import__("pathlib").Path(__file__).parents[1] / "lift_modules.py"
    assert main(["lift", f"{here}:SelfMHA", "--shape", "2,5,12"]) == 0
    out = capsys.readouterr().out
    assert "Y_<τi> = attn_out_proj_weight_<i(μa)> O_<μτa> + attn_out_proj_bias_<i>" in out
    indexattn.compile_spec(out, name="lifted")  # what it prints is a spec
    bare = tmp_path / "bare.py"
    examples = "\n\ndef example_inputs():\n    return torch.randn(2, 5, 12)\n"
    bare.write_text(here.read_text() + examples)
    assert main(["lift", f"{bare}:SelfMHA"]) == 0
    assert "attn_in_proj_weight_<(Bμa)i>" in capsys.readouterr().out
    assert main(["lift", f"{here}:SelfMHA"]) == 1
    assert "--shape 2,8,16" in capsys.readouterr().err
