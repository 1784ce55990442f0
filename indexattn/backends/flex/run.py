"""What a module generated with backend="flex" calls: FlexAttention on (…, heads, sequence,
width) tensors, compiled once per shape family (torch.compile's automatic dynamic sizes: the
second length recompiles once with sizes symbolic, none after; not `dynamic=True`, which makes
float scalars graph inputs that inductor's CPU lowering of flex_attention cannot take), and the
block mask of a call, made once per shape where it reads positions alone."""

from __future__ import annotations

import functools

import torch

from . import masks

COMPILE = True  # False: flex_attention's eager path (every score: for tests at small sizes)
BLOCK = 128  # queries and keys per block of the block mask
_MASKS: dict = {}  # block masks of positions, by shape (the newest MAX_MASKS)
MAX_MASKS = 8


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(
        flex_attention
    )  # sizes go dynamic at the second length: no recompile after


def attention(
    q,
    k,
    v,
    *,
    scale,
    score_mod=None,
    block_mask=None,
    enable_gqa=False,
    dropout=None,
    training=False,
):
    """softmax(score_mod(scale · q·k)) · v where block_mask keeps; q, k, v (…, heads, sequence,
    width), the batch axes flattened into FlexAttention's one (or one added)."""
    if training and dropout:
        raise ValueError(
            "backend='flex': FlexAttention has no dropout on the attention weights; call "
            "with training=False, set the dropout probability to 0, or use backend='blocks'"
        )
    if (
        q.device.type == "cpu"
        and torch.is_grad_enabled()
        and any(x.requires_grad for x in (q, k, v))
    ):
        raise ValueError(
            "backend='flex': FlexAttention has no backward on a CPU; run under torch.no_grad(), "
            "or use backend='blocks' (or 'auto', which takes it on a CPU)"
        )
    from torch.nn.attention.flex_attention import flex_attention

    lead = q.shape[:-3]
    q4, k4, v4 = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))
    call = _compiled() if COMPILE else flex_attention
    out = call(
        q4, k4, v4, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
    )
    return out.reshape(*lead, *out.shape[-3:])


def flat(x: torch.Tensor, own: int) -> torch.Tensor:
    """A tensor score_mod reads, its batch axes flattened into one (FlexAttention's b)."""
    return x.reshape(-1, *x.shape[x.dim() - own :])


def block_mask(mask_mod, box, stats=(), *, batch, heads, n_q, n_kv, device):
    """The call's BlockMask (masks.build); one of positions alone (no `stats`, no tensor
    bound) made once per shape and kept."""
    bound = getattr(mask_mod, "keywords", {})
    key = None
    if not stats and not any(isinstance(x, torch.Tensor) for x in bound.values()):
        key = (
            getattr(mask_mod, "func", mask_mod),
            tuple(sorted(bound.items())),
            batch,
            heads,
            n_q,
            n_kv,
            str(device),
        )
        if key in _MASKS:
            return _MASKS[key]
    with torch.no_grad():
        made = masks.build(
            mask_mod,
            box,
            stats,
            batch=batch,
            heads=heads,
            n_q=n_q,
            n_kv=n_kv,
            block=BLOCK,
            device=device,
        )
    if key is not None:
        while len(_MASKS) >= MAX_MASKS:
            _MASKS.pop(next(iter(_MASKS)))
        _MASKS[key] = made
    return made


def bind(function, /, **values):
    """The function with its keywords bound: what FlexAttention calls (a partial)."""
    return functools.partial(function, **values)
