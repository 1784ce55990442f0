"""Context parallelism from the notation: one sequence split over the ranks (Ulysses).

    torchrun --nproc-per-node 2 examples/context_parallel.py

Each rank holds N/w positions of the input; `context_parallel` reads the sequence plan off
specs/mha.attn, trades the positions for h/w heads over the whole sequence, runs the spec's
own generated code, and returns this rank's N/w rows of the output. Rank 0 prints the plan,
the elements each rank sends (counted as the collectives run, and symbolically), and the
largest difference from the same layer run whole in one process, in values and gradients.
"""

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import indexattn
import indexattn.distributed as cp
from indexattn.sequence import ulysses_sent

SPEC = Path(__file__).resolve().parent.parent / "specs" / "mha.attn"
SIZES = {"d_m": 32, "h": 4, "d_k": 8}
N = 64


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = indexattn.compile_spec(SPEC)
    whole = spec.module(**SIZES).double()
    x = torch.randn(2, N, SIZES["d_m"], dtype=torch.float64)
    layer = cp.context_parallel(copy.deepcopy(whole), mesh, over="τ")  # weights replicated

    x_block = cp.sequence_block(x, mesh, dim=1).requires_grad_()
    with cp.CountSent(world) as sent:
        y_block = layer(x_block)
        y_block.square().sum().backward()

    x.requires_grad_()
    y = whole(x)
    y.square().sum().backward()
    gaps = [
        (y_block - cp.sequence_block(y, mesh, dim=1)).abs().max(),
        (x_block.grad - cp.sequence_block(x.grad, mesh, dim=1)).abs().max(),
        *(
            (p.grad.full_tensor() - q.grad).abs().max()
            for p, q in zip(layer.parameters(), whole.parameters())
        ),
    ]
    sizes = {s: {**SIZES, "N": N}[a] for s, a in spec.ir.size_names.items()}
    counted = sum(
        item.at(sizes, world) * (1 if item.phase == "gradient" else x.shape[0])
        for item in ulysses_sent(spec.ir, spec.sequence_plan())
    )
    if rank == 0:
        print(spec.sequence_plan())
        print(f"elements sent by rank 0: {sum(sent.elements.values()):g} (counted: {counted})")
    gap = torch.stack(gaps).max()
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"largest difference from one process, values and gradients: {gap.item():.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
