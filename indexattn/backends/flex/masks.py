"""A `BlockMask` from a core's block test (mods.box): each block of queries × keys full, empty or
partial as the test reads it off the blocks' first and last positions and the least and
greatest ids each block reads (O(N / block) per tensor, in the tensor's own dtype); only the
blocks it cannot tell, at the edges of what the mask keeps, are read entry by entry through the
mask_mod (O(N · block) for a causal, windowed or document mask), never all N² entries."""

from __future__ import annotations

import torch

CHUNK = 256  # blocks read entry by entry at once


def tile_ends(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The least and greatest of each block of `size` along the last axis (the batch axes
    flattened into one), in x's dtype: the last block padded with its last entry."""
    x = x.reshape(-1, x.shape[-1])
    pad = -x.shape[-1] % size
    if pad:
        x = torch.cat([x, x[:, -1:].expand(-1, pad)], -1)
    x = x.unflatten(-1, (-1, size))
    return x.amin(-1), x.amax(-1)


def build(
    mask_mod,
    box,
    stats: tuple[tuple[str, str, str, torch.Tensor], ...],
    *,
    batch: int,
    heads: int,
    n_q: int,
    n_kv: int,
    block: int,
    device,
):
    """The BlockMask. `box(q0, q1, k0, k1, h, **ends)` -> (full, empty), broadcasting;
    `stats`: (its keyword of the least, of the greatest, "q" or "k", the tensor (batch,
    position)) of each tensor it reads at the queries' or keys' own positions."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, cols = -(-n_q // block), -(-n_kv // block)
    q0 = torch.arange(rows, device=device) * block
    k0 = torch.arange(cols, device=device) * block
    q1, k1 = torch.clamp(q0 + block, max=n_q) - 1, torch.clamp(k0 + block, max=n_kv) - 1
    shape = (batch, heads, rows, cols)
    ends = {}
    for lo, hi, side, x in stats:
        for name, tiles in zip((lo, hi), tile_ends(x, block)):
            ends[name] = tiles[:, None, :, None] if side == "q" else tiles[:, None, None, :]
    h = torch.arange(heads, device=device)[None, :, None, None]
    full, empty = box(q0[:, None], q1[:, None], k0[None, :], k1[None, :], h, **ends)
    full = torch.as_tensor(full, device=device).expand(shape).clone()
    empty = torch.as_tensor(empty, device=device).expand(shape).clone()
    full[..., -1, :] &= n_q % block == 0  # a ragged block is padded with hidden entries
    full[..., :, -1] &= n_kv % block == 0
    partial = ~full & ~empty
    told = partial.nonzero()
    offsets = torch.arange(block, device=device)
    for chunk in told.split(CHUNK):
        b, hh, t, u = chunk.unbind(-1)
        q = t[:, None, None] * block + offsets[None, :, None]
        k = u[:, None, None] * block + offsets[None, None, :]
        inside = (q < n_q) & (k < n_kv)
        at = (q.clamp(max=n_q - 1), k.clamp(max=n_kv - 1))
        seen = mask_mod(b[:, None, None], hh[:, None, None], *at) & inside
        some, every = seen.flatten(1).any(-1), seen.flatten(1).all(-1)
        full[b, hh, t, u] = every
        partial[b, hh, t, u] = some & ~every
    return BlockMask.from_kv_blocks(
        *_indices(partial),
        *_indices(full),
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(n_q, n_kv),
    )


def _indices(kind: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count per row of blocks, the blocks' columns first, in order), as BlockMask keeps them."""
    counts = kind.sum(-1, dtype=torch.int32)
    order = torch.argsort(~kind, dim=-1, stable=True).to(torch.int32)
    return counts, order
