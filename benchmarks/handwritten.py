"""The fastest PyTorch a skilled user writes for each shipped spec, eager.

Each class subclasses the spec's reference module of tests/reference (its parameters, names
and layouts, so one state_dict loads into both) and replaces its forward with the fast way:
F.scaled_dot_product_attention wherever the kernel computes the core (is_causal, enable_gqa,
a boolean mask or an additive bias, built once per shape), the scale folded into Q where
the scores are materialised, and in-place elementwise steps. A reference module whose own
forward is already that (it returns the weights, or has no N×N scores) is used as it is.
`fast(module)` gives a reference module this forward; `flex(module)` FlexAttention's, where
the spec's core is one (causal, grouped, a mask, a bias or a score modification; forward
only: on CPU it has no backward).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from tests.reference import classic, modern_a, modern_b
from tests.reference.classic import merge_heads, split_heads

sdpa = F.scaled_dot_product_attention


def per_shape(maxsize: int):
    """functools.lru_cache for tensors built once per shape, built outside inference mode: a
    cache filled by a forward under torch.inference_mode serves training steps too."""

    def decorate(build):
        @functools.lru_cache(maxsize=maxsize)
        @functools.wraps(build)
        def cached(*args, **kwargs):
            with torch.inference_mode(False):
                return build(*args, **kwargs)

        return cached

    return decorate


@per_shape(64)
def keep(kind: str, n_q: int, n_k: int, size: int = 0, offset: int = 0) -> torch.Tensor:
    """Boolean (n_q, n_k) mask, True where key τ' is visible to query τ: built once per shape."""
    query = torch.arange(offset, offset + n_q)[:, None]
    key = torch.arange(n_k)[None, :]
    causal = key <= query
    if kind == "window":
        return causal & (query - key < size)
    if kind == "prefix":
        return causal | (key < size)
    if kind == "chunk":
        return causal & (query // size == key // size)
    return causal


@per_shape(16)
def rotary(n: int, dim: int, dtype: torch.dtype, base: float = 10000.0):
    """cos and sin (n, dim), rotate-half layout, once per shape."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# -- classic variants


class SelfAttention(classic.SelfAttention):
    def forward(self, x):
        return sdpa(self.W_query(x), self.W_key(x), self.W_value(x))


class CausalAttention(classic.CausalAttention):
    def forward(self, x):
        return sdpa(self.W_query(x), self.W_key(x), self.W_value(x), is_causal=True)


class MultiHeadAttention(classic.MultiHeadAttention):
    def qkv(self, x):
        return [self.split_heads(w(x)) for w in (self.W_query, self.W_key, self.W_value)]

    def forward(self, x):
        return self.out_proj(merge_heads(sdpa(*self.qkv(x), is_causal=True)))


class SlidingWindowAttention(classic.SlidingWindowAttention, MultiHeadAttention):
    def forward(self, x):
        n = x.shape[-2]
        mask = keep("window", n, n, self.window)
        return self.out_proj(merge_heads(sdpa(*self.qkv(x), attn_mask=mask)))


class ALiBiAttention(classic.ALiBiAttention, MultiHeadAttention):
    def forward(self, x):
        n = x.shape[-2]
        return self.out_proj(
            merge_heads(sdpa(*self.qkv(x), attn_mask=alibi(self.num_heads, n, x.dtype)))
        )


@per_shape(16)
def alibi(h: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(h, n, n) causal ALiBi bias, -inf above the diagonal, once per shape."""
    slopes = 2 ** (-8 * torch.arange(1, h + 1, dtype=torch.float64) / h)
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, -math.inf).to(dtype)


class FusedHeadMajorAttention(classic.FusedHeadMajorAttention):
    def forward(self, x):
        q, k, v = classic.split_head_major(self.W_qkv(x), self.num_heads)
        return self.W_O(merge_heads(sdpa(q, k, v, is_causal=True)))


class DkDvAttention(classic.DkDvAttention):
    def forward(self, x, mask=None):
        return sdpa(self.W_q(x), self.W_k(x), self.W_v(x), attn_mask=mask)


def grouped_heads(module, x):
    """Queries, keys and values with their heads split, fewer key/value heads than query heads
    (the layout of the grouped reference modules: q_proj, k_proj, v_proj)."""
    q = split_heads(module.q_proj(x), module.num_heads)
    k = split_heads(module.k_proj(x), module.num_kv_heads)
    v = split_heads(module.v_proj(x), module.num_kv_heads)
    return q, k, v


