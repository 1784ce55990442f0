"""specs/models/ swapped into whole transformers models: the same logits, and generate() with
the key/value cache through the decode specs; every model spec against the literal reading.
The attention layers alone, family by family, are tests/models/test_family_*.py's.

Tiny models built from configs with random weights (nothing is downloaded), float64, eval.
GPT-2 runs transformers' "eager" attention. Llama's kind (Llama 3, Mistral, Qwen2, Qwen3) runs
"sdpa": the eager path takes the softmax in float32 (softmax(..., dtype=torch.float32)), which
would cap the agreement near 1e-7; sdpa keeps float64. Their rotary tables are computed by
transformers in float32 (LlamaRotaryEmbedding.forward and its kin): the models get a float64
rotary table, and Qwen3's norms run in float64 (Qwen3RMSNorm upcasts), so 1e-10 holds
everywhere.
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
    float64_rms_norm,
    float64_rotary,
    logits,
    randomise,
    spec,
)

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 6
SMALL = {  # a tiny 2-layer model of Llama's kind
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
    "eos_token_id": None, "attn_implementation": "sdpa",
}  # fmt: skip
LLAMA_LIKE = {  # config class, rope_theta, its other settings
    "llama3": ("LlamaConfig", 500000.0, {}),
    "mistral": ("MistralConfig", 1e6, {"sliding_window": 3}),  # a window shorter than N
    "qwen2": ("Qwen2Config", 10000.0, {}),
    "qwen3": ("Qwen3Config", 1e4, {"head_dim": 16, "rms_norm_eps": 1e-3}),  # head_dim not 32 / 4
}


def gpt2_config(**kw):
    return GPT2Config(
        vocab_size=40, n_positions=32, n_embd=16, n_layer=2, n_head=4,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=None,
        attn_implementation="eager", **kw,
    )  # fmt: skip


# --- whole models, every attention layer swapped --------------------------------------------


def model_of(name: str):
    """The tiny model and its spec: GPT-2, or one of Llama's kind with a float64 rotary table
    and Qwen3's norms in float64."""
    torch.manual_seed(0)
    if name == "gpt2":
        return randomise(GPT2LMHeadModel(gpt2_config())).double().eval(), spec(name)
    config_class, theta, settings = LLAMA_LIKE[name]
    rope = {"rope_type": "default", "rope_theta": theta}
    config = getattr(transformers, config_class)(**SMALL, rope_parameters=rope, **settings)
    model = randomise(transformers.AutoModelForCausalLM.from_config(config)).double().eval()
    for norm in model.modules():
        if isinstance(norm, Qwen3RMSNorm):
            float64_rms_norm(norm)
    return float64_rotary(model), spec(name)


MODELS = ("gpt2", *LLAMA_LIKE)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_gives_the_same_logits(name):
    model, compiled = model_of(name)
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    padding = torch.ones(B, N, dtype=torch.long)
    padding[1, :2] = 0  # batch 1 is left-padded by two tokens
    before = logits(model, ids, padding)
    hf.swap_attention(model, compiled)
    assert sum(isinstance(m, hf.SpecAttention) for m in model.modules()) == 2
    after = logits(model, ids, padding)
    torch.testing.assert_close(after[:, :], before, **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_with_one_perturbed_weight_differs(name):
    model, compiled = model_of(name)
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2))
    before = logits(model, ids, None)
    hf.swap_attention(model, compiled)
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        next(iter(swapped.spec.parameters()))[0, 0] += 1e-4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(model, ids, None), before, **TOL)


# --- generate() with the key/value cache, through the decode specs ---------------------------

DECODE = {name: spec(f"{name}_decode") for name in ("gpt2", "llama3")}


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


@pytest.mark.parametrize("name", DECODE)
def test_swapped_model_generates_the_same_with_its_cache(name):
    model, compiled = model_of(name)
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    hf.swap_attention(model, compiled, decode=DECODE[name])
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


@pytest.mark.parametrize("name", DECODE)
def test_swapped_model_with_a_perturbed_weight_generates_differently(name):
    """The twin: a weight nudged in the swapped layer (shared by its spec and decode modules)
    changes the prompt's logits and every later step's, and is caught."""
    model, compiled = model_of(name)
    ids, padding = prompt()
    _, steps = generate(model, ids, padding)
    hf.swap_attention(model, compiled, decode=DECODE[name])
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        next(iter(swapped.spec.parameters()))[0, 0] += 1e-4
    _, steps_swapped = generate(model, ids, padding)
    for step, step_swapped in zip(steps, steps_swapped):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(step_swapped, step, **TOL)


@pytest.mark.parametrize("name", DECODE)
def test_swapped_model_reads_the_padding(name):
    """The mask-bit twin: the same prompts with the padding bit of batch 1 set to 1 give other
    logits for batch 1, so the equality above holds only if the specs read the padding."""
    model, compiled = model_of(name)
    hf.swap_attention(model, compiled, decode=DECODE[name])
    ids, padding = prompt()
    _, steps = generate(model, ids, padding)
    _, steps_unpadded = generate(model, ids, torch.ones_like(padding))
    torch.testing.assert_close(steps_unpadded[0, 0], steps[0, 0], **TOL)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(steps_unpadded[:, 1], steps[:, 1], **TOL)


def test_a_cache_without_a_decode_spec_is_refused():
    model, compiled = model_of("gpt2")
    hf.swap_attention(model, compiled, decode=None)
    with pytest.raises(NotImplementedError, match="decode="):
        generate(model, *prompt())


def test_indexattn_never_imports_transformers_unasked():
    code = (
        "import sys, indexattn\n"
        "indexattn.compile_spec('specs/models/llama3.attn').module(d_m=8, h_kv=2, n_rep=2, d_r=2)\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


MODEL_SPECS = sorted((ROOT / "specs" / "models").glob("*.attn"))


@pytest.mark.parametrize("path", MODEL_SPECS, ids=lambda p: p.stem)
def test_model_specs_equal_the_literal_reading(path):
    from indexattn.oracle import verify

    compiled = indexattn.compile_spec(path)
    for batch in ((), (2,)):
        assert verify.compare(compiled, batch=batch).ok
    assert compiled.latex().startswith("\\begin{align}")
