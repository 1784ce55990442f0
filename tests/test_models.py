"""specs/models/ against transformers' own attention layers, and swapped into whole models.

Tiny models built from configs with random weights (nothing is downloaded), float64, eval.
GPT-2 runs transformers' "eager" attention. Llama runs "sdpa": its eager path takes the
softmax in float32 (softmax(..., dtype=torch.float32)), which would cap the agreement near
1e-7; sdpa keeps float64. Llama's rotary table is computed by transformers in float32
(LlamaRotaryEmbedding.forward); the layer tests hand the layer angles computed in float64 and
the model tests give the model a float64 rotary table, so 1e-10 holds everywhere.
"""

import operator
import subprocess
import sys

import pytest
import torch
from models_common import (
    ROOT,
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

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention  # noqa: E402

N = 6

GPT2 = indexattn.compile_spec(ROOT / "specs/models/gpt2.attn")
LLAMA3 = indexattn.compile_spec(ROOT / "specs/models/llama3.attn")


def gpt2_config(**kw):
    return GPT2Config(
        vocab_size=40, n_positions=32, n_embd=16, n_layer=2, n_head=4,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=None,
        attn_implementation="eager", **kw,
    )  # fmt: skip


def llama_config(**kw):
    return LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, eos_token_id=None,
        attn_implementation="sdpa", **kw,
    )  # fmt: skip


def run_gpt2(layer, module, x, mask, **kw):
    ours = module(x, mask[:, 0])
    theirs = layer(x, attention_mask=mask, **kw)
    return ours, theirs


def run_llama(layer, module, x, mask, positions, **kw):
    ours = module(x, positions, mask[:, 0])
    cos_sin = rotary(positions, layer.head_dim, layer.config.rope_parameters["rope_theta"])
    theirs = layer(x, position_embeddings=cos_sin, attention_mask=mask, **kw)
    return ours, theirs


def gpt2_case():
    layer = randomise(GPT2Attention(gpt2_config(), layer_idx=0)).double().eval()
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    return layer, x, (causal_mask(N, {1: 2}),), run_gpt2, GPT2


