"""The backward in low precision, a larger run of tests/oracle/test_gradient_precision.py: random
specs (ties, dead rows, overflowing hidden branches among the draws) and every shipped spec,
in bfloat16 and float16, each backward's gradient error against float64's; prints the
tables of docs/precision.md's "The backward in low precision".

    .venv/bin/python benchmarks/gradient_precision.py --examples 200

Error: max |low - f64| / (1 + max |f64|), the largest over a spec's gradients (_error of
indexattn/oracle/verify.py), on inputs exact in both precisions, at the sizes sample_sizes
draws (widths 2 to 9), batch 2, the largest over three draws of the inputs; the loss
Σ output · ramp.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "oracle")]
import indexattn  # noqa: E402
from indexattn.errors import SpecError  # noqa: E402
from tests.oracle.test_gradient_precision import LOW, specs, within, worst  # noqa: E402

NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--specs", default="all", help="comma-separated shipped specs, or all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    drawn = fuzz(args.examples)
    paths = sorted((ROOT / "specs").glob("*.attn"))
    chosen = [p for p in paths if args.specs == "all" or p.stem in args.specs.split(",")]
    shipped = {p.stem: measured(indexattn.compile_spec(p), 0, False) for p in chosen}
    seconds = time.perf_counter() - start
    print(f"{len(drawn)} random specs and {len(shipped)} shipped, {seconds:.0f} s, one thread.\n")
    print(fuzz_table(drawn))
    print(shipped_table(shipped))


def measured(spec, seed: int, tied: bool) -> dict | None:
    """The worst errors of three draws (the test's `worst`); None where the derived backward
    is refused."""
    try:
        return worst(spec, seed, tied)
    except SpecError:
        return None


def fuzz(examples: int) -> list[dict]:
    """Each random spec's draws and errors."""
    found: list[dict] = []

    every = list(HealthCheck)

    @settings(
        deadline=None,
        max_examples=examples,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=every,
    )
    @given(specs(), st.integers(0, 1))
    def record(drawn, seed):
        text, tied = drawn
        spec = indexattn.compile_spec(text, name="fuzz")
        features = {
            "tied": tied,
            "dead": ">= τ, -inf" in text,
            "overflowing": "exp((L_" in text,
        }
        found.append({**features, "errors": measured(spec, seed, tied)})

    record()
    return [f for f in found if f["errors"] is not None]


def fuzz_table(drawn: list[dict]) -> str:
    rows = [
        "| precision | specs | tied / dead row / overflowing | derived ÷ autograd, median "
        "(max) | within 2× | autograd not finite | derived not finite, autograd finite |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    features = "/".join(str(sum(d[f] for d in drawn)) for f in ("tied", "dead", "overflowing"))
    for dtype in LOW:
        pairs = [d["errors"][dtype] for d in drawn]
        ratios = [p["derived"] / p["autograd"] for p in pairs if 0 < p["autograd"] < math.inf]
        bad = sum(math.isinf(p["derived"]) and p["autograd"] < math.inf for p in pairs)
        rows.append(
            f"| {NAMES[dtype]} | {len(pairs)} | {features} | "
            f"{statistics.median(ratios):.2f} ({max(ratios):.2f}) | "
            f"{sum(within(p, dtype) for p in pairs)} | "
            f"{sum(math.isinf(p['autograd']) for p in pairs)} | {bad} |"
        )
    return "\n".join(rows) + "\n"


def shipped_table(shipped: dict[str, dict | None]) -> str:
    rows = [
        "| spec | bf16 autograd | bf16 derived | f16 autograd | f16 derived |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, found in shipped.items():
        cells = (
            ["refused", "refused"] * 2
            if found is None
            else [f"{found[dtype][mode]:.4f}" for dtype in LOW for mode in ("autograd", "derived")]
        )
        rows.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
