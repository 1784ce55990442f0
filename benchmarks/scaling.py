"""Time and peak memory against N of ten shipped specs and hand-written baselines that run by
blocks of 256 queries over the keys each block sees, each block's mask or bias made from its
positions, checkpointed per block in a training step (benchmarks/baselines/row_blocks.py;
retention and causal linear attention by chunks). Float32, d_m 512, 8 heads of 64 (differential:
4 pairs of maps of 64; attention_sinks: 2 key/value heads of 4 queries), window 1024, batch 1.

One thread; every figure comes from a fresh process: peak resident growth over the first
call at N (after a call at N = 16 for the lazy imports; the spec's per-shape constants are
built in it), and the median time of `--rounds` calls after it (with 0, the time of that
first call, which is kept too). Each record keeps the machine's load average (1, 5 and 15
minutes) at the run's end; `--who spec` or `--who hand` runs one side only (a spec and its
baseline side by side, in two invocations).

A training step is the forward, then `backward` of the mean square (the spec through
autograd). Each measurement is kept in benchmarks/scaling.json (the newest per spec, N,
implementation and mode); benchmarks/report.py (or `--write`) makes docs/performance.md's
tables and docs/scaling.svg from it.

    .venv/bin/python benchmarks/scaling.py --n 512 2048 8192 [--train] [--specs mha ...]
    .venv/bin/python benchmarks/scaling.py --n 32768 --train --specs mha --who hand --rounds 0
    .venv/bin/python benchmarks/scaling.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402
from spec_memory import growth, inputs  # noqa: E402

SPECS = report.SCALING_SPECS  # the ten specs, in the order the page lists them
SIZES = {"d_in": 512, "d_out": 512, "d_m": 512, "d_k": 64, "h": 8, "w": 1024, "c": 50.0}
SIZES_OF = {"attention_sinks": {"h_kv": 2, "n_rep": 4}, "differential": {"h": 4, "d": 64}}
RESULTS = ROOT / "benchmarks" / "scaling.json"


def baseline(name: str):
    """The hand-written forward of a spec: f(inputs, parameters, sizes and scalars)."""
    from baselines import chunked_linear, retention, row_blocks

    if name == "retention":
        return lambda x, p, s: retention.forward(x["X"], p, s)
    if name == "linear_attention_causal":
        return lambda x, p, s: chunked_linear.forward(x["X"], p, s, s["eps"])
    if name == "doc_mask":
        return lambda x, p, s: row_blocks.doc_mask(x["X"], x["D"], p, s)
    return lambda x, p, s: getattr(row_blocks, name)(x["X"], p, s)


def build(name: str):
    """The spec's module (eval: no dropout), its sizes and scalars, and inputs of a length."""
    import indexattn

    spec = indexattn.compile_spec(name)
    known = {*spec.size_names, *(s.ascii for s in spec.ir.scalars)}
    sizes = {k: v for k, v in {**SIZES, **SIZES_OF.get(name, {})}.items() if k in known}
    layer = spec.module(**sizes).eval()
    scalars = {s.ascii: float(s.value) for s in spec.ir.scalars}
    return layer, {**scalars, **sizes}, lambda n: inputs(spec, n, sizes)


def probe(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer, sizes, make = build(name)
    params = dict(layer.named_parameters())
    forward = baseline(name)

    def run(x):
        y = forward(x, params, sizes) if hand else layer(**x)
        if train:
            y.square().mean().backward()

    return timed(run, make, n, train, rounds, params.values())


def timed(run, make, n: int, train: bool, rounds: int, params, clock=time.perf_counter) -> dict:
    """Peak resident growth of `run(make(n))`'s first call (after one at N = 16 for the lazy
    imports; the spec's per-shape constants are built in it) and the median time of `rounds`
    calls after it by `clock` (the first call's with none); also benchmarks/unseen.py's."""
    import torch

    for p in params:
        p.requires_grad_(train)
    with torch.set_grad_enabled(train):
        run(make(16))
        x = make(n)
        start = clock()
        peak = growth(lambda: run(x))
        seconds = [clock() - start]
        for _ in range(rounds):
            start = clock()
            run(x)
            seconds.append(clock() - start)
    median = statistics.median(seconds[1:] or seconds)
    return {"MB": peak, "s": round(median, 4), "first s": round(seconds[0], 4)}


def measure(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    return spawn(__file__, name, n, hand, train, rounds) | {"device": "cpu"}


def spawn(script: str, name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    """`script --probe ...` in a fresh process (glibc mapping each block over 128 kB on its
    own, one thread): its record, with the machine's load average at its end."""
    flags = [name, str(n), "hand" if hand else "spec", "train" if train else "forward"]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, script, "--probe", *flags, str(rounds)],
        stdout=subprocess.PIPE,
        check=True,
        env=env,
        text=True,
    )
    keys = ("name", "n", "who", "mode")
    got = {**dict(zip(keys, [name, n, *flags[2:]])), "rounds": rounds}
    got["load"] = [round(x, 1) for x in os.getloadavg()]
    return {**got, **json.loads(done.stdout)}


def load() -> list[dict]:
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    return json.loads(text) if text else []


def keep(record: dict) -> None:
    """Adds a measurement to benchmarks/scaling.json, in place of an older one of the same
    (under a lock: runs of several lengths may go on side by side)."""
    key = ("name", "n", "who", "mode")
    with FileLock(f"{RESULTS}.lock"):  # filelock ships with torch, and runs on Windows
        old = [r for r in load() if any(r[k] != record[k] for k in key)]
        text = json.dumps([*old, record], indent=1, ensure_ascii=False)
        RESULTS.write_text(text + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="*", default=[])
    parser.add_argument("--specs", nargs="*", default=list(SPECS))
    parser.add_argument("--train", action="store_true", help="a training step, not a forward")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls after the first")
    parser.add_argument("--who", choices=("spec", "hand"), nargs="*", default=["spec", "hand"])
    parser.add_argument("--write", action="store_true", help="then run benchmarks/report.py")
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        name, n, who, mode, rounds = args.probe
        got = probe(name, int(n), who == "hand", mode == "train", int(rounds))
        print(json.dumps(got))
        return
    for n in args.n:
        for name in args.specs:
            for hand in (who == "hand" for who in args.who):
                record = measure(name, n, hand, args.train, args.rounds)
                keep(record)
                print(json.dumps(record, ensure_ascii=False), flush=True)
    if args.write:
        report.main()


if __name__ == "__main__":
    main()
