"""Mamba-2's SSD by hand, two ways: the recurrence over positions (the state space model as
defined) and the quadratic form of the reference code's ssd_minimal (segsum, one einsum)."""

import torch
from torch import nn


def segsum(a):
    """a_(τ'+1) + ... + a_τ at [τ, τ'] for τ' ≤ τ, -inf above: ssd_minimal's stable form."""
    n = a.shape[-1]
    x = a[..., None].expand(*a.shape, n)
    below = torch.tril(torch.ones(n, n, dtype=torch.bool, device=a.device), diagonal=-1)
    sums = torch.cumsum(x.masked_fill(~below, 0), dim=-2)
    keep = torch.tril(torch.ones(n, n, dtype=torch.bool, device=a.device))
    return sums.masked_fill(~keep, -torch.inf)


def recurrence(x, a, b, c):
    """h_τ = exp(a_τ) h_(τ-1) + B_τ x_τᵀ, y_τ = C_τ h_τ, position by position."""
    state = torch.zeros(*x.shape[:-2], b.shape[-1], x.shape[-1], dtype=x.dtype)
    out = []
    for t in range(x.shape[-2]):
        state = torch.exp(a[..., t, None, None]) * state + b[..., t, :, None] * x[..., t, None, :]
        out.append((c[..., t, :, None] * state).sum(-2))
    return torch.stack(out, dim=-2)


class SSD(nn.Module):
    """The quadratic form: (L ∘ C Bᵀ) X, inputs (..., h, N, ·) and a (..., h, N)."""

    def forward(self, x, a, b, c):
        decay = torch.exp(segsum(a))
        return torch.einsum("...ts,...us,...tu,...up->...tp", c, b, decay, x)
