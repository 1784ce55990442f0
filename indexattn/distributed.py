"""Tensor parallelism over a spec's head index with DTensor: each rank holds h/w heads of every
head-split tensor (Shard) and the rest whole (Replicate), runs the spec's own generated code at
h = h/w, and finishes each sum over heads with one all-reduce.

Imported only when used (`import indexattn.distributed`): it imports torch.distributed."""

from __future__ import annotations

import torch
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

from .errors import SpecError
from .runtime.module import SpecModule
from .shard import ONCE, PARTIAL, SPLIT, ShardPlan

__all__ = ["HeadParallel", "parallelize"]


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
        module.__class__ = _parallel_class(type(module))
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
        self.first = torch.tensor(mesh.get_local_rank() == 0)
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
            local = _replicated(value, mesh).to_local(grad_placements=[Partial()])
            return torch.where(self.first, local, torch.zeros((), dtype=local.dtype))
        if name in self.shared:  # every rank's heads read it: sum its gradient over ranks
            return _replicated(value, mesh).to_local(grad_placements=[Partial()])
        return value.to_local() if isinstance(value, DTensor) else value

    def gather(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """An output made whole: summed over ranks (partial) or gathered along its heads."""
        row, mesh = self.rows[name], self.mesh
        if row.placement == PARTIAL:
            return DTensor.from_local(value, mesh, [Partial()], run_check=False).full_tensor()
        if row.placement == SPLIT:
            dim = value.ndim - self.layouts[name] + row.axis
            return DTensor.from_local(value, mesh, [Shard(dim)], run_check=False).full_tensor()
        return value


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
        if len(args) > len(self._inputs):
            raise TypeError(
                f"{self.spec.name} takes {len(self._inputs)} inputs ({', '.join(self._inputs)}),"
                f" got {len(args)}"
            )
        given = dict(zip(self._inputs, args))
        unknown = [k for k in kwargs if k not in self._inputs or k in given]
        if unknown:
            raise TypeError(f"{self.spec.name}: unexpected or repeated inputs: {unknown}")
        given.update(kwargs)
        missing = [name for name in self._inputs if name not in given]
        if missing:
            raise TypeError(f"{self.spec.name} is missing inputs: {', '.join(missing)}")
        held = {**self._parameters, **self._buffers}
        tensors = [
            shards.local(t.ascii, given[t.ascii] if t.role == "input" else held[t.ascii])
            for t in self.spec.ir.arguments
        ]
        out = self.spec._run(tensors, shards.sizes, self.scalars, self.training)
        outs = out if len(shards.outputs) > 1 else (out,)
        whole = tuple(shards.gather(n, v) for n, v in zip(shards.outputs, outs))
        return whole if len(whole) > 1 else whole[0]

    def extra_repr(self) -> str:
        shards = self._head_parallel
        return (
            super().extra_repr()
            + f", over={shards.plan.over}, {shards.plan.size}/rank={shards.heads // shards.world}"
        )


_CLASSES: dict[type, type] = {}


def _parallel_class(cls: type) -> type:
    if issubclass(cls, HeadParallelModule):
        raise ValueError("this module is already split over heads")
    if cls is SpecModule:
        return HeadParallelModule
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"HeadParallel{cls.__name__}", (HeadParallelModule, cls), {})
    return _CLASSES[cls]
