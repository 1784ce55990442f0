"""Masks and tables reach the attention kernel in its preferred form: a per-head bias with the
queries' batch axes (the fused CPU path, not the math fallback), T5's buckets as integers built
once per shape and its table gathered straight into (head, query, key), and masks that read
tensors (document ids, a top-k's blocks read at each key's block) as booleans."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import indexattn
from indexattn.oracle import reference

SIZES = {
    "t5_bias": {"d_m": 16, "h": 2, "d_k": 8},
    "alibi": {"d_in": 16, "d_out": 16, "h": 2, "d_k": 8},
}


def layer(name: str, fresh: str = ""):
    """The spec's module; `fresh` names a compiled spec of its own, with empty caches."""
    torch.manual_seed(0)
    text = Path(f"specs/{name}.attn").read_text(encoding="utf-8")
    spec = indexattn.compile_spec(text, name=f"{name}_{fresh}" if fresh else name)
    return spec.module(**SIZES[name]).eval()


@pytest.mark.parametrize("name", ["t5_bias", "alibi"])
@pytest.mark.parametrize("batch", [(2,), ()])
def test_a_bias_per_head_has_the_queries_axes(name, batch, masks):
    """Batched queries (…, h, N, d) get a (…, h, N, N) bias; unbatched ones (h, N, d) an
    (h, N, N) one: the kernel's fused path takes a mask of 2 axes or of as many as the queries."""
    torch.manual_seed(1)
    layer(name)(torch.randn(*batch, 5, 16))
    (mask,) = masks
    assert mask.shape == (*batch, 2, 5, 5)
    assert mask.stride()[-3:] == (25, 5, 1)  # no copy inside the kernel


@pytest.mark.parametrize("batch", [(1,), ()])
def test_a_bias_per_head_takes_the_fused_kernel(batch):
    """The twin of the shape test in what the kernel does: a batch of one takes the fused CPU
    kernel; unbatched queries go the math way before torch 2.14 and the fused way from it on
    (torch's rule, not ours: 2.13.0 and 2.14.1 seen)."""
    alibi = layer("alibi")
    with torch.profiler.profile() as profile:
        alibi(torch.randn(*batch, 5, 16))
    names = {event.name for event in profile.events()}
    fused = "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert fused == (bool(batch) or torch.__version__ >= "2.14")
    assert ("aten::_scaled_dot_product_attention_math" in names) != fused


def test_t5_buckets_are_made_by_blocks_never_held_whole():
    """T5's bucket ids are made per block of queries from their positions (passes/tables.py):
    what is kept per shape holds no tensor over two positions (the thresholds of the
    logarithmic buckets alone, the same at every length)."""
    t5 = layer("t5_bias", fresh="once")
    spec = t5.spec
    t5(torch.randn(1, 9, 16))
    (held,) = spec._constants.values()
    assert held and all(t.numel() < 9 * 9 for t in held)
    t5(torch.randn(1, 9, 16))
    assert len(spec._constants) == 1
    t5(torch.randn(1, 10, 16))
    assert len(spec._constants) == 1  # they depend on no length


def test_t5_table_gradient_is_the_gathered_sum():
    """d/dtable of sum(mask · G) is G summed over the places of each bucket (no one-hot)."""
    t5 = layer("t5_bias", fresh="gradient")
    table = t5.relative_attention_bias_weight
    x = torch.randn(1, 7, 16)
    t5(x).sum().backward()
    distance = torch.arange(7)[None, :] - torch.arange(7)[:, None]  # key minus query
    buckets = torch.where(distance > 0, 16, 0) + distance.abs()  # every |distance| below 8
    used = torch.zeros(32, dtype=torch.bool)
    used[buckets.unique()] = True
    assert table.grad[used].abs().sum() > 0
    assert table.grad[~used].abs().sum() == 0  # buckets no pair of positions falls in


def doc_mask(ids: torch.Tensor, masks: list) -> torch.Tensor:
    torch.manual_seed(0)
    spec = indexattn.compile_spec("specs/doc_mask.attn")
    spec.module(d_m=16, h=2, d_k=8)(torch.randn(1, ids.shape[-1], 16), ids)
    return masks.pop()


def test_doc_mask_is_boolean(masks):
    ids = torch.tensor([[0, 0, 0, 1, 1, 2]])
    mask = doc_mask(ids, masks)
    assert mask.dtype == torch.bool
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    same = ids[0, :, None] == ids[0, None, :]
    assert torch.equal(mask[0, 0], causal & same)


