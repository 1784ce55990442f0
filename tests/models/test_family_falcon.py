"""specs/models/falcon.attn against transformers' FalconAttention (models_common.LayerTests).

A tiny Falcon-7B-like config built here (multi-query, a fused query_key_value, rotary, no
biases), every weight random, float64, eval, nothing downloaded. Falcon's eager path keeps
float64; only its rotary table is float32 (FalconRotaryEmbedding): the 1e-10 tests hand the
layer cos and sin computed in float64, the layer with its own table agrees within OWN_ATOL.
"""

from typing import ClassVar

import pytest
from models_common import (
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    hidden,
    randomise,
    rotary_case,
)

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import FalconConfig
from transformers.models.falcon import modeling_falcon as falcon

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 7


class TestFalcon(OwnPrecisionTests, LayerTests):
    CASES = OWN = ("falcon",)
    # transformers' config defaults are Falcon-7B's sizes: 4544, 71 heads, multi-query
    REAL: ClassVar = {
        "falcon": ("falcon", falcon.FalconAttention, FalconConfig(), {"layer_idx": 0})
    }

    def case(self, name, exact=True):
        config = FalconConfig(
            vocab_size=40, hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
            multi_query=True, new_decoder_architecture=False, alibi=False, bias=False,
            max_position_embeddings=32,
            rope_parameters={"rope_type": "default", "rope_theta": 3000.0},
            attn_implementation="eager",
        )  # fmt: skip
        layer = randomise(falcon.FalconAttention(config, layer_idx=0)).double().eval()
        x = hidden(N, 32)
        mask = causal_mask(N, {1: 4})[:, 0]
        rotary_embedding = falcon.FalconRotaryEmbedding
        return rotary_case(layer, name, x, mask, rotary_embedding, exact, alibi=None)