class GroupedQueryAttention(classic.GroupedQueryAttention):
    def forward(self, x):
        q, k, v = grouped_heads(self, x)
        return self.o_proj(merge_heads(sdpa(q, k, v, is_causal=True, enable_gqa=True)))


class CrossAttention(classic.CrossAttention):
    def forward(self, x, context):
        q = split_heads(self.to_q(x), self.heads)
        k = split_heads(self.to_k(context), self.heads)
        v = split_heads(self.to_v(context), self.heads)
        return self.to_out(merge_heads(sdpa(q, k, v)))


# -- modern variants, set A


class RoPEAttention(modern_a.RoPEAttention):
    def forward(self, x):
        q, k, v = self.heads(x)
        cos, sin = rotary(x.shape[-2], self.head_dim, x.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        return self.o_proj(merge_heads(sdpa(q, k, v, is_causal=True)))


class GPTNeoXAttention(modern_a.GPTNeoXAttention):
    def forward(self, x):
        qkv = self.query_key_value(x)
        qkv = qkv.view(*qkv.shape[:-1], self.num_heads, 3 * self.head_size).transpose(-3, -2)
        q, k, v = qkv.chunk(3, dim=-1)
        r = self.rotary_ndims
        cos, sin = rotary(x.shape[-2], r, x.dtype)
        q = torch.cat((rope(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((rope(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        return self.dense(merge_heads(sdpa(q, k, v, is_causal=True)))


class GPTJAttention(modern_a.GPTJAttention):
    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        cos, sin = interleaved(x.shape[-2], self.rotary_dim, x.dtype)
        q = q * cos + modern_a.rotate_every_two(q) * sin
        k = k * cos + modern_a.rotate_every_two(k) * sin
        return self.out_proj(merge_heads(sdpa(q, k, v, is_causal=True)))


@per_shape(16)
def interleaved(n: int, dim: int, dtype: torch.dtype):
    cos, sin = rotary(n, dim, torch.float64)
    half = dim // 2
    return tuple(t[:, :half].repeat_interleave(2, dim=-1).to(dtype) for t in (cos, sin))


class Qwen3Attention(modern_a.Qwen3Attention):
    def forward(self, x):
        q = self.q_norm(split_heads(self.q_proj(x), self.num_heads))
        k = self.k_norm(split_heads(self.k_proj(x), self.num_kv_heads))
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        cos, sin = rotary(x.shape[-2], self.head_dim, x.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        out = sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(merge_heads(out))


class Gemma2Attention(modern_a.Gemma2Attention):
    def forward(self, x):
        q, k, v = self.heads(x)
        n = x.shape[-2]
        scores = (q * (self.scaling / self.softcap)) @ k.transpose(-2, -1)
        scores = scores.tanh_() * self.softcap  # tanh's backward keeps its output
        scores.masked_fill_(~keep("window", n, n, self.sliding_window), -math.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class T5Attention(modern_a.T5Attention):
    def forward(self, x):
        q = split_heads(self.q(x), self.num_heads)
        k = split_heads(self.k(x), self.num_heads)
        v = split_heads(self.v(x), self.num_heads)
        n = x.shape[-2]
        bias = self.relative_attention_bias(t5_buckets(n, self.num_buckets, self.max_distance))
        return self.o(merge_heads(sdpa(q, k, v, attn_mask=bias.permute(2, 0, 1), scale=1.0)))


@per_shape(16)
def t5_buckets(n: int, num_buckets: int, max_distance: int) -> torch.Tensor:
    relative = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    return modern_a.t5_relative_position_bucket(relative, True, num_buckets, max_distance)


class DocumentMaskedAttention(modern_a.DocumentMaskedAttention):
    def forward(self, x, doc_ids):
        q, k, v = self.heads(x)
        n = x.shape[-2]
        same = doc_ids[..., :, None] == doc_ids[..., None, :]
        mask = (same & keep("causal", n, n))[..., None, :, :]
        return self.o_proj(merge_heads(sdpa(q, k, v, attn_mask=mask)))


class KVCacheAttention(modern_a.KVCacheAttention):
    def forward(self, x, past_key, past_value):
        q, k, v = self.heads(x)
        k = torch.cat((past_key, k), dim=-2)
        v = torch.cat((past_value, v), dim=-2)
        n, n_c = x.shape[-2], past_key.shape[-2]
        mask = None if n == 1 else keep("causal", n, n_c + n, offset=n_c)
        return self.o_proj(merge_heads(sdpa(q, k, v, attn_mask=mask))), k, v


class PrefixLMAttention(modern_a.PrefixLMAttention):
    def forward(self, x):
        q, k, v = self.heads(x)
        n = x.shape[-2]
        mask = keep("prefix", n, n, self.prefix_length)
        return self.o_proj(merge_heads(sdpa(q, k, v, attn_mask=mask)))


# -- modern variants, set B


class MultiHeadLatentAttention(modern_b.MultiHeadLatentAttention):
    def forward(self, x):
        q = split_heads(self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))), self.num_heads)
        q_pass, q_rot = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        k_pass, k_rot = self.kv_a_proj_with_mqa(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1
        )
        kv = split_heads(self.kv_b_proj(self.kv_a_layernorm(k_pass)), self.num_heads)
        k_pass, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        cos, sin = rotary(x.shape[-2], self.qk_rope_head_dim, x.dtype, self.rope_theta)
        q = torch.cat((q_pass, rope(q_rot, cos, sin)), dim=-1)
        k_rot = rope(k_rot, cos, sin).unsqueeze(-3).expand(*k_pass.shape[:-1], -1)
        k = torch.cat((k_pass, k_rot), dim=-1)
        return self.o_proj(merge_heads(sdpa(q, k, v, is_causal=True, scale=self.scaling)))


class DifferentialAttention(modern_b.DifferentialAttention):
    def forward(self, x):
        q = split_heads(self.q_proj(x), 2 * self.num_heads).unflatten(-3, (self.num_heads, 2))
        k = split_heads(self.k_proj(x), 2 * self.num_heads).unflatten(-3, (self.num_heads, 2))
        v = split_heads(self.v_proj(x), self.num_heads)
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2))
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        first = sdpa(q[..., 0, :, :], k[..., 0, :, :], v, is_causal=True)
        second = sdpa(q[..., 1, :, :], k[..., 1, :, :], v, is_causal=True)
        out = self.subln(first - lambda_full * second) * (1 - self.lambda_init)
        return self.out_proj(merge_heads(out))


class SigmoidAttention(modern_b.SigmoidAttention):
    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        n = x.shape[-2]
        scores = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)
        weights = scores.sub_(math.log(n)).sigmoid_().masked_fill(~keep("causal", n, n), 0.0)
        return self.o_proj(merge_heads(weights @ v))


class ChunkedAttention(modern_b.ChunkedAttention):
    def forward(self, x):
        q, k, v = grouped_heads(self, x)
        n = x.shape[-2]
        mask = keep("chunk", n, n, self.chunk_size)
        return self.o_proj(merge_heads(sdpa(q, k, v, attn_mask=mask, enable_gqa=True)))


class GatedOutputAttention(modern_b.GatedOutputAttention):
    def forward(self, x):
        q_and_gate = self.q_proj(x).view(*x.shape[:-1], self.num_heads, 2 * self.head_dim)
        q, gate = torch.chunk(q_and_gate, 2, dim=-1)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        out = merge_heads(sdpa(q.transpose(-3, -2), k, v, is_causal=True))
        return self.o_proj(out * torch.sigmoid(gate.flatten(-2)))


FAST = {
    cls.__mro__[1]: cls
    for cls in (
        SelfAttention,
        CausalAttention,
        MultiHeadAttention,
        SlidingWindowAttention,
        ALiBiAttention,
        FusedHeadMajorAttention,
        DkDvAttention,
        GroupedQueryAttention,
        CrossAttention,
        RoPEAttention,
        GPTNeoXAttention,
        GPTJAttention,
        Qwen3Attention,
        Gemma2Attention,
        T5Attention,
        DocumentMaskedAttention,
        KVCacheAttention,
        PrefixLMAttention,
        MultiHeadLatentAttention,
        DifferentialAttention,
        SigmoidAttention,
        ChunkedAttention,
        GatedOutputAttention,
    )
}


def fast(module):
    """The reference module with the fast forward (its own where that is already fast)."""
    faster = FAST.get(type(module))
    if faster is not None:
        module.__class__ = faster  # same attributes and parameters, another forward
    return module


# -- FlexAttention: the core as a score_mod and a block mask


def causal_mod(b, h, q, kv):
    return kv <= q


@per_shape(16)
def block_mask(kind: str, n: int, size: int = 0):
    mods = {
        "causal": causal_mod,
        "window": lambda b, h, q, kv: (kv <= q) & (q - kv < size),
        "prefix": lambda b, h, q, kv: (kv <= q) | (kv < size),
        "chunk": lambda b, h, q, kv: (kv <= q) & (q // size == kv // size),
    }
    return create_block_mask(mods[kind], None, None, n, n, device="cpu")


@functools.cache
def compiled_flex():
    # one compiled flex_attention serves every case: each mask and score modification, shape
    # and head count is a recompile of its one frame (static shapes: flex_attention with
    # dynamic ones failed to lower here), more than dynamo's default limit of 8
    torch._dynamo.config.recompile_limit = 64
    return torch.compile(flex_attention, fullgraph=True, dynamic=False)


class FlexMHA(MultiHeadAttention):
    def forward(self, x):
        out = compiled_flex()(*self.qkv(x), block_mask=block_mask("causal", x.shape[-2]))
        return self.out_proj(merge_heads(out))


class FlexWindow(SlidingWindowAttention):
    def forward(self, x):
        mask = block_mask("window", x.shape[-2], self.window)
        return self.out_proj(merge_heads(compiled_flex()(*self.qkv(x), block_mask=mask)))


class FlexGemma2(Gemma2Attention):
    def forward(self, x):
        q, k, v = self.heads(x)
        cap = self.softcap

        def softcap(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / cap) * cap

        mask = block_mask("window", x.shape[-2], self.sliding_window)
        out = compiled_flex()(q, k, v, score_mod=softcap, block_mask=mask, scale=self.scaling)
        return self.o_proj(merge_heads(out))


class FlexT5(T5Attention):
    def forward(self, x):
        q = split_heads(self.q(x), self.num_heads)
        k = split_heads(self.k(x), self.num_heads)
        v = split_heads(self.v(x), self.num_heads)
        buckets = t5_buckets(x.shape[-2], self.num_buckets, self.max_distance)
        table = self.relative_attention_bias.weight

        def bias(score, b, h, q_idx, kv_idx):
            return score + table[buckets[q_idx, kv_idx], h]

        return self.o(merge_heads(compiled_flex()(q, k, v, score_mod=bias, scale=1.0)))


class FlexPrefix(PrefixLMAttention):
    def forward(self, x):
        q, k, v = self.heads(x)
        mask = block_mask("prefix", x.shape[-2], self.prefix_length)
        return self.o_proj(merge_heads(compiled_flex()(q, k, v, block_mask=mask)))


class FlexGQA(GroupedQueryAttention):
    def forward(self, x):
        q, k, v = grouped_heads(self, x)
        out = compiled_flex()(
            q, k, v, block_mask=block_mask("causal", x.shape[-2]), enable_gqa=True
        )
        return self.o_proj(merge_heads(out))


class FlexALiBi(ALiBiAttention):
    def forward(self, x):
        h = self.num_heads
        slopes = 2 ** (-8 * torch.arange(1, h + 1, dtype=x.dtype, device=x.device) / h)

        def bias(score, b, head, q_idx, kv_idx):
            return score - slopes[head] * (q_idx - kv_idx)

        mask = block_mask("causal", x.shape[-2])
        out = compiled_flex()(*self.qkv(x), score_mod=bias, block_mask=mask)
        return self.out_proj(merge_heads(out))


class FlexRoPE(RoPEAttention):
    def forward(self, x):
        q, k, v = self.heads(x)
        cos, sin = rotary(x.shape[-2], self.head_dim, x.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        out = compiled_flex()(q, k, v, block_mask=block_mask("causal", x.shape[-2]))
        return self.o_proj(merge_heads(out))


class FlexDocument(DocumentMaskedAttention):
    def forward(self, x, doc_ids):
        q, k, v = self.heads(x)

        def same_document(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

        n = x.shape[-2]
        mask = create_block_mask(same_document, doc_ids.shape[0], None, n, n, device="cpu")
        return self.o_proj(merge_heads(compiled_flex()(q, k, v, block_mask=mask)))


class FlexChunked(ChunkedAttention):
    def forward(self, x):
        q, k, v = grouped_heads(self, x)
        mask = block_mask("chunk", x.shape[-2], self.chunk_size)
        out = compiled_flex()(q, k, v, block_mask=mask, enable_gqa=True)
        return self.o_proj(merge_heads(out))


FLEX = {
    classic.MultiHeadAttention: FlexMHA,
    classic.GroupedQueryAttention: FlexGQA,
    classic.ALiBiAttention: FlexALiBi,
    modern_a.RoPEAttention: FlexRoPE,
    modern_a.DocumentMaskedAttention: FlexDocument,
    modern_b.ChunkedAttention: FlexChunked,
    classic.SlidingWindowAttention: FlexWindow,
    modern_a.Gemma2Attention: FlexGemma2,
    modern_a.T5Attention: FlexT5,
    modern_a.PrefixLMAttention: FlexPrefix,
}


def flex(module):
    """The reference module with a FlexAttention forward; None where it has none here."""
    cls = FLEX.get(type(module))
    if cls is None:
        return None
    module.__class__ = cls
    return module
