"""Context parallelism from the notation: one sequence split over the ranks, two ways.

    torchrun --nproc-per-node 2 examples/context_parallel.py

Each rank holds N/w positions of the input. Ulysses (`context_parallel(layer, mesh)`) reads the
sequence plan off specs/mha.attn, trades the positions for h/w heads over the whole sequence,
runs the spec's own generated code, and returns this rank's N/w rows of the output. The ring
(`strategy="ring"`) keeps this rank's queries (zig-zag chunks r and 2w - 1 - r, which balance
the causal mask), receives the other ranks' keys and values by P2P, and merges the partial
softmaxes by their log-sum-exp. Rank 0 prints the plan, the elements it sends (counted as
they run, and as `indexattn count --context` counts them), and the largest difference from
the same layer run whole in one process, in values and gradients.
"""

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import indexattn
import indexattn.parallel.distributed as cp
from indexattn.parallel.sends import ring_sent, ring_sent_ranks
from indexattn.parallel.sequence import ulysses_sent

SPEC = Path(__file__).resolve().parent.parent / "specs" / "mha.attn"
SIZES = {"d_m": 32, "h": 4, "d_k": 8}
N = 64


def split_step(whole, mesh, x: torch.Tensor, strategy: str) -> tuple[torch.Tensor, float]:
    """One step of the split layer against one process: the largest difference in values and
    gradients, and the elements this rank sent."""
    world, ring = mesh.size(), strategy == "ring"
    layout = "zigzag" if ring else "contiguous"  # zig-zag balances the ring's causal mask
    layer = cp.context_parallel(copy.deepcopy(whole), mesh, strategy=strategy, layout=layout)
    x_block = cp.sequence_block(x, mesh, dim=1, layout=layout).requires_grad_()
    with cp.CountSent(world) as sent:
        y_block = layer(x_block)
        y_block.square().sum().backward()
    # the ring's P2P blocks are counted by the layer, its collectives by CountSent
    ran = sum(sent.elements.values()) + (layer.last_ring["sent"] if ring else 0)
    x_whole = x.clone().requires_grad_()
    y = whole(x_whole)
    y.square().sum().backward()
    gaps = [
        (y_block - cp.sequence_block(y, mesh, dim=1, layout=layout)).abs().max(),
        (x_block.grad - cp.sequence_block(x_whole.grad, mesh, dim=1, layout=layout)).abs().max(),
        *(
            (p.grad.full_tensor() - q.grad).abs().max()
            for p, q in zip(layer.parameters(), whole.parameters())
        ),
    ]
    whole.zero_grad()
    return torch.stack(gaps).max(), ran


def sent(spec, sizes: dict, world: int, strategy: str, batch: int) -> int:
    """The elements rank 0 sends in one training step of `batch` elements, as `indexattn
    count --context` counts them: the parameters' gradients once, and per batch element
    Ulysses' collectives, or the ring's P2P read off its block map on zig-zag blocks."""
    plan = spec.sequence_plan()
    items = (ulysses_sent if strategy == "ulysses" else ring_sent)(spec.ir, plan)
    once = sum(item.at(sizes, world) for item in items if item.phase == "gradient")
    each = sum(item.at(sizes, world) for item in items if item.phase != "gradient")
    if strategy == "ring":
        each = ring_sent_ranks(spec.ir, plan, sizes, world, "zigzag")[0]
    return each * batch + once


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = indexattn.compile_spec(SPEC)
    whole = spec.module(**SIZES).double()  # weights replicated on every rank
    x = torch.randn(2, N, SIZES["d_m"], dtype=torch.float64)
    sizes = {s: {**SIZES, "N": N}[a] for s, a in spec.ir.size_names.items()}
    if rank == 0:
        print(spec.sequence_plan())
    for strategy in ("ulysses", "ring"):
        gap, ran = split_step(whole, mesh, x, strategy)
        counted = sent(spec, sizes, world, strategy, x.shape[0])
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{strategy}: elements sent by rank 0: {ran:g} (counted: {counted})")
            print(
                f"{strategy}: largest difference from one process, values and gradients: "
                f"{gap.item():.2e}"
            )
    dist.barrier()  # every rank's sends received before any rank tears gloo down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
