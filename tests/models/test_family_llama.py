"""specs/models/ of Llama 3 and Mistral against transformers' LlamaAttention and
MistralAttention (models_common.LayerTests).

Tiny configs built here, every weight random, float64, eval, nothing downloaded. The 1e-10
tests run transformers' "sdpa" attention (the eager path takes its softmax in float32) and hand
the layer its rotary table computed in float64 (models_common.rotary; LlamaRotaryEmbedding and
MistralRotaryEmbedding compute it in float32); the layers as transformers ships them (eager,
their own rotary modules) agree within OWN_ATOL, a float32 tolerance.

Masks are causal with one padded key. Mistral's layer gets the model's sliding-window mask
(transformers' create_sliding_window_causal_mask) while the spec gets the plain causal mask and
applies its own window, over a sequence longer than the window.
"""

from typing import ClassVar

import pytest
import torch
from models_common import (
    B,
    CachedKeysAndValuesTests,
    LayerTests,
    OwnPrecisionTests,
    causal_mask,
    compare,
    hidden,
    randomise,
    rotary_case,
    shifted,
)
from models_common import spec as compiled

pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import LlamaConfig, MistralConfig  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.mistral import modeling_mistral as mistral  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

WINDOW = 3
LENGTH = {"llama3": 6, "mistral": 7}  # Mistral's longer than its window
PADDED = {1: 4}  # batch 1's key 4 is hidden from every query


def llama_config(**kw):
    return LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, eos_token_id=None,
        **{"attn_implementation": "sdpa", **kw},
    )  # fmt: skip


def mistral_config(exact: bool) -> MistralConfig:
    return MistralConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, sliding_window=WINDOW,
        attn_implementation="sdpa" if exact else "eager",
    )  # fmt: skip


def config_of(name: str, exact: bool):
    if name == "mistral":
        return mistral_config(exact)
    return llama_config(attn_implementation="sdpa" if exact else "eager")


def masks(name, config, x, n):
    """The causal mask with the padded key as the spec takes it (additive, no head axis), and
    Mistral's layer's own: its model's with the window (causal and windowed as
    create_causal_mask and create_sliding_window_causal_mask make them)."""
    if name == "llama3":
        return causal_mask(n, PADDED)[:, 0], None
    padding = torch.ones(B, n, dtype=torch.long)
    for b, t in PADDED.items():
        padding[b, t] = 0
    causal, windowed = (
        make(config, x, padding, None, position_ids=shifted(n), allow_is_causal_skip=False)
        for make in (create_causal_mask, create_sliding_window_causal_mask)
    )
    return hf.additive_mask(causal, x, n), windowed


ROTARY = {"llama3": llama.LlamaRotaryEmbedding, "mistral": mistral.MistralRotaryEmbedding}
LAYERS = {"llama3": llama.LlamaAttention, "mistral": mistral.MistralAttention}


class TestLlama(OwnPrecisionTests, CachedKeysAndValuesTests, LayerTests):
    CASES = OWN = ("llama3", "mistral")
    CACHED = ("llama3",)
    REAL: ClassVar = {  # transformers' config defaults are Mistral-7B's sizes: 4096, 32 / 8 heads
        "llama3": (  # Llama-3-8B
            "llama3", llama.LlamaAttention,
            LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8),
            {"layer_idx": 0},
        ),
        "mistral": ("mistral", mistral.MistralAttention, MistralConfig(), {"layer_idx": 0}),
    }  # fmt: skip
    QUOTED: ClassVar = {"llama3": 41_943_040}

    def case(self, name, exact=True):
        """exact: sdpa and a float64 rotary table."""
        n, config = LENGTH[name], config_of(name, exact)
        layer = randomise(LAYERS[name](config, layer_idx=0)).double().eval()
        x = hidden(n, 32)
        mask, layer_mask = masks(name, config, x, n)
        return rotary_case(layer, name, x, mask, ROTARY[name], exact, layer_mask=layer_mask)

    def test_mistral_window_is_the_spec_s_own(self):
        """The spec's window is what hides the far keys: without it (a window as long as the
        sequence) the spec, on the same causal mask, no longer equals the windowed layer."""
        case = self.case("mistral")
        with pytest.raises(AssertionError):
            compare(case, case.module(sliding_window=LENGTH["mistral"]))
        assert case.module().scalars["sliding_window"] == WINDOW

    def test_a_layer_with_other_weights_is_refused_by_name(self):
        """Llama with attention_bias=True has biases that specs/models/llama3.attn does not
        declare; the twin without them loads."""
        layer = llama.LlamaAttention(llama_config(attention_bias=True), layer_idx=0)
        with pytest.raises(ValueError, match=r"the layer has k_proj_bias, o_proj_bias, q_proj_b"):
            hf.from_transformers(layer, compiled("llama3"))
        layer = llama.LlamaAttention(llama_config(), layer_idx=0)
        assert hf.from_transformers(layer, compiled("llama3")) is not None
