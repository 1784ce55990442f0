"""The softmax attention core and the log-sum-exp of its scores, as one autograd step: what a
ring's tile pair merges (indexattn/parallel/ring.py), computed by the kernel one process
calls for the same core (`F.scaled_dot_product_attention`'s flash kernel on a CPU).

    out, lse = attention_lse(q, k, v, mask, causal, scale)   # q, k, v: (..., heads, n, d)

`out` is softmax(scale · q kᵀ + mask) v, `lse` the log-sum-exp over the keys of the same
scores: −∞ for a row that the mask hides entirely (its `out` is 0), with gradient 0 there.
Both are differentiable: the backward is one call of the kernel's backward, with no second
forward, for the gradients of `out` and `lse` together. The kernel's backward takes
D = rowsum(dO ∘ O) from its saved output and gradient; the log-sum-exp's gradient, where
given, enters as D − dL, by one more feature column (`_kernel_grads`). On another device (or
another dtype than the kernel's) the same values come from the plain formula, through
autograd.
"""

from __future__ import annotations

import torch

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
FLASH_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def attention_lse(q, k, v, mask=None, causal=False, scale=1.0):
    """(softmax(scale · q kᵀ + mask) v, logsumexp of those scores over the keys): q (..., n,
    d), k and v (..., m, d) with the same leading axes; `mask` additive (0 or −∞) of
    (n, m), or None; `causal`: keys after their query hidden (n = m, one range)."""
    if not _kernel_takes(q):
        return plain_lse(q, k, v, mask, causal, scale)
    width, (q, k, v) = v.shape[-1], _one_width(q, k, v)
    out, lse = _FlashLSE.apply(q, k, v, mask, causal, scale)
    return out[..., :width], lse


def _kernel_takes(q: torch.Tensor) -> bool:
    """Whether the CPU flash kernel runs this call (else the formula)."""
    return q.device.type == "cpu" and q.dtype in FLASH_DTYPES and q.dim() == 4


def _one_width(*operands: torch.Tensor) -> tuple:
    """The operands padded with features of 0 to the widest one's width: the kernel takes one
    head size, and keys of other width than values (DeepSeek's latent attention) are exact so,
    a feature of 0 changing no score, and making outputs and gradients of 0 where it was put."""
    width = max(t.shape[-1] for t in operands)
    pad = torch.nn.functional.pad
    return tuple(t if t.shape[-1] == width else pad(t, (0, width - t.shape[-1])) for t in operands)


def dense(t: torch.Tensor) -> torch.Tensor:
    """The tensor with its feature (last) axis contiguous, copied only where it is not: the
    kernel is 8 times slower on a strided feature axis, and the same to the bit on a tile
    cut from a longer block (its other axes strided)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _scores(q, k, mask, causal, scale):
    """scale · q kᵀ plus the mask, keys after their query −∞ where `causal`."""
    scores = (q @ k.mT) * scale
    if causal:
        n, m = scores.shape[-2:]
        hidden = torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, -torch.inf)
    return scores if mask is None else scores + mask


def plain_lse(q, k, v, mask=None, causal=False, scale=1.0):
    """attention_lse by the formula, through autograd (any device): the judge in tests."""
    scores = _scores(q, k, mask, causal, scale)
    top = scores.detach().amax(-1, keepdim=True)
    top = torch.where(top.isneginf(), torch.zeros_like(top), top)
    total = (scores - top).exp().sum(-1, keepdim=True)
    empty = total == 0
    weights = (scores - top).exp() / torch.where(empty, 1.0, total)
    lse = torch.where(empty, -torch.inf, top + torch.log(torch.where(empty, 1.0, total)))
    return weights @ v, lse.squeeze(-1)


def _hidden_rows(mask, shape):
    """The rows the mask hides entirely, broadcast to the log-sum-exp's shape; None: none."""
    if mask is None:
        return None
    rows = mask.amax(-1).isneginf()
    return rows.expand(shape) if bool(rows.any()) else None


class _FlashLSE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        # the views given are saved, not the copies (the backward pads them, which copies)
        operands = (dense(t) for t in (q, k, v))
        out, lse = _FLASH(*operands, 0.0, causal, attn_mask=mask, scale=scale)
        hidden = _hidden_rows(mask, lse.shape)
        if hidden is not None:  # the kernel says 0 there
            lse = lse.masked_fill(hidden, -torch.inf)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.causal, ctx.scale, ctx.hidden = mask, causal, scale, hidden
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if ctx.hidden is not None:  # the kernel's own 0 at a hidden row: P is 0 there
            lse = lse.masked_fill(ctx.hidden, 0.0)
            if grad_lse is not None:
                grad_lse = grad_lse.masked_fill(ctx.hidden, 0.0)
        grads = _kernel_grads(
            grad_out.to(out.dtype), q, k, v, out, lse, ctx.mask, ctx.causal, ctx.scale, grad_lse
        )
        return (*grads, None, None, None)


