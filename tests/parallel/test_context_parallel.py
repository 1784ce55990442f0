"""Context parallelism: the sequence plan read off the notation, and, on 2 and 4 CPU processes
(gloo), a spec module split over its sequence (Ulysses) against the same module in one
process (tests/context_worker.py runs every check of one world size in one launch)."""

import itertools
import re
import subprocess
import sys
from pathlib import Path

import context_worker
import pytest
import sympy
from test_distributed import _free_port, _largest, _result, launch

import indexattn
from indexattn.cli import main
from indexattn.ir import check
from indexattn.parallel import ring
from indexattn.parallel.ring import work
from indexattn.parallel.sequence import (
    CONTIGUOUS,
    LSE,
    PREFIX,
    RANKS,
    SUM,
    ZIGZAG,
    balanced,
    sequence_plan,
    ulysses_sent,
)

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "context_worker.py"
TIMEOUT = 420  # a bound on a hang: 4 ranks took 2.5 min on the loaded 2-core machine
EXACT, MOVED = 1e-10, 1e-8  # float64: equal to rounding; a block moved by 1e-3 differs by more


def plan(name: str, **where):
    return indexattn.compile_spec(name).sequence_plan(**where)


# -- the plan


def test_mha_merges_by_log_sum_exp_then_sums_and_reads_global_positions():
    p = plan("mha")
    assert p.indices == ("τ", "τ'") and p.splittable and p.heads == "μ"
    assert [(m.reduction, m.merge) for m in p.merges] == [
        ("softmax_<τ'>", LSE),
        ("sum over τ'", SUM),
    ]
    assert [(q.equation, q.reads) for q in p.positions] == [
        ("M_<ττ'> = where(τ' > τ, -inf, 0)", ("τ", "τ'"))
    ]
    assert p.split == (("X_<τi>", 0),)


def test_sinks_join_the_log_sum_exp_merge():
    merges = {m.reduction: m.merge for m in plan("attention_sinks").merges}
    assert merges == {"logsumexp_<τ'>": LSE, "softmax_<τ'>": LSE, "sum over τ'": SUM}


def test_a_cumsum_is_an_exclusive_scan_across_ranks():
    p = plan("linear_attention_causal")
    assert p.indices == ("τ",) and {m.merge for m in p.merges} == {PREFIX}
    assert not p.positions  # no position read as a number


def test_positions_read_as_numbers_are_global():
    reads = {q.equation.split(" =")[0]: q.reads for q in plan("rope").positions}
    assert reads["θ_<τj>"] == ("τ",)
    t5 = {q.equation.split(" =")[0] for q in plan("t5_bias").positions}
    assert {"ρ_<ττ'>", "β_<ττ'>"} <= t5
    assert "S_<μττ'>" in {q.equation.split(" =")[0] for q in plan("alibi").positions}


def test_cross_attention_takes_its_context_as_the_key_index():
    p = plan("cross", keys=("σ",))
    assert p.indices == ("τ", "σ") and p.sizes == ("N", "L")
    assert p.split == (("X_<τi>", 0), ("C_<σj>", 0))
    assert plan("cross").indices == ("τ", "σ")  # found anyway: the softmax runs over σ


def test_a_concat_along_the_sequence_is_named():
    assert plan("kv_decode").blockers == (
        "K_<μσa> = concat_<σ>(Kc_<μca>, Kn_<μτa>): concat along σ, the sequence",
        "V_<μσa> = concat_<σ>(Vc_<μca>, Vn_<μτa>): concat along σ, the sequence",
    )


