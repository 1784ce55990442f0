"""`lift(module, *example_inputs)`: the stages run in order, the spec checked, the module of
the spec built with the module's own weights."""

from __future__ import annotations

import torch
from torch import nn

from .calls import Call
from .check import check
from .errors import LiftError
from .export import export_module
from .facts import facts
from .text import Text, spec_text


class Lifted(nn.Module):
    """The lifted spec as a layer: the spec's module with the original's parameters and
    buffers copied, called with the original's positional inputs. `spec` is the compiled
    spec, `spec_text` its source."""

    def __init__(self, spec, text: Text, module: nn.Module) -> None:
        super().__init__()
        state = dict(module.state_dict(keep_vars=False))
        state.update(dict(module.named_buffers()))  # non-persistent buffers (inv_freq) too
        buffers = {
            name: state[target].detach().clone()
            for name, target in text.weights
            if target not in dict(module.named_parameters())
        }
        self.layer = spec.module(**text.sizes, **buffers)
        with torch.no_grad():
            for name, target in text.weights:
                getattr_or = dict(self.layer.named_parameters()).get(name)
                if getattr_or is not None:
                    getattr_or.copy_(state[target])
        self.spec, self.spec_text, self.sizes = spec, text.text, dict(text.sizes)
        self.weights = dict(text.weights)

    def forward(self, *inputs):
        return self.layer(*inputs)


def lift(
    module: nn.Module,
    *example_inputs: torch.Tensor,
    check_sizes: tuple = (),
    name: str = "",
    **keywords,
) -> Lifted:
    """`lifted = lift(layer, x)`: the spec `layer` computes, as a module with its weights.
    Keywords are what a model hands its layer, made from x's positions (calls.py):
    `lift(attn, x, position_embeddings=model.rotary_emb, attention_mask=causal_mask_function)`.

    >>> layer = torch.nn.MultiheadAttention(8, 2, batch_first=True)  # doctest: +SKIP
    """
    from ..spec import compile_spec

    title = name or type(module).__name__
    if keywords:
        module = Call(module, keywords)
    exported = export_module(module, *example_inputs)
    found = facts(exported)
    text = spec_text(found, f"{title}, lifted")
    try:
        spec = compile_spec(text.text, name=_stem(title))
    except Exception as error:
        raise LiftError(f"the lifted spec does not compile:\n{text.text}\n{error}") from error
    lifted = Lifted(spec, text, module)
    check(lifted, module, example_inputs, check_sizes)
    if keywords:  # the keys of the layer lifted, not of its Call (rotary.inv_freq stays)
        lifted.weights = {k: v.removeprefix("layer.") for k, v in lifted.weights.items()}
    return lifted


def _stem(title: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in title).lower() or "lifted"
