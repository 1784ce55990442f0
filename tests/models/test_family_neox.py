"""specs/models/ of GPT-NeoX and GPT-J against transformers' GPTNeoXAttention and
GPTJAttention (models_common.LayerTests).

Tiny configs built here, every weight and bias random, float64, eval, nothing downloaded.
The 1e-10 tests take the float32 steps out: GPT-NeoX runs "sdpa" (its eager path takes
softmax(..., dtype=torch.float32)) with its rotary table computed in float64 and handed in as
position_embeddings; GPT-J gets its sin and cos in float64, handed in as position_embeddings
and through "sdpa" from transformers 5.24 on, before that its embed_positions buffer rebuilt in
float64 and its _attn without its cast of the queries and keys to float32
(`gptj_attn_in_float64`). As transformers
ships them (GPTNeoXRotaryEmbedding's float32 table and the float32 softmax; GPT-J's float32
embed_positions and scores) they agree within OWN_ATOL, a float32 tolerance.
"""

import inspect
from typing import ClassVar

import pytest
import torch
from models_common import (
    Case,
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    hidden,
    randomise,
    rotary_case,
    shifted,
)
from models_common import spec as compiled

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import GPTJConfig, GPTNeoXConfig
from transformers.models.gpt_neox import modeling_gpt_neox as gpt_neox
from transformers.models.gptj import modeling_gptj as gptj

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 7
POSITIONS = shifted(N)


def neox_case(exact: bool) -> Case:
    """A fused head-major query_key_value, a quarter of each head rotated, biases."""
    config = GPTNeoXConfig(
        vocab_size=40, hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
        intermediate_size=48, max_position_embeddings=32, rotary_pct=0.25,
        rotary_emb_base=20000, attn_implementation="sdpa" if exact else "eager",
    )  # fmt: skip
    layer = randomise(gpt_neox.GPTNeoXAttention(config, layer_idx=0)).double().eval()
    mask = causal_mask(N, {1: 4})[:, 0]
    rotary_embedding = gpt_neox.GPTNeoXRotaryEmbedding
    return rotary_case(
        layer, "gpt_neox", hidden(N, 64), mask, rotary_embedding, exact, layer.rotary_ndims
    )


def gptj_case(exact: bool) -> Case:
    """Separate projections, interleaved rotary over rotary_dim, no biases. transformers 5.24
    hands the layer its (sin, cos) as position_embeddings, as Llama's; before, the layer
    looked them up in its own embed_positions."""
    handed = "position_embeddings" in inspect.signature(gptj.GPTJAttention.forward).parameters
    config = GPTJConfig(
        vocab_size=40, n_embd=32, n_head=2, n_layer=1, n_positions=32, rotary_dim=8,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=None,
        attn_implementation="sdpa" if exact and handed else "eager",
    )  # fmt: skip
    layer = randomise(gptj.GPTJAttention(config, layer_idx=0)).double().eval()
    x, mask = hidden(N, 32), causal_mask(N, {1: 4})
    if handed:
        table = gptj.GPTJRotaryEmbedding(config).embed_positions  # float32, as shipped
        table = sinusoids_in_float64(32, config.rotary_dim) if exact else table
        sin, cos = table[POSITIONS].to(x.dtype).chunk(2, dim=-1)
        keywords = {"position_embeddings": (sin, cos)}
    else:
        if exact:
            layer.embed_positions = sinusoids_in_float64(32, config.rotary_dim)
            layer._attn = gptj_attn_in_float64(layer)
        keywords = {"position_ids": POSITIONS}
    return Case(
        layer, compiled("gptj"), (x,), mask[:, 0],
        ours=lambda module, m: module(x, POSITIONS, m),
        theirs=lambda: layer(x, attention_mask=mask, **keywords),
    )  # fmt: skip


def sinusoids_in_float64(num_pos: int, dim: int) -> torch.Tensor:
    """GPT-J's create_sinusoidal_positions (sin, then cos, of each position times
    10000^(-2j/dim)) computed in float64 where transformers computes it in float32."""
    inv_freq = 10000.0 ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(num_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=1)


def gptj_attn_in_float64(layer):
    """GPTJAttention._attn without its `query.to(torch.float32)`, `key.to(torch.float32)`."""

    def _attn(query, key, value, attention_mask=None):
        weights = query @ key.transpose(-1, -2) / layer.scale_attn + attention_mask
        weights = torch.softmax(weights, dim=-1)
        return weights @ value, weights

    return _attn


class TestNeoX(OwnPrecisionTests, LayerTests):
    CASES = OWN = ("gpt_neox", "gptj")
    REAL: ClassVar = {  # transformers' config defaults are these models' sizes
        # GPT-NeoX-20B: 6144, 64 heads
        "gpt_neox": ("gpt_neox", gpt_neox.GPTNeoXAttention, GPTNeoXConfig(), {"layer_idx": 0}),
        # GPT-J-6B: 4096, 16 heads, rotary_dim 64
        "gptj": ("gptj", gptj.GPTJAttention, GPTJConfig(), {"layer_idx": 0}),
    }

    def case(self, name, exact=True):
        return {"gpt_neox": neox_case, "gptj": gptj_case}[name](exact)
