"""The softmax core with the log-sum-exp of its scores (indexattn/runtime/flash.py), the ring's
tile pair core where one process's core is SDPA: values and the gradients through both outputs
against autograd through the plain formula, in float64 (fully masked rows, causal diagonal
tiles, an additive mask); a causal tile shifted by one position differs; in float32 and
bfloat16 as close to float64 as one process's SDPA call. The gradients of key tiles made from
the rows' merged output and log-sum-exp (a ring's backward) sum to the whole's. The ring's
use of it is tested in tests/parallel/test_ring_tiles.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from indexattn.runtime.flash import attention_grads, attention_lse, plain_grads, plain_lse

EXACT = 1e-12


def _operands(n: int, m: int, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return [torch.randn(2, 3, size, 8, dtype=dtype, requires_grad=True) for size in (n, m, m)]


def _mask(n: int, m: int, hidden_row: int | None = 1):
    torch.manual_seed(7)
    keep = torch.rand(n, m) > 0.4
    if hidden_row is not None:
        keep[hidden_row] = False  # a row that sees no key
    return torch.zeros(n, m, dtype=torch.float64).masked_fill(~keep, -torch.inf)


def _values_and_grads(core, q, k, v, mask, causal):
    out, lse = core(q, k, v, mask, causal, 0.37)
    torch.manual_seed(3)
    # randn, not randn_like: the kernel's lse is laid out (batch, query, head)
    g_out, g_lse = (torch.randn(t.shape, dtype=t.dtype) for t in (out, lse))
    finite = torch.where(lse.isneginf(), torch.zeros_like(lse), lse)
    grads = torch.autograd.grad((out * g_out).sum() + (finite * g_lse).sum(), [q, k, v])
    return [out, lse, *grads]


def _gap(a, b) -> float:
    return max(
        (x - y).nan_to_num(0.0, 0.0, 0.0).abs().max().item() + float((x.isnan() != y.isnan()).any())
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize(
    ("n", "m", "causal", "masked"),
    [(5, 7, False, False), (6, 6, True, False), (5, 7, False, True), (40, 40, True, False)],
    ids=["plain", "causal-diagonal", "mask-with-a-hidden-row", "causal-long"],
)
def test_values_and_both_gradients_equal_the_formula(n, m, causal, masked):
    q, k, v = _operands(n, m)
    mask = _mask(n, m) if masked else None
    got = _values_and_grads(attention_lse, q, k, v, mask, causal)
    want = _values_and_grads(plain_lse, q, k, v, mask, causal)
    assert _gap(got, want) < EXACT


@pytest.mark.parametrize("widths", [(8, 6), (4, 8)], ids=["values-narrower", "values-wider"])
def test_keys_and_values_of_other_widths_equal_the_formula(widths):
    """The kernel takes one head size: keys of 8 features and values of 6 (DeepSeek's latent
    attention), or the other way, run padded with features of 0, values and the gradients
    through both outputs and from the rows (the ring's backward) as the formula's."""
    torch.manual_seed(0)
    d, e = widths
    q, k = (torch.randn(2, 3, n, d, dtype=torch.float64, requires_grad=True) for n in (5, 7))
    v = torch.randn(2, 3, 7, e, dtype=torch.float64, requires_grad=True)
    got = _values_and_grads(attention_lse, q, k, v, _mask(5, 7), False)
    assert got[0].shape[-1] == e and [g.shape[-1] for g in got[2:]] == [d, d, e]
    assert _gap(got, _values_and_grads(plain_lse, q, k, v, _mask(5, 7), False)) < EXACT
    out, lse = (t.detach() for t in got[:2])
    g_out = torch.randn(out.shape, dtype=out.dtype)
    rows = (g_out, q, k, v, out, lse, _mask(5, 7), False, 0.37)
    assert _gap(attention_grads(*rows), plain_grads(*rows)) < EXACT


def test_a_fully_masked_row_has_lse_minus_infinity_zeros_and_no_nan():
    q, k, v = _operands(5, 7)
    out, lse, *grads = _values_and_grads(attention_lse, q, k, v, _mask(5, 7), False)
    assert lse[..., 1].isneginf().all() and not lse[..., [0, 2, 3, 4]].isneginf().any()
    assert (out[..., 1, :] == 0).all()
    assert all(g.isfinite().all() for g in grads)
    assert (grads[0][..., 1, :] == 0).all()  # a hidden row's query reads nothing


def test_causal_equals_its_mask_and_the_twin_shifted_by_one_differs():
    q, k, v = _operands(6, 6)
    causal = _values_and_grads(attention_lse, q, k, v, None, True)
    hidden = torch.ones(6, 6, dtype=torch.bool).triu(1)
    mask = torch.zeros(6, 6, dtype=torch.float64).masked_fill(hidden, -torch.inf)
    assert _gap(causal, _values_and_grads(attention_lse, q, k, v, mask, False)) < EXACT
    late = torch.zeros(6, 6, dtype=torch.float64).masked_fill(hidden.roll(1, 1), -torch.inf)
    late[:, 0] = 0.0  # every key one position late: query τ sees keys up to τ + 1
    assert _gap(causal, _values_and_grads(attention_lse, q, k, v, late, False)) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_is_as_close_to_float64_as_one_process(dtype):
    q, k, v = _operands(64, 64)
    truth = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.37)
    low = [t.detach().to(dtype) for t in (q, k, v)]
    one = F.scaled_dot_product_attention(*low, is_causal=True, scale=0.37)
    out, lse = attention_lse(*low, None, True, 0.37)
    want_lse = plain_lse(*(t.double() for t in low), None, True, 0.37)[1]  # of the rounded
    err_one = (one.double() - truth).abs().max().item()
    assert (out.double() - truth).abs().max().item() <= 1.01 * err_one
    one_rounding = torch.finfo(dtype).eps * want_lse.abs().max().item()
    assert (lse.double() - want_lse).abs().max().item() < one_rounding  # float32 inside


HALVES = (slice(None, 3), slice(3, None))


def _by_halves(grads, q, k, v, mask, g_out, rows_of):
    """dq summed and dk, dv joined over two key tiles, each made by `grads` from the rows'
    output and log-sum-exp that `rows_of(keys)` gives."""
    parts = [
        grads(
            g_out, q, k[..., keys, :], v[..., keys, :], *rows_of(keys), mask[:, keys], False, 0.37
        )
        for keys in HALVES
    ]
    dk, dv = (torch.cat([parts[0][n], parts[1][n]], -2) for n in (1, 2))
    return [parts[0][0] + parts[1][0], dk, dv]


@pytest.mark.parametrize("grads", [attention_grads, plain_grads], ids=["kernel", "formula"])
def test_key_tiles_gradients_from_the_merged_rows_sum_to_the_whole(grads):
    q, k, v = _operands(5, 7)
    mask = _mask(5, 7)  # row 1 sees no key: its lse is −∞, its gradients 0
    out, lse = plain_lse(q, k, v, mask, False, 0.37)
    torch.manual_seed(3)
    g_out = torch.randn(out.shape, dtype=out.dtype)
    whole = torch.autograd.grad((out * g_out).sum(), [q, k, v])
    q, k, v, out, lse = (t.detach() for t in (q, k, v, out, lse))
    merged = _by_halves(grads, q, k, v, mask, g_out, lambda keys: (out, lse))
    assert _gap(merged, whole) < EXACT

    def own(keys):  # the twin: each tile's own output and log-sum-exp
        return plain_lse(q, k[..., keys, :], v[..., keys, :], mask[:, keys], False, 0.37)

    assert _gap(_by_halves(grads, q, k, v, mask, g_out, own), whole) > 1e-3


@pytest.mark.parametrize("grads", [attention_grads, plain_grads], ids=["kernel", "formula"])
def test_the_log_sum_exp_s_gradient_enters_each_tile(grads):
    """Where the rows' log-sum-exp is read too (attention sinks' L), its gradient dL enters
    every key tile's backward as D − dL; the twin leaves it out."""
    q, k, v = _operands(5, 7)
    mask = _mask(5, 7, hidden_row=None)
    out, lse = plain_lse(q, k, v, mask, False, 0.37)
    torch.manual_seed(4)
    g_out, g_lse = torch.randn(out.shape, dtype=out.dtype), torch.randn(lse.shape, dtype=lse.dtype)
    whole = torch.autograd.grad((out * g_out).sum() + (lse * g_lse).sum(), [q, k, v])
    q, k, v, out, lse = (t.detach() for t in (q, k, v, out, lse))

    def with_dl(*args):
        return grads(*args, grad_lse=g_lse)

    assert _gap(_by_halves(with_dl, q, k, v, mask, g_out, lambda keys: (out, lse)), whole) < EXACT
    assert _gap(_by_halves(grads, q, k, v, mask, g_out, lambda keys: (out, lse)), whole) > 1e-3


