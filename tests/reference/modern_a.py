"""Hand-written modern attention variants (set A), classic style, one per spec in specs/.

Each module follows its paper and the layout of the transformers library (parameter names,
weight layouts, order of operations), takes inputs as (batch..., n, d) and builds its position
tables and masks inside forward, so its state_dict holds the parameters and nothing else. A
state_dict key with dots replaced by underscores is the name of the spec parameter.
MODERN_A_CASES gives each module's sizes and inputs, TWINS one perturbation each;
tests/models/test_modern_a.py checks them.

Rotary tables are built as transformers builds them: angles, cos and sin in float32 (float64
for float64 inputs, so that a float64 spec can match them to 1e-10), then cast to the input's
dtype where they multiply the queries and keys. This is the hand-written low-precision
reference of tests/lower/test_tables.py.
"""

import math

import torch
from torch import nn

from .cases import BATCH, Case, N, randn, tokens
from .classic import causal_mask, merge_heads, split_heads

# ---------------------------------------------------------------- rotary position embeddings


def rotary_angles(n, dim, offset, like):
    """(n, dim/2) angles m·θ_j at positions m = offset .. offset+n-1, θ_j = 10000^(-2j/dim), in
    float32 or wider."""
    kw = {"device": like.device, "dtype": torch.promote_types(like.dtype, torch.float32)}
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, **kw) / dim))
    position = torch.arange(offset, offset + n, **kw)
    return torch.outer(position, inv_freq)


def rotate_half(x):
    """Llama's and GPT-NeoX's rotate_half: halves (x1, x2) -> (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, angles):
    """x·cos + rotate_half(x)·sin: feature j pairs with feature j + d/2 at angle θ_j."""
    emb = torch.cat((angles, angles), dim=-1)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


def rotate_every_two(x):
    """GPT-J's rotate_every_two: pairs (x_2j, x_2j+1) -> (-x_2j+1, x_2j)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class LlamaProjections(nn.Module):
    """q_proj, k_proj, v_proj, o_proj without bias, `num_heads` heads of `head_dim`: the
    layout of Llama, shared by the modules below that keep Llama's names."""

    def __init__(self, d_model, num_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def heads(self, x):
        """Queries, keys and values of shape (..., h, n, d_k)."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        return [split_heads(proj(x), self.num_heads) for proj in projections]


class RoPEAttention(LlamaProjections):
    """Llama: causal multi-head attention with rotary embeddings, rotate-half (specs/rope.attn).

    RoFormer (Su et al. 2021) as transformers' LlamaAttention applies it with
    num_key_value_heads = num_heads: queries and keys at positions offset + τ are rotated,
    feature j with feature j + d_k/2, by the angle (offset + τ)·10000^(-2j/d_k).
    """

    def forward(self, x, offset=0):
        q, k, v = self.heads(x)
        angles = rotary_angles(x.shape[-2], self.head_dim, offset, like=q)
        q, k = apply_rotary(q, angles), apply_rotary(k, angles)
        scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class GPTNeoXAttention(nn.Module):
    """GPT-NeoX (Black et al. 2022): partial rotary on the first rotary_pct of each head.

    transformers' GPTNeoXAttention: one fused query_key_value Linear with bias, read head-major
    as (h, 3, d_k) along its output axis; rotate-half within the first rotary_ndims features,
    the rest passed through; causal; `dense` output Linear with bias (specs/rope_partial.attn).
    """

    def __init__(self, hidden_size, num_heads, rotary_pct=0.25):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.rotary_ndims = int(self.head_size * rotary_pct)
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def rotate(self, x, angles):
        r = self.rotary_ndims
        return torch.cat((apply_rotary(x[..., :r], angles), x[..., r:]), dim=-1)

    def forward(self, x, offset=0):
        qkv = self.query_key_value(x)
        qkv = qkv.view(*qkv.shape[:-1], self.num_heads, 3 * self.head_size).transpose(-3, -2)
        q, k, v = qkv.chunk(3, dim=-1)
        angles = rotary_angles(x.shape[-2], self.rotary_ndims, offset, like=q)
        q, k = self.rotate(q, angles), self.rotate(k, angles)
        scores = q @ k.transpose(-2, -1) / self.head_size**0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        return self.dense(merge_heads(torch.softmax(scores, dim=-1) @ v))


class GPTJAttention(nn.Module):
    """GPT-J (Wang and Komatsuzaki 2021): rotary on interleaved pairs (2j, 2j+1).

    transformers' GPTJAttention: q_proj, k_proj, v_proj, out_proj without bias; rotate_every_two
    on the first rotary_dim features of each head (None: the whole head, as in the spec;
    GPT-J-6B itself rotates 64 of 256); causal (specs/rope_interleaved.attn).
    """

    def __init__(self, embed_dim, num_heads, rotary_dim=None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.rotary_dim = rotary_dim or self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def rotate(self, x, angles):
        r = self.rotary_dim
        cos = angles.cos().to(x.dtype).repeat_interleave(2, dim=-1)
        sin = angles.sin().to(x.dtype).repeat_interleave(2, dim=-1)
        x_rot = x[..., :r] * cos + rotate_every_two(x[..., :r]) * sin
        return torch.cat((x_rot, x[..., r:]), dim=-1)

    def forward(self, x, offset=0):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        angles = rotary_angles(x.shape[-2], self.rotary_dim, offset, like=q)
        q, k = self.rotate(q, angles), self.rotate(k, angles)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        return self.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: weight · x / sqrt(mean(x²) + eps) over the last axis."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class Qwen3Attention(nn.Module):
    """Qwen3 (Qwen Team 2025): per-head RMSNorm of queries and keys before rotate-half RoPE.

    transformers' Qwen3Attention without the optional sliding window: q_norm and k_norm (one
    weight of size head_dim each, eps 1e-6) normalise every head's query and key; grouped-query
    attention with Llama's repeat_kv order, query head μ = g·n_rep + r reading key/value head g;
    causal (specs/qk_norm.attn).
    """

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, eps=1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def repeat_kv(self, t):
        return t.repeat_interleave(self.num_heads // self.num_kv_heads, dim=-3)

    def forward(self, x, offset=0):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_kv_heads)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        angles = rotary_angles(x.shape[-2], self.head_dim, offset, like=q)
        q, k = apply_rotary(q, angles), apply_rotary(k, angles)
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


# ------------------------------------------------------------------- biases, caps and masks


class Gemma2Attention(LlamaProjections):
    """Gemma 2 (Gemma Team 2024): soft-capped scores and a causal sliding window.

    transformers' Gemma2Attention with RoPE and grouped-query heads left out (see RoPEAttention
    and Qwen3Attention): scores scaled by query_pre_attn_scalar^-0.5 (not head_dim^-0.5), then
    capped c·tanh(s/c) with c = attn_logit_softcapping, then masked: query τ sees the keys
    τ - w < τ' <= τ (specs/softcap_window.attn).
    """

    def __init__(
        self,
        d_model,
        num_heads,
        head_dim,
        query_pre_attn_scalar=256,
        softcap=50.0,
        sliding_window=4096,
    ):
        super().__init__(d_model, num_heads, head_dim)
        self.scaling = query_pre_attn_scalar**-0.5
        self.softcap = softcap
        self.sliding_window = sliding_window

    def forward(self, x):
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) * self.scaling
        scores = torch.tanh(scores / self.softcap) * self.softcap
        future = causal_mask(scores)
        too_far = torch.tril(torch.ones_like(future), diagonal=-self.sliding_window)
        scores = scores.masked_fill(future | too_far, -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


def t5_relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """transformers' T5Attention._relative_position_bucket, line for line (key - query)."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


