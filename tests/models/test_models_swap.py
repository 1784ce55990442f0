"""The whole-layer swap on every transformers version in the tested range (.ci/run runs this
file at both ends): generate() through the decode specs, saving, unswapping, refusals.

Tiny models built from configs with random weights (nothing downloaded), float64, eval. The
reference is the model before the swap with "sdpa" attention (float64 throughout), a float64
rotary table (transformers computes it in float32; the specs compute theirs in float64) and
Qwen3's norms kept in float64 (Qwen3RMSNorm upcasts to float32).
"""

import re
import warnings

import pytest
import torch
from models_common import ROOT, TOL, randomise, rotary

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

B, N, NEW = 2, 6, 8
SMALL = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "eos_token_id": None, "attn_implementation": "sdpa",
}  # fmt: skip

FAMILIES = {  # config class, extra settings, layer spec, decode spec
    "llama": ("LlamaConfig", {}, "llama3", "llama3_decode"),
    "mistral": ("MistralConfig", {"sliding_window": 3}, "mistral", "llama3_decode"),
    "qwen2": ("Qwen2Config", {}, "qwen2", "qwen2_decode"),
    "qwen3": ("Qwen3Config", {"head_dim": 16}, "qwen3", "qwen3_decode"),
    "gemma2": (  # a cap that bites; a window of 3 that the cache outgrows; eager (sdpa: no cap)
        "Gemma2Config",
        {"head_dim": 8, "query_pre_attn_scalar": 12, "attn_logit_softcapping": 2.0,
         "sliding_window": 3, "attn_implementation": "eager"},
        "gemma2", "gemma2_decode",
    ),
    "gpt_neox": (  # half of each head's 8 features rotated; a fused projection with biases
        "GPTNeoXConfig", {"num_key_value_heads": 4, "rotary_pct": 0.5}, "gpt_neox",
        "gpt_neox_decode",
    ),
}  # fmt: skip
SPECS = {
    name: indexattn.compile_spec(ROOT / f"specs/models/{name}.attn")
    for _, _, *specs in FAMILIES.values()
    for name in specs
}


@pytest.fixture(autouse=True)
def float64_norms(monkeypatch):
    """Qwen3's norms and eager's softmax (Gemma 2's reference) without their float32 upcast."""

    def rms_norm(self, x):
        mean_square = x.pow(2).mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(mean_square + self.variance_epsilon)

    def softmax_as_is(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, **kw)

    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", rms_norm)
    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_as_is)


def model_of(family: str, **settings):
    """The family's tiny causal LM, float64, eval, random weights, float64 rotary table."""
    config_class, extra, _, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SMALL, **extra, **settings})
    torch.manual_seed(0)
    model = randomise(transformers.AutoModelForCausalLM.from_config(config)).double().eval()
    d_k = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    d_k = int(d_k * config.rope_parameters.get("partial_rotary_factor", 1.0))
    theta = config.rope_parameters["rope_theta"]
    model.base_model.rotary_emb.forward = lambda x, position_ids: rotary(position_ids, d_k, theta)
    return model


def swap(model, family: str, decode: bool = True):
    _, _, spec, decode_spec = FAMILIES[family]
    return hf.swap_attention(model, SPECS[spec], decode=SPECS[decode_spec] if decode else None)


def prompt():
    ids = torch.randint(1, 40, (B, N), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(ids)
    padding[1, :2] = 0
    return ids, padding


def generate(model, ids, padding):
    """Greedy decoding with the cache on: the tokens, and every step's float64 logits."""
    steps = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, i, out: steps.append(out[:, -1])
    )
    with torch.no_grad():
        tokens = model.generate(
            ids, attention_mask=padding, max_new_tokens=NEW, do_sample=False, use_cache=True,
            pad_token_id=0,
        )  # fmt: skip
    hook.remove()
    return tokens, torch.stack(steps)


