"""The cookbook's variants of 2025 against their hand-written modules, forward and
forward+backward, one thread, interleaved rounds, the median of each.

    .venv/bin/python benchmarks/variants_2025.py nsa --n 512 1024 --rounds 5 --hands mask
    .venv/bin/python benchmarks/variants_2025.py ssd --n 512 1024 --rounds 5
    .venv/bin/python benchmarks/variants_2025.py nsa_selected --n 512 1024 --rounds 5
    .venv/bin/python benchmarks/variants_2025.py selective --n 512 1024 --rounds 5

nsa: specs/nsa.attn against tests/reference/nsa.py (d_m 768, 12 heads of 64, blocks of 64,
2 selected, window 8). Two hand-written selections: `gather` reads each query's torch.topk
blocks alone (as the paper's kernel does), `mask` scatters them into an N×N mask for
scaled_dot_product_attention; the spec's selected branch is a dense boolean mask made by torch.topk.
nsa_selected: that branch alone (specs/nsa.attn's Kc, Sc, Ms, Ss, Os over given Q, K, V, φ),
against the module's `selected_blocks` (gather) and `selected_by_mask` (mask) on the same
compressed scores; peak memory too.
selective: specs/selective.attn against tests/reference/selective.py (the paper's pseudo-code;
12 heads of 64, head 0 selecting).
ssd: specs/ssd.attn against ssd_minimal's quadratic einsum (tests/reference/ssd.py; 12 heads
of 64, a state of 128). Float32, batch 1, checked to agree first. Prints one JSON line per
N: milliseconds and the ratios spec / hand.
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
from benchmarks.mta import peak_mb  # noqa: E402
from tests.reference.nsa import NativeSparseAttention  # noqa: E402
from tests.reference.selective import SelectiveAttention  # noqa: E402
from tests.reference.ssd import SSD  # noqa: E402


def nsa_calls(n: int, hands: list[str], device: str) -> dict:
    module = NativeSparseAttention(768, 12, 64, block=64).to(device)
    masked = NativeSparseAttention(768, 12, 64, block=64, gather=False).to(device)
    masked.load_state_dict(module.state_dict())
    params = {k.replace(".", "_"): p for k, p in module.named_parameters()}
    spec = indexattn.compile_spec(ROOT / "specs" / "nsa.attn")
    x = torch.randn(1, n, 768, device=device, requires_grad=True)
    every = {"gather": lambda: module(x), "mask": lambda: masked(x)}
    return {"spec": lambda: spec(X=x, **params, h=12), **{h: every[h] for h in hands}}


SELECTED = """
index τ, τ' : N
index β     : N / ℓ
index λ     : ℓ
index μ     : h
index a     : d_k
input  Q_<μτa>
input  K_<μτ'a>
input  V_<μτ'a>
param  φ_<λ>
scalar n = 2
Kc_<μβa>  = φ_<λ> K_<μ[β ℓ + λ]a>
Mc_<τβ>   = where((β + 1) ℓ > τ + 1, -inf, 0)
Sc_<μτβ>  = Q_<μτa> Kc_<μβa> / sqrt(d_k) + Mc_<τβ>
Ms_<μτβ>  = where(rank_<β>(Sc_<μτβ>) < n or β == floor(τ / ℓ), 0, -inf)
M_<ττ'>   = where(τ' > τ, -inf, 0)
Ss_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + Ms_<μτ[floor(τ' / ℓ)]> + M_<ττ'>
Os_<μτa>  = softmax_<τ'>(Ss_<μττ'>) V_<μτ'a>
output Os
"""


def nsa_selected_calls(n: int, hands: list[str], device: str) -> dict:
    """NSA's selected branch alone, given the heads' queries, keys and values."""
    module = NativeSparseAttention(768, 12, 64, block=64).to(device)
    spec = indexattn.compile_spec(SELECTED, name="nsa_selected")
    q, k, v = (torch.randn(1, 12, n, 64, device=device, requires_grad=True) for _ in "qkv")

    def hand(select):
        return lambda: select(module.compressed(q, k, v)[0], q, k, v)

    every = {"gather": hand(module.selected_blocks), "mask": hand(module.selected_by_mask)}
    spec_call = lambda: spec(Q=q, K=k, V=v, φ=module.phi, ℓ=64)  # noqa: E731
    return {"spec": spec_call, **{h: every[h] for h in hands}}


def ssd_calls(n: int, hands: list[str], device: str) -> dict:
    spec = indexattn.compile_spec(ROOT / "specs" / "ssd.attn")
    x, b, c = (torch.randn(1, 12, n, k, device=device).requires_grad_() for k in (64, 128, 128))
    a = (-torch.rand(1, 12, n, device=device) * 0.1).requires_grad_()  # dt · A ≤ 0
    return {"spec": lambda: spec(X=x, a=a, B=b, C=c), "einsum": lambda: SSD()(x, a, b, c)}


def selective_calls(n: int, hands: list[str], device: str) -> dict:
    spec = indexattn.compile_spec(ROOT / "specs" / "selective.attn")
    q, k, v = (torch.randn(1, 12, n, 64, device=device, requires_grad=True) for _ in "qkv")
    return {"spec": lambda: spec(Q=q, K=k, V=v), "hand": lambda: SelectiveAttention()(q, k, v)}


CASES = {
    "nsa": (nsa_calls, ["gather", "mask"]),
    "nsa_selected": (nsa_selected_calls, ["gather", "mask"]),
    "ssd": (ssd_calls, ["einsum"]),
    "selective": (selective_calls, ["hand"]),
}


def timed(call) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    call()
    sync()
    return (time.perf_counter() - start) * 1e3


def peaks(calls: dict) -> dict:
    """Each call's peak of tensors alive at once (benchmarks/mta.py's PeakTensors), MB."""
    out = {}
    for name, call in calls.items():
        with torch.no_grad():
            out[f"{name} fwd MB"] = round(peak_mb(call), 1)
        out[f"{name} fwd+bwd MB"] = round(peak_mb(lambda call=call: call().sum().backward()), 1)
    return out


def measure(calls: dict, n: int, rounds: int) -> dict:
    hands = [name for name in calls if name != "spec"]
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
    out |= peaks(calls)
    for mode in ("fwd", "fwd+bwd"):
        for hand in hands:
            out[f"spec/{hand} {mode}"] = round(out[f"spec {mode}"] / out[f"{hand} {mode}"], 2)
            memory = out[f"spec {mode} MB"] / out[f"{hand} {mode} MB"]
            out[f"spec/{hand} {mode} MB"] = round(memory, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hands", nargs="+", help="nsa: gather, mask (default both)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    make, hands = CASES[args.case]
    for n in args.n:
        torch.manual_seed(0)
        calls = make(n, args.hands or hands, args.device)
        print(json.dumps(measure(calls, n, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
