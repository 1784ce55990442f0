"""Native Sparse Attention (Yuan et al. 2025) by hand, as specs/nsa.attn simplifies it: the
selected branch gathers each query's top-n key blocks (torch.topk, then the blocks' keys
read by index) and attends over those blocks alone, as the paper's kernel does; nothing is
shared with the spec's dense mask."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .classic import merge_heads, split_heads


def masked_softmax(scores, visible):
    """softmax over the last axis of the visible entries; a row with none visible gives 0."""
    alive = visible.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~visible, -torch.inf).masked_fill(~alive, 0.0)
    return torch.softmax(scores, dim=-1) * alive


class NativeSparseAttention(nn.Module):
    def __init__(self, d_model, num_heads, head_dim, block, selected=2, window=8, gather=True):
        super().__init__()
        self.gather = gather  # False: the selected blocks as a mask over all keys
        self.num_heads, self.head_dim, self.block = num_heads, head_dim, block
        self.selected, self.window = selected, window
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.g_proj = nn.Linear(d_model, num_heads * 3, bias=False)
        self.phi = nn.Parameter(torch.randn(block) / block)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def compressed(self, q, k, v):
        """Scores and output over one key per block, the blocks ending at or before the query."""
        n, ell = q.shape[-2], self.block
        kc = torch.einsum("...bld,l->...bd", k.unflatten(-2, (n // ell, ell)), self.phi)
        vc = torch.einsum("...bld,l->...bd", v.unflatten(-2, (n // ell, ell)), self.phi)
        ends = (torch.arange(n // ell, device=q.device) + 1) * ell - 1
        visible = ends[None, :] <= torch.arange(n, device=q.device)[:, None]
        scores = (q @ kc.transpose(-2, -1) / math.sqrt(self.head_dim)).masked_fill(
            ~visible, -torch.inf
        )
        return scores, masked_softmax(scores, visible) @ vc

    def selected_blocks(self, scores, q, k, v):
        """Each query over its top-n blocks by compressed score and its own block, gathered."""
        n, ell = q.shape[-2], self.block
        top = scores.topk(self.selected, dim=-1).indices  # (..., h, N, n)
        own = torch.arange(n, device=q.device) // ell
        own = own.expand(*top.shape[:-1])[..., None]
        again = (top == own).any(dim=-1, keepdim=True)  # own block among the top: read once
        blocks = torch.cat([top, own], dim=-1)  # (..., h, N, n + 1)
        keys = blocks[..., None] * ell + torch.arange(ell, device=q.device)  # (..., n+1, ℓ)
        keys = keys.flatten(-2)  # (..., h, N, (n + 1) ℓ)
        rows = keys.flatten(-2)[..., None].expand(*keys.shape[:-2], -1, self.head_dim)
        k_sel = k.gather(-2, rows).unflatten(-2, keys.shape[-2:])  # (..., h, N, (n+1)ℓ, d)
        v_sel = v.gather(-2, rows).unflatten(-2, keys.shape[-2:])
        s = (q[..., None, :] * k_sel).sum(-1) / math.sqrt(self.head_dim)
        query = torch.arange(n, device=q.device)[:, None]
        duplicate = torch.zeros_like(keys, dtype=torch.bool)
        duplicate[..., -ell:] = again
        visible = (keys <= query) & ~duplicate
        return (masked_softmax(s, visible)[..., None] * v_sel).sum(-2)

    def selected_by_mask(self, scores, q, k, v):
        """The same by a mask over all keys: torch.topk's blocks scattered into it."""
        n, ell = q.shape[-2], self.block
        top = scores.topk(self.selected, dim=-1).indices
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
        t = torch.arange(n, device=q.device)
        chosen |= torch.arange(n // ell, device=q.device)[None, :] == (t // ell)[:, None]
        visible = chosen.repeat_interleave(ell, dim=-1) & (t[None, :] <= t[:, None])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)

    def windowed(self, q, k, v):
        n = q.shape[-2]
        t = torch.arange(n, device=q.device)
        gap = t[:, None] - t[None, :]
        visible = (gap >= 0) & (gap < self.window)
        return masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), visible) @ v

    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        scores, o_cmp = self.compressed(q, k, v)
        select = self.selected_blocks if self.gather else self.selected_by_mask
        o_slc = select(scores, q, k, v)
        o_win = self.windowed(q, k, v)
        gates = torch.sigmoid(self.g_proj(x)).unflatten(-1, (self.num_heads, 3))
        gates = gates.transpose(-3, -2)  # (..., h, N, 3)
        o = gates[..., 0:1] * o_cmp + gates[..., 1:2] * o_slc + gates[..., 2:3] * o_win
        return self.o_proj(merge_heads(o))