def wrappers(model) -> list:
    return [m for m in model.modules() if isinstance(m, hf.SpecAttention)]


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_runs_the_decode_spec_and_gives_the_same_tokens(family):
    model = model_of(family)
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    swap(model, family)
    decoded = []
    for wrapper in wrappers(model):
        wrapper.decode.register_forward_hook(lambda m, i, out: decoded.append(i[0].shape[-2]))
    tokens_swapped, steps_swapped = generate(model, ids, padding)
    assert decoded == [1] * 2 * (NEW - 1)  # two layers, one new token at every later step
    assert tokens.shape == (B, N + NEW) and torch.equal(tokens_swapped, tokens)
    torch.testing.assert_close(steps_swapped, steps, **TOL)


def test_gemma2_decodes_its_sliding_layers_from_the_windowed_cache():
    """Gemma 2's sliding layer (0) is handed the last sliding_window - 1 = 2 cached tokens at
    every step, its full layer (1) the whole prefix, and the tokens are the model's. The soft
    cap's twin: layers swapped with another cap give other logits at every step."""
    model = model_of("gemma2")
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    for block in model.model.layers:
        block.self_attn.attn_logit_softcapping = 3.0  # the layer's own value wins
    swap(model, "gemma2")
    cached = {0: [], 1: []}
    for wrapper in wrappers(model):
        keep = cached[wrapper.layer_idx].append
        wrapper.decode.register_forward_hook(lambda m, i, out, keep=keep: keep(i[2].shape[-3]))
    _, steps_capped = generate(model, ids, padding)
    assert cached == {0: [2] * (NEW - 1), 1: list(range(N, N + NEW - 1))}
    for step, step_capped in zip(steps, steps_capped):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(step_capped, step, **TOL)
    for wrapper in wrappers(model):  # the twin's twin: the model's own cap
        wrapper.spec.scalars["attn_logit_softcapping"] = wrapper.decode.scalars[
            "attn_logit_softcapping"
        ] = 2.0
    tokens_swapped, steps_swapped = generate(model, ids, padding)
    assert torch.equal(tokens_swapped, tokens)
    torch.testing.assert_close(steps_swapped, steps, **TOL)


@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma2", "gpt_neox"])
def test_a_nudged_weight_changes_every_step(family):
    model = model_of(family)
    ids, padding = prompt()
    _, steps = generate(model, ids, padding)
    swap(model, family)
    with torch.no_grad():
        next(wrappers(model)[1].spec.parameters()).view(-1)[0] += 1e-4  # q_proj's, say
    _, steps_swapped = generate(model, ids, padding)
    for step, step_swapped in zip(steps, steps_swapped):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(step_swapped, step, **TOL)


def logits(model, ids, padding):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=padding, use_cache=False).logits


def test_save_pretrained_writes_the_layers_names_once(tmp_path):
    """A swapped model saves the unswapped model's checkpoint: its keys, each weight once;
    from_pretrained gives the same logits, unswapped and swapped again."""
    from safetensors.torch import load_file

    model = model_of("llama")
    keys = set(model.state_dict())
    ids, padding = prompt()
    swap(model, "llama")
    with torch.no_grad():
        wrappers(model)[0].spec.q_proj_weight[0, 0] += 0.5  # trained, say
    want = logits(model, ids, padding)
    assert set(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert set(saved) == keys
    loaded = model_of("llama")  # its rotary table, then the saved weights
    loaded.load_state_dict(transformers.LlamaForCausalLM.from_pretrained(tmp_path).state_dict())
    torch.testing.assert_close(logits(loaded, ids, padding), want, **TOL)
    torch.testing.assert_close(logits(swap(loaded, "llama"), ids, padding), want, **TOL)
    untrained = model_of("llama")  # the twin: the weights before the nudge
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(untrained, ids, padding), want, **TOL)


def test_unswap_puts_the_layers_back_with_the_swapped_weights():
    model = model_of("qwen2")
    classes = [type(m.self_attn) for m in model.model.layers]
    ids, padding = prompt()
    swap(model, "qwen2")
    with torch.no_grad():
        wrappers(model)[1].spec.q_proj_bias[0] += 0.5
    want = logits(model, ids, padding)
    hf.unswap_attention(model)
    assert [type(m.self_attn) for m in model.model.layers] == classes
    torch.testing.assert_close(logits(model, ids, padding), want, **TOL)
    with pytest.raises(ValueError, match="no swapped attention layer"):
        hf.unswap_attention(model)


