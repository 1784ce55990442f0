"""One rank of tests/parallel/test_distributed.py:
`python distributed_worker.py RANK WORLD PORT OUT`.

Every check compares a distributed run (gloo, CPU, float64) with the same module run in this
one process, and writes the largest difference under the check's name to OUT/rank{RANK}.json;
a twin check perturbs one shard or one weight and must differ."""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import indexattn
import indexattn.parallel.distributed

SPECS = Path(__file__).resolve().parent.parent / "specs"
torch.set_default_dtype(torch.float64)


def spec(name: str):
    return indexattn.compile_spec(SPECS / f"{name}.attn")


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def gap(a, b) -> float:
    return max((whole(x) - whole(y)).abs().max().item() for x, y in zip(a, b))


# -- tensor parallel


def tp_case(mesh, module, inputs, over, perturb=None):
    """Outputs, input gradients and gathered parameter gradients: one process vs the mesh."""
    torch.manual_seed(1)
    single = copy.deepcopy(module).eval()
    tp = indexattn.distributed.parallelize(copy.deepcopy(module).eval(), mesh, over=over)
    if perturb:  # the twin: one rank's shard of one weight moved a little
        with torch.no_grad():
            shard = tp._parameters[perturb].to_local()
            if dist.get_rank() == 1:
                shard.add_(1e-3)
    results = []
    for m in (single, tp):
        xs = [x.clone().requires_grad_() for x in inputs]
        outs = m(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        weights = [
            torch.randn(o.shape, generator=torch.Generator().manual_seed(k))
            for k, o in enumerate(outs)
        ]
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        grads = [p.grad for p in m.parameters()] + [x.grad for x in xs]
        results.append((outs, grads, list(m.state_dict().values())))
    (o1, g1, s1), (o2, g2, s2) = results
    return {"out": gap(o1, o2), "grad": gap(g1, g2), "state": gap(s1, s2)}


def mha_case():
    torch.manual_seed(0)
    return spec("mha").module(d_m=8, h=4, d_k=3), [torch.randn(2, 5, 8)]


def gqa_case():
    torch.manual_seed(0)
    return spec("gqa").module(d_m=8, h_kv=2, n_rep=2, d_k=3), [torch.randn(2, 5, 8)]


def cross_case():
    torch.manual_seed(0)
    module = spec("cross").module(d_q=8, d_c=6, h=4, d_k=3)
    return module, [torch.randn(2, 5, 8), torch.randn(2, 7, 6)]


def qwen3_case():
    """Qwen3's attention (qk_norm.attn): grouped-query heads, QK RMSNorm, rotary."""
    torch.manual_seed(0)
    module = spec("qk_norm").module(d_m=8, h_kv=2, n_rep=2, d_r=2)
    with torch.no_grad():  # norm weights away from ones, so a mis-sharded one shows
        for name in ("q_norm_weight", "k_norm_weight"):
            module._parameters[name].uniform_(0.5, 1.5)
    return module, [torch.randn(2, 5, 8)]


def mqa_case():
    torch.manual_seed(0)
    return spec("mqa").module(d_m=8, h=4, d_k=3), [torch.randn(2, 5, 8)]


GPT2_HEAD_MAJOR = {"(Bμa)": "(μBa)", "(0μa)": "(μ0a)", "(1μa)": "(μ1a)", "(2μa)": "(μ2a)"}


def gpt2_relaid(mesh, perturb=None):
    """gpt2 as shipped, one process, against gpt2 with c_attn relaid out to (μBa), split."""
    torch.manual_seed(0)
    gpt2 = spec("gpt2")
    text = gpt2.text
    for old, new in GPT2_HEAD_MAJOR.items():
        text = text.replace(old, new)
    head_major = indexattn.compile_spec(text, name="gpt2_head_major")
    original = gpt2.module(d_m=8, h=4, d_k=3).eval()
    state = original.state_dict()
    for name, layout in (("c_attn_weight", "<(Bμa)i>"), ("c_attn_bias", "<(Bμa)>")):
        state[name] = indexattn.relayout(
            state[name], layout, layout.replace("Bμ", "μB"), B=3, mu=4
        ).contiguous()
    moved = head_major.module(d_m=8, h=4, d_k=3)
    moved.load_state_dict(state)
    x, pad = torch.randn(2, 5, 8), torch.zeros(5)
    pad[3] = -torch.inf
    tp = indexattn.distributed.parallelize(moved.eval(), mesh, over="mu")
    if perturb:
        with torch.no_grad():
            if dist.get_rank() == 1:
                tp._parameters[perturb].to_local().add_(1e-3)
    y1, a1 = original(x, pad)
    y2, a2 = tp(x, pad)
    (y1.sum() + a1.sum()).backward()
    (y2.sum() + a2.sum()).backward()
    back = indexattn.relayout(
        tp._parameters["c_attn_weight"].grad.full_tensor(), "<(μBa)i>", "<(Bμa)i>", B=3, mu=4
    )
    grads = gap([original._parameters["c_attn_weight"].grad], [back])
    return {"out": gap([y1, a1], [y2, a2]), "grad": grads}


def gpt2_refused(mesh) -> str:
    module = spec("gpt2").module(d_m=8, h=4, d_k=3)
    try:
        indexattn.distributed.parallelize(module, mesh, over="μ")
    except indexattn.SpecError as error:
        return str(error)
    return "no error"


def indivisible(mesh) -> str:
    try:
        indexattn.distributed.parallelize(spec("mha").module(d_m=6, h=3, d_k=2), mesh)
    except ValueError as error:
        return str(error)
    return "no error"


# -- data parallel: 3 SGD steps on the same data, one process vs DDP vs FSDP2


def batches():
    torch.manual_seed(5)
    return [(torch.randn(4, 5, 8), torch.randn(4, 5, 8)) for _ in range(3)]


def train(module, rank=None, world=1, perturb=None):
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for step, (x, target) in enumerate(batches()):
        if rank is not None:  # this rank's half of the batch
            x, target = x.chunk(world)[rank], target.chunk(world)[rank]
        loss = (module(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if perturb and step == 0:
            perturb(module)
    return module


def data_parallel(mesh, kind: str, twin: bool):
    torch.manual_seed(0)
    base = spec("mha").module(d_m=8, h=4, d_k=3)
    single = train(copy.deepcopy(base))
    rank, world = dist.get_rank(), dist.get_world_size()

    def nudge(m):  # rank 1's copy of one weight (DDP) or its shard of one weight (FSDP2)
        if rank == 1:
            with torch.no_grad():
                p = dict(m.named_parameters())["module.W_O" if kind == "ddp" else "W_O"]
                (p.to_local() if isinstance(p, DTensor) else p).add_(1e-3)

    module = copy.deepcopy(base)
    wrapped = DistributedDataParallel(module) if kind == "ddp" else fully_shard(module, mesh=mesh)
    train(wrapped, rank, world, nudge if twin else None)
    return gap(list(single.state_dict().values()), list(module.state_dict().values()))


def error_of(call, *errors: type[Exception]) -> str:
    """The message of the error (one of `errors`) that `call()` raises, or "no error"."""
    try:
        call()
    except errors as error:
        return str(error)
    return "no error"


def start(device: str = "cpu") -> tuple[int, Path, DeviceMesh]:
    """This rank of `python WORKER RANK WORLD PORT OUT`: its process group joined on
    127.0.0.1 (gloo on the CPU; NCCL where `device` is "cuda", each rank on card RANK); its
    rank, OUT and the 1-D mesh of every rank."""
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    return rank, out, init_device_mesh(device, (world,))


def main() -> None:
    rank, out, mesh = start()
    checks = {
        "tp_mha": lambda: tp_case(mesh, *mha_case(), over="\\mu"),
        "tp_mha_twin": lambda: tp_case(mesh, *mha_case(), over="μ", perturb="W"),
        "tp_gqa": lambda: tp_case(mesh, *gqa_case(), over="g"),
        "tp_gqa_twin": lambda: tp_case(mesh, *gqa_case(), over="g", perturb="k_proj_weight"),
        "tp_cross": lambda: tp_case(mesh, *cross_case(), over="mu"),
        "tp_cross_twin": lambda: tp_case(mesh, *cross_case(), over="mu", perturb="to_out_weight"),
        "tp_mqa": lambda: tp_case(mesh, *mqa_case(), over="μ"),
        "tp_qwen3": lambda: tp_case(mesh, *qwen3_case(), over="g"),
        "tp_qwen3_twin": lambda: tp_case(mesh, *qwen3_case(), over="g", perturb="q_proj_weight"),
        "gpt2_refused": lambda: gpt2_refused(mesh),
        "gpt2_relaid": lambda: gpt2_relaid(mesh),
        "gpt2_relaid_twin": lambda: gpt2_relaid(mesh, perturb="c_attn_weight"),
        "indivisible": lambda: indivisible(mesh),
        "ddp": lambda: data_parallel(mesh, "ddp", twin=False),
        "ddp_twin": lambda: data_parallel(mesh, "ddp", twin=True),
        "fsdp": lambda: data_parallel(mesh, "fsdp", twin=False),
        "fsdp_twin": lambda: data_parallel(mesh, "fsdp", twin=True),
    }
    run_checks(checks, rank, out)


def run_checks(checks: dict, rank: int, out: Path) -> None:
    """Each check in turn (an exception is its result, with the traceback, for the test that
    reads it), the results written to OUT/rank{RANK}.json, and the process left."""
    found: dict = {}
    for name, check in checks.items():
        try:
            found[name] = check()
        except Exception:
            found[name] = {"error": traceback.format_exc()}
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(found, indent=1))
    dist.barrier()
    sys.stdout.flush()
    # Leave without tearing down: a gloo/FSDP background thread still joinable in the
    # interpreter's teardown aborts the process now and then ("terminate called without an
    # active exception"), and with 4 ranks a rank still in destroy_process_group when rank 0
    # (the store's host) had left waited for ever. Every result is written by now.
    os._exit(0)


if __name__ == "__main__":
    main()
