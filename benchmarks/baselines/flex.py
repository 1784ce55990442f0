"""FlexAttention (torch.nn.attention.flex_attention), the masks and score changes it expresses.

Why it is the best a skilled user writes: FlexAttention is PyTorch's own answer to "attention
with a custom mask or bias": the mask is a `mask_mod` turned into a block mask, whose empty
blocks the kernel never visits (a window costs O(N w), not O(N²)), and a bias or soft-cap is
a `score_mod` fused into the kernel, under torch.compile as its documentation requires.
Static masks are built once per length and cached, as its documentation recommends; the
document mask depends on the call's ids, so it is built per call. Projections are the plain
F.linear of each spec's layout. On a CPU torch 2.13 compiles the forward only (no backward;
float32, float16 and bfloat16 only): benchmarks/independent.py times forward+backward where a
GPU is present. specs: mha (causal), sliding_window, softcap_window (tanh soft-cap), alibi,
doc_mask.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from . import fused_qkv


@functools.cache
def compiled():
    # each mask, score change and shape is a recompile of the one frame (static shapes), more
    # than dynamo's default limit of 8 in one benchmark process
    torch._dynamo.config.recompile_limit = 64
    return torch.compile(flex_attention, dynamic=False)


def attend(q, k, v, **kwargs):
    """flex_attention, compiled (tests call the eager one: float64, no compile)."""
    return compiled()(q, k, v, **kwargs)


def causal(b, h, q, kv):
    return kv <= q


@functools.lru_cache(maxsize=16)
def static_mask(n: int, window: int | None, device: torch.device):
    """Causal, and with a window the keys q - window < kv <= q: built once per length (outside
    inference mode, so a forward's cache serves a training step)."""

    def windowed(b, h, q, kv):
        return (kv <= q) & (q - kv < window)

    with torch.inference_mode(False):
        mod = causal if window is None else windowed
        return create_block_mask(mod, None, None, n, n, device=device)


def heads(x, weight, h):
    return F.linear(x, weight).unflatten(-1, (h, -1)).transpose(-3, -2)


def merged(o):
    return o.transpose(-3, -2).flatten(-2)


def mha(x, p: dict, s: dict):
    """specs/mha.attn: one fused head-major q/k/v weight, causal."""
    q, k, v = fused_qkv.split_head_major(x, p, s["h"])
    return fused_qkv.output(attend(q, k, v, block_mask=static_mask(x.shape[-2], None, x.device)), p)


def sliding_window(x, p: dict, s: dict):
    """specs/sliding_window.attn: causal, the last w keys."""
    q, k, v = (heads(x, p[f"W_{t}_weight"], s["h"]) for t in ("query", "key", "value"))
    o = attend(q, k, v, block_mask=static_mask(x.shape[-2], s["w"], x.device))
    return F.linear(merged(o), p["out_proj_weight"], p["out_proj_bias"])


def softcap_window(x, p: dict, s: dict):
    """specs/softcap_window.attn (Gemma 2): scores soft-capped to (-c, c), then windowed."""
    q, k, v = (heads(x, p[f"{t}_proj_weight"], s["h"]) for t in "qkv")
    cap = s["c"]

    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    mask = static_mask(x.shape[-2], s["w"], x.device)
    scale = s["query_pre_attn_scalar"] ** -0.5
    o = attend(q, k, v, score_mod=softcap, block_mask=mask, scale=scale)
    return F.linear(merged(o), p["o_proj_weight"])


def alibi(x, p: dict, s: dict):
    """specs/alibi.attn: score - m_μ (q - kv), slopes m_μ = 2^(-8(μ+1)/h), causal."""
    h = s["h"]
    q, k, v = (heads(x, p[f"W_{t}_weight"], h) for t in ("query", "key", "value"))
    slopes = 2 ** (-8 * torch.arange(1, h + 1, dtype=x.dtype, device=x.device) / h)

    def bias(score, b, head, q_idx, kv_idx):
        return score - slopes[head] * (q_idx - kv_idx)

    o = attend(q, k, v, score_mod=bias, block_mask=static_mask(x.shape[-2], None, x.device))
    return F.linear(merged(o), p["out_proj_weight"], p["out_proj_bias"])


def doc_mask(x, doc, p: dict, s: dict):
    """specs/doc_mask.attn: causal within each document of a packed sequence (FlexAttention's
    document mask), the block mask built from this call's ids."""
    q, k, v = (heads(x, p[f"{t}_proj_weight"], s["h"]) for t in "qkv")

    def same_document(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    n = x.shape[-2]
    mask = create_block_mask(same_document, doc.shape[0], None, n, n, device=x.device)
    return F.linear(merged(attend(q, k, v, block_mask=mask)), p["o_proj_weight"])