def test_doc_mask_follows_the_ids(masks):
    """The twin: one token moved to the next document changes exactly its row and column."""
    before = doc_mask(torch.tensor([[0, 0, 0, 1, 1, 2]]), masks)[0, 0]
    after = doc_mask(torch.tensor([[0, 0, 1, 1, 1, 2]]), masks)[0, 0]
    changed = (before != after).nonzero().tolist()
    assert changed and all(2 in place for place in changed)


def kernel_path(module, *inputs, **keywords) -> str:
    """Which CPU kernel scaled_dot_product_attention took: "fused" or "math"."""
    with torch.profiler.profile() as profile:
        module(*inputs, **keywords)
    names = {event.name for event in profile.events()}
    fused = "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert fused != ("aten::_scaled_dot_product_attention_math" in names)
    return "fused" if fused else "math"


@pytest.mark.parametrize("mask_batch", [(), (3,), (1,)])
def test_an_input_mask_with_or_without_batch_axes_takes_the_fused_kernel(mask_batch, masks):
    """An additive mask input M_<τσ> (llama3_decode's) comes as (N, N_c + N) or with the batch's
    axes (any narrower batch is expanded to the call's, a view): the kernel gets it with a head
    axis and as many as the queries, and takes its fused path either way (a 3-axis mask would
    go the math way: the twin below)."""
    spec = indexattn.compile_spec(Path("specs/models/llama3_decode.attn"))
    decode = spec.module(d_m=16, h_kv=2, n_rep=2, d_r=2)
    x, positions = torch.randn(3, 1, 16), torch.tensor([[4]])
    cache = torch.randn(3, 2, 4, 2, 2), torch.randn(3, 2, 4, 4)
    mask = torch.zeros(*mask_batch, 1, 5)
    assert kernel_path(decode, x, positions, *cache, mask) == "fused"
    assert masks[-1].shape == (3, 1, 1, 5)


KEYS_KEPT = """
index τ : N
index τ' : N
index h : heads
index a : d
input Q_<hτa>
input K_<hτ'a>
input V_<hτ'a>
input P_<τ'> : int
S_<hττ'> = Q_<hτa> K_<hτ'a> + where(P_<τ'> == 0, -inf, 0)
A_<hττ'> = softmax_<τ'>(S_<hττ'>)
O_<hτa> = A_<hττ'> V_<hτ'a>
output O
"""


@pytest.mark.parametrize("batch", [(8,), (), (2, 3)])
def test_a_mask_along_the_keys_alone_with_batch_axes(batch):
    """A mask of the keys alone (padding ids P_<τ'>) with batch axes: its batch is not read as
    queries (a batch of 8 against 5 keys failed), with or without batch axes; the twin: one
    more key hidden changes the result."""
    spec = indexattn.compile_spec(KEYS_KEPT, name="keys_kept")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*batch, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in "qkv")
    p = torch.randint(0, 3, (*batch, 5), generator=gen)
    p[..., 0] = 1  # every query sees a key
    (literal,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, P=p)
    torch.testing.assert_close(spec(Q=q, K=k, V=v, P=p), literal, rtol=0, atol=1e-12)
    p[..., 0], p[..., 4] = 0, 1  # key 0 hidden from every query, key 4 kept
    assert (spec(Q=q, K=k, V=v, P=p) - literal).abs().max() > 1e-3


def test_a_three_axis_mask_goes_the_math_way():
    """The twin: torch's rule that the test above steers clear of."""
    q, kv = torch.randn(3, 4, 1, 4), torch.randn(3, 4, 5, 4)
    for mask, path in ((torch.zeros(1, 1, 5), "math"), (torch.zeros(1, 5), "fused")):
        assert kernel_path(F.scaled_dot_product_attention, q, kv, kv, attn_mask=mask) == path


# NSA's selected branch, smaller: each query's top-n blocks of keys (by its block scores), read
# at each key's block, and the causal mask; a query whose chosen blocks all lie ahead of it
# sees no key.
BLOCKS = """
index τ, τ' : N
index β : N / ℓ
index λ : ℓ
index c : d
index a : e
input Q_<τc>
input K_<τ'c>
input V_<τ'a>
input φ_<λ>
scalar n = 1
Kc_<βc> = φ_<λ> K_<[β ℓ + λ]c>
Sc_<τβ> = Q_<τc> Kc_<βc>
Ms_<τβ> = where(rank_<β>(Sc_<τβ>) < n, 0, HIDDEN)
M_<ττ'> = where(τ' > τ, -inf, 0)
O_<τa>  = softmax_<τ'>(Q_<τc> K_<τ'c> + Ms_<τ[floor(τ' / ℓ)]> + M_<ττ'>) V_<τ'a>
output O
"""


