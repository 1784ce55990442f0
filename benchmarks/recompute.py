"""What recomputing each block of rows in the backward costs: a training step (forward, then
`backward` of the mean square) of a spec through autograd, its blocks of rows recomputed
(the runtime's `by_blocks`: one autograd step whose backward makes each block again)
against the same step with every block's scores saved (`by_blocks` replaced by the plain
blocks, the runtime's `each_block`). float32, d_m 512, 8 heads of 64, window 1024, batch 1,
one thread; peak resident growth of each step, and the median time of interleaved rounds.

    .venv/bin/python benchmarks/recompute.py --specs softcap_window --n 4096 [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from scaling import SIZES  # noqa: E402
from spec_memory import growth, inputs  # noqa: E402

THRESHOLD = "MALLOC_MMAP_THRESHOLD_"  # glibc maps every block above 128 kB on its own


def step(spec, n: int):
    """A training step of the spec at N = n through autograd, as a function of nothing."""
    import torch

    known = {*spec.size_names, *(s.ascii for s in spec.ir.scalars)}
    layer = spec.module(**{k: v for k, v in SIZES.items() if k in known})
    x = inputs(spec, n, SIZES)
    given = {k: v for k, v in SIZES.items() if k in spec.required or k in ("w", "c")}
    weights = dict(layer.named_parameters())

    def run():
        y = spec(**x, **weights, **given, backward="autograd")
        y.square().mean().backward()

    torch.manual_seed(0)
    return run


def saving(block, spans, tensors, cuts, dim=-2, draws=False):
    """`by_blocks` through autograd's own steps: every block's scores and weights saved."""
    from indexattn.runtime import lib as rt

    return rt.each_block(block, spans, tensors, cuts, dim)


def main() -> None:
    if os.environ.get(THRESHOLD) != "131072":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, THRESHOLD: "131072"})
    import torch

    import indexattn
    from indexattn.runtime import lib as rt

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--specs", nargs="*", default=["softcap_window"])
    parser.add_argument("--n", type=int, nargs="*", default=[4096])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    columns = ["spec (training step, autograd)", "N", "recomputed MB", "saved MB"]
    columns += ["recomputed s", "saved s", "time ratio"]
    print("| " + " | ".join(columns) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.specs:
        spec = indexattn.compile_spec(name)
        modes = {"recomputed": rt.by_blocks, "saved": saving}
        for n in args.n:
            run = step(spec, n)
            run()  # the per-shape constants, the lazy imports
            peak, seconds = {}, {m: [] for m in modes}
            for m, helper in modes.items():
                rt.by_blocks = helper
                peak[m] = growth(run)
            for _ in range(args.rounds):
                for m, helper in modes.items():
                    rt.by_blocks = helper
                    start = time.perf_counter()
                    run()
                    seconds[m].append(time.perf_counter() - start)
            rt.by_blocks = modes["recomputed"]
            r, s = (statistics.median(seconds[m]) for m in modes)
            cells = [name, n, f"{peak['recomputed']:.0f}", f"{peak['saved']:.0f}"]
            cells += [f"{r:.2f}", f"{s:.2f}", f"{r / s:.2f}"]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
