"""specs/models/ for Qwen2, Qwen3, Gemma 2 and Bloom against transformers' own attention layers.

Tiny configs built here with random weights (nothing is downloaded), float64, eval, "eager"
attention. transformers computes parts of these layers in float32 whatever their dtype: the
eager softmax (softmax(..., dtype=torch.float32), Bloom's too), Qwen3's q_norm / k_norm
(Qwen3RMSNorm casts to float32), and the rotary tables (the models' RotaryEmbedding modules).
So each layer is compared twice:

- at 1e-10 (`exact`) against the same layer with those upcasts removed: the softmax and
  Qwen3RMSNorm monkeypatched to keep float64, and the rotary table computed in float64 and
  handed in as position_embeddings (models_common.rotary), as transformers' own formula;
- at `ITS_OWN` (1e-5; the outputs differ by 3e-7 to 8e-7) against the layer as it is, with the
  rotary table from the model's own RotaryEmbedding module.

Bloom's ALiBi tensor is made by transformers' build_alibi_tensor in both: its slopes are
computed in float32, exact for the head counts tested here (4 and 6: every slope a power of
two); the spec computes them itself in float64.
"""

from types import SimpleNamespace

import pytest
import torch
from models_common import ROOT, TOL, B, _ascii, causal_mask, logits, randomise, rotary

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import BloomConfig, Gemma2Config, Qwen2Config, Qwen3Config  # noqa: E402
from transformers.models.bloom import modeling_bloom  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

ITS_OWN = {"atol": 1e-5, "rtol": 0}
N = 8  # longer than the sliding window below
WINDOW = 3

SPECS = {
    name: indexattn.compile_spec(ROOT / f"specs/models/{name}.attn")
    for name in ("qwen2", "qwen3", "gemma2", "gemma2_sliding", "bloom")
}
LAYERS = {
    "qwen2": modeling_qwen2.Qwen2Attention,
    "qwen3": modeling_qwen3.Qwen3Attention,
    "gemma2": modeling_gemma2.Gemma2Attention,
    "gemma2_sliding": modeling_gemma2.Gemma2Attention,
}


ROTARY = {  # the rotary table as each model makes it, in float32
    "qwen2": modeling_qwen2.Qwen2RotaryEmbedding,
    "qwen3": modeling_qwen3.Qwen3RotaryEmbedding,
    "gemma2": modeling_gemma2.Gemma2RotaryEmbedding,
    "gemma2_sliding": modeling_gemma2.Gemma2RotaryEmbedding,
}

SMALL = {"vocab_size": 40, "num_hidden_layers": 2, "attn_implementation": "eager"}


def qwen2_config():
    return Qwen2Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **SMALL,
    )  # fmt: skip


def qwen3_config():  # head_dim 16 is not hidden_size / heads = 8, as in the real Qwen3
    return Qwen3Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-3, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        **SMALL,
    )  # fmt: skip


def gemma2_config():  # query_pre_attn_scalar is not head_dim; a cap that bites the scores
    return Gemma2Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        sliding_window=WINDOW, **SMALL,
    )  # fmt: skip


def bloom_config(heads):
    return BloomConfig(hidden_size=24, n_head=heads, **SMALL)


def window(mask):
    """The mask transformers hands a sliding layer: key τ' hidden unless τ - WINDOW < τ'."""
    far = torch.ones(N, N, dtype=torch.bool).tril(-WINDOW)
    return mask.masked_fill(far, torch.finfo(mask.dtype).min)


def positions():
    return torch.tensor([list(range(N)), list(range(3, 3 + N))])  # batch 1 starts at 3


def rotary_case(name, config, layer_idx, exact):
    """A rotary family's layer, the inputs, and how to call it and the spec's module."""
    layer = randomise(LAYERS[name](config, layer_idx=layer_idx)).double().eval()
    assert (layer.sliding_window is not None) == (name == "gemma2_sliding"), "layer_types"
    x = torch.randn(B, N, config.hidden_size, dtype=torch.float64, requires_grad=True)
    ids, mask = positions(), causal_mask(N, {1: 4})[:, 0]
    if exact:
        cos_sin = rotary(ids, layer.head_dim, config.rope_parameters["rope_theta"])
    else:
        cos_sin = ROTARY[name](config)(x, ids)
    theirs_mask = window(mask) if name == "gemma2_sliding" else mask

    def theirs():
        return layer(x, position_embeddings=cos_sin, attention_mask=theirs_mask[:, None])

    return SimpleNamespace(
        layer=layer, spec=SPECS[name], leaves=[x], mask=mask, theirs=theirs, config=config,
        ours=lambda module, m: module(x, ids, m),
    )  # fmt: skip


