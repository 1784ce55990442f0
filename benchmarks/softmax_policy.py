"""The safe softmax (rows -inf everywhere give zeros) with and without a branch on the scores'
values: today's branchy policy (the plain softmax, then one boolean read back to decide whether
the safe one must run) against kernels that need no branch, forward without gradients (the
weights over the scores, as the generated code does there) and forward+backward. One
interleaved run, one thread, float32, no row dead (the case the branch is fast for).

    .venv/bin/python benchmarks/softmax_policy.py [--rounds 15] [--sizes 512 2048]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

HEADS = 12


def branchy_inference(s: torch.Tensor) -> torch.Tensor:
    """The generated code's no-gradient path before: ask first, then overwrite the scores."""
    if s.amax(-1).isneginf().any():
        return torch.ops.aten._safe_softmax.default(s, -1)
    return torch.softmax(s, dim=-1, out=s)


def branchy(s: torch.Tensor) -> torch.Tensor:
    """The generated code's path with gradients before: the plain softmax, then one weight per
    row read back (a dead row is NaN throughout)."""
    a = torch.softmax(s, dim=-1)
    if a.select(-1, 0).isnan().any():
        a = torch.ops.aten._safe_softmax.default(s, -1)
    return a


def safe_op(s: torch.Tensor) -> torch.Tensor:
    """aten's own safe softmax, always."""
    return torch.ops.aten._safe_softmax.default(s, -1)


def shifted_inference(s: torch.Tensor) -> torch.Tensor:
    """Branch-free, in place: a dead row's maximum taken as 0, so exp gives 0 there, and its
    sum (0) divided as 1. A live row's sum is at least 1 (its maximum's exp)."""
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill_(m == -torch.inf, 0.0)
    e = s.sub_(m).exp_()
    total = e.sum(-1, keepdim=True)
    return e.div_(total.masked_fill_(total == 0, 1.0))


def shifted(s: torch.Tensor) -> torch.Tensor:
    """The same, out of place, for autograd."""
    m = s.detach().amax(-1, keepdim=True)
    e = torch.exp(s - m.masked_fill_(m == -torch.inf, 0.0))
    total = e.sum(-1, keepdim=True)
    return e / total.masked_fill(total == 0, 1.0)


INFERENCE = {"branchy": branchy_inference, "safe_op": safe_op, "shifted": shifted_inference}
TRAINING = {"branchy": branchy, "safe_op": safe_op, "shifted": shifted}


def sample(fn, n: int, grad: bool, repeat: int) -> float:
    """Milliseconds per call, fresh scores each call (the in-place paths write over them)."""
    total = 0.0
    for _ in range(repeat):
        s = torch.randn(1, HEADS, n, n).tril_().requires_grad_(grad)  # zeros, no row dead
        start = time.perf_counter()
        with torch.set_grad_enabled(grad):
            a = fn(s)
            if grad:
                a.backward(torch.ones_like(a))
        total += time.perf_counter() - start
    return total / repeat * 1e3


def run(n: int, grad: bool, rounds: int) -> dict:
    fns = TRAINING if grad else INFERENCE
    repeat = 20 if n <= 512 else 2
    shuffle = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        sample(fn, n, grad, 1)  # warm-up
    for _ in range(rounds):
        names = list(fns)
        shuffle.shuffle(names)
        for name in names:
            times[name].append(sample(fns[name], n, grad, repeat))
    out = {}
    for name, samples in times.items():
        ratios = [a / b for a, b in zip(samples, times["branchy"])]
        out[name] = {
            "ms": round(statistics.median(samples), 3),
            "x_branchy": round(statistics.median(ratios), 3),
            "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 2048])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.sizes:
        for grad in (False, True):
            mode = "forward+backward" if grad else "forward, no gradients"
            print(json.dumps({"N": n, "mode": mode, **run(n, grad, args.rounds)}), flush=True)


if __name__ == "__main__":
    main()
