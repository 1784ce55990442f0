"""Prefix sums of outer products read only through a contraction (causal linear attention's
state S_<μτab>) are computed by chunks of positions, never held: the chunked code equals the
literal interpreter in float64 when the sequence is several chunks and not a multiple of
one, a whole number of them, and shorter than one; in values and gradients. A key at the
last position changes only the last output, one at the first changes them all. Its FLOPs
are what torch counts."""

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import indexattn
from indexattn.lower.program.steps import PrefixProduct, Reduction
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.views import cost

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "linear_attention_causal.attn"


@pytest.fixture(scope="module")
def causal():
    return indexattn.compile_spec(SPEC)


def sizes_at(spec, n: int) -> dict[str, int]:
    return {**sample_sizes(spec.ir), "N": n}


def arguments(spec, n: int, seed: int = 0):
    sizes = sizes_at(spec, n)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    return sample_arguments(spec.ir, sizes, (2,), torch.float64, seed), given


def chunked(spec, monkeypatch, chunk: int | None):
    """The spec's function, with chunks of `chunk` positions (the module's knob)."""
    if chunk is not None:
        monkeypatch.setitem(spec.function.__globals__, "CHUNK", chunk)
    return spec


def test_the_state_is_never_held(causal):
    steps = causal.plan.steps
    assert any(isinstance(s, PrefixProduct) for s in steps)
    assert all(len(s.out.dims) < 4 for s in steps), "a value over (μ, τ, a, b) is held"
    assert "CHUNK = 64" in causal.source


def test_a_prefix_sum_that_is_an_output_is_held():
    text = SPEC.read_text().replace("output Y", "output Y, S")
    spec = indexattn.compile_spec(text, name="linear_attention_causal")
    assert not any(isinstance(s, PrefixProduct) for s in spec.plan.steps)
    cumsums = [s for s in spec.plan.steps if isinstance(s, Reduction) and s.fn == "cumsum"]
    assert any(len(s.out.dims) == 4 for s in cumsums)  # the state over (μ, τ, a, b), held


@pytest.mark.parametrize(
    "n, chunk",
    [(7, 3), (6, 3), (2, None), (130, None)],
    ids=["not-a-multiple", "whole-chunks", "shorter-than-one", "default-three-chunks"],
)
def test_chunked_equals_literal(causal, monkeypatch, n, chunk):
    args, given = arguments(causal, n)
    got = chunked(causal, monkeypatch, chunk)(**args, **given)
    (want,) = reference.evaluate(causal.ir, **args, **given)
    assert got.shape[-2] == n
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_gradients_through_every_chunk_equal_literal(causal, monkeypatch):
    args, given = arguments(causal, 7)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    twins = {k: v.clone().requires_grad_() for k, v in args.items()}
    (want,) = reference.evaluate(causal.ir, **twins, **given)
    weights = torch.randn_like(want)
    (chunked(causal, monkeypatch, 3)(**leaves, **given) * weights).sum().backward()
    (want * weights).sum().backward()
    for name in args:
        torch.testing.assert_close(leaves[name].grad, twins[name].grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("position, changed", [(-1, [6]), (0, range(7))], ids=["last", "first"])
def test_a_key_changes_the_outputs_after_it(causal, monkeypatch, position, changed):
    """X at one position moves its query, key and value: outputs from there on change."""
    args, given = arguments(causal, 7)
    run = chunked(causal, monkeypatch, 3)
    before = run(**args, **given)
    args["X"][..., position, :] += 0.5
    moved = (run(**args, **given) - before).abs().amax(dim=(0, 2)) > 1e-9
    assert moved.tolist() == [k in changed for k in range(7)]


@pytest.mark.parametrize("n", [2, 130])
def test_flops_are_what_torch_counts(causal, n):
    args, given = arguments(causal, n)
    with FlopCounterMode(display=False) as counter:
        causal(**{k: v[0] if k == "X" else v for k, v in args.items()}, **given)
    sizes = cost.sizes_for(causal.ir, sizes_at(causal, n))
    matmul = sum((c for _, c in cost.block_costs(causal.plan)), cost.Cost()).matmul
    assert counter.get_total_flops() == cost.evaluate(matmul, sizes)
