"""cumprod_<j>, the reduction added as ops.py's record, its literal reading
(oracle/reference.py) and its rule of reverse mode (derive/adjoints.py) alone: values against
torch.cumprod, the derived gradient against finite differences and autograd, LaTeX and
counts from the record. Each with its twin."""

import sympy
import torch

import indexattn
from indexattn.oracle.reference import evaluate
from indexattn.views import cost

SPEC = """index i : n
index j : m
input x_<ij>
y_<ij> = cumprod_<j>(x_<ij>)
output y
"""


def spec():
    return indexattn.compile_spec(SPEC, name="running_product")


def gates(*shape) -> torch.Tensor:
    """Entries away from 0 (the derived rule divides by them) and from 1 (a product of ones
    tells no order apart)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(*shape, generator=generator, dtype=torch.float64) + 0.5
    return x.requires_grad_()


def test_values_are_torch_cumprod_and_the_oracle():
    x = gates(3, 5)
    y = spec()(x=x)
    torch.testing.assert_close(y, torch.cumprod(x, dim=-1), rtol=1e-12, atol=0)
    (want,) = evaluate(spec().ir, x=x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=0)
    assert "torch.cumprod(" in spec().source


def test_twin_the_running_sum_differs():
    x = gates(3, 5)
    assert not torch.allclose(spec()(x=x), torch.cumsum(x, dim=-1))


def test_the_derived_gradient_is_finite_differences_and_autograd():
    x = gates(2, 4)
    derived = lambda t: spec()(x=t, backward="derived")  # noqa: E731
    assert torch.autograd.gradcheck(derived, (x,))
    g = torch.randn(2, 4, dtype=torch.float64)
    (mine,) = torch.autograd.grad(derived(x), x, g)
    (torchs,) = torch.autograd.grad(torch.cumprod(x, dim=-1), x, g)
    torch.testing.assert_close(mine, torchs, rtol=1e-12, atol=1e-12)
    assert "cumprod" in spec().backward_text()


def test_twin_a_wrong_rule_is_caught_by_finite_differences():
    """The cumsum's rule in cumprod's place: gradcheck tells them apart."""
    from indexattn.derive import adjoints

    rule = adjoints.ADJOINTS["cumprod"]
    adjoints.ADJOINTS["cumprod"] = adjoints.ADJOINTS["cumsum"]
    try:
        wrong = indexattn.compile_spec(
            SPEC.replace("y_<ij>", "z_<ij>").replace("output y", "output z")
        )
        x = gates(2, 4)
        g = torch.ones(2, 4, dtype=torch.float64)
        (got,) = torch.autograd.grad(wrong(x=x, backward="derived"), x, g)
        (want,) = torch.autograd.grad(torch.cumprod(x, dim=-1), x, g)
        assert not torch.allclose(got, want)
    finally:
        adjoints.ADJOINTS["cumprod"] = rule


def test_latex_and_counts_come_from_the_record():
    """One multiplication per element reduced (the record's flops), as cumsum's one
    addition; the LaTeX operator is the record's."""
    s = spec()
    assert r"\operatorname{cumprod}_{j}\left(x_{i j}\right)" in s.latex()
    n, m = sympy.symbols("n m", positive=True, integer=True)
    assert s.flops() == n * m == cost.flops(s.plan)


def test_a_split_over_its_index_names_what_blocks_it():
    """Its parts over blocks of j do not merge (the record's merge is None): the sequence plan
    over j says so by name. The twin: cumsum's (an exclusive scan) splits."""
    refused = str(spec().sequence_plan(over="j"))
    assert "cumprod_<j> along the sequence has no merge across ranks" in refused
    running_sum = indexattn.compile_spec(SPEC.replace("cumprod", "cumsum"), name="running_sum")
    assert "has no merge" not in str(running_sum.sequence_plan(over="j"))
