"""What the model tests share (tests/models/test_family_*.py, tests/models/test_models*.py): random
weights, transformers' masks and rotary tables in float64, the spec-against-layer comparison
(`Case`, `compare`), a whole model's logits, and the tests every family's attention layers take
(`LayerTests`, `OwnPrecisionTests`, `CachedKeysAndValuesTests`: docs/testing.md, "Model
families").

Not a test file: pytest puts tests/ on the path (rootdir-relative imports), so the test files
import it as `models_common`. Nothing here imports transformers at import time: the tests
that need it import it when they run, after their file's importorskip.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

import indexattn
from indexattn.views.cost import evaluate

ROOT = Path(__file__).parent.parent
TOL = {"atol": 1e-10, "rtol": 0}
B = 2


def randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every weight and bias random, so that no zero bias hides a layout mistake."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return module


def hidden(n: int, width: int, seed: int = 5) -> torch.Tensor:
    """A batch of B random inputs of n tokens, float64, taking gradients; the same on every run
    whatever ran before (a generator of its own)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, width, dtype=torch.float64, generator=gen).requires_grad_()


def causal_mask(n: int, padded: dict) -> torch.Tensor:
    """transformers' 4D additive mask [B, 1, N, N]: causal, and key t of batch b hidden for each
    (b, t) in `padded` (never key 0, so that no query row is hidden everywhere)."""
    mask = torch.zeros(B, 1, n, n, dtype=torch.float64)
    mask.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    for b, t in padded.items():
        mask[b, :, :, t] = torch.finfo(torch.float64).min
    return mask


def padding_mask(n: int, padded: dict) -> torch.Tensor:
    """An extended additive padding mask [B, 1, 1, N]: key t of batch b hidden for each (b, t)
    in `padded`, by the dtype's minimum, as BERT's and T5's models build it."""
    mask = torch.zeros(B, 1, 1, n, dtype=torch.float64)
    for b, t in padded.items():
        mask[b, ..., t] = torch.finfo(torch.float64).min
    return mask


