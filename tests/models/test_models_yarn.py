"""YaRN rotary scaling in the model specs against transformers' own layers: Llama (an explicit
attention_factor; DeepSeek's mscale pair on a Llama layer), Qwen2 (biases), GPT-OSS
(truncate=False, its shipped form) and DeepSeek-V3 (mscale, mscale_all_dim and its softmax
scale).

Tiny configs with random weights, float64, eval. transformers computes the YaRN table in float32
(_compute_yarn_parameters writes torch.float); the 1e-10 comparisons run that same function with
float64 in its place (`float64_yarn`) and hand the layer cos and sin computed from it in float64,
as the models' RotaryEmbedding modules compute them. Llama, Qwen2 and DeepSeek-V3 run "sdpa"
(eager takes its softmax in float32), DeepSeek-V3 with its RMSNorms in float64, GPT-OSS "eager"
(its softmax keeps float64). One test per family also takes the model's own rotary embedding,
float32 inside, at 1e-5.
"""

import pytest
import torch
from models_common import (
    ROOT,
    TOL,
    Case,
    _ascii,
    causal_mask,
    compare,
    float64_rms_norm,
    hidden,
    randomise,
)

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import modeling_rope_utils  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2 as qwen2  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

B, N = 2, 10
POSITIONS = torch.tensor([list(range(N)), list(range(20, 20 + N))])  # batch 1 starts at 20
# d_k 8, rope_theta 100, 32 positions: the correction range is 0 to 1.41 pairs (2 rounded
# outwards): truncate matters, one pair kept, one blended, two interpolated
YARN = {
    "rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
    "original_max_position_embeddings": 32,
}  # fmt: skip
SMALL = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "attn_implementation": "sdpa",
}  # fmt: skip


class _Float64Torch:
    """torch, with float64 wherever a function asks for float32."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def float64_yarn(config) -> tuple[torch.Tensor, float]:
    """transformers' _compute_yarn_parameters for `config`, computed in float64."""
    real = modeling_rope_utils.torch
    modeling_rope_utils.torch = _Float64Torch()
    try:
        return modeling_rope_utils._compute_yarn_parameters(config)
    finally:
        modeling_rope_utils.torch = real


def yarn_rotary(config, positions: torch.Tensor, halves: int = 2):
    """cos and sin as the models' RotaryEmbedding modules make them from the YaRN table, in
    float64 (`halves=1`: GPT-OSS's table, not repeated)."""
    inv_freq, attention_factor = float64_yarn(config)
    angles = (positions[..., None].double() * inv_freq).repeat(1, 1, halves)
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def yarn_case(layer, spec, mask, *, halves=2, layer_mask=None) -> Case:
    """The layer given cos and sin from its YaRN table in float64, and `layer_mask` (by default
    `mask` with its head axis); the spec given `mask`."""
    x = hidden(N, 32)  # the same on every run, whatever ran before
    cos_sin = yarn_rotary(layer.config, POSITIONS, halves)
    layer_mask = mask[:, None] if layer_mask is None else layer_mask
    return Case(
        layer, spec, (x,), mask,
        ours=lambda module, m: module(x, POSITIONS, m),
        theirs=lambda: layer(x, position_embeddings=cos_sin, attention_mask=layer_mask),
    )  # fmt: skip


def windowed(layer, mask: torch.Tensor) -> torch.Tensor:
    """The mask GptOssModel hands a sliding layer: its window in it."""
    outside = torch.ones(N, N, dtype=torch.bool).tril(-(layer.sliding_window or N))
    return mask.masked_fill(outside, -torch.inf)


def gpt_oss_case(layer, spec, mask) -> Case:
    """The window of a sliding layer in the layer's mask, the spec's own in the spec."""
    return yarn_case(layer, spec, mask, halves=1, layer_mask=windowed(layer, mask[:, None]))


def deepseek_layer(config, layer_idx):
    """DeepseekV3Attention with its RMSNorms in float64."""
    layer = deepseek.DeepseekV3Attention(config, layer_idx)
    float64_rms_norm(layer.q_a_layernorm), float64_rms_norm(layer.kv_a_layernorm)
    return layer


DEEPSEEK = {
    **SMALL, "num_key_value_heads": 4, "q_lora_rank": 12, "kv_lora_rank": 10,
    "qk_nope_head_dim": 6, "qk_rope_head_dim": 8, "v_head_dim": 5,
}  # fmt: skip
GPT_OSS = {
    **SMALL, "intermediate_size": 16, "head_dim": 8, "num_local_experts": 2,
    "num_experts_per_tok": 1, "sliding_window": 3, "attn_implementation": "eager",
}  # fmt: skip

