"""One rank of tests/parallel/test_context_parallel_models.py: `python context_models_worker.py RANK
WORLD PORT OUT`.

A tiny Llama (from a config, random weights, float64) split over the sequence with
indexattn.distributed.context_parallel_model, each rank passing its block of the tokens and of
position_ids, against the same model in one process (sdpa): the largest difference in this
rank's block of the logits and in every parameter's gradient (summed over the ranks by
sum_gradients, or by FSDP2 over the same ranks), written
to OUT/rank{RANK}.json. The twins: rank 1's block of the embeddings moved by 1e-3; each rank's
position_ids its block's own 0, 1, ... (rotary not at the global positions)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import transformers
from distributed_worker import error_of, run_checks, start  # tests/ is on a script's path
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from indexattn.parallel.distributed import context_parallel_model, sequence_block, sum_gradients

B, N = 2, 8  # zig-zag chunks of 2 tokens on 2 ranks
CONFIG = {
    "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "attn_implementation": "sdpa",
}  # fmt: skip


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).double()
    with torch.no_grad():  # every weight random: no zero bias or unit norm hides a mistake
        for p in llama.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.3)
    return llama


def step(llama, ids, positions, block, move: float = 0.0):
    """This rank's logits (its block of the tokens, at `positions`) and every parameter's
    gradient of a weighted sum of the logits (summed over the ranks where `block` splits)."""
    llama.get_input_embeddings().register_forward_hook(lambda _, given, out: out + move)
    out = llama(input_ids=block(ids), position_ids=positions, use_cache=False).logits
    probe = torch.randn(B, N, out.shape[-1], generator=torch.Generator().manual_seed(7))
    (out * block(probe.to(out.device))).sum().backward()
    return out, [p.grad for p in llama.parameters()]


def check(mesh, strategy: str, zigzag: bool, twin: str = "", fsdp: bool = False) -> dict:
    llama, device = model().to(mesh.device_type), mesh.device_type  # cuda: this rank's card
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2)).to(device)
    positions = torch.arange(N, device=device).expand(B, N)

    def block(v):
        return sequence_block(v, mesh, dim=1, zigzag=zigzag)

    out1, grads1 = step(copy.deepcopy(llama), ids, positions, lambda v: v)
    split = context_parallel_model(llama, mesh, strategy=strategy, zigzag=zigzag)
    if fsdp:  # FSDP2 over the sequence ranks: it sums their gradients (divided by none)
        split = fully_shard(split, mesh=mesh)
        split.set_gradient_divide_factor(1.0)
    positions = block(positions)
    if twin == "local positions":  # the block's own 0, 1, ...
        positions = torch.arange(positions.shape[1]).expand_as(positions)
    move = 1e-3 if twin == "moved" and dist.get_rank() == 1 else 0.0
    out2, grads2 = step(split, ids, positions, block, move)
    if not fsdp:
        sum_gradients(split, mesh)
    grads2 = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads2]
    grad = max((a - b).abs().max().item() for a, b in zip(grads1, grads2))
    return {"out": (block(out1) - out2).abs().max().item(), "grad": grad}


def refused(mesh, **call) -> str:
    llama = context_parallel_model(model(), mesh)
    ids = sequence_block(torch.zeros(B, N, dtype=torch.long), mesh, dim=1)
    return error_of(lambda: llama(input_ids=ids, **call), ValueError, NotImplementedError)


def main() -> None:
    torch.set_default_dtype(torch.float64)
    rank, out, mesh = start()
    world = mesh.size()
    whole = torch.arange(N).expand(B, N)
    positions = sequence_block(whole, mesh, dim=1)
    other = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "cp"))["dp"]
    padding = torch.ones(B, N // world, dtype=torch.long)
    padding[0, 0] = 0
    at_the_end = torch.ones_like(padding)  # padded at the end: the last rank's block alone
    at_the_end[:, -1] = 0 if rank == world - 1 else 1
    checks = {
        "ring": lambda: check(mesh, "ring", zigzag=True),
        "ring_contiguous": lambda: check(mesh, "ring", zigzag=False),
        "ulysses": lambda: check(mesh, "ulysses", zigzag=False),
        "ring_moved": lambda: check(mesh, "ring", zigzag=True, twin="moved"),
        "ulysses_moved": lambda: check(mesh, "ulysses", zigzag=False, twin="moved"),
        "ring_fsdp": lambda: check(mesh, "ring", zigzag=True, fsdp=True),
        "ring_fsdp_moved": lambda: check(mesh, "ring", True, twin="moved", fsdp=True),
        "ring_local_positions": lambda: check(mesh, "ring", True, twin="local positions"),
        "no_positions": lambda: refused(mesh),
        "padding": lambda: refused(mesh, position_ids=positions, attention_mask=padding),
        "padding_at_the_end": lambda: refused(
            mesh, position_ids=positions, attention_mask=at_the_end
        ),
        "cache": lambda: refused(mesh, position_ids=positions, use_cache=True),
        "labels": lambda: refused(mesh, position_ids=positions, labels=positions),
        "other_mesh": lambda: refused(mesh, position_ids=sequence_block(whole, other, dim=1)),
    }
    run_checks(checks, rank, out)


if __name__ == "__main__":
    main()
