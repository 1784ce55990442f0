"""Soft-capped causal attention (softcap_window.attn) by blocks of queries, against the same
spec's code before blocking (the golden of main, passed as a path) and hand-written eager code
that folds 1/(√s·c) into Q and caps in place. One interleaved run; memory in fresh processes.

    .venv/bin/python benchmarks/blocked.py OLD_GOLDEN.py            # times and memory
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import indexattn

ROOT = Path(__file__).resolve().parent.parent
D_M, H, S, C = 768, 12, 256.0, 50.0
IMPLEMENTATIONS = ("blocked", "before", "hand")


def hand(x, wq, wk, wv, wo):
    b, n, _ = x.shape
    q, k, v = (
        torch.nn.functional.linear(x, w).view(b, n, H, -1).transpose(1, 2) for w in (wq, wk, wv)
    )
    scores = (q * (1 / (math.sqrt(S) * C))) @ k.transpose(-2, -1)
    scores = scores.tanh_().mul_(C) if not torch.is_grad_enabled() else torch.tanh(scores) * C
    causal = torch.ones(n, n, dtype=torch.bool).triu_(1)
    scores = (
        scores.masked_fill_(causal, -math.inf)
        if not torch.is_grad_enabled()
        else scores.masked_fill(causal, -math.inf)
    )
    out = torch.softmax(scores, -1) @ v
    return torch.nn.functional.linear(out.transpose(1, 2).flatten(2), wo)


def build(name: str, old: str):
    spec = indexattn.compile_spec(ROOT / "specs" / "softcap_window.attn")
    if name == "blocked":
        return lambda *a: spec.function(*a, h=H)
    if name == "before":
        namespace: dict = {}
        exec(compile(Path(old).read_text(), old, "exec"), namespace)
        return lambda *a: namespace["softcap_window"](*a, h=H)
    return hand


def inputs(n: int, grad: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, n, D_M, generator=g)
    ws = [torch.randn(D_M, D_M, generator=g) * 0.02 for _ in range(4)]
    return [t.requires_grad_(grad) for t in (x, *ws)]


def once(f, n: int, mode: str) -> None:
    args = inputs(n, mode == "fwd+bwd")
    if mode == "forward":
        with torch.inference_mode():
            f(*args)
    else:
        f(*args).sum().backward()


def peak(name: str, old: str, n: int, mode: str) -> dict:
    """Growth of resident memory (VmHWM) and the peak of live tensor bytes over one call."""
    from torch.profiler import ProfilerActivity, profile

    f = build(name, old)
    once(f, 64, mode)  # libraries loaded, threads started
    before = _hwm()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        once(f, n, mode)
    events = sorted(
        (e for e in p.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = top = 0
    for e in events:
        live += e.nbytes()
        top = max(top, live)
    return {"rss_mb": round(_hwm() - before), "live_mb": round(top / 2**20)}


def _hwm() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmHWM")


def main() -> None:
    if sys.argv[1] == "--probe":
        name, old, n, mode = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        return print(json.dumps(peak(name, old, n, mode)))
    old, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    for n in (512, 2048):
        for mode in ("forward", "fwd+bwd"):
            times = {name: [] for name in IMPLEMENTATIONS}
            calls = {name: build(name, old) for name in IMPLEMENTATIONS}
            for name in IMPLEMENTATIONS:
                once(calls[name], n, mode)  # warm
            for _ in range(rounds):
                for name in random.sample(IMPLEMENTATIONS, len(IMPLEMENTATIONS)):
                    start = time.perf_counter()
                    once(calls[name], n, mode)
                    times[name].append(time.perf_counter() - start)
            hand_ms = statistics.median(times["hand"])
            for name in IMPLEMENTATIONS:
                ms = statistics.median(times[name])
                memory = (
                    subprocess.run(
                        [sys.executable, __file__, "--probe", name, old, str(n), mode],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                print(
                    f"(1, {n}) {mode:8s} {name:8s} {ms * 1e3:8.0f} ms",
                    f"×hand {ms / hand_ms:.2f}  {memory}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
