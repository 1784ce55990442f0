"""Multi-head attention with one fused q/k/v weight, the two ways checkpoints store it.

Why it is the best a skilled user writes: one F.linear for the three projections, a view
into heads (no copy), the fused kernel with is_causal=True (flash attention's CPU path), and
one F.linear with the bias for the output. `qkv_major` is GPT-2's and nn.MultiheadAttention's
layout, W = [W_q; W_k; W_v] with heads inside each (rows (B μ a)); `head_major` is
specs/mha.attn's, each head's q, k, v rows together (rows (μ B a)). The two differ only in how
the projection's output is split: `chunk(3)` of the last axis, or a view (h, 3, d_k) and
`unbind`. Benchmarked against specs/mha.attn and benchmarks/specs/mha_qkv_major.attn.
"""

from __future__ import annotations

import torch.nn.functional as F


def qkv_major(x, p: dict, s: dict):
    qkv = F.linear(x, p["W"]).chunk(3, -1)
    q, k, v = (t.unflatten(-1, (s["h"], -1)).transpose(-3, -2) for t in qkv)
    return output(F.scaled_dot_product_attention(q, k, v, is_causal=True), p)


def head_major(x, p: dict, s: dict):
    q, k, v = split_head_major(x, p, s["h"])
    return output(F.scaled_dot_product_attention(q, k, v, is_causal=True), p)


def split_head_major(x, p: dict, h: int):
    qkv = F.linear(x, p["W"]).unflatten(-1, (h, 3, -1)).transpose(-4, -3)  # (..., h, N, 3, d)
    return qkv.unbind(-2)


def output(o, p: dict):
    return F.linear(o.transpose(-3, -2).flatten(-2), p["W_O"], p["b_O"])
