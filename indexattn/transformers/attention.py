"""A core spec as a transformers attention function: `attn_implementation="indexattn"`.

>>> model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="indexattn")
... # doctest: +SKIP

transformers' layers keep their projections, rotary, cache and checkpoint names, and hand
their attention function the queries, keys and values with an additive mask; a core spec
computes the rest. Every keyword the layer passes is given to the spec, or is known to be
carried by the mask, or is refused by name.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ..runtime import CompiledSpec
from ..spec import compile_spec

TENSORS = ("Q", "K", "V", "M")  # a core spec's inputs, in this order
SINKS = "s_aux"  # an optional input: a learned logit per query head joins the softmax
HEADS = "heads"  # a core whose mask is one per query head, M_<grτσ> (gqa_heads_core)
SCALARS = {  # transformers' keyword -> the core spec's scalar that takes it (None: see unset)
    "scaling": "scaling",
    "dropout": "p",
    "softcap": "softcap",
    "sliding_window": "sliding_window",
}
CARRIED = {  # keywords a spec never sees, and why that loses nothing
    "sliding_window": "the mask hides the keys outside the window",
    "is_causal": "read only where the layer gives no mask, as sdpa does",
    "position_ids": "the mask holds packed sequences' boundaries",
    "use_cache": "the layer updates its own cache before attention",
    "cache_position": "the layer updates its own cache before attention (BERT, transformers 5.0)",
    "output_attentions": "the weights are returned where the spec outputs them, else refused",
    "cu_seq_lens_q": "the mask holds packed sequences' boundaries",
    "cu_seq_lens_k": "the mask holds packed sequences' boundaries",
    "max_length_q": "the mask holds packed sequences' boundaries",
    "max_length_k": "the mask holds packed sequences' boundaries",
    "output_router_logits": "a flag of the model's experts (Mixtral), not of attention",
    "num_items_in_batch": "a keyword of the model's loss, handed to every layer",
    "shift_labels": "a keyword of the model's loss, handed to every layer",
    "labels": "the model's loss targets, handed to every layer (Gemma 4)",
    "output_hidden_states": "a flag of the model's outputs, handed to every layer (Cohere, 5.0)",
    "encoder_hidden_states": "the layer computed its keys and values from it (cross-attention)",
}
FOLDED = {  # keywords one with the mask: the core's M holds them (`folded`)
    "indices": "the keys each query selects (DeepSeek-V3.2's indexer): the others hidden",
    "position_bias": "a bias on the scores (Inkling's relative positions): added to M",
}
KNOWN = frozenset(SCALARS) | frozenset(CARRIED) | frozenset(FOLDED) | {SINKS}  # all accepted


def shipped(name: str) -> Path:
    """A spec shipped with indexattn: inside the wheel, or in a checkout's specs/."""
    here = Path(__file__).resolve().parent.parent
    return next(p for p in (here / "specs" / name, here.parent / "specs" / name) if p.exists())


