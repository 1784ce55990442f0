"""Hugging Face transformers' attention layers as specs: load their weights, swap them in.

>>> import indexattn, indexattn.transformers as hf  # doctest: +SKIP
>>> module = hf.from_transformers(model.transformer.h[0].attn, "specs/models/gpt2.attn")
>>> hf.swap_attention(model, "specs/models/gpt2.attn")  # every GPT2Attention runs the spec

transformers is imported only by this module, and only when it is used: it is an optional
extra (`pip install indexattn[transformers]`), never a requirement of the compiler. The specs
under `specs/models/` declare their parameters in the checkpoint's own names and layouts, so
loading a layer is a rename (dots become underscores), never a reshuffle of the weights.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from .runtime import CompiledSpec, SpecModule, compile_spec


def from_transformers(
    layer: nn.Module, spec: CompiledSpec | str | Path, *, config=None, **given: float
) -> SpecModule:
    """The spec's module holding a copy of `layer`'s weights, in their dtype and device.

    >>> module = from_transformers(GPT2Attention(config, layer_idx=0), "specs/models/gpt2.attn")
    ... # doctest: +SKIP

    The spec's sizes and scalars are read off the layer and its config: the usual short names
    (d_m, h, h_kv, n_rep, d_k, d_r, d_p: see `SIZES`), `rope_theta` from the config's rope
    parameters, and any size or scalar named like a config attribute (`sliding_window`,
    `rms_norm_eps`, `kv_lora_rank`, ...) takes that attribute's value; an attribute of the layer
    itself wins over its config's, and a layer's None is no limit, inf (GptOssAttention's
    sliding_window on a full-attention layer). Keywords override them. `config` is the
    model's config, for layers that keep none (BloomAttention): by default the layer's own,
    or the first a submodule holds (BertAttention).
    """
    spec = spec if isinstance(spec, CompiledSpec) else compile_spec(spec)
    wanted = {str(s) for s in spec.sizes} | {s.ascii for s in spec.ir.scalars}
    known = {**sizes_and_scalars(layer, wanted, config), **given}
    module = spec.module(**{k: v for k, v in known.items() if k in wanted})
    weights = {k.replace(".", "_"): v.detach().clone() for k, v in layer.state_dict().items()}
    _same_weights(layer, spec, weights, module.state_dict())
    module.load_state_dict(weights, assign=True)  # assign: keep the layer's dtype and device
    return module.train(layer.training)


def _same_weights(layer: nn.Module, spec: CompiledSpec, weights: dict, declared: dict) -> None:
    """Refuse, naming them, the weights that only one side has (a Llama layer with
    attention_bias=True against a spec without biases, say)."""
    extra, missing = sorted(weights.keys() - declared.keys()), sorted(declared.keys() - weights)
    sides = [f"the layer has {', '.join(extra)}, which the spec does not declare"] if extra else []
    sides += [f"the spec declares {', '.join(missing)}, which the layer lacks"] if missing else []
    if sides:
        raise ValueError(
            f"{type(layer).__name__}'s weights are not the parameters of spec {spec.name!r}: "
            + "; ".join(sides)
            + ". Write a spec whose parameters are the layer's state_dict keys, dots made"
            " underscores (specs/models/ has one per family)"
        )


def _head_dim(layer: nn.Module, config) -> int:
    d_k = getattr(layer, "head_dim", None) or getattr(config, "head_dim", None)
    return d_k or config.hidden_size // config.num_attention_heads


def _kv_heads(layer: nn.Module, config) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def _rotary_half(layer, config) -> int:
    """Half the rotated features of a head: of GPT-J's rotary_dim, of the partial_rotary_factor
    part (GPT-NeoX's rotary_pct), else of the whole head."""
    rope = getattr(config, "rope_parameters", None) or {}
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    rotated = getattr(config, "rotary_dim", None) or int(_head_dim(layer, config) * factor)
    return rotated // 2


SIZES = {  # the specs' short size names, read off a layer and its config
    "d_m": lambda layer, config: config.hidden_size,
    "h": lambda layer, config: config.num_attention_heads,
    "h_kv": _kv_heads,
    "n_rep": lambda layer, config: config.num_attention_heads // _kv_heads(layer, config),
    "d_k": _head_dim,
    "d_r": _rotary_half,  # a rotated head is 2 d_r features, then d_p passed through
    "d_p": lambda layer, config: _head_dim(layer, config) - 2 * _rotary_half(layer, config),
}


def sizes_and_scalars(layer: nn.Module, wanted: set[str], config=None) -> dict:
    """The values of the `wanted` sizes and scalars that the layer or its config (by default
    `layer_config(layer)`) tells."""
    config = layer_config(layer) if config is None else config
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2's scale_attn_by_inverse_layer_idx is not in specs/models/gpt2.attn")
    if getattr(config, "scale_attn_weights", True) is False:
        raise ValueError("GPT-2 without scale_attn_weights is not in specs/models/gpt2.attn")
    if getattr(config, "rope_interleave", True) is False:
        raise ValueError("rope_interleave=False: deepseek_v3.attn turns interleaved pairs")
    known = {}
    for name in wanted:
        if name in SIZES:
            known[name] = SIZES[name](layer, config)
        elif name == "rope_theta":
            known[name] = _rope_theta(config)
        else:  # the layer's own value before its config's
            source = next((s for s in (layer, config) if _number(s, name)), None)
            if source is not None:
                known[name] = _attribute(source, name)
    return known


def _number(source, name: str) -> bool:
    """`source` has a number (or None) named `name`: not a submodule (BloomAttention's
    attention_dropout is an nn.Dropout; its config's is the probability)."""
    value = getattr(source, name, False)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


NO_LIMIT = {"sliding_window"}  # attributes whose None means no limit: inf


def _attribute(source, name: str):
    value = getattr(source, name)
    if value is None and name not in NO_LIMIT:
        raise ValueError(
            f"{type(source).__name__}.{name} is None, but the spec computes with a scalar"
            f" {name}: use a spec without it, or pass {name}=... to from_transformers"
        )
    return math.inf if value is None else value


def layer_config(layer: nn.Module):
    """The layer's config: its own, or for a block without one (BertAttention) the first of its
    submodules'."""
    return next(m.config for m in layer.modules() if hasattr(m, "config"))


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope['rope_type']!r}: the spec computes default RoPE")
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


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


