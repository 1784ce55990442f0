"""The triton backend's printed kernels against the spec's own generated code (the eager
alternative), forward and forward+backward, with peak memory: one JSON line per spec and
length. On a GPU: benchmarks/on_a_gpu.sh runs it (its section "triton"); `--device cpu`
is its dry run in Triton's interpreter at a tiny length (it times nothing worth quoting).

    python benchmarks/triton_gpu.py --device cuda --lengths 8192,32768
    TRITON_INTERPRET=1 python benchmarks/triton_gpu.py --device cpu --lengths 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch

import indexattn
from indexattn.backends import triton as backend
from indexattn.oracle.verify import sample_arguments, sample_sizes

# core specs: inputs are the kernel's operands (a named set: the ones issue 49 must show first)
SPECS = ("sinks_core", "softcap_core", "gqa_causal_core")
BLOCKS = {"cuda": 64, "cpu": 16}  # the one configuration of each device (no autotuning yet)


def _time(fn, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, n: int, device: str, rounds: int, dtype: torch.dtype) -> dict:
    compiled = indexattn.compile_spec(name)
    spec = compiled.ir
    fixed = {"N": n, "N_kv": n, "h_kv": 2, "n_rep": 4, "d_k": 64, "d_v": 64}
    if device == "cpu":  # the dry run: the interpreter's seconds per program
        fixed.update(h_kv=1, n_rep=2, d_k=8, d_v=8)
    sizes = sample_sizes(spec, fixed={k: v for k, v in fixed.items() if k in spec.size_asciis})
    args = sample_arguments(spec, sizes, batch=(1,), dtype=dtype, device=device)
    floats = [a for k, a in args.items() if k in ("Q", "K", "V", "s_aux")]
    for a in floats:
        a.requires_grad_(True)
    block = BLOCKS[device]

    def triton_forward():
        with torch.no_grad():
            return backend.run(spec, block=block, **args)

    def triton_train():
        out = backend.run(spec, block=block, **args)[0]
        torch.autograd.grad(out, floats, torch.ones_like(out))

    def eager_forward():
        with torch.no_grad():
            return compiled(**args)

    def eager_train():
        out = compiled(**args)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, floats, torch.ones_like(out))

    row = {"spec": name, "N": n, "device": device, "dtype": str(dtype).removeprefix("torch.")}
    for label, fn in (
        ("triton_forward", triton_forward),
        ("triton_train", triton_train),
        ("eager_forward", eager_forward),
        ("eager_train", eager_train),
    ):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row[f"{label}_s"] = _time(fn, rounds)
        if device == "cuda":
            row[f"{label}_peak_bytes"] = torch.cuda.max_memory_allocated()
    got = triton_forward()[0]
    want = eager_forward()
    want = want[0] if isinstance(want, tuple) else want
    row["max_error"] = (got - want).abs().max().item()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--lengths", default="8192,32768")
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    rounds = args.rounds if args.device == "cuda" else 1
    failed = 0
    for name in args.specs.split(","):
        for n in map(int, args.lengths.split(",")):
            try:
                row = measure(name, n, args.device, rounds, dtype)
            except Exception as error:  # one spec's failure is a row, not the end of the run
                row, failed = {"spec": name, "N": n, "error": repr(error)[:300]}, 1
            print(json.dumps(row), flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