class T5Attention(nn.Module):
    """T5 (Raffel et al. 2020): a learned bias per head and relative-position bucket.

    transformers' T5Attention in the encoder (bidirectional buckets, has_relative_attention_bias):
    q, k, v, o Linear without bias; scores Q Kᵀ with no 1/sqrt(d) (T5 folds it into the
    initialisation) plus relative_attention_bias[bucket(τ' - τ), μ]; no mask
    (specs/t5_bias.attn).
    """

    def __init__(self, d_model, num_heads, d_kv, num_buckets=32, max_distance=128):
        super().__init__()
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.q = nn.Linear(d_model, num_heads * d_kv, bias=False)
        self.k = nn.Linear(d_model, num_heads * d_kv, bias=False)
        self.v = nn.Linear(d_model, num_heads * d_kv, bias=False)
        self.o = nn.Linear(num_heads * d_kv, d_model, bias=False)
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def compute_bias(self, query_length, key_length, device):
        """(h, n_q, n_k) bias: the learned value of each head at bucket(key - query)."""
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        buckets = t5_relative_position_bucket(
            relative_position, True, self.num_buckets, self.max_distance
        )
        return self.relative_attention_bias(buckets).permute(2, 0, 1)

    def forward(self, x):
        q = split_heads(self.q(x), self.num_heads)
        k = split_heads(self.k(x), self.num_heads)
        v = split_heads(self.v(x), self.num_heads)
        scores = q @ k.transpose(-2, -1)
        scores = scores + self.compute_bias(x.shape[-2], x.shape[-2], x.device)
        return self.o(merge_heads(torch.softmax(scores, dim=-1) @ v))


