"""specs/models/ of GPT-NeoX, GPT-J, Falcon and Mistral against transformers' own layers.

Tiny configs built here, every weight and bias random, float64, eval, nothing downloaded.
Each layer is compared twice:

- exactly (1e-10, outputs, attention weights, gradients of the input and of every weight),
  against the layer with its float32 steps removed: the rotary table computed in float64 and
  handed in as position_embeddings (GPT-J: its embed_positions buffer rebuilt in float64),
  and the softmax kept in float64: GPT-NeoX and Mistral through the "sdpa" path (their eager
  path takes softmax(..., dtype=torch.float32)), GPT-J with its _attn minus its cast of the
  queries and keys to float32 (`gptj_attn_in_float64`); Falcon's eager path is float64 already;
- as each layer is (`test_spec_is_the_layer_at_its_own_precision`), with transformers' own
  rotary module (GPTNeoXRotaryEmbedding, FalconRotaryEmbedding, MistralRotaryEmbedding: tables
  in float32) or GPT-J's float32 embed_positions, and the eager path with its float32 softmax
  (GPT-J: scores in float32): within OWN_PRECISION, a float32 tolerance.

Masks are causal with one padded key. Mistral's layer gets the model's sliding-window mask
(transformers' create_sliding_window_causal_mask) while the spec gets the plain causal mask and
applies its own window, over a sequence longer than the window. A tiny 2-layer Mistral gives
the same logits with its attention swapped for mistral.attn (swap_attention).
"""

from pathlib import Path

import pytest
import torch
from models_common import (
    TOL,
    B,
    _ascii,
    causal_mask,
    compare,
    float64_rotary,
    logits,
    randomise,
    rotary,
)

