"""Forward + backward of shipped specs with autograd's backward and with the derived one
(`backward="derived"`): time and peak memory, each measurement in a fresh process on one
thread, the two modes interleaved round by round; writes the measurements and the default
backward each spec gets (indexattn/derive/defaults.json).

    .venv/bin/python benchmarks/gradients.py --n 2048 --rounds 3 --write

Sizes: N = --n, heads 8 (h_kv 2 × n_rep 4), d_m 512, every other size 64; float32 on CPU,
one batch element. Time: one forward+backward pass after a pass at N = 16 (the lazy imports)
and one at N (the per-shape work); the median over rounds, with its spread. Memory: the growth
of the process's peak resident memory (MB) over the first pass at N, with glibc mapping every
block above 128 kB on its own (as benchmarks/spec_memory.py), so the peak counts the tensors
alive together. The derived backward is a spec's default where its median time is at most
autograd's and its peak memory at most autograd's (docs/gradients.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from indexattn.catalog import shipped_specs  # noqa: E402
from indexattn.derive.defaults import TABLE, choose, digest  # noqa: E402

SIZES = {"h": 8, "h_kv": 2, "n_rep": 4, "d_m": 512}
BLOCKED = "softcap_window,attention_sinks,differential,talking_heads,sigmoid_attention"
DEFAULT = f"mha,gqa,{BLOCKED}"
MODES = ("autograd", "derived")
KEYS = ("autograd median ms", "derived median ms", "autograd MB", "derived MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--specs", default=DEFAULT, help="comma-separated, or `all` shipped")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the defaults' table")
    parser.add_argument("--probe", nargs=2, metavar=("SPEC", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe, args.n)))
        return
    names = sorted(shipped_specs()) if args.specs == "all" else args.specs.split(",")
    found = measure(names, args.n, args.rounds)
    rows = [summary(name, args.n, found[name]) for name in names]
    print("| spec | N | autograd ms | derived ms | derived / autograd | autograd MB | derived MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['spec']} | {r['n']} | {r['autograd ms']} | {r['derived ms']} | "
            f"{r['ratio']:.2f} | {r['autograd MB']:.0f} | {r['derived MB']:.0f} |"
        )
    if args.write:
        write(rows)


def measure(names: list[str], n: int, rounds: int) -> dict[str, dict[str, list[dict]]]:
    """Every spec in every mode, once a round; within a round the modes alternate which goes
    first, so that a change of the machine's load falls on both."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT)}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    found = {name: {mode: [] for mode in MODES} for name in names}
    for r in range(rounds):
        for name in names:
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                command = [sys.executable, __file__, "--probe", name, mode, "--n", str(n)]
                done = subprocess.run(
                    command, stdout=subprocess.PIPE, check=True, env=env, text=True
                )
                found[name][mode].append(json.loads(done.stdout))
    return found


def summary(name: str, n: int, found: dict[str, list[dict]]) -> dict:
    """The medians of the rounds, the times with their spread (min–max)."""
    row: dict = {"spec": name, "n": n}
    for mode in MODES:
        times = [p["ms"] for p in found[mode]]
        spread = f"{min(times):.0f}–{max(times):.0f}"
        row[f"{mode} ms"] = f"{statistics.median(times):.0f} ({spread})"
        row[f"{mode} median ms"] = statistics.median(times)
        row[f"{mode} MB"] = statistics.median(p["mb"] for p in found[mode])
    row["ratio"] = row["derived median ms"] / row["autograd median ms"]
    return row


def write(rows: list[dict]) -> None:
    """The table each spec's default backward is read from: its measurements, the choice,
    and the hash of the spec's text it was measured on (a changed spec falls back to
    autograd until the benchmark is run again)."""
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    for row in rows:
        text = (ROOT / "specs" / f"{row['spec']}.attn").read_text(encoding="utf-8")
        table[row["spec"]] = {
            "backward": choose(*(row[k] for k in KEYS)),
            "sha256": digest(text),
            "n": row["n"],
            **{
                f"{m} {u}": round(row[f"{m} {k}"], 1)
                for m in MODES
                for u, k in (("ms", "median ms"), ("MB", "MB"))
            },
        }
    TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=1, ensure_ascii=False) + "\n")


def probe(name: str, mode: str, n: int) -> dict[str, float]:
    import resource
    import time

    import torch

    import indexattn
    from indexattn.oracle.verify import sample_arguments

    torch.set_num_threads(1)
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
    start = time.perf_counter()
    step(big)
    return {"ms": (time.perf_counter() - start) * 1000, "mb": grown}


if __name__ == "__main__":
    main()
