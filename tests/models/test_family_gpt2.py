"""specs/models/gpt2.attn against transformers' GPT2Attention (models_common.LayerTests).

A tiny config built here, every weight and bias random, float64, eval, nothing downloaded.
GPT-2's eager attention computes in float64 throughout, so the layer as it is agrees to 1e-10.
"""

from typing import ClassVar

import pytest
from models_common import (
    CachedKeysAndValuesTests,
    Case,
    LayerTests,
    causal_mask,
    hidden,
    randomise,
)
from models_common import spec as compiled

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import GPT2Config
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 6


class TestGPT2(CachedKeysAndValuesTests, LayerTests):
    CASES = CACHED = ("gpt2",)
    REAL: ClassVar = {
        "gpt2": ("gpt2", GPT2Attention, GPT2Config(n_embd=768, n_head=12), {"layer_idx": 0})
    }
    QUOTED: ClassVar = {"gpt2": 2_362_368}  # GPT-2 small

    def case(self, name, exact=True):
        config = GPT2Config(n_embd=16, n_head=4, attn_implementation="eager")
        layer = randomise(GPT2Attention(config, layer_idx=0)).double().eval()
        x = hidden(N, 16)
        mask = causal_mask(N, {1: 2})
        return Case(
            layer, compiled(name), (x,), mask[:, 0],
            ours=lambda module, m: module(x, m),
            theirs=lambda **kw: layer(x, attention_mask=mask, **kw),
        )  # fmt: skip