CASES = {  # config, layer, spec, how to call both, the twin (a scalar that makes the spec differ)
    "llama_attention_factor": (
        transformers.LlamaConfig(**SMALL, rope_parameters={**YARN, "attention_factor": 1.7}),
        llama.LlamaAttention, "llama3_yarn", yarn_case, {"attention_factor": 0.0},
    ),
    "llama_mscale": (
        transformers.LlamaConfig(
            **SMALL, rope_parameters={**YARN, "mscale": 1.3, "mscale_all_dim": 0.6}
        ),
        llama.LlamaAttention, "llama3_yarn", yarn_case, {"mscale": 0.0},
    ),
    "qwen2": (
        transformers.Qwen2Config(**SMALL, rope_parameters={**YARN, "beta_fast": 16.0}),
        qwen2.Qwen2Attention, "qwen2_yarn", yarn_case, {"factor": 1.0},
    ),
    "gpt_oss_sliding": (  # GptOssConfig's own rope_parameters but for rope_theta and the context
        transformers.GptOssConfig(**GPT_OSS, rope_parameters={**YARN, "truncate": False}),
        gpt_oss.GptOssAttention, "gpt_oss_yarn", gpt_oss_case, {"truncate": 1.0},
    ),
    "deepseek_v3": (  # DeepSeek-V3's mscale = mscale_all_dim = 1: attention factor 1
        transformers.DeepseekV3Config(
            **DEEPSEEK, rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}
        ),
        deepseek_layer, "deepseek_v3_yarn", yarn_case, {"mscale": 0.0, "mscale_all_dim": 0.0},
    ),
    "deepseek_v3_mscales": (
        transformers.DeepseekV3Config(
            **DEEPSEEK, rope_parameters={**YARN, "mscale": 0.8, "mscale_all_dim": 0.5}
        ),
        deepseek_layer, "deepseek_v3_yarn", yarn_case, {"mscale_all_dim": 0.0},
    ),
}  # fmt: skip
SPECS = {
    name: indexattn.compile_spec(ROOT / f"specs/models/{name}.attn")
    for name in ("llama3_yarn", "qwen2_yarn", "gpt_oss_yarn", "deepseek_v3_yarn")
}


def case(name):
    """The case's layer, float64, random weights, its inputs and the twin's scalars."""
    config, layer_class, spec, make, twin = CASES[name]
    layer = randomise(layer_class(config, 0)).double().eval()
    return make(layer, SPECS[spec], causal_mask(N, {1: 4})[:, 0]), twin


@pytest.mark.parametrize("name", CASES)
def test_yarn_spec_is_the_transformers_layer(name):
    """Outputs, weights and gradients at 1e-10; the twin: the one scalar the case is about set
    as if the config did not give it, and the spec differs."""
    yarn, twin = case(name)
    module = yarn.module()
    assert sorted(dict(module.named_parameters())) == sorted(
        _ascii(k) for k, _ in yarn.layer.named_parameters()
    )
    compare(yarn, module)
    with pytest.raises(AssertionError):
        compare(yarn, yarn.module(**twin))


def test_float64_yarn_is_transformers_table():
    """The float64 table is transformers' own function: within float32's rounding of its
    float32 run, and different where a parameter is."""
    config = CASES["gpt_oss_sliding"][0]
    want, f_want = modeling_rope_utils._compute_yarn_parameters(config)
    got, f_got = float64_yarn(config)
    assert got.dtype == torch.float64 and f_got == f_want
    torch.testing.assert_close(got, want.double(), atol=1e-7, rtol=1e-6)
    truncated = transformers.GptOssConfig(**GPT_OSS, rope_parameters=YARN)
    assert (float64_yarn(truncated)[0] - got).abs().max() > 1e-3


ROTARY = {  # the model's own rotary embedding, float32 inside, by spec
    "llama3_yarn": llama.LlamaRotaryEmbedding,
    "qwen2_yarn": qwen2.Qwen2RotaryEmbedding,
    "gpt_oss_yarn": gpt_oss.GptOssRotaryEmbedding,
    "deepseek_v3_yarn": deepseek.DeepseekV3RotaryEmbedding,
}


@pytest.mark.parametrize("name", CASES)
def test_yarn_spec_is_the_layer_with_its_own_rotary(name):
    """The layer given its model's rotary embedding as it is (the table in float32): outputs
    within 1e-5, and not within 1e-10 (the float32 is real)."""
    yarn, _ = case(name)
    (x,), positions = yarn.leaves, POSITIONS
    ours = yarn.module()(x, positions, yarn.mask)[0]
    rotary = ROTARY[yarn.spec.name](yarn.layer.config)
    mask = yarn.mask[:, None]
    mask = windowed(yarn.layer, mask) if yarn.spec.name == "gpt_oss_yarn" else mask
    theirs = yarn.layer(x, position_embeddings=rotary(x, positions), attention_mask=mask)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (ours - theirs).abs().max() > TOL["atol"]


@pytest.mark.parametrize(
    "yarn, base",
    [("llama3_yarn", "llama3"), ("qwen2_yarn", "qwen2"), ("gpt_oss_yarn", "gpt_oss"),
     ("deepseek_v3_yarn", "deepseek_v3")],
)  # fmt: skip
def test_yarn_adds_scalars_not_parameters(yarn, base):
    """A YaRN spec's parameters are its base spec's (docs/models.md's counts at real sizes);
    the twin: its scalars are the base's and YaRN's eight."""
    plain = indexattn.compile_spec(ROOT / f"specs/models/{base}.attn")
    assert SPECS[yarn].param_count() == plain.param_count()
    scalars = {s.ascii for s in SPECS[yarn].ir.scalars} - {s.ascii for s in plain.ir.scalars}
    assert scalars == set(hf.weights.ROPE_TYPES["yarn"])
