"""Sharding over heads: the plan in the spec's symbols, and, on 2 CPU processes (gloo), tensor
parallel, DDP and FSDP2 against the same module in one process (tests/distributed_worker.py
runs every distributed check in one launch, each rank bounded in time)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import indexattn
from indexattn.parallel.shard import ONCE, PARTIAL, RELAYOUT, REPLICATED, SPLIT

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "distributed_worker.py"
WORLD, TIMEOUT = 2, 120
EXACT, MOVED = 1e-10, 1e-6  # float64: equal to rounding; a twin moved by 1e-3 differs by more


def spec(name: str):
    return indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")


# -- the plan


def test_mha_plan_splits_heads_and_reduces_once():
    plan = spec("mha").shard_plan(over="μ")
    assert plan.shardable and plan.size == "h"
    assert (plan.row("W").placement, plan.row("W").axis) == (SPLIT, 0)
    assert (plan.row("W_O").placement, plan.row("W_O").axis) == (SPLIT, 1)
    assert "row-parallel" in plan.row("W_O").why
    assert plan.row("b_O").placement == ONCE
    assert plan.row("Y").placement == PARTIAL and plan.all_reduced == ("Y_<τi>",)
    assert plan.row("M").placement == REPLICATED


@pytest.mark.parametrize("over", ["μ", "\\mu", "mu", " µ "])  # the last: the micro sign
def test_over_by_glyph_macro_or_ascii(over):
    assert spec("mha").shard_plan(over).over == "μ"


def test_gpt2_needs_a_relayout_to_head_major():
    plan = spec("gpt2").shard_plan("μ")
    assert not plan.shardable and not plan.blockers
    moves = {r.ascii: (r.to, r.sizes) for r in plan.relayouts}
    assert moves == {
        "c_attn_weight": ("(μBa)i", "B=3, mu=h"),
        "c_attn_bias": ("(μBa)", "B=3, mu=h"),
    }
    assert plan.row("c_proj_weight").placement == SPLIT
    assert 'indexattn.relayout(c_attn_weight, "<(Bμa)i>", "<(μBa)i>", B=3, mu=h)' in str(plan)


def test_gqa_shards_by_its_group():
    plan = spec("gqa").shard_plan("g")
    assert plan.shardable and plan.size == "h_kv"
    assert {r.ascii: r.axis for r in plan.rows if r.role == "param"} == {
        "q_proj_weight": 0,
        "k_proj_weight": 0,
        "v_proj_weight": 0,
        "o_proj_weight": 1,
    }
    # over the query index r instead, (g r a) must put r first
    assert {r.ascii: r.to for r in spec("gqa").shard_plan("r").relayouts} == {
        "q_proj_weight": "(rga)i",
        "o_proj_weight": "i(rga)",
    }


def test_a_param_shared_by_every_head_is_replicated_with_summed_gradients():
    row = spec("mqa").shard_plan("μ").row("k_proj_weight")
    assert row.placement == REPLICATED and row.shared


def test_alibi_reads_the_head_number_and_cannot_shard():
    plan = spec("alibi").shard_plan("μ")
    assert not plan.shardable
    assert plan.blockers == (
        "m_<μ> = 2^(-8 (μ + 1) / h): reads h, μ as a number; on a rank with h/w heads it "
        "would have another value",
    )


def test_unknown_index_names_the_ones_there_are():
    with pytest.raises(indexattn.SpecError, match=r"gqa has no index 'μ'.*τ, τ', i, g, r, a"):
        spec("gqa").shard_plan("μ")


def test_softmax_over_heads_blocks():
    text = "index μ : h\nindex τ : N\ninput S_<μτ>\nA_<μτ> = softmax_<μ>(S_<μτ>)\noutput A"
    plan = indexattn.compile_spec(text, name="mix").shard_plan("mu")
    assert plan.blockers == (
        "A_<μτ> = softmax_<μ>(S_<μτ>): softmax over μ needs every head on one rank",
    )


def test_the_plan_prints_as_a_table():
    text = str(spec("mha").shard_plan("μ"))
    assert text.splitlines()[:3] == [
        "Shard plan of mha over μ (h heads, h/w per rank)",
        "  tensor       role     placement      why",
        "  X_<τi>       input    replicated     no μ; read by every rank's heads (gradient "
        "summed over ranks)",
    ]
    assert text.endswith("all-reduce after: Y_<τi>.")


def test_relayout_rows_are_marked():
    assert spec("torch_mha").shard_plan("μ").row("in_proj_weight").placement == RELAYOUT


# -- on 2 processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker: Path, world: int, out: Path, timeout: int = TIMEOUT) -> list[dict]:
    """`world` processes of `worker` on 127.0.0.1, each bounded in time; each rank's JSON."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), str(world), port, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"the {world} ranks did not finish in {timeout} s")
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(WORKER, WORLD, tmp_path_factory.mktemp("dist"))


