"""Multi-Token Attention's core (specs/mta.attn's scores onward) against a hand-written
F.pad + grouped F.conv2d, forward and forward+backward: time and peak memory, interleaved,
median of rounds, one thread.

    .venv/bin/python benchmarks/mta.py --n 1024 --rounds 5
    .venv/bin/python benchmarks/mta.py --n 4096 --rounds 2 --heads 1 --no-warmup
    .venv/bin/python benchmarks/mta.py --n 512 --literal   # the plan before the convolve rule
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "models")]

from test_mta import CENTRED, HEAD, TAIL, conv2d_reference  # noqa: E402

import indexattn  # noqa: E402

H, D, C_Q, C_K = 4, 64, 6, 11  # the paper's kernel: 6 queries by 11 keys


def run(call, backward: bool, leaves=()):
    def step():
        for leaf in leaves:  # each call's gradients its own, none accumulated
            leaf.grad = None
        out = call()
        if backward:
            out.sum().backward()

    return step


class PeakTensors(TorchDispatchMode):
    """The peak of the bytes of tensor storages alive at once, made by the ops run under it
    (each storage counted once, freed when its last tensor goes): exact and repeatable, where
    the process's resident memory depends on what the allocator kept from earlier calls."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.live:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                self.live[key] = storage.nbytes()
                weakref.finalize(storage, self.live.pop, key, None)
        self.peak = max(self.peak, sum(self.live.values()))
        return out


def seconds(step) -> tuple[float, float]:
    """Wall time and the thread's CPU time (user and system: the page faults of fresh N × N
    tensors count) of one call. On a loaded machine the CPU time is the steadier: it leaves
    out the time the thread waited for a core."""
    wall, cpu = time.perf_counter(), time.thread_time()
    step()
    return time.perf_counter() - wall, time.thread_time() - cpu


def peak_mb(step) -> float:
    """The peak of tensors alive during one call, traced (tracing slows each op; the peak
    is the same every call)."""
    with PeakTensors() as traced:
        step()
    return traced.peak / 2**20


def literal() -> None:
    """Plans without the convolve rules: the shifted reads as gathers, as before them."""
    import os

    from indexattn.lower.planner import plan, products

    os.environ["INDEXATTN_CACHE"] = "0"
    products.PRODUCT_RULES = tuple(r for r in products.PRODUCT_RULES if r.name != "convolve")
    plan.REDUCTION_RULES = tuple(r for r in plan.REDUCTION_RULES if r.name != "convolve")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heads", type=int, default=H)
    parser.add_argument("--no-warmup", action="store_true", help="time the first call too")
    parser.add_argument(
        "--literal", action="store_true", help="the spec planned without the convolve rules"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.literal:
        literal()
    spec = indexattn.compile_spec(HEAD + CENTRED + TAIL, name="mta_core")
    for n in args.n:
        for backward in (False, True):
            compare(spec, n, args.heads, args.rounds, backward, not args.no_warmup)


def compare(spec, n: int, heads: int, rounds: int, backward: bool, warmup: bool) -> None:
    """The spec and the hand-written core, interleaved: median time and memory of rounds."""
    q, k, v = (torch.randn(heads, n, D, requires_grad=True) for _ in range(3))
    theta = torch.randn(heads, C_Q, C_K, requires_grad=True)
    calls = {
        "indexattn": lambda: spec(Q=q, K=k, V=v, theta=theta),
        "hand": lambda: conv2d_reference(q, k, v, theta, centred=True),
    }
    if warmup:
        for call in calls.values():  # the first call builds the tables of this shape
            run(call, backward, (q, k, v, theta))()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(seconds(run(call, backward, (q, k, v, theta))))
    m = {name: peak_mb(run(call, backward, (q, k, v, theta))) for name, call in calls.items()}
    t = {name: statistics.median(wall for wall, _ in ts) for name, ts in times.items()}
    c = {name: statistics.median(cpu for _, cpu in ts) for name, ts in times.items()}
    what = "forward+backward" if backward else "forward"
    print(
        f"N={n} {what}: indexattn {t['indexattn'] * 1e3:.0f} ms {m['indexattn']:.0f} MB, "
        f"hand {t['hand'] * 1e3:.0f} ms {m['hand']:.0f} MB, "
        f"time ratio {t['indexattn'] / t['hand']:.3f}, "
        f"CPU time ratio {c['indexattn'] / c['hand']:.3f} "
        f"({c['indexattn'] * 1e3:.0f} vs {c['hand'] * 1e3:.0f} ms), "
        f"memory ratio {m['indexattn'] / max(m['hand'], 1e-9):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
