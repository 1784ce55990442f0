"""The two unseen combinations of issue 48 against hand-written blocked baselines: memory and
time of the forward (and a training step) at N = 4096 to 32768, as benchmarks/scaling.py
measures the shipped specs (float32, d_m 512, 8 heads of 64 (GQA: 2 key/value heads of 4
queries), window 1024, batch 1, one thread, peak resident growth of a fresh process over the
first call at N, median time of `--rounds` calls after it).

- benchmarks/specs/rope_softcap_doc.attn: rotary written with (c j) halves, a soft cap,
  a document-id mask (four documents), against baselines/unseen.py's rope_softcap_doc;
- benchmarks/specs/gqa_alibi_window_sinks.attn: GQA, ALiBi slopes, a window of 1024 and
  sinks through logsumexp, against gqa_alibi_window_sinks.

Each measurement is kept in benchmarks/unseen.json (the newest per spec, N, side and mode).

    .venv/bin/python benchmarks/unseen.py --n 4096 8192 16384 32768 [--train] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from scaling import spawn, timed  # noqa: E402
from spec_memory import inputs  # noqa: E402

SPECS = ("rope_softcap_doc", "gqa_alibi_window_sinks")
SIZES = {
    "rope_softcap_doc": {"d_m": 512, "h": 8, "d_r": 32},
    "gqa_alibi_window_sinks": {"d_m": 512, "h_kv": 2, "n_rep": 4, "d_k": 64, "w": 1024},
}
RESULTS = ROOT / "benchmarks" / "unseen.json"


def probe(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    import torch
    from baselines import unseen

    import indexattn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = indexattn.compile_spec(ROOT / "benchmarks" / "specs" / f"{name}.attn")
    layer = spec.module(**SIZES[name]).eval()
    sizes = {**{s.ascii: float(s.value) for s in spec.ir.scalars}, **SIZES[name]}
    params = dict(layer.named_parameters())
    forward = getattr(unseen, name)

    def run(x):
        y = forward(*x.values(), params, sizes) if hand else layer(**x)
        if train:
            y.square().mean().backward()

    make = lambda n: inputs(spec, n, SIZES[name])  # noqa: E731
    return timed(run, make, n, train, rounds, params.values(), time.process_time)


def measure(name: str, n: int, hand: bool, train: bool, rounds: int) -> dict:
    return spawn(__file__, name, n, hand, train, rounds) | {
        "device": "cpu, one thread",
        "clock": "CPU time of the process (time.process_time): the machine is shared",
    }


def keep(record: dict) -> None:
    key = ("name", "n", "who", "mode")
    old = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else []
    old = [r for r in old if any(r[k] != record[k] for k in key)]
    RESULTS.write_text(json.dumps([*old, record], indent=1) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="*", default=[4096])
    parser.add_argument("--specs", nargs="*", default=list(SPECS))
    parser.add_argument("--train", action="store_true", help="a training step, not a forward")
    parser.add_argument("--rounds", type=int, default=1, help="timed calls after the first")
    parser.add_argument("--who", choices=("spec", "hand"), nargs="*", default=["spec", "hand"])
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        name, n, who, mode, rounds = args.probe
        print(json.dumps(probe(name, int(n), who == "hand", mode == "train", int(rounds))))
        return
    for n in args.n:
        for name in args.specs:
            for who in args.who:
                record = measure(name, n, who == "hand", args.train, args.rounds)
                keep(record)
                print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