class DocumentMaskedAttention(LlamaProjections):
    """Causal attention within documents of a packed sequence (specs/doc_mask.attn).

    Llama 3's "attention mask that prevents self-attention between different documents within
    the same sequence", FlexAttention's document mask: key τ' is visible to query τ when
    τ' <= τ and doc_ids[τ'] == doc_ids[τ]. The ids stay integers: compared as LongTensors,
    never cast to the scores' dtype (in bfloat16, 256 and 257 are one number).
    """

    def forward(self, x, doc_ids):
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        other_doc = doc_ids[..., :, None] != doc_ids[..., None, :]  # (..., n, n)
        hidden = causal_mask(scores) | other_doc[..., None, :, :]
        scores = scores.masked_fill(hidden, -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class KVCacheAttention(LlamaProjections):
    """One decode step of causal attention with a key/value cache (specs/kv_decode.attn).

    transformers' past_key_values for Llama without RoPE: the new tokens' keys and values are
    appended to the cached (..., h, N_c, d_k) ones along the sequence; new query τ sits at
    absolute position N_c + τ and sees the keys σ <= N_c + τ. Returns the output and the
    grown cache.
    """

    def forward(self, x, past_key, past_value):
        q, k, v = self.heads(x)
        k = torch.cat((past_key, k), dim=-2)
        v = torch.cat((past_value, v), dim=-2)
        n, n_c = x.shape[-2], past_key.shape[-2]
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        ones = torch.ones(n, n_c + n, dtype=torch.bool, device=x.device)
        scores = scores.masked_fill(torch.triu(ones, diagonal=n_c + 1), -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v)), k, v


