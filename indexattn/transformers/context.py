"""A transformers model with its sequence split over processes: each rank holds a block of the
tokens and of their position_ids, rotary reads those global positions, and each layer's
attention core (specs/gqa_causal_core.attn) runs split over the sequence (ring or Ulysses,
indexattn.distributed.context_parallel) in place of attn_implementation="indexattn".

>>> model = indexattn.distributed.context_parallel_model(model, mesh)  # doctest: +SKIP
>>> block = functools.partial(sequence_block, mesh=mesh, dim=1)  # doctest: +SKIP
>>> out = model(input_ids=block(ids), position_ids=block(positions))  # doctest: +SKIP

Imported by indexattn.distributed.context_parallel_model only: it imports transformers.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..spec import compile_spec
from .attention import CARRIED, SCALARS, SINKS, shipped
from .guard import NAMES, install

CORE = "gqa_causal_core.attn"  # the core the split runs: causal over global positions
REFUSED = {  # keywords a layer may pass that the causal core split cannot honour, and why
    "sliding_window": "a window (use strategy='ring' on a layer spec with a window)",
    "softcap": "soft-capped scores",
    "s_aux": "attention sinks",
    "cu_seq_lens_q": "packed sequences",
    "cu_seq_lens_k": "packed sequences",
    "output_attentions": "returned weights",
}


class ContextAttention:
    """transformers' attention function over this rank's block of queries, keys and values:
    the causal core split over `mesh` by `strategy` (by `split_core`, which is
    indexattn.distributed.context_parallel), one core module per shape and scale."""

    def __init__(self, mesh: DeviceMesh, strategy: str, layout, split_core) -> None:
        self.mesh, self.strategy, self.layout = mesh, strategy, layout
        self.split_core = split_core
        self.spec = compile_spec(shipped(CORE))
        self.cores: dict[tuple, nn.Module] = {}

    def __call__(self, module: nn.Module, query, key, value, attention_mask, **kwargs):
        _refuse(module, attention_mask, kwargs)
        b, _, n, d = query.shape
        h_kv = key.shape[1]
        scaling = kwargs.get("scaling") or d**-0.5
        core = self.core(h_kv, query.shape[1] // h_kv, d, value.shape[-1], scaling)
        out = core(query.view(b, h_kv, -1, n, d), key, value)
        return out.flatten(1, 2).transpose(1, 2), None

    def core(self, h_kv: int, n_rep: int, d_k: int, d_v: int, scaling: float) -> nn.Module:
        shape = (h_kv, n_rep, d_k, d_v, float(scaling))
        if shape not in self.cores:
            sizes = dict(zip(("h_kv", "n_rep", "d_k", "d_v"), shape))
            module = self.spec.module(**sizes, scaling=scaling)
            self.cores[shape] = self.split_core(
                module, self.mesh, strategy=self.strategy, layout=self.layout
            )
        return self.cores[shape]


def _refuse(module: nn.Module, attention_mask, kwargs: dict) -> None:
    """What the split causal core cannot compute, by name."""
    layer = type(module).__name__
    unknown = sorted(kwargs.keys() - SCALARS.keys() - CARRIED.keys() - {SINKS})
    if unknown:
        raise TypeError(
            f"{layer} passes {', '.join(unknown)}, which a context-parallel model does not know:"
            " split this model's layers with indexattn.distributed.context_parallel on a spec"
        )
    if attention_mask is not None:
        raise NotImplementedError(f"{layer} got an attention mask: {_PADDING}")
    if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
        raise NotImplementedError(
            f"{layer} is not causal, and a context-parallel model runs {CORE}: split a"
            " bidirectional model's layers with indexattn.distributed.context_parallel on a spec"
        )
    for name, why in REFUSED.items():
        if kwargs.get(name) is not None and kwargs[name] is not False:
            raise NotImplementedError(
                f"{layer} passes {name}: {why} is not in {CORE}, the core a context-parallel"
                " model runs; swap its layers for a layer spec and split them with"
                " indexattn.distributed.context_parallel"
            )
    if module.training and kwargs.get("dropout"):
        raise NotImplementedError(
            f"{layer} passes dropout={kwargs['dropout']} in training: attention dropout is not"
            " split over the sequence; set the config's attention_dropout to 0"
        )


_PADDING = (
    "a context-parallel model takes whole sequences, causal over their global positions:"
    " no padding mask (pack the batch, pad at the end and ignore those labels, or"
    " drop attention_mask)"
)


def _no_mask(*args, attention_mask=None, **kwargs):
    """transformers' mask function for the split: the core's mask is causal over global
    positions, a block's local mask would be wrong; a padding mask is refused."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise NotImplementedError(f"attention_mask hides some tokens: {_PADDING}")


BLOCKS = ("input_ids", "inputs_embeds", "position_ids", "labels", "shift_labels")


def _needs_positions(layout, model: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """position_ids required; the cache off (it would hold this rank's block of keys only);
    labels only shifted on the whole sequence (shift_labels); blocks cut in `layout`."""
    if kwargs.get("position_ids") is None:
        raise ValueError(
            f"{type(model).__name__} is split over the sequence: pass position_ids, this rank's"
            " block of the global positions (sequence_block(positions, mesh, dim=1,"
            f" layout={layout.name!r})), or rotary would read the block's own 0, 1, ..."
        )
    for key in BLOCKS:
        found = getattr(kwargs.get(key), "_sequence_layout", None)
        if found is not None and found != layout:
            raise ValueError(
                f"{type(model).__name__}: {key} is a {found} block, and the model was split"
                f" for {layout} blocks: pass layout={layout.name!r} to sequence_block, or"
                f" split the model with layout={found.name!r}"
            )
    if kwargs.get("use_cache"):
        raise ValueError(
            f"{type(model).__name__} is split over the sequence: call it with use_cache=False"
            " (a cache would hold this rank's block of keys only)"
        )
    if kwargs.get("labels") is not None and kwargs.get("shift_labels") is None:
        raise ValueError(
            f"{type(model).__name__} is split over the sequence: labels shifted inside a block"
            " would give its last token no label; shift them on the whole sequence and pass"
            " this rank's block as shift_labels too (with num_items_in_batch, the whole"
            " batch's count, so that the ranks' losses add up to the one process's)"
        )
    return args, {**kwargs, "use_cache": False}


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
    model.register_forward_pre_hook(functools.partial(_needs_positions, layout), with_kwargs=True)
    return model
