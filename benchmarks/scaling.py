"""Time and peak memory against N of shipped specs and hand-written baselines that run by
blocks of 256 queries, each block's mask or bias made from its positions (float32, d_m 512,
8 heads of 64, window 1024, batch 1, one thread). Every figure comes from a fresh process:
peak resident growth over the first call at N (after a call at N = 16 for the lazy imports;
the spec's per-shape constants are built in it), and the median time of the calls after.
Writes the table between the markers of docs/performance.md ("Scaling").

    .venv/bin/python benchmarks/scaling.py --n 512 2048 8192 [--train] [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from spec_memory import growth, inputs  # noqa: E402

SPECS = ("mha", "sliding_window", "softcap_window", "alibi", "t5_bias")
SIZES = {"d_in": 512, "d_out": 512, "d_m": 512, "d_k": 64, "h": 8, "w": 1024, "c": 50.0}
BLOCK, H, D, W = 256, 8, 64, 1024
PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- scaling: benchmarks/scaling.py -->", "<!-- end scaling -->"


def bucket(distance):
    """T5's bidirectional bucket of key minus query (32 buckets, max distance 128)."""
    import torch

    rho = distance.abs()
    big = 8 + (torch.log(rho.clamp(min=1) / 8) / math.log(16) * 8).long().clamp(max=7)
    return torch.where(distance > 0, 16, 0) + torch.where(rho < 8, rho, big)


def baseline(name: str, x, weights, table):
    """The spec's forward by hand, 256 queries a block, over the keys the block sees."""
    import torch
    import torch.nn.functional as F

    n = x.shape[-2]
    q, k, v = (F.linear(x, w).unflatten(-1, (H, D)).transpose(-3, -2) for w in weights[:3])
    pos, blocks, windowed = torch.arange(n), [], name.endswith("window")
    for t in range(0, n, BLOCK):
        u = min(t + BLOCK, n)
        k0 = max(0, t - W + 1) if windowed else 0
        k1 = n if name == "t5_bias" else u  # causal but T5's encoder
        d = pos[None, k0:k1] - pos[t:u, None]
        keep = (d <= 0) & (d > -W) if windowed else d <= 0
        mask = torch.zeros(d.shape).masked_fill(~keep, -math.inf)
        qb, kb, vb = q[..., t:u, :], k[..., k0:k1, :], v[..., k0:k1, :]
        if name == "softcap_window":
            s = torch.tanh(qb @ kb.mT / (math.sqrt(D) * 50.0)) * 50.0 + mask
            blocks.append(torch.softmax(s, -1) @ vb)
            continue
        if name == "alibi":
            mask = mask + table[:, None, None] * d
        if name == "t5_bias":
            mask = table[bucket(d)].permute(2, 0, 1)
        scale = 1.0 if name == "t5_bias" else None
        blocks.append(F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale))
    return F.linear(torch.cat(blocks, -2).transpose(-3, -2).flatten(-2), weights[3])


def probe(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    import torch

    import indexattn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = indexattn.compile_spec(name)
    known = {*spec.size_names, *(s.ascii for s in spec.ir.scalars)}
    layer = spec.module(**{k: v for k, v in SIZES.items() if k in known}).eval()  # no dropout
    weights = [torch.randn(512, 512) / 23 for _ in range(4)]
    table = 2.0 ** (-torch.arange(1, H + 1.0)) if name == "alibi" else torch.randn(32, H)

    def run(x):
        y = baseline(name, x["X"], weights, table) if hand else layer(**x)
        if train:
            y.square().mean().backward()

    for w in weights:
        w.requires_grad_(train)
    with torch.set_grad_enabled(train):
        run(inputs(spec, 16, SIZES))
        x = inputs(spec, n, SIZES)
        peak = growth(lambda: run(x))  # the first call: the per-shape constants too
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            run(x)
            seconds.append(time.perf_counter() - start)
    return {"MB": peak, "s": round(statistics.median(seconds), 3)}


def measure(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    what = "train" if train else "forward"
    flags = [name, str(n), "hand" if hand else "spec", what, str(rounds)]
    done = subprocess.run(
        [sys.executable, __file__, "--probe", *flags],
        stdout=subprocess.PIPE,
        check=True,
        env=env,
        text=True,
    )
    return json.loads(done.stdout)


def table_text(rows: list[dict], train: bool) -> str:
    what = "training step" if train else "forward"
    lines = [
        f"| spec ({what}) | N | spec MB | blocked MB | spec s | blocked s | time ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = r["spec"]["s"] / r["hand"]["s"]
        lines.append(
            f"| {r['name']} | {r['n']} | {r['spec']['MB']:.0f} | {r['hand']['MB']:.0f} "
            f"| {r['spec']['s']:.2f} | {r['hand']['s']:.2f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="*", default=[512, 2048, 8192])
    parser.add_argument("--specs", nargs="*", default=list(SPECS))
    parser.add_argument("--train", action="store_true", help="a training step, not a forward")
    parser.add_argument("--write", action="store_true", help="into docs/performance.md")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls after the first")
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        name, n, who, what, rounds = args.probe
        print(json.dumps(probe(name, int(n), who == "hand", what == "train", int(rounds))))
        return
    rows = []
    for name in args.specs:
        for n in args.n:
            got = {
                w: measure(name, n, w == "hand", args.train, args.rounds) for w in ("spec", "hand")
            }
            rows.append({"name": name, "n": n, **got})
            print(json.dumps(rows[-1]), flush=True)
    text = table_text(rows, args.train)
    print(text)
    if args.write:
        page = PAGE.read_text(encoding="utf-8")
        head, rest = page.split(BEGIN)
        _, tail = rest.split(END)
        PAGE.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
