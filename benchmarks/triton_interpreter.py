"""The triton backend's interpreter suite as figures: per case, the largest error of the
outputs and of each gradient against the oracle's autograd (indexattn.backends.triton.check),
and the seconds it took, on this machine's CPU in Triton's interpreter (one thread). One JSON
line per case; docs/triton.md quotes them.

    python benchmarks/triton_interpreter.py
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch

import indexattn
from indexattn.backends.triton import check


def cases():
    for name, sizes, what in (*check.CASES, *check.SLOW):
        yield name, sizes, what, {}
    yield (
        "sinks_core",
        {"N": 20, "N_kv": 23, "h_kv": 1, "n_rep": 2},
        "float64",
        {"dtype": torch.float64},
    )

    def dead(args):
        args["M"][..., 3:7, :] = -torch.inf

    yield "gqa_core", {"N": 19, "N_kv": 21, "h_kv": 1, "n_rep": 2}, "dead rows", {"edit": dead}
    for name, sizes, what in check.SWEPT:
        for n in check.EDGES:
            at = check.at_length(name, sizes, n)
            yield name, at, f"{what}, N = {n}", {"block": check.SWEPT_BLOCK}


def main() -> None:
    torch.set_num_threads(1)
    for name, sizes, what, options in cases():
        start = time.perf_counter()
        errors = check.compare(indexattn.compile_spec(name).ir, sizes, **options)
        forward = errors.pop("forward")
        row = {
            "spec": name,
            "case": what,
            "forward": forward,
            "backward": max(errors.values(), default=0.0),
            "gradients": sorted(errors),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
