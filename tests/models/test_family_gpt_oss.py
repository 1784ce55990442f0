"""specs/models/gpt_oss.attn against transformers' GptOssAttention (models_common.LayerTests).

A tiny config built here (layer 0 slides, a window of 3 over N = 6 positions; layer 1 attends
to every key), random weights (the sinks included), float64, eval. GPT-OSS's eager softmax keeps
its input's dtype; only its rotary table is float32 (GptOssRotaryEmbedding), so the 1e-10 tests
hand the layer cos and sin computed in float64; the layer with its own table agrees within
OWN_ATOL. The spec gets the causal and padding mask and applies its window itself; the layer
gets the window in its mask, as GptOssModel builds it for a sliding layer.
"""

import math
from typing import ClassVar

import pytest
import torch
from models_common import (
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    compare,
    hidden,
    randomise,
    rotary_case,
)

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import GptOssConfig
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 6
LAYER = {"gpt_oss_sliding": 0, "gpt_oss_full": 1}


def gpt_oss_config():
    return GptOssConfig(
        vocab_size=40, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=3, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        attn_implementation="eager",
    )  # fmt: skip


class TestGptOss(OwnPrecisionTests, LayerTests):
    CASES = tuple(LAYER)
    OWN = ("gpt_oss_full",)
    # GptOssConfig's defaults are GPT-OSS-120B's (hidden 2880, 64 heads, 8 key/value heads, 64)
    REAL: ClassVar = {
        "gpt_oss": ("gpt_oss", gpt_oss.GptOssAttention, GptOssConfig(), {"layer_idx": 0}),
    }

    def case(self, name, exact=True):
        layer = gpt_oss.GptOssAttention(gpt_oss_config(), layer_idx=LAYER[name])
        layer = randomise(layer).double().eval()
        x = hidden(N, 32)
        mask = causal_mask(N, {1: 4})
        outside = torch.ones(N, N, dtype=torch.bool).tril(-(layer.sliding_window or N))
        windowed = mask.masked_fill(outside, -torch.inf)
        embedding = gpt_oss.GptOssRotaryEmbedding
        return rotary_case(layer, "gpt_oss", x, mask[:, 0], embedding, exact, layer_mask=windowed)

    def test_sliding_layer_without_its_window_is_caught(self):
        """The window's twin: the sliding layer's spec module without the window (inf)
        differs."""
        case = self.case("gpt_oss_sliding")
        assert case.layer.sliding_window == 3
        with pytest.raises(AssertionError):
            compare(case, case.module(sliding_window=math.inf))
