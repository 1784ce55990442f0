"""The triton backend's printed kernels timed against FlexAttention where it takes the spec
(backend="flex") and against the blocked path's generated code (backend="blocks", the eager
alternative), forward and forward+backward, with peak memory: one JSON line per spec and
length. The kernels' block size is picked per spec from a small named set (`CONFIGS`, timed
on the forward at the first length). On a GPU: benchmarks/on_a_gpu.sh runs it (its section
"triton"); `--device cpu` is its dry run in Triton's interpreter at a tiny length, with
FlexAttention's eager forward (it times nothing worth quoting; the suite runs it).

    python benchmarks/triton_gpu.py --device cuda --lengths 8192,32768
    python benchmarks/triton_gpu.py --device cpu --lengths 40 --specs softcap_core
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch

import indexattn
from indexattn.backends import Refused
from indexattn.backends.flex import run as flex_run
from indexattn.oracle.verify import sample_arguments, sample_sizes

# the specs issue 49 must show first: a learned sink, a soft cap, causal GQA, sigmoid weights
SPECS = ("sinks_core", "softcap_core", "gqa_causal_core", "sigmoid_attention")
# the named autotune set: rows and keys per program (BLOCK_M = BLOCK_N)
CONFIGS = {"cuda": {"b32": 32, "b64": 64, "b128": 128}, "cpu": {"b16": 16}}
WIDTHS = {"h_kv": 2, "n_rep": 4, "h": 8, "d_k": 64, "d_v": 64, "d_m": 512}
TINY = {"h_kv": 1, "n_rep": 2, "h": 2, "d_k": 8, "d_v": 8, "d_m": 8}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, rounds: int, device: str) -> dict:
    """Best seconds of `rounds` calls after one warm-up; on CUDA the peak memory of one."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    row = {"s": best}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        fn()
        row["peak_MB"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return row


def callers(spec, args: dict, given: dict, floats: list):
    """(forward, forward+backward) of one compiled spec on these arguments."""

    detached = {k: v.detach() for k, v in args.items()}  # FlexAttention's CPU forward asks it

    def forward():
        with torch.no_grad():
            return spec(**detached, **given)

    def train():
        out = spec(**args, **given)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, floats, torch.ones_like(out))

    return forward, train


def compiled(name: str, backend: str):
    try:
        return indexattn.compile_spec(name, backend=backend)
    except Refused as error:
        return str(error).splitlines()[0][:160]


def measure(name: str, n: int, device: str, rounds: int, dtype, block: dict) -> dict:
    """One spec at one length: the kernels at each config (forward) where none is picked yet,
    then at the picked one, FlexAttention and the blocked path, forward and fwd+bwd."""
    spec = indexattn.compile_spec(name, backend="triton")
    fixed = {"N": n, "N_kv": n, **(WIDTHS if device == "cuda" else TINY)}
    sizes = sample_sizes(
        spec.ir, fixed={k: v for k, v in fixed.items() if k in spec.ir.size_asciis}
    )
    args = sample_arguments(spec.ir, sizes, batch=(1,), dtype=dtype, device=device)
    floats = [a for a in args.values() if a.is_floating_point()]
    for a in floats:
        a.requires_grad_(True)
    given = {k: sizes[k] for k in spec.ir.size_asciis if k in ("h",)}
    row = {"spec": name, "N": n, "device": device, "dtype": str(dtype).removeprefix("torch.")}
    from indexattn.backends.triton import launch

    if name not in block:
        tried = {}
        for label, size in CONFIGS[device].items():
            launch.BLOCK = size
            tried[label] = _safely(
                lambda: timed(callers(spec, args, given, floats)[0], rounds, device)["s"]
            )
        row["configs_forward_s"] = tried
        block[name] = min((s, k) for k, s in tried.items() if isinstance(s, float))[1]
    row["config"] = block[name]
    launch.BLOCK = CONFIGS[device][block[name]]
    forward, train = callers(spec, args, given, floats)
    got = forward()
    row["triton_forward"], row["triton_train"] = (
        _safely(lambda f=f: timed(f, rounds, device)) for f in (forward, train)
    )
    for backend in ("flex", "blocks"):
        other = compiled(name, backend)
        if isinstance(other, str):
            row[backend] = other
            continue
        forward, train = callers(other, args, given, floats)
        row[f"{backend}_forward"] = _safely(lambda f=forward: timed(f, rounds, device))
        if device == "cuda" or backend != "flex":  # FlexAttention has no CPU backward
            row[f"{backend}_train"] = _safely(lambda f=train: timed(f, rounds, device))
        if backend == "blocks":
            want = forward()
            row["max_error_vs_blocks"] = (got - want).abs().max().item()
    return row


def _safely(fn):
    """fn(), or its error as a short string (out of memory is a figure, not the end)."""
    try:
        return fn()
    except (torch.OutOfMemoryError, RuntimeError, ValueError) as error:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return f"error: {repr(error)[:200]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--lengths", default="8192,32768")
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    flex_run.COMPILE = args.device == "cuda"  # the dry run: flex_attention's eager forward
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    rounds = args.rounds if args.device == "cuda" else 1
    failed, block = 0, {}
    for n in map(int, args.lengths.split(",")):
        for name in args.specs.split(","):
            try:
                row = measure(name, n, args.device, rounds, dtype, block)
            except Exception as error:  # one spec's failure is a row, not the end of the run
                row, failed = {"spec": name, "N": n, "error": repr(error)[:300]}, 1
            failed |= any(isinstance(v, str) and v.startswith("error") for v in row.values())
            print(json.dumps(row), flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
