"""The grouped-query spec equals PyTorch's fused kernel with enable_gqa=True."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import indexattn
from indexattn.oracle import reference

ROOT = Path(__file__).resolve().parents[2]


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


UNMASKED = """
index τ : N
index σ : N_kv
{heads}
index a : d_k
input  Q_<{q}τa>
input  K_<{k}σa>
input  V_<{k}σa>
S_<{q}τσ> = Q_<{q}τa> K_<{k}σa>
A_<{q}τσ> = softmax_<σ>(S_<{q}τσ>)
O_<{q}τa> = A_<{q}τσ> V_<{k}σa>
output O
"""
RANGES = {"g": "h_kv", "r": "n_rep", "m": "n_sub"}


def _packed_case(q: str, k: str, n: int, n_kv: int = 6):
    """A grouped unmasked spec and its inputs: query heads `q`, key heads `k`."""
    sizes = {"g": 2, "r": 3, "m": 2}
    heads = "\n".join(f"index {i} : {RANGES[i]}" for i in q)
    spec = indexattn.compile_spec(UNMASKED.format(heads=heads, q=q, k=k), name="grouped")
    gen = torch.Generator().manual_seed(n)
    args = {
        name: torch.randn(4, *(sizes[i] for i in heads), length, 5, generator=gen).double()
        for name, heads, length in (("Q", q, n), ("K", k, n_kv), ("V", k, n_kv))
    }
    return spec, args


@pytest.mark.parametrize("n", [1, 4])  # a decode step's one query, and several
@pytest.mark.parametrize(("q", "k"), [("gr", "g"), ("grm", "g"), ("gr", ""), ("gmr", "gm")])
def test_query_heads_of_a_key_head_run_as_rows_without_a_mask(q, k, n):
    """No mask: a key head's query heads are more rows against its keys (Attention.packed),
    one kernel call without enable_gqa, equal to the literal reading and to the grouped call."""
    spec, args = _packed_case(q, k, n)
    assert "enable_gqa" not in spec.module_source.text and ".unflatten(-2," in spec.source
    got = spec(**args)
    (literal,) = reference.evaluate(spec.ir, **args)
    torch.testing.assert_close(got, literal, rtol=0, atol=1e-12)
    if len(k) <= 1:  # the grouped call, as transformers' sdpa makes it
        keys, values = (args[x] if k else args[x][:, None] for x in ("K", "V"))
        queries = args["Q"].flatten(1, len(q))
        want = F.scaled_dot_product_attention(queries, keys, values, scale=1.0, enable_gqa=True)
        torch.testing.assert_close(got.flatten(1, len(q)), want, rtol=0, atol=1e-12)


def test_twin_the_heads_of_the_keys_laid_out_last_are_packed_after_a_transpose():
    """Query heads (r g) with keys by g: the queries are laid out (g r) first (a view), then
    packed; the values are the literal reading's."""
    spec, args = _packed_case("rg", "g", 1)
    assert ".transpose(-4, -3).flatten(-3, -2)" in spec.source
    (literal,) = reference.evaluate(spec.ir, **args)
    torch.testing.assert_close(spec(**args), literal, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gqa_core", "gqa_causal_core"])
def test_twin_a_mask_or_the_causal_flag_keeps_the_heads_apart(name):
    """A mask over (τ, σ), or the kernel's causal flag, tells rows apart: heads stay heads."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    assert "enable_gqa=True" in spec.source and ".unflatten(-2," not in spec.source