@pytest.mark.parametrize("hidden", ["-inf", "-30"])
def test_masks_read_at_block_positions_reach_the_kernel_as_one_boolean(hidden, masks):
    """Two 0/-inf masks, one of tensors read at each key's block, are one boolean attn_mask
    (and, or: no float tensor of the scores' size); values and gradients equal the literal
    interpreter's in float64, rows that see no key zeros (not NaN). The twin: blocks hidden
    by -30, a bias and no mask, stay an additive float mask, and no row is dead."""
    spec = indexattn.compile_spec(BLOCKS.replace("HIDDEN", hidden), name=f"blocks{hidden[1:]}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 3, dtype=torch.float64, generator=g) for _ in "qkv")
    phi = torch.randn(3, dtype=torch.float64, generator=g)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    got = spec(Q=q, K=k, V=v, φ=phi)
    (want,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, phi=phi)
    assert (got - want).abs().max() < 1e-13
    weight = torch.randn(got.shape, dtype=got.dtype, generator=g)
    for a, b in zip(*(torch.autograd.grad((o * weight).sum(), inputs) for o in (got, want))):
        assert a.isfinite().all() and (a - b).abs().max() < 1e-12
    dead = (got == 0).all(-1)
    assert {m.dtype for m in masks} == {torch.bool if hidden == "-inf" else torch.float64}
    assert 0 < dead.sum() < dead.numel() if hidden == "-inf" else not dead.any()
    (other,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, phi=phi, n=2)
    assert (got - other).abs().max() > 1e-3  # one more block each: the comparison sees it


BLOCK_CAUSAL = """
index τ, τ' : N
index β : N / ℓ
index c, e : d
input Q_<τe>
input K_<τ'e>
input V_<τ'c>
Mb_<τβ> = where(β > floor(τ / ℓ), HIDDEN, 0)
O_<τc>  = softmax_<τ'>(Q_<τe> K_<τ'e> + Mb_<τ[floor(τ' / ℓ)]>) V_<τ'c>
output O
"""


@pytest.mark.parametrize("hidden", ["-inf", "-30"])
def test_a_mask_of_positions_read_at_block_positions_is_a_boolean_table(hidden, masks):
    """Block-causal attention, a mask of positions read at each key's block: a boolean table
    made once per shape, equal to the literal interpreter's reading. The twin: a bias of -30
    read there stays float."""
    spec = indexattn.compile_spec(BLOCK_CAUSAL.replace("HIDDEN", hidden), name="block_causal")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 3, dtype=torch.float64, generator=g) for _ in "qkv")
    got = spec(Q=q, K=k, V=v, ℓ=3)
    (want,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, ℓ=3)
    assert (got - want).abs().max() < 1e-13
    assert {m.dtype for m in masks} == {torch.bool if hidden == "-inf" else torch.float64}
    (other,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, ℓ=4)
    assert (got - other).abs().max() > 1e-3  # blocks of four: the comparison sees it


BLOCK_BIAS = """
index τ, τ' : N
index β : {blocks}
index c, e : d
input Q_<τe>
input K_<τ'e>
input V_<τ'c>
param T_<β>
O_<τc> = softmax_<τ'>(Q_<τe> K_<τ'e> + T_<[floor(τ' / ℓ)]> + where(τ' > τ, -inf, 0)) V_<τ'c>
output O
"""


@pytest.mark.parametrize("blocks", ["N / ℓ", "ceil(N / ℓ)"])
def test_a_table_read_at_its_blocks_equals_the_literal_in_values_and_gradients(blocks):
    """A bias per block read at each key's block, `[floor(τ' / ℓ)]` over β : N / ℓ (each entry
    ℓ times in a row: a repeat, no gather; over ceil(N / ℓ), a gather), against the literal
    interpreter: values and the table's gradient, summed over each block's keys. The twin:
    one block's bias moved, the literal's values differ from these."""
    spec = indexattn.compile_spec(BLOCK_BIAS.format(blocks=blocks), name="block_bias")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 3, dtype=torch.float64, generator=g) for _ in "qkv")
    t = torch.randn(4, dtype=torch.float64, generator=g).requires_grad_()
    got = spec(Q=q, K=k, V=v, T=t, ℓ=3)
    (want,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, T=t, ℓ=3)
    assert (got - want).abs().max() < 1e-13
    (a,), (b,) = (torch.autograd.grad(o.sum(), (t,)) for o in (got, want))
    assert (a - b).abs().max() < 1e-13
    moved = t.detach() + torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    (other,) = reference.evaluate(spec.ir, Q=q, K=k, V=v, T=moved, ℓ=3)
    assert (got - other).abs().max() > 1e-3