def rotary(positions: torch.Tensor, d_k: int, theta: float):
    """cos and sin as transformers' LlamaRotaryEmbedding makes them, but in float64."""
    inv_freq = theta ** -(torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    freqs = positions[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def float64_rotary(model):
    """Give a Llama-like model the float64 rotary table: transformers computes it in float32."""
    config = model.config
    d_k = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def forward(x, position_ids):
        return rotary(position_ids, d_k, config.rope_parameters["rope_theta"])

    model.model.rotary_emb.forward = forward
    return model


def float64_rms_norm(norm):
    """DeepseekV3RMSNorm without its float32 upcast: the same formula, in the input's dtype."""

    def forward(x):
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * x * rms

    norm.forward = forward
    return norm


def _ascii(key: str) -> str:
    """A transformers state_dict key as the spec's parameter name: dots become underscores."""
    return key.replace(".", "_")


def compare(case: "Case", module, tol=TOL, mask=None) -> None:
    """Outputs, attention weights (where the layer returns them), and gradients of a random loss
    to every input and every weight: the spec's module against the transformers layer, within
    `tol`; the spec given `mask` in place of the case's own."""
    y, a, *_ = case.ours(module, case.mask if mask is None else mask)
    y_hf, a_hf = case.theirs()
    torch.testing.assert_close(y, y_hf, **tol)
    if a_hf is not None:  # sdpa returns no weights
        torch.testing.assert_close(a.reshape(a_hf.shape), a_hf, **tol)
    probe = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    params = dict(module.named_parameters())
    names, weights = zip(*case.layer.named_parameters())
    mine = [params[_ascii(n)] for n in names]
    ours = torch.autograd.grad((y * probe).sum(), [*case.leaves, *mine])
    theirs = torch.autograd.grad((y_hf * probe).sum(), [*case.leaves, *weights])
    labels = [f"input {k}" for k in range(len(case.leaves))] + list(names)
    assert len(ours) == len(theirs) == len(labels)
    for label, g, g_hf in zip(labels, ours, theirs, strict=True):
        torch.testing.assert_close(g, g_hf, **tol, msg=lambda m, n=label: f"{n}: {m}")


def logits(model, ids, padding):
    """A whole model's logits, the cache off."""
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=padding, use_cache=False).logits


@cache
def spec(name: str):
    """specs/models/<name>.attn, compiled once."""
    return indexattn.compile_spec(ROOT / "specs" / "models" / f"{name}.attn")


@dataclass(frozen=True)
class Case:
    """One transformers attention layer and its spec, and how to call both on the same inputs:
    `ours(module, mask)` gives the spec's module's outputs (output, weights, then the keys and
    values where the spec returns them), `theirs(**kw)` the layer's output and weights (None
    where it returns none), the keywords handed on to the layer (past_key_values)."""

    layer: nn.Module
    spec: object  # a compiled spec
    leaves: tuple  # the inputs whose gradients are compared
    mask: torch.Tensor  # the additive mask the spec is given
    ours: Callable
    theirs: Callable
    given: dict = field(default_factory=dict)  # from_transformers' keywords (config=)

    def module(self, **given):
        """The spec's module holding a copy of the layer's weights (from_transformers)."""
        from indexattn.transformers import from_transformers

        return from_transformers(self.layer, self.spec, **{**self.given, **given})


def shifted(n: int) -> torch.Tensor:
    """The positions of a batch of two sequences of n tokens, the second starting at 3."""
    return torch.tensor([list(range(n)), list(range(3, 3 + n))])


def rotary_case(
    layer, name: str, x, mask, embedding, exact=True, d_r=None, layer_mask=None, **keywords
) -> Case:
    """A layer handed its rotary table, as Llama's and most families since: the spec given x,
    the positions (`shifted`) and the additive mask `mask` (no head axis); the layer x, cos and
    sin as position_embeddings, `layer_mask` (by default `mask` with its head axis) and
    `keywords`. cos and sin: exact, computed in float64 (`rotary`) at the config's rope_theta
    over d_r features (by default the head's), as wide as the model's own rotary module class
    `embedding` makes them; else by that module (its table in float32)."""
    positions = shifted(x.shape[-2])
    cos_sin = embedding(layer.config)(x, positions)
    if exact:
        theta = layer.config.rope_parameters["rope_theta"]
        width = cos_sin[0].shape[-1]  # GPT-OSS's table is half of rotary's: one of its halves
        cos_sin = [t[..., :width] for t in rotary(positions, d_r or layer.head_dim, theta)]
    layer_mask = mask[:, None] if layer_mask is None else layer_mask

    def theirs(**kw):
        return layer(x, position_embeddings=cos_sin, attention_mask=layer_mask, **keywords, **kw)

    return Case(layer, spec(name), (x,), mask, lambda module, m: module(x, positions, m), theirs)


def nudged(module, by: float):
    """The module with the first number of its first weight moved by `by`."""
    with torch.no_grad():
        next(iter(module.parameters())).view(-1)[0] += by
    return module


def count_at(compiled, layer, config, plus: int = 0) -> int:
    """The spec's param_count() at the sizes from_transformers reads off the layer (+ plus)."""
    from indexattn.transformers import sizes_and_scalars

    known = sizes_and_scalars(layer, {str(s) for s in compiled.sizes}, config)
    sizes = {s: known[str(s)] + plus for s in compiled.sizes if str(s) in known}
    return evaluate(compiled.param_count(), sizes)


class LayerTests:
    """What every family's attention layers are tested for (tests/models/test_family_*.py subclass
    it, one Test<Family> class a family): the spec's module against the transformers layer holding
    the same weights, at 1e-10 in float64 (`case(name)`: the layer with its float32 steps
    taken out), with its twins, one weight nudged and one mask bit flipped; the parameter count
    at a real model's sizes, with its twin, every size one larger.

    A subclass sets CASES (the layers, by name), REAL (name: spec, layer class, config, the
    layer's keywords; the layer at its real sizes, built on the meta device) and `case`.
    """

    CASES: tuple = ()
    REAL: ClassVar[dict] = {}
    QUOTED: ClassVar[dict] = {}  # name: the parameter count docs/models.md quotes
    PARAMETERS = (("name", "CASES"), ("real", "REAL"), ("own", "OWN"), ("cached", "CACHED"))

    def case(self, name: str, exact: bool = True) -> Case:
        """The layer `name` and its inputs; exact=False: the layer as transformers ships it."""
        raise NotImplementedError(type(self).__name__)

    def pytest_generate_tests(self, metafunc):
        for arg, attribute in self.PARAMETERS:
            if arg in metafunc.fixturenames:
                metafunc.parametrize(arg, getattr(self, attribute))

    @pytest.fixture
    def float64_softmax(self, monkeypatch):
        """transformers' eager softmax without its upcast (softmax(..., dtype=torch.float32))."""
        softmax = torch.nn.functional.softmax

        def softmax_as_is(x, dim=None, dtype=None, **kw):
            return softmax(x, dim=dim, **kw)

        monkeypatch.setattr(torch.nn.functional, "softmax", softmax_as_is)

    def test_spec_is_the_transformers_layer(self, name, float64_softmax):
        case = self.case(name)
        module = case.module()
        assert sorted(dict(module.named_parameters())) == sorted(
            _ascii(k) for k, _ in case.layer.named_parameters()
        )
        compare(case, module)

    def test_one_perturbed_weight_is_caught(self, name, float64_softmax):
        """The twin: the same comparison fails when one weight of the spec's copy is nudged."""
        case = self.case(name)
        with pytest.raises(AssertionError):
            compare(case, nudged(case.module(), 1e-6))

    def test_one_flipped_mask_bit_is_caught(self, name, float64_softmax):
        """The twin of the mask: key 3 of batch 0 hidden from the spec alone is seen."""
        case = self.case(name)
        flipped = case.mask.clone()
        flipped[0, ..., 3] = torch.finfo(flipped.dtype).min
        with pytest.raises(AssertionError):
            compare(case, case.module(), mask=flipped)

    def test_param_count_at_the_real_size_is_the_layers(self, real):
        """param_count() at the sizes read off the layer built at the real model's sizes on the
        meta device (no memory), and its twin: every size one larger gives another count."""
        name, layer_class, config, keywords = self.REAL[real]
        with torch.device("meta"):
            layer = layer_class(config, **keywords)
        numel = sum(p.numel() for p in layer.parameters())
        assert count_at(spec(name), layer, config) == numel == self.QUOTED.get(real, numel)
        assert count_at(spec(name), layer, config, plus=1) != numel


class OwnPrecisionTests:
    """For layers that compute in float32 inside whatever their dtype (an eager softmax in
    float32, RMSNorm upcasts, rotary tables in float32): the layer as transformers ships it
    (`case(name, exact=False)`) agrees within OWN_ATOL, and not within 1e-10; a weight nudged by
    1e-3 is caught at OWN_ATOL."""

    OWN: tuple = ()
    OWN_ATOL = 1e-4  # measured: 3e-7 to 1.6e-5 (gradients up to ~120 rounded at float32's 1.2e-7)

    def test_spec_is_the_layer_at_its_own_precision(self, own):
        case = self.case(own, exact=False)
        module = case.module()
        compare(case, module, {"atol": self.OWN_ATOL, "rtol": 0})
        with pytest.raises(AssertionError):  # the float32 inside is real
            compare(case, module)

    def test_one_perturbed_weight_is_caught_at_its_own_precision(self, own):
        case = self.case(own, exact=False)
        with pytest.raises(AssertionError):
            compare(case, nudged(case.module(), 1e-3), {"atol": self.OWN_ATOL, "rtol": 0})


class CachedKeysAndValuesTests:
    """For the layers generate() runs through a decode spec: the keys and values the spec
    returns are those the layer puts in transformers' DynamicCache."""

    CACHED: tuple = ()

    def test_spec_returns_the_keys_and_values_transformers_caches(self, cached):
        from transformers import DynamicCache

        case = self.case(cached)
        cache = DynamicCache(config=case.layer.config)
        *_, k, v = case.ours(case.module(), case.mask)
        case.theirs(past_key_values=cache)
        torch.testing.assert_close(k.flatten(3) if k.dim() == 5 else k, cache.layers[0].keys, **TOL)
        torch.testing.assert_close(v, cache.layers[0].values, **TOL)
