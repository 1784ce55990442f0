"""Never silently not indexattn: a model whose layers never call transformers' attention
functions (Bloom, Falcon) is refused an indexattn implementation by name when it is built or
switched, where transformers would accept it and run its own attention (Bloom), fail with a
bare KeyError (Falcon) or log a warning and stay as it was (set_attn_implementation).

>>> AutoModelForCausalLM.from_config(BloomConfig(), attn_implementation="indexattn")
... # doctest: +SKIP
ValueError: BloomForCausalLM's attention layers compute their own attention ...
"""

from __future__ import annotations

import functools

NAMES: set[str] = set()  # the attn_implementation names registered by indexattn


def refuse_bypass(model, requested) -> None:
    """Refuse `requested` (an indexattn name) for a model whose layers would never call it.

    transformers' own test of whether a model's attention goes through its AttentionInterface
    (`_can_set_attn_implementation`: the modeling file calls ALL_ATTENTION_FUNCTIONS) decides.
    """
    if not isinstance(requested, str) or requested not in NAMES:
        return
    if not type(model)._can_set_attn_implementation():
        name = type(model).__name__
        raise ValueError(
            f"{name}'s attention layers compute their own attention and never call"
            f" transformers' attention functions, so attn_implementation={requested!r} would"
            f" not run indexattn: build it with 'eager' or 'sdpa', and load a layer into its"
            f" spec with from_transformers (specs/models/, docs/models.md)"
        )


def _guarded(method):
    @functools.wraps(method)
    def guarded(self, requested, *args, **kwargs):
        refuse_bypass(self, requested)
        return method(self, requested, *args, **kwargs)

    guarded.__wrapped_by_indexattn__ = True
    return guarded


def install() -> None:
    """Guard the two doors an implementation comes in by: the check every model runs when it is
    built (get_correct_attn_implementation) and set_attn_implementation. Once."""
    from transformers import PreTrainedModel

    for door in ("get_correct_attn_implementation", "set_attn_implementation"):
        method = getattr(PreTrainedModel, door)
        if not getattr(method, "__wrapped_by_indexattn__", False):
            setattr(PreTrainedModel, door, _guarded(method))
