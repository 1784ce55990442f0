"""Hand-written modules for eleven modern attention variants, in the classic style of classic.py.

Each follows its paper or its model's reference code (named in the docstring), takes inputs as
(batch..., n, d), builds its masks on the input's device, and names its parameters so that a
state_dict key with dots replaced by underscores is the spec parameter's name (specs/*.attn).
`MODERN_B_CASES` at the end says at which sizes each is compared.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cases import Case, tokens
from .classic import causal_mask, merge_heads, split_heads
from .modern_a import RoPEAttention


def positions(scores):
    """Query position (a column) and key position (a row) of the last two axes of `scores`."""
    n_q, n_k = scores.shape[-2:]
    return (
        torch.arange(n_q, device=scores.device)[:, None],
        torch.arange(n_k, device=scores.device)[None, :],
    )


class Attention(nn.Module):
    """Llama-style causal softmax attention, the base of the variants below that change only
    which keys are hidden (`hidden`), how scores become weights (`weights`) or the whole head
    (`attend`): q_proj, k_proj, v_proj, o_proj; query heads (g r) share key/value head g, as
    Llama's repeat_kv orders them (num_kv_heads=None: one key/value head per query head)."""

    def __init__(self, d_model, num_heads, head_dim, num_kv_heads=None, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, self.num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, self.num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=bias)

    def repeat_kv(self, t):
        return t.repeat_interleave(self.num_heads // self.num_kv_heads, dim=-3)

    def hidden(self, scores):
        return causal_mask(scores)

    def weights(self, scores):
        return torch.softmax(scores.masked_fill(self.hidden(scores), -torch.inf), dim=-1)

    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        return self.weights(scores) @ v

    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = self.repeat_kv(split_heads(self.k_proj(x), self.num_kv_heads))
        v = self.repeat_kv(split_heads(self.v_proj(x), self.num_kv_heads))
        return self.o_proj(merge_heads(self.attend(q, k, v)))


def elu_feature_map(x):
    """φ(x) = elu(x) + 1: positive, so every normaliser φ(q)·Σφ(k) is positive."""
    return F.elu(x) + 1


class LinearAttention(Attention):
    """Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), non-causal:
    O = φ(Q) (Σ_τ' φ(K)ᵀ V) / (φ(Q) · Σ_τ' φ(K) + eps), as fast-transformers' LinearAttention
    (eps 1e-6; its AttentionLayer's projections have biases). specs/linear_attention.attn."""

    def __init__(self, d_model, num_heads, head_dim, eps=1e-6):
        super().__init__(d_model, num_heads, head_dim, bias=True)
        self.eps = eps

    def attend(self, q, k, v):
        q, k = elu_feature_map(q), elu_feature_map(k)
        kv = k.transpose(-2, -1) @ v  # (..., h, d_k, d_k): Σ_τ' φ(K_τ')ᵀ V_τ'
        z = q @ k.sum(dim=-2)[..., None]  # (..., h, n, 1): φ(Q_τ) · Σ_τ' φ(K_τ')
        return (q @ kv) / (z + self.eps)


class CausalLinearAttention(LinearAttention):
    """Causal linear attention (Katharopoulos et al. 2020), fast-transformers'
    CausalLinearAttention: the sums over τ' become prefix sums over τ' <= τ, written here
    with torch.cumsum over the outer products φ(K_τ')ᵀ V_τ'. specs/linear_attention_causal.attn."""

    def attend(self, q, k, v):
        q, k = elu_feature_map(q), elu_feature_map(k)
        kv = torch.cumsum(k[..., :, None] * v[..., None, :], dim=-3)  # (..., h, n, d_k, d_k)
        z = torch.cumsum(k, dim=-2)  # (..., h, n, d_k)
        numerator = (q[..., None, :] @ kv).squeeze(-2)
        return numerator / ((q * z).sum(dim=-1, keepdim=True) + self.eps)


def mix_heads(t, P):
    """t'[..., ν, τ, τ'] = Σ_μ t[..., μ, τ, τ'] P[μ, ν]: the paper's einsum over the head axis."""
    return (t.movedim(-3, -1) @ P).movedim(-1, -3)


class TalkingHeadsAttention(Attention):
    """Talking-Heads attention (Shazeer et al. 2020), causal: the logits of the h heads are
    mixed by P_l (h×h) before the softmax and the weights by P_w (h×h) after it, the paper's
    einsums "...hqk,hj->...jqk"; the causal mask goes on the mixed logits (mixing -inf would
    give NaN). No biases. specs/talking_heads.attn."""

    def __init__(self, d_model, num_heads, head_dim):
        super().__init__(d_model, num_heads, head_dim)
        self.P_l = nn.Parameter(torch.randn(num_heads, num_heads) / num_heads**0.5)
        self.P_w = nn.Parameter(torch.randn(num_heads, num_heads) / num_heads**0.5)

    def weights(self, scores):
        logits = mix_heads(scores, self.P_l)
        logits = logits.masked_fill(self.hidden(logits), -torch.inf)
        return mix_heads(torch.softmax(logits, dim=-1), self.P_w)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight over the last axis (Llama's, DeepSeek's, DIFF's)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(n, dim, base, like):
    """cos and sin (n, dim) at positions 0..n-1, transformers' RotaryEmbedding: frequencies
    base^(-2k/dim), k < dim/2, repeated for the two halves (computed in like's dtype)."""
    kw = {"dtype": like.dtype, "device": like.device}
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, **kw) / dim)
    freqs = torch.arange(n, **kw)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention, DeepSeek-V2/V3 (transformers' DeepseekV3Attention with
    rope_interleave=False, no biases, no YaRN mscale), causal. specs/mla.attn.

    Queries through a low-rank latent: q_a_proj -> q_a_layernorm -> q_b_proj into per-head
    (nope | rope) parts. Keys and values: kv_a_proj_with_mqa gives one fused axis split
    unequally into the kv latent (kv_lora_rank) and one rotary key part (qk_rope_head_dim)
    shared by all heads; the latent is normed and kv_b_proj expands it into per-head
    (key nope | value) parts. Scale (qk_nope_head_dim + qk_rope_head_dim)^-0.5.
    """

    def __init__(
        self,
        hidden_size,
        num_heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        rope_theta=10000.0,
        eps=1e-6,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_theta = rope_theta
        self.scaling = self.qk_head_dim**-0.5
        self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(q_lora_rank, eps)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            hidden_size, kv_lora_rank + qk_rope_head_dim, bias=False
        )
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps)
        self.kv_b_proj = nn.Linear(
            kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=False)

    def forward(self, x):
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = split_heads(q, self.num_heads)
        q_pass, q_rot = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)

        compressed_kv = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = compressed_kv.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv = split_heads(self.kv_b_proj(self.kv_a_layernorm(k_pass)), self.num_heads)
        k_pass, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_rot = k_rot.unsqueeze(-3)  # (..., 1, n, d_r): one rotary key for every head

        cos, sin = rotary(x.shape[-2], self.qk_rope_head_dim, self.rope_theta, x)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = k_rot * cos + rotate_half(k_rot) * sin

        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_pass, k_rot.expand(*k_pass.shape[:-1], -1)), dim=-1)
        scores = q @ k.transpose(-2, -1) * self.scaling
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(merge_heads(out))


class DifferentialAttention(nn.Module):
    """Differential attention (Ye et al. 2024, "Differential Transformer"), as the authors'
    MultiheadDiffAttn without RoPE and with as many key/value heads as heads, causal.

    q_proj and k_proj make 2h heads of width d; heads (2μ, 2μ+1) give the two softmax maps of
    head μ, whose value head is 2d wide. A1 - λ·A2 with λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init,
    then a per-head RMSNorm (subln, eps 1e-5, learned scale) and the factor (1 - λ_init).
    specs/differential.attn.
    """

    def __init__(self, embed_dim, num_heads, lambda_init=0.8):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads // 2
        self.lambda_init = lambda_init
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(self.head_dim).normal_(0, 0.1)))
        self.subln = RMSNorm(2 * self.head_dim, eps=1e-5)

    def forward(self, x):
        q = split_heads(self.q_proj(x), 2 * self.num_heads)
        k = split_heads(self.k_proj(x), 2 * self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5
        weights = torch.softmax(scores.masked_fill(causal_mask(scores), -torch.inf), dim=-1)

        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2))
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        weights = weights.unflatten(-3, (self.num_heads, 2))
        weights = weights[..., 0, :, :] - lambda_full * weights[..., 1, :, :]

        out = self.subln(weights @ v) * (1 - self.lambda_init)
        return self.out_proj(merge_heads(out))


class SigmoidAttention(Attention):
    """Sigmoid attention (Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for
    Sigmoid Self-Attention"): weights sigmoid(Q Kᵀ/√d_k + b) with b = -log n (n keys), no
    normalisation over keys; causal by setting the hidden weights to 0.
    specs/sigmoid_attention.attn."""

    def weights(self, scores):
        weights = torch.sigmoid(scores - math.log(scores.shape[-1]))
        return weights.masked_fill(self.hidden(scores), 0.0)


class SinkAttention(Attention):
    """Attention sinks as in GPT-OSS (transformers' GptOssAttention, eager path, RoPE left
    out): grouped-query heads, biases, a sliding window of `window` keys (the query itself
    included), and a learned logit sinks[μ] per head that joins the softmax's denominator:
    softmax over [scores, sink], then the sink's column dropped. specs/attention_sinks.attn."""

    def __init__(self, d_model, num_heads, head_dim, num_kv_heads, window):
        super().__init__(d_model, num_heads, head_dim, num_kv_heads, bias=True)
        self.window = window
        self.sinks = nn.Parameter(torch.randn(num_heads))

    def hidden(self, scores):
        query, key = positions(scores)
        return (key > query) | (query - key >= self.window)

    def weights(self, scores):
        scores = scores.masked_fill(self.hidden(scores), -torch.inf)
        sinks = self.sinks.reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.amax(dim=-1, keepdim=True)
        return torch.softmax(combined, dim=-1)[..., :-1]


class ChunkedAttention(Attention):
    """Llama 4's chunked attention (attention_chunk_size 8192; RoPE and QK norm left out):
    grouped-query causal attention where query τ sees key τ' only inside its own chunk,
    ⌊τ/C⌋ = ⌊τ'/C⌋ and τ' <= τ. specs/chunked.attn."""

    def __init__(self, d_model, num_heads, head_dim, num_kv_heads, chunk_size):
        super().__init__(d_model, num_heads, head_dim, num_kv_heads)
        self.chunk_size = chunk_size

    def hidden(self, scores):
        query, key = positions(scores)
        other_chunk = query // self.chunk_size != key // self.chunk_size
        return (key > query) | other_chunk


class GatedOutputAttention(Attention):
    """Gated attention of Qwen3-Next (transformers' Qwen3NextAttention; q/k norms, partial
    RoPE and grouped keys left out): q_proj gives, per head, the query and a gate of the same
    width; the attention output is multiplied by sigmoid(gate) elementwise before o_proj.
    Causal. specs/gated_output.attn."""

    def __init__(self, d_model, num_heads, head_dim):
        super().__init__(d_model, num_heads, head_dim)
        self.q_proj = nn.Linear(d_model, num_heads * head_dim * 2, bias=False)

    def forward(self, x):
        q_and_gate = self.q_proj(x).view(*x.shape[:-1], self.num_heads, 2 * self.head_dim)
        q, gate = torch.chunk(q_and_gate, 2, dim=-1)
        gate = gate.reshape(*x.shape[:-1], -1)  # (..., n, (μa)), as the merged heads
        q = q.transpose(-3, -2)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        out = merge_heads(self.attend(q, k, v))
        return self.o_proj(out * torch.sigmoid(gate))


class ForgettingAttention(Attention):
    """The Forgetting Transformer (Lin et al. 2025, "Forgetting Transformer: Softmax Attention
    with a Forget Gate"), its "FoX (Llama)" layer without output gate or norms: a forget gate
    f_t = sigmoid(fgate_proj(x_t)) per head and position, and key j's score for query i >= j
    down-weighted by log of the product f_(j+1) ... f_i, the difference of the prefix sums of
    log f (the paper's D matrix). Causal. specs/forgetting.attn."""

    def __init__(self, d_model, num_heads, head_dim):
        super().__init__(d_model, num_heads, head_dim)
        self.fgate_proj = nn.Linear(d_model, num_heads, bias=True)

    def forward(self, x):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_heads)
        v = split_heads(self.v_proj(x), self.num_heads)
        log_f = F.logsigmoid(self.fgate_proj(x)).transpose(-2, -1)  # (..., h, n), <= 0
        c = torch.cumsum(log_f, dim=-1)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5 + c[..., :, None] - c[..., None, :]
        return self.o_proj(merge_heads(self.weights(scores) @ v))


