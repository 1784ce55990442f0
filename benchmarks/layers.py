"""Whole decoder layers: the specs in specs/layers/ against transformers' own decoder layers.

    .venv/bin/python benchmarks/layers.py            # N = 512 and 2048, forward and f+b
    .venv/bin/python benchmarks/layers.py --quick    # N = 128, fewer rounds

The same layer twice, float32, eval: transformers' LlamaDecoderLayer / Gemma2DecoderLayer
(Llama with attn_implementation="sdpa", transformers' fastest on CPU; Gemma 2 with "eager",
the path its soft cap takes), its rotary tables made per call by the model's own rotary
module (the spec computes them inside), and specs/layers/<name>.attn holding its weights
(from_transformers). Both get the same additive causal mask [B, 1, N, N]. Sizes are a small
real model's: width 1024, 16 query heads on 4 key/value heads of 64, MLP width 2816.
Rounds are interleaved (each round times both, in a shuffled order, so a noisy neighbour
slows both alike); the result is the median over rounds of generated time / transformers
time. Prints one JSON line per case; one thread (steadier ratios on a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
         "num_key_value_heads": 4, "head_dim": 64}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="N = 128, 3 rounds")
    parser.add_argument(
        "--cases", default="llama,gemma2", help="llama, gemma2, llama_halves (comma-separated)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = (128,) if args.quick else (512, 2048)
    rounds = 3 if args.quick else args.rounds
    for name in args.cases.split(","):
        for n in lengths:
            for backward in (False, True):
                print(json.dumps(measure(name, n, backward, rounds)), flush=True)


def build(name: str):
    """The transformers layer with its rotary module, and the spec's module of its weights."""
    from transformers import Gemma2Config, LlamaConfig
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.llama import modeling_llama

    from indexattn.transformers import from_transformers

    if name.startswith("llama"):
        config = LlamaConfig(**SIZES, attn_implementation="sdpa")
        layer = modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
        rotary = modeling_llama.LlamaRotaryEmbedding(config)
    else:
        config = Gemma2Config(**SIZES, attn_implementation="eager")
        layer = modeling_gemma2.Gemma2DecoderLayer(config, layer_idx=1)
        rotary = modeling_gemma2.Gemma2RotaryEmbedding(config)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    spec = ROOT / "specs" / "layers" / f"{name}.attn"
    if name == "llama_halves":  # the head width as two halves on the values and output too
        spec = ROOT / "benchmarks" / "specs" / "llama_halves.attn"
    module = from_transformers(layer.eval(), spec, d_ff=config.intermediate_size)
    return layer, rotary, module


def measure(name: str, n: int, backward: bool, rounds: int) -> dict:
    torch.manual_seed(0)
    layer, rotary, module = build(name)
    x = torch.randn(1, n, SIZES["hidden_size"], requires_grad=backward)
    positions = torch.arange(n)[None]
    mask = torch.zeros(1, 1, n, n).masked_fill(
        torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf
    )

    def theirs():
        cos_sin = rotary(x, positions)
        return layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)

    def ours():
        return module(x, positions, mask[:, 0])

    runs = {"generated": ours, "transformers": theirs}
    with torch.no_grad():
        error = (ours() - theirs()).abs().max().item()
    if error > 1e-3:
        raise AssertionError(f"{name}: the two layers disagree by {error}")
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key in random.sample(list(runs), len(runs)):
            samples[key].append(timed(runs[key], backward))
    ratios = [g / t for g, t in zip(samples["generated"], samples["transformers"])]
    return {
        "case": name, "N": n, "mode": "forward+backward" if backward else "forward",
        "generated_ms": round(1e3 * statistics.median(samples["generated"]), 2),
        "transformers_ms": round(1e3 * statistics.median(samples["transformers"]), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "max_abs_error": error, "torch": torch.__version__,
    }  # fmt: skip


def timed(run, backward: bool) -> float:
    if backward:
        start = time.perf_counter()
        run().sum().backward()
        return time.perf_counter() - start
    with torch.no_grad():
        start = time.perf_counter()
        run()
        return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
