"""The grouped-query spec equals PyTorch's fused kernel with enable_gqa=True."""

from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

import indexattn

ROOT = Path(__file__).resolve().parent.parent


def test_gqa_equals_sdpa_with_enable_gqa():
    spec = indexattn.compile_spec(ROOT / "specs" / "gqa.attn")
    g, r, d_k, d_m, n = 2, 3, 4, 10, 7
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = randn(2, n, d_m)
    wq, wk, wv, wo = (
        randn(g * r * d_k, d_m),
        randn(g * d_k, d_m),
        randn(g * d_k, d_m),
        randn(d_m, g * r * d_k),
    )
    y = spec(X=x, q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv, o_proj_weight=wo, h_kv=g)
    q = rearrange(x @ wq.T, "b n (h a) -> b h n a", a=d_k)  # h = (g r), Llama's order
    k = rearrange(x @ wk.T, "b n (g a) -> b g n a", a=d_k)
    v = rearrange(x @ wv.T, "b n (g a) -> b g n a", a=d_k)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = rearrange(o, "b h n a -> b n (h a)") @ wo.T
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
