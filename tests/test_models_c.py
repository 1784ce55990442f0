"""specs/models/ of BERT, T5, DeepSeek-V3 and GPT-OSS against transformers' own layers.

Tiny configs built here, random weights (every parameter, biases and norm weights included),
float64, eval. BERT's and T5's eager attention computes in float64 throughout, so the layer as
it is agrees to 1e-10. GPT-OSS's eager softmax keeps its input's dtype too; only its rotary
table is float32 (GptOssRotaryEmbedding), so the 1e-10 test hands the layer cos and sin
computed in float64 as position_embeddings. DeepSeek-V3 computes in float32 in three places:
the eager softmax (dtype=torch.float32), the RMSNorms (DeepseekV3RMSNorm upcasts) and the
rotary table; its 1e-10 test runs the sdpa path, float64 position_embeddings and the norms
without the upcast (monkeypatched), and a second test compares the layer exactly as it is,
float32 inside, at 1e-5.
"""

import math

import pytest
import torch

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from test_models import TOL, _ascii, compare, randomise, rotary  # noqa: E402
from transformers import BertConfig, T5Config  # noqa: E402
from transformers.models.bert.modeling_bert import BertAttention  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).parent.parent
B, N = 2, 6


def spec(name):
    return indexattn.compile_spec(ROOT / "specs" / "models" / f"{name}.attn")


def padding_mask(n: int, padded: dict) -> torch.Tensor:
    """An extended additive padding mask [B, 1, 1, N]: key t of batch b hidden for each (b, t)
    in `padded`, by the dtype's minimum, as BERT's and T5's models build it."""
    mask = torch.zeros(B, 1, 1, n, dtype=torch.float64)
    for b, t in padded.items():
        mask[b, ..., t] = torch.finfo(torch.float64).min
    return mask


# --- BERT --------------------------------------------------------------------------------


def bert_config(**kw):
    return BertConfig(
        hidden_size=16, num_attention_heads=4, intermediate_size=24, layer_norm_eps=1e-7,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, attn_implementation="eager",
        **kw,
    )  # fmt: skip


def run_bert(layer, module, x, mask):
    return module(x, mask[:, 0, 0]), layer(x, attention_mask=mask)


def bert_case():
    layer = randomise(BertAttention(bert_config())).double().eval()
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    return layer, x, (padding_mask(N, {1: 4}),), run_bert, spec("bert")


# --- T5 ----------------------------------------------------------------------------------

T5_N = 140  # beyond relative_attention_max_distance: every bucket, and the last one's cap


def t5_config(**kw):
    return T5Config(
        d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=32,
        relative_attention_max_distance=128, dropout_rate=0.0, attn_implementation="eager", **kw,
    )  # fmt: skip


def run_t5(layer, module, x, mask):
    out, _, weights = layer(x, mask=mask)
    return module(x, mask[:, 0, 0]), (out, weights)


def t5_case():
    config = t5_config()
    layer = randomise(T5Attention(config, has_relative_attention_bias=True, layer_idx=0))
    x = torch.randn(B, T5_N, 16, dtype=torch.float64, requires_grad=True)
    return layer.double().eval(), x, (padding_mask(T5_N, {1: 100}),), run_t5, spec("t5")


CASES = {"bert": bert_case, "t5": t5_case}


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_transformers_layer(name):
    layer, x, extra, run, compiled = CASES[name]()
    module = hf.from_transformers(layer, compiled)
    assert sorted(dict(module.named_parameters())) == sorted(
        _ascii(k) for k, _ in layer.named_parameters()
    )
    compare(layer, module, x, extra, run)


@pytest.mark.parametrize("name", CASES)
def test_one_perturbed_weight_is_caught(name):
    """The twin: the same comparison fails when one weight of the spec's copy is nudged."""
    layer, x, extra, run, compiled = CASES[name]()
    module = hf.from_transformers(layer, compiled)
    with torch.no_grad():
        next(iter(module.parameters())).view(-1)[0] += 1e-6
    with pytest.raises(AssertionError):
        compare(layer, module, x, extra, run)


@pytest.mark.parametrize("name", CASES)
def test_one_flipped_mask_bit_is_caught(name):
    """The twin of the mask: hiding one more key from the spec alone is seen."""
    layer, x, (mask, *rest), run, compiled = CASES[name]()
    module = hf.from_transformers(layer, compiled)
    flipped = mask.clone()
    flipped[0, ..., 3] = torch.finfo(torch.float64).min

    def run_differently(layer, module, x, mask, *rest):
        ours, _ = run(layer, module, x, flipped, *rest)
        _, theirs = run(layer, module, x, mask, *rest)
        return ours, theirs

    with pytest.raises(AssertionError):
        compare(layer, module, x, (mask, *rest), run_differently)


def test_t5_bucket_rule_with_another_max_distance_is_caught():
    """The bucket rule's twin: one less relative_attention_max_distance moves some buckets."""
    layer, x, extra, run, compiled = t5_case()
    module = hf.from_transformers(layer, compiled, relative_attention_max_distance=127)
    with pytest.raises(AssertionError):
        compare(layer, module, x, extra, run)
