"""The runtime every generated module imports (indexattn/runtime/lib.py), on its own: each
function against a reference written here by other means, each with a twin that perturbs one
thing and sees the difference."""

import pytest
import torch
import torch.nn.functional as F

from indexattn.runtime import lib as rt


def seen_spans(keep: torch.Tensor, block: int) -> list[tuple]:
    """Per block of queries, the first and last key any of them sees (a reference)."""
    out = []
    for t in range(0, keep.shape[0], block):
        u = min(t + block, keep.shape[0])
        keys = keep[t:u].any(0).nonzero().flatten().tolist()
        k0, k1 = (keys[0], keys[-1] + 1) if keys else (0, keep.shape[1])
        out.append((t, u, k0, k1, bool(keep[t:u, k0:k1].all())))
    return out


@pytest.mark.parametrize("window", [3, 6])
def test_key_spans_are_the_keys_each_block_sees(window, monkeypatch):
    """A causal window at 32 queries, 4 a block: the spans are the reference's, for a mask of
    booleans (kept where true) and its additive form; the twin: one more key seen at the
    last query widens the last span."""
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    tau = torch.arange(32)
    keep = (tau[:, None] >= tau[None, :]) & (tau[:, None] - tau[None, :] < window)
    want = seen_spans(keep, 4)
    assert rt.key_spans(keep, "false") == want
    assert rt.key_spans(torch.zeros(32, 32).masked_fill(~keep, -torch.inf), "-inf") == want
    wider = keep.clone()
    wider[31, 0] = True
    assert rt.key_spans(wider, "false")[-1][2] == 0 != want[-1][2]


def test_key_spans_of_a_mask_that_hides_little_run_the_kernel_once(monkeypatch):
    """Blocks that would skip less than a fifth of the scores: None (one kernel call), or with
    `blocks` every key for each block; the twin, a narrow window, gives spans."""
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    tau = torch.arange(16)
    causal = tau[:, None] >= tau[None, :]
    assert rt.key_spans(causal | True, "false") == [(0, 16, 0, 16, True)]
    assert rt.key_spans(tau[:, None] - tau[None, :] < 15, "false") is None
    every = rt.key_spans(tau[:, None] - tau[None, :] < 15, "false", blocks=True)
    assert every == [(t, t + 4, 0, 16, False) for t in range(0, 16, 4)]
    assert rt.key_spans(causal & (tau[:, None] - tau[None, :] < 2), "false") is not None


def test_key_spans_read_nothing_back_off_the_host_devices(monkeypatch):
    """A mask read on every call, on a device not in HOST_READS, is never read: every key;
    the twin, the CPU in HOST_READS, reads the spans."""
    tau = torch.arange(8)
    keep = (tau[:, None] >= tau[None, :]) & (tau[:, None] - tau[None, :] < 2)
    monkeypatch.setattr(rt, "QUERY_BLOCK", 2)
    assert rt.key_spans(keep, "false", every_call=True) == seen_spans(keep, 2)
    monkeypatch.setattr(rt, "HOST_READS", ())
    assert rt.key_spans(keep, "false", every_call=True) is None


