"""A `where` chain on every value of a literal index is one `torch.stack` (lower/planner/stacks.py,
the `Stack` step): how the derived backward's regrouped cotangents of a fused projection
(`dQKV_<μBτa> = where(B == 0, dQ, where(B == 1, dK, dV))`) are computed, one copy of each
part rather than a `torch.where` per part over the whole result. Its values equal the literal
interpreter's and, in the derived backward, autograd's; each equality has a twin."""

import pytest
import torch
from test_derive import both_modes, both_modes_of

import indexattn
from indexattn.lower.planner import stacks
from indexattn.lower.program.steps import Stack
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes

HEAD = "index τ : N\nindex a : d\nindex B : 3\ninput P_<τa>\ninput Q_<τa>\ninput R_<τa>\n"
CHAIN = HEAD + "Y_<Bτa> = where(B == 0, P_<τa>, where(1 == B, Q_<τa>, R_<τa>))\n"
# the twin: the first two values of B swapped
SWAPPED = HEAD + "Y_<Bτa> = where(B == 1, P_<τa>, where(0 == B, Q_<τa>, R_<τa>))\n"
# a part that lacks an axis, a param (no batch axes) and a number: broadcast to one shape
MIXED = (
    "index τ : N\nindex a : d\nindex B : 4\ninput P_<τa>\nparam b_<a>\n"
    "Y_<Bτa> = where(B == 0, P_<τa>, where(B == 3, b_<a>, where(B == 1, 2 P_<τa>, 0)))\n"
)
# a sum of chains that end in 0, on distinct values: 0 at B = 1
SUMMED = HEAD + "Y_<Bτa> = where(B == 0, P_<τa>, 0) + where(B == 2, exp(Q_<τa>), 0)\n"
# its twin: both terms at B = 0, which add
OVERLAPPING = HEAD + "Y_<Bτa> = where(B == 0, P_<τa>, 0) + where(B == 0, exp(Q_<τa>), 0)\n"
# two values of B left to the last part: a `where`, not a stack
SHORT = HEAD.replace("B : 3", "B : 4") + (
    "Y_<Bτa> = where(B == 0, P_<τa>, where(B == 1, Q_<τa>, R_<τa>))\n"
)


def stacks_in(spec) -> list[Stack]:
    return [s for s in spec.program.steps if isinstance(s, Stack)]


def outputs(spec, seed: int = 0) -> torch.Tensor:
    sizes = sample_sizes(spec.ir, seed)
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, seed)
    return spec(**args)


@pytest.mark.parametrize("text", [CHAIN, MIXED, SUMMED])
def test_a_where_chain_on_every_value_is_one_stack(text):
    spec = indexattn.compile_spec(text, name="chain")
    assert len(stacks_in(spec)) == 1
    assert "torch.stack(" in spec.source and "torch.where(" not in spec.source
    assert compare(spec).ok and compare(spec, batch=(2,)).ok


def test_twin_the_stack_follows_the_values_its_conditions_name():
    """B == 0 and B == 1 swapped: still a stack, equal to the oracle, and a different value
    (the parts at B = 0 and B = 1 trade places)."""
    chain = indexattn.compile_spec(CHAIN, name="chain")
    swapped = indexattn.compile_spec(SWAPPED, name="swapped")
    assert len(stacks_in(swapped)) == 1 and compare(swapped).ok
    a, b = outputs(chain), outputs(swapped)
    assert torch.equal(a[..., 0, :, :], b[..., 1, :, :])
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("text", [SHORT, OVERLAPPING])
def test_twin_a_chain_short_of_a_value_or_terms_that_overlap_stay_wheres(text):
    spec = indexattn.compile_spec(text, name="short")
    assert stacks_in(spec) == [] and "torch.where(" in spec.source
    assert compare(spec).ok


@pytest.mark.parametrize("name", ["mha", "differential"])
def test_the_derived_backward_stacks_the_regrouped_cotangents(name):
    """mha's dQKV and differential's regrouped cotangents are one `torch.stack` each; the
    derived gradients equal autograd's in float64."""
    spec = indexattn.compile_spec(name).backward(training=False)
    assert stacks_in(spec) and "torch.stack(" in spec.source
    autograd, derived = both_modes(name)
    for k, g in autograd.items():
        torch.testing.assert_close(derived[k], g, rtol=0, atol=1e-10)


def test_twin_a_stack_in_the_wrong_order_is_seen(monkeypatch):
    """The parts planted in reverse order: mha's derived gradients leave autograd's."""

    def reversed_form(node):
        found = stack_form(node)
        return None if found is None else (found[0], found[1][::-1])

    stack_form = stacks.stack_form
    monkeypatch.setattr("indexattn.lower.planner.plan.stack_form", reversed_form)
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    text = indexattn.compile_spec("mha").text
    planted = indexattn.compile_spec(text + "\n", name="mha_planted")
    autograd, derived = both_modes_of(planted)
    assert max((derived[k] - g).abs().max().item() for k, g in autograd.items()) > 1e-3
