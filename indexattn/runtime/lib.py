"""What every generated module calls and none prints: key spans, a safe softmax, softmax with
its product as one autograd step, blocks of queries or rows as one autograd step, a top-k mask.

A generated module imports it (`from indexattn.runtime import lib as rt`) and calls
`rt.by_blocks(...)`; `indexattn compile SPEC --standalone` inlines the definitions a module
uses, read from this file (standalone.py), so that module imports nothing of indexattn.
Only torch, math and this module's own names: each top-level definition is inlined as it
stands. The knobs below are read at each call, so setting `rt.QUERY_BLOCK` tunes every
module."""

import math

import torch
import torch.nn.functional as F

HOST_READS = ("cpu",)  # devices whose values a call may read back: no synchronisation there

QUERY_BLOCK = 128  # queries per kernel call where a mask hides whole blocks of keys


def key_spans(mask, hides, shape=None, every_call=False, blocks=False, box=None, values=()):
    """Per block of QUERY_BLOCK queries: (first query, end, first key, end, whole), the keys
    the mask (..., query, key) lets any of them see, and whether it changes nothing there, so
    that the block runs without it. `mask`: a tensor, or a function of queries and keys
    (t, u, k, l) giving its entries there, of `shape` (query, key) in all (a table made by
    blocks, never whole). `hides`: the entries that hide a key ("-inf", "0", "true",
    "false"; "none", not read: every key for each block). `box`: with such a function, one
    of the same arguments telling what the mask's condition holds at all those entries (2:
    kept, the mask changing nothing; 1: kept; 0: hidden; None: it cannot tell), so that only
    the keys it cannot tell, at the edges of what a block sees, are read; `values`: tensors
    (..., position) the condition reads, given to `box` as functions of a first and last
    position giving their least and greatest entries there (by tiles of QUERY_BLOCK). One
    span of every query and key where the mask changes nothing anywhere; when traced, None;
    where blocks would skip less than a fifth of the scores, None, or with `blocks` every key
    for each block of queries. The values are read back at once: on every call
    (`every_call`, a mask of tensors), only on a device of HOST_READS, so that elsewhere a
    call never waits for the device (the kernel then runs on all keys, or with `blocks` every
    key for each block)."""
    if torch.compiler.is_compiling():  # one call, its shape traced: not a loop over it
        return None
    n_q, n_k = mask.shape[-2:] if shape is None else shape
    every = [(t, min(t + QUERY_BLOCK, n_q), 0, n_k, False) for t in range(0, n_q, QUERY_BLOCK)]
    if n_q * n_k == 0:
        return every if blocks else None
    if hides == "none":  # a mask made by blocks that hides no key: every key for each block
        return every
    entries = mask if shape is None else mask(0, 0, 0, 0) if every_call else None
    if every_call and entries.device.type not in HOST_READS:
        return every if blocks else None

    if any(x.numel() == 0 for x in values):  # no entries at all: nothing to tell
        box = None
    if box is not None and values:  # their least and greatest by tiles of each one's axis
        tiles = [x.reshape(-1, x.shape[-1]) for x in values]
        tiles = [
            torch.cat([x, x[:, -1:].expand(-1, -x.shape[-1] % QUERY_BLOCK)], -1) for x in tiles
        ]
        tiles = [x.unflatten(-1, (-1, QUERY_BLOCK)) for x in tiles]
        ends = [
            e.double() if e.is_floating_point() else e.long()  # integers stay exact
            for x in tiles
            for e in (x.amin((0, 2)), x.amax((0, 2)))
        ]
        read = {  # one read per dtype
            d: iter(torch.cat([e for e in ends if e.dtype == d]).tolist())
            for d in {e.dtype for e in ends}
        }
        ends = [[next(read[e.dtype]) for _ in range(len(e))] for e in ends]
        values = [
            lambda a, b, lo=lo, hi=hi: (
                min(lo[a // QUERY_BLOCK : b // QUERY_BLOCK + 1]),
                max(hi[a // QUERY_BLOCK : b // QUERY_BLOCK + 1]),
            )
            for lo, hi in zip(ends[::2], ends[1::2])
        ]

    def told(t, u, k, stop):  # the keys k:stop in parts, each with what the condition holds
        said = box(t, u, k, stop, *values)
        if said is not None or stop - k <= QUERY_BLOCK:
            return [(k, stop, said)]
        half = k + max(1, (stop - k) // (2 * QUERY_BLOCK)) * QUERY_BLOCK  # at a tile's edge
        return told(t, u, k, half) + told(t, u, half, stop)

    read, parts = [], []  # the counts read, and each block's parts: (first key, counts)
    for t in range(0, n_q, QUERY_BLOCK):
        u, told_apart, part = min(t + QUERY_BLOCK, n_q), [], []
        for k, stop, said in [(0, n_k, None)] if box is None else told(t, u, 0, n_k):
            if said is None and told_apart and told_apart[-1][2] is None:
                k = told_apart.pop()[0]  # keys not told apart side by side: read at once
            told_apart.append((k, stop, said))
        for k, stop, said in told_apart:
            if said is not None:  # (seen, first seen, end, keys where it changes nothing)
                part.append((k, (int(said > 0), 0, stop - k, (stop - k) * (said == 2))))
                continue
            rows = mask(t, u, k, stop) if shape is not None else mask[..., t:u, k:stop]
            keep = rows != -math.inf if hides == "-inf" else rows != 0 if hides == "0" else rows
            keep = ~rows if hides == "true" else keep
            plain = rows == 0 if hides == "-inf" else keep  # where the mask changes nothing
            seen = keep.any(-2).reshape(-1, stop - k).any(0).long()
            fit = plain.all(-2).reshape(-1, stop - k).all(0)
            end = stop - k - seen.flip(0).argmax()
            read.append(torch.stack([seen.amax(), seen.argmax(), end, fit.sum()]))
            part.append((k, len(read) - 1))
        parts.append(part)
    counts = torch.stack(read).tolist() if read else []
    spans, fits = [], []
    for t, part in zip(range(0, n_q, QUERY_BLOCK), parts):
        part = [(k, counts[c] if isinstance(c, int) else c) for k, c in part]
        seen = [(k + first, k + end) for k, (any_, first, end, _) in part if any_]
        k0, k1 = (seen[0][0], seen[-1][1]) if seen else (0, n_k)  # none seen: 0 to n_k
        fits.append(sum(count for _, (*_, count) in part))  # only keys a block sees can fit
        spans.append((t, min(t + QUERY_BLOCK, n_q), k0, k1, fits[-1] == k1 - k0))
    if all(count == n_k for count in fits):
        return [(0, n_q, 0, n_k, True)]
    kept = sum((u - t) * (k1 - k0) for t, u, k0, k1, _ in spans)
    return spans if kept <= 0.8 * n_q * n_k else every if blocks else None


def safe_softmax(scores, dim=-1, overwrite=False):
    """softmax over `dim` where a row may be -inf everywhere: such a row gives zeros, not NaN
    (values and gradients); `overwrite`: the weights may be written over the scores. On a
    device of HOST_READS, reading a value back costs no synchronisation: the plain softmax
    runs, and aten's safe one only where a row is dead (it costs 1.3-3.7x the plain one).
    Elsewhere, when traced and under torch.func, nothing branches on the scores' values."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return torch.ops.aten._safe_softmax.default(scores, dim)
    if scores.device.type not in HOST_READS:
        if torch.is_grad_enabled() and scores.requires_grad:
            return torch.ops.aten._safe_softmax.default(scores, dim)
        # a dead row's maximum taken as 0, so that exp makes it 0, and its sum, 0, taken as
        # 1; a live row's sum is at least 1 (its maximum's exp)
        top = scores.amax(dim, keepdim=True)
        top = top.masked_fill_(top.isneginf(), 0.0)
        weights = (scores.sub_(top) if overwrite else scores - top).exp_()
        total = weights.sum(dim, keepdim=True)
        return weights.div_(total.masked_fill_(total == 0, 1.0))
    if overwrite:
        if scores.amax(dim).isneginf().any():
            return torch.ops.aten._safe_softmax.default(scores, dim)
        return torch.softmax(scores, dim=dim, out=scores)
    weights = torch.softmax(scores, dim=dim)
    if weights.select(dim, 0).isnan().any():  # a dead row is NaN throughout, a live one not
        weights = torch.ops.aten._safe_softmax.default(scores, dim)
    return weights


class SoftmaxValues(torch.autograd.Function):
    """W = dropout(softmax(S), p) over the last axis (no dropout where p is 0 or not
    training), and O = W @ V, as one step: the backward adds W's own gradient into the
    product's and makes the scores' gradient in place, one tensor of their size where
    autograd's steps make three."""

    @staticmethod
    def forward(ctx, scores, values, p, training, softmax):
        weights = torch.softmax(scores, dim=-1) if softmax is None else softmax(scores)
        kept, keep = weights, None
        if training and p > 0:
            kept, keep = torch.native_dropout(weights, p, True)  # F.dropout's draws
        ctx.p = p
        ctx.set_materialize_grads(False)
        if keep is None:  # the weights are the kept weights: saved once
            ctx.save_for_backward(weights, values)
        else:
            ctx.save_for_backward(weights, values, kept, keep)
        return kept, kept @ values

    @staticmethod
    def backward(ctx, grad_kept, grad_out):
        if torch.is_grad_enabled():  # create_graph=True
            raise RuntimeError(
                "softmax_values: no second derivative (its backward works in place); "
                "differentiate twice under torch.func, which runs the plain steps"
            )
        weights, values, *dropped = ctx.saved_tensors
        kept, keep = dropped if dropped else (weights, None)
        grad_values = None
        if grad_out is not None and ctx.needs_input_grad[1]:
            grad_values = kept.mT @ grad_out
        if (grad_out is None and grad_kept is None) or not ctx.needs_input_grad[0]:
            return None, grad_values, None, None, None
        if grad_out is None:
            grad = grad_kept.clone(memory_format=torch.contiguous_format)
        else:
            grad = grad_out @ values.mT
            grad = grad if grad_kept is None else grad.add_(grad_kept)
        if keep is not None:
            grad.mul_(keep).div_(1 - ctx.p)
        grad.mul_(weights)  # the softmax's: W (g - sum(W g))
        grad.addcmul_(weights, grad.sum(-1, keepdim=True), value=-1)
        return grad, grad_values, None, None, None


def softmax_values(scores, values, p=0.0, training=False, softmax=None):
    """dropout(softmax(S), p) over the last axis (no dropout where p is 0 or not training),
    and its product with the values: with gradients, one autograd step (SoftmaxValues); else
    the plain steps. `softmax`: the runtime's safe_softmax, where rows may be -inf everywhere
    (zeros, not NaN)."""
    traced = torch.compiler.is_compiling()  # torch.compile fuses the plain steps itself
    # vmap, grad: their own autograd, and no branch on a tensor's values
    transformed = torch._C._are_functorch_transforms_active()
    plain = (
        traced
        or transformed
        or not torch.is_grad_enabled()
        or not (scores.requires_grad or values.requires_grad)
        or torch.is_autocast_enabled(scores.device.type)  # the backward would mix dtypes
        or (training and p >= 1)  # F.dropout's zeros, without a draw
    )
    if not plain:
        return SoftmaxValues.apply(scores, values, p, training, softmax)
    overwrite = not (torch.is_grad_enabled() or traced)  # the weights over the scores
    if softmax is not None:
        weights = softmax(scores, -1, overwrite)
    else:
        weights = torch.softmax(scores, dim=-1, out=scores if overwrite else None)
    if training:  # F.dropout returns its input when not training
        weights = F.dropout(weights, p, training=training)
    return weights, weights @ values


def recomputed(function, *args, **kwargs):
    """function(*args, **kwargs) for one block of rows or queries. Under autograd its scores
    and weights are made again in the backward rather than saved (torch.utils.checkpoint),
    so that a training step holds one block's at a time, never every row's; the random
    state is replayed, so dropout draws the same mask. Traced, or without gradients: the
    call."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return function(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)


def pieces(tensors, cuts, span):
    """Each tensor cut to a block, along each axis its cut names: to the span's queries
    ("q": span[0]:span[1]) or keys ("k": span[2]:span[3]). Views: nothing is copied."""
    out = []
    for tensor, cut in zip(tensors, cuts):
        for axis, which in cut.items():
            start, end = span[0:2] if which == "q" else span[2:4]
            tensor = tensor.narrow(axis, start, end - start)
        out.append(tensor)
    return out


def each_block(block, spans, tensors, cuts, dim=-2):
    """block(*span, *pieces) at each span, joined along `dim`: the plain blocks, through
    autograd's own steps (every block's scores saved for the backward, where autograd runs)."""
    outs = [block(*span, *pieces(tensors, cuts, span)) for span in spans]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim)


class Blocks(torch.autograd.Function):
    """The blocks of `by_blocks` as one autograd step. The forward keeps no block's scores;
    the backward makes each block again from its pieces (under the forward's autocast) and
    adds its gradients into one per tensor (float32 or wider), at the queries and keys the
    block read, as FlashAttention's backward accumulates dK and dV: no block makes a gradient
    the size of a whole tensor, as autograd's own backward of a slice does (work that grows
    as blocks times N)."""

    @staticmethod
    def forward(ctx, block, spans, cuts, dim, draws, *values):
        tensors = [v for v in values if torch.is_tensor(v)]  # the others: numbers
        ctx.kind = next((t.device.type for t in tensors if t.device.type != "cpu"), "cuda")
        kind = tensors[0].device.type
        ctx.autocast = kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
        outs, ctx.states = [], []
        for span in spans:
            if draws:  # the random state the block draws from, replayed in the backward
                devices = torch.utils.checkpoint.get_device_states(*tensors)
                ctx.states.append((torch.get_rng_state(), devices))
            outs.append(block(*span, *pieces(values, cuts, span)))
        ctx.block, ctx.spans, ctx.cuts, ctx.dim = block, spans, cuts, dim
        ctx.sizes = [out.shape[dim] for out in outs]
        ctx.tensors = [k for k, v in enumerate(values) if torch.is_tensor(v)]
        ctx.values = [None if torch.is_tensor(v) else v for v in values]
        ctx.save_for_backward(*tensors)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True
            raise RuntimeError(
                "by_blocks: no second derivative (its backward adds into its gradients in "
                "place); differentiate twice under torch.func, which runs the plain blocks"
            )
        values, needs = list(ctx.values), ctx.needs_input_grad[5:]
        for k, tensor in zip(ctx.tensors, ctx.saved_tensors):
            values[k] = tensor
        kept = [v for v, n in zip(values, needs) if n]  # those whose gradients are made
        wide = [torch.promote_types(v.dtype, torch.float32) for v in kept]
        sums = [v.new_zeros(v.shape, dtype=w) for v, w in zip(kept, wide)]  # float32 or wider
        into, made = [cut for cut, n in zip(ctx.cuts, needs) if n], [False] * len(kept)
        leaves, start = [v.detach() if torch.is_tensor(v) else v for v in values], 0
        kind, autocast, dtype = ctx.autocast
        for k, (span, size) in enumerate(zip(ctx.spans, ctx.sizes)):
            cut = pieces(leaves, ctx.cuts, span)
            cut = [p.requires_grad_() if n else p for p, n in zip(cut, needs)]
            state = ctx.states[k] if ctx.states else None  # as the forward drew, if it drew
            devices = state[1][0] if state else []
            with torch.random.fork_rng(devices, state is not None, device_type=ctx.kind):
                if state is not None:
                    torch.set_rng_state(state[0])
                    torch.utils.checkpoint.set_device_states(*state[1], device_type=ctx.kind)
                with torch.enable_grad(), torch.autocast(kind, dtype, autocast):
                    out = ctx.block(*span, *cut)
            if out.requires_grad:
                part = grad.narrow(ctx.dim, start, size)
                wanted = [p for p, n in zip(cut, needs) if n]
                found = torch.autograd.grad(out, wanted, part, allow_unused=True)
                for j, (total, got) in enumerate(zip(pieces(sums, into, span), found)):
                    if got is not None:
                        total.add_(got)
                        made[j] = True
            start += size
        sums = iter(s.to(v.dtype) if m else None for s, m, v in zip(sums, made, kept))
        return None, None, None, None, None, *(next(sums) if n else None for n in needs)


def block_rows(floor, budget):
    """The rows of a block: the scores' budget's, at least `floor` (a module's BLOCK_ROWS),
    which must be a whole number of 1 or more (0 would step no row forward)."""
    if not (isinstance(floor, int) and floor >= 1):
        raise ValueError(
            f"BLOCK_ROWS = {floor!r}: the rows a block holds at least must be a whole number "
            "of 1 or more (64 by default; 1 lets the budget BLOCK_SCORES alone decide)"
        )
    return max(floor, budget)


def by_blocks(block, spans, tensors, cuts, dim=-2, draws=False):
    """block(*span, *pieces) at each span (first query, end, first key, end, ...), joined
    along `dim`: each tensor cut to the span as `cuts` says (pieces); a number (a scalar,
    which may be a tensor too) passed as it is. Under autograd one step (Blocks) whose
    backward makes each block again (`draws`: dropout's draws replayed), so that a training
    step holds one block's scores at a time; under torch.func (its own autograd), traced
    (never by blocks) and without gradients, the blocks (each_block)."""
    grads = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad for t in tensors)
    plain = torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling()
    if grads and not plain:
        return Blocks.apply(block, spans, cuts, dim, draws, *tensors)
    return each_block(block, spans, tensors, cuts, dim)


def top_k(x, k, dim):
    """Where x holds one of its k largest along `dim` (torch.topk), as a mask. Of the entries
    equal to the k-th largest, the first along `dim` are kept: each kept entry's place in the
    descending order, ties by position, is below k."""
    k = torch.sym_min(max(math.ceil(k), 0), x.shape[dim])
    if k == 0:
        return torch.zeros_like(x, dtype=torch.bool)
    kth = x.topk(k, dim=dim, sorted=False).values.amin(dim=dim, keepdim=True)
    above, tied = x > kth, x == kth
    return above | (tied & (tied.cumsum(dim) <= k - above.sum(dim, keepdim=True)))
