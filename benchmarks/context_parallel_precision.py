"""Context parallelism in bfloat16 at long N: each split layer's error from float64 against
one process's in bfloat16, values and gradients.

    .venv/bin/python benchmarks/context_parallel_precision.py          # N = 8192, W = 2, ring
    .venv/bin/python benchmarks/context_parallel_precision.py --strategy ulysses --worlds 2,4

Each spec (benchmarks/context_parallel.py's sizes; rope's rotary angles at positions past
bfloat16's exact integers, 256) runs in W fresh processes over gloo on 127.0.0.1. Every
rank computes the layer in float64 and in bfloat16 on the whole sequence (one process), then
the split layer in bfloat16 on its block (the ring on the layout `count --ring` names, Ulysses
contiguous): the output, and the gradient of X under a weighted sum of it (fixed random
weights, so that no gradient is a plain column sum), each compared with float64 on this
rank's rows. The result is the largest difference over the ranks, one process's and the
split layer's, and their ratio (1: the split layer is exactly as close as one process). The
tile pairs and their merges accumulate in float32, as one process's kernels do
(docs/decisions.md, "The ring's tiles accumulate in float32"). Prints one JSON line per
spec, N and W.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from context_parallel import SIZES, _inputs, answer, launch  # this folder is on a script's path
from context_parallel import split as split_layer

ROOT = Path(__file__).resolve().parent.parent


def _step(layer, xs: dict, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output, and X's gradient of the output weighted by `weight`, in float64."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in xs.items()}
    out = layer(**leaves)
    (out * weight.to(out.dtype)).sum().backward()
    return out.detach().double(), leaves["X"].grad.double()


def worker(name: str, rank: int, world: int, n: int, port: int, ring: int) -> dict:
    """One rank: float64 and bfloat16 in one process on the whole sequence, then the split
    layer on this rank's block; the largest differences from float64 on this rank's rows."""
    import indexattn
    import indexattn.parallel.distributed as cp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    exact = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn").module(**SIZES[name])
    exact = exact.double()
    xs = {k: v.double() if v.is_floating_point() else v for k, v in _inputs(name, n).items()}
    weight = torch.randn(xs["X"].shape, generator=torch.Generator().manual_seed(7)).double()
    reference = _step(exact, xs, weight)
    low = copy.deepcopy(exact).to(torch.bfloat16)
    lows = {k: v.bfloat16() if v.is_floating_point() else v for k, v in xs.items()}
    one = _step(low, lows, weight)
    split, mesh, layout, _ = split_layer(copy.deepcopy(low), name, n, (rank, world, port), ring)

    def block(v: torch.Tensor) -> torch.Tensor:
        return cp.sequence_block(v, mesh, dim=1, layout=layout)

    mine = _step(split, {k: block(v) for k, v in lows.items()}, block(weight))
    found = {"layout": layout}
    for k, what in enumerate(("out", "grad")):
        exact_rows = block(reference[k])
        found[f"one_{what}"] = (block(one[k]) - exact_rows).abs().max().item()
        found[f"split_{what}"] = (mine[k] - exact_rows).abs().max().item()
    return found


def measure(name: str, n: int, world: int, ring: int) -> dict:
    ranks = launch(__file__, name, world, n, ring)
    found: dict = {"N": n, "W": world, "layout": ranks[0]["layout"]}
    for what in ("out", "grad"):
        one = max(r[f"one_{what}"] for r in ranks)
        split = max(r[f"split_{what}"] for r in ranks)
        found |= {f"one_{what}": one, f"split_{what}": split, f"ratio_{what}": split / one}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = ", ".join(SIZES)
    parser.add_argument(
        "--specs", default="mha,softcap_window,doc_mask,attention_sinks,rope", help=names
    )
    parser.add_argument("--sizes", default="8192")
    parser.add_argument("--worlds", default="2", help="processes W, e.g. 2,4")
    parser.add_argument("--strategy", choices=["ulysses", "ring"], default="ring")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        answer(worker, args.worker)
    ring = int(args.strategy == "ring")
    for name in args.specs.split(","):
        for world in (int(w) for w in args.worlds.split(",")):
            for n in (int(s) for s in args.sizes.split(",")):
                found = measure(name, n, world, ring)
                print(json.dumps({"spec": name, "strategy": args.strategy, **found}), flush=True)


if __name__ == "__main__":
    main()
