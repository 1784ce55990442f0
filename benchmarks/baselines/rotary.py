"""Rotary position embeddings as the model libraries write them, then the fused kernel.

Why it is the best a skilled user writes: transformers' Llama, GPT-J and GPT-NeoX code,
tidied. The angle table (positions × inverse frequencies, duplicated to the head's width the
way the rotation reads it) is one outer product, built in float64 and cast once, per call as
transformers' rotary embedding module does (N × d_k values: noise beside the attention).
The rotation is two multiplies and an add against a rotated copy, `rotate_half` (Llama,
NeoX: halves (x1, x2) -> (-x2, x1)) or `rotate_every_two` (GPT-J: pairs); then
F.scaled_dot_product_attention with is_causal=True and one F.linear out. Eager, each step is
one ATen call; under torch.compile the rotation and the copies around it fuse into one
kernel per tensor, which is the version the rotary specs have to match.
specs: rope.attn (rotate-half), rope_interleaved.attn (GPT-J), rope_partial.attn (NeoX:
a quarter of each head rotated, a fused head-major projection with bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def heads(x, weight, h, bias=None):
    return F.linear(x, weight, bias).unflatten(-1, (h, -1)).transpose(-3, -2)


def angles(n: int, d: int, like: torch.Tensor, base: float = 10000.0):
    """cos and sin of (position × base^(-2j/d)), (n, d/2), in like's dtype and device."""
    inv_freq = base ** -(torch.arange(0, d, 2, dtype=torch.float64, device=like.device) / d)
    theta = torch.outer(torch.arange(n, dtype=torch.float64, device=like.device), inv_freq)
    return theta.cos().to(like.dtype), theta.sin().to(like.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), -1).flatten(-2)


def llama(x, p: dict, s: dict):
    """specs/rope.attn: Llama's apply_rotary_pos_emb on every feature of q and k."""
    q, k, v = (heads(x, p[f"{t}_proj_weight"], s["h"]) for t in "qkv")
    cos, sin = (torch.cat((t, t), -1) for t in angles(x.shape[-2], q.shape[-1], q))
    q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(-3, -2).flatten(-2), p["o_proj_weight"])


def gptj(x, p: dict, s: dict):
    """specs/rope_interleaved.attn: GPT-J's rotate_every_two, angles repeated pairwise."""
    q, k, v = (heads(x, p[f"{t}_proj_weight"], s["h"]) for t in "qkv")
    cos, sin = (t.repeat_interleave(2, -1) for t in angles(x.shape[-2], q.shape[-1], q))
    q, k = (t * cos + rotate_every_two(t) * sin for t in (q, k))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(-3, -2).flatten(-2), p["out_proj_weight"])


def neox(x, p: dict, s: dict):
    """specs/rope_partial.attn: GPT-NeoX's fused head-major projection, the first
    rotary_ndims = 2 d_r features of each head rotated (rotate-half), the rest passed through."""
    w, b = p["query_key_value_weight"], p["query_key_value_bias"]
    q, k, v = heads(x, w, s["h"], b).chunk(3, -1)  # each head's rows (B a): q, k, v
    rot = 2 * s["d_r"]
    cos, sin = (torch.cat((t, t), -1) for t in angles(x.shape[-2], rot, q))
    q, k = (
        torch.cat((t[..., :rot] * cos + rotate_half(t[..., :rot]) * sin, t[..., rot:]), -1)
        for t in (q, k)
    )
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(-3, -2).flatten(-2), p["dense_weight"], p["dense_bias"])
