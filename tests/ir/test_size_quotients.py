"""Index ranges from size expressions: `index β : N / ℓ` and `index β : ceil(N / ℓ)`, through
parsing, checking, the generated code, the oracle, the counts, `check --size` and the pages."""

import pytest
import sympy
import torch
import torch.nn.functional as F

import indexattn
from indexattn.errors import ShapeError
from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_sizes

BLOCK_MEANS = """
index β : N / ℓ        # key blocks
index λ : ℓ            # position in a block
index τ : N
index a : d
input X_<τa>
Y_<βa> = sum_<λ>(X_<[β ℓ + λ] a>) / ℓ
output Y
"""

PADDED_SUMS = """
index β : {rounding}(N / ℓ)
index τ : N
index a : d
input X_<τa>
M_<βτ> = where(floor(τ / ℓ) == β, 1, 0)
Y_<βa> = M_<βτ> X_<τa>
output Y
"""


def x_of(n, d=3):
    return torch.randn(2, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(n))


def test_block_means_equal_hand_written_code_in_values_and_gradients():
    spec = indexattn.compile_spec(BLOCK_MEANS, name="block_means")
    x = x_of(12).requires_grad_()
    y = spec(X=x, l=4)
    want = x.unflatten(-2, (3, 4)).mean(-2)
    assert (y - want).abs().max() < 1e-14
    weight = torch.randn_like(want)
    (got,) = torch.autograd.grad((y * weight).sum(), x)
    (expected,) = torch.autograd.grad((want * weight).sum(), x)
    assert (got - expected).abs().max() < 1e-14
    twin = x.unflatten(-2, (4, 3)).mean(-2)  # blocks of 3, not of 4: another size
    assert twin.shape != y.shape and spec(X=x, l=3).shape == twin.shape


def test_the_block_count_is_computed_from_sizes_in_the_generated_code():
    source = indexattn.compile_spec(BLOCK_MEANS, name="block_means").source
    assert "torch.arange(N // l," in source
    assert "def block_means(X, *, l," in source  # N from X; β's count is never asked for


@pytest.mark.parametrize("n", [10, 12])
def test_a_size_that_does_not_divide_is_named_with_what_to_write(n):
    spec = indexattn.compile_spec(BLOCK_MEANS, name="block_means")
    if n == 12:  # the twin: a size that divides runs
        assert spec(X=x_of(n), l=4).shape == (2, 3, 3)
        return
    with pytest.raises(ShapeError) as caught:
        spec(X=x_of(n), l=4)
    message = str(caught.value)
    assert "index β ranges over N / l" in message and "N = 10 is not a multiple of l = 4" in message
    assert "write index β : ceil(N / l)" in message
    with pytest.raises(ShapeError, match="N = 10 is not a multiple of l = 4"):
        reference.evaluate(spec.ir, X=x_of(n), l=4)  # the oracle reads the same rule


@pytest.mark.parametrize("rounding", ["ceil", "floor"])
def test_a_rounded_range_counts_the_blocks_the_paper_pads_or_drops(rounding):
    spec = indexattn.compile_spec(PADDED_SUMS.format(rounding=rounding), name="sums")
    x = x_of(10)
    blocks = 3 if rounding == "ceil" else 2
    want = F.pad(x, (0, 0, 0, 2)).unflatten(-2, (3, 4)).sum(-2)[..., :blocks, :]
    y = spec(X=x, l=4)
    assert y.shape == want.shape and (y - want).abs().max() < 1e-14
    (literal,) = reference.evaluate(spec.ir, X=x, l=4)
    assert (literal - want).abs().max() < 1e-14


@pytest.mark.parametrize("text", [BLOCK_MEANS, PADDED_SUMS.format(rounding="ceil")])
def test_the_oracle_agrees_at_sampled_sizes(text):
    spec = indexattn.compile_spec(text, name="sampled")
    assert compare(spec).ok and compare(spec, batch=(2,), seed=1).ok


def test_sampled_sizes_divide_and_fixed_sizes_that_do_not_are_refused():
    spec = indexattn.compile_spec(BLOCK_MEANS, name="block_means").ir
    sizes = sample_sizes(spec, fixed={"l": 4})
    assert sizes["l"] == 4 and sizes["N"] % 4 == 0
    assert sample_sizes(spec, fixed={"N": 12, "l": 4})["N"] == 12  # the twin: they divide
    with pytest.raises(ValueError, match="N = 10, l = 4 leave N / l fractional"):
        sample_sizes(spec, fixed={"N": 10, "l": 4})


def test_counts_are_symbolic_in_the_quotient():
    spec = indexattn.compile_spec(PADDED_SUMS.format(rounding="ceil"), name="sums")
    n, d, ell = sympy.symbols("N d l", integer=True, positive=True)
    flops = spec.flops().subs({s: {"N": n, "d": d, "l": ell}[str(s)] for s in spec.ir.sizes})
    assert sympy.simplify(flops - (2 * n * d + 3 * n) * sympy.ceiling(n / ell)) == 0


def test_the_derived_backward_declares_the_range_as_written():
    text = indexattn.compile_spec(PADDED_SUMS.format(rounding="ceil"), name="sums").backward_text()
    assert "index β : ceil(N/l)" in text


def test_a_range_with_another_function_says_what_a_range_may_be():
    with pytest.raises(indexattn.SpecError, match="index β : ceil"):
        indexattn.compile_spec(PADDED_SUMS.format(rounding="sqrt"), name="bad")