def test_a_row_read_at_a_shifted_position_is_named():
    text = (
        "index τ, τ' : N\nindex i : d\ninput X_<τi>\n"
        "Y_<τi> = X_<τi> - X_<[τ - 1]i>\nZ_<i> = X_<0i>\noutput Y, Z"
    )
    blockers = indexattn.compile_spec(text, name="shift").sequence_plan().blockers
    assert blockers == (
        "Y_<τi> = X_<τi> - X_<[τ - 1]i>: X is read at a computed position along τ, a row "
        "another rank may hold",
        "Z_<i> = X_<0i>: X is read at 0 along τ, a row another rank may hold",
    )
    # its twin: the same spec without the shifted reads splits
    plain = "index τ : N\nindex i : d\ninput X_<τi>\nY_<τi> = 2 X_<τi>\noutput Y"
    assert indexattn.compile_spec(plain, name="plain").sequence_plan().splittable


def test_every_shipped_spec_has_a_plan_or_names_what_blocks_it():
    """Only a KV cache (a concat along the sequence) and reads at computed positions along it
    (MTA's convolution, NSA's blocks) block a shipped spec's split."""
    blocked = {}
    for name in indexattn.shipped_specs():
        path = indexattn.shipped(name)
        spec = check(path.read_text(encoding="utf-8"), name, str(path))  # no code generated
        found = sequence_plan(spec)
        texts = {eq.text for eq in spec.equations}
        assert all(b.split(": ")[0] in texts for b in found.blockers), found.blockers
        if found.blockers:
            blocked[name] = " ".join(found.blockers)
    decode = {name for name in blocked if name.endswith("decode")}
    assert decode and all("concat along" in blocked[name] for name in decode)
    assert set(blocked) - decode == {"mta", "nsa"}, sorted(blocked)
    assert all("read at a computed position" in blocked[name] for name in ("mta", "nsa"))


def test_alibi_has_no_head_index_for_ulysses_and_says_why():
    p = plan("alibi")
    assert p.splittable and not p.ulysses
    assert "m_<μ> = 2^(-8 (μ + 1) / h): reads h, μ as a number" in p.head_blockers[0]


def test_the_plan_prints():
    text = str(plan("mha"))
    assert text.splitlines()[0] == (
        "Sequence plan of mha over τ, τ' (N positions, blocks of N/w per rank)"
    )
    assert "Ulysses: all-to-all from sequence blocks to head blocks over μ" in text


# -- bytes, counted


def test_ulysses_sends_of_mha():
    spec = indexattn.compile_spec("mha").ir
    sent = {(s.tensor, s.collective, s.phase): s.elements for s in ulysses_sent(spec, plan("mha"))}
    n, d, h, a = sympy.symbols("N d_m h d_k", positive=True, integer=True)
    w = RANKS
    share = (w - 1) / w
    expected = {
        ("X_<τi>", "all-gather", "forward"): n * d * share,
        ("X_<τi>", "reduce-scatter", "backward"): n * d * share,
        ("Y_<τi>", "reduce-scatter", "forward"): n * d * share,
        ("Y_<τi>", "all-gather", "backward"): n * d * share,
        ("W_<(μBa)i>", "all-gather", "gradient"): 3 * h * a * d * share,
        ("W_O_<i(μa)>", "all-gather", "gradient"): h * a * d * share,
        ("b_O_<i>", "all-reduce", "gradient"): 2 * d * share,
    }
    names = {str(s): s for e in sent.values() for s in e.free_symbols}
    mine = {
        k: v.subs({s: names.get(str(s), s) for s in v.free_symbols}) for k, v in expected.items()
    }
    assert set(sent) == set(mine)
    assert all(sympy.simplify(sent[k] - mine[k]) == 0 for k in mine), sent


COUNT = ["count", "specs/mha.attn", "--context", "2"]
COUNT += ["--size", "N=8192", "--size", "d_m=64", "--size", "h=2", "--size", "d_k=32"]


