"""The attention core against compiled FlexAttention on a CPU (docs/performance.md,
"FlexAttention backend"): [1, 4, N, 64], float32, one thread, forward, median of interleaved
rounds, for document + causal, causal + soft cap, and document + soft cap + per-head bias
(learnable ALiBi-like slopes b_<μ> (τ' - τ)); each spec run through backend="flex" and through
today's code (backend="auto": the blocked path, SDPA where it computes the core), against
hand-written compiled `flex_attention` with the same score_mod and mask_mod. Then
`spec.block_mask` against `create_block_mask` (compiled, as FlexAttention's docs advise) of
`spec.mask_mod` for the document + causal mask.

    .venv/bin/python benchmarks/flex.py                       # writes benchmarks/flex.json
    .venv/bin/python benchmarks/flex.py --lengths 1024 --masks 8192
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask

import indexattn
from indexattn.backends.flex import run

ROOT = Path(__file__).resolve().parent.parent
HEAD = """index τ, τ' : N
index μ : h
index a : d
input Q_<μτa>
input K_<μτ'a>
input V_<μτ'a>
"""
CASES = {
    "doc+causal": HEAD
    + """input D_<τ> : int
M_<ττ'> = where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d) + M_<ττ'>
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>
output O
""",
    "causal+cap": HEAD
    + """scalar c = 20
M_<ττ'> = where(τ' > τ, -inf, 0)
S_<μττ'> = c tanh(Q_<μτa> K_<μτ'a> / (sqrt(d) c)) + M_<ττ'>
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>
output O
""",
    "doc+cap+bias": HEAD
    + """input D_<τ> : int
param b_<μ>
scalar c = 20
M_<ττ'> = where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)
S_<μττ'> = c tanh(Q_<μτa> K_<μτ'a> / (sqrt(d) c)) + b_<μ> (τ' - τ) + M_<ττ'>
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>
output O
""",
}
C = 20.0


def hand_mods(case: str, d: torch.Tensor, b: torch.Tensor):
    """The score_mod and mask_mod an engineer writes for the case."""

    def doc(bb, h, q, k):
        return (k <= q) & (d[q] == d[k])

    def causal(bb, h, q, k):
        return k <= q

    def cap(score, bb, h, q, k):
        return C * torch.tanh(score / C)

    def cap_bias(score, bb, h, q, k):
        return C * torch.tanh(score / C) + b[h] * (k - q)

    return {
        "doc+causal": (None, doc),
        "causal+cap": (cap, causal),
        "doc+cap+bias": (cap_bias, doc),
    }[case]


def inputs(n: int, seed: int = 0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, n, 64, generator=g).to(device, dtype) for _ in range(3))
    d = torch.randint(0, 8, (n,), generator=g).sort().values.to(device)
    b = (torch.rand(4, generator=g) * 0.01).to(device, dtype)
    return q, k, v, d, b


def core_functions(case: str, n: int, compiled_flex, device="cpu", dtype=torch.float32):
    q, k, v, d, b = inputs(n, 0, device, dtype)
    text = CASES[case]
    flex = indexattn.compile_spec(text, name=case.replace("+", "_"), backend="flex")
    auto = indexattn.compile_spec(text, name=case.replace("+", "_"))
    given = {"Q": q[0], "K": k[0], "V": v[0]}
    given |= {"D": d} if "D" in flex.arguments else {}
    given |= {"b": b} if "b" in flex.arguments else {}
    score, mask = hand_mods(case, d, b)
    block = create_block_mask(mask, None, None, n, n, device=device)

    def hand():
        return compiled_flex(q, k, v, score_mod=score, block_mask=block)

    def generated_flex():
        return flex(**given)

    def blocks():
        return auto(**given)

    return {"flex (hand-written)": hand, 'backend="flex"': generated_flex, "auto": blocks}


def median_rounds(functions: dict, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in functions}
    with torch.no_grad():
        for function in functions.values():  # compile and warm up
            function()
            function()
        for _ in range(rounds):
            for name, function in functions.items():
                start = time.process_time()
                function()
                times[name].append(time.process_time() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def check(functions: dict) -> float:
    with torch.no_grad():
        outs = [f() for f in functions.values()]
    want = outs[0][0]
    return max(float((o - want).abs().max()) for o in outs[1:])


def mask_times(n: int, rounds: int) -> dict:
    spec = indexattn.compile_spec(CASES["doc+causal"], name="doc_causal")
    _, _, _, d, _ = inputs(n)
    mine = lambda: spec.block_mask(D=d, N=n)  # noqa: E731
    mod = spec.mask_mod(D=d)
    theirs = lambda: create_block_mask(mod, None, None, n, n, device="cpu", _compile=True)  # noqa: E731
    mine(), theirs()
    found = median_rounds({"block_mask": mine, "create_block_mask": theirs}, rounds)
    same = _same(mine(), theirs())
    return {
        "N": n,
        **found,
        "ratio": found["create_block_mask"] / found["block_mask"],
        "equal": same,
        "load": _load(),
    }


def _load() -> list[float]:
    """The machine's load average (1, 5, 15 minutes) at a row's end."""
    return [round(x, 1) for x in os.getloadavg()]


def _same(a, b) -> bool:
    def rows(m):
        out = []
        for counts, idx in (
            (m.kv_num_blocks, m.kv_indices),
            (m.full_kv_num_blocks, m.full_kv_indices),
        ):
            out.append(
                [sorted(r[:c].tolist()) for r, c in zip(idx.flatten(0, -2), counts.flatten())]
            )
        return out

    return rows(a) == rows(b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--masks", default="8192,32768,131072")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "flex.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    compiled_flex = run._compiled(True)  # a kernel per shape (recompiles: 8 is too few)
    result = {
        "machine": f"{platform.machine()} CPU, one thread, torch {torch.__version__}",
        "clock": "CPU time of the process (time.process_time), not wall: the machine is shared",
        "cores": [],
        "masks": [],
    }
    for n in map(int, filter(None, args.lengths.split(","))):
        for case in args.cases.split(","):
            functions = core_functions(case, n, compiled_flex)
            try:
                times = median_rounds(functions, args.rounds)
            except Exception as error:  # inductor's CPU flex kernel fails to build at some shapes
                row = {"case": case, "N": n, "error": f"{type(error).__name__}: {str(error)[:200]}"}
                result["cores"].append(row)
                print(json.dumps(row), flush=True)
                continue
            hand = times["flex (hand-written)"]
            row = {"case": case, "N": n, "ms": times, "error": check(functions), "load": _load()}
            row["ratio"] = {name: t / hand for name, t in times.items()}
            result["cores"].append(row)
            print(json.dumps(row), flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for n in map(int, filter(None, args.masks.split(","))):
        row = mask_times(n, max(1, args.rounds // 2))
        result["masks"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