def bloom_case(heads):
    """Bloom with a key hidden in the middle of batch 1, so that its keys' ALiBi positions
    (counted over unpadded tokens) are not their indices."""
    config = bloom_config(heads)
    layer = randomise(modeling_bloom.BloomAttention(config, layer_idx=0))
    layer = layer.double().eval()
    x, residual = (torch.randn(B, N, 24, dtype=torch.float64, requires_grad=True) for _ in "xr")
    padding = torch.ones(B, N, dtype=torch.long)
    padding[1, 2] = 0
    mask = causal_mask(N, {1: 2})[:, 0]
    alibi = modeling_bloom.build_alibi_tensor(padding, heads, torch.float64)
    ids = (padding.cumsum(-1) - 1) * padding

    def theirs():
        return layer(x, residual, alibi, mask[:, None])

    return SimpleNamespace(
        layer=layer, spec=SPECS["bloom"], leaves=[x, residual], mask=mask, theirs=theirs,
        config=config,
        ours=lambda module, m, p=ids: module(x, residual, p, m),
    )  # fmt: skip


CASES = {
    "qwen2": lambda exact: rotary_case("qwen2", qwen2_config(), 0, exact),
    "qwen3": lambda exact: rotary_case("qwen3", qwen3_config(), 0, exact),
    "gemma2": lambda exact: rotary_case("gemma2", gemma2_config(), 1, exact),
    "gemma2_sliding": lambda exact: rotary_case("gemma2_sliding", gemma2_config(), 0, exact),
    "bloom_4_heads": lambda exact: bloom_case(4),  # Bloom has no rotary table
    "bloom_6_heads": lambda exact: bloom_case(6),
}


@pytest.fixture
def float64_layers(monkeypatch):
    """transformers' layers without their float32 upcasts: the softmax and Qwen3's RMSNorm."""
    softmax = torch.nn.functional.softmax

    def softmax_as_is(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, **kw)

    def rms_norm(self, x):
        mean_square = x.pow(2).mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(mean_square + self.variance_epsilon)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_as_is)
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", rms_norm)


def load(case, **given):
    """The spec's module with the case's layer's weights (from_transformers)."""
    return hf.from_transformers(case.layer, case.spec, config=case.config, **given)


def compare(case, module, mask, tol):
    """Outputs, attention weights, and gradients of a random loss to the inputs and every
    weight: the spec's module against the transformers layer."""
    y, a, *_ = case.ours(module, mask)
    y_hf, a_hf = case.theirs()
    torch.testing.assert_close(y, y_hf, **tol)
    torch.testing.assert_close(a.reshape(a_hf.shape), a_hf, **tol)
    probe = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    params = dict(module.named_parameters())
    names, weights = zip(*case.layer.named_parameters())
    mine = [params[_ascii(n)] for n in names]
    ours = torch.autograd.grad((y * probe).sum(), [*case.leaves, *mine])
    theirs = torch.autograd.grad((y_hf * probe).sum(), [*case.leaves, *weights])
    labels = [f"input {k}" for k in range(len(case.leaves))] + list(names)
    assert len(ours) == len(theirs) == len(labels)
    for label, g, g_hf in zip(labels, ours, theirs):
        torch.testing.assert_close(g, g_hf, **tol, msg=lambda m, n=label: f"{n}: {m}")


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_transformers_layer_without_its_upcasts(name, float64_layers):
    case = CASES[name](exact=True)
    module = load(case)
    assert sorted(dict(module.named_parameters())) == sorted(
        _ascii(k) for k, _ in case.layer.named_parameters()
    )
    compare(case, module, case.mask, TOL)


@pytest.mark.parametrize("name", CASES)
def test_spec_is_the_transformers_layer_at_its_own_precision(name):
    case = CASES[name](exact=False)
    compare(case, load(case), case.mask, ITS_OWN)


@pytest.mark.parametrize("name", CASES)
def test_one_perturbed_weight_is_caught(name, float64_layers):
    """The twin: the same comparison fails when one weight of the spec's copy is nudged."""
    case = CASES[name](exact=True)
    module = load(case)
    with torch.no_grad():
        next(iter(module.parameters())).view(-1)[0] += 1e-6
    with pytest.raises(AssertionError):
        compare(case, module, case.mask, TOL)


@pytest.mark.parametrize("name", CASES)
def test_one_flipped_mask_bit_is_caught(name, float64_layers):
    """The twin of the mask: hiding one more key (batch 0, query N - 1, key N - 2) is caught."""
    case = CASES[name](exact=True)
    mask = case.mask.clone()
    mask[0, N - 1, N - 2] = -torch.inf
    with pytest.raises(AssertionError):
        compare(case, load(case), mask, TOL)


def test_a_window_one_wider_is_caught(float64_layers):
    """The sliding layer's twin: the spec computes the window itself (it is given the mask
    without one), so a window of WINDOW + 1 keys differs from transformers'."""
    case = CASES["gemma2_sliding"](exact=True)
    module = load(case, sliding_window=WINDOW + 1)
    with pytest.raises(AssertionError):
        compare(case, module, case.mask, TOL)


