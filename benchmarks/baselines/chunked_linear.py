"""Causal linear attention by chunks (Katharopoulos et al. 2020; the chunked form of
Yang et al. 2023, "Gated Linear Attention", and of fla's `chunk` kernels).

Why it is the best a skilled user writes on a CPU: the cumsum form holds h×N×d×d prefix sums
(805 MB at N = 2048, 12 heads of 64) and the recurrent form runs N tiny steps. By chunks of C
positions, inside a chunk the causal part is a masked (C×C) score matrix, as softmax
attention's, and across chunks a running d×d state carries what earlier chunks contribute:
all matrix products, h×(N/C)×d×d states, no Python loop over positions (one over chunks for
the state, a cumsum over chunks here, so it is vectorised too). The feature map is
elu(x) + 1 and the normaliser φ(Q)·Σφ(K) + eps, as specs/linear_attention_causal.attn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def heads(x, weight, bias, h):
    return F.linear(x, weight, bias).unflatten(-1, (h, -1)).transpose(-3, -2)


def forward(x: torch.Tensor, p: dict, s: dict, eps: float = 1e-6) -> torch.Tensor:
    h = s["h"]
    q = F.elu(heads(x, p["q_proj_weight"], p["q_proj_bias"], h)) + 1
    k = F.elu(heads(x, p["k_proj_weight"], p["k_proj_bias"], h)) + 1
    v = heads(x, p["v_proj_weight"], p["v_proj_bias"], h)
    o = attend(q, k, v, eps, CHUNK)
    return F.linear(o.transpose(-3, -2).flatten(-2), p["o_proj_weight"], p["o_proj_bias"])


def attend(q, k, v, eps: float, chunk: int):
    n = q.shape[-2]
    pad = -n % chunk
    if pad:  # padded keys and values are zero: they add nothing to any state
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q, k, v = (t.unflatten(-2, (-1, chunk)) for t in (q, k, v))  # (..., h, chunks, C, d)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    local = (q @ k.transpose(-2, -1)).masked_fill_(~causal, 0)  # (..., h, chunks, C, C)
    states = k.transpose(-2, -1) @ v  # each chunk's Σ φ(K)ᵀ V: (..., h, chunks, d, d)
    sums = k.sum(-2)  # each chunk's Σ φ(K): (..., h, chunks, d)
    before = states.cumsum(-3) - states  # what earlier chunks hold, exclusive
    z_before = sums.cumsum(-2) - sums
    numerator = local @ v + q @ before
    z = local.sum(-1) + (q @ z_before[..., None]).squeeze(-1)
    out = numerator / (z[..., None] + eps)
    return out.flatten(-3, -2)[..., :n, :]
