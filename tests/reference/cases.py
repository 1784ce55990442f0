"""Which spec each reference module implements, at which sizes, and how its state_dict maps.

One `Case` per spec: `build` makes the module from the spec's sizes, `inputs` makes the spec's
inputs (in declaration order, which is also the order of the module's forward arguments), and
`mapping` turns the module's state_dict into the spec's parameters: a rename (dots become
underscores), except for ConcatHeads, whose ModuleList entries are stacked along the head axis.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from . import classic

# Variant 1's published example, "Your journey starts with one step" (3-wide embeddings), and
# its numbers for the query "journey" (row 1), to 4 decimals.
JOURNEY = [
    [0.43, 0.15, 0.89],
    [0.55, 0.87, 0.66],
    [0.57, 0.85, 0.64],
    [0.22, 0.58, 0.33],
    [0.77, 0.25, 0.10],
    [0.05, 0.80, 0.55],
]
JOURNEY_WEIGHTS = [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]
JOURNEY_CONTEXT = [0.4419, 0.6515, 0.5683]


def assert_reproduces_journey(context: torch.Tensor, weights: torch.Tensor) -> None:
    for got, published in ((weights[1], JOURNEY_WEIGHTS), (context[1], JOURNEY_CONTEXT)):
        torch.testing.assert_close(got, torch.tensor(published).double(), atol=5e-5, rtol=0)


BATCH = (2,)  # leading batch axes of the test inputs
N, N_KV = 5, 7  # query and key/value lengths of the test inputs

GPT2_SIZES = {  # GPT-2 small, medium, large, xl: width and heads, head width 64
    "GPT-2 small": {"d_m": 768, "h": 12, "d_k": 64},
    "GPT-2 medium": {"d_m": 1024, "h": 16, "d_k": 64},
    "GPT-2 large": {"d_m": 1280, "h": 20, "d_k": 64},
    "GPT-2 xl": {"d_m": 1600, "h": 25, "d_k": 64},
}
GPT2_IN_OUT = {  # the same, for modules with a separate input and output width
    name: {"d_in": s["d_m"], "d_out": s["d_m"], "h": s["h"], "d_k": s["d_k"]}
    for name, s in GPT2_SIZES.items()
}
GPT2_HEAD = {"GPT-2 small, one head": {"d_in": 768, "d_k": 64}}
BERT_BASE = {"BERT-base": {"d_in": 768, "h": 12, "d_k": 64}}
LLAMA3_8B = {"Llama-3-8B": {"d_m": 4096, "h_kv": 8, "n_rep": 4, "d_k": 128}}  # 32 query heads


def rename(state_dict):
    """state_dict key -> spec parameter name: `W_query.weight` -> `W_query_weight`."""
    return {key.replace(".", "_"): value for key, value in state_dict.items()}


def stack_heads(state_dict):
    """`heads.{μ}.W_query.weight` -> `heads_W_query_weight[μ]`; other keys are renamed."""
    stacks, out = {}, {}
    for key, value in state_dict.items():
        match = re.fullmatch(r"heads\.(\d+)\.(.+)", key)
        if match is None:
            out[key.replace(".", "_")] = value
        else:
            stacks.setdefault("heads_" + match[2].replace(".", "_"), []).append(value)
    return {**out, **{name: torch.stack(values) for name, values in stacks.items()}}


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def additive(hidden):
    """0 where `hidden` is False, -inf where it is True."""
    zeros = torch.zeros(hidden.shape, dtype=torch.float64)
    return zeros.masked_fill(hidden, -torch.inf)


def right_padding(n):
    """(*BATCH, n) additive key mask hiding the last b tokens of batch row b (row 0: none)."""
    rows = torch.arange(BATCH[0])[:, None]
    return additive(torch.arange(n) >= n - rows)


def random_mask(n):
    """(n, n) additive mask hiding random keys, never the diagonal, so no row is all -inf."""
    hidden = torch.rand(n, n) < 0.4
    return additive(hidden & ~torch.eye(n, dtype=torch.bool))


def positional(module, inputs):
    return module(*inputs.values())


def torch_mha_call(module, inputs):
    query, key, value, mask = inputs.values()
    return module(query, key, value, key_padding_mask=mask, average_attn_weights=False)


@dataclass(frozen=True)
class Case:
    """One spec checked against one hand-written module."""

    spec: str  # specs/<spec>.attn
    build: Callable[[dict], nn.Module]  # the reference module at the given spec sizes
    inputs: Callable[[dict], dict]  # spec input name -> tensor, in declaration order
    sizes: dict = field(default_factory=dict)  # test sizes: the spec module's sizes and scalars
    count: str = "0"  # parameter count in the spec's size symbols
    real: dict = field(default_factory=dict)  # named real sizes for the parameter count
    mapping: Callable[[dict], dict] = rename  # module state_dict -> spec parameters
    call: Callable = positional  # runs the module on the inputs


def tokens(width):
    return lambda s: {"X": randn(*BATCH, N, s[width])}


MHA_COUNT = "3*d_in*h*d_k + d_out*h*d_k + d_out"
MHA_SIZES = {"d_in": 6, "d_out": 8, "h": 2, "d_k": 4}

CASES = [
    Case("simple", lambda s: classic.SimpleSelfAttention(), lambda s: {"X": randn(*BATCH, N, 3)}),
    Case(
        "single_head",
        lambda s: classic.SelfAttention(s["d_in"], s["d_k"], qkv_bias=True),
        tokens("d_in"),
        {"d_in": 6, "d_k": 4},
        "3*d_in*d_k + 3*d_k",
        GPT2_HEAD,
    ),
    Case(
        "causal_head",
        lambda s: classic.CausalAttention(s["d_in"], s["d_k"]),
        tokens("d_in"),
        {"d_in": 6, "d_k": 4},
        "3*d_in*d_k",
        GPT2_HEAD,
    ),
    Case(
        "mha_separate",
        lambda s: classic.MultiHeadAttention(s["d_in"], s["d_out"], s["h"]),
        tokens("d_in"),
        MHA_SIZES,
        MHA_COUNT,
        GPT2_IN_OUT,
    ),
    Case(
        "mha_math",
        lambda s: classic.FusedHeadMajorAttention(s["d_m"], s["h"], s["d_k"]),
        tokens("d_m"),
        {"d_m": 6, "h": 2, "d_k": 4},
        "4*d_m*h*d_k + d_m",
        GPT2_SIZES,
    ),
    Case(
        "gpt2",
        lambda s: classic.GPT2Attention(s["d_m"], s["h"]),
        lambda s: {"X": randn(*BATCH, N, s["d_m"]), "P": right_padding(N)},
        {"d_m": 6, "h": 2, "d_k": 3},
        "4*d_m*h*d_k + 3*h*d_k + d_m",
        GPT2_SIZES,
    ),
    Case(
        "dk_dv",
        lambda s: classic.DkDvAttention(s["d"]),
        lambda s: {"X": randn(N, s["d"])},
        {"d": 6},
        "256*d + d**2",
        {"d = 768": {"d": 768}},
    ),
    Case(
        "dk_dv_mask",
        lambda s: classic.DkDvAttention(s["d"]),
        lambda s: {"X": randn(N, s["d"]), "M": random_mask(N)},
        {"d": 6},
        "256*d + d**2",
        {"d = 768": {"d": 768}},
    ),
    Case(
        "concat_heads",
        lambda s: classic.ConcatHeads(s["d_in"], s["d_k"], s["h"], out_proj=False),
        tokens("d_in"),
        {"d_in": 6, "h": 3, "d_k": 2},
        "3*h*d_k*d_in + 3*h*d_k",
        BERT_BASE,
        mapping=stack_heads,
    ),
    Case(
        "concat_heads_proj",
        lambda s: classic.ConcatHeads(s["d_in"], s["d_k"], s["h"], out_proj=True),
        tokens("d_in"),
        {"d_in": 6, "h": 3, "d_k": 2},
        "4*h*d_k*d_in + 3*h*d_k + d_in",
        BERT_BASE,
        mapping=stack_heads,
    ),
    Case(
        "sdpa",
        lambda s: classic.ScaledDotProductAttention(),
        lambda s: {
            "Q": randn(*BATCH, N, 4),
            "K": randn(*BATCH, N_KV, 4),
            "V": randn(*BATCH, N_KV, 3),
        },
    ),
    Case(
        "mqa",
        lambda s: classic.GroupedQueryAttention(s["d_m"], s["h"], 1, s["d_k"]),
        tokens("d_m"),
        {"d_m": 6, "h": 4, "d_k": 3},
        "2*d_m*h*d_k + 2*d_m*d_k",
        {"Llama-3-8B, one kv head": {"d_m": 4096, "h": 32, "d_k": 128}},
    ),
    Case(
        "gqa",
        lambda s: classic.GroupedQueryAttention(
            s["d_m"], s["h_kv"] * s["n_rep"], s["h_kv"], s["d_k"]
        ),
        tokens("d_m"),
        {"d_m": 6, "h_kv": 2, "n_rep": 3, "d_k": 2},
        "2*d_m*h_kv*n_rep*d_k + 2*d_m*h_kv*d_k",
        LLAMA3_8B,
    ),
    Case(
        "gqa_core",
        lambda s: classic.GroupedQueryCore(s["scaling"], s["p"]),
        lambda s: {
            "Q": randn(*BATCH, 2, 3, N, 4),
            "K": randn(*BATCH, 2, N_KV, 4),
            "V": randn(*BATCH, 2, N_KV, 3),
            "M": random_mask(N_KV)[:N] + right_padding(N_KV)[:, None, :],
        },
        {"scaling": 0.3, "p": 0.2},
    ),
    Case(
        "cross",
        lambda s: classic.CrossAttention(s["d_q"], s["d_c"], s["h"], s["d_k"]),
        lambda s: {"X": randn(*BATCH, N, s["d_q"]), "C": randn(*BATCH, N_KV, s["d_c"])},
        {"d_q": 6, "d_c": 5, "h": 2, "d_k": 3},
        "2*d_q*h*d_k + 2*d_c*h*d_k + d_q",
        {"Stable Diffusion 1.x, first block": {"d_q": 320, "d_c": 768, "h": 8, "d_k": 40}},
    ),
    Case(
        "sliding_window",
        lambda s: classic.SlidingWindowAttention(s["d_in"], s["d_out"], s["h"], window=s["w"]),
        tokens("d_in"),
        {**MHA_SIZES, "w": 3},
        MHA_COUNT,
        {name: {**sizes, "w": 4096} for name, sizes in GPT2_IN_OUT.items()},
    ),
    Case(
        "alibi",
        lambda s: classic.ALiBiAttention(s["d_in"], s["d_out"], s["h"]),
        tokens("d_in"),
        {**MHA_SIZES, "h": 4, "d_k": 2},
        MHA_COUNT,
        GPT2_IN_OUT,
    ),
    Case(
        "torch_mha",
        lambda s: nn.MultiheadAttention(s["d_m"], s["h"], dropout=0.1, batch_first=True),
        lambda s: {
            "query": randn(*BATCH, N, s["d_m"]),
            "key": randn(*BATCH, N_KV, s["d_m"]),
            "value": randn(*BATCH, N_KV, s["d_m"]),
            "key_padding_mask": right_padding(N_KV),
        },
        {"d_m": 6, "h": 2, "d_k": 3},
        "4*d_m*h*d_k + 3*h*d_k + d_m",
        GPT2_SIZES,
        call=torch_mha_call,
    ),
]


# Variant 12 once more: the same specs against F.scaled_dot_product_attention with the mask or
# the ALiBi bias given explicitly (tests/models/test_classic_variants.py, test_spec_matches_sdpa).
SDPA_CASES = [
    Case(
        "sliding_window",
        lambda s: classic.SlidingWindowSDPA(s["d_in"], s["d_out"], s["h"], window=s["w"]),
        tokens("d_in"),
        {**MHA_SIZES, "w": 3},
        MHA_COUNT,
    ),
    Case(
        "alibi",
        lambda s: classic.ALiBiSDPA(s["d_in"], s["d_out"], s["h"]),
        tokens("d_in"),
        {**MHA_SIZES, "h": 4, "d_k": 2},
        MHA_COUNT,
    ),
]