import indexattn
from indexattn.views import cost

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import (  # noqa: E402
    FalconConfig,
    GPTJConfig,
    GPTNeoXConfig,
    MistralConfig,
    MistralForCausalLM,
)
from transformers.masking_utils import (  # noqa: E402
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.models.falcon import modeling_falcon as falcon  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as gpt_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj as gptj  # noqa: E402
from transformers.models.mistral import modeling_mistral as mistral  # noqa: E402

SPECS = {
    name: indexattn.compile_spec(Path(__file__).parent.parent / f"specs/models/{name}.attn")
    for name in ("gpt_neox", "gptj", "falcon", "mistral")
}
N = 7  # longer than Mistral's window below
WINDOW = 3
OWN_PRECISION = {"atol": 1e-4, "rtol": 0}  # float32 rounding (1.2e-7) of gradients up to ~120
POSITIONS = torch.tensor([list(range(N)), list(range(3, 3 + N))])  # batch 1 starts at 3
PADDED = {1: 4}  # batch 1's key 4 is hidden from every query


def hidden(width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return torch.randn(B, N, width, dtype=torch.float64, generator=gen).requires_grad_()


def masks() -> tuple[torch.Tensor, torch.Tensor]:
    """The causal mask with the padded key: as the spec takes it (additive, no head axis), and
    as the layer does ([batch, 1, queries, keys])."""
    mask = causal_mask(N, PADDED)
    return mask[:, 0], mask


def layer_of(cls, config):
    return randomise(cls(config, layer_idx=0)).double().eval()


# --- GPT-NeoX: fused head-major query_key_value, partial rotary, biases --------------------


def neox_case(exact: bool):
    config = GPTNeoXConfig(
        vocab_size=40, hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
        intermediate_size=48, max_position_embeddings=32, rotary_pct=0.25,
        rotary_emb_base=20000, attn_implementation="sdpa" if exact else "eager",
    )  # fmt: skip
    layer = layer_of(gpt_neox.GPTNeoXAttention, config)
    x = hidden(64)
    if exact:
        cos_sin = rotary(POSITIONS, layer.rotary_ndims, 20000.0)
    else:
        cos_sin = gpt_neox.GPTNeoXRotaryEmbedding(config).double()(x, POSITIONS)
    return layer, x, (*masks(), cos_sin), run_neox


def run_neox(layer, module, x, ours_mask, mask, cos_sin):
    ours = module(x, POSITIONS, ours_mask)
    return ours, layer(x, attention_mask=mask, position_embeddings=cos_sin)


# --- GPT-J: separate projections, interleaved rotary over rotary_dim, no biases ------------


def gptj_case(exact: bool):
    config = GPTJConfig(
        vocab_size=40, n_embd=32, n_head=2, n_layer=1, n_positions=32, rotary_dim=8,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=None,
        attn_implementation="eager",
    )  # fmt: skip
    layer = layer_of(gptj.GPTJAttention, config)
    if exact:
        layer.embed_positions = sinusoids_in_float64(32, config.rotary_dim)
        layer._attn = gptj_attn_in_float64(layer)
    return layer, hidden(32), masks(), run_gptj


def sinusoids_in_float64(num_pos: int, dim: int) -> torch.Tensor:
    """GPT-J's create_sinusoidal_positions (sin, then cos, of each position times
    10000^(-2j/dim)) computed in float64 where transformers computes it in float32."""
    inv_freq = 10000.0 ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(num_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=1)


def gptj_attn_in_float64(layer):
    """GPTJAttention._attn without its `query.to(torch.float32)`, `key.to(torch.float32)`."""

    def _attn(query, key, value, attention_mask=None):
        weights = query @ key.transpose(-1, -2) / layer.scale_attn + attention_mask
        weights = torch.softmax(weights, dim=-1)
        return weights @ value, weights

    return _attn


def run_gptj(layer, module, x, ours_mask, mask):
    ours = module(x, POSITIONS, ours_mask)
    return ours, layer(x, attention_mask=mask, position_ids=POSITIONS)


# --- Falcon-7B: multi-query fused query_key_value, rotary, no biases -----------------------


def falcon_case(exact: bool):
    config = FalconConfig(
        vocab_size=40, hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
        multi_query=True, new_decoder_architecture=False, alibi=False, bias=False,
        max_position_embeddings=32, rope_parameters={"rope_type": "default", "rope_theta": 3000.0},
        attn_implementation="eager",
    )  # fmt: skip
    layer = layer_of(falcon.FalconAttention, config)
    x = hidden(32)
    if exact:
        cos_sin = rotary(POSITIONS, layer.head_dim, 3000.0)
    else:
        cos_sin = falcon.FalconRotaryEmbedding(config).double()(x, POSITIONS)
    return layer, x, (*masks(), cos_sin), run_falcon


def run_falcon(layer, module, x, ours_mask, mask, cos_sin):
    ours = module(x, POSITIONS, ours_mask)
    return ours, layer(x, alibi=None, attention_mask=mask, position_embeddings=cos_sin)


# --- Mistral: grouped-query, rotary, sliding window ----------------------------------------


def mistral_config(exact: bool) -> MistralConfig:
    return MistralConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, sliding_window=WINDOW,
        attn_implementation="sdpa" if exact else "eager",
    )  # fmt: skip


def mistral_case(exact: bool):
    config = mistral_config(exact)
    layer = layer_of(mistral.MistralAttention, config)
    x = hidden(32)
    if exact:
        cos_sin = rotary(POSITIONS, layer.head_dim, 1e6)
    else:
        cos_sin = mistral.MistralRotaryEmbedding(config).double()(x, POSITIONS)
    return layer, x, (*mistral_masks(config, x), cos_sin), run_mistral


def mistral_masks(config, x):
    """The masks Mistral's model makes (causal, the padded key hidden), without and with the
    window: the spec takes the first (additive, no head axis), the layer the second."""
    padding = torch.ones(B, N, dtype=torch.long)
    for b, t in PADDED.items():
        padding[b, t] = 0
    causal, windowed = (
        make(config, x, padding, None, position_ids=POSITIONS, allow_is_causal_skip=False)
        for make in (create_causal_mask, create_sliding_window_causal_mask)
    )
    return hf.additive_mask(causal, x, N), windowed


def run_mistral(layer, module, x, ours_mask, windowed, cos_sin):
    ours = module(x, POSITIONS, ours_mask)
    return ours, layer(x, position_embeddings=cos_sin, attention_mask=windowed)


CASES = {"gpt_neox": neox_case, "gptj": gptj_case, "falcon": falcon_case, "mistral": mistral_case}


# --- the comparisons ------------------------------------------------------------------------


def spec_module(layer, name: str, **given):
    module = hf.from_transformers(layer, SPECS[name], **given)
    assert sorted(dict(module.named_parameters())) == sorted(
        _ascii(k) for k, _ in layer.named_parameters()
    )
    return module


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_transformers_layer(name):
    layer, x, extra, run = CASES[name](exact=True)
    compare(layer, spec_module(layer, name), x, extra, run)


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_layer_at_its_own_precision(name):
    layer, x, extra, run = CASES[name](exact=False)
    compare(layer, spec_module(layer, name), x, extra, run, OWN_PRECISION)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "own_precision"])
