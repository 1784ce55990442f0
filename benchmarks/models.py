"""Whole transformers models through attn_implementation="indexattn", against "sdpa" and "eager".

    .venv/bin/python benchmarks/models.py            # Llama: hidden 512, 8 heads on 2, 4 layers
    .venv/bin/python benchmarks/models.py --quick    # fewer rounds

One tiny-config Llama with random weights (nothing downloaded), float32, eval, one thread; the
same model switched between implementations (set_attn_implementation), so everything but the
attention core is the same code. Three measurements: a forward at sequence N (no cache), and
greedy generate() of NEW tokens with the cache on from a prompt of P tokens (where the Python
around each decode step's call counts most) and from one of N tokens. Token ids are drawn
above 0, generate()'s pad id, so that no prompt token is read as padding. Rounds
are interleaved (each round times every implementation, in a shuffled order, so a noisy
neighbour slows them alike); the result is the median over rounds of each implementation's time
over sdpa's in the same round, and each one's median time. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time

import torch

LLAMA = {
    "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
}  # fmt: skip
IMPLEMENTATIONS = ("sdpa", "indexattn", "eager")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="the forward's sequence length")
    parser.add_argument("--prompt", type=int, default=128, help="generate()'s prompt length")
    parser.add_argument("--new", type=int, default=32, help="generate()'s new tokens")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds
    print(json.dumps(measure(args.n, args.prompt, args.new, rounds)))


def model():
    """The Llama, float32, eval, random weights (a fixed seed)."""
    import transformers

    import indexattn.transformers  # noqa: F401  (registers "indexattn")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA, attn_implementation="sdpa")
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def measure(n: int, prompt: int, new: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    llama = model()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, LLAMA["vocab_size"], (1, n), generator=gen)  # 0 pads

    def forward():
        with torch.no_grad():
            llama(input_ids=ids, use_cache=False)

    def generate(start: torch.Tensor):
        with torch.no_grad():
            llama.generate(
                start, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
            )

    def generated(length: int) -> dict:
        work = functools.partial(generate, ids[:, :length])
        return interleaved(llama, work, rounds) | {"prompt": length, "new": new}

    return {
        "forward": interleaved(llama, forward, rounds) | {"N": n},
        "generate": generated(prompt),
        "generate_long": generated(n),
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        "rounds": rounds,
    }


def interleaved(llama, work, rounds: int) -> dict:
    """Each round times `work` once under every implementation, in a shuffled order; the
    median over rounds of each one's time over sdpa's, and each one's median seconds."""
    seconds = {name: [] for name in IMPLEMENTATIONS}
    cpu = {name: [] for name in IMPLEMENTATIONS}
    for name in IMPLEMENTATIONS:  # warm-up: compile caches, first allocations
        llama.set_attn_implementation(name)
        work()
    for _ in range(rounds):
        order = list(IMPLEMENTATIONS)
        random.shuffle(order)
        for name in order:
            llama.set_attn_implementation(name)
            begin, begin_cpu = time.perf_counter(), time.thread_time()
            work()
            seconds[name].append(time.perf_counter() - begin)
            cpu[name].append(time.thread_time() - begin_cpu)
    return {**ratios(seconds, ""), **ratios(cpu, "cpu_")}


def ratios(seconds: dict, prefix: str) -> dict:
    """Each implementation's median seconds, and the median of its time over sdpa's in the
    same round. `cpu_`: the thread's CPU time, which leaves out the waits for a core that
    dominate wall time on a loaded machine."""
    base = seconds["sdpa"]
    return {
        **{f"{name}_{prefix}s": statistics.median(seconds[name]) for name in IMPLEMENTATIONS},
        **{
            f"{name}_over_sdpa_{prefix}time": statistics.median(
                t / b for t, b in zip(seconds[name], base)
            )
            for name in IMPLEMENTATIONS
            if name != "sdpa"
        },
    }


if __name__ == "__main__":
    main()
