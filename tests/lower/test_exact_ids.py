"""Integer ids compared as integers (issue 51): document ids at and above 2^53, where
float64 makes 2^53 and 2^53 + 1 one number, keep their mask; and a mask reading ids along
queries and keys of different lengths is read by tiles of each axis (decode over packed
documents, cross attention). Each against the literal interpreter, with its twin."""

import pytest
import torch

import indexattn
from indexattn.oracle.reference import evaluate

DOCUMENTS = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
input D_<τ> : int
M_<ττ'> = where(D_<τ> != D_<τ'>, -inf, 0)
S_<ττ'> = Q_<τa> K_<τ'a> + M_<ττ'>
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""

CROSS = """index τ : N
index σ : L
index a : d
input Q_<τa>
input K_<σa>
input V_<σa>
input D_<τ> : int
input E_<σ> : int
M_<τσ> = where(D_<τ> != E_<σ>, -inf, 0)
S_<τσ> = Q_<τa> K_<σa> + M_<τσ>
A_<τσ> = softmax_<σ>(S_<τσ>)
O_<τa> = A_<τσ> V_<σa>
output O
"""


def qkv(n_q: int, n_k: int):
    torch.manual_seed(0)
    q = torch.randn(n_q, 4, dtype=torch.float64)
    return q, torch.randn(n_k, 4, dtype=torch.float64), torch.randn(n_k, 4, dtype=torch.float64)


def documents(base: int, step: int, n: int = 16):
    """Two documents of `n` tokens: ids `base` and `base + step`."""
    spec = indexattn.compile_spec(DOCUMENTS, name="documents")
    q, k, v = qkv(n, n)
    ids = torch.full((n,), base, dtype=torch.int64)
    ids[n // 2 :] += step
    args = {"Q": q, "K": k, "V": v, "D": ids}
    return spec(**args), evaluate(spec.ir, **args)[0]


@pytest.mark.parametrize("base", [2**53, 2**62, -(2**62)])
def test_ids_beyond_float64_keep_their_mask(base):
    """Failed before: the tiles' least and greatest ids were read through .double(), the
    box said "the mask changes nothing" and the keys of the other document were seen."""
    got, want = documents(base, 1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_twin_one_document_differs_from_two():
    two, _ = documents(2**53, 1)
    one, want = documents(2**53, 0)
    torch.testing.assert_close(one, want, rtol=1e-12, atol=1e-12)
    assert (one - two).abs().max() > 0.1


@pytest.mark.parametrize(("n_q", "n_k"), [(1, 300), (300, 1), (130, 257)])
def test_ids_along_queries_and_keys_of_different_lengths(n_q, n_k):
    """Failed before: `stack expects each tensor to be equal size` (the tiles of both axes
    were stacked as one)."""
    spec = indexattn.compile_spec(CROSS, name="cross_ids")
    q, k, v = qkv(n_q, n_k)
    args = {"Q": q, "K": k, "V": v, "D": torch.arange(n_q) * 3 // n_q}
    args["E"] = torch.arange(n_k) * 3 // n_k
    got, want = spec(**args), evaluate(spec.ir, **args)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    args["E"] = (args["E"] + 1) % 3  # twin: other documents for the keys
    other = spec(**args)
    torch.testing.assert_close(other, evaluate(spec.ir, **args)[0], rtol=1e-12, atol=1e-12)
    assert (other - got).abs().max() > 1e-3


def test_the_derived_backward_of_ids_along_both_axes():
    """Failed before (found by test_tensor_masks.py): the derived backward's rows read their
    device and dtype off their first input, the ids D: `value cannot be converted to type
    int64 without overflow` (-inf in int64). Its gradients are autograd's."""
    spec = indexattn.compile_spec(CROSS, name="cross_ids")
    q, k, v = (x.requires_grad_() for x in qkv(5, 7))
    ids = {"D": torch.tensor([0, 0, 1, 1, 2]), "E": torch.tensor([0, 1, 1, 2, 2, 2, 0])}

    def grads(backward, **given):
        out = spec(Q=q, K=k, V=v, **(ids | given), backward=backward)
        return torch.autograd.grad(out.sin().sum(), (q, k, v))

    for got, want in zip(grads("derived"), grads("autograd")):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    other = grads("derived", E=ids["E"].roll(1))  # twin: other documents for the keys
    assert max((a - b).abs().max() for a, b in zip(other, grads("derived"))) > 1e-3
