"""Hugging Face transformers through specs: two ways in (docs/models.md).

>>> import indexattn.transformers  # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="indexattn")
... # doctest: +SKIP
>>> swap_attention(model, "specs/models/llama3.attn", decode="specs/models/llama3_decode.attn")
... # doctest: +SKIP

- The attention function: importing this module registers "indexattn" with transformers'
  AttentionInterface (specs/gqa_core.attn); `register(name, spec)` adds a core spec of one's
  own. The model keeps its projections, rotary, cache and checkpoint names.
- The whole-layer swap: `swap_attention` replaces each attention layer of GPT-2, Llama,
  Mistral, Qwen2, Qwen3, Gemma 2 and GPT-NeoX by a layer spec (specs/models/), and by its
  decode spec with a cache; `unswap_attention` puts the transformers layers back.

transformers is imported only by this module, and only when it is used: it is an optional
extra (`pip install indexattn[transformers]`), never a requirement of the compiler. Only the
transformers versions in TESTED are accepted: outside them, this import fails with the range.
"""

from __future__ import annotations

import transformers
from packaging.version import Version

TESTED = ("5.0.0", "5.25")  # the oldest version tested, and the first one not tested
"""The same range as pyproject.toml's extra `transformers` and .ci/run's two environments."""


def _check_version(version: str) -> None:
    low, high = TESTED
    if not Version(low) <= Version(version) < Version(high):
        raise ImportError(
            f"indexattn.transformers is tested with transformers >={low},<{high}; this is"
            f" transformers {version}: pip install 'transformers>={low},<{high}'"
        )


_check_version(transformers.__version__)

from .attention import DEFAULT, CoreAttention, register, shipped  # noqa: E402
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

CORE = register(DEFAULT, shipped("gqa_core.attn"))  # attn_implementation="indexattn"

__all__ = [
    "CORE",
    "DEFAULT",
    "SIZES",
    "TESTED",
    "WRAPPERS",
    "CoreAttention",
    "GPT2SpecAttention",
    "GPTNeoXSpecAttention",
    "LlamaSpecAttention",
    "SpecAttention",
    "additive_mask",
    "from_transformers",
    "layer_config",
    "register",
    "sizes_and_scalars",
    "swap_attention",
    "unswap_attention",
]
