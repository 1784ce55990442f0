"""specs/models/ of Qwen2 and Qwen3 against transformers' Qwen2Attention and Qwen3Attention
(models_common.LayerTests).

Tiny configs built here with random weights (nothing is downloaded), float64, eval, "eager"
attention. transformers computes parts of these layers in float32 whatever their dtype: the
eager softmax (softmax(..., dtype=torch.float32)), Qwen3's q_norm and k_norm (Qwen3RMSNorm
casts to float32), and the rotary tables (the models' RotaryEmbedding modules). The 1e-10
tests take those out (the softmax as it is, the norms in float64, the rotary table computed in
float64); the layers as they are agree within OWN_ATOL (the outputs differ by 3e-7 to 8e-7).
"""

from typing import ClassVar

import pytest
from models_common import (
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    float64_rms_norm,
    hidden,
    randomise,
    rotary_case,
)

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import Qwen2Config, Qwen3Config
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.qwen3 import modeling_qwen3 as qwen3

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 8
SMALL = {"vocab_size": 40, "num_hidden_layers": 2, "attn_implementation": "eager"}


def qwen2_config():
    return Qwen2Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **SMALL,
    )  # fmt: skip


def qwen3_config():  # head_dim 16 is not hidden_size / heads = 8, as in the real Qwen3
    return Qwen3Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-3, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        **SMALL,
    )  # fmt: skip


LAYERS = {  # the config, the layer, the rotary table as the model makes it (float32)
    "qwen2": (qwen2_config, qwen2.Qwen2Attention, qwen2.Qwen2RotaryEmbedding),
    "qwen3": (qwen3_config, qwen3.Qwen3Attention, qwen3.Qwen3RotaryEmbedding),
}


class TestQwen(OwnPrecisionTests, LayerTests):
    CASES = OWN = ("qwen2", "qwen3")
    REAL: ClassVar = {  # sizes of the published configs (the checkpoints' config.json)
        "qwen2": (  # Qwen2-7B
            "qwen2", qwen2.Qwen2Attention,
            Qwen2Config(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4),
            {"layer_idx": 0},
        ),
        "qwen3": (  # Qwen3-8B
            "qwen3", qwen3.Qwen3Attention,
            Qwen3Config(
                hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128
            ),
            {"layer_idx": 0},
        ),
    }  # fmt: skip

    def case(self, name, exact=True):
        """exact: Qwen3's norms in float64 (the softmax: the float64_softmax fixture)."""
        config, layer_class, embedding = LAYERS[name]
        layer = randomise(layer_class(config(), layer_idx=0)).double().eval()
        if exact and name == "qwen3":
            float64_rms_norm(layer.q_norm), float64_rms_norm(layer.k_norm)
        x = hidden(N, 32)
        mask = causal_mask(N, {1: 4})[:, 0]
        return rotary_case(layer, name, x, mask, embedding, exact)
