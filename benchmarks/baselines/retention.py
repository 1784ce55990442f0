"""Retention (Sun et al. 2023, "Retentive Network"), its chunkwise form.

Why it is the best a skilled user writes for long sequences: the parallel form
(Q Kᵀ ⊙ D) V materialises the h×N×N decay-weighted scores, half of them zeros above the
diagonal. The paper's chunkwise form keeps that only inside chunks of C positions and carries
a d×d state across chunks, decayed by γ^C per chunk: O(N C d + N d²) work, no N×N tensor.
Within a chunk the decay matrix D[t, s] = γ^(t - s) (t ≥ s) is built once per shape; across
chunks the state of chunk c is Σ_s γ^(C - 1 - s) K_sᵀ V_s, and chunk c reads
Σ_(c' < c) γ^(C (c - 1 - c')) state_c' scaled by γ^(t + 1) at its row t — computed here for
all chunks at once by a decayed prefix sum (a small matrix of γ powers over the chunks).
specs: specs/retention.attn (λ = log γ per head, scores scaled by 1/sqrt(d_k), no
GroupNorm).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

CHUNK = 128


def heads(x, weight, h):
    return F.linear(x, weight).unflatten(-1, (h, -1)).transpose(-3, -2)


def forward(x: torch.Tensor, p: dict, s: dict) -> torch.Tensor:
    h = s["h"]
    q, k, v = (heads(x, p[name], h) for name in ("W_Q", "W_K", "W_V"))
    o = attend(q / math.sqrt(q.shape[-1]), k, v, p["lambda_"], CHUNK)
    return F.linear(o.transpose(-3, -2).flatten(-2), p["W_O"])


def attend(q, k, v, log_gamma, chunk: int):
    n = q.shape[-2]
    chunk = min(chunk, n)
    pad = -n % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q, k, v = (t.unflatten(-2, (-1, chunk)) for t in (q, k, v))  # (..., h, m, C, d)
    m = q.shape[-3]
    t = torch.arange(chunk, device=q.device, dtype=q.dtype)
    lam = log_gamma[:, None, None]  # (h, 1, 1)
    gap = t[:, None] - t[None, :]  # clamped below: exp of the unused side never overflows
    inner = torch.where(gap >= 0, (gap.clamp(min=0) * lam).exp(), 0)  # (h, C, C): γ^(t - s), t ≥ s
    local = (q @ k.transpose(-2, -1)) * inner[:, None]  # (..., h, m, C, C)
    out = local @ v
    into = ((chunk - 1 - t) * lam).exp()  # (h, 1, C): γ^(C - 1 - s) into the chunk's state
    states = (k * into[..., None]).transpose(-2, -1) @ v  # (..., h, m, d, d)
    c = torch.arange(m, device=q.device, dtype=q.dtype)
    steps = c[:, None] - 1 - c[None, :]  # chunk c reads chunk c' < c decayed γ^(C (c - 1 - c'))
    carry = torch.where(steps >= 0, (steps.clamp(min=0) * chunk * lam).exp(), 0)  # (h, m, m)
    held = torch.einsum("hcz,...hzde->...hcde", carry, states)  # (..., h, m, d, d)
    out = out + (q * ((t + 1) * lam).exp()[..., None]) @ held
    return out.flatten(-3, -2)[..., :n, :]
