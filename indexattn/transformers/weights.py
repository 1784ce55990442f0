"""A transformers attention layer's weights, sizes and scalars, loaded into a spec's module.

The specs under `specs/models/` declare their parameters in the checkpoint's own names and
layouts, so loading a layer is a rename (dots become underscores), never a reshuffle.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import nn

from ..runtime import CompiledSpec, SpecModule
from ..spec import compile_spec


def from_transformers(
    layer: nn.Module, spec: CompiledSpec | str | Path, *, config=None, **given: float
) -> SpecModule:
    """The spec's module holding a copy of `layer`'s weights, in their dtype and device.

    >>> module = from_transformers(GPT2Attention(config, layer_idx=0), "specs/models/gpt2.attn")
    ... # doctest: +SKIP

    The spec's sizes and scalars are read off the layer and its config: the usual short size
    names (d_m, h, h_kv, n_rep, d_k, d_r, d_p: see `SIZES`) and other sizes named like a config
    attribute (`kv_lora_rank`, ...); each scalar through `FIELDS`, the explicit map from a
    spec's scalar to the field it takes (`rope_theta` and the rotary scaling's from the
    config's rope parameters; `sliding_window` the layer's own window: None on a full-attention
    layer, no limit, inf); a scalar that FIELDS does not map and no keyword gives is refused by
    name, never left at its default. Keywords override them. `config` is the
    model's config, for layers that keep none (BloomAttention): by default the layer's own,
    or the first a submodule holds (BertAttention).
    """
    spec = spec if isinstance(spec, CompiledSpec) else compile_spec(spec)
    _refuse_unmapped(spec, given)
    wanted = {str(s) for s in spec.sizes} | {s.ascii for s in spec.ir.scalars}
    known = {**sizes_and_scalars(layer, wanted, config), **given}
    module = spec.module(**{k: v for k, v in known.items() if k in wanted})
    weights = {k.replace(".", "_"): v.detach().clone() for k, v in layer.state_dict().items()}
    _same_weights(layer, spec, weights, module.state_dict())
    module.load_state_dict(weights, assign=True)  # assign: keep the layer's dtype and device
    return module.train(layer.training)


def _refuse_unmapped(spec: CompiledSpec, given: dict) -> None:
    """A scalar of the spec that no field is mapped to, and that no keyword gives: by name (a
    spec's `softcap` is not Gemma 2's `attn_logit_softcapping`, and would keep its default)."""
    mapped = FIELDS.keys() | ROTARY
    unmapped = [s.ascii for s in spec.ir.scalars if s.ascii not in mapped | given.keys()]
    if unmapped:
        raise ValueError(
            f"spec {spec.name!r} declares scalar {', '.join(unmapped)}, which no field of a"
            f" transformers layer is mapped to (FIELDS: {', '.join(sorted(FIELDS))}; and"
            f" rope_theta and the rotary scaling's): name it after the field it takes, or pass"
            f" {unmapped[0]}=... to from_transformers"
        )


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
    `layer_config(layer)`) tells: SIZES, FIELDS and the rotary parameters, then sizes named like
    an attribute of the layer or its config."""
    config = layer_config(layer) if config is None else config
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2's scale_attn_by_inverse_layer_idx is not in specs/models/gpt2.attn")
    if getattr(config, "scale_attn_weights", True) is False:
        raise ValueError("GPT-2 without scale_attn_weights is not in specs/models/gpt2.attn")
    if getattr(config, "rope_interleave", True) is False:
        raise ValueError("rope_interleave=False: deepseek_v3.attn turns interleaved pairs")
    known = _rope(config, wanted) if "rope_theta" in wanted else {}
    for name in wanted - known.keys():
        if name in SIZES:
            known[name] = SIZES[name](layer, config)
        elif name in FIELDS:
            known[name] = FIELDS[name](layer, config)
        elif name not in ROTARY:  # a size: the layer's own value before its config's
            source = next((s for s in (layer, config) if _number(s, name)), None)
            if source is not None:
                known[name] = _attribute(source, name)
    _refuse_partial_rotary(layer, config, known, wanted)
    return known


def _refuse_partial_rotary(layer: nn.Module, config, known: dict, wanted: set[str]) -> None:
    """A layer that rotates part of each head (StableLM, Phi), against a spec that turns whole
    heads (no passed-through part d_p)."""
    d_k = _head_dim(layer, config)
    if "d_r" in known and "d_p" not in wanted and 2 * known["d_r"] != d_k:
        raise ValueError(
            f"{type(layer).__name__} rotates {2 * known['d_r']} of each head's {d_k} features"
            " (partial rotary), and the spec turns whole heads: use a spec whose heads are a"
            " rotated part 2 d_r and a passed-through part d_p (specs/models/gpt_neox.attn)"
        )


def _number(source, name: str) -> bool:
    """`source` has a number (or None) named `name`: not a submodule (BloomAttention's
    attention_dropout is an nn.Dropout; its config's is the probability)."""
    value = getattr(source, name, False)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _attribute(source, name: str):
    value = getattr(source, name)
    if value is None:
        raise ValueError(
            f"{type(source).__name__}.{name} is None, but the spec computes with a scalar"
            f" {name}: use a spec without it, or pass {name}=... to from_transformers"
        )
    return value


