"""Selective Attention (Leviathan et al. 2024) by hand, as the paper's pseudo-code writes it:
head 0's causal logits through a ReLU, the diagonal and the first token's column zeroed, rolled
down by one query, summed over queries and subtracted from every head's logits."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class SelectiveAttention(nn.Module):
    def forward(self, q, k, v):
        n = q.shape[-2]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        logits = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~causal, -torch.inf)
        s = torch.relu(logits[..., 0, :, :])  # head 0 selects, (..., N, N)
        not_selected = torch.eye(n, dtype=torch.bool, device=q.device)  # not itself
        not_selected[:, 0] = True  # nor the first token
        s = s.masked_fill(not_selected, 0.0)
        s = F.pad(s[..., :-1, :], (0, 0, 1, 0))  # roll by one query, the first row zero
        f = torch.cumsum(s, dim=-2)
        return torch.softmax(logits - f[..., None, :, :], dim=-1) @ v