def _kernel_grads(grad_out, q, k, v, out, lse, mask, causal, scale, grad_lse=None):
    """The CPU flash kernel's backward, which makes D = rowsum(grad_out ∘ out) itself; a
    log-sum-exp's gradient enters as D − dL, by one more feature column (the gradient 1
    against an output column −dL, over query, key and value columns of 0, which change no
    score)."""
    if grad_lse is None:
        q, k, v = (dense(t) for t in (q, k, v))
    else:
        one, zero = q.new_ones(()), q.new_zeros(())

        def pad(t, c):
            return torch.cat([t, c.expand(*t.shape[:-1], 1)], -1)

        grad_out, q, k, v = pad(grad_out, one), pad(q, zero), pad(k, zero), pad(v, zero)
        out = torch.cat([out, (-grad_lse).to(out.dtype)[..., None]], -1)
    grads = _FLASH_BACKWARD(grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale)
    return grads if grad_lse is None else tuple(g[..., :-1] for g in grads)


def attention_grads(grad_out, q, k, v, out, lse, mask=None, causal=False, scale=1.0, grad_lse=None):
    """(dq, dk, dv) of one tile pair of the core above, from its rows' final output `out` and
    log-sum-exp `lse`, merged over every key tile (a ring's backward, FlashAttention's):
    P = exp(scale · q kᵀ + mask − lse), D = rowsum(grad_out ∘ out), dS = P ∘ (grad_out vᵀ − D).
    Summed over a row's key tiles they are the gradients of the whole; a row that sees no key
    anywhere (`lse` −∞) gets none. `grad_lse`: the gradient of the rows' log-sum-exp too,
    where it is read (D − dL in its place). On a CPU one call of the flash kernel's backward,
    which makes D from `out` itself; elsewhere the formula."""
    if not _kernel_takes(q):
        return plain_grads(grad_out, q, k, v, out, lse, mask, causal, scale, grad_lse)
    widths = (q.shape[-1], k.shape[-1], v.shape[-1])
    grad_out, out = grad_out.to(q.dtype), out.to(q.dtype)
    grad_out, q, k, v, out = (dense(t) for t in _one_width(grad_out, q, k, v, out))
    lse = seen_rows(lse).to(torch.promote_types(q.dtype, torch.float32))
    grads = _kernel_grads(grad_out, q, k, v, out, lse, mask, causal, scale, grad_lse)
    return tuple(g[..., :w] for g, w in zip(grads, widths))


def seen_rows(lse):
    """A row that sees no key (log-sum-exp −∞) read at 0: its scores are all −∞, P is 0."""
    return lse.masked_fill(lse.isneginf(), 0.0)


def plain_grads(grad_out, q, k, v, out, lse, mask=None, causal=False, scale=1.0, grad_lse=None):
    """attention_grads by the formula (any device): the judge in tests."""
    grad_out, out, lse = grad_out.to(q.dtype), out.to(q.dtype), seen_rows(lse)
    scores = _scores(q, k, mask, causal, scale)
    weights = (scores - lse.unsqueeze(-1)).exp()
    row = (grad_out * out).sum(-1, keepdim=True)
    if grad_lse is not None:
        row = row - grad_lse.to(row.dtype).unsqueeze(-1)
    grad = (grad_out @ v.mT).sub_(row).mul_(weights)
    return (grad @ k) * scale, (grad.mT @ q) * scale, weights.mT @ grad_out


def softmax_values_lse(scores, values):
    """(softmax(scores) values, logsumexp(scores)) over the last axis of the scores, as one
    autograd step: one exponential of the scores, the statistic from the same pass; a row of
    −∞ gives 0 and −∞, with gradient 0. The backward makes the scores' gradient as the
    kernel's does, P ∘ (dO vᵀ − D), D = rowsum(dO ∘ O) − dL."""
    return _SoftmaxValuesLSE.apply(scores, values)


class _SoftmaxValuesLSE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, values):
        top = scores.amax(-1, keepdim=True)
        top = top.masked_fill_(top.isneginf(), 0.0)
        weights = (scores - top).exp_()
        total = weights.sum(-1, keepdim=True)
        lse = (top + total.log()).squeeze(-1)  # log 0 = −∞ where a row sees nothing
        weights = weights.div_(total.masked_fill_(total == 0, 1.0))
        out = weights @ values
        ctx.save_for_backward(weights, values, out)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        weights, values, out = ctx.saved_tensors
        grad_values = None
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        elif ctx.needs_input_grad[1]:
            grad_values = weights.mT @ grad_out
        row = (grad_out * out).sum(-1, keepdim=True)
        if grad_lse is not None:
            row = row - grad_lse.unsqueeze(-1)
        grad = (grad_out @ values.mT).sub_(row).mul_(weights)
        return grad, grad_values
