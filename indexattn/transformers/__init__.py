"""Hugging Face transformers through specs: two ways in (docs/models.md).

>>> import indexattn.transformers  # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="indexattn")
... # doctest: +SKIP
>>> swap_attention(model, "specs/models/llama3.attn", decode="specs/models/llama3_decode.attn")
... # doctest: +SKIP

- The attention function: importing this module registers "indexattn" with transformers'
  AttentionInterface (specs/gqa_core.attn, softcap_core.attn for soft-capping layers,
  sinks_core.attn for layers with sinks, gqa_heads_core.attn for a mask per head);
  `register(name, spec)` adds a core spec of one's own.
  The model keeps its projections, rotary, cache and checkpoint names.
- The whole-layer swap: `swap_attention` replaces each attention layer of GPT-2, Llama,
  Mistral, Qwen2, Qwen3, Gemma 2 and GPT-NeoX by a layer spec (specs/models/), and by its
  decode spec with a cache; `unswap_attention` puts the transformers layers back.

transformers is imported only by this module, and only when it is used: it is an optional
extra, never a requirement of the compiler. The transformers versions in TESTED are those the
tests run on: outside them, this import warns (TransformersVersionWarning) and goes on.
"""

from __future__ import annotations

import warnings

import transformers
from packaging.version import Version

TESTED = ("5.0.0", "5.26")  # the oldest version tested, and the first one not tested
"""The same range as pyproject.toml's extra `transformers` and .ci/run's two environments."""


class TransformersVersionWarning(UserWarning):
    """transformers outside the versions indexattn.transformers is tested with."""


def _check_version(version: str) -> None:
    low, high = TESTED
    if not Version(low) <= Version(version) < Version(high):
        warnings.warn(
            f"indexattn.transformers is tested with transformers >={low},<{high}; this is"
            f" transformers {version}: what it changed may be refused or break (to be safe:"
            f" pip install 'transformers>={low},<{high}')",
            TransformersVersionWarning,
            stacklevel=3,
        )


_check_version(transformers.__version__)

from .attention import DEFAULT, SHIPPED, CoreAttention, Cores, register, shipped  # noqa: E402
from .swap import (  # noqa: E402
    WRAPPERS,
    GPT2SpecAttention,
    GPTNeoXSpecAttention,
    LlamaSpecAttention,
    SpecAttention,
    additive_mask,
    swap_attention,
    unswap_attention,
)
from .weights import SIZES, from_transformers, layer_config, sizes_and_scalars  # noqa: E402

CORE = register(DEFAULT, *map(shipped, SHIPPED))  # attn_implementation="indexattn"

__all__ = [
    "CORE",
    "DEFAULT",
    "SIZES",
    "TESTED",
    "WRAPPERS",
    "CoreAttention",
    "Cores",
    "GPT2SpecAttention",
    "GPTNeoXSpecAttention",
    "LlamaSpecAttention",
    "SpecAttention",
    "TransformersVersionWarning",
    "additive_mask",
    "from_transformers",
    "layer_config",
    "register",
    "sizes_and_scalars",
    "swap_attention",
    "unswap_attention",
]