def test_bloom_keys_at_their_indices_are_caught(float64_layers):
    """The twin of Bloom's positions: with a key padded in the middle, the key positions
    counted over unpadded tokens are not the indices 0..N-1, and the spec sees the difference."""
    case = CASES["bloom_6_heads"](exact=True)
    y = case.ours(load(case), case.mask, torch.arange(N))[0]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y, case.theirs()[0], **TOL)


# --- the ALiBi slopes at the real head counts ------------------------------------------------


@pytest.mark.parametrize("heads", [6, 12, 16, 112])  # 112: Bloom-176B
def test_alibi_slopes_are_build_alibi_tensors(heads):
    """The spec's slopes, computed in float64, against transformers' (computed in float32)."""
    slopes = SPECS["bloom"].constants_function(heads, device="cpu", dtype=torch.float64)[0]
    theirs = modeling_bloom._get_alibi_slopes(heads, "cpu").double()
    torch.testing.assert_close(slopes, theirs, atol=0, rtol=1e-6)


def test_the_papers_slopes_are_not_blooms_for_112_heads():
    """The twin: ALiBi's 2^(-8 (μ + 1) / h) (specs/alibi.attn) differs from Bloom's at a head
    count that is not a power of two."""
    paper = 2.0 ** (-8 * (torch.arange(112, dtype=torch.float64) + 1) / 112)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(paper, modeling_bloom._get_alibi_slopes(112, "cpu").double())


# --- parameters at the real models' sizes -----------------------------------------------------

REAL = {  # sizes of the published configs (the checkpoints' config.json, from memory)
    "qwen2": (  # Qwen2-7B
        modeling_qwen2.Qwen2Attention,
        Qwen2Config(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4),
    ),
    "qwen3": (  # Qwen3-8B
        modeling_qwen3.Qwen3Attention,
        Qwen3Config(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    ),
    "gemma2": (  # Gemma-2-9B
        modeling_gemma2.Gemma2Attention,
        Gemma2Config(hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256),
    ),
    "bloom": (  # Bloom-176B
        modeling_bloom.BloomAttention,
        BloomConfig(hidden_size=14336, n_head=112),
    ),
}
REAL["gemma2_sliding"] = REAL["gemma2"]


def counts(name):
    """The spec's parameter count at the real size, and the layer's, built on the meta device."""
    layer_class, config = REAL[name]
    with torch.device("meta"):
        layer = layer_class(config, layer_idx=0)
    count = SPECS[name].param_count()
    sizes = hf.sizes_and_scalars(layer, {str(s) for s in count.free_symbols}, config)
    ours = count.subs({s: sizes[str(s)] for s in count.free_symbols})
    return ours, sizes, sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("name", REAL)
def test_param_count_at_the_real_size_is_the_layers(name):
    ours, _, theirs = counts(name)
    assert ours == theirs


def test_param_count_without_one_bias_differs():
    """The twin: Qwen2's count without its key bias (h_kv d_k numbers) is not the layer's."""
    ours, sizes, theirs = counts("qwen2")
    assert ours - sizes["h_kv"] * 2 * sizes["d_r"] != theirs


# --- whole models, every attention layer swapped ---------------------------------------------


def qwen_model(name):
    """A tiny 2-layer Qwen2 or Qwen3, float64, with a float64 rotary table (transformers
    computes it in float32) of its own head width."""
    config = {"qwen2": qwen2_config, "qwen3": qwen3_config}[name]()
    torch.manual_seed(0)
    model = getattr(transformers, f"{name.capitalize()}ForCausalLM")(config)
    model = randomise(model).double().eval()
    d_k = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]
    model.model.rotary_emb.forward = lambda x, position_ids: rotary(position_ids, d_k, theta)
    return model


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_swapped_qwen_gives_the_same_logits(name, float64_layers):
    """Every layer's attention swapped for the spec: the same logits from a left-padded batch
    (softmax and Qwen3's norms in float64, as in the layer tests); a nudged weight is caught."""
    model = qwen_model(name)
    ids = torch.randint(0, 40, (B, 6), generator=torch.Generator().manual_seed(2))
    padding = torch.ones(B, 6, dtype=torch.long)
    padding[1, :2] = 0
    before = logits(model, ids, padding)
    hf.swap_attention(model, ROOT / f"specs/models/{name}.attn")
    assert sum(isinstance(m, hf.SpecAttention) for m in model.modules()) == 2
    torch.testing.assert_close(logits(model, ids, padding), before, **TOL)
    swapped = next(m for m in model.modules() if isinstance(m, hf.SpecAttention))
    with torch.no_grad():
        swapped.spec.q_proj_weight[0, 0] += 1e-4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(logits(model, ids, padding), before, **TOL)
