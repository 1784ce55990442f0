"""The whole-layer swap: a transformers model's attention layers replaced by specs' modules.

>>> swap_attention(model, "specs/models/gpt2.attn")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..runtime import CompiledSpec
from ..spec import compile_spec
from .attention import shipped
from .weights import from_transformers


def additive_mask(mask: torch.Tensor | None, like: torch.Tensor, n_keys: int) -> torch.Tensor:
    """transformers' attention_mask as the specs take it: additive, without the head axis.

    The model hands its layers a 4D mask `[batch, 1, queries, keys]`, float (0 keeps, the
    dtype's minimum hides), boolean (True keeps), or None where sdpa may skip a causal mask.
    """
    n = like.shape[-2]
    if mask is None:
        above = torch.ones(n, n_keys, dtype=torch.bool, device=like.device).triu(n_keys - n + 1)
        return torch.zeros(n, n_keys, dtype=like.dtype, device=like.device).masked_fill(
            above, -torch.inf
        )
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=like.dtype, device=like.device).masked_fill(
            ~mask, -torch.inf
        )
    return mask[:, 0].to(like.dtype)


KNOWN = {  # keywords a wrapped layer accepts beside its inputs, and why each is safe to take
    "position_ids": "the rotary angles' positions (Llama's family); GPT-2 has none",
    "position_embeddings": "the cos and sin of position_ids: the spec computes them",
    "use_cache": "the cache is used whenever the model hands one",
    "cache_position": "the cache's length tells the new tokens' place",
    "output_attentions": "the weights are returned whenever the spec outputs them",
}


class SpecAttention(nn.Module):
    """A transformers attention layer whose work is done by a spec's module, and with a key/value
    cache by a decode spec's module sharing its parameters: the cache's first step (the prompt) runs
    the layer's spec, which also returns the keys and values to keep; each later step runs the
    decode spec on the cached ones.

    Its state_dict holds the layer's own keys (`q_proj.weight`), once: a swapped model saves a
    checkpoint the unswapped model loads. The layer itself is kept, holding the same parameters,
    for `unswap_attention`."""

    def __init__(self, layer: nn.Module, spec: CompiledSpec, decode: CompiledSpec | None) -> None:
        super().__init__()
        _refuse_dropout(layer)
        self.spec = from_transformers(layer, spec)
        self.decode = None
        if decode is not None:  # one set of weights: the decode module holds the spec module's
            declared = {s for s, _ in decode.plain.scalars}
            scalars = {k: v for k, v in self.spec.scalars.items() if k in declared}
            self.decode = decode.module(**self.spec.sizes, **scalars)
            self.decode._parameters.update(self.spec._parameters)
        self.config = layer.config
        self.layer_idx = layer.layer_idx
        self.keys = {key: key.replace(".", "_") for key in layer.state_dict()}  # layer -> spec
        self.__dict__["layer"] = _sharing(layer, self.spec)  # not a submodule: saved once
        self.register_state_dict_post_hook(_layer_keys)
        self.register_load_state_dict_pre_hook(_spec_keys)

    def train(self, mode: bool = True):
        _refuse_dropout(self.layer, mode)
        return super().train(mode)

    def _cache(self, past_key_values, cache, kwargs: dict):
        """The layer's cache, by either name (transformers 5.24 renamed past_key_values to
        cache); a keyword the wrapper does not know is an error naming it."""
        unknown = sorted(kwargs.keys() - KNOWN.keys())
        if unknown:
            raise TypeError(
                f"{type(self).__name__} (swapped {type(self.layer).__name__}) got"
                f" {', '.join(unknown)}, which it does not know: this transformers passes"
                " more than the swap reads; use attn_implementation='indexattn' instead"
            )
        if past_key_values is not None and cache is not None:
            raise TypeError(f"{type(self).__name__} got both past_key_values and cache")
        return cache if past_key_values is None else past_key_values

    def _cached(self, cache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached keys and values of this layer, or None before the first step."""
        if cache is None or cache.get_seq_length(self.layer_idx) == 0:
            return None
        if self.decode is None:
            raise NotImplementedError(
                "a key/value cache needs swap_attention(model, spec, decode=...) (a shipped"
                " model spec gets its shipped decode spec by default), or call the model with"
                " use_cache=False"
            )
        layer = cache.layers[self.layer_idx]
        return layer.keys, layer.values

    def _keep(self, cache, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        """Append the new tokens' keys and values [batch, heads, n, d_k] to the cache."""
        if cache is not None:
            cache.update(keys[..., -n:, :], values[..., -n:, :], self.layer_idx)


def _refuse_dropout(layer: nn.Module, training: bool | None = None) -> None:
    """A layer with attention dropout in training: the layer specs declare none."""
    training = layer.training if training is None else training
    names = ("attention_dropout", "attn_pdrop")  # Llama's family, GPT-2
    p = next((getattr(layer.config, n) for n in names if hasattr(layer.config, n)), 0)
    if training and p:
        raise NotImplementedError(
            f"{type(layer).__name__} has attention dropout {p} in training, and the layer specs"
            " declare none: call model.eval(), set the config's attention dropout to 0, or"
            " use attn_implementation='indexattn' (its core spec applies dropout)"
        )


def _sharing(layer: nn.Module, module: nn.Module) -> nn.Module:
    """The layer, its parameters replaced by the spec module's (one copy of the weights)."""
    for key in layer.state_dict(keep_vars=True):
        name = key.replace(".", "_")
        if name in module._parameters:
            owner, _, attr = key.rpartition(".")
            layer.get_submodule(owner)._parameters[attr] = module._parameters[name]
    return layer


def _layer_keys(wrapper: SpecAttention, state: dict, prefix: str, metadata) -> None:
    """state_dict hook: the spec's and decode's keys become the layer's own, once."""
    for name in [k for k in state if k.startswith((prefix + "spec.", prefix + "decode."))]:
        del state[name]
    for key, name in wrapper.keys.items():
        state[prefix + key] = wrapper.spec.state_dict(keep_vars=True)[name].detach()


def _spec_keys(wrapper: SpecAttention, state: dict, prefix: str, *args) -> None:
    """load_state_dict hook: the layer's keys are loaded into the spec (and its decode)."""
    for key, name in wrapper.keys.items():
        if prefix + key in state:
            value = state.pop(prefix + key)
            state[prefix + "spec." + name] = value
            if wrapper.decode is not None and name in wrapper.decode._parameters:
                state[prefix + "decode." + name] = value


class GPT2SpecAttention(SpecAttention):
    """GPT2Attention's forward, computed by specs/models/gpt2.attn (self-attention only)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is not None:
            raise NotImplementedError("cross-attention is not in specs/models/gpt2.attn")
        cache = self._cache(past_key_values, cache, kwargs)
        n = hidden_states.shape[-2]
        cached = self._cached(cache)
        if cached is None:
            mask = additive_mask(attention_mask, hidden_states, n)
            out, weights, keys, values = self.spec(hidden_states, mask)
        else:
            mask = additive_mask(attention_mask, hidden_states, cached[0].shape[-2] + n)
            out, keys, values = self.decode(hidden_states, *cached, mask)
            weights = None
        self._keep(cache, keys, values, n)
        return out, weights


class LlamaSpecAttention(SpecAttention):
    """LlamaAttention's forward (and Mistral's, Qwen2's, Qwen3's, Gemma 2's: the same forward),
    computed by the family's spec: the rotary angles come from position_ids, not from
    position_embeddings (the cos and sin of the same angles). Gemma 2's window is in the mask
    transformers hands its sliding layers, and its cache keeps their last sliding_window - 1
    tokens: gemma2.attn and gemma2_decode.attn serve both kinds of layer."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        cache=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self._cache(past_key_values, cache, kwargs)
        n = hidden_states.shape[-2]
        cached = self._cached(cache)
        positions, mask = _positions_and_mask(hidden_states, attention_mask, cached, kwargs)
        if cached is None:
            out, weights, keys, values = self.spec(hidden_states, positions, mask)
            weights = weights.flatten(-4, -3)  # heads (g r), as transformers returns them
        else:
            keys = cached[0].unflatten(-1, (2, -1))  # features in halves (c j)
            out, keys, values = self.decode(hidden_states, positions, keys, cached[1], mask)
            weights = None
        self._keep(cache, keys.flatten(-2), values, n)
        return out, weights


class GPTNeoXSpecAttention(SpecAttention):
    """GPTNeoXAttention's forward, computed by specs/models/gpt_neox.attn (and with a cache by
    gpt_neox_decode.attn): partial rotary, so the cache's keys are split into their rotated
    part (2 d_r features, in halves) and their passed-through part, and joined back."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layer_past=None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self._cache(layer_past, None, kwargs)
        n = hidden_states.shape[-2]
        cached = self._cached(cache)
        positions, mask = _positions_and_mask(hidden_states, attention_mask, cached, kwargs)
        if cached is None:
            out, weights, rotated, passed, values = self.spec(hidden_states, positions, mask)
        else:
            keys, values = cached
            rotated = keys[..., : 2 * self.spec.sizes["d_r"]].unflatten(-1, (2, -1))
            passed = keys[..., 2 * self.spec.sizes["d_r"] :]
            out, rotated, passed, values = self.decode(
                hidden_states, positions, rotated, passed, values, mask
            )
            weights = None
        self._keep(cache, torch.cat([rotated.flatten(-2), passed], -1), values, n)
        return out, weights


def _positions_and_mask(
    hidden_states: torch.Tensor, attention_mask, cached, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' positions (position_ids, else after the cached ones) and the additive
    mask over the cached and new keys."""
    n = hidden_states.shape[-2]
    n_c = 0 if cached is None else cached[0].shape[-2]
    positions = kwargs.get("position_ids")
    if positions is None:
        positions = torch.arange(n_c, n_c + n, device=hidden_states.device)
    return positions, additive_mask(attention_mask, hidden_states, n_c + n)


WRAPPERS = {  # the transformers layers swap_attention replaces, by class name
    "GPT2Attention": GPT2SpecAttention,
    "LlamaAttention": LlamaSpecAttention,
    "MistralAttention": LlamaSpecAttention,  # Llama's forward, and its inputs
    "Qwen2Attention": LlamaSpecAttention,
    "Qwen3Attention": LlamaSpecAttention,
    "Gemma2Attention": LlamaSpecAttention,  # its scaling and soft cap are the spec's
    "GPTNeoXAttention": GPTNeoXSpecAttention,
}


PAIRS = {  # a shipped model spec (specs/models/) -> its shipped decode spec
    "gpt2": "gpt2_decode",
    "llama3": "llama3_decode",
    "mistral": "llama3_decode",  # Llama 3's: Mistral's window is in the mask transformers gives
    "qwen2": "qwen2_decode",
    "qwen3": "qwen3_decode",
    "gemma2": "gemma2_decode",
    "gpt_neox": "gpt_neox_decode",
}
PAIRED = "paired"  # swap_attention's default decode: the shipped spec's shipped decode spec


def paired_decode(spec: CompiledSpec) -> CompiledSpec | None:
    """The shipped decode spec of a shipped model spec (its text the shipped file's, word for
    word), else None."""
    if spec.name not in PAIRS:
        return None
    if spec.text != shipped(f"models/{spec.name}.attn").read_text(encoding="utf-8"):
        return None
    return compile_spec(shipped(f"models/{PAIRS[spec.name]}.attn"))


def swap_attention(
    model: nn.Module,
    spec: CompiledSpec | str | Path,
    decode: CompiledSpec | str | Path | None = PAIRED,
) -> nn.Module:
    """Replace every attention layer of `model` that WRAPPERS names (GPT-2, Llama, Mistral,
    Qwen2, Qwen3, Gemma 2, GPT-NeoX) by the spec, in place.

    >>> swap_attention(model, "specs/models/llama3.attn")(ids, use_cache=False)  # doctest: +SKIP

    Each replacement holds the layer's weights (under `.spec`; its state_dict keeps the layer's
    names) and has the layer's forward signature. A shipped model spec gets its shipped decode
    spec (PAIRS: specs/models/gpt2_decode.attn, llama3_decode.attn, qwen2_decode.attn,
    qwen3_decode.attn, gemma2_decode.attn, gpt_neox_decode.attn) unless `decode` says another
    or None; without a decode spec the model runs without a KV cache (use_cache=False); with
    one, generate() runs with its cache. A layer with attention dropout is refused in training
    mode.
    """
    spec = spec if isinstance(spec, CompiledSpec) else compile_spec(spec)
    if decode is PAIRED:
        decode = paired_decode(spec)
    if decode is not None and not isinstance(decode, CompiledSpec):
        decode = compile_spec(decode)
    swaps = [
        (parent, name, WRAPPERS[type(child).__name__](child, spec, decode))
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child).__name__ in WRAPPERS and not getattr(child, "is_cross_attention", False)
    ]
    if not swaps:
        raise ValueError(f"no attention layer of {', '.join(WRAPPERS)} in {type(model).__name__}")
    for parent, name, wrapper in swaps:
        setattr(parent, name, wrapper)
    return model


def unswap_attention(model: nn.Module) -> nn.Module:
    """Put back, in place, the transformers layers swap_attention replaced, holding the
    swapped model's current weights (trained or not).

    >>> unswap_attention(swap_attention(model, "specs/models/llama3.attn"))  # doctest: +SKIP
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, SpecAttention)
    ]
    if not swaps:
        raise ValueError(f"no swapped attention layer in {type(model).__name__}")
    for parent, name, wrapper in swaps:
        weight = next(wrapper.spec.parameters())
        setattr(parent, name, wrapper.layer.to(weight.device).train(wrapper.training))
    return model
