"""Generated code against independent baselines (benchmarks/baselines/), in interleaved rounds.

    .venv/bin/python benchmarks/independent.py            # N = 512 and 2048, about 15 minutes
    .venv/bin/python benchmarks/independent.py --quick    # N = 128, one round: a smoke run

benchmarks/run.py compares each spec with the fast forward of its own reference module;
these baselines are written from the paper's or the library's algorithm instead, the way a
skilled engineer would write the computation if indexattn did not exist (chunked causal
linear attention, chunkwise retention, a fused q/k/v weight in either layout). Each case
builds the spec's module, hands its parameters to the baseline, checks that both compute the
same, then times the generated module, the baseline eager and the baseline under
torch.compile, forward (inference mode) and forward+backward, at width 768, 12 heads of 64,
batch 1, one thread (steadier ratios on a loaded machine). "× best": the generated time over
the faster baseline's, the median of the ratios within interleaved rounds, with their range.
Prints one JSON line per case, shape and mode; `--markdown` prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from baselines import chunked_linear, fused_qkv, retention  # noqa: E402
from run import interleaved  # noqa: E402

import indexattn  # noqa: E402

SIZES = {"d_m": 768, "h": 12, "d_k": 64}
CASES = {  # name: (spec file, {baseline name: function(x, params, h)})
    "linear_attention_causal": (
        ROOT / "specs" / "linear_attention_causal.attn",
        {"chunked": chunked_linear.forward},
    ),
    "retention": (ROOT / "specs" / "retention.attn", {"chunkwise": retention.forward}),
    "mha (head-major weight)": (
        ROOT / "specs" / "mha.attn",
        {"head_major": fused_qkv.head_major},
    ),
    "mha_one_equation (the whole of mha in one equation)": (
        HERE / "specs" / "mha_one_equation.attn",
        {"head_major": fused_qkv.head_major},
    ),
    "mha_qkv_major (q/k/v-major weight)": (
        HERE / "specs" / "mha_qkv_major.attn",
        {"qkv_major": fused_qkv.qkv_major},
    ),
}
MODES = ("forward", "forward+backward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 128, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = (128,) if args.quick else (512, 2048)
    names = args.cases.split(",") if args.cases else list(CASES)
    for name in names:
        for n in lengths:
            built = build(name, n, compiled=not args.quick)
            for mode in MODES:
                samples = interleaved(built, mode, 1 if args.quick else args.rounds)
                print(json.dumps({"case": name, "N": n, "mode": mode, **summary(samples)}))


def build(name: str, n: int, compiled: bool) -> dict:
    """name -> (call, inputs, params), as benchmarks/run.py's `interleaved` takes them."""
    path, baselines = CASES[name]
    torch.manual_seed(0)
    module = indexattn.compile_spec(path).module(**SIZES).eval()
    params = dict(module.named_parameters())
    x = torch.randn(1, n, SIZES["d_m"])
    built = {"generated": (module, [x], list(params.values()))}
    for key, fn in baselines.items():
        call = lambda x, fn=fn: fn(x, params, SIZES["h"])  # noqa: E731
        built[key] = (call, [x], list(params.values()))
        if compiled:
            built[key + " compiled"] = (torch.compile(call), [x], list(params.values()))
    with torch.no_grad():
        want = module(x)
        for key, (call, inputs, _) in built.items():
            torch.testing.assert_close(call(*inputs), want, atol=1e-4, rtol=1e-3, msg=key)
    return built


def summary(samples: dict[str, list[float]]) -> dict:
    ms = {k: statistics.median(s) for k, s in samples.items()}
    best = min((k for k in ms if k != "generated"), key=ms.get)
    ratios = [g / b for g, b in zip(samples["generated"], samples[best])]
    return {
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "best_baseline": best,
        "ratio": round(statistics.median(ratios), 3),
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


if __name__ == "__main__":
    main()
