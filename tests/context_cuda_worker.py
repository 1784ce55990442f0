"""One rank of tests/parallel/test_context_parallel_cuda.py: `python context_cuda_worker.py
RANK WORLD PORT OUT [DEVICE]`, each rank on its own card (cuda:RANK), NCCL.

The ring and Ulysses with every tensor on the rank's card and their collectives and P2P over
NCCL: context_worker's checks of spec modules (a causal mask, a window, documents, sinks,
rotary) and the transformers models' (context_models_worker's Llama, context_families_worker's
GPT-OSS and Gemma 2), each against the same module in one process on the same card, float64;
the twins move rank 1's block by 1e-3. DEVICE "cpu" runs the same checks on gloo (a dry run
of this file where no card is)."""

from __future__ import annotations

import sys

import context_families_worker as families  # tests/ is on a script's path
import context_models_worker as models
import context_worker as specs
from distributed_worker import run_checks, start

SPECS = ("mha", "sliding_window", "doc_mask", "attention_sinks", "rope")


def checks(mesh) -> dict:
    cases = specs.cases()
    found = {
        f"{name}_{strategy}": lambda n=name, s=strategy: specs.check(mesh, cases[n], strategy=s)
        for name in SPECS
        for strategy in ("ulysses", "ring")
    }
    for strategy in ("ulysses", "ring"):
        found[f"mha_{strategy}_moved"] = lambda s=strategy: specs.check(
            mesh, cases["mha"], twin=True, strategy=s
        )
    found["llama_ring"] = lambda: models.check(mesh, "ring", zigzag=True)
    found["llama_ulysses"] = lambda: models.check(mesh, "ulysses", zigzag=False)
    found["llama_ring_moved"] = lambda: models.check(mesh, "ring", zigzag=True, twin="moved")
    for name in ("gpt_oss_ring", "gemma2_ulysses"):
        found[name] = lambda n=name: families.check(mesh, *families.CHECKS[n])
    return found


def main() -> None:
    families.float64()
    rank, out, mesh = start(sys.argv[5] if len(sys.argv) > 5 else "cuda")
    run_checks(checks(mesh), rank, out)


if __name__ == "__main__":
    main()
