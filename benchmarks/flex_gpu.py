"""Every shipped spec FlexAttention takes (backend="flex"), timed on a device: forward,
forward+backward and peak memory of forward+backward, at each length, through backend="flex"
and backend="blocks"; and benchmarks/flex.py's three cores against hand-written compiled
`flex_attention` (same score_mod and mask_mod). JSON lines on stdout. On a GPU,
benchmarks/on_a_gpu.sh runs it at N = 8192 and 32768; `--device cpu` is its dry run at a tiny
length (forward only for flex: FlexAttention has no CPU backward), which the suite runs.

    .venv/bin/python benchmarks/flex_gpu.py --device cuda --lengths 8192,32768
    .venv/bin/python benchmarks/flex_gpu.py --device cpu --lengths 64 --rounds 1 --eager
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flex as cores

import indexattn
from indexattn import catalog
from indexattn.backends.flex import run
from indexattn.oracle import verify

WIDTHS = {"h": 8, "h_kv": 2, "n_rep": 4, "d_k": 64, "d_v": 64, "d": 64, "d_m": 512}
WIDTHS |= {"d_in": 512, "d_out": 512, "d_model": 512}
SEQUENCES = ("N", "N_kv", "M", "T", "L")


def flex_specs() -> list[str]:
    found = []
    for name in catalog.names():
        try:
            indexattn.compile_spec(name, backend="flex")
        except (ValueError, LookupError, NotImplementedError):
            continue
        found.append(name)
    return found


def sizes_at(spec, n: int) -> dict[str, int]:
    fixed = {k: v for k, v in WIDTHS.items() if k in spec.ir.size_asciis}
    fixed |= {k: n for k in SEQUENCES if k in spec.ir.size_asciis}
    try:
        return verify.sample_sizes(spec.ir, 0, fixed)
    except ValueError:
        return verify.sample_sizes(spec.ir, 0, {k: n for k in SEQUENCES if k in fixed})


def timed(function, rounds: int, device: str) -> float:
    times = []
    for _ in range(rounds + 1):
        sync(device)
        start = time.perf_counter()
        function()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(spec, args: dict, sizes: dict, rounds: int, device: str, backward: bool) -> dict:
    given = {k: v for k, v in sizes.items() if k in spec.required}
    floats = [v for v in args.values() if v.is_floating_point()]

    def forward():
        with torch.no_grad():
            spec(**args, **given)

    def step():
        for x in floats:
            x.grad = None
        out = spec(**args, **given)  # eval: FlexAttention has no dropout (forward+backward)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()

    row = {"forward_ms": timed(forward, rounds, device)}
    if backward:
        for x in floats:
            x.requires_grad_()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row["step_ms"] = timed(step, rounds, device)
        if device == "cuda":
            row["peak_MB"] = torch.cuda.max_memory_allocated() / 2**20
        for x in floats:
            x.requires_grad_(False)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", default="8192,32768")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--specs", default="", help="comma-separated; default every flex spec")
    parser.add_argument("--eager", action="store_true", help="flex_attention uncompiled")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    run.COMPILE = not args.eager
    device = args.device
    names = args.specs.split(",") if args.specs else flex_specs()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for n in map(int, args.lengths.split(",")):
        for name in names:
            for backend in ("flex", "blocks"):
                spec = indexattn.compile_spec(name, backend=backend)
                sizes = sizes_at(spec, n)
                data = verify.sample_arguments(spec.ir, sizes, (1,), dtype, 0, device)
                backward = device != "cpu" or backend != "flex"
                try:
                    row = measure(spec, data, sizes, args.rounds, device, backward)
                except torch.OutOfMemoryError:
                    row = {"error": "out of memory"}
                    torch.cuda.empty_cache()
                print(json.dumps({"spec": name, "backend": backend, "N": n, **row}), flush=True)
        for case in cores.CASES:
            compiled = run._compiled(device == "cpu") if run.COMPILE else flex_attention
            functions = cores.core_functions(case, n, compiled, device, dtype)
            with torch.no_grad():
                times = {k: timed(f, args.rounds, device) for k, f in functions.items()}
            print(json.dumps({"core": case, "N": n, "forward_ms": times}), flush=True)


if __name__ == "__main__":
    main()
