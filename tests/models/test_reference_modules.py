"""The hand-written reference modules on their own: published numbers, bugs, sizes, batch axes."""

import pytest
import sympy
import torch
from reference import classic
from reference.buggy import HeadMajorGPT2, RepeatKVGQA, ReshapeHeadsMHA
from reference.cases import CASES, JOURNEY, assert_reproduces_journey
from torch import nn


def test_simple_attention_reproduces_the_published_example():
    context, weights = classic.SimpleSelfAttention()(torch.tensor(JOURNEY, dtype=torch.float64))
    assert_reproduces_journey(context, weights)


def mha(heads):
    return classic.MultiHeadAttention(6, 2 * heads, heads), ReshapeHeadsMHA(6, 2 * heads, heads)


def gqa(kv_heads):
    right = classic.GroupedQueryAttention(6, 2 * kv_heads, kv_heads, 3)
    return right, RepeatKVGQA(6, 2 * kv_heads, kv_heads, 3)


def gpt2(heads):
    return classic.GPT2Attention(6, heads), HeadMajorGPT2(6, heads)


BUGS = {"reshape for transpose": mha, "heads (r g) for (g r)": gqa, "(μBa) for (Bμa)": gpt2}


def first_output(module, x):
    out = module(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("pair", BUGS.values(), ids=BUGS.keys())
@pytest.mark.parametrize("heads", [1, 2])
def test_each_bug_changes_the_output_unless_there_is_one_head(pair, heads):
    """With one head (one key/value group), the two confused axis orders are the same."""
    torch.manual_seed(0)
    right, wrong = (m.double().eval() for m in pair(heads))
    wrong.load_state_dict(right.state_dict())
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    same = torch.allclose(first_output(right, x), first_output(wrong, x), atol=1e-10, rtol=0)
    assert same == (heads == 1)


def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_parameter_count_formula(case):
    formula = sympy.sympify(case.count)
    for sizes in [case.sizes, *case.real.values()]:
        with torch.device("meta"):
            module = case.build(sizes)
        assert parameter_count(module) == formula.subs(sizes), sizes


# torch.bmm and torch.nn.MultiheadAttention take one batch axis; dk_dv has none.
BATCHED = [c for c in CASES if c.spec not in ("sdpa", "torch_mha", "dk_dv", "dk_dv_mask")]


def run(case, module, inputs):
    out = case.call(module, inputs)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("case", BATCHED, ids=lambda c: c.spec)
def test_modules_take_any_number_of_batch_axes(case):
    torch.manual_seed(0)
    module = case.build(case.sizes).double().eval()
    inputs = case.inputs(case.sizes)
    batched = run(case, module, inputs)
    unbatched = run(case, module, {k: v[1] for k, v in inputs.items()})
    two_axes = run(case, module, {k: v[None] for k, v in inputs.items()})
    for one, none, two in zip(batched, unbatched, two_axes, strict=True):
        torch.testing.assert_close(one[1], none, atol=1e-12, rtol=0)
        torch.testing.assert_close(one, two[0], atol=1e-12, rtol=0)


def test_gpt2_and_torch_mha_read_the_fused_weight_alike():
    """Two implementations of the (Bμa) layout: nanoGPT's split and torch's in_proj_weight."""
    torch.manual_seed(0)
    gpt2 = classic.GPT2Attention(8, 2).double().eval()
    torch_mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    torch_mha.load_state_dict(
        {
            "in_proj_weight": gpt2.c_attn.weight,
            "in_proj_bias": gpt2.c_attn.bias,
            "out_proj.weight": gpt2.c_proj.weight,
            "out_proj.bias": gpt2.c_proj.bias,
        }
    )
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    causal = classic.causal_mask(torch.empty(5, 5))
    want, weights = torch_mha(x, x, x, attn_mask=causal, average_attn_weights=False)
    got, got_weights = gpt2(x)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_weights, weights, atol=1e-12, rtol=0)