def test_safe_softmax_gives_zeros_on_a_dead_row_on_every_path(monkeypatch):
    """A row -inf everywhere: zeros and zero gradients, with and without HOST_READS, in place
    or not; live rows as torch.softmax's. The twin: torch.softmax gives NaN there."""
    scores = torch.randn(3, 5, dtype=torch.float64)
    scores[1] = -torch.inf
    want = torch.softmax(scores, -1)
    assert want[1].isnan().all()
    want[1] = 0
    for reads in (("cpu",), ()):
        monkeypatch.setattr(rt, "HOST_READS", reads)
        got = rt.safe_softmax(scores.clone(), -1, overwrite=True)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
        leaf = scores.clone().requires_grad_()
        got = rt.safe_softmax(leaf, -1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
        got.sum().backward()
        assert leaf.grad.isfinite().all() and leaf.grad[1].eq(0).all()


def test_softmax_values_is_softmax_then_the_product_values_and_gradients():
    """One autograd step against autograd's own steps: equal outputs and gradients; the
    twin: another value of the weights' gradient is seen."""
    scores = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    values = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    weights, out = rt.softmax_values(scores, values)
    plain = torch.softmax(scores, -1)
    torch.testing.assert_close(weights, plain, rtol=0, atol=1e-15)
    torch.testing.assert_close(out, plain @ values, rtol=0, atol=1e-15)
    probe = torch.randn_like(weights)
    got = torch.autograd.grad((out.sum() + (weights * probe).sum()), (scores, values))
    loss = (plain @ values).sum() + (plain * probe).sum()
    want = torch.autograd.grad(loss, (scores, values), retain_graph=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    other = torch.autograd.grad(((plain @ values).sum() + plain.sum()), scores)[0]
    assert not torch.allclose(got[0], other)


def test_softmax_values_with_dropout_draws_as_f_dropout():
    """In training, the weights' dropout draws what F.dropout draws at the same seed, and the
    gradients are autograd's of those steps; the twin: another seed draws another mask."""
    scores = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    values = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    weights, out = rt.softmax_values(scores, values, p=0.5, training=True)
    torch.manual_seed(0)
    plain = F.dropout(torch.softmax(scores, -1), 0.5, training=True)
    torch.testing.assert_close(weights, plain, rtol=0, atol=1e-15)
    got = torch.autograd.grad(out.sum(), (scores, values))
    want = torch.autograd.grad((plain @ values).sum(), (scores, values))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    torch.manual_seed(1)
    assert not torch.equal(rt.softmax_values(scores, values, p=0.5, training=True)[0], weights)


def attention_block(t, u, k0, k1, q, k, v):
    """One block of queries over its keys: softmax attention (a block function)."""
    return torch.softmax(q @ k.mT, -1) @ v


def test_by_blocks_equals_the_whole_and_its_plain_blocks():
    """Blocks of queries over every key, as one autograd step: the output and gradients of
    the whole computation, and of the plain blocks (each_block); the twin: a span that
    leaves out a key differs."""
    q, k, v = (torch.randn(2, 8, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    spans = [(0, 3, 0, 8), (3, 8, 0, 8)]
    cuts = ({-2: "q"}, {-2: "k"}, {-2: "k"})
    whole = attention_block(0, 8, 0, 8, q, k, v)
    want = torch.autograd.grad(whole.square().sum(), (q, k, v), retain_graph=True)
    for function in (rt.by_blocks, rt.each_block):
        out = function(attention_block, spans, (q, k, v), cuts)
        torch.testing.assert_close(out, whole, rtol=0, atol=1e-14)
        got = torch.autograd.grad(out.square().sum(), (q, k, v))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    short = rt.by_blocks(attention_block, [(0, 3, 0, 8), (3, 8, 0, 7)], (q, k, v), cuts)
    assert not torch.allclose(short, whole)


def test_recomputed_is_the_call_values_and_gradients():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = rt.recomputed(torch.tanh, x)
    torch.testing.assert_close(out, torch.tanh(x), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, 1 - torch.tanh(x) ** 2, rtol=0, atol=1e-15)
    assert not torch.allclose(rt.recomputed(torch.sin, x), out)  # the twin: another function


def test_top_k_keeps_the_k_largest_ties_by_position():
    """Against a rank written here: each entry's place in the descending order, ties by
    position, below k; the twin: k + 1 keeps one more per row."""
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0], [0.0, 5.0, 5.0, 1.0, 2.0]])
    order = sorted(range(5), key=lambda j: -x[0, j].item())  # stable: ties by position
    assert order == [0, 2, 4, 3, 1]
    for k in (1, 2, 3):
        want = torch.zeros_like(x, dtype=torch.bool)
        for row in range(2):
            for j in sorted(range(5), key=lambda j, row=row: -x[row, j].item())[:k]:
                want[row, j] = True
        assert torch.equal(rt.top_k(x, k, dim=-1), want)
    assert rt.top_k(x, 3, -1).sum() == rt.top_k(x, 2, -1).sum() + 2
    assert not rt.top_k(x, 0, -1).any()
