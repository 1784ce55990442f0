"""Context parallelism (Ulysses, or ring) on W CPU processes against one process: per-rank CPU
time and peak memory of one training step, the work ratio (CPU time summed over the W ranks
over one process's), and the elements sent against the symbolic count.

    .venv/bin/python benchmarks/context_parallel.py            # mha, N = 8192 … 32768, W = 2
    .venv/bin/python benchmarks/context_parallel.py --sizes 2048 --rounds 1   # a quick look
    .venv/bin/python benchmarks/context_parallel.py --strategy ring --worlds 2,4 --steps 2 \\
        --specs mha,softcap_window,doc_mask,attention_sinks --sizes 32768 --rounds 3

The ring runs each tile pair of `--tile` positions (by default the length its block map
chooses for the mask: a window's, or, for document ids, from their bounds) through its pass's
compiled tile spec (indexattn/parallel/tiles.py; the projections outside the tile pairs on
the interpreter; tile pairs that a mask hides skipped, each tile pair recomputed in the
backward, from each row's merged output and log-sum-exp where its core is SDPA's or the
one-step softmax); its elements sent are the P2P blocks (keys, values and their
gradients), counted as they are posted and by indexattn.parallel.sends.ring_sent_ranks (this
rank's, read off the block map).

Each spec runs at d_m = 64 and two heads of 32 (attention_sinks: 2 key/value groups of 1
query head), float32, one thread per process, with its shipped scalars (softcap_window's
window 4096, attention_sinks' 128; doc_mask's documents 1024 positions long). A round runs
`--steps` steps (forward and backward, after a warm-up step on a short sequence) and times
the last (1: the first step at N, with what is made once per length; 2: the steady state of
training) in a fresh single process, then in W fresh processes over gloo on 127.0.0.1, each
rank holding N/W positions (indexattn.distributed.context_parallel; for the ring, the layout
that balances its work as `count --ring` names it, indexattn.parallel.sequence.balanced);
the result is the median over rounds, one process's rounds shared by every W. CPU time is
each process's own (time.process_time: what a loaded machine's other processes take is not in
it), and the work ratio is the W ranks' CPU time summed over one process's: 1 is perfect
division of the work. The W ranks share the machine's cores and caches, which makes each
process's CPU time longer (on the 2-core machine of docs/distributed.md, two single processes
at N = 16384 run at once took 0.23 to 0.32 s of CPU each, against 0.17 to 0.19 s alone): the
loaded work ratio divides by one process's CPU time measured as W single processes run at
once, each on its own, the machine as loaded as it is by the ranks. Peak memory is each
process's peak resident set (ru_maxrss) less its resident set just before the first step at
N. Elements sent are counted as the collectives run (indexattn.distributed.CountSent) and by
indexattn.sequence.ulysses_sent at the same sizes. Prints one JSON line per spec, N and W.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SIZES = {  # per spec: the module's sizes
    "mha": {"d_m": 64, "h": 2, "d_k": 32},
    "softcap_window": {"d_m": 64, "h": 2, "d_k": 32, "query_pre_attn_scalar": 32},
    "doc_mask": {"d_m": 64, "h": 2, "d_k": 32},
    "attention_sinks": {"d_m": 64, "h_kv": 2, "n_rep": 1, "d_k": 32},
    "rope": {"d_m": 64, "h": 2, "d_r": 16},  # rotary at global positions (two halves of 16)
}
DOCUMENT = 1024  # doc_mask's documents: positions 0 … 1023 the first, and so on


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _inputs(name: str, n: int) -> dict:
    found = {"X": torch.randn(1, n, SIZES[name]["d_m"])}
    if name == "doc_mask":
        found["D"] = (torch.arange(n) // DOCUMENT)[None]
    return found


def split(layer, name: str, n: int, group: tuple[int, int, int], ring: int, tile: int = 0):
    """`layer` split over the W processes of `group` (rank, W, port: gloo on 127.0.0.1), the
    ring on the layout that balances its work (count --ring's), Ulysses on contiguous blocks;
    with the mesh, the layout's name and the sizes by symbol at N = `n`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import indexattn.parallel.distributed as cp
    from indexattn.parallel.sequence import balanced

    rank, world, port = group
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    spec, plan = layer.spec.ir, layer.spec.sequence_plan()
    given = {**SIZES[name], "N": n}
    values = {s: given[a] for s, a in spec.size_names.items() if a in given}
    layout = balanced(spec, plan, values, world).name if ring else "contiguous"
    strategy = "ring" if ring else "ulysses"
    layer = cp.context_parallel(layer, mesh, strategy=strategy, layout=layout, tile=tile or None)
    return layer, mesh, layout, values


def worker(
    name: str, rank: int, world: int, n: int, port: int, ring: int, tile: int, steps: int
) -> dict:
    """One process: `steps` steps after a warm-up, the last timed, the first's peak memory;
    world = 1 is the single process."""
    import indexattn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn").module(**SIZES[name])
    xs = _inputs(name, n)
    sent: dict = {}
    if world > 1:
        import indexattn.parallel.distributed as cp
        from indexattn.parallel.sends import ring_sent_ranks
        from indexattn.parallel.sequence import ulysses_sent

        layer, mesh, layout, values = split(layer, name, n, (rank, world, port), ring, tile)
        spec, plan = layer.spec.ir, layer.spec.sequence_plan()
        xs = {k: cp.sequence_block(v, mesh, dim=1, layout=layout) for k, v in xs.items()}
        sent["layout"] = layout
        sent["counted"] = (  # the ring's off the block map (document ids: an upper bound)
            ring_sent_ranks(spec, plan, values, world, layout, tile or None)[rank]
            if ring
            else sum(item.at(values, world) for item in ulysses_sent(spec, plan))
        )
    xs["X"].requires_grad_()

    def step(rows: dict) -> None:
        layer(**rows).sum().backward()

    def timed() -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        if world > 1 and ring:
            step(xs)
            sent["ran"] = layer.last_ring["sent"]
        elif world > 1:
            with cp.CountSent(world) as counter:
                step(xs)
            sent["ran"] = sum(counter.elements.values())
        else:
            step(xs)
        return time.process_time() - cpu, time.perf_counter() - start

    warm = 256 if world == 1 or not ring else 2 * world * min(tile or 64, n // (2 * world))
    step({k: v[:, :warm] for k, v in xs.items()})  # warm-up: the first call's setup
    before = _rss_mb()
    cpu, seconds = timed()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the first step's
    for _ in range(steps - 1):  # the steady state: every later step at this N
        cpu, seconds = timed()
    return {"seconds": seconds, "cpu_s": cpu, "peak_mb": peak - before, **sent}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MMAP: dict[str, str] = {}  # --mmap-threshold: glibc returns every larger block when freed


def launch(script: str, name: str, world: int, n: int, *rest: int, copies: int = 0) -> list[dict]:
    """`world` processes of `script --worker NAME RANK W N PORT *REST`, each rank's JSON line;
    with `copies`, that many single processes (W = 1) at once, each on its own."""
    port = _port()
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--worker", name]
            + [str(v) for v in (0 if copies else rank, world, n, port, *rest)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **MMAP},
        )
        for rank in range(copies or world)
    ]
    outs = [proc.communicate(timeout=3600)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a rank failed: {name} at N = {n}, W = {world}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def answer(worker, given: list[str]) -> None:
    """A worker process: its JSON line printed, and the process left (no gloo teardown, see
    tests/context_worker.py)."""
    print(json.dumps(worker(given[0], *map(int, given[1:]))))
    sys.stdout.flush()
    os._exit(0)


def _median(rows: list, key) -> float:
    return statistics.median(map(key, rows))


SINGLE: dict[tuple, list] = {}  # one process's rounds, per spec, N and processes beside it


def measure(name: str, n: int, world: int, rounds: int, ring: int, tile: int, steps: int) -> dict:
    single, split = SINGLE.setdefault((name, n, 1), []), []
    loaded = SINGLE.setdefault((name, n, world), [])
    for k in range(rounds):
        if len(single) <= k:  # one process measured once for every W
            single.append(launch(__file__, name, 1, n, 0, 0, steps)[0])
        if len(loaded) <= k:  # W single processes at once: the machine as loaded as the ranks
            loaded += launch(__file__, name, 1, n, 0, 0, steps, copies=world)
        split.append(launch(__file__, name, world, n, ring, tile, steps))
    cpu1 = _median(single, lambda r: r["cpu_s"])
    beside = _median(loaded, lambda r: r["cpu_s"])
    ranks_cpu = [round(statistics.median(rs[k]["cpu_s"] for rs in split), 2) for k in range(world)]
    return {
        "N": n,
        "W": world,
        "one_process_cpu_s": round(cpu1, 2),
        "per_rank_cpu_s": ranks_cpu,
        "work_ratio": round(sum(ranks_cpu) / cpu1, 2),
        "one_process_loaded_cpu_s": round(beside, 2),
        "work_ratio_loaded": round(sum(ranks_cpu) / beside, 2),
        "one_process_s": round(_median(single, lambda r: r["seconds"]), 2),
        "split_s": round(_median(split, lambda rs: max(r["seconds"] for r in rs)), 2),
        "one_process_peak_mb": round(_median(single, lambda r: r["peak_mb"]), 1),
        "per_rank_peak_mb": round(_median(split, lambda rs: max(r["peak_mb"] for r in rs)), 1),
        "layout": split[0][0]["layout"],
        "sent_per_rank": split[0][0]["ran"],
        "counted_per_rank": split[0][0]["counted"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", default="mha", help=f"some of {', '.join(SIZES)}")
    parser.add_argument("--sizes", default="8192,16384,32768")
    parser.add_argument("--worlds", default="2", help="processes W, e.g. 2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategy", choices=["ulysses", "ring"], default="ulysses")
    parser.add_argument(
        "--tile",
        type=int,
        default=0,
        help="the ring's tile (positions); 0: the one the block map chooses for the spec's mask",
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        help="MALLOC_MMAP_THRESHOLD_ of every process (bytes): blocks above it are returned to "
        "the system when freed, so the peak resident set is what was live, not what glibc's "
        "heap kept",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="steps at N per process, the last timed (2: the steady state of training, what "
        "each step after the first costs; 1: the first, with its per-length setup)",
    )
    parser.add_argument("--worker", nargs=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        answer(worker, args.worker)
    if args.mmap_threshold:
        MMAP["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    ring = int(args.strategy == "ring")
    for name in args.specs.split(","):
        for world in (int(w) for w in args.worlds.split(",")):
            for n in (int(s) for s in args.sizes.split(",")):
                found = measure(name, n, world, args.rounds, ring, args.tile, args.steps)
                print(json.dumps({"spec": name, "strategy": args.strategy, **found}), flush=True)


if __name__ == "__main__":
    main()