class PrefixLMAttention(LlamaProjections):
    """Prefix LM (Raffel et al. 2020, §3.2.1; UniLM): bidirectional prefix, causal rest.

    The first prefix_length tokens see each other, every later token sees the prefix and the
    tokens before it: key τ' is visible to query τ when τ' <= τ or τ' < P
    (specs/prefix_lm.attn).
    """

    def __init__(self, d_model, num_heads, head_dim, prefix_length):
        super().__init__(d_model, num_heads, head_dim)
        self.prefix_length = prefix_length

    def forward(self, x):
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        key_in_prefix = torch.arange(x.shape[-2], device=x.device) < self.prefix_length
        scores = scores.masked_fill(causal_mask(scores) & ~key_in_prefix, -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


# ------------------------------------------------------------------------------------ cases

OFFSET = 3  # position of the first token in the rotary cases (rope is relative: no effect)
N_T5 = 70  # T5's logarithmic buckets up to distance 69: boundaries 16, 32, 64 included
N_CACHE = 4  # cached tokens in the decode case; N = 5 would be a prefill, so 2 new tokens
N_NEW = 2
DOC_IDS = [[256, 256, 257, 257, 257], [0, 1, 1, 2, 2]]  # packed documents per batch row


def with_offset(module, inputs):
    return module(*inputs.values(), offset=OFFSET)


def qwen3(s):
    """Qwen3Attention at the spec's sizes, its RMSNorm weights (which start at 1) drawn at
    random so that loading them into the spec shows."""
    module = Qwen3Attention(s["d_m"], s["h_kv"] * s["n_rep"], s["h_kv"], 2 * s["d_r"], s["eps"])
    with torch.no_grad():
        module.q_norm.weight.normal_(1.0, 0.5)
        module.k_norm.weight.normal_(1.0, 0.5)
    return module


def documents(s):
    return {"X": randn(*BATCH, N, s["d_m"]), "D": torch.tensor(DOC_IDS)}


def decode_inputs(s):
    cache = (*BATCH, s["h"], N_CACHE, s["d_k"])
    return {"X": randn(*BATCH, N_NEW, s["d_m"]), "Kc": randn(*cache), "Vc": randn(*cache)}


LLAMA_SIZES = {"d_m": 6, "h": 2, "d_k": 3}
LLAMA_COUNT = "4*d_m*h*d_k"
LLAMA2_7B = {"Llama-2-7B": {"d_m": 4096, "h": 32, "d_k": 128}}

MODERN_A_CASES = [
    Case(
        "rope",
        lambda s: RoPEAttention(s["d_m"], s["h"], 2 * s["d_r"]),
        tokens("d_m"),
        {"d_m": 6, "h": 2, "d_r": 2, "offset": OFFSET},
        "8*d_m*h*d_r",
        {"Llama-2-7B": {"d_m": 4096, "h": 32, "d_r": 64}},
        call=with_offset,
    ),
    Case(
        "rope_partial",
        lambda s: GPTNeoXAttention(s["d_m"], s["h"], rotary_pct=0.25),
        tokens("d_m"),
        {"d_m": 32, "h": 2, "d_r": 2, "d_p": 12, "offset": OFFSET},  # head 16, rotary 4
        "4*d_m*h*(2*d_r + d_p) + 3*h*(2*d_r + d_p) + d_m",
        {"GPT-NeoX-20B": {"d_m": 6144, "h": 64, "d_r": 12, "d_p": 72}},
        call=with_offset,
    ),
    Case(
        "rope_interleaved",
        lambda s: GPTJAttention(s["d_m"], s["h"]),
        tokens("d_m"),
        {"d_m": 8, "h": 2, "d_r": 2, "offset": OFFSET},
        "8*d_m*h*d_r",
        {"GPT-J-6B shape": {"d_m": 4096, "h": 16, "d_r": 128}},
        call=with_offset,
    ),
    Case(
        "qk_norm",
        qwen3,
        tokens("d_m"),
        {"d_m": 6, "h_kv": 2, "n_rep": 2, "d_r": 2, "offset": OFFSET, "eps": 1e-6},
        "4*d_m*h_kv*n_rep*d_r + 4*d_m*h_kv*d_r + 4*d_r",
        {"Qwen3-8B": {"d_m": 4096, "h_kv": 8, "n_rep": 4, "d_r": 64, "eps": 1e-6}},
        call=with_offset,
    ),
    Case(
        "softcap_window",
        lambda s: Gemma2Attention(
            s["d_m"], s["h"], s["d_k"], s["query_pre_attn_scalar"], s["c"], s["w"]
        ),
        tokens("d_m"),
        # a small cap, so that the cap bends the test's scores well beyond 1e-10
        {**LLAMA_SIZES, "d_k": 4, "query_pre_attn_scalar": 8, "c": 2.0, "w": 3},
        LLAMA_COUNT,
    ),
    Case(
        "t5_bias",
        lambda s: T5Attention(s["d_m"], s["h"], s["d_k"]),
        lambda s: {"X": randn(*BATCH, N_T5, s["d_m"])},
        LLAMA_SIZES,
        "4*d_m*h*d_k + 32*h",
        {"T5-base": {"d_m": 768, "h": 12, "d_k": 64}},
    ),
    Case(
        "doc_mask",
        lambda s: DocumentMaskedAttention(s["d_m"], s["h"], s["d_k"]),
        documents,
        LLAMA_SIZES,
        LLAMA_COUNT,
        LLAMA2_7B,
    ),
    Case(
        "kv_decode",
        lambda s: KVCacheAttention(s["d_m"], s["h"], s["d_k"]),
        decode_inputs,
        LLAMA_SIZES,
        LLAMA_COUNT,
        LLAMA2_7B,
    ),
    Case(
        "prefix_lm",
        lambda s: PrefixLMAttention(s["d_m"], s["h"], s["d_k"], s["P"]),
        tokens("d_m"),
        {**LLAMA_SIZES, "P": 2},
        LLAMA_COUNT,
        {name: {**sizes, "P": 512} for name, sizes in LLAMA2_7B.items()},
    ),
]


# ------------------------------------------------------------------------------------ twins


def bump(module, name, index):
    with torch.no_grad():
        module.get_parameter(name)[index] += 1.0


def twin_weight(name, index):
    """Twin: one entry of one parameter raised by 1 (module changed in place)."""

    def perturb(module, inputs, sizes):
        bump(module, name, index)
        return inputs, sizes

    return perturb


def twin_scalar(attribute, size, step):
    """Twin: a mask's scalar (window, prefix length) moved by `step`, in module and sizes."""

    def perturb(module, inputs, sizes):
        setattr(module, attribute, getattr(module, attribute) + step)
        return inputs, {**sizes, size: sizes[size] + step}

    return perturb


def twin_input(name, index, value):
    """Twin: one entry of one input replaced (a document id, a cached key)."""

    def perturb(module, inputs, sizes):
        changed = inputs[name].detach().clone()
        changed[index] = value
        return {**inputs, name: changed}, sizes

    return perturb


T5_FAR = int(t5_relative_position_bucket(torch.tensor(20)))  # a logarithmic bucket, 26

# spec -> perturb(module, inputs, sizes) -> (inputs, sizes): one weight or one mask bit that
# the spec must track (rotary half c = 1, a key's rotated part, an odd feature of a pair, ...).
TWINS = {
    "rope": twin_weight("q_proj.weight", 2),  # head 0, second half (c = 1), j = 0
    "rope_partial": twin_weight("query_key_value.weight", 16 * 4 + 3),  # head 1, key, rotated
    "rope_interleaved": twin_weight("q_proj.weight", 1),  # pair j = 0, its odd member
    "qk_norm": twin_weight("k_norm.weight", 3),
    "softcap_window": twin_scalar("sliding_window", "w", -1),
    "t5_bias": twin_weight("relative_attention_bias.weight", (T5_FAR, 1)),
    "doc_mask": twin_input("D", (1, 2), 2),  # token 2 of row 1 joins the next document
    "kv_decode": twin_input("Kc", (0, 1, 0, 0), 5.0),
    "prefix_lm": twin_scalar("prefix_length", "P", 1),
}
