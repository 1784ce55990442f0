"""Context parallelism (Ulysses, or ring) on 2 CPU processes against one process: time and
peak memory per rank of one training step, and the elements sent against the symbolic count.

    .venv/bin/python benchmarks/context_parallel.py                    # N = 8192, 16384, 32768
    .venv/bin/python benchmarks/context_parallel.py --sizes 2048 --rounds 1   # a quick look
    .venv/bin/python benchmarks/context_parallel.py --strategy ring --tile 1024

The ring runs the literal interpreter on tiles of `--tile` positions (zig-zag chunks, causal
tile pairs above the diagonal skipped, each tile pair recomputed in the backward); its
elements sent are the P2P blocks (keys, values and their gradients), counted as they are
posted and by indexattn.sequence.ring_sent.

The layer is specs/mha.attn (causal; its core runs as SDPA) at d_m = 64, h = 2 heads of 32,
float32, one thread per process. A round times one step (forward and backward, after a
warm-up step on 256 positions) in a fresh single process, then in 2 fresh processes over
gloo on 127.0.0.1, each rank holding N/2 positions (indexattn.distributed.context_parallel);
rounds alternate the two, and the result is the median over rounds. Peak memory is each
process's peak resident set (ru_maxrss) less its resident set just before the timed step.
Elements sent are counted as the collectives run (indexattn.distributed.CountSent) and by
indexattn.sequence.ulysses_sent at the same sizes. Prints one JSON line per N.
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
SIZES = {"d_m": 64, "h": 2, "d_k": 32}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def worker(rank: int, world: int, n: int, port: int, ring: int, tile: int) -> dict:
    """One process: one step timed after a warm-up; world = 1 is the single process."""
    import indexattn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = indexattn.compile_spec(ROOT / "specs" / "mha.attn").module(**SIZES)
    x = torch.randn(1, n, SIZES["d_m"])
    sent: dict = {}
    if world > 1:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        import indexattn.parallel.distributed as cp
        from indexattn.parallel.sequence import ring_sent, ulysses_sent

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        mesh = init_device_mesh("cpu", (world,))
        strategy = "ring" if ring else "ulysses"
        layer = cp.context_parallel(layer, mesh, strategy=strategy, tile=tile or None)
        x = cp.sequence_block(x, mesh, dim=1, zigzag=bool(ring))
        spec = layer.spec.ir
        values = {s: {**SIZES, "N": n}[a] for s, a in spec.size_names.items()}
        items = (ring_sent if ring else ulysses_sent)(spec, layer.spec.sequence_plan())
        sent["counted"] = sum(
            item.at(values, world) for item in items if not ring or item.phase != "gradient"
        )
    x.requires_grad_()

    def step(rows: torch.Tensor) -> None:
        layer(rows).sum().backward()

    warm = 256 if world == 1 or not ring else 2 * world * min(tile or 64, n // (2 * world))
    step(x[:, :warm])  # warm-up: the first call's setup, on a short sequence
    before = _rss_mb()
    start = time.perf_counter()
    if world > 1 and ring:
        step(x)
        sent["ran"] = layer.last_ring["sent"]
    elif world > 1:
        with cp.CountSent(world) as counter:
            step(x)
        sent["ran"] = sum(counter.elements.values())
    else:
        step(x)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mb": peak - before, **sent}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MMAP: dict[str, str] = {}  # --mmap-threshold: glibc returns every larger block when freed


def _launch(world: int, n: int, ring: int = 0, tile: int = 0) -> list[dict]:
    port = _port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker"]
            + [str(v) for v in (rank, world, n, port, ring, tile)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **MMAP},
        )
        for rank in range(world)
    ]
    outs = [proc.communicate(timeout=1800)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a rank failed at N = {n}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def measure(n: int, rounds: int, ring: int, tile: int) -> dict:
    single, split = [], []
    for _ in range(rounds):
        single.append(_launch(1, n)[0])
        split.append(_launch(2, n, ring, tile))
    time1 = statistics.median(r["seconds"] for r in single)
    time2 = statistics.median(max(r["seconds"] for r in ranks) for ranks in split)
    return {
        "N": n,
        "one_process_s": round(time1, 3),
        "two_ranks_s": round(time2, 3),
        "speedup": round(time1 / time2, 2),
        "one_process_peak_mb": round(statistics.median(r["peak_mb"] for r in single), 1),
        "per_rank_peak_mb": round(
            statistics.median(max(r["peak_mb"] for r in ranks) for ranks in split), 1
        ),
        "sent_per_rank": split[0][0]["ran"],
        "counted_per_rank": split[0][0]["counted"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8192,16384,32768")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategy", choices=["ulysses", "ring"], default="ulysses")
    parser.add_argument("--tile", type=int, default=1024, help="the ring's tile (positions)")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        help="MALLOC_MMAP_THRESHOLD_ of every process (bytes): blocks above it are returned to "
        "the system when freed, so the peak resident set is what was live, not what glibc's "
        "heap kept",
    )
    parser.add_argument("--worker", nargs=6, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        sys.stdout.flush()
        os._exit(0)  # no gloo teardown (see tests/context_worker.py)
    if args.mmap_threshold:
        MMAP["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    for n in (int(s) for s in args.sizes.split(",")):
        ring = int(args.strategy == "ring")
        print(json.dumps({"strategy": args.strategy, **measure(n, args.rounds, ring, args.tile)}))


if __name__ == "__main__":
    main()
