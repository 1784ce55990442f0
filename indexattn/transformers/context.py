"""A transformers model with its sequence split over processes: each rank holds a block of the
tokens and of their position_ids, rotary reads those global positions, and each layer's
attention core runs split over the sequence (ring or Ulysses,
indexattn.distributed.context_parallel) in place of attn_implementation="indexattn": the core
of the layer's kind (`Kind`: causal, a window, a chunk, a soft cap, sinks), its mask a
predicate on the global positions.

>>> model = indexattn.distributed.context_parallel_model(model, mesh)  # doctest: +SKIP
>>> block = functools.partial(sequence_block, mesh=mesh, dim=1)  # doctest: +SKIP
>>> out = model(input_ids=block(ids), position_ids=block(positions))  # doctest: +SKIP

Imported by indexattn.distributed.context_parallel_model only: it imports transformers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..parallel.agree import agree, block_refused, described
from ..spec import compile_spec
from .attention import CARRIED, SCALARS, SINKS, shipped, unset_scaling
from .guard import NAMES, install

REFUSED = {  # keywords a layer may pass that no split core honours, and why
    "cu_seq_lens_q": "packed sequences",
    "cu_seq_lens_k": "packed sequences",
    "output_attentions": "returned weights",
}
SPLIT_KINDS = ("full_attention", "sliding_attention", "chunked_attention")  # config.layer_types'


@dataclass(frozen=True)
class Kind:
    """What one layer's attention asks of the split core: its window (keys a query sees,
    itself included; None: every key before it), its chunk (Llama 4's chunked layers), its
    soft cap (Gemma 2), and whether it has sinks (GPT-OSS)."""

    window: int | None = None
    chunk: int | None = None
    softcap: float | None = None
    sinks: bool = False

    def core(self) -> str:
        """The shipped core spec that computes this kind, or "" where none does."""
        if self.chunk is not None:
            plain = self.window is None and self.softcap is None and not self.sinks
            return "gqa_chunked_core.attn" if plain else ""
        if self.sinks:
            return "" if self.softcap is not None else "sinks_window_core.attn"
        if self.softcap is not None:
            return "softcap_window_core.attn"
        return "gqa_causal_core.attn" if self.window is None else "gqa_window_core.attn"

    def scalars(self, scaling: float) -> dict:
        """The core's scalars: the layer's scale and this kind's window, chunk or cap."""
        given = {"scaling": scaling}
        if self.chunk is not None:
            return {**given, "attention_chunk_size": self.chunk}
        if self.softcap is not None:
            given["softcap"] = self.softcap
        if self.window is not None or self.core() != "gqa_causal_core.attn":
            given["sliding_window"] = math.inf if self.window is None else self.window
        return given


def _layer(module: nn.Module) -> str:
    index = getattr(module, "layer_idx", None)
    return type(module).__name__ + ("" if index is None else f" (layer {index})")


def kind_of(module: nn.Module, kwargs: dict) -> Kind:
    """The layer's kind, from what it passes (sliding_window, softcap, s_aux) and its config's
    layer_types entry (a chunked layer passes no chunk: its mask holds it); a kind no core
    splits, or a window the config's layer type contradicts, is refused by name."""
    config = getattr(module, "config", None)
    types, index = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    declared = types[index] if types is not None and index is not None else None
    window = kwargs.get("sliding_window")
    if declared is not None and declared not in SPLIT_KINDS:
        raise NotImplementedError(
            f"{_layer(module)} is a {declared!r} layer (config.layer_types), and a"
            f" context-parallel model splits {', '.join(SPLIT_KINDS)} layers only: split this"
            " model's layers with indexattn.distributed.context_parallel on a spec"
        )
    sliding = declared == "sliding_attention"
    if declared in SPLIT_KINDS[:2] and sliding != (window is not None):
        raise NotImplementedError(
            f"{_layer(module)} is a {declared!r} layer and passes sliding_window={window!r}:"
            " the mask transformers builds and the window the layer passes disagree; give the"
            " layer its config's sliding_window, or use one process"
        )
    chunk = config.attention_chunk_size if declared == "chunked_attention" else None
    kind = Kind(window, chunk, kwargs.get("softcap"), kwargs.get(SINKS) is not None)
    if not kind.core():
        raise NotImplementedError(
            f"{_layer(module)} asks for {kind}, and no core a context-parallel model runs"
            " takes all of that at once: swap its layers for a layer spec that does and split"
            " them with indexattn.distributed.context_parallel"
        )
    return kind


class _Share(torch.autograd.Function):
    """A whole input of the split core (the sinks), its gradient each rank's share: the split
    core gives every rank the gradient of all ranks' losses, and the model's gradients are
    summed over the ranks afterwards (sum_gradients, FSDP), so each rank keeps 1/w of it."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, world: int) -> torch.Tensor:
        ctx.world = world
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad / ctx.world, None


class ContextAttention:
    """transformers' attention function over this rank's block of queries, keys and values:
    the core of each layer's kind (`kind_of`) split over `mesh` by `strategy` (by `split_core`,
    which is indexattn.distributed.context_parallel), one core module per kind, shape and
    scale."""

    def __init__(self, mesh: DeviceMesh, strategy: str, layout, split_core) -> None:
        self.mesh, self.strategy, self.layout = mesh, strategy, layout
        self.split_core = split_core
        self.specs: dict[str, object] = {}
        self.cores: dict[tuple, nn.Module] = {}

    def __call__(self, module: nn.Module, query, key, value, attention_mask, **kwargs):
        _refuse(module, attention_mask, kwargs)
        kind = self.kind(module, kwargs)
        b, _, n, d = query.shape
        h_kv = key.shape[1]
        scaling = kwargs.get("scaling")
        scaling = unset_scaling(module, query) if scaling is None else scaling
        core = self.core(kind, (h_kv, query.shape[1] // h_kv, d, value.shape[-1]), scaling)
        tensors = [query.view(b, h_kv, -1, n, d), key, value]
        if kind.sinks:  # last, as the core declares it; kept float32 by some (Flint)
            tensors.append(_Share.apply(kwargs[SINKS].to(query.dtype), self.mesh.size()))
        out = core(*tensors)
        return out.flatten(1, 2).transpose(1, 2), None

    def kind(self, module: nn.Module, kwargs: dict) -> Kind:
        return kind_of(module, kwargs)

    def core(self, kind: Kind, sizes: tuple, scaling: float) -> nn.Module:
        found = (kind, *sizes, float(scaling))
        if found not in self.cores:
            name = kind.core()
            if name not in self.specs:
                self.specs[name] = compile_spec(shipped(name))
            named = dict(zip(("h_kv", "n_rep", "d_k", "d_v"), sizes))
            module = self.specs[name].module(**named, **kind.scalars(float(scaling)))
            self.cores[found] = self.split_core(
                module, self.mesh, strategy=self.strategy, layout=self.layout
            )
        return self.cores[found]


def _refuse(module: nn.Module, attention_mask, kwargs: dict) -> None:
    """What no split core can compute, by name: the layer, what it asks, what to do."""
    layer = _layer(module)
    unknown = sorted(kwargs.keys() - SCALARS.keys() - CARRIED.keys() - {SINKS})
    if unknown:
        raise TypeError(
            f"{layer} passes {', '.join(unknown)}, which a context-parallel model does not know:"
            " split this model's layers with indexattn.distributed.context_parallel on a spec"
        )
    if attention_mask is not None:
        raise NotImplementedError(
            f"{layer} got an attention mask of shape {tuple(attention_mask.shape)} (a padding"
            " mask, or one the layer builds, as Doge's): a context-parallel model's mask is a"
            f" predicate on the global positions; {_PADDING}"
        )
    if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
        raise NotImplementedError(
            f"{layer} is not causal, and a context-parallel model's cores are: split a"
            " bidirectional model's layers with indexattn.distributed.context_parallel on a spec"
        )
    for name, why in REFUSED.items():
        if kwargs.get(name) is not None and kwargs[name] is not False:
            raise NotImplementedError(
                f"{layer} passes {name}: {why} are in no core a context-parallel model runs;"
                " swap its layers for a layer spec and split them with"
                " indexattn.distributed.context_parallel"
            )
    if module.training and kwargs.get("dropout"):
        raise NotImplementedError(
            f"{layer} passes dropout={kwargs['dropout']} in training: attention dropout is not"
            " split over the sequence; set the config's attention_dropout to 0"
        )
    if getattr(module, "attn_temperature_tuning", False) and not getattr(module, "use_rope", 1):
        raise NotImplementedError(
            f"{layer} scales its queries by their positions counted in its own block"
            " (Llama 4's attn_temperature_tuning on a layer without rotary), not the global"
            " positions: set the config's attn_temperature_tuning=False, or use one process"
        )


_PADDING = (
    "a context-parallel model takes whole sequences, its mask a predicate on their global"
    " positions: no padding mask (pack the batch, pad at the end and ignore those labels, or"
    " drop attention_mask)"
)


def _padded(mask: torch.Tensor | None) -> str | None:
    """Why a padding mask is refused, where it hides some token; None: none."""
    if mask is not None and not bool(mask.all()):
        return f"attention_mask hides some tokens: {_PADDING}"
    return None


def _no_mask(*args, attention_mask=None, **kwargs):
    """transformers' mask function for the split: the core's mask is causal over global
    positions, a block's local mask would be wrong; a padding mask is refused (where the
    model's call did not name it: passed by position)."""
    refused = _padded(attention_mask)
    if refused is not None:
        raise NotImplementedError(refused)