def test_attention_dropout_in_training_is_refused():
    model = model_of("llama", attention_dropout=0.1)
    with pytest.raises(NotImplementedError, match=r"attention dropout 0\.1 in training"):
        swap(model.train(), "llama")
    swap(model.eval(), "llama")  # eval: no dropout to apply
    with pytest.raises(NotImplementedError, match="attention dropout"):
        model.train()
    assert model_of("llama", attention_dropout=0.0).train() is not None  # the twin


def test_an_unknown_keyword_is_an_error_naming_it():
    model = swap(model_of("llama"), "llama", decode=False)
    layer = wrappers(model)[0]
    x = torch.randn(B, N, 32, dtype=torch.float64)
    with pytest.raises(TypeError, match="got head_mask, which it does not know"):
        layer(x, attention_mask=None, head_mask=torch.ones(4))
    assert layer(x, attention_mask=None, use_cache=False)[0].shape == x.shape


def test_the_cache_is_read_under_either_name():
    """transformers 5.24 renamed the layer's past_key_values argument to cache: both fill it."""
    model = swap(model_of("llama"), "llama")
    layer = wrappers(model)[0]
    x = torch.randn(B, N, 32, dtype=torch.float64)
    for name in ("past_key_values", "cache"):
        cache = transformers.DynamicCache(config=model.config)
        layer(x, attention_mask=None, **{name: cache})
        assert cache.get_seq_length(0) == N
    with pytest.raises(TypeError, match="both past_key_values and cache"):
        layer(x, attention_mask=None, past_key_values=cache, cache=cache)


