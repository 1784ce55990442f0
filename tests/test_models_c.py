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
from models_common import (
    ROOT,
    _ascii,
    causal_mask,
    compare,
    float64_rms_norm,
    randomise,
    rotary,
)

import indexattn
from indexattn.views.cost import evaluate

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import BertConfig, DeepseekV3Config, GptOssConfig, T5Config  # noqa: E402
from transformers.models.bert.modeling_bert import BertAttention  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

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


# --- DeepSeek-V3 ---------------------------------------------------------------------------

POSITIONS = torch.tensor([list(range(N)), list(range(3, 3 + N))])  # batch 1 starts at 3


def deepseek_config(attn_implementation="sdpa"):
    return DeepseekV3Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation=attn_implementation,
    )  # fmt: skip


def run_with_rotary(layer, module, x, mask, positions, layer_mask=None, halves=2):
    """The layer given cos and sin in float64, as position_embeddings (models_common.rotary; one
    half of them, `halves=1`, for GPT-OSS, whose rotary table is not repeated)."""
    ours = module(x, positions, mask[:, 0])
    d_k, theta = layer.config.head_dim, layer.config.rope_parameters["rope_theta"]
    cos_sin = [t[..., : d_k * halves // 2] for t in rotary(positions, d_k, theta)]
    layer_mask = mask if layer_mask is None else layer_mask
    return ours, layer(x, position_embeddings=cos_sin, attention_mask=layer_mask)


def deepseek_case():
    """sdpa (no float32 softmax), the norms in float64, float64 cos and sin."""
    layer = randomise(deepseek.DeepseekV3Attention(deepseek_config(), layer_idx=0))
    float64_rms_norm(layer.q_a_layernorm), float64_rms_norm(layer.kv_a_layernorm)
    x = torch.randn(B, N, 32, dtype=torch.float64, requires_grad=True)
    extra = (causal_mask(N, {1: 4}), POSITIONS)
    return layer.double().eval(), x, extra, run_with_rotary, spec("deepseek_v3")


def test_deepseek_v3_without_interleaved_rotary_is_refused():
    config = deepseek_config()
    config.rope_interleave = False
    layer = deepseek.DeepseekV3Attention(config, layer_idx=0)
    with pytest.raises(ValueError, match="rope_interleave"):
        hf.from_transformers(layer, spec("deepseek_v3"))


# --- GPT-OSS -------------------------------------------------------------------------------


def gpt_oss_config():
    """Layer 0 slides (a window of 3 over N = 6 positions), layer 1 attends to every key."""
    return GptOssConfig(
        vocab_size=40, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=3, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        attn_implementation="eager",
    )  # fmt: skip


def run_gpt_oss(layer, module, x, mask, positions):
    """The spec gets the causal and padding mask and applies its window itself; the layer gets
    the window in its mask, as GptOssModel builds it for a sliding layer."""
    n = mask.shape[-1]
    outside = torch.ones(n, n, dtype=torch.bool).tril(-(layer.sliding_window or n))
    windowed = mask.masked_fill(outside, -torch.inf)
    return run_with_rotary(layer, module, x, mask, positions, layer_mask=windowed, halves=1)


def gpt_oss_case(layer_idx):
    layer = randomise(gpt_oss.GptOssAttention(gpt_oss_config(), layer_idx=layer_idx))
    layer = layer.double().eval()
    x = torch.randn(B, N, 32, dtype=torch.float64, requires_grad=True)
    extra = (causal_mask(N, {1: 4}), POSITIONS)
    return layer, x, extra, run_gpt_oss, spec("gpt_oss")


CASES = {
    "bert": bert_case,
    "t5": t5_case,
    "deepseek_v3": deepseek_case,
    "gpt_oss_sliding": lambda: gpt_oss_case(0),
    "gpt_oss_full": lambda: gpt_oss_case(1),
}


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


def test_gpt_oss_sliding_layer_without_its_window_is_caught():
    """The window's twin: the sliding layer's spec module without the window (inf) differs."""
    layer, x, extra, run, compiled = gpt_oss_case(0)
    assert layer.sliding_window == 3
    module = hf.from_transformers(layer, compiled, sliding_window=math.inf)
    with pytest.raises(AssertionError):
        compare(layer, module, x, extra, run)


AS_IT_IS = {  # a layer computing in float32 inside, and its model's rotary embedding
    "deepseek_v3": lambda: (
        deepseek.DeepseekV3Attention(deepseek_config("eager"), layer_idx=0),
        deepseek.DeepseekV3RotaryEmbedding(deepseek_config()),
    ),
    "gpt_oss": lambda: (
        gpt_oss.GptOssAttention(gpt_oss_config(), layer_idx=1),
        gpt_oss.GptOssRotaryEmbedding(gpt_oss_config()),
    ),
}


@pytest.mark.parametrize("name", AS_IT_IS)
def test_layer_as_it_is_agrees_at_float32_precision(name):
    """The layer untouched, with its own rotary table (float32) and, for DeepSeek-V3, eager's
    float32 softmax and its RMSNorms' float32 upcast. Outputs and attention weights agree to
    1e-6 (measured: 3e-8 to 2.3e-7), and not to 1e-10: the float32 inside is real."""
    layer, rotary_embedding = AS_IT_IS[name]()
    layer = randomise(layer).double().eval()
    x = torch.randn(B, N, 32, dtype=torch.float64)
    mask = causal_mask(N, {1: 4})
    ours = hf.from_transformers(layer, spec(name))(x, POSITIONS, mask[:, 0])
    cos_sin = rotary_embedding(x, POSITIONS)
    theirs = layer(x, position_embeddings=cos_sin, attention_mask=mask)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.reshape(b.shape), b, atol=1e-6, rtol=0)
        assert (a.reshape(b.shape) - b).abs().max() > 1e-10


# --- parameter counts at the real models' sizes ------------------------------------------------

REAL = {  # the attention layer at its model's sizes, on the meta device
    # BertConfig's defaults are BERT-base's (hidden 768, 12 heads)
    "bert": lambda: BertAttention(BertConfig()),
    # T5-base (d_model 768, d_kv 64, 12 heads, 32 buckets); T5Config's defaults are T5-small's
    "t5": lambda: T5Attention(
        T5Config(d_model=768, d_kv=64, num_heads=12), has_relative_attention_bias=True
    ),
    # DeepseekV3Config's defaults are DeepSeek-V3's (hidden 7168, 128 heads, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)
    "deepseek_v3": lambda: deepseek.DeepseekV3Attention(DeepseekV3Config(), layer_idx=0),
    # GptOssConfig's defaults are GPT-OSS-120B's (hidden 2880, 64 heads, 8 key/value heads, 64)
    "gpt_oss": lambda: gpt_oss.GptOssAttention(GptOssConfig(), layer_idx=0),
}


def count_at(compiled, layer, plus=0):
    """The spec's param_count() at the sizes from_transformers reads off the layer (+ plus)."""
    known = hf.sizes_and_scalars(layer, {str(s) for s in compiled.sizes})
    sizes = {s: known[str(s)] + plus for s in compiled.sizes if str(s) in known}
    return evaluate(compiled.param_count(), sizes)


@pytest.mark.parametrize("name", REAL)
def test_param_count_at_the_real_size_is_the_layers(name):
    """And its twin: every size one larger gives another count."""
    with torch.device("meta"):
        layer = REAL[name]()
    compiled = spec(name)
    numel = sum(p.numel() for p in layer.parameters())
    assert count_at(compiled, layer) == numel
    assert count_at(compiled, layer, plus=1) != numel
