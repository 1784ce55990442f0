"""One rank of tests/parallel/test_ranks_agree.py: `python context_agree_worker.py RANK WORLD
PORT OUT`.

Each check calls a split layer with rank 1's call made different from rank 0's in one thing
(a scalar, a block's length or dtype, the mode, a block's layout, a whole input's values) or
every rank's block cut on another mesh (a 2-D mesh's other dimension), and writes each
rank's error message, or "no error", under the check's name to OUT/rank{RANK}.json; the
twins call every rank alike. A rank that went on into the ring while another raised would
wait for ever: the launch's time bound is the test of that. A ring layer called again after
a tile pair raised on every rank equals one process."""

from __future__ import annotations

import functools

import torch
from context_worker import cases, inputs, raised
from distributed_worker import run_checks, start  # this folder is on the path of a script run
from torch.distributed.device_mesh import init_device_mesh

import indexattn.parallel.distributed as distributed
from indexattn.parallel import ring
from indexattn.parallel.distributed import context_parallel, sequence_block

SPLIT = ("ulysses", "ring")
DIFFERENT = ("scalar", "length", "dtype", "mode", "layout", "mesh", "values")  # one thing
BLOCKS = ("layout", "mesh")  # differences of a block: not for parallelize's whole inputs
WHOLE = ("values",)  # of a whole input: parallelize's alone (a block's values differ anyway)


def layer(mesh, strategy: str, name: str = "softcap_window"):
    """A module of `name` split by `strategy` ("heads": parallelize), and its input X."""
    torch.manual_seed(0)
    module = cases()[name]().eval()
    x = inputs(module)["X"]
    if strategy == "heads":
        return distributed.parallelize(module, mesh), x
    return context_parallel(module, mesh, strategy=strategy), x


def called(mesh, strategy: str, different: str | None, other=None) -> str:
    """Every rank calls the layer alike, except rank 1 in `different` (None: the twin), or
    every rank with its block cut on `other` (the other dimension of the mesh 1 × W: the
    whole sequence, rank 0's block of 1), where `different` is "mesh"."""
    parallel, x = layer(mesh, strategy)
    odd = mesh.get_local_rank() == 1 and different is not None
    given = {"c": 2.0} if odd and different == "scalar" else {}
    block = x if strategy == "heads" else sequence_block(x, mesh, dim=1)
    if odd and different == "length":
        block = block[:, 1:]
    if odd and different == "dtype":
        block = block.float()
    if odd and different == "mode":
        parallel.train()
    if odd and different == "layout":
        block = sequence_block(x, mesh, dim=1, layout="zigzag")
    if odd and different == "values":  # another batch on rank 1: a whole input differs
        block = block + 1.0
    if different == "mesh":
        block = sequence_block(x, other, dim=1)
    return raised(lambda: parallel(block, **given))


def after_a_raise(mesh, name: str) -> dict:
    """A ring layer whose first tile pair raises on every rank alike (an error of the spec's
    own, the same everywhere), then called again: the error, and the largest difference of
    the second call's block of the output from one process's (a transfer the first call
    left posted would be waited for for ever, or read by the second)."""
    torch.manual_seed(0)
    module = cases()[name]().eval()
    x = inputs(module)["X"]
    want = sequence_block(module(x), mesh, dim=1)  # one process, before the split
    layer = context_parallel(module, mesh, strategy="ring")
    block = sequence_block(x, mesh, dim=1)
    real = {n: getattr(ring._Ring, n) for n in ("flashed", "compiled")}

    def failing(*args, **kwargs):
        raise RuntimeError("a tile pair failed")

    for n in real:
        setattr(ring._Ring, n, failing)
    try:
        error = raised(lambda: layer(block), (RuntimeError,))
    finally:
        for n, f in real.items():
            setattr(ring._Ring, n, f)
    return {"raised": error, "out": (layer(block) - want).abs().max().item()}


def main() -> None:
    torch.set_default_dtype(torch.float64)
    rank, out, mesh = start()
    other = init_device_mesh("cpu", (1, mesh.size()), mesh_dim_names=("dp", "cp"))["dp"]
    checks = {}
    for strategy in (*SPLIT, "heads"):
        for different in (*DIFFERENT, None):
            heads = strategy == "heads"  # whole inputs: no block to cut, a whole input to pass
            if different not in (BLOCKS if heads else WHOLE):
                checks[f"{strategy}_{different}"] = functools.partial(
                    called, mesh, strategy, different, other
                )
    for name in ("mha", "softcap_window"):  # SDPA's kernel, the one-step softmax
        checks[f"after_a_raise_{name}"] = functools.partial(after_a_raise, mesh, name)
    run_checks(checks, rank, out)


if __name__ == "__main__":
    main()