def _result(ranks, name):
    found = [r[name] for r in ranks]
    for value in found:
        if isinstance(value, dict) and "error" in value:
            pytest.fail(f"{name}:\n{value['error']}")
    return found


def _largest(ranks, name) -> dict:
    found = _result(ranks, name)
    if not isinstance(found[0], dict):
        return {"params": max(found)}
    return {k: max(f[k] for f in found) for k in found[0]}


TP = ["tp_mha", "tp_gqa", "tp_cross", "tp_qwen3", "gpt2_relaid"]


@pytest.mark.parametrize("name", [*TP, "tp_mqa"])
def test_tensor_parallel_equals_one_process(ranks, name):
    gaps = _largest(ranks, name)  # outputs, gathered parameter and input gradients, state
    assert all(g < EXACT for g in gaps.values()), gaps


@pytest.mark.parametrize("name", TP)
def test_twin_one_shard_moved_changes_the_result(ranks, name):
    gaps = _largest(ranks, name + "_twin")
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_data_parallel_training_equals_one_process(ranks, name):
    assert _largest(ranks, name)["params"] < EXACT


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_twin_one_weight_moved_on_one_rank_changes_the_result(ranks, name):
    assert _largest(ranks, name + "_twin")["params"] > MOVED


def test_gpt2_is_refused_with_the_relayout_to_write(ranks):
    message = _result(ranks, "gpt2_refused")[0]
    assert "gpt2 needs a relayout before it shards over μ" in message
    assert '"<(Bμa)i>", "<(μBa)i>", B=3, mu=h' in message


def test_heads_that_do_not_divide_are_an_error(ranks):
    assert _result(ranks, "indivisible")[0].startswith(
        "mha: h = 3 heads (μ) do not divide among 2 ranks"
    )


def test_docs_print_the_current_plans():
    # To accept a change, rerun the plans and paste them into docs/distributed.md.
    page = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    for name, over in (("mha", "μ"), ("gpt2", "μ"), ("gqa", "g")):
        assert f"```text\n{spec(name).shard_plan(over)}\n```" in page, name


def test_what_needs_every_head_on_one_rank_is_named():
    text = (
        "index μ : h\nindex τ : N\nindex i : d\ninput X_<τi>\nparam W_<μi>\n"
        "Y_<τ> = W_<0i> X_<τi>\nZ_<μτ> = W_<μi> X_<τi>\nU_<τ> = exp(sum_<μ>(Z_<μτ>))\n"
        "R_<τ> = sum_<μ>(Z_<μτ>) + X_<τ0>\noutput Y, U, R"
    )
    plan = indexattn.compile_spec(text, name="bad").shard_plan("μ")
    assert plan.blockers == (
        "Y_<τ> = W_<0i> X_<τi>: W reads the literal 0 where its layout has μ: one rank does "
        "not hold every head",
        "U_<τ> = exp(sum_<μ>(Z_<μτ>)): exp of a sum over μ that each rank holds only part of",
        "X_<τi> is added once after the sum over μ in R_<τ> = sum_<μ>(Z_<μτ>) + X_<τ0>, and "
        "used per head elsewhere: pass it twice",
    )
