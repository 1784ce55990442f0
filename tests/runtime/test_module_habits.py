"""What nn.Module users expect of a SpecModule: `forward` with the inputs by name (for
inspect.signature, IDEs and torch.export's dynamic shapes by name), a notebook
representation, and dtype errors that name the kind of tensor expected."""

import inspect
import pickle

import pytest
import torch
from torch.export import Dim, export

import indexattn


def doc_mask():
    torch.manual_seed(0)
    return indexattn.compile_spec("doc_mask").module(d_m=8, h=2, d_k=4).double()


def test_forward_has_the_inputs_by_name():
    module = doc_mask()
    assert list(inspect.signature(module.forward).parameters) == ["X", "D"]
    mha = indexattn.compile_spec("mha").module(d_m=8, h=2, d_k=4)
    assert list(inspect.signature(mha.forward).parameters) == ["X"]  # another spec's
    x, d = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 1])
    assert torch.equal(module(x, d), module(D=d, X=x))
    bound = inspect.signature(module.forward).bind(x, D=d)  # what torch.export does
    assert torch.equal(module(*bound.args, **bound.kwargs), module(x, d))


def test_the_signature_survives_pickling_and_tracks_the_class():
    module = doc_mask()
    again = pickle.loads(pickle.dumps(module))
    assert inspect.signature(again.forward) == inspect.signature(module.forward)
    assert again.forward.args[0] is again  # bound to the copy, not to the original

    class Doubled(type(module)):  # as sharding and fully_shard swap the class
        def forward(self, *args, **kwargs):
            return 2 * super().forward(*args, **kwargs)

    x, d = torch.randn(5, 8, dtype=torch.float64), torch.zeros(5, dtype=torch.long)
    before = module(x, d)
    module.__class__ = Doubled
    assert torch.equal(module(x, d), 2 * before)


def test_export_takes_dynamic_shapes_by_input_name():
    module = doc_mask().eval()
    x, d = torch.randn(2, 6, 8, dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1])
    n = Dim("N", min=2, max=64)
    program = export(module, (x, d), dynamic_shapes={"X": {1: n}, "D": {0: n}})
    longer = torch.randn(2, 9, 8, dtype=torch.float64), torch.tensor([0] * 4 + [1] * 5)
    torch.testing.assert_close(program.module()(*longer), module(*longer), rtol=0, atol=1e-12)
    with pytest.raises(Exception, match="X"):  # names that are not the inputs' are refused
        export(module, (x, d), dynamic_shapes={"x": {1: n}, "D": {0: n}})


def test_a_notebook_shows_the_title_equations_and_parameter_count():
    spec = indexattn.compile_spec("mha")
    shown = spec.module(d_m=768, h=12, d_k=64)._repr_markdown_()
    assert shown.startswith("# Causal multi-head self-attention")
    assert "A_{\\mu\\tau\\tau'} = \\operatorname{softmax}_{\\tau'}" in shown
    assert shown.endswith(
        "**2,360,064 parameters** at $d_m = 768, h = 12, d_k = 64$: $4 d_k d_m h + d_m$\n"
    )
    smaller = spec.module(d_m=64, h=4, d_k=16)._repr_markdown_()
    assert "**16,448 parameters** at $d_m = 64, h = 4, d_k = 16$" in smaller  # 4·16·64·4 + 64


def test_dtype_errors_name_the_kind_of_tensor_expected():
    module = doc_mask()
    x, d = torch.randn(5, 8, dtype=torch.float64), torch.zeros(5, dtype=torch.long)
    messages = {
        "D float": (x, d.double()),
        "X integer": (x.long(), d),
    }
    found = {}
    for key, args in messages.items():
        with pytest.raises(indexattn.ShapeError) as caught:
            module(*args)
        found[key] = str(caught.value)
    assert found == {
        "D float": "doc_mask: D must be an integer tensor (declared `: int`), not a floating "
        "tensor (torch.float64); pass integers, e.g. D.long()",
        "X integer": "doc_mask: X must be a floating tensor, not an integer tensor "
        "(torch.int64): its dtype is the call's; convert it, e.g. X.float()",
    }
    mask = indexattn.compile_spec("dk_dv_mask").module(d=6)
    with pytest.raises(indexattn.ShapeError) as caught:
        mask(torch.randn(5, 6), torch.zeros(5, 5, dtype=torch.long))
    assert str(caught.value) == (
        "dk_dv_mask: M must be a floating tensor, of X's dtype, not an integer tensor "
        "(torch.int64); convert it, e.g. M.to(X.dtype)"
    )
    assert mask(torch.randn(5, 6), torch.zeros(5, 5)).shape == (5, 6)  # the twin: floats run


def test_a_scalar_given_to_a_call_wins_for_that_call_only():
    """`module(x, w=2)` is the module built with w=2, for this call; the module keeps its own
    scalar, and the signature shows the scalars as keywords with their values."""
    spec = indexattn.compile_spec("sliding_window")
    torch.manual_seed(0)
    module = spec.module(d_in=16, d_out=16, h=2, d_k=8, w=4).double().eval()
    narrow = spec.module(d_in=16, d_out=16, h=2, d_k=8, w=2).double().eval()
    narrow.load_state_dict(module.state_dict())
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    assert torch.equal(module(x, w=2), narrow(x))
    assert not torch.allclose(module(x), narrow(x))  # the twin: the window changes the output
    assert module.scalars["w"] == 4.0
    w = inspect.signature(module.forward).parameters["w"]
    assert (w.kind, w.default) == (inspect.Parameter.KEYWORD_ONLY, 4.0)
