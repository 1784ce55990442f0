"""specs/models/deepseek_v3.attn against transformers' DeepseekV3Attention
(models_common.LayerTests).

A tiny config built here, random weights (every parameter, norm weights included), float64,
eval. DeepSeek-V3 computes in float32 in three places: the eager softmax
(dtype=torch.float32), the RMSNorms (DeepseekV3RMSNorm upcasts) and the rotary table. The
1e-10 tests run the sdpa path, float64 cos and sin and the norms without the upcast
(models_common.float64_rms_norm); the layer as it is, float32 inside, agrees within OWN_ATOL.
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
from models_common import spec as compiled

pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 6


def deepseek_config(attn_implementation="sdpa"):
    return DeepseekV3Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation=attn_implementation,
    )  # fmt: skip


class TestDeepSeek(OwnPrecisionTests, LayerTests):
    CASES = OWN = ("deepseek_v3",)
    # DeepseekV3Config's defaults are DeepSeek-V3's (hidden 7168, 128 heads, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)
    REAL: ClassVar = {
        "deepseek_v3": (
            "deepseek_v3", deepseek.DeepseekV3Attention, DeepseekV3Config(), {"layer_idx": 0}
        ),
    }  # fmt: skip

    def case(self, name, exact=True):
        """exact: sdpa (no float32 softmax), the norms in float64, float64 cos and sin."""
        config = deepseek_config("sdpa" if exact else "eager")
        layer = randomise(deepseek.DeepseekV3Attention(config, layer_idx=0)).double().eval()
        if exact:
            float64_rms_norm(layer.q_a_layernorm), float64_rms_norm(layer.kv_a_layernorm)
        x = hidden(N, 32)
        mask = causal_mask(N, {1: 4})[:, 0]
        embedding = deepseek.DeepseekV3RotaryEmbedding
        return rotary_case(layer, name, x, mask, embedding, exact, config.head_dim)

    def test_without_interleaved_rotary_is_refused(self):
        """rope_interleave=False turns halves, not the spec's pairs; the twin (True) loads."""
        config = deepseek_config()
        layer = deepseek.DeepseekV3Attention(config, layer_idx=0)
        assert hf.from_transformers(layer, compiled("deepseek_v3")) is not None
        config.rope_interleave = False
        with pytest.raises(ValueError, match="rope_interleave"):
            hf.from_transformers(layer, compiled("deepseek_v3"))