@pytest.mark.parametrize("name", CASES)
def test_one_perturbed_weight_is_caught(name, exact):
    """The twin: the same comparison fails when one weight of the spec's copy is nudged, by
    1e-6 against the exact layer, by 1e-3 against the layer at its own precision."""
    layer, x, extra, run = CASES[name](exact=exact)
    module = spec_module(layer, name)
    with torch.no_grad():
        next(iter(module.parameters()))[0, 0] += 1e-6 if exact else 1e-3
    with pytest.raises(AssertionError):
        compare(layer, module, x, extra, run, TOL if exact else OWN_PRECISION)


@pytest.mark.parametrize("name", CASES)
def test_one_more_masked_key_is_caught(name):
    """The twin of the mask: one more key hidden from one query, in the spec's mask only."""
    layer, x, (mask, *rest), run = CASES[name](exact=True)
    mask = mask.clone()
    mask[..., N - 1, N - 2] = float("-inf")  # the last query no longer sees the key before it
    with pytest.raises(AssertionError):
        compare(layer, spec_module(layer, name), x, (mask, *rest), run)


def test_mistral_window_is_the_spec_s_own():
    """The spec's window is what hides the far keys: without it (a window as long as the
    sequence) the spec, on the same causal mask, no longer equals the windowed layer."""
    layer, x, extra, run = mistral_case(exact=True)
    with pytest.raises(AssertionError):
        compare(layer, spec_module(layer, "mistral", sliding_window=N), x, extra, run)
    assert spec_module(layer, "mistral").scalars["sliding_window"] == WINDOW


# --- parameter counts at the real models' sizes ---------------------------------------------

REAL = {  # transformers' config defaults are these models' sizes
    "gpt_neox": (gpt_neox.GPTNeoXAttention, GPTNeoXConfig),  # GPT-NeoX-20B: 6144, 64 heads
    "gptj": (gptj.GPTJAttention, GPTJConfig),  # GPT-J-6B: 4096, 16 heads, rotary_dim 64
    "falcon": (falcon.FalconAttention, FalconConfig),  # Falcon-7B: 4544, 71 heads, multi-query
    "mistral": (mistral.MistralAttention, MistralConfig),  # Mistral-7B: 4096, 32 / 8 heads
}


def real_sizes(name: str):
    """The layer of the real model, on the meta device, and the spec's sizes read off it."""
    cls, config = REAL[name]
    with torch.device("meta"):
        layer = cls(config(), layer_idx=0)
    known = hf.sizes_and_scalars(layer, {str(s) for s in SPECS[name].sizes})
    return layer, {s: known[str(s)] for s in SPECS[name].sizes if str(s) in known}


@pytest.mark.parametrize("name", REAL)
def test_param_count_at_the_real_size(name):
    layer, sizes = real_sizes(name)
    count = cost.evaluate(SPECS[name].param_count(), sizes)
    assert count == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("name", REAL)
def test_param_count_at_a_wrong_size_differs(name):
    """The twin: one head fewer changes the count."""
    layer, sizes = real_sizes(name)
    head = max((s for s in sizes if str(s) in ("h", "h_kv")), key=str)  # h_kv if there is one
    sizes[head] -= 1
    assert cost.evaluate(SPECS[name].param_count(), sizes) != sum(
        p.numel() for p in layer.parameters()
    )


# --- a whole Mistral with every attention swapped -------------------------------------------


def mistral_model():
    """A tiny 2-layer Mistral, window 3 over 7 tokens, with a float64 rotary table."""
    torch.manual_seed(0)
    config = mistral_config(exact=True)
    config.num_hidden_layers = 2
    return float64_rotary(randomise(MistralForCausalLM(config)).double().eval())


def test_swapped_mistral_gives_the_same_logits():
    model = mistral_model()
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    padding = torch.ones(B, N, dtype=torch.long)
    padding[1, :2] = 0  # batch 1 is left-padded by two tokens
    before = logits(model, ids, padding)
    hf.swap_attention(model, SPECS["mistral"])
    assert sum(isinstance(m, hf.SpecAttention) for m in model.modules()) == 2
    torch.testing.assert_close(logits(model, ids, padding), before, **TOL)


def test_swapped_mistral_with_one_perturbed_weight_differs():
    model = mistral_model()
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    before = logits(model, ids, None)
    hf.swap_attention(model, SPECS["mistral"])
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        next(iter(swapped.spec.parameters()))[0, 0] += 1e-4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(model, ids, None), before, **TOL)
