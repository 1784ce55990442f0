"""Multi-Token Attention (Golovneva et al. 2025), hand-written as the paper's code computes it:
the scores masked with zeros, padded, convolved with one c_q×c_k kernel per head by a grouped
F.conv2d, masked with -inf, softmax. specs/mta.attn; `MTA_CASES` says at which sizes."""

import torch
import torch.nn.functional as F
from torch import nn

from .cases import Case, tokens
from .modern_b import LLAMA_COUNT, LLAMA_SIZES, Attention, jitter


def key_query_conv(scores, kernel):
    """Σ_{p, r} kernel[μ, p, r] scores[μ, τ - p, τ' - r + ⌊c_k/2⌋], zero outside the
    sequence: queries reach back c_q - 1, keys are centred (the paper's j' from -⌊c_k/2⌋ to
    ⌈c_k/2⌉ - 1). conv2d is a correlation, so the kernel is flipped."""
    heads, c_q, c_k = kernel.shape
    padded = F.pad(scores, (c_k - 1 - c_k // 2, c_k // 2, c_q - 1, 0))
    batch = padded.reshape(-1, heads, *padded.shape[-2:])
    weight = kernel.flip(-2, -1)[:, None]
    return F.conv2d(batch, weight, groups=heads).view(scores.shape)


class MultiTokenAttention(Attention):
    """Causal attention whose pre-softmax scores are convolved over (query, key) offsets:
    future scores zeroed before the convolution, -inf after it (the paper's Mask_0 and
    Mask_-inf around Conv2d_θ)."""

    def __init__(self, d_model, num_heads, head_dim, c_q, c_k):
        super().__init__(d_model, num_heads, head_dim)
        self.theta = nn.Parameter(torch.randn(num_heads, c_q, c_k) / (c_q * c_k) ** 0.5)

    def weights(self, scores):
        hidden = self.hidden(scores)
        mixed = key_query_conv(scores.masked_fill(hidden, 0), self.theta)
        return torch.softmax(mixed.masked_fill(hidden, -torch.inf), dim=-1)


MTA_SIZES = {**LLAMA_SIZES, "c_q": 3, "c_k": 4}  # c_k even: the key offsets lean back by one

MTA_CASES = [
    Case(
        "mta",
        lambda s: jitter(MultiTokenAttention(s["d_m"], s["h"], s["d_k"], s["c_q"], s["c_k"])),
        tokens("d_m"),
        MTA_SIZES,
        LLAMA_COUNT + " + h*c_q*c_k",
        {"GPT-2 small, a 6×11 kernel": {"d_m": 768, "h": 12, "d_k": 64, "c_q": 6, "c_k": 11}},
    ),
]
