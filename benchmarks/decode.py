"""One decode step with a KV cache: generated code against transformers' SDPA path.

    .venv/bin/python benchmarks/decode.py            # Llama-ish: d_m 2048, 32/8 heads of 64
    .venv/bin/python benchmarks/decode.py --quick    # fewer rounds

The same layer twice: transformers' LlamaAttention (attn_implementation="sdpa") with a
DynamicCache prefilled with N_c tokens, and specs/models/llama3_decode.attn holding its weights
(from_transformers), fed the same cache. A step is one new token: its rotary angles (transformers'
LlamaRotaryEmbedding, which the spec computes inside), the projections, the cache grown by
torch.cat, attention over N_c + 1 keys, the output projection. After each step the cache is
cut back to N_c (a view, in the step), so every step sees the same lengths. Rounds are
interleaved (each round times both, in a shuffled order, so a noisy neighbour slows both
alike); the result is the median, over rounds, of generated time / transformers time, with
each one's median per-token latency. Prints one JSON line; benchmarks/run.py can call `measure()`.
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
SPEC = ROOT / "specs" / "models" / "llama3_decode.attn"
LLAMA = {"d_m": 2048, "heads": 32, "kv_heads": 8, "head_dim": 64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cached", type=int, default=2048, help="N_c, the tokens in the cache")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="8 rounds")
    args = parser.parse_args()
    print(json.dumps(measure(args.cached, 8 if args.quick else args.rounds)))


def measure(cached: int = 2048, rounds: int = 40, steps: int = 10) -> dict:
    """Median per-token latencies (ms) and their median ratio, over interleaved rounds of
    `steps` decode steps each."""
    torch.manual_seed(0)
    with torch.inference_mode():
        runs = build(cached)
        outputs = {name: run() for name, run in runs.items()}
        error = (outputs["generated"] - outputs["transformers"]).abs().max().item()
        if error > 1e-4:
            raise AssertionError(f"the two layers disagree by {error}")
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name in random.sample(list(runs), len(runs)):
                samples[name].append(timed(runs[name], steps))
    ratios = [g / t for g, t in zip(samples["generated"], samples["transformers"])]
    return {
        "case": "llama3_decode",
        **LLAMA,
        "cached": cached,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "transformers ms": round(statistics.median(samples["transformers"]) * 1e3, 3),
        "generated ms": round(statistics.median(samples["generated"]) * 1e3, 3),
        "ratio": round(statistics.median(ratios), 3),
        "rounds": rounds,
        "max abs difference": error,
    }


def timed(run, steps: int) -> float:
    """Seconds per step, over `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - start) / steps


def build(cached: int) -> dict:
    """The two layers' steps, each a function of no arguments returning the step's output."""
    from transformers import DynamicCache, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    sys.path.insert(0, str(ROOT))
    from indexattn.transformers import from_transformers

    config = LlamaConfig(
        hidden_size=LLAMA["d_m"],
        num_attention_heads=LLAMA["heads"],
        num_key_value_heads=LLAMA["kv_heads"],
        head_dim=LLAMA["head_dim"],
        attn_implementation="sdpa",
    )
    layer = LlamaAttention(config, layer_idx=0).eval()
    rotary = LlamaRotaryEmbedding(config)
    generated = from_transformers(layer, SPEC).eval()
    keys = torch.randn(1, LLAMA["kv_heads"], cached, LLAMA["head_dim"])
    values = torch.randn(1, LLAMA["kv_heads"], cached, LLAMA["head_dim"])
    cache = DynamicCache(config=config)
    cache.update(keys, values, 0)
    x = torch.randn(1, 1, LLAMA["d_m"])
    positions = torch.tensor([[cached]])
    mask = torch.zeros(1, cached + 1)  # the additive mask over the grown cache: all seen
    halves = keys.unflatten(-1, (2, -1))  # the spec's cached keys, features in halves (c j)

    def transformers_step() -> torch.Tensor:
        embeddings = rotary(x, positions)
        out, _ = layer(x, embeddings, None, past_key_values=cache, position_ids=positions)
        cache.crop(-1)  # back to N_c tokens
        return out

    def generated_step() -> torch.Tensor:
        out, _, _ = generated(x, positions, halves, values, mask)
        return out

    return {"transformers": transformers_step, "generated": generated_step}


if __name__ == "__main__":
    main()