class SpecAttention(nn.Module):
    """A transformers attention layer whose work is done by a spec's module, and with a key/value
    cache by a decode spec's module sharing its parameters: the cache's first step (the prompt) runs
    the layer's spec, which also returns the keys and values to keep; each later step runs the
    decode spec on the cached ones."""

    def __init__(self, layer: nn.Module, spec: CompiledSpec, decode: CompiledSpec | None) -> None:
        super().__init__()
        self.spec = from_transformers(layer, spec)
        self.decode = None
        if decode is not None:  # one set of weights: the decode module holds the spec module's
            self.decode = decode.module(**self.spec.sizes, **self.spec.scalars)
            self.decode._parameters.update(self.spec._parameters)
        self.config = layer.config
        self.layer_idx = layer.layer_idx

    def _cached(self, cache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached keys and values of this layer, or None before the first step."""
        if cache is None or cache.get_seq_length(self.layer_idx) == 0:
            return None
        if self.decode is None:
            raise NotImplementedError(
                "a key/value cache needs swap_attention(model, spec, decode=...),"
                " or call the model with use_cache=False"
            )
        layer = cache.layers[self.layer_idx]
        return layer.keys, layer.values

    def _keep(self, cache, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        """Append the new tokens' keys and values [batch, heads, n, d_k] to the cache."""
        if cache is not None:
            cache.update(keys[..., -n:, :], values[..., -n:, :], self.layer_idx)


class GPT2SpecAttention(SpecAttention):
    """GPT2Attention's forward, computed by specs/models/gpt2.attn (self-attention only)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is not None:
            raise NotImplementedError("cross-attention is not in specs/models/gpt2.attn")
        n = hidden_states.shape[-2]
        cached = self._cached(past_key_values)
        if cached is None:
            mask = additive_mask(attention_mask, hidden_states, n)
            out, weights, keys, values = self.spec(hidden_states, mask)
        else:
            mask = additive_mask(attention_mask, hidden_states, cached[0].shape[-2] + n)
            out, keys, values = self.decode(hidden_states, *cached, mask)
            weights = None
        self._keep(past_key_values, keys, values, n)
        return out, weights


class LlamaSpecAttention(SpecAttention):
    """LlamaAttention's forward (and Mistral's, Qwen2's, Qwen3's: the same forward), computed
    by the family's spec: the rotary angles come from position_ids, not from
    position_embeddings (which are ignored)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden_states.shape[-2]
        cached = self._cached(past_key_values)
        n_c = 0 if cached is None else cached[0].shape[-2]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(n_c, n_c + n, device=hidden_states.device)
        mask = additive_mask(attention_mask, hidden_states, n_c + n)
        if cached is None:
            out, weights, keys, values = self.spec(hidden_states, positions, mask)
            weights = weights.flatten(-4, -3)  # heads (g r), as transformers returns them
        else:
            keys = cached[0].unflatten(-1, (2, -1))  # features in halves (c j)
            out, keys, values = self.decode(hidden_states, positions, keys, cached[1], mask)
            weights = None
        self._keep(past_key_values, keys.flatten(-2), values, n)
        return out, weights


WRAPPERS = {  # the transformers layers swap_attention replaces, by class name
    "GPT2Attention": GPT2SpecAttention,
    "LlamaAttention": LlamaSpecAttention,
    "MistralAttention": LlamaSpecAttention,  # Llama's forward, and its inputs
    "Qwen2Attention": LlamaSpecAttention,
    "Qwen3Attention": LlamaSpecAttention,
}


def swap_attention(
    model: nn.Module,
    spec: CompiledSpec | str | Path,
    decode: CompiledSpec | str | Path | None = None,
) -> nn.Module:
    """Replace every attention layer of `model` that WRAPPERS names (GPT-2, Llama, Mistral,
    Qwen2, Qwen3) by the spec, in place.

    >>> swap_attention(model, "specs/models/llama3.attn")(ids, use_cache=False)  # doctest: +SKIP

    Each replacement holds a copy of the layer's weights (under `.spec`) and has the layer's
    forward signature. Without a `decode` spec (specs/models/gpt2_decode.attn,
    llama3_decode.attn) the model runs without a KV cache (use_cache=False); with one,
    generate() runs with its cache.
    """
    spec = spec if isinstance(spec, CompiledSpec) else compile_spec(spec)
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
