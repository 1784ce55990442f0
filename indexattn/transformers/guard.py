"""Never silently not indexattn: a model whose layers never call transformers' attention
functions (Bloom, Falcon) is refused an indexattn implementation by name when it is built or
switched, where transformers would accept it and run its own attention (Bloom), fail with a
bare KeyError (Falcon) or log a warning and stay as it was (set_attn_implementation); and a
model saved under an indexattn implementation keeps it in its config.json (transformers saves
none), spelled so that transformers' own error, in a process that did not import this module,
says what to import (`saved_name`).

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


def saved_name(name: str) -> str:
    """How config.json spells an indexattn implementation: transformers quotes it in the error
    it raises where the name is not registered (`Specified attn_implementation="indexattn
    (import indexattn.transformers first)" is not supported`), and this module reads it back
    as `name`. No '/', ':' or '|': transformers would read those as a hub kernel or paging."""
    return f"{name} (import indexattn.transformers first)"


def _read(requested):
    """An implementation as config.json spells it (`saved_name`), read back as its name."""
    return next((name for name in NAMES if requested == saved_name(name)), requested)


def _guarded(method):
    @functools.wraps(method)
    def guarded(self, requested, *args, **kwargs):
        requested = _read(requested)
        refuse_bypass(self, requested)
        return method(self, requested, *args, **kwargs)

    guarded.__wrapped_by_indexattn__ = True
    return guarded


def _saving(method):
    @functools.wraps(method)
    def saving(self, d: dict) -> None:
        if d.get("_attn_implementation_internal") in NAMES:
            d["attn_implementation"] = saved_name(d["_attn_implementation_internal"])
        method(self, d)

    saving.__wrapped_by_indexattn__ = True
    return saving


DOORS = (  # class, method, its wrapper
    ("PreTrainedModel", "get_correct_attn_implementation", _guarded),
    ("PreTrainedModel", "set_attn_implementation", _guarded),
    ("PretrainedConfig", "_remove_keys_not_serialized", _saving),
)


def install() -> None:
    """Guard the doors an implementation comes in and goes out by: the check every model runs
    when it is built (get_correct_attn_implementation), set_attn_implementation, and what a
    config serializes (to_dict, to_diff_dict, so save_pretrained). Once."""
    import transformers

    for owner, door, wrapper in DOORS:
        cls = getattr(transformers, owner)
        method = getattr(cls, door)
        if not getattr(method, "__wrapped_by_indexattn__", False):
            setattr(cls, door, wrapper(method))
