"""Tensor parallelism over a spec's head index with DTensor: each rank holds h/w heads of every
head-split tensor (Shard) and the rest whole (Replicate), runs the spec's own generated code at
h = h/w, and finishes each sum over heads with one all-reduce.

Context parallelism over its sequence index (Ulysses): each rank passes its block of the
sequence; an all-to-all trades it for a block of heads over the whole sequence (an all-gather
for an input without heads), the same generated code runs at h = h/w, and the outputs go back
to sequence blocks (an all-to-all, or a reduce-scatter of a sum over heads).

Imported only when used (`import indexattn.distributed`): it imports torch.distributed."""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import SpecError
from ..runtime.module import SpecModule
from . import ring
from .agree import agree, block_refused, described
from .sequence import CONTIGUOUS, ZIGZAG, Cut, Layout, SequencePlan, layout_of
from .shard import ONCE, PARTIAL, SPLIT, ShardPlan

__all__ = [
    "CONTIGUOUS",
    "ZIGZAG",
    "ContextParallel",
    "CountSent",
    "HeadParallel",
    "Layout",
    "RingParallelModule",
    "context_parallel",
    "context_parallel_model",
    "parallelize",
    "sequence_block",
    "sum_gradients",
]


def parallelize(module: SpecModule, mesh: DeviceMesh, over: str = "μ") -> SpecModule:
    """The module, in place, split over the head index `over` across a 1-D device mesh.

    >>> import torch.distributed as dist, indexattn, indexattn.distributed
    >>> mesh = dist.device_mesh.init_device_mesh("cpu", (2,))  # doctest: +SKIP
    >>> layer = indexattn.compile_spec("specs/mha.attn").module(d_m=8, h=4, d_k=2)
    >>> layer = indexattn.distributed.parallelize(layer, mesh, over="μ")  # doctest: +SKIP
    >>> layer.state_dict()["W"].placements  # doctest: +SKIP
    (Shard(dim=0),)

    `over` is the index's letter (`μ`), macro (`\\mu`) or ASCII name (`mu`). Parameters and
    buffers become DTensors placed as `module.spec.shard_plan(over)` says, so `state_dict()`
    holds the shards under the spec's names; the forward takes and returns whole tensors,
    like the module's own. Every rank must pass the same inputs.

    Raises SpecError when the plan says the spec cannot shard (a relayout first, or a value
    that needs every head), ValueError when the head count does not divide by the mesh size.
    """
    return parallelize_module(module, mesh, HeadParallel(over))


class HeadParallel(ParallelStyle):
    """The ParallelStyle of a spec module split over its head index (see parallelize)."""

    def __init__(self, over: str = "μ") -> None:
        self.over = over

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, SpecModule):
            raise TypeError(
                f"HeadParallel shards a module built by spec.module(), not {type(module).__name__}"
            )
        if device_mesh.ndim != 1:
            raise ValueError(f"HeadParallel needs a 1-D device mesh, got {device_mesh.ndim}-D")
        plan = module.spec.shard_plan(self.over)
        if not plan.shardable:
            raise SpecError(plan.verdict(), file=module.spec.file)
        shards = _Shards(module, plan, device_mesh)
        rows = {r.ascii: r for r in plan.rows}

        def partition(name: str, sub: nn.Module, mesh: DeviceMesh) -> None:
            if sub is not module:
                return
            for key, param in list(sub._parameters.items()):
                placed = distribute_tensor(
                    param.data, mesh, [_placement(rows[key])], src_data_rank=self.src_data_rank
                )
                sub.register_parameter(key, nn.Parameter(placed, param.requires_grad))
            for key, buffer in list(sub._buffers.items()):
                sub._buffers[key] = distribute_tensor(
                    buffer, mesh, [_placement(rows[key])], src_data_rank=self.src_data_rank
                )

        distribute_module(module, device_mesh, partition)
        # As fully_shard does: the module's class gains a forward that runs on the local shards.
        module.__class__ = _parallel_class(type(module), HeadParallelModule)
        module._head_parallel = shards
        return module