@pytest.mark.parametrize("version", ["4.57.6", "5.26.0", "6.0"])
def test_a_transformers_outside_the_tested_range_warns(version):
    """A warning, not an ImportError; the twin: the range's ends and this one warn nothing."""
    low, high = hf.TESTED
    with pytest.warns(hf.TransformersVersionWarning, match=f">={low},<{high}; this is"):
        hf._check_version(version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf._check_version(low)
        hf._check_version(transformers.__version__)


def test_pyproject_admits_the_major_release_and_ci_tests_both_ends():
    """pyproject.toml admits transformers 5 from the oldest release tested (the import warns
    past the newest); .ci/run tests the oldest and the last minor release tested."""
    from packaging.version import Version

    low, high = hf.TESTED
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    bound = f'"transformers>={low},<{Version(low).major + 1}"'
    assert pyproject.count(bound) == 2  # the extra and the tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    oldest, newest = re.search(r"^ *for version in (\S+) (\S+); do$", ci, re.M).groups()
    assert oldest == low and Version(newest) < Version(high)
    assert Version(newest).minor == Version(high).minor - 1  # the last minor release tested


def test_a_spec_module_loads_the_layers_own_keys():
    """load_state_dict(layer.state_dict()): dots read as underscores; a key the spec does not
    declare is still refused by name (the twin)."""
    layer = model_of("qwen2").model.layers[0].self_attn
    module = SPECS["qwen2"].module(d_m=32, h_kv=2, n_rep=2, d_r=4).double()
    module.load_state_dict(layer.state_dict())
    assert torch.equal(module.q_proj_bias, layer.q_proj.bias)
    extra = {**layer.state_dict(), "o_proj.bias": torch.zeros(32)}
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "o_proj.bias"'):
        module.load_state_dict(extra)


def test_partial_rotary_is_refused_by_name():
    """StableLM rotates a quarter of each head; llama3.attn turns whole heads. The twin: the
    same layer rotating whole heads loads."""
    from transformers import StableLmConfig
    from transformers.models.stablelm.modeling_stablelm import StableLmAttention

    def layer(factor):
        config = StableLmConfig(**{**SMALL, "partial_rotary_factor": factor})
        return StableLmAttention(config, layer_idx=0)

    with pytest.raises(ValueError, match="rotates 2 of each head's 8 features"):
        hf.from_transformers(layer(0.25), SPECS["llama3"])
    assert hf.from_transformers(layer(1.0), SPECS["llama3"]).sizes["d_r"] == 4


LLAMA3_ROPE = {  # wavelengths 6.3, 20, 63, 199: one kept (< 8), one mixed, two divided (> 32)
    "rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
}  # fmt: skip


def test_llama3_rotary_scaling_is_transformers_table():
    """llama3_scaled.attn against LlamaAttention with rope_type "llama3" and transformers' own
    table (LlamaRotaryEmbedding, computed in float32: agreement at float32's precision, measured
    2.8e-6 in the outputs; without the scaling they are 8 apart). The
    twins: factor 1 (no scaling) is caught; llama3.attn is refused by name, and so is the scaled
    spec on a layer with default RoPE."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(**{**SMALL, "rope_parameters": LLAMA3_ROPE})
    layer = randomise(LlamaAttention(config, layer_idx=0)).double().eval()
    spec = indexattn.compile_spec(ROOT / "specs/models/llama3_scaled.attn")
    x = torch.randn(B, 40, 32, dtype=torch.float64)
    positions = torch.arange(40)[None].expand(B, -1)
    cos_sin = LlamaRotaryEmbedding(config)(x, positions)
    want, _ = layer(x, position_embeddings=cos_sin, attention_mask=None)
    mask = torch.zeros(40, 40, dtype=torch.float64).masked_fill(
        torch.ones(40, 40, dtype=torch.bool).triu(1), -torch.inf
    )
    module = hf.from_transformers(layer, spec)
    assert module.scalars["original_max_position_embeddings"] == 32
    torch.testing.assert_close(module(x, positions, mask)[0], want, atol=1e-5, rtol=1e-5)
    unscaled = hf.from_transformers(layer, spec, factor=1.0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(unscaled(x, positions, mask)[0], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rope_type 'llama3', and the spec computes 'default'"):
        hf.from_transformers(layer, SPECS["llama3"])
    plain = LlamaAttention(LlamaConfig(**SMALL), layer_idx=0)
    with pytest.raises(ValueError, match="rope_type 'default', and the spec computes 'llama3'"):
        hf.from_transformers(plain, spec)


YARN_ROPE = {  # pairs of wavelengths 6.3, 20, 63, 199 over 32 positions: ramp 0, 1/2, 1, 1
    "rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
    "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
}  # fmt: skip


def test_yarn_rotary_scaling_is_transformers_table():
    """llama3_yarn.attn against LlamaAttention with rope_type "yarn" and transformers' own table
    (LlamaRotaryEmbedding: _compute_yarn_parameters' frequencies and attention factor, in
    float32, so agreement at float32's precision): one pair kept, one blended, two
    interpolated, cos and sin scaled by 0.1 log 4 + 1. The twins: factor 1 (no scaling) is
    caught; llama3.attn on a YaRN layer is refused by name, and so is an attention_factor that is
    not > 0 (tests/models/test_models_yarn.py: mscale, truncate=False, an explicit
    attention_factor)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(**{**SMALL, "rope_parameters": YARN_ROPE})
    layer = randomise(LlamaAttention(config, layer_idx=0)).double().eval()
    spec = indexattn.compile_spec(ROOT / "specs/models/llama3_yarn.attn")
    x = torch.randn(B, 40, 32, dtype=torch.float64)
    positions = torch.arange(40)[None].expand(B, -1)
    want, _ = layer(x, position_embeddings=LlamaRotaryEmbedding(config)(x, positions))
    mask = torch.zeros(40, 40, dtype=torch.float64).masked_fill(
        torch.ones(40, 40, dtype=torch.bool).triu(1), -torch.inf
    )
    module = hf.from_transformers(layer, spec)
    assert module.scalars["beta_fast"] == 32 and module.scalars["factor"] == 4
    torch.testing.assert_close(module(x, positions, mask)[0], want, atol=1e-5, rtol=1e-5)
    unscaled = hf.from_transformers(layer, spec, factor=1.0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(unscaled(x, positions, mask)[0], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rope_type 'yarn', and the spec computes 'default'"):
        hf.from_transformers(layer, SPECS["llama3"])
    for zero_or_less in (0.0, -1.0):  # no rotary table: refused by name
        rope = {**YARN_ROPE, "attention_factor": zero_or_less}
        odd = LlamaConfig(**{**SMALL, "rope_parameters": rope})
        with pytest.raises(ValueError, match=f"YaRN with attention_factor={zero_or_less}"):
            hf.from_transformers(LlamaAttention(odd, layer_idx=0), spec)


def test_a_swapped_model_compiles_to_the_same_logits():
    """torch.compile (aot_eager: dynamo's graph and AOTAutograd, no code generation) of a swapped
    model: one graph, no break (fullgraph), the same logits as the swapped model in eager. The
    twin: a weight nudged after compiling reaches the compiled model's logits."""
    model = swap(model_of("qwen2"), "qwen2")
    ids, padding = prompt()
    want = logits(model, ids, padding)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(logits(compiled, ids, padding), want, **TOL)
    with torch.no_grad():
        wrappers(model)[1].spec.q_proj_bias[0] += 1e-4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(compiled, ids, padding), want, **TOL)


def test_a_decoder_layer_s_window_is_its_own():
    """Gemma 2's decoder layers alternate sliding (0) and full (1) attention: the full layer
    is no window (inf), never the config's sliding_window; its twin, the sliding layer, is."""
    model = model_of("gemma2")
    sliding, full = model.model.layers
    assert hf.sizes_and_scalars(full, {"sliding_window"}) == {"sliding_window": float("inf")}
    assert hf.sizes_and_scalars(sliding, {"sliding_window"}) == {"sliding_window": 3}
    assert hf.sizes_and_scalars(full.self_attn, {"sliding_window"})["sliding_window"] > 1e9


def test_a_spec_scalar_no_field_is_mapped_to_is_refused_by_name():
    """gemma2.attn with its cap named `softcap` (not the config's attn_logit_softcapping) kept
    its default 50 silently; it is refused by name, and given softcap=... it is the layer's
    spec again (the twin: the same module as gemma2.attn's, output for output)."""
    layer = model_of("gemma2").model.layers[1].self_attn
    text = (ROOT / "specs/models/gemma2.attn").read_text(encoding="utf-8")
    renamed = indexattn.compile_spec(text.replace("attn_logit_softcapping", "softcap"), name="g")
    with pytest.raises(ValueError, match="declares scalar softcap, which no field"):
        hf.from_transformers(layer, renamed)
    x = torch.randn(B, N, 32, dtype=torch.float64)
    positions, mask = torch.arange(N), torch.zeros(N, N, dtype=torch.float64)
    want = hf.from_transformers(layer, SPECS["gemma2"])(x, positions, mask)[0]
    got = hf.from_transformers(layer, renamed, softcap=2.0)(x, positions, mask)[0]
    torch.testing.assert_close(got, want, **TOL)
    other = hf.from_transformers(layer, renamed, softcap=50.0)(x, positions, mask)[0]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(other, want, **TOL)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_a_shipped_spec_gets_its_shipped_decode_spec(family):
    """swap_attention(model, spec) without decode=: generate() runs the paired decode spec and
    gives the model's tokens. The twin: the same spec with one comment changed is not the
    shipped one, and gets no pairing (generate() asks for decode=)."""
    model = model_of(family)
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    _, _, name, decode = FAMILIES[family]
    hf.swap_attention(model, ROOT / f"specs/models/{name}.attn")
    assert all(w.decode.spec.name == decode for w in wrappers(model))
    tokens_swapped, steps_swapped = generate(model, ids, padding)
    assert torch.equal(tokens_swapped, tokens)
    torch.testing.assert_close(steps_swapped, steps, **TOL)
    own = (ROOT / f"specs/models/{name}.attn").read_text(encoding="utf-8") + "# mine\n"
    other = hf.swap_attention(model_of(family), indexattn.compile_spec(own, name=name))
    with pytest.raises(NotImplementedError, match="decode="):
        generate(other, ids, padding)