class CoreAttention:
    """transformers' attention function computed by a core spec (see specs/gqa_core.attn):
    inputs Q_<grτa>, K_<gσa>, V_<gσc>, M_<τσ> (or M_<grτσ>, one per query head; and
    s_aux_<(gr)> for sinks), a scalar
    `scaling`, optionally `p` (dropout), `softcap` and `sliding_window`; output O_<grτc>, and
    optionally the weights."""

    def __init__(self, spec: CompiledSpec) -> None:
        self.spec, self.name = spec, spec.name
        self.scalars = {s for s, _ in spec.plain.scalars}
        self.sinks = SINKS in spec.arguments
        self.mask = mask_kind(spec)
        _check_core(spec, self.scalars)  # first: M, where declared, is the fourth argument
        self.heads = "M" in spec.arguments and len(spec.ir.arguments[3].indices) == 4
        self.taking = {"softcap": "softcap" in self.scalars, SINKS: self.sinks, HEADS: self.heads}
        self.given = tuple((k, scalar) for k, scalar in SCALARS.items() if scalar in self.scalars)

    def __call__(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        needed = needed_mask(attention_mask, query, key, kwargs, module)
        return self.run(module, query, key, value, attention_mask, needed, kwargs)

    def run(self, module, query, key, value, attention_mask, needed: str, kwargs: dict):
        """The call, the mask it needs (`needed_mask`) known."""
        given = self._keywords(module, query, kwargs)
        b, _, n, d = query.shape  # heads (g r) split by a view: no copy, no Python unflatten
        tensors = [query.view(b, key.shape[1], -1, n, d), key, value]  # TENSORS' order
        if self.mask == TENSOR:
            tensors.append(core_mask(attention_mask, query, key, kwargs, module, self.heads))
        elif self.mask != needed:
            raise NotImplementedError(
                f"attention spec {self.name!r} takes no mask: {MASK_KINDS[self.mask]}, and"
                f" {type(module).__name__}'s call needs {MASK_KINDS[needed]}: register it"
                " beside a core that takes M"
            )
        if self.sinks:  # last, as _check_core requires
            tensors.append(kwargs[SINKS].to(query.dtype))  # kept float32 by some (Flint)
        out = self.spec.in_order(tensors, given, training=module.training)
        out, weights = out if isinstance(out, tuple) else (out, None)
        if weights is None and kwargs.get("output_attentions"):
            raise NotImplementedError(
                f"output_attentions=True, and attention spec {self.name!r} outputs no weights:"
                " register a core spec that outputs them too (`output O, A`), or call the model"
                " without output_attentions"
            )
        return as_sdpa(out, weights, blind(attention_mask, key.shape[-2]))

    def _keywords(self, module: nn.Module, query: torch.Tensor, kwargs: dict) -> dict:
        """The spec's scalars from the layer's keywords; a keyword the spec cannot honour is an
        error naming it."""
        if not KNOWN.issuperset(kwargs):  # a decode step's every call: no set built
            unknown = sorted(kwargs.keys() - KNOWN)
            raise TypeError(
                f"attention spec {self.name!r} got {', '.join(unknown)} from"
                f" {type(module).__name__}, which indexattn does not know: use another"
                " attn_implementation for this model, or swap_attention with a layer spec"
            )
        self._refuse(module, kwargs)
        given = {}
        for keyword, scalar in self.given:
            value = kwargs.get(keyword)
            given[scalar] = _unset(scalar, module, query) if value is None else value
        return given

    def _refuse(self, module: nn.Module, kwargs: dict) -> None:
        """A keyword that changes the result, and that this spec has no scalar or input for."""
        asked = kwargs.get("softcap") is not None or kwargs.get(SINKS) is not None
        if not (asked or kwargs.get("dropout") or self.taking["softcap"] or self.sinks):
            return  # nothing asked of a plain core: nothing to refuse
        layer = type(module).__name__
        wants = {
            "p": kwargs.get("dropout") or 0.0,
            "softcap": kwargs.get("softcap"),
            SINKS: kwargs.get(SINKS),
        }
        has = {"p": "p" in self.scalars, "softcap": "softcap" in self.scalars, SINKS: self.sinks}
        for name, value in wants.items():
            if not has[name] and not (value is None or (not torch.is_tensor(value) and value == 0)):
                raise NotImplementedError(
                    f"{layer} passes {_keyword(name)}={_shown(value)}, and attention spec"
                    f" {self.name!r} declares no {name}: register a core spec with"
                    f" {_declaration(name)} (docs/models.md)"
                )
        if has["softcap"] and kwargs.get("softcap") is None:
            raise NotImplementedError(
                f"attention spec {self.name!r} caps its scores, and {layer} passes no"
                " softcap: use a core spec without softcap for this model"
            )
        if self.sinks and kwargs.get(SINKS) is None:
            raise NotImplementedError(
                f"attention spec {self.name!r} takes sinks, and {layer} passes no s_aux:"
                " use a core spec without s_aux for this model"
            )


def _unset(scalar: str, module: nn.Module, query: torch.Tensor) -> float:
    """A scalar's value where the layer passes None for it."""
    if scalar == "scaling":
        return unset_scaling(module, query)
    return {"p": 0.0, "sliding_window": math.inf}[scalar]


def unset_scaling(module: nn.Module, query: torch.Tensor) -> float:
    """The score scale of a layer that passes none: 1/√d_k, as sdpa; where the layer scales by
    flags of its own (GPT-2's in transformers 5.0: scale_attn_weights, 1/√d;
    scale_attn_by_inverse_layer_idx, 1/(layer_idx + 1)), the scale its eager computes."""
    if not hasattr(module, "scale_attn_weights"):
        return query.shape[-1] ** -0.5
    scale = query.shape[-1] ** -0.5 if module.scale_attn_weights else 1.0
    by_layer = getattr(module, "scale_attn_by_inverse_layer_idx", False)  # not GPTBigCode's
    return scale / (module.layer_idx + 1) if by_layer else scale


def _keyword(name: str) -> str:
    return {"p": "dropout"}.get(name, name)


def _shown(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else repr(value)


def _declaration(name: str) -> str:
    return {
        "p": "`scalar p` and `dropout(A, p)` on its weights",
        "softcap": "`scalar softcap` capping its scores",
        SINKS: "`input s_aux_<(gr)>` joining its softmax",
    }[name]


def _check_core(spec: CompiledSpec, scalars: set[str]) -> None:
    """Refuse, at registration, a spec that is not a core: its inputs, scalars and outputs."""
    inputs = spec.arguments[:-1] if spec.arguments[-1:] == (SINKS,) else spec.arguments
    problems = []
    if tuple(inputs) not in (TENSORS, TENSORS[:3]):  # the order the call passes them in
        problems.append(f"its inputs are {', '.join(spec.arguments)}, in this order")
    if "scaling" not in scalars:
        problems.append("it declares no scalar scaling")
    if spec.plain.outputs not in (1, 2):
        problems.append(f"it has {spec.plain.outputs} outputs")
    if problems:
        raise ValueError(
            f"spec {spec.name!r} is not an attention core: {'; '.join(problems)}. A core"
            " declares `input Q_<grτa>`, `input K_<gσa>`, `input V_<gσc>`, `input M_<τσ>`"
            " in this order (optionally `input s_aux_<(gr)>` last; no M where it is causal by"
            " a predicate, as gqa_causal_core.attn), `scalar scaling`, and outputs O_<grτc>"
            " (and optionally the weights): see specs/gqa_core.attn"
        )


def core_mask(
    mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor, kwargs: dict, module,
    heads: bool = False,
) -> torch.Tensor:  # fmt: skip
    """The layer's mask as a core spec takes it: additive, [batch, queries, keys], or, for a
    core with a mask per head (`heads`), [batch, h_kv, n_rep, queries, keys]. transformers
    gives [batch, 1, queries, keys] (float: 0 keeps; bool: True keeps; Doge's: [batch, h, ...],
    one per query head), or None where the
    layer relies on is_causal (then the causal mask, windowed by sliding_window, is built); a
    mask over more keys than the layer hands (transformers 5.0's BERT in generate, no cache) is
    read over its first N_kv, as eager and sdpa read it."""
    n, n_kv = query.shape[-2], key.shape[-2]
    if mask is None:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal
        seen = torch.ones(n, n_kv, dtype=torch.bool, device=query.device)
        if causal:
            seen = seen.tril(n_kv - n)
        window = kwargs.get("sliding_window")
        if window is not None:
            seen = seen.triu(n_kv - n - window + 1)
        mask = seen[None, None]
    mask = mask[..., :n_kv]
    if mask.dtype == torch.bool:
        mask = additive(mask, query.dtype)
    own = own_causal(module, n, n_kv)
    if own is not None:
        mask = mask + additive(own, query.dtype)  # eager's: where(own, S, min) + mask
    mask = folded(mask.to(query.dtype), kwargs)
    if mask.shape[1] not in (1, query.shape[1]) or (mask.shape[1] != 1 and not heads):
        raise NotImplementedError(
            f"a mask of shape {tuple(mask.shape)}: one per head; a core spec takes one mask"
            " for every head, [batch, 1, queries, keys], or, declaring `input M_<grτσ>`, one"
            " per query head (specs/gqa_heads_core.attn)"
        )
    if heads:  # the head axis (g r), as the queries' view splits it
        return mask.expand(-1, query.shape[1], -1, -1).unflatten(1, (key.shape[1], -1))
    return mask[:, 0]


def blind(mask: torch.Tensor | None, n_kv: int) -> torch.Tensor | None:
    """The queries that see no key by the mask the layer hands over, [batch, 1 or heads,
    queries, 1]: every key False (sdpa's boolean mask; a left padding's query) or -inf. None
    where the layer hands none (then every query sees a key), or a mask over more keys than
    it hands (transformers 5.0's BERT in generate: sdpa fails there, and the door reads it as
    eager does, `core_mask`, giving eager's result)."""
    if mask is None or mask.shape[-1] != n_kv:
        return None
    seen = mask if mask.dtype == torch.bool else mask > -math.inf
    return ~seen.any(-1, keepdim=True)


def as_sdpa(out: torch.Tensor, weights: torch.Tensor | None, blind: torch.Tensor | None):
    """The core's output [batch, g, r, queries, c] as transformers takes it, [batch, queries,
    heads (g r), c] (and the weights [batch, heads, queries, keys]), as torch's sdpa gives them
    on the mask handed over: zeros, values and gradients, where a query sees no key (`blind`),
    where the core's softmax over a row of the dtype's minimum gives the mean of V. A mask that
    hides by the dtype's minimum (eager's, `layer_mask`) blinds nothing: there the mean of V
    stays, as sdpa and eager give it. Filled after the transpose: the layout the core wrote
    stays (a layer's .view of it works)."""
    out = out.flatten(1, 2).transpose(1, 2)
    weights = None if weights is None else weights.flatten(1, 2)
    if blind is None:
        return out, weights
    weights = None if weights is None else weights.masked_fill(blind, 0)
    return out.masked_fill(blind.transpose(1, 2), 0), weights


def folded(mask: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """The additive mask with the keywords that are one with it (FOLDED), as eager reads them:
    `indices` [batch, queries, k], the keys each query selects (the layer hides the others in
    eager's mask, and hands them to any other implementation), and `position_bias`, added to
    the scores ([batch, heads, queries, keys]: a mask per head)."""
    indices, bias = kwargs.get("indices"), kwargs.get("position_bias")
    if indices is not None:
        chosen = torch.zeros(
            *indices.shape[:2], mask.shape[-1], dtype=torch.bool, device=mask.device
        )
        chosen = chosen.scatter(-1, indices.long(), True)[:, None]
        mask = torch.where(chosen, mask, torch.finfo(mask.dtype).min)
    return mask if bias is None else mask + bias.to(mask.dtype)


def per_head(mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether the core's mask is one per head: the layer's, or its position_bias."""
    bias = kwargs.get("position_bias")
    return (mask is not None and mask.shape[1] != 1) or (bias is not None and bias.shape[1] != 1)


def additive(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True sees) as an additive one: 0, or the dtype's minimum."""
    zeros = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
    return zeros.masked_fill(~seen, torch.finfo(dtype).min)


def own_causal(module: nn.Module, n: int, n_kv: int) -> torch.Tensor | None:
    """The causal mask a layer sets its scores by before adding the mask it hands over, [1, 1,
    queries, keys], or None: GPT-2's in transformers 5.0, its boolean buffer `bias` (a score it
    hides is the dtype's minimum, one both hide -inf, so where the door stands in for eager, a
    query that sees no key, a left padding's, spreads its weight over the keys up to it, where
    other layers' spread it over every key; where it stands in for sdpa, `as_sdpa` zeros it)."""
    buffer = getattr(module, "bias", None)
    if (
        not torch.is_tensor(buffer)
        or buffer.dtype != torch.bool
        or getattr(module, "is_cross_attention", False)
    ):
        return None
    return buffer[:, :, n_kv - n : n_kv, :n_kv]


TENSOR, CAUSAL, NONE = "tensor", "causal", "none"
MASK_KINDS = {  # what a core's mask is, and when the layer's call needs it
    TENSOR: "a mask tensor (padding, a window, or queries after cached keys)",
    CAUSAL: "causal over the same tokens (sdpa's is_causal)",
    NONE: "every query sees every key (one new query after its cache, or not causal)",
}


def mask_kind(spec: CompiledSpec) -> str:
    """A core's mask: an input M (TENSOR), an M its equations define, a predicate on the
    positions (CAUSAL, gqa_causal_core), or none at all (NONE, gqa_unmasked_core)."""
    if "M" in spec.arguments:
        return TENSOR
    defined = {equation.tensor.name for equation in spec.ir.equations}
    return CAUSAL if "M" in defined else NONE


def needed_mask(mask, query: torch.Tensor, key: torch.Tensor, kwargs: dict, module) -> str:
    """The mask a call needs, as sdpa reads it: none handed over (transformers' sdpa mask
    function skips one that hides nothing sdpa cannot) and causal, with no window shorter than
    the keys: CAUSAL where queries and keys are the same tokens, NONE where one query follows
    its cache (it sees every key) or the layer is not causal; else TENSOR."""
    if mask is not None or any(kwargs.get(keyword) is not None for keyword in FOLDED):
        return TENSOR
    n, n_kv = query.shape[-2], key.shape[-2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    window = kwargs.get("sliding_window")
    if not causal:
        return NONE
    if window is not None and window < n_kv:
        return TENSOR
    return CAUSAL if n == n_kv else NONE if n == 1 else TENSOR


class Cores:
    """Several core specs under one attn_implementation: each call runs one that takes what
    the layer hands over (a soft cap: softcap_core; sinks: sinks_core; a mask per query head:
    gqa_heads_core; none of them: gqa_core, or
    gqa_causal_core where the mask is plainly causal, or gqa_unmasked_core where the call
    needs none, `needed_mask`), or the first, which refuses what it lacks by name."""

    def __init__(self, cores: list[CoreAttention]) -> None:
        self.cores = cores
        self.picked: dict[tuple, CoreAttention] = {}  # (mask, softcap?, sinks?, per head?): core

    def __call__(self, module: nn.Module, query, key, value, attention_mask, **kwargs):
        needed = needed_mask(attention_mask, query, key, kwargs, module)
        core = self.pick(needed, kwargs, attention_mask)
        return core.run(module, query, key, value, attention_mask, needed, kwargs)

    def pick(self, needed: str, kwargs: dict, mask: torch.Tensor | None) -> CoreAttention:
        heads = per_head(mask, kwargs)
        key = (needed, kwargs.get("softcap") is not None, kwargs.get(SINKS) is not None, heads)
        found = self.picked.get(key)
        if found is None:
            given = {"softcap": key[1], SINKS: key[2], HEADS: heads}
            matching = [c for c in self.cores if c.taking == given] or self.cores[:1]
            found = self.picked[key] = next((c for c in matching if c.mask == needed), matching[0])
        return found


def layer_mask(*args, config=None, **kwargs) -> torch.Tensor | None:
    """The mask an indexattn model's layers get: the one of the implementation the door stands
    in for, the one transformers runs the family with (`handed`). sdpa's (transformers'
    sdpa_mask: boolean, none where it is plainly causal or plainly sees every key), always
    built for BUILT; eager's (float, the dtype's minimum hiding) for a family transformers does
    not run with sdpa: transformers never called its layers without a mask, and their
    is_causal may not say what the mask did (BigBirdPegasus's decoder: False, its mask causal).
    A query that sees no key then gets what that implementation gives it (`as_sdpa`): sdpa's
    zeros, eager's mean of V. Once a decode step: the family is read off the config's class (a
    config instance's attributes go through transformers' own lookup)."""
    kind = SDPA if config is None else handed(getattr(type(config), "model_type", ""))
    if kind == EAGER:
        return masks().eager_mask(*args, config=config, **kwargs)
    if kind == BUILT_SDPA:
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return masks().sdpa_mask(*args, config=config, **kwargs)


BUILT = {  # families whose layers read the mask as built, and sdpa's skipped one wrongly: why
    "doge": "its dynamic mask adds the one handed over, and is not causal without it (5.0)",
}
SDPA, BUILT_SDPA, EAGER = "sdpa", "sdpa, built", "eager"  # the mask a family is handed


def masks():
    """transformers' masking_utils (imported when first asked for: a look-up after)."""
    from transformers import masking_utils

    return masking_utils


# Memos by model type, as plain dicts: torch.compile traces a model's mask function, and
# warns at each functools.cache it meets there (docs/decisions.md, "Memos Dynamo traces").
HANDED: dict[str, str] = {}


def handed(model_type: str) -> str:
    """The mask a family's layers are handed: EAGER where transformers does not run it with
    sdpa, BUILT_SDPA for BUILT, else SDPA."""
    found = HANDED.get(model_type)
    if found is None:
        found = EAGER if not runs_sdpa(model_type) else BUILT_SDPA if model_type in BUILT else SDPA
        HANDED[model_type] = found
    return found


def runs_sdpa(model_type: str) -> bool:
    """Whether transformers runs the family's models with sdpa (True where it is not known)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type)
    return name is None or getattr(getattr(transformers, name, None), "_supports_sdpa", True)


DEFAULT = "indexattn"
SHIPPED = (
    "gqa_core.attn",
    "gqa_causal_core.attn",
    "gqa_unmasked_core.attn",
    "softcap_core.attn",
    "sinks_core.attn",
    "gqa_heads_core.attn",
)


def register(
    name: str, spec: CompiledSpec | str | Path, *more, backend: str = "auto"
) -> CoreAttention | Cores:
    """Make `attn_implementation=name` run the core spec `spec`, in every model; with `more`
    specs, each call runs the first whose soft cap and sinks are what the layer hands over.
    `backend`: what computes each spec's attention core (docs/backends.md).

    >>> register("my_core", "my_core.attn")  # doctest: +SKIP
    >>> AutoModelForCausalLM.from_config(config, attn_implementation="my_core")  # doctest: +SKIP

    The mask is sdpa's: none where it is plainly causal (then a core without M runs, else the
    causal mask is built), else boolean [batch, 1, queries, keys], given to the spec additive.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from .guard import NAMES, install

    cores = [
        CoreAttention(
            s.with_backend(backend)
            if isinstance(s, CompiledSpec) and backend != "auto"
            else s
            if isinstance(s, CompiledSpec)
            else compile_spec(s, backend=backend)
        )
        for s in (spec, *more)
    ]
    function = cores[0] if not more else Cores(cores)
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, layer_mask)
    NAMES.add(name)
    install()
    return function
