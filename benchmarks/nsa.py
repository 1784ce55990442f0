"""specs/nsa.attn against its hand-written module (tests/reference/nsa.py), forward and
forward+backward, one thread, interleaved rounds, the median of each.

    .venv/bin/python benchmarks/nsa.py --n 512 1024 --rounds 7

Two hand-written selections: `gather` reads each query's torch.topk blocks alone (as the
paper's kernel does), `mask` scatters them into an N×N mask for scaled_dot_product_attention;
the spec's selected branch is a dense N×N mask made from the ranks. All run the module's
weights (d_m 768, 12 heads of 64, blocks of 64, 2 selected, window 8), float32, checked to
agree first. Prints one JSON line per N: milliseconds and the ratios spec / hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import indexattn  # noqa: E402
from tests.reference.nsa import NativeSparseAttention  # noqa: E402


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def measure(n: int, rounds: int, hands: list[str]) -> dict:
    torch.manual_seed(0)
    module = NativeSparseAttention(768, 12, 64, block=64)
    params = {k.replace(".", "_"): p for k, p in module.named_parameters()}
    spec = indexattn.compile_spec(ROOT / "specs" / "nsa.attn")
    x = torch.randn(1, n, 768, requires_grad=True)
    masked = NativeSparseAttention(768, 12, 64, block=64, gather=False)
    masked.load_state_dict(module.state_dict())
    every = {"gather": lambda: module(x), "mask": lambda: masked(x)}
    calls = {"spec": lambda: spec(X=x, **params, h=12), **{h: every[h] for h in hands}}
    for hand in hands:
        error = (calls["spec"]() - calls[hand]()).abs().max().item()
        assert error < 1e-3, (hand, error)
    times = {f"{name} {mode}": [] for name in calls for mode in ("fwd", "fwd+bwd")}
    for _ in range(rounds):
        for name, call in calls.items():
            with torch.no_grad():
                times[f"{name} fwd"].append(timed(call))
            times[f"{name} fwd+bwd"].append(timed(lambda call=call: call().sum().backward()))
    out = {"N": n, **{k: round(statistics.median(v), 1) for k, v in times.items()}}
    for mode in ("fwd", "fwd+bwd"):
        for hand in hands:
            out[f"spec/{hand} {mode}"] = round(out[f"spec {mode}"] / out[f"{hand} {mode}"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--hands", nargs="+", default=["gather", "mask"], choices=["gather", "mask"]
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.n:
        print(json.dumps(measure(n, args.rounds, args.hands)), flush=True)


if __name__ == "__main__":
    main()
