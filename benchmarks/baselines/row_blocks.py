"""Softmax attention by blocks of 256 queries, over the keys each block's mask keeps, each
block's mask or bias made from its O(N) positions: what a skilled engineer writes to keep
memory linear in N without a fused kernel (FlashAttention's outer loop in eager PyTorch).
In a training step each block runs under torch.utils.checkpoint, so the backward makes the
block's scores again instead of keeping every block's: one block's h×256×N at a time.

One function per spec of benchmarks/scaling.py; each takes the spec module's parameters by
name and its scalars (`s`), and returns the spec's output. Retention and causal linear
attention run by chunks instead (retention.py, chunked_linear.py beside this file).
specs: mha, sliding_window, softcap_window, alibi, t5_bias, doc_mask, attention_sinks,
differential (specs/*.attn).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

BLOCK = 256


def heads(x, weight, count, bias=None):
    """(b, N, d_m) projected to (b, count, N, width)."""
    return F.linear(x, weight, bias).unflatten(-1, (count, -1)).transpose(-3, -2)


def merge(o, weight, bias=None):
    return F.linear(o.transpose(-3, -2).flatten(-2), weight, bias)


def by_blocks(attend, first_key, q, k, v, last_key=None):
    """attend(qb, kb, vb, rows, keys) over blocks of 256 queries, keys first_key(t)..u (or
    last_key(u)); checkpointed per block when gradients are on."""
    n = q.shape[-2]
    pos, out = torch.arange(n, device=q.device), []
    for t in range(0, n, BLOCK):
        u = min(t + BLOCK, n)
        k0, k1 = first_key(t), (last_key or (lambda u: u))(u)
        args = (q[..., t:u, :], k[..., k0:k1, :], v[..., k0:k1, :], pos[t:u], pos[k0:k1])
        out.append(
            checkpoint(attend, *args, use_reentrant=False) if q.requires_grad else attend(*args)
        )
    return torch.cat(out, -2)


def causal(rows, keys, window=None):
    """True where the query at `rows` sees the key at `keys`."""
    d = rows[:, None] - keys[None, :]
    return (d >= 0) & (d < window) if window else d >= 0


def sdpa(keep):
    return lambda qb, kb, vb, rows, keys: F.scaled_dot_product_attention(
        qb, kb, vb, attn_mask=keep(rows, keys)
    )


def mha(x, p, s):
    q, k, v = heads(x, p["W"], 3 * s["h"]).unflatten(-3, (s["h"], 3)).unbind(-3)  # rows (μ, 3, a)
    o = by_blocks(sdpa(causal), lambda t: 0, q, k, v)
    return merge(o, p["W_O"], p["b_O"])


def sliding_window(x, p, s):
    q, k, v = (heads(x, p[f"W_{w}_weight"], s["h"]) for w in ("query", "key", "value"))
    w = s["w"]
    o = by_blocks(sdpa(lambda r, c: causal(r, c, w)), lambda t: max(0, t - w + 1), q, k, v)
    return merge(o, p["out_proj_weight"], p["out_proj_bias"])


def softcap_window(x, p, s):
    q, k, v = (heads(x, p[f"{w}_proj_weight"], s["h"]) for w in "qkv")
    w, c, scale = s["w"], s["c"], 1 / math.sqrt(s["query_pre_attn_scalar"])

    def attend(qb, kb, vb, rows, keys):
        scores = torch.tanh(qb @ kb.mT * (scale / c)) * c
        scores = scores.masked_fill(~causal(rows, keys, w), -math.inf)
        return torch.softmax(scores, -1) @ vb

    o = by_blocks(attend, lambda t: max(0, t - w + 1), q, k, v)
    return merge(o, p["o_proj_weight"])


def alibi(x, p, s):
    h = s["h"]
    q, k, v = (heads(x, p[f"W_{w}_weight"], h) for w in ("query", "key", "value"))
    slope = 2.0 ** (-8 * torch.arange(1, h + 1, device=x.device, dtype=x.dtype) / h)[:, None, None]

    def attend(qb, kb, vb, rows, keys):
        d = (keys[None, :] - rows[:, None]).to(qb.dtype)  # ≤ 0 where kept
        bias = (slope * d).masked_fill(d > 0, -math.inf)
        return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias)

    o = by_blocks(attend, lambda t: 0, q, k, v)
    return merge(o, p["out_proj_weight"], p["out_proj_bias"])


def t5_buckets(distance):
    """T5's bidirectional bucket of key minus query: 16 buckets a side, exact below 8, then
    one more at each doubling of the distance up to 128."""
    rho = distance.abs()
    far = 8 + sum((rho * rho >= 64 * 2 ** (m + 1)).long() for m in range(7))
    return torch.where(distance > 0, 16, 0) + torch.where(rho < 8, rho, far)


def t5_bias(x, p, s):
    q, k, v = (heads(x, p[f"{w}_weight"], s["h"]) for w in "qkv")
    n = x.shape[-2]
    ids = t5_buckets(torch.arange(1 - n, n, device=x.device))  # the 2N - 1 distances, once
    table = p["relative_attention_bias_weight"]

    def attend(qb, kb, vb, rows, keys):
        bias = table[ids[keys[None, :] - rows[:, None] + n - 1]].permute(2, 0, 1)
        return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias, scale=1.0)

    o = by_blocks(attend, lambda t: 0, q, k, v, last_key=lambda u: n)
    return merge(o, p["o_weight"])


def doc_mask(x, documents, p, s):
    """Documents contiguous, ids ascending (as the benchmark's): a block's keys start at its
    first query's document."""
    q, k, v = (heads(x, p[f"{w}_proj_weight"], s["h"]) for w in "qkv")
    ids = documents.reshape(-1)
    starts = torch.searchsorted(ids, ids)  # each position's document start, O(N)

    def keep(rows, keys):
        return causal(rows, keys) & (ids[rows][:, None] == ids[keys][None, :])

    o = by_blocks(sdpa(keep), lambda t: int(starts[t]), q, k, v)
    return merge(o, p["o_proj_weight"])


def attention_sinks(x, p, s):
    g, r, w = s["h_kv"], s["n_rep"], s["w"]
    q = heads(x, p["q_proj_weight"], g * r, p["q_proj_bias"]).unflatten(-3, (g, r))
    k, v = (heads(x, p[f"{n}_proj_weight"], g, p[f"{n}_proj_bias"])[..., None, :, :] for n in "kv")
    sinks = p["sinks"].view(g, r, 1, 1)
    scale = 1 / math.sqrt(q.shape[-1])

    def attend(qb, kb, vb, rows, keys):
        scores = (qb @ kb.mT * scale).masked_fill(~causal(rows, keys, w), -math.inf)
        lse = scores.logsumexp(-1, keepdim=True)
        return (scores - lse).exp() * torch.sigmoid(lse - sinks) @ vb

    o = by_blocks(attend, lambda t: max(0, t - w + 1), q, k, v).flatten(-4, -3)
    return merge(o, p["o_proj_weight"], p["o_proj_bias"])


def differential(x, p, s):
    h = s["h"]
    q, k = (heads(x, p[f"{n}_proj_weight"], 2 * h).unflatten(-3, (h, 2)) for n in "qk")
    v = heads(x, p["v_proj_weight"], h)
    lam = (
        torch.exp(p["lambda_q1"] @ p["lambda_k1"])
        - torch.exp(p["lambda_q2"] @ p["lambda_k2"])
        + s["lambda_init"]
    )

    def attend(qb, kb, vb, rows, keys):
        mask = causal(rows, keys)
        one, two = (
            F.scaled_dot_product_attention(qb[..., j, :, :], kb[..., j, :, :], vb, attn_mask=mask)
            for j in (0, 1)
        )
        return one - lam * two

    o = by_blocks(attend, lambda t: 0, q, k, v)
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + s["eps"])
    o = p["subln_weight"] * o * (1 - s["lambda_init"])
    return merge(o, p["out_proj_weight"])
