"""Every rank of a split layer called alike (indexattn/parallel/agree.py): on 2 CPU processes
(gloo, tests/context_agree_worker.py), a call that differs on rank 1 in one thing raises the
same error on both ranks, naming it, where it once gave a result no process would (a scalar)
or left rank 0 waiting for ever in the ring (a block of another length, dtype or layout);
and the message, made of every rank's description of its call, without processes."""

from pathlib import Path

import pytest
import torch
from test_distributed import _result, launch

from indexattn.parallel.agree import ALIKE, described, disagreement, sampled

WORKER = Path(__file__).resolve().parents[1] / "context_agree_worker.py"
TIMEOUT = 90  # a bound on a hang: a rank left waiting in the ring never finishes
STRATEGIES = ("ulysses", "ring", "heads")
NAMED = {  # what each difference's message names, with rank 0's and rank 1's values
    "scalar": "c: 1.0 on rank 0, 2.0 on rank 1",
    "length": "X: (2, 4, 8) float64 on cpu on rank 0, (2, 3, 8) float64 on cpu on rank 1",
    "dtype": "X: (2, 4, 8) float64 on cpu on rank 0, (2, 4, 8) float32 on cpu on rank 1",
    "mode": "mode: eval on rank 0, training on rank 1",
}
BLOCKS = [(s, d) for s in ("ulysses", "ring") for d in ("layout", "mesh")]
CASES = [(s, d) for s in STRATEGIES for d in NAMED] + BLOCKS + [("heads", "values")]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(WORKER, 2, tmp_path_factory.mktemp("agree"), TIMEOUT)


@pytest.mark.parametrize(("strategy", "different"), CASES)
def test_a_rank_called_differently_raises_on_every_rank(ranks, strategy, different):
    messages = _result(ranks, f"{strategy}_{different}")
    assert messages[0] == messages[1], messages  # the same error on both ranks
    if different == "layout":  # rank 1's block is zig-zag: its refusal, raised by both
        assert messages[0].startswith("softcap_window: X is a zig-zag block"), messages[0]
        assert messages[0].endswith("(on rank 1; every rank of the layer raises this)")
        return
    if different == "mesh":  # every rank's block cut on the mesh's other dimension, of 1
        cut = "X was cut for rank 0 of 1 (sequence_block on another mesh), and this is rank 0"
        assert messages[0].startswith(f"softcap_window: {cut}"), messages[0]
        assert messages[0].endswith("(on ranks 0, 1; every rank of the layer raises this)")
        return
    if different == "values":  # parallelize's whole X, another batch on rank 1
        said = "softcap_window: the ranks were called differently, X's values: sampled "
        assert messages[0].startswith(said) and " on rank 1; " in messages[0], messages[0]
        return
    whole = NAMED[different]
    if strategy == "heads":  # whole inputs: every rank's X is the whole sequence
        whole = whole.replace("(2, 4, 8)", "(2, 8, 8)").replace("(2, 3, 8)", "(2, 7, 8)")
    assert messages[0] == f"softcap_window: the ranks were called differently, {whole}; {ALIKE}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_twin_every_rank_called_alike_runs(ranks, strategy):
    assert _result(ranks, f"{strategy}_None") == ["no error", "no error"]


@pytest.mark.parametrize("name", ["mha", "softcap_window"])
def test_a_ring_called_again_after_a_tile_pair_raised_equals_one_process(ranks, name):
    """Every rank's first tile pair raised alike; the transfers posted ahead of it were
    finished before the error left the ring, so the next call equals one process."""
    found = _result(ranks, f"after_a_raise_{name}")
    assert [r["raised"] for r in found] == ["a tile pair failed"] * 2, found
    assert all(r["out"] < 1e-12 for r in found), found


def test_a_whole_inputs_sample_tells_equal_values_from_another_batch():
    """`sampled` is the same for equal tensors (a copy), and differs for a tensor changed
    throughout (another batch) or reversed."""
    x = torch.randn(4, 1000, 24, dtype=torch.float64)
    assert sampled(x) == sampled(x.clone())
    assert sampled(x) != sampled(x + 1e-9)
    assert sampled(x) != sampled(x.flip(1))


def test_the_message_names_the_first_difference_and_groups_the_ranks():
    calls = [(described({}, {"c": c}, training=False), None) for c in (1, 2, 2, 1)]
    named = "c: 1.0 on ranks 0, 3, 2.0 on ranks 1, 2"
    assert disagreement("s", calls) == f"s: the ranks were called differently, {named}; {ALIKE}"
    alike = calls[0][0]
    refusals = [(alike, None), (alike, "s: no"), (alike, "s: no")]
    raised = "s: no (on ranks 1, 2; every rank of the layer raises this)"
    assert disagreement("s", refusals) == raised
