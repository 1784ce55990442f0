"""specs/models/t5.attn against transformers' T5Attention (models_common.LayerTests).

A tiny config built here, random weights (the relative attention bias included), float64,
eval, over N = 140 positions: beyond relative_attention_max_distance, so that every bucket and
the last one's cap are used. T5's eager attention computes in float64 throughout, so the layer
as it is agrees to 1e-10. The mask is T5's model's: an extended additive padding mask
[B, 1, 1, N], the spec given it without its two middle axes.
"""

from typing import ClassVar

import pytest
from models_common import Case, LayerTests, compare, hidden, padding_mask, randomise
from models_common import spec as compiled

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 140  # beyond relative_attention_max_distance: every bucket, and the last one's cap
WITH_BIAS = {"has_relative_attention_bias": True}


class TestT5(LayerTests):
    CASES = ("t5",)
    REAL: ClassVar = {  # T5-base (T5Config's defaults are T5-small's)
        "t5": ("t5", T5Attention, T5Config(d_model=768, d_kv=64, num_heads=12), WITH_BIAS),
    }

    def case(self, name, exact=True):
        config = T5Config(
            d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=32,
            relative_attention_max_distance=128, dropout_rate=0.0, attn_implementation="eager",
        )  # fmt: skip
        layer = randomise(T5Attention(config, layer_idx=0, **WITH_BIAS)).double().eval()
        x = hidden(N, 16)
        mask = padding_mask(N, {1: 100})

        def theirs():
            out, _, weights = layer(x, mask=mask)
            return out, weights

        return Case(
            layer, compiled(name), (x,), mask[:, 0, 0], lambda module, m: module(x, m), theirs
        )

    def test_bucket_rule_with_another_max_distance_is_caught(self, float64_softmax):
        """The bucket rule's twin: one less relative_attention_max_distance moves some
        buckets."""
        case = self.case("t5")
        with pytest.raises(AssertionError):
            compare(case, case.module(relative_attention_max_distance=127))
