"""Each classic variant's spec, compiled, against its hand-written module in float64.

The module's state_dict is mapped onto the spec module's parameters (a rename; a stack for
ConcatHeads) and loaded strictly; outputs and the gradients of every input and parameter
must agree to 1e-10. See tests/reference/MAPPING.md.
"""

import functools
from pathlib import Path

import pytest
import sympy
import torch
from reference.buggy import HeadMajorGPT2, RepeatKVGQA, ReshapeHeadsMHA
from reference.cases import CASES

indexattn = pytest.importorskip("indexattn")

SPECS = Path(__file__).resolve().parent.parent / "specs"
ATOL = 1e-10

BUGGY = {  # spec -> the module with the bug that spec rules out, at the spec's sizes
    "mha_separate": lambda s: ReshapeHeadsMHA(s["d_in"], s["d_out"], s["h"]),
    "gqa": lambda s: RepeatKVGQA(s["d_m"], s["h_kv"] * s["n_rep"], s["h_kv"], s["d_k"]),
    "gpt2": lambda s: HeadMajorGPT2(s["d_m"], s["h"]),
}


@functools.cache
def compiled(name):
    path = SPECS / f"{name}.attn"
    if not path.exists():
        pytest.skip(f"{path.name} is not written yet")
    return indexattn.compile_spec(path)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def gradients(outputs, cotangents, inputs, module):
    """d(Σ output·cotangent) by input name and by parameter name."""
    params = dict(module.named_parameters())
    loss = sum((out * cot).sum() for out, cot in zip(outputs, cotangents, strict=True))
    grads = torch.autograd.grad(loss, [*inputs.values(), *params.values()])
    n = len(inputs)
    return dict(zip(inputs, grads[:n], strict=True)), dict(zip(params, grads[n:], strict=True))


def assert_all_close(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def setup(case, build):
    """The reference module, the spec module holding its weights, and fresh inputs."""
    torch.manual_seed(0)
    ref = build(case.sizes).double().eval()
    spec_module = compiled(case.spec).module(**case.sizes).double().eval()
    spec_module.load_state_dict(case.mapping(ref.state_dict()))
    inputs = {name: t.requires_grad_() for name, t in case.inputs(case.sizes).items()}
    return ref, spec_module, inputs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_spec_matches_module(case):
    ref, spec_module, inputs = setup(case, case.build)
    want = as_tuple(case.call(ref, inputs))
    got = as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)

    cotangents = [torch.randn_like(w) for w in want]
    want_inputs, want_params = gradients(want, cotangents, inputs, ref)
    got_inputs, got_params = gradients(got, cotangents, inputs, spec_module)
    assert_all_close(list(got_inputs.values()), list(want_inputs.values()))
    want_params = case.mapping(want_params)
    assert got_params.keys() == want_params.keys()
    assert_all_close([got_params[k] for k in want_params], list(want_params.values()))


@pytest.mark.parametrize("spec", BUGGY)
def test_spec_tells_the_buggy_module_apart(spec):
    case = next(c for c in CASES if c.spec == spec)
    buggy, spec_module, inputs = setup(case, BUGGY[spec])
    got = as_tuple(spec_module(*inputs.values()))[0]
    assert not torch.allclose(got, as_tuple(case.call(buggy, inputs))[0], atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_parameter_count(case):
    count = compiled(case.spec).param_count()
    for sizes in [case.sizes, *case.real.values()]:
        value = count.subs({s: sizes[str(s)] for s in count.free_symbols})
        assert value == sympy.sympify(case.count).subs(sizes), sizes
