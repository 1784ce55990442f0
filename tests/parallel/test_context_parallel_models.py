"""A transformers model split over its sequence (indexattn.distributed.context_parallel_model):
a tiny Llama on 2 CPU processes (gloo), each rank holding its block of the tokens and of
position_ids, against the same model in one process (tests/context_models_worker.py runs
every check in one launch)."""

from pathlib import Path

import pytest
from test_distributed import _largest, _result, launch

pytest.importorskip("transformers")

WORKER = Path(__file__).resolve().parents[1] / "context_models_worker.py"
TIMEOUT = 240  # a bound on a hang: the launch took 100 s on the loaded 2-core machine
EXACT, MOVED = 1e-10, 1e-6  # float64: equal to rounding; a block moved by 1e-3 differs by more


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(WORKER, 2, tmp_path_factory.mktemp("cpmodels"), TIMEOUT)


@pytest.mark.parametrize("name", ["ring", "ring_contiguous", "ulysses", "ring_fsdp"])
def test_logits_and_every_gradient_equal_one_process(ranks, name):
    gaps = _largest(ranks, name)  # this rank's block of the logits; gradients summed over ranks
    assert all(g < EXACT for g in gaps.values()), gaps


TWINS = ["ring_moved", "ulysses_moved", "ring_fsdp_moved", "ring_local_positions"]


@pytest.mark.parametrize("name", TWINS)
def test_twin_a_moved_block_or_local_positions_change_the_result(ranks, name):
    gaps = _largest(ranks, name)
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


def test_a_call_without_position_ids_is_refused(ranks):
    assert (
        "pass position_ids, this rank's block of the global positions"
        in (_result(ranks, "no_positions")[0])
    )


def test_a_padding_mask_a_cache_and_labels_shifted_in_a_block_are_refused(ranks):
    assert _result(ranks, "padding")[0].startswith("attention_mask hides some tokens")
    assert "call it with use_cache=False" in _result(ranks, "cache")[0]
    assert "pass this rank's block as shift_labels too" in _result(ranks, "labels")[0]


def test_padding_on_one_rank_alone_is_refused_by_every_rank(ranks):
    """A batch padded at the end: the last rank's block alone is padded, and every rank raises
    its refusal (once, rank 1 raised while rank 0 went on into the first layer's core and
    waited there for ever)."""
    messages = _result(ranks, "padding_at_the_end")
    assert messages[0] == messages[1], messages
    assert messages[0].startswith("attention_mask hides some tokens"), messages[0]
    assert messages[0].endswith("(on rank 1; every rank of the model raises this)")


def test_a_block_cut_on_another_mesh_is_refused(ranks):
    """position_ids cut on the other dimension of a 1 × 2 mesh (the whole sequence) are
    refused by name; the twins, blocks cut on the model's mesh, run (above)."""
    said = "position_ids was cut for rank 0 of 1 (sequence_block on another mesh)"
    assert _result(ranks, "other_mesh")[0].startswith(f"LlamaForCausalLM: {said}")


# -- without processes: what a layer's call may hand the split core


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"cu_seq_lens_q": 0}, "passes cu_seq_lens_q: packed sequences"),
        ({"output_attentions": True}, "passes output_attentions: returned weights"),
        ({"is_causal": False}, "is not causal"),
        ({"dropout": 0.1}, "passes dropout=0.1 in training"),
        ({"rope_deltas": 0}, "passes rope_deltas, which a context-parallel model does not know"),
    ],
)
def test_what_the_split_core_cannot_compute_is_refused_by_name(given, said):
    import torch

    from indexattn.transformers.context import _refuse

    layer = torch.nn.Linear(1, 1)  # in training, as a layer is by default
    plain = {"scaling": 0.5, "dropout": 0.0, "sliding_window": None, "output_attentions": False}
    _refuse(layer, None, plain)  # the twin: what a Llama layer passes goes through
    with pytest.raises((NotImplementedError, TypeError), match=said):
        _refuse(layer, None, {**plain, **given})