BLOCKS = ("input_ids", "inputs_embeds", "position_ids", "labels", "shift_labels")


def _checked(layout, mesh, model: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """The model's call with the cache off, where every rank's call passes `_refusal` and
    the ranks were called alike (agree.py): else every rank raises the same ValueError, so
    that no rank goes on into a layer's collectives while another has raised (a batch padded
    at the end pads the last rank's block alone)."""
    name, refused = type(model).__name__, _refusal(layout, mesh, model, kwargs)
    if mesh.size() > 1:
        given = {key: kwargs.get(key) for key in (*BLOCKS, "attention_mask")}
        agree(name, mesh, described(given, {}, model.training), refused, "model")
    elif refused is not None:
        raise ValueError(refused)
    return args, {**kwargs, "use_cache": False}


def _refusal(layout, mesh, model: nn.Module, kwargs: dict) -> str | None:
    """Why this rank refuses the model's call, or None: position_ids required; blocks cut in
    `layout` for this rank of `mesh`; the cache off (it would hold this rank's block of keys
    only); labels only shifted on the whole sequence (shift_labels); no padding mask."""
    name = type(model).__name__
    if kwargs.get("position_ids") is None:
        return (
            f"{name} is split over the sequence: pass position_ids, this rank's block of the"
            " global positions (sequence_block(positions, mesh, dim=1,"
            f" layout={layout.name!r})), or rotary would read the block's own 0, 1, ..."
        )
    refused = block_refused(name, kwargs, BLOCKS, layout, mesh, "model")
    if refused is not None:
        return refused
    if kwargs.get("use_cache"):
        return (
            f"{name} is split over the sequence: call it with use_cache=False"
            " (a cache would hold this rank's block of keys only)"
        )
    if kwargs.get("labels") is not None and kwargs.get("shift_labels") is None:
        return (
            f"{name} is split over the sequence: labels shifted inside a block"
            " would give its last token no label; shift them on the whole sequence and pass"
            " this rank's block as shift_labels too (with num_items_in_batch, the whole"
            " batch's count, so that the ranks' losses add up to the one process's)"
        )
    return _padded(kwargs.get("attention_mask"))


# (id of the mesh, strategy, layout) -> the mesh and its function's registered name; the mesh
# is kept, so that its id is never another mesh's (equal meshes may hold other groups)
_FUNCTIONS: dict[tuple, tuple[DeviceMesh, str]] = {}


def split(model: nn.Module, mesh: DeviceMesh, strategy: str, layout, split_core) -> nn.Module:
    """See indexattn.distributed.context_parallel_model, which passes its context_parallel as
    `split_core` (this module imports nothing of indexattn.distributed: no import cycle)."""
    if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
        raise ValueError("context_parallel_model needs a 1-D DeviceMesh (mesh['cp'] of a 2-D one)")
    found = (id(mesh), strategy, layout)
    if found not in _FUNCTIONS:
        name = f"indexattn_context_{len(_FUNCTIONS)}"
        AttentionInterface.register(name, ContextAttention(mesh, strategy, layout, split_core))
        AttentionMaskInterface.register(name, _no_mask)
        NAMES.add(name)
        install()
        _FUNCTIONS[found] = mesh, name
    model.set_attn_implementation(_FUNCTIONS[found][1])
    hook = functools.partial(_checked, layout, mesh)
    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model