def _field(name: str):
    """The field `name` of the layer (its own value first: a layer may differ from its
    config), else of its config."""

    def read(layer: nn.Module, config):
        return _attribute(next((s for s in (layer, config) if _number(s, name)), config), name)

    return read


def _window(layer: nn.Module, config) -> float:
    """The layer's own window: the sliding_window of the layer or of its attention (None on
    Gemma 2's, GPT-OSS's, Qwen's full-attention layers), else its config.layer_types entry,
    else the config's window for every layer (Mistral); None is no limit, inf. A decoder
    layer's full attention never takes the config's sliding_window."""
    own = next((m for m in layer.modules() if _number(m, "sliding_window")), None)
    if own is not None:
        window = own.sliding_window
    else:
        types, index = getattr(config, "layer_types", None), _layer_index(layer)
        full = types is not None and index is not None and types[index] == "full_attention"
        window = None if full else getattr(config, "sliding_window", None)
    return math.inf if window is None else window


def _layer_index(layer: nn.Module) -> int | None:
    return next((m.layer_idx for m in layer.modules() if hasattr(m, "layer_idx")), None)


def _norm_eps(layer: nn.Module, config) -> float:
    """The epsilon of the layer's own RMSNorms (DeepSeek-V3's: its default, not the config's)."""
    return next(m.variance_epsilon for m in layer.modules() if hasattr(m, "variance_epsilon"))


FIELDS = {  # a spec's scalar -> how it is read off a transformers layer and its config
    "sliding_window": _window,
    "attn_logit_softcapping": _field("attn_logit_softcapping"),  # Gemma 2
    "query_pre_attn_scalar": _field("query_pre_attn_scalar"),  # Gemma 2
    "rms_norm_eps": _field("rms_norm_eps"),  # Qwen3, the decoder layers
    "layer_norm_eps": _field("layer_norm_eps"),  # BERT
    "eps": _norm_eps,  # DeepSeek-V3's RMSNorms
    "attention_dropout": _field(
        "attention_dropout"
    ),  # Bloom (its config's: the layer's is a module)
    "hidden_dropout": _field("hidden_dropout"),  # Bloom
    "relative_attention_max_distance": _field("relative_attention_max_distance"),  # T5
}


def layer_config(layer: nn.Module):
    """The layer's config: its own, or for a block without one (BertAttention) the first of its
    submodules'."""
    return next(m.config for m in layer.modules() if hasattr(m, "config"))


ROPE_TYPES = {  # rope_type -> the scalars of config.rope_parameters a spec computing it declares
    "default": frozenset(),
    "llama3": frozenset(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    ),  # specs/models/llama3_scaled.attn
    "yarn": frozenset(
        {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"}
        | {"mscale", "mscale_all_dim", "attention_factor"}
    ),  # specs/models/*_yarn.attn
}
ROTARY = {"rope_theta"} | {name for names in ROPE_TYPES.values() for name in names}  # _rope's
YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}  # _compute_yarn_parameters' defaults
YARN_NONE = {"mscale": 0.0, "mscale_all_dim": 0.0, "attention_factor": 0.0}  # the specs' "unset"


def _rope(config, wanted: set[str]) -> dict:
    """rope_theta and the rotary scaling's parameters, where the spec computes the config's
    rope_type: the spec's scaling scalars are exactly those of the config's rope_type."""
    rope = getattr(config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    declared = {name for names in ROPE_TYPES.values() for name in names} & wanted
    if kind not in ROPE_TYPES or declared != ROPE_TYPES[kind]:
        computed = next(k for k, names in ROPE_TYPES.items() if names == declared)
        raise ValueError(
            f"rope_type {kind!r}, and the spec computes {computed!r} RoPE: use a spec that"
            f" computes {kind!r} (llama3: specs/models/llama3_scaled.attn; yarn: llama3_yarn,"
            " qwen2_yarn, gpt_oss_yarn or deepseek_v3_yarn.attn; default: llama3.attn)"
        )
    given = {k: v for k, v in rope.items() if v is not None}
    if kind == "yarn":
        given = _yarn(config, given)
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return {"rope_theta": theta, **{name: float(given[name]) for name in declared}}


def _yarn(config, rope: dict) -> dict:
    """config.rope_parameters of a YaRN layer as the specs take them, read as
    _compute_yarn_parameters reads them: a factor of None is max_position_embeddings over
    original_max_position_embeddings, beta_fast and beta_slow of 0 or None their defaults, and
    unset mscale, mscale_all_dim, attention_factor 0. An attention_factor of 0 or less is
    refused: 0 would read as unset, and either zeroes or flips cos and sin."""
    betas = {name: rope.get(name) or default for name, default in YARN_BETAS.items()}
    given = {**YARN_NONE, **rope, **betas, "truncate": float(bool(rope.get("truncate", True)))}
    if "attention_factor" in rope and not rope["attention_factor"] > 0:
        raise ValueError(
            f"YaRN with attention_factor={rope['attention_factor']!r}: cos and sin times a"
            " factor <= 0 are no rotary table; give a positive attention_factor, or none"
            " (then it is computed from factor, mscale and mscale_all_dim)"
        )
    if "factor" not in rope:
        original = rope["original_max_position_embeddings"]
        given["factor"] = config.max_position_embeddings / original
    return given
