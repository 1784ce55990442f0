"""Whole decoder layers in specs/layers/ against transformers' own decoder layers.

Tiny configs built here, every weight random (norm weights included, so that a norm read with
the wrong weight shows), float64, eval, nothing downloaded. Each layer is handed rotary tables
computed in float64 (the models' rotary modules compute them in float32) and its RMSNorms run
in the input's dtype (LlamaRMSNorm and Gemma2RMSNorm cast to float32 and back); Llama runs
transformers' "sdpa" attention, which keeps float64 (its eager path takes the softmax in
float32), Gemma 2 its eager attention with the soft cap, its softmax's upcast to float32 taken
out (`float64_softmax`). So outputs and the gradients of the
input and of every weight agree to 1e-10. As transformers ships them (norms through float32),
the layers agree within a float32 tolerance.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

from transformers import Gemma2Config, LlamaConfig  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

ROOT = Path(__file__).resolve().parents[2]
TOL = {"atol": 1e-10, "rtol": 0}
B, N = 2, 7


def llama():
    config = LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
        attn_implementation="sdpa",
    )  # fmt: skip
    return SimpleNamespace(config=config, layer=LlamaDecoderLayer(config, layer_idx=0), one=0.0)


def gemma2():  # query_pre_attn_scalar is not head_dim; a cap that bites the scores
    config = Gemma2Config(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=2.0, rms_norm_eps=1e-4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager",
    )  # fmt: skip
    layer = Gemma2DecoderLayer(config, layer_idx=1)  # a full_attention layer
    assert layer.self_attn.sliding_window is None
    return SimpleNamespace(config=config, layer=layer, one=1.0)  # Gemma's norms: (1 + w)


FAMILIES = {"llama": llama, "gemma2": gemma2}
SPECS = {name: indexattn.compile_spec(ROOT / f"specs/layers/{name}.attn") for name in FAMILIES}


def float64_norms(layer, one: float):
    """Every RMSNorm's forward without its cast to float32: x / rms(x) times (one + w)."""
    for norm in layer.modules():
        if type(norm).__name__.endswith("RMSNorm"):
            eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))

            def forward(x, norm=norm, eps=eps):
                rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
                return (one + norm.weight) * (x * rms)

            norm.forward = forward


@pytest.fixture
def float64_softmax(monkeypatch):
    """The eager attention's softmax(..., dtype=torch.float32) kept in the input's dtype."""
    softmax = torch.nn.functional.softmax

    def softmax_as_is(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, **kw)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_as_is)


def case(name: str, exact: bool = True, seed: int = 0):
    family = FAMILIES[name]()
    layer = family.layer.double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in layer.named_parameters():
            mean = 1.0 - family.one if "norm" in key else 0.0  # norms near 1, projections near 0
            p.copy_(mean + 0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    if exact:
        float64_norms(layer, family.one)
    module = hf.from_transformers(layer, SPECS[name], d_ff=family.config.intermediate_size)
    return family.config, layer, module


def inputs(width: int):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, N, width, dtype=torch.float64, generator=gen, requires_grad=True)
    positions = torch.tensor([list(range(N)), list(range(5, 5 + N))])  # batch 1 starts at 5
    mask = torch.zeros(B, 1, N, N, dtype=torch.float64)
    mask.masked_fill_(torch.ones(N, N, dtype=torch.bool).triu(1), -torch.inf)
    mask[1, :, :, 3] = torch.finfo(torch.float64).min  # one padded key in batch 1
    return x, positions, mask


def float64_rotary(positions, head_dim: int, theta: float):
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[..., None].double() * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def theirs(config, layer, x, positions, mask):
    theta = config.rope_parameters["rope_theta"]
    cos_sin = float64_rotary(positions, layer.self_attn.head_dim, theta)
    return layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)


def gradients(y, wrt):
    probe = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(2))
    return torch.autograd.grad((y * probe).sum(), wrt)


@pytest.mark.usefixtures("float64_softmax")
@pytest.mark.parametrize("name", FAMILIES)
def test_layer_is_transformers_decoder_layer(name):
    config, layer, module = case(name)
    x, positions, mask = inputs(config.hidden_size)
    ours, reference = module(x, positions, mask[:, 0]), theirs(config, layer, x, positions, mask)
    torch.testing.assert_close(ours, reference, **TOL)
    params = dict(module.named_parameters())
    names, weights = zip(*layer.named_parameters())
    assert sorted(params) == sorted(n.replace(".", "_") for n in names)
    mine = gradients(ours, [x, *(params[n.replace(".", "_")] for n in names)])
    expected = gradients(reference, [x, *weights])
    for key, g, g_ref in zip(["input", *names], mine, expected, strict=True):
        torch.testing.assert_close(g, g_ref, **TOL, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_as_transformers_ships_it(name):
    """With the norms' float32 round trip the layer is near, not equal: within float32."""
    config, layer, module = case(name, exact=False)
    x, positions, mask = inputs(config.hidden_size)
    ours, reference = module(x, positions, mask[:, 0]), theirs(config, layer, x, positions, mask)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert (ours - reference).abs().max() > 1e-10  # the float32 round trip is visible


NUDGES = ["post_attention_layernorm_weight", "rms_norm_eps", "positions", "mask"]


@pytest.mark.usefixtures("float64_softmax")
@pytest.mark.parametrize("nudge", NUDGES)
@pytest.mark.parametrize("name", FAMILIES)
def test_layer_twin_sees_one_change(name, nudge):
    """Each twin changes one thing the layer reads (the second norm's weight, the epsilon, one
    token's position, one mask bit) on the spec's side only; the outputs must then differ."""
    config, layer, module = case(name)
    x, positions, mask = inputs(config.hidden_size)
    reference = theirs(config, layer, x, positions, mask)
    if nudge == "rms_norm_eps":
        eps = 10 * config.rms_norm_eps
        module = hf.from_transformers(
            layer, SPECS[name], d_ff=config.intermediate_size, rms_norm_eps=eps
        )
    elif nudge == "positions":
        positions = positions.clone()
        positions[0, 3] += 1
    elif nudge == "mask":
        mask = mask.clone()
        mask[0, :, 5, 2] = -torch.inf  # query 5 no longer sees key 2
    else:
        with torch.no_grad():
            getattr(module, nudge)[0] += 0.1
    ours = module(x, positions, mask[:, 0])
    assert (ours - reference).abs().max() > 1e-6


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_spec_equals_the_literal_reading(name):
    from indexattn.oracle import verify

    for batch in ((), (2,)):
        assert verify.compare(SPECS[name], batch=batch).ok


REAL = {  # Llama-3-8B and Gemma-2-9B, one decoder layer each
    "llama": (
        LlamaDecoderLayer,
        LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8),
    ),
    "gemma2": (
        Gemma2DecoderLayer,
        Gemma2Config(hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=256),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_parameter_count_at_the_real_size(name):
    """spec.param_count() at the real model's sizes is the layer's, built on the meta device."""
    cls, config = REAL[name]
    with torch.device("meta"):
        layer = cls(config, layer_idx=1)
    sizes = hf.sizes_and_scalars(layer.self_attn, {str(s) for s in SPECS[name].sizes}, config)
    sizes["d_ff"] = config.intermediate_size
    count = (
        SPECS[name]
        .param_count()
        .subs({s: sizes[str(s)] for s in SPECS[name].sizes if str(s) in sizes})
    )
    assert count == sum(p.numel() for p in layer.parameters())
    assert count != sum(p.numel() for p in layer.self_attn.parameters())  # the twin: attention only
