"""Never silently not indexattn: a model whose layers never call transformers' attention
functions (Bloom; Falcon before transformers 5.25) is refused an indexattn implementation by
name when it is built or switched, where transformers would accept it and run its own
attention (Bloom), fail with a bare KeyError (Falcon) or log a warning and stay as it was
(set_attn_implementation); so is a model transformers' own test lets through
(`refuse_unused`: GIT, whose text layers compute their own attention; Mamba, which has none);
and a model saved under an indexattn implementation keeps it in its config.json
(transformers saves none), spelled so that
transformers' own error, in a process that did not import this module, says what to import
(`saved_name`).

>>> AutoModelForCausalLM.from_config(BloomConfig(), attn_implementation="indexattn")
... # doctest: +SKIP
ValueError: BloomForCausalLM's attention layers compute their own attention ...
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys

NAMES: set[str] = set()  # the attn_implementation names registered by indexattn


def refuse_bypass(model, requested) -> None:
    """Refuse `requested` (an indexattn name) for a model whose layers would never call it.

    transformers' own test of whether a model's attention goes through its AttentionInterface
    (`_can_set_attn_implementation`: the modeling file calls ALL_ATTENTION_FUNCTIONS) decides,
    and a modeling file that picks its layers from a table by the implementation's name (GIT's
    GIT_SELF_ATTENTION_CLASSES: eager only), where transformers would fail with a bare KeyError.
    """
    if not isinstance(requested, str) or requested not in NAMES:
        return
    name = type(model).__name__
    table = TABLE.search(_modeling_code(type(model)))
    if table:
        whose = f"{name} picks its attention layers from {table[1]}, which has no {requested!r}"
        raise ValueError(f"{whose}: they {BYPASSING.format(requested)}: build it with 'eager'")
    if not type(model)._can_set_attn_implementation():
        raise ValueError(
            f"{name}'s attention layers {BYPASSING.format(requested)}: build it with 'eager' or"
            f" 'sdpa', and load a layer into its spec with from_transformers (specs/models/,"
            f" docs/models.md)"
        )


BYPASSING = (
    "compute their own attention and never call transformers' attention functions, so"
    " attn_implementation={!r} would not run indexattn"
)
TABLE = re.compile(r"(\w+_CLASSES)\[\s*config\._attn_implementation\s*\]")  # layers by name


def _modeling_code(cls) -> str:
    """The text of the file a model class is defined in ('' where it has none)."""
    with contextlib.suppress(OSError, TypeError):
        return inspect.getsource(sys.modules[cls.__module__])
    return ""


CALLING, OWN = "calling", "own"  # a layer's kind (`layer_kind`)
LAYER = re.compile(r"Attention")  # a layer named for attention: it computes it one way or another
OWN_MARKS = ("softmax", "scaled_dot_product_attention")


@functools.cache
def layer_kind(cls) -> str | None:
    """CALLING where the code of the layer class `cls` (its own classes, base classes outside
    torch included) reads transformers' attention functions; OWN where a layer named for
    attention, over tokens (its forward takes an attention_mask), computes weights itself (not
    Inkling 2's BlockAttentionResidual, a softmax over blocks of layers); None for every other
    module (norms, MLPs, mixers)."""
    code = ""
    for owner in cls.__mro__:
        if not owner.__module__.startswith("torch"):
            with contextlib.suppress(OSError, TypeError):  # a class made at run time: no file
                code += inspect.getsource(owner)
    if "ALL_ATTENTION_FUNCTIONS" in code:
        return CALLING
    masked = "attention_mask" in inspect.signature(cls.forward).parameters  # over tokens
    if LAYER.search(cls.__name__) and masked and any(mark in code for mark in OWN_MARKS):
        return OWN
    return None


def refuse_unused(model, requested) -> None:
    """Refuse `requested` (an indexattn name) for a built model where it would not run: a layer
    named for attention computes its own (GIT's text layers; OpenAI GPT's in transformers 5.0),
    or no layer calls transformers' attention functions at all (Mamba's mixers). transformers'
    own test (`refuse_bypass`) reads the modeling file's text, and lets these through."""
    if not isinstance(requested, str) or requested not in NAMES:
        return
    from transformers import PreTrainedModel

    kinds: dict = {}
    for module in model.modules():
        if not isinstance(module, PreTrainedModel):  # the layers, not the models around them
            kinds.setdefault(layer_kind(type(module)), set()).add(type(module).__name__)
    name = type(model).__name__
    if OWN in kinds:
        raise ValueError(
            f"{name}'s layers {', '.join(sorted(kinds[OWN]))} {BYPASSING.format(requested)}"
            f" there: build it with 'eager' or 'sdpa'"
        )
    if CALLING not in kinds:
        raise ValueError(
            f"{name} has no attention layers (none calls transformers' attention functions), so"
            f" attn_implementation={requested!r} would never run: build it without"
            f" attn_implementation"
        )
    refuse_weightless(model, requested)


def refuse_weightless(model, requested: str) -> None:
    """Refuse a model configured with output_attentions whose core specs output no weights:
    when it is built, not at its first forward."""
    from transformers import AttentionInterface

    if not getattr(model.config, "output_attentions", False):
        return
    function = AttentionInterface._global_mapping.get(requested)
    cores = getattr(function, "cores", [function])
    weightless = [c.name for c in cores if getattr(c, "spec", None) and c.spec.plain.outputs < 2]
    if weightless:
        raise NotImplementedError(
            f"{type(model).__name__} is configured with output_attentions=True, and attention"
            f" spec {weightless[0]!r} outputs no weights: register a core spec that outputs"
            " them too (`output O, A`, as specs/sdpa.attn), or set output_attentions=False"
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


def _guarded(*checks):
    """A door taking an implementation: read back as its name, and each check run on it."""

    def wrapper(method):
        @functools.wraps(method)
        def guarded(self, requested, *args, **kwargs):
            requested = _read(requested)
            for check in checks:
                check(self, requested)
            return method(self, requested, *args, **kwargs)

        guarded.__wrapped_by_indexattn__ = True
        return guarded

    return wrapper


def _built(method):
    @functools.wraps(method)
    def built(self, *args, **kwargs) -> None:
        method(self, *args, **kwargs)
        refuse_unused(self, self.config._attn_implementation)

    built.__wrapped_by_indexattn__ = True
    return built


def _saving(method):
    @functools.wraps(method)
    def saving(self, d: dict) -> None:
        if d.get("_attn_implementation_internal") in NAMES:
            d["attn_implementation"] = saved_name(d["_attn_implementation_internal"])
        method(self, d)

    saving.__wrapped_by_indexattn__ = True
    return saving


DOORS = (  # class, method, its wrapper
    ("PreTrainedModel", "get_correct_attn_implementation", _guarded(refuse_bypass)),
    ("PreTrainedModel", "set_attn_implementation", _guarded(refuse_bypass, refuse_unused)),
    ("PreTrainedModel", "post_init", _built),
    ("PretrainedConfig", "_remove_keys_not_serialized", _saving),
)


def install() -> None:
    """Guard the doors an implementation comes in and goes out by: the check every model runs
    when it is built (get_correct_attn_implementation), the end of its building (post_init,
    its layers made), set_attn_implementation, and what a config serializes (to_dict,
    to_diff_dict, so save_pretrained). Once."""
    import transformers

    for owner, door, wrapper in DOORS:
        cls = getattr(transformers, owner)
        method = getattr(cls, door)
        if not getattr(method, "__wrapped_by_indexattn__", False):
            setattr(cls, door, wrapper(method))