def yarn_frequencies(dim, base, factor, original, beta_fast=32, beta_slow=1):
    """YaRN's rotary frequencies (Peng et al. 2023, "YaRN", section 3.2, "NTK-by-parts"),
    in float64: pair j's wavelength 2π/θ_j against the original context `original` says how
    many turns it makes there; pairs from the one that turns beta_fast times keep θ_j, pairs
    from the one that turns beta_slow times get θ_j / factor, linearly in between by pair
    index (rounded outwards, as the paper's code); and the attention factor 0.1 ln s + 1."""

    def pair_turning(turns):  # the (fractional) pair index that turns `turns` times
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), dim - 1)
    high = high + 0.001 if high == low else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return theta * (1 - ramp) + theta / factor * ramp, 0.1 * math.log(factor) + 1


class YarnRoPEAttention(RoPEAttention):
    """Llama's rotate-half rotary attention with YaRN's frequencies and attention factor,
    as transformers' rope_type "yarn" applies them (cos and sin scaled by the factor).
    Causal. specs/yarn_rope.attn."""

    def __init__(self, d_model, num_heads, head_dim, factor, original, base=10000.0):
        super().__init__(d_model, num_heads, head_dim)
        self.factor, self.original, self.base = factor, original, base

    def forward(self, x):
        q, k, v = self.heads(x)
        theta, scale = yarn_frequencies(self.head_dim, self.base, self.factor, self.original)
        angles = torch.outer(torch.arange(x.shape[-2], dtype=torch.float64), theta).to(q)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos() * scale, emb.sin() * scale
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5
        scores = scores.masked_fill(causal_mask(scores), -torch.inf)
        return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


