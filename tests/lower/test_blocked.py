"""Scores by blocks of queries: every shipped spec whose generated code holds scores over
two sequence positions computes them in a rows function; forced into blocks of one query
(the module's BLOCK_SCORES knob), it still equals the literal interpreter, in values and
gradients (through every block)."""

from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
BLOCKED = sorted(p.stem for p in GOLDEN.glob("*.py") if "BLOCK_SCORES = " in p.read_text())


def counted(spec, monkeypatch, budget: int | None) -> list[int]:
    """The queries of each call of the spec's rows function, with the knob at `budget`."""
    namespace = spec.function.__globals__
    rows = namespace[f"{spec.name}_rows"]
    calls: list[int] = []

    def counting(*args, **kwargs):
        calls.append(1)
        return rows(*args, **kwargs)

    monkeypatch.setitem(namespace, f"{spec.name}_rows", counting)
    if budget is not None:
        monkeypatch.setitem(namespace, "BLOCK_SCORES", budget)
        monkeypatch.setitem(namespace, "BLOCK_ROWS", 1)
    return calls


def test_the_score_modifications_are_blocked():
    assert {"softcap_window", "sigmoid_attention", "attention_sinks", "differential"} <= set(
        BLOCKED
    )


@pytest.mark.parametrize("name", BLOCKED)
def test_short_sequences_take_all_queries_at_once(name, monkeypatch):
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    calls = counted(spec, monkeypatch, None)
    assert compare(spec, torch.float64, (2,)).ok
    assert len(calls) == 1


@pytest.mark.parametrize("name", BLOCKED)
def test_blocks_of_one_query_equal_the_literal(name, monkeypatch):
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    calls = counted(spec, monkeypatch, 1)
    result = compare(spec, torch.float64, (2,), seed=0)
    assert result.ok, f"{name}: error {result.error:.2e}"
    assert len(calls) == sample_sizes(spec.ir, 0)["N"]


@pytest.mark.parametrize("name", BLOCKED)
def test_blocks_of_one_query_see_a_change_in_the_last_query(name, monkeypatch):
    """The twin: against the literal reading of inputs whose last position differs, the
    blocks of the earlier queries still agree (these specs are causal), the last does not."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    counted(spec, monkeypatch, 1)
    sizes = sample_sizes(spec.ir)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, (2,))
    changed = {**args, "X": args["X"].clone()}
    changed["X"][..., -1, :] += 1
    got = spec(**args, **given)
    (want,) = reference.evaluate(spec.ir, **changed, **given)
    assert torch.allclose(got[..., :-1, :], want[..., :-1, :])
    assert not torch.allclose(got[..., -1, :], want[..., -1, :])


@pytest.mark.parametrize("name", BLOCKED)
def test_gradients_through_blocks_equal_the_literal(name, monkeypatch):
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    counted(spec, monkeypatch, 1)
    sizes = sample_sizes(spec.ir, seed=1)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, seed=3)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    twins = {k: v.clone().requires_grad_() for k, v in args.items()}
    weights = torch.randn_like(spec(**args, **given))
    (spec(**leaves, **given) * weights).sum().backward()
    (reference.evaluate(spec.ir, **twins, **given)[0] * weights).sum().backward()
    for name in args:
        torch.testing.assert_close(leaves[name].grad, twins[name].grad, rtol=0, atol=1e-12)


SHARED_MASK = (ROOT / "benchmarks" / "specs" / "shared_mask.attn").read_text(encoding="utf-8")
TWO_CORES = SHARED_MASK  # soft-capped, so that neither core is the fused kernel
for k in "12":
    TWO_CORES = TWO_CORES.replace(
        f"(Q{k}_<μτa> K{k}_<μτ'a> / sqrt(d_k)", f"(tanh(Q{k}_<μτa> K{k}_<μτ'a> / sqrt(d_k))"
    )


def test_rows_read_before_their_block_stay_plain():
    """Two soft-capped cores summed in one equation (`O = A1 V1 + A2 V2`): the first core's
    rows would be read inside the block that computes them, so no rows function is written,
    and the plain steps equal the literal interpreter. The twin, each core in an equation of
    its own, computes the first core by blocks, and is equal too."""
    spec = indexattn.compile_spec(TWO_CORES, name="two_cores")
    assert "tanh" in spec.source and "_rows" not in spec.source
    assert compare(spec, batch=(2,)).ok
    apart = TWO_CORES.replace(
        "O_<μτa>   = A1_<μττ'> V1_<μτ'a> + A2_<μττ'> V2_<μτ'a>",
        "O1_<μτa>  = A1_<μττ'> V1_<μτ'a>\nO2_<μτa>  = A2_<μττ'> V2_<μτ'a>\n"
        "O_<μτa> = O1_<μτa> + O2_<μτa>",
    )
    split = indexattn.compile_spec(apart, name="apart")
    assert "def apart_rows(" in split.source
    assert compare(split, batch=(2,)).ok