def test_count_shows_what_each_rank_sends(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(COUNT) == 0
    text = capsys.readouterr().out
    assert "  X_<τi>       all-gather      forward   N*d_m*(w - 1)/w        262,144" in text
    assert "total: 1,048,576 per batch element (4.19 MB in float32), and 8,256 per step" in text
    # to accept a change, paste the output into docs/distributed.md
    page = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert "\n".join(text.splitlines()[-9:]) in page
    assert main([*COUNT[:2], "--context", "4"]) == 0  # the twin: 4 ranks send another share
    assert "total: 1,048,576 per batch element" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "sizes", "best"),
    [
        ("mha", {"d_m": 64, "h": 2, "d_k": 32}, ZIGZAG),  # causal: zig-zag evens it
        ("softcap_window", {"d_m": 64, "h": 2, "d_k": 32, "query_pre_attn_scalar": 32}, CONTIGUOUS),
    ],
)
@pytest.mark.parametrize("world", [2, 4])
def test_the_balanced_layout_is_the_one_count_names(name, sizes, best, world, capsys):
    """What the benchmark runs the ring on: the layout `count --ring` says balances it (a
    window of 4096 over 32768 keys is even on contiguous blocks, a causal mask on zig-zag)."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    given = {**sizes, "N": 32768}
    values = {s: given[a] for s, a in spec.ir.size_names.items()}  # scalars: the spec's
    found = balanced(spec.ir, spec.sequence_plan(), values, world)
    assert found == best
    command = ["count", f"specs/{name}.attn", "--context", str(world), "--ring"]
    command += [f"--size={a}={given[a]}" for a in spec.ir.size_names.values()]
    assert main(command) == 0
    assert f"balanced by: {found} (layout={found.name!r})" in capsys.readouterr().out


def test_count_shows_what_the_ring_sends(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main([*COUNT, "--ring"]) == 0
    text = capsys.readouterr().out
    assert "  K_<μτa>      send/recv   forward   N*d_k*h*(w - 1)/w      262,144" in text
    # each rank's work by layout, read off the block map: zig-zag balances the causal mask
    assert "  contiguous  12,582,912  29,360,128  (max/mean 1.40)" in text
    assert "  zig-zag     20,971,520  20,971,520  (max/mean 1.00)" in text
    assert "balanced by: zig-zag (layout='zigzag')" in text
    # each rank's P2P off the block map: rank 0's last chunk read by no other rank
    assert "\n  1,048,576  1,310,720\n" in text
    page = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert text[text.index("Elements sent") :].rstrip() in page
    # the twin: ALiBi, which Ulysses refuses, is counted for the ring
    sizes = ["--size", "N=64", "--size", "d_in=8", "--size", "d_out=8", "--size", "h=2"]
    assert main(["count", "specs/alibi.attn", "--context", "2", "--ring", *sizes]) == 0
    assert "K_<μτa>" in capsys.readouterr().out


def _sent_rows(text: str) -> dict:
    return {
        tuple(line.split()[:3]): line.split()[3] for line in text.splitlines() if "send/" in line
    }


def test_count_has_the_sink_s_one_pass(capsys, monkeypatch, tmp_path):
    """attention_sinks' logsumexp is the statistic of the pass over K and V (its σ(L − s)
    taken out of the sum): K and V are sent once each in the forward, twice in the backward
    (their gradients, and again for the pass made from its rows). The twin: a factor that
    reads the mask too stays inside the sum, and the logsumexp needs a pass over K of its
    own first (the count once said one pass where the ring made two)."""
    monkeypatch.chdir(ROOT)
    sizes = ["--size", "N=64", "--size", "d_m=8", "--size", "h_kv=2", "--size", "n_rep=1"]
    assert main(["count", "specs/attention_sinks.attn", "--context", "2", "--ring", *sizes]) == 0
    text = capsys.readouterr().out
    rows = _sent_rows(text)
    assert rows[("K_<gτa>", "send/recv", "forward")] == "N*d_k*h_kv*(w", rows
    assert rows[("V_<gτa>", "send/recv", "backward")] == "2*N*d_k*h_kv*(w", rows
    assert "1 pass over the keys" in text and "L is its log-sum-exp" in text
    source = (ROOT / "specs" / "attention_sinks.attn").read_text(encoding="utf-8")
    inside = source.replace(
        "sigmoid(L_<grτ> - sinks_<(gr)>)", "sigmoid(L_<grτ> - sinks_<(gr)> + M_<ττ'>)"
    )
    assert inside != source
    (tmp_path / "inside.attn").write_text(inside, encoding="utf-8")
    assert main(["count", str(tmp_path / "inside.attn"), "--context", "2", "--ring", *sizes]) == 0
    text = capsys.readouterr().out
    assert _sent_rows(text)[("K_<gτa>", "send/recv", "forward")] == "2*N*d_k*h_kv*(w"
    assert "2 passes over the keys" in text


def test_count_refuses_a_spec_without_a_head_split(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["count", "specs/alibi.attn", "--context", "2"]) == 1
    assert "m_<μ> = 2^(-8 (μ + 1) / h): reads h, μ as a number" in capsys.readouterr().err


def test_docs_print_the_current_sequence_plans():
    page = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    for name in ("mha", "linear_attention_causal"):
        assert f"```text\n{plan(f'specs/{name}.attn')}\n```" in page, name


@pytest.mark.slow  # torchrun starts the ranks: 20 to 30 s each
@pytest.mark.parametrize("world", [2, 4])
def test_the_example_runs_under_torchrun(world):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world)]
    command += ["--master-port", str(_free_port()), str(ROOT / "examples" / "context_parallel.py")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    # gloo's teardown aborts rank 0 now and then after every result is printed (1 run in 20 at
    # 4 ranks: docs/decisions.md); the results below are read all the same
    torn = "terminate called without an active exception" in done.stderr
    assert done.returncode == 0 or torn, done.stderr[-3000:]
    for strategy in ("ulysses", "ring"):
        line = rf"{strategy}: elements sent by rank 0: (\d+) \(counted: (\d+)\)"
        sent, counted = re.search(line, done.stdout).groups()
        assert sent == counted, strategy
        line = rf"{strategy}: largest difference from one process, values and gradients: (\S+)"
        assert float(re.search(line, done.stdout).group(1)) < EXACT, strategy


# -- on 2 and 4 processes: one launch of each, every check of it run in that launch

ULYSSES, RING = context_worker.ULYSSES, context_worker.RING
RUNS = {"ulysses": "", "ring": "ring_"}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    found: dict[int, list[dict]] = {}

    def ranks(world: int) -> list[dict]:
        if world not in found:
            out = tmp_path_factory.mktemp(f"cp{world}")
            found[world] = launch(WORKER, world, out, TIMEOUT)
        return found[world]

    return ranks


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, launched) -> list[dict]:
    return launched(request.param)


EQUAL = [(s, n) for s, names in (("ulysses", ULYSSES), ("ring", RING)) for n in names]


@pytest.mark.parametrize(("strategy", "name"), EQUAL)
def test_split_sequence_equals_one_process(ranks, strategy, name):
    gaps = _largest(ranks, RUNS[strategy] + name)  # this rank's output block, and every
    assert all(g < EXACT for g in gaps.values()), gaps  # gradient made whole; no NaN


@pytest.mark.parametrize(("strategy", "name"), EQUAL)
def test_twin_one_rank_block_moved_changes_the_result(ranks, strategy, name):
    gaps = _largest(ranks, RUNS[strategy] + name + "_twin")
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


@pytest.mark.parametrize("name", ["mha", "doc_mask", "cross", "core", "whole"])
def test_elements_sent_are_the_count(launched, name):
    for found in _result(launched(2), "sent_" + name):
        assert found["ran"] == found["counted"] and found["ran"], found
    if name == "core":  # inputs with heads: traded by all-to-all
        assert "all-to-all" in found["ran"]


def test_the_ring_computes_its_schedule_and_sends_its_count(ranks):
    """Each rank's P2P is its count off the block map on zig-zag blocks, at most the symbolic
    count; the twin, the count on contiguous blocks, differs on some rank (what travels
    follows the mask on the layout)."""
    found = _result(ranks, "ring_work_mha")
    for each in found:
        assert each["work"] == each["schedule"] > 0, each
        assert 0 < each["sent"] == each["counted"] <= each["most"], each
    assert any(each["contiguous"] != each["counted"] for each in found), found


def test_the_ring_sends_the_count_of_a_sink_s_pass(ranks):
    """attention_sinks' logsumexp is the statistic of its one pass over K and V, and the ring
    sends what the count says (it once said 256 where the ring sent 384, at 2 ranks, when
    the logsumexp had a pass of its own the count left out)."""
    for found in _result(ranks, "ring_work_attention_sinks"):
        assert 0 < found["sent"] == found["counted"] <= found["most"], found
        assert found["work"] == found["schedule"] > 0, found


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "heads"])
def test_a_scalar_given_to_the_call_is_honoured_by_a_split_layer(ranks, strategy):
    gaps = _largest(ranks, f"scalar_{strategy}")  # softcap_window's c for this call only
    assert all(g < EXACT for g in gaps.values()), gaps
    twin = _largest(ranks, f"scalar_{strategy}_twin")  # against the module's own c
    assert twin["out"] > MOVED and twin["grad"] > MOVED, twin


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_the_defaults_agree_so_natural_code_equals_one_process(ranks, strategy):
    gaps = _largest(ranks, f"natural_{strategy}")  # context_parallel and sequence_block as is
    assert all(g < EXACT for g in gaps.values()), gaps
    twin = _largest(ranks, f"natural_{strategy}_twin")
    assert twin["out"] > MOVED and twin["grad"] > MOVED, twin


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_a_block_of_another_layout_is_refused_by_name(ranks, strategy):
    message = _result(ranks, f"mismatch_{strategy}_contiguous")[0]
    assert "X is a contiguous block" in message and "zig-zag" in message, message
    assert _result(ranks, f"mismatch_{strategy}_zigzag")[0] == "no error"  # the twin


@pytest.mark.parametrize("name", ["mha", "doc_mask", "rope"])
def test_ulysses_on_zigzag_blocks_equals_one_process(ranks, name):
    gaps = _largest(ranks, f"ulysses_zigzag_{name}")
    assert all(g < EXACT for g in gaps.values()), gaps
    twin = _largest(ranks, f"ulysses_zigzag_{name}_twin")
    assert twin["out"] > MOVED and twin["grad"] > MOVED, twin


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
@pytest.mark.parametrize("name", ["mha", "rope"])
def test_bfloat16_split_is_as_close_to_float64_as_one_process(launched, strategy, name):
    """Tables (rotary angles) in float32 or wider, and the ring's tiles and merges
    accumulated in float32, as one process's kernels do: at N = 512 (rope's angles there in
    bfloat16 were 20 times one process's error), within 1.5 times one process's error."""
    for found in _result(launched(2), f"bfloat16_{strategy}_{name}"):
        assert found["dtype"] == "torch.bfloat16", found
        assert 0 < found["split"] <= 1.5 * found["one"], found


def _read_runs(found: dict) -> list[list[int]]:
    """The runs of one key each that a rank reading `found["read"]` receives, forward then
    backward."""
    forward = [[k, k + 1] for keys in found["read"] for k in keys]
    return forward * 2


@pytest.mark.parametrize("name", ["mha", "window"])
def test_a_kept_pass_receives_the_keys_its_queries_read_in_runs(ranks, name):
    """In tiles of one position (runs of one key: sequence.cuts, N/w = 4 or 2 keys), each
    rank receives the keys its queries read, each once in the forward and once in the
    backward, and no other (sequence.read_runs): mha on zig-zag blocks (the first rank's last
    chunk is read by no other rank), sliding_window (w = 2) on contiguous blocks (one key of
    the rank before); the result is one process's. The twin: mha, whose rank with the last
    chunk reads every key of every other rank, receives them all."""
    for found in _result(ranks, "ring_runs" + "_window" * (name == "window")):
        assert found["out"] < EXACT and found["grad"] < EXACT, found
        assert found["runs"] == _read_runs(found), found
    if name == "mha":
        last = _result(ranks, "ring_runs")[0]  # rank 0: chunks 0 and 2w - 1
        every = len(ranks) - 1
        assert [len(keys) for keys in last["read"]] == [8 // len(ranks)] * every, last


def test_a_rank_receives_keys_only_from_ranks_its_window_reaches(ranks):
    world = len(ranks)
    unseen = 0  # pairs of ranks whose window holds no pair of positions
    for found in _result(ranks, "ring_received_sliding_window"):
        assert [n > 0 for n in found["received"]] == found["sees"], found
        unseen += world - 1 - sum(found["sees"])
    assert unseen == (6 if world == 4 else 0)  # 4 ranks: zig-zag chunks of one position
    # the twin: without a window, every rank receives from every other
    for rank, found in enumerate(_result(ranks, "ring_received_mha")):
        assert [n > 0 for n in found["received"]] == found["sees"], found
        assert found["sees"] == [src != rank for src in range(world)], found


def test_a_rank_receives_keys_only_from_ranks_whose_documents_its_queries_read(ranks):
    """Document ids near 2^62, one document a zig-zag chunk at 2 ranks: the ring skips the
    tile pairs between documents and receives nothing from a rank it reads nothing of."""
    gaps = _largest(ranks, "ring_documents")
    assert all(g < EXACT for g in gaps.values()), gaps
    twin = _largest(ranks, "ring_documents_twin")
    assert twin["out"] > MOVED and twin["grad"] > MOVED, twin
    unseen = 0
    for found in _result(ranks, "ring_received_documents"):
        assert [n > 0 for n in found["received"]] == found["sees"], found
        unseen += len(ranks) - 1 - sum(found["sees"])
    assert unseen == (2 if len(ranks) == 2 else 8)  # 4 ranks: a document spans 2 chunks
    # the twin: documents that straddle the chunks, and the ranks, are received from
    straddling = _result(ranks, "ring_received_straddling")
    for found in straddling:
        assert [n > 0 for n in found["received"]] == found["sees"], found
    assert sum(sum(found["sees"]) for found in straddling) == (2 if len(ranks) == 2 else 6)


@pytest.mark.parametrize("name", ["fsdp_and_sequence", "fsdp_and_ring"])
def test_fsdp_over_the_batch_and_the_sequence_split_equal_one_process(launched, name):
    ranks = launched(4)  # a 2 × 2 mesh: dp × cp (Ulysses, or the ring)
    assert max(_result(ranks, name)) < EXACT
    assert max(_result(ranks, name + "_twin")) > MOVED


def test_heads_over_one_mesh_dimension_and_the_ring_over_the_other_equal_one_process(launched):
    ranks = launched(4)  # a 2 × 2 mesh: tp (parallelize) × cp (ring)
    gaps = _largest(ranks, "heads_and_ring")
    assert all(g < EXACT for g in gaps.values()), gaps
    twin = _largest(ranks, "heads_and_ring_twin")
    assert twin["out"] > MOVED and twin["grad"] > MOVED, twin


def test_alibi_is_refused_by_name(ranks):
    message = _result(ranks, "alibi_refused")[0]
    assert "Ulysses: no head index to trade the sequence for" in message
    assert "m_<μ> = 2^(-8 (μ + 1) / h): reads h, μ as a number" in message


def test_a_spec_the_ring_cannot_split_is_refused_by_name(ranks):
    message = _result(ranks, "kv_decode_refused")[0]
    assert "kv_decode: its sequence cannot be split into blocks over ranks" in message
    assert "concat_<σ>(Kc_<μca>, Kn_<μτa>): concat along σ, the sequence" in message


def test_heads_that_do_not_divide_are_an_error(ranks):
    world = len(ranks)
    assert _result(ranks, "heads_indivisible")[0].startswith(
        f"mha: h = {world - 1} heads (μ) do not divide among {world} ranks"
    )


def test_a_sequence_that_does_not_divide_is_an_error(ranks):
    world = len(ranks)
    assert _result(ranks, "indivisible")[0].startswith(
        f"a sequence of 9 positions (dim 1) does not split into {world} equal chunks"
    )
    assert _result(ranks, "indivisible_zigzag")[0].startswith(
        f"a sequence of 9 positions (dim 1) does not split into {2 * world} equal chunks "
        "(2 per rank, zig-zag): pad it to a multiple of"
    )


# -- the ring's schedule, without processes


def _work(name: str, world: int, zigzag: bool, tile: int | None = None, **sizes) -> list[int]:
    spec = indexattn.compile_spec(name)
    return work(spec.ir, spec.sequence_plan(), sizes, world, zigzag, tile)


@pytest.mark.parametrize("world", [2, 4])
def test_zigzag_balances_a_causal_mask_and_a_contiguous_split_does_not(world):
    sizes = {"N": 64, "d_m": 8, "h": 2, "d_k": 4, "tile": 4}
    zigzag = _work("mha", world, True, **sizes)
    contiguous = _work("mha", world, False, **sizes)
    assert len(set(zigzag)) == 1, zigzag  # every rank computes as many scores
    assert contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1], contiguous
    assert sum(zigzag) == sum(contiguous) < world * (64 // world) * 64  # masked tiles skipped


def test_a_sliding_window_reads_only_its_neighbours():
    sizes = {"N": 64, "d_in": 8, "d_out": 8, "h": 2, "d_k": 4, "w": 8}
    found = _work("sliding_window", 4, False, **sizes)
    # its own block, and the window's 8 keys of the one before (the span cut by quarter tiles)
    assert found == [16 * 16] + [16 * 16 + 16 * 8] * 3
    assert _work("mha", 4, False, **{**sizes, "d_m": 8}) == [256, 512, 768, 1024]  # no window


def test_chunks_that_do_not_divide_name_the_sizes():
    with pytest.raises(ValueError, match=r"a sequence of 12 positions .* 8 equal chunks"):
        ring.chunks(12, 4, zigzag=True)
    assert ring.chunks(8, 2, zigzag=True) == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]


DOCS, WINDOW = context_worker.DOCS, context_worker.WINDOW
SEES = {  # the launch's masks: the part read off positions (the ring skips by it), and all
    "doc_mask": (lambda t, s: s <= t, lambda t, s: DOCS[t] == DOCS[s]),
    "padding": (lambda t, s: s <= t, lambda t, s: DOCS[s] != 2),
    "sliding_window": (lambda t, s: 0 <= t - s < WINDOW, lambda t, s: True),
}


@pytest.mark.parametrize(
    ("world", "name"), [(2, "doc_mask"), (2, "padding"), (2, "sliding_window"), (4, "doc_mask")]
)
def test_the_launch_merges_tiles_where_a_row_sees_no_key(world, name):
    """The ring checks' "no NaN" means something: some tile pair the ring computes (one the
    positions do not hide) holds a query that sees none of its keys."""
    spans = ring.chunks(context_worker.N, world, zigzag=True)
    blocks = [[range(a, b) for a, b in mine] for mine in spans]
    placed, visible = SEES[name]
    empty = [
        (q, k)
        for q, k in itertools.product(itertools.chain(*blocks), repeat=2)
        if any(placed(t, s) for t in q for s in k)
        and any(not any(placed(t, s) and visible(t, s) for s in k) for t in q)
    ]
    assert empty, name


def test_a_fully_masked_row_has_log_sum_exp_minus_infinity_and_no_nan_gradient():
    import torch

    x = torch.tensor([[0.5, -torch.inf], [-torch.inf, -torch.inf]], requires_grad=True)
    found = ring.lse(x, (-1,))
    assert found[1, 0] == -torch.inf and abs(found[0, 0] - 0.5) < 1e-7
    merged = ring.merge_lse(found, torch.full_like(found, -torch.inf))
    merged.sum().backward()  # a row of -inf only: gradient 0 (torch's SDPA says lse = 0.0)
    assert not x.grad.isnan().any() and x.grad[0, 0] == 1.0