def context_parallel(
    module: SpecModule,
    mesh: DeviceMesh,
    over: str = "τ",
    *,
    keys: tuple[str, ...] = (),
    heads: str | None = None,
    strategy: str = "ulysses",
    layout: Layout | str | None = None,
    zigzag: bool | None = None,
    tile: int | None = None,
) -> SpecModule:
    """The module, in place, with its sequence split over a 1-D device mesh (Ulysses, or ring).

    >>> mesh = dist.device_mesh.init_device_mesh("cpu", (2,))  # doctest: +SKIP
    >>> layer = indexattn.distributed.context_parallel(layer, mesh, over="τ")  # doctest: +SKIP
    >>> y = layer(indexattn.distributed.sequence_block(x, mesh, dim=1))  # doctest: +SKIP

    Every rank passes its block of every input that has the sequence index `over` (or a key
    index: `module.spec.sequence_plan(over, keys)` lists them) and gets its block of each
    output back; inputs without the sequence, whole. Parameters become replicated DTensors
    (whole on every rank, gradients whole on every rank); each rank computes with the heads
    `heads` (by default the plan's choice) that are its own.

    `layout` says which positions each rank's blocks hold: "contiguous" (the default, as
    for `sequence_block`) or "zigzag" (chunks r and 2w - 1 - r of 2w, which balances a
    causal mask's work on the ring); `zigzag=True` is the older spelling. Each rank passes
    `sequence_block(x, mesh, dim, layout=layout)` and gets its blocks back in that layout; a
    block that `sequence_block` cut in another layout is a ValueError naming both.

    Raises SpecError when no head index can be split (the head plan's blockers are named),
    ValueError when the heads do not divide by the mesh size.

    `strategy="ring"`: each rank keeps its queries and the key-side blocks travel between
    ranks by P2P (indexattn/parallel/ring.py); any spec whose sequence plan splits, heads or not.
    `tile` bounds the
    positions of one tile (scores are held one pair of tiles at a time); by default a chunk.
    A module that `parallelize` split over heads (on another mesh dimension) runs the ring
    over its heads: the 2-D mesh heads × sequence.
    """
    style = ContextParallel(
        over, keys=keys, heads=heads, strategy=strategy, layout=layout, zigzag=zigzag, tile=tile
    )
    return parallelize_module(module, mesh, style)


def context_parallel_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    strategy: str = "ring",
    layout: Layout | str | None = None,
    zigzag: bool | None = None,
) -> nn.Module:
    """A transformers model, in place, whose attention runs split over the sequence on `mesh`.

    >>> model = AutoModelForCausalLM.from_config(config)  # doctest: +SKIP
    >>> model = indexattn.distributed.context_parallel_model(model, mesh)  # doctest: +SKIP
    >>> block = functools.partial(sequence_block, mesh=mesh, dim=1)  # doctest: +SKIP
    >>> logits = model(input_ids=block(ids), position_ids=block(positions)).logits  # doctest: +SKIP
    >>> (loss_of(logits)).backward(); sum_gradients(model, mesh)  # doctest: +SKIP

    Each rank passes its block of the tokens and of position_ids (`sequence_block`, with the
    same `layout`: contiguous by default, or "zigzag"); the model's own embeddings, rotary
    (at those global positions), norms and MLPs run on the block, and each layer's attention
    core (the core of its kind: causal, sliding window, soft cap, sinks or chunked; see
    docs/distributed.md) runs split by `strategy` ("ring" or "ulysses", see
    context_parallel), causal over the global positions. It returns this rank's block of the
    logits. Each rank's backward gives the gradient of its own block's loss: `sum_gradients`
    (or a data-parallel wrapper over a mesh that includes this one) sums them.

    Refused by name: a call without position_ids or with a cache; a padding mask; a layer
    whose kind no core takes, with attention dropout in training, or not causal.
    """
    if strategy not in ("ulysses", "ring"):
        raise ValueError(f"strategy is 'ulysses' or 'ring', not {strategy!r}")
    from ..transformers import context

    return context.split(model, mesh, strategy, layout_of(layout, zigzag), context_parallel)


def sum_gradients(module: nn.Module, mesh: DeviceMesh) -> None:
    """Each parameter's gradient summed over the ranks of `mesh`, in place: after the backward
    of a model whose ranks each computed the loss of their own block of the sequence. Under
    FSDP2 over the same ranks, leave it out and set the gradient divide factor to 1."""
    group = mesh.get_group()
    for param in module.parameters():
        if param.grad is not None:
            torch.distributed.all_reduce(param.grad, group=group)


