"""specs/nsa.attn (Native Sparse Attention) against a hand-written module that selects key
blocks by torch.topk and reads them by a gather: values, gradients, counts and twins, float64."""

from pathlib import Path

import pytest
import sympy
import torch
from reference.nsa import NativeSparseAttention

import indexattn

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "specs" / "nsa.attn").read_text(encoding="utf-8")
D_MODEL, HEADS, HEAD_DIM, BLOCK, N = 6, 2, 3, 2, 12  # six blocks of two keys


def layer(seed=0, **options):
    torch.manual_seed(seed)
    return NativeSparseAttention(D_MODEL, HEADS, HEAD_DIM, BLOCK, **options).double()


def params(module):
    return {name.replace(".", "_"): p for name, p in module.named_parameters()}


def x_of(seed=1):
    return torch.randn(
        2, N, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )


def close(got, want):
    assert got.shape == want.shape and (got - want).abs().max() < 1e-12, (got - want).abs().max()


def run(text, module, x, **scalars):
    spec = indexattn.compile_spec(text, name="nsa")
    return spec(X=x, **params(module), h=HEADS, **scalars)


def grads(out, module, x):
    """Gradients with respect to x and every parameter (None where none reaches one)."""
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    wrt = [x, *module.parameters()]
    return torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)


def test_nsa_equals_the_hand_written_module_in_values_and_gradients():
    module, x = layer(), x_of().requires_grad_()
    got, want = run(TEXT, module, x), module(x)
    close(got, want)
    for g, w in zip(grads(got, module, x), grads(want, module, x)):
        close(g, w)


def test_the_selected_branch_equals_top_k_blocks_read_by_a_gather():
    """The selection alone: the spec's Os against the module's gathered blocks."""
    module, x = layer(), x_of().requires_grad_()
    got = run(TEXT.replace("output Y", "output Os"), module, x)
    q, k, v = (
        m(x).unflatten(-1, (HEADS, -1)).transpose(-3, -2)
        for m in (module.q_proj, module.k_proj, module.v_proj)
    )
    scores, _ = module.compressed(q, k, v)
    want = module.selected_blocks(scores, q, k, v)
    close(got, want)
    got_grads, want_grads = grads(got, module, x), grads(want, module, x)
    assert got_grads[1] is None and want_grads[1] is None  # φ only selects: no gradient
    for g, w in zip(got_grads, want_grads):
        assert (g is None) == (w is None)
        if g is not None:
            close(g, w)


def test_the_module_selects_alike_by_a_gather_and_by_a_mask():
    """The benchmark's second hand-written selection (a mask of torch.topk's blocks)."""
    x = x_of()
    close(layer(gather=False)(x), layer()(x))


@pytest.mark.parametrize("twin", ["selected", "phi"])
def test_a_twin_with_one_change_differs(twin):
    """One more block selected, or one compression weight changed, changes the output."""
    module, x = layer(), x_of()
    want = module(x)
    if twin == "selected":
        got = run(TEXT, module, x, n=3)
    else:
        with torch.no_grad():
            module.phi[1] += 0.5
        got = run(TEXT, layer(), x)  # the spec at the old weights
        want = module(x)
    assert (got - want).abs().max() > 1e-3


def test_the_block_count_is_a_size_from_sizes_and_must_divide():
    module = layer()
    with pytest.raises(indexattn.ShapeError, match="N = 11 is not a multiple of l = 2"):
        run(TEXT, module, x_of()[:, :11])


def test_counts_match_the_module():
    spec = indexattn.compile_spec(TEXT, name="nsa")
    sizes = {
        s: {"d_m": D_MODEL, "h": HEADS, "d_k": HEAD_DIM, "l": BLOCK}[spec.ir.size_ascii(s)]
        for s in spec.ir.sizes
        if spec.ir.size_ascii(s) != "N"
    }
    assert spec.param_count().subs(sizes) == sum(p.numel() for p in layer().parameters())
    n = next(s for s in spec.ir.sizes if str(s) == "N")
    assert sympy.degree(sympy.expand(spec.flops()), n) == 2  # the dense mask of the selection
