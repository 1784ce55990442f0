"""specs/selective.attn (Selective Attention) against a hand-written module that follows the
paper's pseudo-code (tests/reference/selective.py): values, gradients, counts and twins,
float64."""

from pathlib import Path

import pytest
import torch
from reference.selective import SelectiveAttention

import indexattn

SPEC = Path(__file__).resolve().parents[2] / "specs" / "selective.attn"


def qkv(seed=0, heads=3, n=9, d=4):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(2, heads, n, d, dtype=torch.float64, generator=g).requires_grad_()
        for _ in "qkv"
    ]


def grads(out, args):
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    return torch.autograd.grad((out * weight).sum(), args)


def close(got, want):
    assert got.shape == want.shape and (got - want).abs().max() < 1e-12, (got - want).abs().max()


def test_selective_attention_equals_the_hand_written_module_in_values_and_gradients():
    spec, args = indexattn.compile_spec(SPEC), qkv()
    got, want = spec(Q=args[0], K=args[1], V=args[2]), SelectiveAttention()(*args)
    close(got, want)
    for g, w in zip(grads(got, args), grads(want, args)):
        close(g, w)


@pytest.mark.parametrize(
    "twin",
    [
        ("cumsum_<τ>(Σ_<ττ'>) - Σ_<ττ'>", "cumsum_<τ>(Σ_<ττ'>)"),  # not shifted by one
        ("relu(S_<0ττ'>)", "relu(S_<1ττ'>)"),  # another head selects
        ("τ' == τ or τ' == 0", "τ' == τ"),  # the first token may be selected
    ],
)
def test_a_twin_with_one_change_differs(twin):
    spec = indexattn.compile_spec(SPEC.read_text(encoding="utf-8").replace(*twin), name="twin")
    args = qkv()
    assert (spec(Q=args[0], K=args[1], V=args[2]) - SelectiveAttention()(*args)).abs().max() > 1e-3


def test_a_query_that_selects_nothing_changes_nothing():
    """With head 0's scores all negative nothing is selected: plain causal attention."""
    q, k, v = (t.detach() for t in qkv())
    q[..., 0, :, :], k[..., 0, :, :] = q[..., 0, :, :].abs(), -k[..., 0, :, :].abs()
    got = indexattn.compile_spec(SPEC)(Q=q, K=k, V=v)
    causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(got, causal)


def test_counts_no_parameters_and_quadratic_in_the_sequence():
    spec = indexattn.compile_spec(SPEC)
    sizes = {str(s): s for s in spec.ir.sizes}
    flops = [
        spec.flops().subs({sizes["h"]: 12, sizes["d_k"]: 64, sizes["N"]: n}) for n in (512, 1024)
    ]
    assert spec.param_count() == 0
    assert 3.9 < flops[1] / flops[0] < 4.1
