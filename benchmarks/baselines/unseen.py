"""Hand-written blocked baselines of the two unseen combinations of issue 48
(benchmarks/specs/rope_softcap_doc.attn, benchmarks/specs/gqa_alibi_window_sinks.attn), in
the style of row_blocks.py beside this file: blocks of 256 queries over the keys each block's
mask keeps, each block's mask and bias made from its O(N) positions, checkpointed per block
in a training step. Rotary as rotary.py applies it (Llama's rotate_half: the halves (c j)
are the two halves of each head's features)."""

from __future__ import annotations

import math

import torch

from .rotary import angles, rotate_half
from .row_blocks import by_blocks, causal, heads, merge


def rope_softcap_doc(x, documents, p, s):
    """Rotary on q and k, a soft cap, causal within one document (ids contiguous and
    ascending, as the benchmark's: a block's keys start at its first query's document)."""
    q, k, v = (heads(x, p[f"{w}_proj_weight"], s["h"]) for w in "qkv")
    cos, sin = (torch.cat((t, t), -1) for t in angles(x.shape[-2], q.shape[-1], q))
    q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
    cap, scale = s["cap"], 1 / math.sqrt(q.shape[-1])
    ids = documents.reshape(-1)
    starts = torch.searchsorted(ids, ids)  # each position's document start, O(N)

    def attend(qb, kb, vb, rows, keys):
        scores = torch.tanh(qb @ kb.mT * (scale / cap)) * cap
        keep = causal(rows, keys) & (ids[rows][:, None] == ids[keys][None, :])
        return torch.softmax(scores.masked_fill(~keep, -math.inf), -1) @ vb

    o = by_blocks(attend, lambda t: int(starts[t]), q, k, v)
    return merge(o, p["o_proj_weight"])


def gqa_alibi_window_sinks(x, p, s):
    """Grouped-query heads (g r), ALiBi slopes per query head, a window of w, and the sink's
    logit in the denominator (gpt-oss's: one more column of the softmax, dropped after)."""
    g, r, w = s["h_kv"], s["n_rep"], s["w"]
    q = heads(x, p["q_proj_weight"], g * r).unflatten(-3, (g, r))
    k, v = (heads(x, p[f"{n}_proj_weight"], g)[..., None, :, :] for n in "kv")
    slope = 2.0 ** (-8 * torch.arange(1, g * r + 1, device=x.device, dtype=x.dtype) / (g * r))
    slope = slope.view(g, r, 1, 1)
    sinks = p["sinks"].view(g, r, 1, 1)
    scale = 1 / math.sqrt(q.shape[-1])

    def attend(qb, kb, vb, rows, keys):
        d = (keys[None, :] - rows[:, None]).to(qb.dtype)  # ≤ 0 where kept
        scores = qb @ kb.mT * scale + slope * d
        scores = scores.masked_fill(~causal(rows, keys, w), -math.inf)
        column = sinks.expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, column), -1), -1)[..., :-1]
        return weights @ vb

    o = by_blocks(attend, lambda t: max(0, t - w + 1), q, k, v).flatten(-4, -3)
    return merge(o, p["o_proj_weight"])
