"""Peak memory of one forward of a shipped spec, in a fresh process.

    .venv/bin/python benchmarks/spec_memory.py specs/t5_bias.attn --n 2048 --size d_m=768 h=12

Builds the spec's module (parameters at the given sizes) and an input X of shape (1, N, d_m)
(an integer input, such as the document ids of doc_mask: four documents), runs one call at N = 16
for the lazy imports, then reports the growth of peak resident memory (MB) over the first call
at N (which builds the per-shape constants) and over a second call (which reuses them). Each
measurement runs in its own process, with glibc mapping every block above 128 kB on its own,
so the peak counts tensors alive together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--size", nargs="*", default=[], help="NAME=VALUE, as the module wants")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = {k: int(v) for k, v in (item.split("=") for item in args.size)}
    if args.probe:
        print(json.dumps(probe(args.spec, args.n, sizes)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    command = [sys.executable, __file__, "--probe", args.spec, "--n", str(args.n)]
    done = subprocess.run(
        [*command, "--size", *args.size], stdout=subprocess.PIPE, check=True, env=env, text=True
    )
    print(json.dumps({"spec": args.spec, "n": args.n, **json.loads(done.stdout)}))


def probe(path: str, n: int, sizes: dict[str, int]) -> dict[str, float]:
    import torch

    import indexattn

    torch.manual_seed(0)
    spec = indexattn.compile_spec(path)
    known = {*spec.size_names, *(s.ascii for s in spec.ir.scalars)}  # sizes, and scalars (w)
    sizes = {k: v for k, v in sizes.items() if k in known}
    layer = spec.module(**sizes).eval()
    with torch.inference_mode():
        layer(**inputs(spec, 16, sizes))
        x = inputs(spec, n, sizes)
        first = growth(lambda: layer(**x))
        second = growth(lambda: layer(**x))
    return {**sizes, "first call MB": first, "second call MB": second}


def growth(call) -> float:
    """How far resident memory rises above its level before the call, in MB."""
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak to the current level
    before = status_mb("VmRSS")
    call()
    return round(status_mb("VmHWM") - before, 1)


def inputs(spec, n: int, sizes: dict[str, int]) -> dict:
    import torch

    found = {}
    for tensor in spec.ir.tensors_of("input"):
        shape = [n if str(i.size) == "N" else sizes[str(i.size)] for i in tensor.indices]
        if tensor.dtype == "int":
            found[tensor.ascii] = (torch.arange(n) * 4 // n)[None]  # four documents
        else:
            found[tensor.ascii] = torch.randn(1, *shape)
    return found


def status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status: peak memory needs Linux")


if __name__ == "__main__":
    main()