def sequence_block(
    value: torch.Tensor,
    mesh: DeviceMesh,
    dim: int,
    zigzag: bool | None = None,
    *,
    layout: Layout | str | None = None,
) -> torch.Tensor:
    """This rank's block of `value` along `dim` (the sequence) in `layout`: "contiguous" (the
    default) or "zigzag", chunks r and 2w - 1 - r of 2w (`zigzag=True`, the older spelling).
    The block carries its layout: a split layer made for another refuses it by name.
    ValueError when the length does not divide."""
    laid = layout_of(layout, zigzag)
    rank, world = mesh.get_local_rank(), mesh.size()
    spans = laid.spans(value.shape[dim], world, dim)[rank]
    block = torch.cat([value.narrow(dim, a, b - a) for a, b in spans], dim)
    block._sequence_cut = Cut(laid, rank, world)  # read by the split layers (block_refused)
    return block


class ContextParallel(ParallelStyle):
    """The ParallelStyle of a spec module split over its sequence (see context_parallel)."""

    def __init__(
        self,
        over: str = "τ",
        *,
        keys: tuple[str, ...] = (),
        heads: str | None = None,
        strategy: str = "ulysses",
        layout: Layout | str | None = None,
        zigzag: bool | None = None,
        tile: int | None = None,
    ) -> None:
        if strategy not in ("ulysses", "ring"):
            raise ValueError(f"strategy is 'ulysses' or 'ring', not {strategy!r}")
        self.over, self.keys, self.heads = over, keys, heads
        self.strategy, self.layout, self.tile = strategy, layout_of(layout, zigzag), tile

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, SpecModule):
            raise TypeError(
                f"ContextParallel splits a module built by spec.module(), not "
                f"{type(module).__name__}"
            )
        if device_mesh.ndim != 1:
            raise ValueError(f"ContextParallel needs a 1-D device mesh, got {device_mesh.ndim}-D")
        plan = module.spec.sequence_plan(self.over, self.keys, self.heads)
        if not (plan.splittable if self.strategy == "ring" else plan.ulysses):
            raise SpecError(plan.verdict(), file=module.spec.file)
        if self.strategy == "ring":
            setup = _RingSetup(module, plan, device_mesh, self.layout, self.tile)
            if isinstance(module, HeadParallelModule) and not isinstance(
                module, ContextParallelModule | RingParallelModule
            ):  # split over heads already: the 2-D mesh heads × sequence
                module.__class__ = RingParallelModule
                module._ring = setup
                return module
            shards = setup
        else:
            shards = _Sequence(module, plan, device_mesh, self.layout)

        def partition(name: str, sub: nn.Module, mesh: DeviceMesh) -> None:
            if sub is not module:
                return
            for key, param in list(sub._parameters.items()):
                placed = distribute_tensor(param.data, mesh, [Replicate()])
                sub.register_parameter(key, nn.Parameter(placed, param.requires_grad))
            for key, buffer in list(sub._buffers.items()):
                sub._buffers[key] = distribute_tensor(buffer, mesh, [Replicate()])

        distribute_module(module, device_mesh, partition)
        if self.strategy == "ring":
            module.__class__ = _parallel_class(type(module), RingParallelModule)
            module._ring = shards
            return module
        module.__class__ = _parallel_class(type(module), ContextParallelModule)
        module._head_parallel = shards
        return module


def _placement(row) -> Shard | Replicate:
    return Shard(row.axis) if row.placement == SPLIT else Replicate()


