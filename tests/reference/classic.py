"""Hand-written attention modules in the classic tutorial style, one per variant of specs/.

Each module takes its inputs as (batch..., n, d), builds its masks on the input's device, and
names its submodules so that a state_dict key with dots replaced by underscores is the name of
the matching spec parameter (see MAPPING.md).
"""

import torch
import torch.nn.functional as F
from torch import nn


def causal_mask(scores):
    """True above the diagonal: key position τ' > query position τ is hidden."""
    n_q, n_k = scores.shape[-2:]
    ones = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device)
    return torch.triu(ones, diagonal=1)


def split_heads(t, num_heads):
    """(..., n, h*d_k) -> (..., h, n, d_k)."""
    return t.view(*t.shape[:-1], num_heads, -1).transpose(-3, -2)


def merge_heads(t):
    """(..., h, n, d_k) -> (..., n, h*d_k): the heads side by side."""
    t = t.transpose(-3, -2).contiguous()
    return t.view(*t.shape[:-2], -1)


class SimpleSelfAttention(nn.Module):
    """Variant 1: context = softmax(X Xᵀ) X, no weights, no scaling (specs/simple.attn)."""

    def forward(self, x):
        attn_scores = x @ x.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores, dim=-1)
        context = attn_weights @ x
        return context, attn_weights


