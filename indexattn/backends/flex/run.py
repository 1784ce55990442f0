"""What a module generated with backend="flex" calls: FlexAttention on (…, heads, sequence,
width) tensors, compiled once per shape family on a GPU (torch.compile's automatic dynamic
sizes: the second length recompiles once with sizes symbolic, none after; not `dynamic=True`,
which makes float scalars graph inputs that inductor's CPU lowering of flex_attention cannot
take), once per shape on a CPU (its flex kernel fails to build with symbolic sizes), and the
block mask of a call, made once per shape and inputs it reads."""

from __future__ import annotations

import functools

import torch

from . import DROPOUT, SMALLEST_WIDTH, masks, narrow

COMPILE = True  # False: flex_attention's eager path (every score: for tests at small sizes)
BLOCK = 128  # queries and keys per block of the block mask
_MASKS: dict = {}  # block masks, with the inputs they read, by shape (the newest MAX_MASKS)
MAX_MASKS = 8
RECOMPILES = 64  # kernels of flex_attention kept on a CPU (shapes × score_mods)


@functools.cache
def _compiled(static: bool):
    """flex_attention compiled; `static`: a recompile per shape (inductor's CPU flex kernel
    does not build with symbolic sizes: `cur_qSplitSize` undeclared at the second length)."""
    from torch.nn.attention.flex_attention import flex_attention

    if static:  # a kernel per shape and per score_mod: more than dynamo's 8 before eager
        limits = torch._dynamo.config
        limits.recompile_limit = max(limits.recompile_limit, RECOMPILES)
    return torch.compile(flex_attention, dynamic=False if static else None)


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
        raise ValueError(f"backend='flex': {DROPOUT}")
    if q.device.type != "cpu" and min(q.size(-1), v.size(-1)) < SMALLEST_WIDTH:
        raise ValueError(f"backend='flex': {narrow(q.size(-1), v.size(-1))}")
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
    call = _compiled(q.device.type == "cpu") if COMPILE else flex_attention
    out = call(
        q4, k4, v4, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
    )
    return out.reshape(*lead, *out.shape[-3:])


def flat(x: torch.Tensor, own: int) -> torch.Tensor:
    """A tensor score_mod reads, its batch axes flattened into one (FlexAttention's b)."""
    return x.reshape(-1, *x.shape[x.dim() - own :])


def block_mask(mask_mod, box, stats=(), *, batch, heads, n_q, n_kv, device):
    """The call's BlockMask (masks.build), kept by shape and by the values of the tensors it
    reads (a copy of each, O(N) integers, compared at the next call): made once per shape for a
    mask of positions, once per batch of document ids shared by a model's layers."""
    bound = getattr(mask_mod, "keywords", {})
    reads = [x for _, x in sorted(bound.items()) if isinstance(x, torch.Tensor)]
    reads += [st[3] for st in stats]
    key = (
        getattr(mask_mod, "func", mask_mod),
        tuple((k, x) for k, x in sorted(bound.items()) if not isinstance(x, torch.Tensor)),
        tuple((x.shape, x.dtype) for x in reads),
        batch,
        heads,
        n_q,
        n_kv,
        str(device),
    )
    kept = _MASKS.get(key)
    if kept is not None and all(torch.equal(a, b) for a, b in zip(kept[0], reads)):
        return kept[1]
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
    _MASKS.pop(key, None)
    while len(_MASKS) >= MAX_MASKS:
        _MASKS.pop(next(iter(_MASKS)))
    _MASKS[key] = (tuple(x.detach().clone() for x in reads), made)
    return made


def bind(function, /, **values):
    """The function with its keywords bound: what FlexAttention calls (a partial)."""
    return functools.partial(function, **values)