def test_a_causal_diagonal_tile_from_its_rows_equals_autograd():
    q, k, v = _operands(40, 40)
    out, lse = plain_lse(q, k, v, None, True, 0.37)
    torch.manual_seed(3)
    g_out = torch.randn(out.shape, dtype=out.dtype)
    whole = torch.autograd.grad((out * g_out).sum(), [q, k, v])
    rows = (out.detach(), lse.detach())
    made = attention_grads(g_out, *(t.detach() for t in (q, k, v)), *rows, None, True, 0.37)
    assert _gap(made, whole) < EXACT
    shifted = attention_grads(g_out, *(t.detach() for t in (q, k, v)), *rows, None, False, 0.37)
    assert _gap(shifted, whole) > 1e-3  # the twin: the keys after each query seen


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_equals_the_cpu():
    q, k, v = _operands(6, 6)
    mask = _mask(6, 6)
    cpu = _values_and_grads(attention_lse, q, k, v, mask, False)
    on = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    got = _values_and_grads(attention_lse, *on, mask.cuda(), False)
    assert _gap([g.cpu() for g in got], cpu) < EXACT


def test_the_output_s_gradient_alone_equals_the_formula():
    """Nothing reads the log-sum-exp: the kernel's backward runs unpadded (no dL column)."""
    q, k, v = _operands(40, 40)
    torch.manual_seed(3)
    g_out = torch.randn(2, 3, 40, 8, dtype=torch.float64)
    got = torch.autograd.grad(
        (attention_lse(q, k, v, None, True, 0.37)[0] * g_out).sum(), [q, k, v]
    )
    want = torch.autograd.grad((plain_lse(q, k, v, None, True, 0.37)[0] * g_out).sum(), [q, k, v])
    assert _gap(got, want) < EXACT
    shifted = torch.autograd.grad(
        (plain_lse(q, k, v, None, False, 0.37)[0] * g_out).sum(), [q, k, v]
    )
    assert _gap(got, shifted) > 1e-3  # the twin: not causal
