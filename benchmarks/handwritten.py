"""Hand-written PyTorch for the benchmarked specs, in the two styles people write: "classic"
(view / transpose / masked_fill / softmax, as in the tutorials) and "fused" (one projection
call, F.scaled_dot_product_attention). Parameters are named and laid out as in the specs, so
one state_dict loads into the generated module and into these."""

import torch
import torch.nn.functional as F
from torch import nn


def causal(scores):
    """True where key τ' > query τ: hidden."""
    n_q, n_k = scores.shape[-2:]
    return torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1)


def heads(t, h):
    """(b, n, h·d_k) -> (b, h, n, d_k)."""
    b, n, _ = t.shape
    return t.view(b, n, h, -1).transpose(1, 2)


def merge(t):
    """(b, h, n, d_k) -> (b, n, h·d_k)."""
    b, h, n, d_k = t.shape
    return t.transpose(1, 2).contiguous().view(b, n, h * d_k)


class MHA(nn.Module):
    """specs/mha.attn: W = Linear(d_m, h·3·d_k, bias=False), rows head-major (μBa);
    W_O = Linear(h·d_k, d_m); causal."""

    def __init__(self, d_m, h, d_k, fused):
        super().__init__()
        self.h, self.d_k, self.fused = h, d_k, fused
        self.W = nn.Parameter(torch.empty(h * 3 * d_k, d_m))
        self.W_O = nn.Parameter(torch.empty(d_m, h * d_k))
        self.b_O = nn.Parameter(torch.zeros(d_m))

    def forward(self, x):
        b, n, _ = x.shape
        qkv = F.linear(x, self.W).view(b, n, self.h, 3, self.d_k)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = q @ k.transpose(-2, -1) / self.d_k**0.5
            att = att.masked_fill(causal(att), float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        return F.linear(merge(y), self.W_O, self.b_O)


class GQA(nn.Module):
    """specs/gqa.attn, Llama's attention without RoPE: h = h_kv·n_rep query heads (g r)."""

    def __init__(self, d_m, h_kv, n_rep, d_k, fused):
        super().__init__()
        self.h_kv, self.n_rep, self.fused = h_kv, n_rep, fused
        self.q_proj_weight = nn.Parameter(torch.empty(h_kv * n_rep * d_k, d_m))
        self.k_proj_weight = nn.Parameter(torch.empty(h_kv * d_k, d_m))
        self.v_proj_weight = nn.Parameter(torch.empty(h_kv * d_k, d_m))
        self.o_proj_weight = nn.Parameter(torch.empty(d_m, h_kv * n_rep * d_k))

    def forward(self, x):
        q = heads(F.linear(x, self.q_proj_weight), self.h_kv * self.n_rep)
        k = heads(F.linear(x, self.k_proj_weight), self.h_kv)
        v = heads(F.linear(x, self.v_proj_weight), self.h_kv)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
            att = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            att = att.masked_fill(causal(att), float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        return F.linear(merge(y), self.o_proj_weight)


class Cross(nn.Module):
    """specs/cross.attn, Stable Diffusion's CrossAttention: queries from x, keys and values
    from the context c; to_out with bias."""

    def __init__(self, d_q, d_c, h, d_k, fused):
        super().__init__()
        self.h, self.fused = h, fused
        self.to_q_weight = nn.Parameter(torch.empty(h * d_k, d_q))
        self.to_k_weight = nn.Parameter(torch.empty(h * d_k, d_c))
        self.to_v_weight = nn.Parameter(torch.empty(h * d_k, d_c))
        self.to_out_weight = nn.Parameter(torch.empty(d_q, h * d_k))
        self.to_out_bias = nn.Parameter(torch.zeros(d_q))

    def forward(self, x, c):
        q = heads(F.linear(x, self.to_q_weight), self.h)
        k = heads(F.linear(c, self.to_k_weight), self.h)
        v = heads(F.linear(c, self.to_v_weight), self.h)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            att = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            y = torch.softmax(att, dim=-1) @ v
        return F.linear(merge(y), self.to_out_weight, self.to_out_bias)


class GPT2(nn.Module):
    """specs/gpt2.attn, nanoGPT's attention returning its weights: c_attn rows (Bμa) with
    bias, causal plus an additive padding mask, dropout (identity in eval)."""

    def __init__(self, d_m, h, d_k, fused=False):
        super().__init__()
        self.h = h
        self.c_attn_weight = nn.Parameter(torch.empty(3 * h * d_k, d_m))
        self.c_attn_bias = nn.Parameter(torch.zeros(3 * h * d_k))
        self.c_proj_weight = nn.Parameter(torch.empty(d_m, h * d_k))
        self.c_proj_bias = nn.Parameter(torch.zeros(d_m))
        self.attn_dropout = nn.Dropout(0.1)
        self.resid_dropout = nn.Dropout(0.1)

    def forward(self, x, padding):
        qkv = F.linear(x, self.c_attn_weight, self.c_attn_bias)
        q, k, v = (heads(t, self.h) for t in qkv.chunk(3, dim=-1))
        att = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        att = att.masked_fill(causal(att), float("-inf")) + padding[:, None, None, :]
        att = self.attn_dropout(torch.softmax(att, dim=-1))
        y = F.linear(merge(att @ v), self.c_proj_weight, self.c_proj_bias)
        return self.resid_dropout(y), att
