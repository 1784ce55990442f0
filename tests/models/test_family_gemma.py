"""specs/models/gemma2.attn and gemma2_sliding.attn against transformers' Gemma2Attention
(models_common.LayerTests).

A tiny config built here (query_pre_attn_scalar is not head_dim; a soft cap that bites the
scores), random weights, float64, eval, "eager" attention (sdpa has no cap). The eager softmax
and the rotary table (Gemma2RotaryEmbedding) are float32 in transformers: the 1e-10 tests take
them out (the softmax as it is, the rotary table in float64), the layer as it is agrees within
OWN_ATOL. The sliding layer (layer 0) gets the windowed mask transformers hands it, the spec
the plain causal mask and its own window, over a sequence longer than the window.
"""

from typing import ClassVar

import pytest
import torch
from models_common import (
    ROOT,
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    compare,
    hidden,
    randomise,
    rotary_case,
)

pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import Gemma2Config  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as gemma2  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 8  # longer than the sliding window below
WINDOW = 3
REAL_CONFIG = Gemma2Config(  # Gemma-2-9B
    hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256
)


def gemma2_config():
    return Gemma2Config(
        vocab_size=40, num_hidden_layers=2, attn_implementation="eager", hidden_size=32,
        intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        query_pre_attn_scalar=24, attn_logit_softcapping=2.0, sliding_window=WINDOW,
    )  # fmt: skip


def window(mask):
    """The mask transformers hands a sliding layer: key τ' hidden unless τ - WINDOW < τ'."""
    far = torch.ones(N, N, dtype=torch.bool).tril(-WINDOW)
    return mask.masked_fill(far, torch.finfo(mask.dtype).min)


class TestGemma2(OwnPrecisionTests, LayerTests):
    CASES = OWN = ("gemma2", "gemma2_sliding")
    REAL: ClassVar = {
        name: (name, gemma2.Gemma2Attention, REAL_CONFIG, {"layer_idx": 0}) for name in CASES
    }

    def case(self, name, exact=True):
        """gemma2: layer 1, attending to every key; gemma2_sliding: layer 0, windowed."""
        sliding = name == "gemma2_sliding"
        layer = gemma2.Gemma2Attention(gemma2_config(), layer_idx=0 if sliding else 1)
        layer = randomise(layer).double().eval()
        assert (layer.sliding_window is not None) == sliding, "layer_types"
        x = hidden(N, 32)
        mask = causal_mask(N, {1: 4})[:, 0]
        theirs = (window(mask) if sliding else mask)[:, None]
        embedding = gemma2.Gemma2RotaryEmbedding
        return rotary_case(layer, name, x, mask, embedding, exact, layer_mask=theirs)

    def test_a_window_one_wider_is_caught(self, float64_softmax):
        """The sliding layer's twin: the spec computes the window itself (it is given the mask
        without one), so a window of WINDOW + 1 keys differs from transformers'."""
        case = self.case("gemma2_sliding")
        with pytest.raises(AssertionError):
            compare(case, case.module(sliding_window=WINDOW + 1))

    def test_a_scalar_the_layer_leaves_unset_is_refused(self):
        """Gemma 2 without soft-capping: the spec caps, so loading it is refused rather than
        capping at the spec's default; the twin with the cap set loads, and reads the layer's
        value."""

        def layer(cap):
            config = Gemma2Config(
                hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                attn_logit_softcapping=cap,
            )  # fmt: skip
            return gemma2.Gemma2Attention(config, layer_idx=0)

        spec = ROOT / "specs/models/gemma2.attn"
        with pytest.raises(ValueError, match="attn_logit_softcapping is None"):
            hf.from_transformers(layer(None), spec)
        module = hf.from_transformers(layer(30.0), spec)
        assert module.scalars["attn_logit_softcapping"] == 30.0