def llama_case():
    layer = randomise(LlamaAttention(llama_config(), layer_idx=0)).double().eval()
    x = torch.randn(B, N, 32, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([list(range(N)), list(range(3, 3 + N))])  # batch 1 starts at 3
    return layer, x, (causal_mask(N, {1: 4}), positions), run_llama, LLAMA3


CASES = {"gpt2": gpt2_case, "llama3": llama_case}


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_transformers_layer(name):
    layer, x, extra, run, spec = CASES[name]()
    module = hf.from_transformers(layer, spec)
    assert sorted(dict(module.named_parameters())) == sorted(
        _ascii(k) for k, _ in layer.named_parameters()
    )
    compare(layer, module, x, extra, run)


@pytest.mark.parametrize("name", CASES)
def test_one_perturbed_weight_is_caught(name):
    """The twin: the same comparison fails when one weight of the spec's copy is nudged."""
    layer, x, extra, run, spec = CASES[name]()
    module = hf.from_transformers(layer, spec)
    with torch.no_grad():
        next(iter(module.parameters()))[0, 0] += 1e-6
    with pytest.raises(AssertionError):
        compare(layer, module, x, extra, run)


# --- whole models, every attention layer swapped --------------------------------------------


def gpt2_model():
    torch.manual_seed(0)
    return randomise(GPT2LMHeadModel(gpt2_config())).double().eval(), GPT2


def llama_model():
    torch.manual_seed(0)
    model = randomise(LlamaForCausalLM(llama_config())).double().eval()
    return float64_rotary(model), LLAMA3


MODELS = {"gpt2": gpt2_model, "llama3": llama_model}


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_gives_the_same_logits(name):
    model, spec = MODELS[name]()
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    padding = torch.ones(B, N, dtype=torch.long)
    padding[1, :2] = 0  # batch 1 is left-padded by two tokens
    before = logits(model, ids, padding)
    hf.swap_attention(model, spec)
    assert sum(isinstance(m, hf.SpecAttention) for m in model.modules()) == 2
    after = logits(model, ids, padding)
    torch.testing.assert_close(after[:, :], before, **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_with_one_perturbed_weight_differs(name):
    model, spec = MODELS[name]()
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    before = logits(model, ids, None)
    hf.swap_attention(model, spec)
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        next(iter(swapped.spec.parameters()))[0, 0] += 1e-4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(model, ids, None), before, **TOL)


# --- generate() with the key/value cache, through the decode specs ---------------------------

DECODE = {
    "gpt2": indexattn.compile_spec(ROOT / "specs/models/gpt2_decode.attn"),
    "llama3": indexattn.compile_spec(ROOT / "specs/models/llama3_decode.attn"),
}


NEW_TOKENS = 20


def prompt():
    """Two prompts of three tokens, the second left-padded by one token."""
    ids = torch.randint(1, 40, (B, 3), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(ids)
    ids[1, 0], padding[1, 0] = 0, 0
    return ids, padding


def generate(model, ids, padding):
    """Greedy decoding with the cache on: the tokens, and every step's float64 logits (read off
    lm_head: generate() itself hands its logits back in float32)."""
    logits = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: logits.append(out[:, -1]))
    with torch.no_grad():
        tokens = model.generate(
            ids, attention_mask=padding, max_new_tokens=NEW_TOKENS, do_sample=False,
            use_cache=True, pad_token_id=0,
        )  # fmt: skip
    hook.remove()
    assert all(step.dtype == torch.float64 for step in logits)
    return tokens, torch.stack(logits)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_generates_the_same_with_its_cache(name):
    model, spec = MODELS[name]()
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    hf.swap_attention(model, spec, decode=DECODE[name])
    calls = []
    for m in model.modules():
        if isinstance(m, hf.SpecAttention):
            assert all(map(operator.is_, m.decode.parameters(), m.spec.parameters()))
            m.decode.register_forward_hook(lambda *_: calls.append(1))
    tokens_swapped, steps_swapped = generate(model, ids, padding)
    assert len(calls) == 2 * (NEW_TOKENS - 1)  # two layers, every step after the prompt
    assert tokens.shape == (B, 3 + NEW_TOKENS)
    assert torch.equal(tokens_swapped, tokens)
    torch.testing.assert_close(steps_swapped, steps, **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_with_a_perturbed_weight_generates_differently(name):
    """The twin: a weight nudged in the swapped layer (shared by its spec and decode modules)
    changes the prompt's logits and every later step's, and is caught."""
    model, spec = MODELS[name]()
    ids, padding = prompt()
    _, steps = generate(model, ids, padding)
    hf.swap_attention(model, spec, decode=DECODE[name])
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        next(iter(swapped.spec.parameters()))[0, 0] += 1e-4
    _, steps_swapped = generate(model, ids, padding)
    for step, step_swapped in zip(steps, steps_swapped):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(step_swapped, step, **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_reads_the_padding(name):
    """The mask-bit twin: the same prompts with the padding bit of batch 1 set to 1 give other
    logits for batch 1, so the equality above holds only if the specs read the padding."""
    model, spec = MODELS[name]()
    hf.swap_attention(model, spec, decode=DECODE[name])
    ids, padding = prompt()
    _, steps = generate(model, ids, padding)
    _, steps_unpadded = generate(model, ids, torch.ones_like(padding))
    torch.testing.assert_close(steps_unpadded[0, 0], steps[0, 0], **TOL)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(steps_unpadded[:, 1], steps[:, 1], **TOL)


def test_a_cache_without_a_decode_spec_is_refused():
    model, spec = gpt2_model()
    hf.swap_attention(model, spec)
    with pytest.raises(NotImplementedError, match="decode="):
        generate(model, *prompt())


def test_indexattn_never_imports_transformers_unasked():
    code = (
        "import sys, indexattn\n"
        "indexattn.compile_spec('specs/models/llama3.attn').module(d_m=8, h_kv=2, n_rep=2, d_r=2)\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("name", CASES)
def test_spec_returns_the_keys_and_values_transformers_caches(name):
    layer, x, extra, run, spec = CASES[name]()
    module = hf.from_transformers(layer, spec)
    cache = transformers.DynamicCache(config=layer.config)
    (*_, k, v), _ = run(layer, module, x, *extra, past_key_values=cache)
    torch.testing.assert_close(k.flatten(3) if k.dim() == 5 else k, cache.layers[0].keys, **TOL)
    torch.testing.assert_close(v, cache.layers[0].values, **TOL)


MODEL_SPECS = sorted((ROOT / "specs" / "models").glob("*.attn"))


@pytest.mark.parametrize("path", MODEL_SPECS, ids=lambda p: p.stem)
def test_model_specs_equal_the_literal_reading(path):
    from indexattn.oracle import verify

    spec = indexattn.compile_spec(path)
    for batch in ((), (2,)):
        assert verify.compare(spec, batch=batch).ok
    assert spec.latex().startswith("\\begin{align}")


def test_a_layer_with_other_weights_is_refused_by_name():
    """Llama with attention_bias=True has biases that specs/models/llama3.attn does not declare."""
    layer = LlamaAttention(llama_config(attention_bias=True), layer_idx=0)
    with pytest.raises(ValueError, match=r"the layer has k_proj_bias, o_proj_bias, q_proj_bias"):
        hf.from_transformers(layer, LLAMA3)
    assert hf.from_transformers(LlamaAttention(llama_config(), layer_idx=0), LLAMA3) is not None


def test_llama_as_transformers_runs_it_at_its_own_precision():
    """The layer as it is: eager attention (softmax in float32) and transformers' own rotary
    table (computed in float32). It agrees to float32's precision, not float64's; the tests above
    remove those two upcasts (sdpa, a float64 table) and agree to 1e-10."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = llama_config()
    config._attn_implementation = "eager"
    layer = randomise(LlamaAttention(config, layer_idx=0)).double().eval()
    module = hf.from_transformers(layer, LLAMA3)
    x = torch.randn(B, N, 32, dtype=torch.float64)
    positions = torch.tensor([list(range(N)), list(range(3, 3 + N))])
    mask = causal_mask(N, {1: 4})
    cos_sin = LlamaRotaryEmbedding(config)(x, positions)
    theirs, _ = layer(x, position_embeddings=cos_sin, attention_mask=mask)
    ours = module(x, positions, mask[:, 0])[0]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError):  # float32's rounding is there to see at 1e-10
        torch.testing.assert_close(ours, theirs, **TOL)


def at(expr, **sizes) -> int:
    """A symbolic count at given sizes (its symbols by name)."""
    return int(expr.subs({s: sizes[str(s)] for s in expr.free_symbols}))


REAL = {  # the published sizes: GPT-2 small, Llama-3-8B
    "gpt2": (
        GPT2,
        GPT2Attention,
        GPT2Config(n_embd=768, n_head=12),
        {"d_m": 768, "h": 12, "d_k": 64},
        2_362_368,
    ),
    "llama3": (
        LLAMA3,
        LlamaAttention,
        LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8),
        {"d_m": 4096, "h_kv": 8, "n_rep": 4, "d_r": 64},
        41_943_040,
    ),
}


@pytest.mark.parametrize("name", REAL)
def test_param_count_at_the_real_size_is_the_layers(name):
    """param_count() at the real model's sizes against the transformers layer built at those
    sizes on the meta device (no memory), and the figure docs/models.md quotes."""
    spec, layer_class, config, sizes, quoted = REAL[name]
    with torch.device("meta"):
        layer = layer_class(config, layer_idx=0)
    assert at(spec.param_count(), **sizes) == sum(p.numel() for p in layer.parameters()) == quoted
    assert at(spec.param_count(), **{**sizes, "d_m": sizes["d_m"] + 1}) != quoted  # the twin


def test_a_scalar_the_layer_leaves_unset_is_refused():
    """Gemma 2 without soft-capping: the spec caps, so loading it is refused rather than capping
    at the spec's default; the twin with the cap set loads, and reads the layer's value."""
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    def layer(cap):
        config = Gemma2Config(
            hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
            attn_logit_softcapping=cap,
        )  # fmt: skip
        return Gemma2Attention(config, layer_idx=0)

    spec = ROOT / "specs/models/gemma2.attn"
    with pytest.raises(ValueError, match="attn_logit_softcapping is None"):
        hf.from_transformers(layer(None), spec)
    assert hf.from_transformers(layer(30.0), spec).scalars["attn_logit_softcapping"] == 30.0
