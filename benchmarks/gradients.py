"""Forward + backward of a shipped spec with autograd's backward and with the derived one
(`backward="derived"`): median time and peak memory, each mode in a fresh process.

    .venv/bin/python benchmarks/gradients.py --n 512 --specs mha,softcap_window

Sizes: N = --n, heads 8 (h_kv 2 × n_rep 4), d_m 512, every other size 64; float32 on CPU,
one batch element. Time: the median of --repeat forward+backward passes after one warm-up.
Memory: the growth of the process's peak resident memory (MB) over one pass at N, after a
pass at N = 16 for the lazy imports, with glibc mapping every block above 128 kB on its own
(as benchmarks/spec_memory.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"h": 8, "h_kv": 2, "n_rep": 4, "d_m": 512}
DEFAULT = "mha,gqa,softcap_window,attention_sinks,talking_heads,sigmoid_attention,differential"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--specs", default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--probe", nargs=2, metavar=("SPEC", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe, args.n, args.repeat)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT)}
    print("| spec | N | autograd ms | derived ms | ratio | autograd MB | derived MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.specs.split(","):
        found = {}
        for mode in ("autograd", "derived"):
            command = [sys.executable, __file__, "--probe", name, mode, "--n", str(args.n)]
            done = subprocess.run(
                [*command, "--repeat", str(args.repeat)],
                stdout=subprocess.PIPE,
                check=True,
                env=env,
                text=True,
            )
            found[mode] = json.loads(done.stdout)
        a, d = found["autograd"], found["derived"]
        print(
            f"| {name} | {args.n} | {a['ms']:.1f} | {d['ms']:.1f} | {d['ms'] / a['ms']:.2f} "
            f"| {a['mb']:.0f} | {d['mb']:.0f} |"
        )


def probe(name: str, mode: str, n: int, repeat: int) -> dict[str, float]:
    import resource
    import statistics
    import time

    import torch

    import indexattn
    from indexattn.oracle.verify import sample_arguments

    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")

    def arguments(length: int) -> dict:
        sizes = {a: SIZES.get(a, 64) for a in spec.ir.size_asciis} | {"N": length}
        args = sample_arguments(spec.ir, sizes, (1,), torch.float32)
        given = {k: v for k, v in sizes.items() if k in spec.required}
        leaves = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
        return leaves | given

    def step(kwargs: dict) -> None:
        out = spec(**kwargs, backward=mode)
        out = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in out if o.is_floating_point()).backward()

    step(arguments(16))
    big = arguments(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step(big)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step(big)
        times.append((time.perf_counter() - start) * 1000)
    return {"ms": statistics.median(times), "mb": grown}


if __name__ == "__main__":
    main()
