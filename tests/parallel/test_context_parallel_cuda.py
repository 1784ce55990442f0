"""The ring and Ulysses over NCCL, each rank on its own card (tests/context_cuda_worker.py): the
spec modules' checks (a causal mask, a window, documents, sinks, rotary) and the transformers
models' (Llama, GPT-OSS, Gemma 2), each equal to one process on the same card in float64, and
the twins (rank 1's block moved) differ. Skipped where torch sees fewer than two cards; the
same worker's dry run on gloo (`... OUT cpu`) is how it was checked where none is."""

from pathlib import Path

import pytest
import torch
from test_distributed import _largest, launch

pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]

WORKER = Path(__file__).resolve().parents[1] / "context_cuda_worker.py"
TIMEOUT = 600  # a bound on a hang (NCCL waits forever where a send has no receive)
EXACT, CHANGED = 1e-12, 1e-6
SPLIT = [
    *(
        f"{n}_{s}"
        for n in ("mha", "sliding_window", "doc_mask", "attention_sinks", "rope")
        for s in ("ulysses", "ring")
    ),
    "llama_ring",
    "llama_ulysses",
    "gpt_oss_ring",
    "gemma2_ulysses",
]
MOVED = ["mha_ulysses_moved", "mha_ring_moved", "llama_ring_moved"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(WORKER, 2, tmp_path_factory.mktemp("cpcuda"), TIMEOUT)


@pytest.mark.parametrize("name", SPLIT)
def test_over_nccl_equals_one_process_on_the_card(ranks, name):
    gaps = _largest(ranks, name)
    assert all(g < EXACT for g in gaps.values()), gaps


@pytest.mark.parametrize("name", MOVED)
def test_twin_a_moved_block_over_nccl_differs(ranks, name):
    gaps = _largest(ranks, name)
    assert max(gaps.values()) > CHANGED, gaps