class SelfAttention(nn.Module):
    """Variant 2: one head, trainable W_query/W_key/W_value, scaled by √d_k (single_head.attn)."""

    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        queries = self.W_query(x)
        keys = self.W_key(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
        return self.weights(attn_scores) @ values

    def weights(self, attn_scores):
        return torch.softmax(attn_scores, dim=-1)


class CausalAttention(SelfAttention):
    """Variant 3: one causal head with dropout on the weights (specs/causal_head.attn)."""

    def __init__(self, d_in, d_out, dropout=0.1, qkv_bias=False):
        super().__init__(d_in, d_out, qkv_bias)
        self.dropout = nn.Dropout(dropout)

    def weights(self, attn_scores):
        attn_scores = attn_scores.masked_fill(causal_mask(attn_scores), -torch.inf)
        return self.dropout(torch.softmax(attn_scores, dim=-1))


class MultiHeadAttention(nn.Module):
    """Variant 4: separate W_query/W_key/W_value (d_in -> h*d_k), causal, dropout, out_proj.

    specs/mha_separate.attn. The subclasses below change only the mask or the head split.
    """

    def __init__(self, d_in, d_out, num_heads, dropout=0.1, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, t):
        return split_heads(t, self.num_heads)

    def mask_scores(self, attn_scores):
        return attn_scores.masked_fill(causal_mask(attn_scores), -torch.inf)

    def forward(self, x):
        queries = self.split_heads(self.W_query(x))
        keys = self.split_heads(self.W_key(x))
        values = self.split_heads(self.W_value(x))
        attn_scores = queries @ keys.transpose(-2, -1) / self.head_dim**0.5
        attn_weights = torch.softmax(self.mask_scores(attn_scores), dim=-1)
        attn_weights = self.dropout(attn_weights)
        context = merge_heads(attn_weights @ values)
        return self.out_proj(context)


def split_head_major(qkv, num_heads):
    """Fused (..., n, (μBa)) -> q, k, v of (..., h, n, d_k): head-major, B inside each head."""
    qkv = qkv.view(*qkv.shape[:-1], num_heads, 3, -1)
    return [t.transpose(-3, -2) for t in qkv.unbind(-2)]


def split_gpt2(qkv, num_heads):
    """Fused (..., n, (Bμa)) -> q, k, v of (..., h, n, d_k): all queries, then keys, then values."""
    return [split_heads(t, num_heads) for t in qkv.chunk(3, dim=-1)]


class FusedHeadMajorAttention(nn.Module):
    """Variant 5: one fused projection W_qkv in the math layout (μBa), causal (mha_math.attn)."""

    def __init__(self, d_model, num_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.W_qkv = nn.Linear(d_model, num_heads * 3 * head_dim, bias=False)
        self.W_O = nn.Linear(num_heads * head_dim, d_model)

    def forward(self, x):
        q, k, v = split_head_major(self.W_qkv(x), self.num_heads)
        att = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        att = att.masked_fill(causal_mask(att), -torch.inf)
        att = torch.softmax(att, dim=-1)
        return self.W_O(merge_heads(att @ v))


class GPT2Attention(nn.Module):
    """Variant 6: nanoGPT's c_attn = Linear(d, 3*h*d_k) split into q, k, v (specs/gpt2.attn).

    GPT-2 initialisation, an optional additive padding mask over key positions (0 keep,
    -inf pad, shape (batch..., n)), and the attention weights returned beside the output.
    """

    def __init__(self, n_embd, n_head, dropout=0.1):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)

    def split_qkv(self, qkv):
        return split_gpt2(qkv, self.n_head)

    def forward(self, x, padding_mask=None):
        q, k, v = self.split_qkv(self.c_attn(x))
        att = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        att = att.masked_fill(causal_mask(att), -torch.inf)
        if padding_mask is not None:
            att = att + padding_mask[..., None, None, :]
        att = self.attn_dropout(torch.softmax(att, dim=-1))
        y = merge_heads(att @ v)
        return self.resid_dropout(self.c_proj(y)), att


class DkDvAttention(nn.Module):
    """Variant 7: one head on (N, d) with W_q, W_k: d -> d_k and W_v: d -> d_v, no bias.

    specs/dk_dv.attn; with an additive (N, N) mask, specs/dk_dv_mask.attn.
    """

    def __init__(self, d, d_k=128, d_v=None):
        super().__init__()
        self.W_q = nn.Linear(d, d_k, bias=False)
        self.W_k = nn.Linear(d, d_k, bias=False)
        self.W_v = nn.Linear(d, d_v or d, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        scores = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        if mask is not None:
            scores = scores + mask
        return torch.softmax(scores, dim=-1) @ v


class ConcatHeads(nn.Module):
    """Variant 8: h independent SelfAttention heads with biases, concatenated.

    specs/concat_heads.attn without, specs/concat_heads_proj.attn with the output projection.
    """

    def __init__(self, d_in, head_dim, num_heads, out_proj=True):
        super().__init__()
        heads = [SelfAttention(d_in, head_dim, qkv_bias=True) for _ in range(num_heads)]
        self.heads = nn.ModuleList(heads)
        self.out_proj = nn.Linear(num_heads * head_dim, d_in) if out_proj else nn.Identity()

    def forward(self, x):
        return self.out_proj(torch.cat([head(x) for head in self.heads], dim=-1))


class ScaledDotProductAttention(nn.Module):
    """Variant 9: softmax(Q Kᵀ / √d_k) V on given (b, n, d) tensors, bmm style (sdpa.attn)."""

    def forward(self, q, k, v):
        attn = torch.bmm(q, k.transpose(1, 2)) / q.shape[-1] ** 0.5
        attn = torch.softmax(attn, dim=-1)
        return torch.bmm(attn, v), attn


class GroupedQueryAttention(nn.Module):
    """Variant 10: Llama's causal attention (no RoPE): h query heads share h_kv key/value heads.

    Query head μ = g·n_rep + r reads key/value head g, as Llama's repeat_kv does: heads (g r).
    specs/gqa.attn; with num_kv_heads=1 this is multi-query attention, specs/mqa.attn.
    """

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def repeat_kv(self, t):
        return t.repeat_interleave(self.num_heads // self.num_kv_heads, dim=-3)

    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = self.repeat_kv(split_heads(self.k_proj(x), self.num_kv_heads))
        v = self.repeat_kv(split_heads(self.v_proj(x), self.num_kv_heads))
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(merge_heads(out))


class GroupedQueryCore(nn.Module):
    """transformers' eager attention core (gqa_core.attn): given queries (..., h_kv, n_rep, n, d)
    with heads (g r), keys and values (..., h_kv, n_kv, d), an additive mask (..., n, n_kv);
    scores times `scaling`, softmax, dropout on the weights, then the values."""

    def __init__(self, scaling, p=0.0):
        super().__init__()
        self.scaling = scaling
        self.dropout = nn.Dropout(p)

    def repeat_kv(self, t, n_rep):
        return t.repeat_interleave(n_rep, dim=-3)

    def forward(self, q, k, v, mask):
        n_rep = q.shape[-3]
        q = q.flatten(-4, -3)
        k, v = self.repeat_kv(k, n_rep), self.repeat_kv(v, n_rep)
        scores = q @ k.transpose(-2, -1) * self.scaling + mask[..., None, :, :]
        out = self.dropout(torch.softmax(scores, dim=-1)) @ v
        return out.unflatten(-3, (-1, n_rep))


class CrossAttention(nn.Module):
    """Variant 11: multi-head queries from x (N, d_q), keys and values from context (L, d_c).

    Stable Diffusion's layout (to_q, to_k, to_v without bias, to_out with bias), no mask.
    """

    def __init__(self, query_dim, context_dim, heads=8, dim_head=64):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(query_dim, heads * dim_head, bias=False)
        self.to_k = nn.Linear(context_dim, heads * dim_head, bias=False)
        self.to_v = nn.Linear(context_dim, heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, query_dim)

    def forward(self, x, context):
        q = split_heads(self.to_q(x), self.heads)
        k = split_heads(self.to_k(context), self.heads)
        v = split_heads(self.to_v(context), self.heads)
        sim = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        out = torch.softmax(sim, dim=-1) @ v
        return self.to_out(merge_heads(out))


class SlidingWindowAttention(MultiHeadAttention):
    """Variant 12a: MultiHeadAttention where query τ sees keys τ-w < τ' <= τ (sliding_window)."""

    def __init__(self, d_in, d_out, num_heads, window, dropout=0.1, qkv_bias=False):
        super().__init__(d_in, d_out, num_heads, dropout, qkv_bias)
        self.window = window

    def mask_scores(self, attn_scores):
        future = causal_mask(attn_scores)
        too_far = torch.tril(torch.ones_like(future), diagonal=-self.window)
        return attn_scores.masked_fill(future | too_far, -torch.inf)


class ALiBiAttention(MultiHeadAttention):
    """Variant 12b: causal MultiHeadAttention plus ALiBi's bias -m_μ (τ - τ') (specs/alibi.attn).

    Slopes m_μ = 2^(-8(μ+1)/h), the paper's geometric sequence (exact for h a power of two).
    """

    def mask_scores(self, attn_scores):
        h, n_q, n_k = attn_scores.shape[-3:]
        kw = {"device": attn_scores.device, "dtype": attn_scores.dtype}
        slopes = 2 ** (-8 * torch.arange(1, h + 1, **kw) / h)
        distance = torch.arange(n_q, **kw)[:, None] - torch.arange(n_k, **kw)[None, :]
        attn_scores = attn_scores - slopes[:, None, None] * distance
        return super().mask_scores(attn_scores)


class ExplicitBiasSDPA(MultiHeadAttention):
    """MultiHeadAttention through F.scaled_dot_product_attention with an explicit additive
    bias of shape (h, n, n) (variant 12 once more: the fused kernel against the same spec)."""

    def bias(self, n, like):
        raise NotImplementedError

    def forward(self, x):
        queries = self.split_heads(self.W_query(x))
        keys = self.split_heads(self.W_key(x))
        values = self.split_heads(self.W_value(x))
        bias = self.bias(x.shape[-2], queries)
        p = self.dropout.p if self.training else 0.0
        context = F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias, dropout_p=p)
        return self.out_proj(merge_heads(context))


def positions(n, like):
    """Query position i (a column) and key position j (a row), in the dtype of `like`."""
    kw = {"device": like.device, "dtype": like.dtype}
    return torch.arange(n, **kw)[:, None], torch.arange(n, **kw)[None, :]


class SlidingWindowSDPA(ExplicitBiasSDPA):
    """Variant 12a by SDPA: bias 0 where 0 <= i - j < window, -inf elsewhere."""

    def __init__(self, d_in, d_out, num_heads, window, dropout=0.1, qkv_bias=False):
        super().__init__(d_in, d_out, num_heads, dropout, qkv_bias)
        self.window = window

    def bias(self, n, like):
        i, j = positions(n, like)
        seen = (i - j >= 0) & (i - j < self.window)
        bias = torch.zeros(n, n, dtype=like.dtype, device=like.device).masked_fill(
            ~seen, -torch.inf
        )
        return bias.expand(self.num_heads, n, n)


class ALiBiSDPA(ExplicitBiasSDPA):
    """Variant 12b by SDPA: bias -m_μ (i - j) with m_μ = 2^(-8(μ+1)/h), -inf where j > i."""

    def bias(self, n, like):
        i, j = positions(n, like)
        h = self.num_heads
        slopes = 2 ** (-8 * torch.arange(1, h + 1, dtype=like.dtype, device=like.device) / h)
        bias = -slopes[:, None, None] * (i - j)
        return bias.masked_fill(j > i, -torch.inf)
