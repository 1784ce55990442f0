"""specs/models/bert.attn against transformers' BertAttention (models_common.LayerTests).

A tiny config built here, random weights (biases and the norm's weights included), float64,
eval. BERT's eager attention computes in float64 throughout, so the layer as it is agrees to
1e-10. The mask is BERT's model's: an extended additive padding mask [B, 1, 1, N], the spec
given it without its two middle axes.
"""

from typing import ClassVar

import pytest
from models_common import Case, LayerTests, hidden, padding_mask, randomise
from models_common import spec as compiled

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertAttention

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 6


class TestBert(LayerTests):
    CASES = ("bert",)
    # BertConfig's defaults are BERT-base's (hidden 768, 12 heads)
    REAL: ClassVar = {"bert": ("bert", BertAttention, BertConfig(), {})}

    def case(self, name, exact=True):
        config = BertConfig(
            hidden_size=16, num_attention_heads=4, intermediate_size=24, layer_norm_eps=1e-7,
            attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
            attn_implementation="eager",
        )  # fmt: skip
        layer = randomise(BertAttention(config)).double().eval()
        x = hidden(N, 16)
        mask = padding_mask(N, {1: 4})
        return Case(
            layer, compiled(name), (x,), mask[:, 0, 0],
            ours=lambda module, m: module(x, m),
            theirs=lambda: layer(x, attention_mask=mask),
        )  # fmt: skip