class _Shards:
    """What a rank's forward needs: the plan's rows, the mesh and the local sizes."""

    def __init__(self, module: SpecModule, plan: ShardPlan, mesh: DeviceMesh) -> None:
        self.plan, self.mesh = plan, mesh
        self.rows = {r.ascii: r for r in plan.rows}
        world = mesh.size()
        heads = module.sizes.get(plan.size)
        if heads is None:
            heads = _heads(module, plan)
        if heads % world:
            raise ValueError(
                f"{plan.spec}: {plan.size} = {heads} heads ({plan.over}) do not divide among "
                f"{world} ranks; use a mesh whose size divides {heads}, or a head count that "
                f"is a multiple of {world}"
            )
        self.heads, self.world = heads, world
        self.first = mesh.get_local_rank() == 0
        self.sizes = {**module.sizes, plan.size: heads // world}
        ir_spec = module.spec.ir
        self.layouts = {t.ascii: len(t.layout) for t in ir_spec.tensors}
        self.outputs = tuple(t.ascii for t in ir_spec.outputs)
        self.shared = {r.ascii for r in plan.rows if r.shared}

    def local(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """This rank's part of an argument, with the gradient rule of its placement."""
        row, mesh = self.rows[name], self.mesh
        if row.placement == SPLIT:
            if not isinstance(value, DTensor):  # a whole input: every rank passes all of it
                value = DTensor.from_local(value, mesh, [Replicate()], run_check=False)
            dim = value.ndim - self.layouts[name] + row.axis
            return value.redistribute(mesh, [Shard(dim)]).to_local()
        if row.placement == ONCE:
            # Rank 0 adds it, the others add zeros (DTensor's Partial, exactly, and -inf stays
            # -inf): the all-reduce adds it once. Its gradient, rank 0's, is summed back.
            return self.once(_replicated(value, mesh))
        if name in self.shared:  # every rank's heads read it: sum its gradient over ranks
            return _replicated(value, mesh).to_local(grad_placements=[Partial()])
        return value.to_local() if isinstance(value, DTensor) else value

    def once(self, whole: DTensor) -> torch.Tensor:
        """Rank 0's copy of a replicated value, zeros on the others: added once in all."""
        local = whole.to_local(grad_placements=[Partial()])
        first = torch.full((), self.first, device=local.device)  # the value's device, any card
        return torch.where(first, local, torch.zeros((), dtype=local.dtype, device=local.device))

    def gather(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """An output made whole: summed over ranks (partial) or gathered along its heads."""
        row, mesh = self.rows[name], self.mesh
        if row.placement == PARTIAL:
            return DTensor.from_local(value, mesh, [Partial()], run_check=False).full_tensor()
        if row.placement == SPLIT:
            dim = value.ndim - self.layouts[name] + row.axis
            return DTensor.from_local(value, mesh, [Shard(dim)], run_check=False).full_tensor()
        return value


class _Sequence(_Shards):
    """A head split that receives sequence blocks: inputs along the sequence are traded for
    head blocks (all-to-all) or gathered whole (all-gather); outputs go back to blocks."""

    def __init__(
        self, module: SpecModule, plan: SequencePlan, mesh: DeviceMesh, layout: Layout
    ) -> None:
        super().__init__(module, module.spec.shard_plan(plan.heads), mesh)
        self.sequence, self.layout = plan, layout
        self.split = {
            t.ascii for t in module.spec.ir.tensors_of("input") if repr(t) in dict(plan.split)
        }
        ir_spec, seq = module.spec.ir, set(plan.indices)
        self.axes = {  # a tensor's first axis along the sequence
            t.ascii: next(k for k, group in enumerate(t.layout) if seq & {i.glyph for i in group})
            for t in ir_spec.tensors
            if seq & {i.glyph for i in t.indices}
        }

    def dim(self, name: str, value: torch.Tensor, axis: int) -> int:
        return value.ndim - self.layouts[name] + axis

    def axes_dim(self, name: str, value: torch.Tensor) -> int:
        return self.dim(name, value, self.axes[name])

    def ordered(self, value: torch.Tensor, dim: int, joined: bool) -> torch.Tensor:
        """Blocks joined in rank order put in the order of positions (`joined`), or the
        other way round before they go back to the ranks: nothing to do when contiguous."""
        if self.layout == CONTIGUOUS:
            return value
        held = torch.tensor(self.layout.held(value.shape[dim], self.world), device=value.device)
        return value.index_select(dim, torch.argsort(held) if joined else held)

    def local(self, name: str, value: torch.Tensor) -> torch.Tensor:
        row, mesh = self.rows[name], self.mesh
        if row.role != "input" or name not in self.axes:
            return super().local(name, value)
        along = self.axes_dim(name, value)
        if row.placement == SPLIT:  # a block of positions for a block of heads
            traded = _all_to_all(value, self.dim(name, value, row.axis), along, mesh)
            return self.ordered(traded, along, joined=True)
        block = DTensor.from_local(value, mesh, [Shard(along)], run_check=False)
        whole = block.redistribute(mesh, [Replicate()])  # all-gather
        if row.placement == ONCE:
            return self.ordered(self.once(whole), along, joined=True)
        placement = Partial() if name in self.shared else Replicate()
        return self.ordered(whole.to_local(grad_placements=[placement]), along, joined=True)

    def gather(self, name: str, value: torch.Tensor) -> torch.Tensor:
        row, mesh = self.rows[name], self.mesh
        if name not in self.axes:
            return super().gather(name, value)
        along = self.axes_dim(name, value)
        value = self.ordered(value, along, joined=False)
        if row.placement == SPLIT:  # a block of heads for a block of positions
            return _all_to_all(value, along, self.dim(name, value, row.axis), mesh)
        placement = Partial() if row.placement == PARTIAL else Replicate()
        held = DTensor.from_local(value, mesh, [placement], run_check=False)
        return held.redistribute(mesh, [Shard(along)]).to_local()  # a reduce-scatter


def _all_to_all(value: torch.Tensor, scatter: int, gather: int, mesh: DeviceMesh) -> torch.Tensor:
    """Rank r's block j along `scatter` goes to rank j, and the blocks received are joined
    along `gather` in rank order: one all_to_all_single, differentiable (its backward is the
    reverse exchange). DTensor's Shard-to-Shard falls back to an all-gather on gloo."""
    world = mesh.size()
    parts = torch.stack(value.chunk(world, scatter)).contiguous()
    received = funcol.all_to_all_single_autograd(parts, None, None, mesh)
    return torch.cat(received.unbind(0), gather)


def _replicated(value: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    if isinstance(value, DTensor):
        return DTensor.from_local(value.to_local(), mesh, [Replicate()], run_check=False)
    return DTensor.from_local(value, mesh, [Replicate()], run_check=False)


def _heads(module: SpecModule, plan: ShardPlan) -> int:
    """The head count from a split param's shape, when the module was built without it."""
    ir_spec = module.spec.ir
    values = {s: module.sizes[a] for s, a in ir_spec.size_names.items() if a in module.sizes}
    for tensor in ir_spec.tensors_of("param", "buffer"):
        row = plan.row(tensor.ascii)
        if row.placement != SPLIT:
            continue
        group = tensor.layout[row.axis]
        rest = 1
        for index in group[1:]:
            rest *= index.size.subs(values)
        if rest.is_Integer:
            return int(
                module._parameters.get(tensor.ascii, module._buffers.get(tensor.ascii)).shape[
                    row.axis
                ]
            ) // int(rest)
    raise TypeError(
        f"{plan.spec}: build the module with {plan.size}=... to shard it over {plan.over}"
    )


class HeadParallelModule(SpecModule):
    """A SpecModule whose params are DTensors split over heads; its forward runs the spec's
    generated code on this rank's shards at h/w heads, and returns whole outputs."""

    _head_parallel: _Shards

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        shards = self._head_parallel
        given, scalars = self._given(args, kwargs)
        held = {**self._parameters, **self._buffers}
        tensors = [
            shards.local(t.ascii, given[t.ascii] if t.role == "input" else held[t.ascii])
            for t in self.spec.ir.arguments
        ]
        out = self.spec._run(tensors, shards.sizes, scalars, self.training)
        outs = out if len(shards.outputs) > 1 else (out,)
        whole = tuple(shards.gather(n, v) for n, v in zip(shards.outputs, outs))
        return whole if len(whole) > 1 else whole[0]

    def _given(self, args: tuple, kwargs: dict) -> tuple[dict, dict]:
        """The inputs by name, as the module's own forward takes them, and the scalars of this
        call: the module's, with any given by keyword for this call only."""
        if len(args) > len(self._inputs):
            raise TypeError(
                f"{self.spec.name} takes {len(self._inputs)} inputs ({', '.join(self._inputs)}),"
                f" got {len(args)}"
            )
        given = dict(zip(self._inputs, args))
        scalars = self._call_scalars(kwargs)
        unknown = [k for k in kwargs if k not in self._inputs or k in given]
        if unknown:
            raise TypeError(f"{self.spec.name}: unexpected or repeated inputs: {unknown}")
        given.update(kwargs)
        missing = [name for name in self._inputs if name not in given]
        if missing:
            raise TypeError(f"{self.spec.name} is missing inputs: {', '.join(missing)}")
        mesh = self._mesh()
        if mesh.size() > 1:  # every rank called alike, or every rank raises (agree.py)
            call = described(given, scalars, self.training, self._whole(given))
            agree(self.spec.name, mesh, call, self._refused(given))
        return given, scalars

    def _mesh(self) -> DeviceMesh:
        return self._head_parallel.mesh

    def _whole(self, given: dict) -> list[str]:
        """The inputs every rank passes whole, the same tensor: split over heads, all."""
        return list(given)

    def _refused(self, given: dict) -> str | None:
        """Why this rank refuses its call, beyond the checks of `_given`; None: it does not."""
        return None

    def extra_repr(self) -> str:
        shards = self._head_parallel
        return (
            super().extra_repr()
            + f", over={shards.plan.over}, {shards.plan.size}/rank={shards.heads // shards.world}"
        )


class ContextParallelModule(HeadParallelModule):
    """A SpecModule whose forward takes and returns blocks of the sequence (Ulysses)."""

    def _whole(self, given: dict) -> list[str]:
        """Those not split over the sequence."""
        return [name for name in given if name not in self._head_parallel.split]

    def _refused(self, given: dict) -> str | None:
        shards = self._head_parallel
        return block_refused(self.spec.name, given, shards.split, shards.layout, shards.mesh)

    def extra_repr(self) -> str:
        shards = self._head_parallel
        return (
            SpecModule.extra_repr(self)
            + f", over={', '.join(shards.sequence.indices)} ({shards.layout})"
            + f", heads={shards.plan.over}"
            + f", {shards.plan.size}/rank={shards.heads // shards.world}"
        )


class _RingSetup:
    """What a ring rank's forward needs: the plan, the mesh, the layout of its positions."""

    def __init__(
        self, module: SpecModule, plan: SequencePlan, mesh: DeviceMesh, layout: Layout, tile
    ) -> None:
        ir_spec = module.spec.ir
        seq = set(plan.indices)
        pairs = [t for t in ir_spec.outputs if len(seq & {i.glyph for i in t.indices}) > 1]
        if pairs:
            raise SpecError(
                f"{plan.spec}: the ring never holds a tensor along two sequence indices whole, "
                f"and {pairs[0]!r} is an output",
                hint="output what is reduced over the key index, or use strategy='ulysses'",
                file=module.spec.file,
            )
        self.plan, self.mesh, self.layout, self.tile = plan, mesh, layout, tile
        self.split = {t.ascii for t in ir_spec.tensors_of("input") if repr(t) in dict(plan.split)}

    def local(self, values: dict) -> dict:
        """The call's arguments by ASCII name on this rank: blocks as given; the whole values
        that autograd differentiates with their gradients summed over the ranks, one
        all-reduce for all (`_SummedOnce`)."""
        found = {n: v.to_local() if isinstance(v, DTensor) else v for n, v in values.items()}
        whole = [
            n
            for n, v in found.items()
            if n not in self.split and v.is_floating_point() and v.requires_grad
        ]
        if whole:
            group = self.mesh.get_group()
            found.update(zip(whole, _SummedOnce.apply(group, *(found[n] for n in whole))))
        return found


class _SummedOnce(torch.autograd.Function):
    """Identity on the whole values every rank reads; the backward sums their gradients over
    the group in one all-reduce per dtype and device (a bucket, as DDP's), where DTensor's
    Partial would all-reduce each (about 1.5 ms of CPU a tensor on gloo)."""

    @staticmethod
    def forward(ctx, group, *values):
        ctx.group = group
        return tuple(v.view_as(v) for v in values)

    @staticmethod
    def backward(ctx, *grads):
        found, kinds = list(grads), {}
        for n, grad in enumerate(grads):  # in the values' order: the same on every rank
            kinds.setdefault((grad.dtype, grad.device), []).append(n)
        for ns in kinds.values():
            flat = torch.cat([grads[n].reshape(-1) for n in ns])
            flat = funcol.wait_tensor(funcol.all_reduce(flat, "sum", ctx.group))  # CountSent's
            for n, part in zip(ns, flat.split([grads[n].numel() for n in ns])):
                found[n] = part.view_as(grads[n])
        return (None, *found)


class RingParallelModule(HeadParallelModule):
    """A SpecModule whose forward takes and returns blocks of the sequence (ring), over this
    rank's heads when `parallelize` split them first (a 2-D mesh, heads × sequence); the last
    call's elements sent (its backward's too, once run), score elements computed and elements
    received from each rank in its forward are in `last_ring`."""

    _head_parallel: _Shards | None = None
    _ring: _RingSetup

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        setup, heads = self._ring, self._head_parallel
        given, scalars = self._given(args, kwargs)
        held = {**self._parameters, **self._buffers}
        ir_spec, mesh = self.spec.ir, setup.mesh
        arguments = {}
        for t in ir_spec.arguments:
            value = given[t.ascii] if t.role == "input" else held[t.ascii]
            if heads is not None:  # this rank's heads, as the head split runs them
                value = heads.local(t.ascii, value)
            arguments[t.ascii] = value
        outs, run = ring.forward(
            ir_spec,
            setup.plan,
            setup.local(arguments),
            {
                "group": mesh.get_group(),
                "rank": mesh.get_local_rank(),
                "world": mesh.size(),
                "layout": setup.layout,
                "tile": setup.tile,
                "sizes": self.sizes if heads is None else heads.sizes,
                "scalars": scalars,
                "training": self.training,
            },
        )
        self.last_ring = run.counts
        if heads is not None:  # sums over heads finished across the head ranks
            outs = tuple(heads.gather(n, v) for n, v in zip(heads.outputs, outs))
        return outs if len(outs) > 1 else outs[0]

    def _mesh(self) -> DeviceMesh:
        return self._ring.mesh

    def _whole(self, given: dict) -> list[str]:
        return [name for name in given if name not in self._ring.split]

    def _refused(self, given: dict) -> str | None:
        setup = self._ring
        return block_refused(self.spec.name, given, setup.split, setup.layout, setup.mesh)

    def extra_repr(self) -> str:
        setup = self._ring
        return (
            SpecModule.extra_repr(self)
            + f", ring over {', '.join(setup.plan.indices)} ({setup.layout})"
        )


_CLASSES: dict[tuple[type, type], type] = {}


def _parallel_class(cls: type, base: type) -> type:
    if issubclass(cls, HeadParallelModule):
        raise ValueError("this module is already split over heads or its sequence")
    if cls is SpecModule:
        return base
    if (cls, base) not in _CLASSES:
        name = base.__name__.removesuffix("Module") + cls.__name__
        _CLASSES[cls, base] = type(name, (base, cls), {})
    return _CLASSES[cls, base]


_SHARES = {  # the functional collective, its name, and the share of its input sent
    "all_gather_into_tensor": ("all-gather", lambda w: w - 1),
    "reduce_scatter_tensor": ("reduce-scatter", lambda w: (w - 1) / w),
    "all_reduce": ("all-reduce", lambda w: 2 * (w - 1) / w),
    "all_to_all_single": ("all-to-all", lambda w: (w - 1) / w),
}


class CountSent(TorchDispatchMode):
    """Counts the elements this rank sends in the collectives run inside `with CountSent(w):`,
    by the share each one's usual algorithm sends (indexattn.sequence.Sent says which).

    >>> with indexattn.distributed.CountSent(2) as sent:  # doctest: +SKIP
    ...     layer(x_block).sum().backward()  # mha, d_m=8, h=4, d_k=3, x of (2, 8, 8)
    >>> sent.elements  # doctest: +SKIP
    {'all-gather': 320, 'reduce-scatter': 128.0, 'all-reduce': 8.0}
    """

    def __init__(self, world: int) -> None:
        super().__init__()
        self.world = world
        self.elements: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace.startswith("_c10d_functional") and name in _SHARES:
            what, share = _SHARES[name]
            sent = args[0].numel() * share(self.world)
            self.elements[what] = self.elements.get(what, 0) + sent
        return func(*args, **(kwargs or {}))
