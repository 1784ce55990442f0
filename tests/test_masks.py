"""Masks and tables reach the attention kernel in its preferred form: a per-head bias with the
queries' batch axes (the fused CPU path, not the math fallback), T5's buckets as integers built
once per shape and its table gathered straight into (head, query, key), and masks that read
tensors (document ids) as booleans."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import indexattn

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


def test_a_three_axis_mask_goes_the_math_way():
    """The twin: torch's rule that the test above steers clear of."""
    q, kv = torch.randn(3, 4, 1, 4), torch.randn(3, 4, 5, 4)
    for mask, path in ((torch.zeros(1, 1, 5), "math"), (torch.zeros(1, 5), "fused")):
        assert kernel_path(F.scaled_dot_product_attention, q, kv, kv, attn_mask=mask) == path