def jitter(module):
    """Moves every parameter off its initial value (RMSNorm's ones, above all), so that a
    weight read in the wrong layout cannot hide behind a constant."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


LLAMA_SIZES = {"d_m": 6, "h": 2, "d_k": 3}
LLAMA_COUNT = "4*d_m*h*d_k"
GQA_SIZES = {"d_m": 6, "h_kv": 2, "n_rep": 2, "d_k": 3}
GQA_COUNT = "2*d_m*h_kv*n_rep*d_k + 2*d_m*h_kv*d_k"
LINEAR_COUNT = "4*d_m*h*d_k + 3*h*d_k + d_m"
MLA_COUNT = (
    "d_m*d_q + d_q + d_q*h*(d_n + d_r) + d_m*(d_c + d_r) + d_c + d_c*h*(d_n + d_v) + h*d_v*d_m"
)
MLA_SIZES = {"d_m": 8, "h": 2, "d_q": 5, "d_c": 4, "d_n": 3, "d_r": 4, "d_v": 2}
DEEPSEEK_V3 = {
    "DeepSeek-V3": {
        "d_m": 7168,
        "h": 128,
        "d_q": 1536,
        "d_c": 512,
        "d_n": 128,
        "d_r": 64,
        "d_v": 128,
    }
}


def mha(module_class):
    return lambda s: jitter(module_class(s["d_m"], s["h"], s["d_k"]))


def gqa(module_class, size_name):
    """module_class(d_m, h, d_k, h_kv, size) at the spec's (g r) sizes."""
    return lambda s: jitter(
        module_class(s["d_m"], s["h_kv"] * s["n_rep"], s["d_k"], s["h_kv"], s[size_name])
    )


