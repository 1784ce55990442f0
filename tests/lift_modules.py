"""Hand-written attention modules that indexattn.lift turns into specs (tests/test_lift.py,
docs/lift.md): written as their authors write them, not as the notation would."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """nanoGPT's model.py: one fused c_attn, split into q, k, v, heads by view and transpose,
    causal scores masked by a registered lower-triangular buffer, then c_proj."""

    def __init__(self, n_embd=16, n_head=4, block_size=64, flash=False):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd, self.flash = n_head, n_embd, flash
        tril = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("bias", tril.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Head(nn.Module):
    """One head of Karpathy's "Let's build GPT": its own key, query and value nn.Linear."""

    def __init__(self, n_embd, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)

    def forward(self, x):
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = F.softmax(wei, dim=-1)
        return wei @ self.value(x)


class MultiHead(nn.Module):
    """Heads of their own, concatenated and projected."""

    def __init__(self, n_embd=12, n_head=3):
        super().__init__()
        self.heads = nn.ModuleList(Head(n_embd, n_embd // n_head) for _ in range(n_head))
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RotaryGQA(nn.Module):
    """Grouped-query attention as Llama writes it: rotate-half rotary from positions,
    repeat_kv's expand and reshape, a causal mask added to the scores."""

    def __init__(self, d_model=16, n_head=4, n_kv=2, head_dim=4, theta=10000.0):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, head_dim
        self.q_proj = nn.Linear(d_model, n_head * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv * head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * head_dim, d_model, bias=False)
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        t = torch.arange(n, device=x.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_head // self.n_kv
        k = k[:, :, None].expand(b, self.n_kv, rep, n, self.head_dim).reshape(b, self.n_head, n, -1)
        v = v[:, :, None].expand(b, self.n_kv, rep, n, self.head_dim).reshape(b, self.n_head, n, -1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        mask = torch.full((n, n), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
        weights = (scores + mask).softmax(dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, n, -1)
        return self.o_proj(out)


class SelfMHA(nn.Module):
    """torch.nn.MultiheadAttention, batch first, as a self-attention layer calls it."""

    def __init__(self, embed_dim=12, num_heads=3):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]
