"""Multi-Token Attention's core (specs/mta.attn's scores onward) against a hand-written
F.pad + grouped F.conv2d, forward and forward+backward: time and peak memory, interleaved,
median of rounds, one thread.

    .venv/bin/python benchmarks/mta.py --n 1024 --rounds 5
    .venv/bin/python benchmarks/mta.py --n 4096 --rounds 3 --heads 1
    .venv/bin/python benchmarks/mta.py --n 512 --literal   # the plan before the convolve rule
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_mta import CENTRED, HEAD, TAIL, conv2d_reference  # noqa: E402

import indexattn  # noqa: E402
from benchmarks.spec_memory import growth  # noqa: E402

H, D, C_Q, C_K = 4, 64, 6, 11  # the paper's kernel: 6 queries by 11 keys


def run(call, backward: bool):
    def step():
        out = call()
        if backward:
            out.sum().backward()

    return step


def measure(step) -> tuple[float, float]:
    start = time.perf_counter()
    mb = growth(step)
    return time.perf_counter() - start, mb


def literal() -> None:
    """Plans without the convolve rules: the shifted reads as gathers, as before them."""
    import os

    from indexattn.lower import plan, products

    os.environ["INDEXATTN_CACHE"] = "0"
    products.PRODUCT_RULES = tuple(r for r in products.PRODUCT_RULES if r.name != "convolve")
    plan.REDUCTION_RULES = tuple(r for r in plan.REDUCTION_RULES if r.name != "convolve")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heads", type=int, default=H)
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
            compare(spec, n, args.heads, args.rounds, backward)


def compare(spec, n: int, heads: int, rounds: int, backward: bool) -> None:
    """The spec and the hand-written core, interleaved: median time and memory of rounds."""
    q, k, v = (torch.randn(heads, n, D, requires_grad=True) for _ in range(3))
    theta = torch.randn(heads, C_Q, C_K, requires_grad=True)
    calls = {
        "indexattn": lambda: spec(Q=q, K=k, V=v, theta=theta),
        "hand": lambda: conv2d_reference(q, k, v, theta, centred=True),
    }
    rows = {name: [] for name in calls}
    for call in calls.values():  # the first call builds the tables of this shape
        run(call, backward)()
    for _ in range(rounds):
        for name, call in calls.items():
            rows[name].append(measure(run(call, backward)))
            q.grad = k.grad = v.grad = theta.grad = None
    t = {name: statistics.median(r[0] for r in rs) for name, rs in rows.items()}
    m = {name: statistics.median(r[1] for r in rs) for name, rs in rows.items()}
    what = "forward+backward" if backward else "forward"
    print(
        f"N={n} {what}: indexattn {t['indexattn'] * 1e3:.0f} ms {m['indexattn']:.0f} MB, "
        f"hand {t['hand'] * 1e3:.0f} ms {m['hand']:.0f} MB, "
        f"time ratio {t['indexattn'] / t['hand']:.3f}, "
        f"memory ratio {m['indexattn'] / max(m['hand'], 1e-9):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