MODERN_B_CASES = [
    Case(
        "linear_attention",
        mha(LinearAttention),
        tokens("d_m"),
        LLAMA_SIZES,
        LINEAR_COUNT,
    ),
    Case(
        "linear_attention_causal",
        mha(CausalLinearAttention),
        tokens("d_m"),
        LLAMA_SIZES,
        LINEAR_COUNT,
    ),
    Case(
        "talking_heads",
        mha(TalkingHeadsAttention),
        tokens("d_m"),
        {**LLAMA_SIZES, "h": 3},
        LLAMA_COUNT + " + 2*h**2",
    ),
    Case(
        "mla",
        lambda s: jitter(
            MultiHeadLatentAttention(
                s["d_m"], s["h"], s["d_q"], s["d_c"], s["d_n"], s["d_r"], s["d_v"]
            )
        ),
        tokens("d_m"),
        MLA_SIZES,
        MLA_COUNT,
        DEEPSEEK_V3,
    ),
    Case(
        "differential",
        lambda s: jitter(DifferentialAttention(s["d_m"], s["h"], s["lambda_init"])),
        tokens("d_m"),
        {"d_m": 8, "h": 2, "d": 2, "lambda_init": 0.8},
        "4*d_m*2*h*d + 4*d + 2*d",
    ),
    Case(
        "sigmoid_attention",
        mha(SigmoidAttention),
        tokens("d_m"),
        LLAMA_SIZES,
        LLAMA_COUNT,
    ),
    Case(
        "attention_sinks",
        gqa(SinkAttention, "w"),
        tokens("d_m"),
        {**GQA_SIZES, "w": 3},
        GQA_COUNT + " + h_kv*n_rep*d_k + 2*h_kv*d_k + d_m + h_kv*n_rep",
        {"GPT-OSS-120B": {"d_m": 2880, "h_kv": 8, "n_rep": 8, "d_k": 64, "w": 128}},
    ),
    Case(
        "chunked",
        gqa(ChunkedAttention, "C"),
        tokens("d_m"),
        {**GQA_SIZES, "C": 2},
        GQA_COUNT,
        {"Llama-4-Scout": {"d_m": 5120, "h_kv": 8, "n_rep": 5, "d_k": 128, "C": 8192}},
    ),
    Case(
        "gated_output",
        mha(GatedOutputAttention),
        tokens("d_m"),
        LLAMA_SIZES,
        "5*d_m*h*d_k",
    ),
    Case(
        "forgetting",
        mha(ForgettingAttention),
        tokens("d_m"),
        LLAMA_SIZES,
        LLAMA_COUNT + " + h*d_m + h",
    ),
    Case(
        "yarn_rope",
        lambda s: jitter(YarnRoPEAttention(s["d_m"], s["h"], 2 * s["d_r"], s["factor"], s["L"])),
        tokens("d_m"),
        # pairs j = 0 kept, j = 2 half interpolated, j = 3 interpolated (d_k = 8, L = 4096)
        {"d_m": 6, "h": 2, "d_r": 4, "factor": 4.0, "L": 4096.0},
        "8*d_m*h*d_r",
        # YaRN's Llama 2 7B at 128k tokens (factor 32 of 4096)
        {"Yarn-Llama-2-7b-128k": {"d_m": 4096, "h": 32, "d_r": 64, "factor": 32.0, "L": 4096}},
    ),
]
