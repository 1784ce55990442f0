"""A transformers attention layer called as its model calls it, for `lift(layer, x,
position_embeddings=rotary, attention_mask=mask_function)`: the rotary module run on the
positions 0..n-1, the mask function on the query and key positions (a predicate, True where a
key is seen), inside the graph that is exported, so that both are lifted as the layer is."""

from __future__ import annotations

import torch
from torch import nn

from .errors import LiftError


class Call(nn.Module):
    """`Call(layer, position_embeddings=rotary, attention_mask=mask_fn)(x)`: the layer's first
    output, given what its model gives it, computed from x's positions."""

    def __init__(self, layer: nn.Module, keywords: dict) -> None:
        super().__init__()
        self.layer = layer
        self.made = {}
        for name, value in keywords.items():
            if isinstance(value, nn.Module):
                if hasattr(self, "rotary"):
                    raise LiftError("lift takes one module among the keywords (the rotary one)")
                self.rotary = value  # its buffers named rotary_..., the layer's weights layer_...
            elif value is not None and not callable(value):
                raise LiftError(
                    f"{name}={type(value).__name__}: lift takes a keyword as a module run on "
                    "the positions (position_embeddings=model.rotary_emb) or a mask function "
                    "(attention_mask=causal_mask_function); pass tensors positionally"
                )
            self.made[name] = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        given = {name: self.make(value, x, n) for name, value in self.made.items()}
        out = self.layer(x, **given)
        return out[0] if isinstance(out, tuple) else out

    def make(self, value, x: torch.Tensor, n: int):
        if value is None:  # what the model hands this layer as None (Falcon's alibi)
            return None
        if isinstance(value, nn.Module):  # the rotary table of positions 0..n-1
            return value(x, torch.arange(n, device=x.device)[None])
        queries = torch.arange(n, device=x.device)[:, None]
        keys = torch.arange(n, device=x.device)[None, :]  # a second range: τ' apart from τ
        seen = value(0, 0, queries, keys)[None, None]  # [batch, head, query, key]
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.where(seen, zero, float("-inf"))  # additive, as eager layers add it
