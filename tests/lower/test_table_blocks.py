"""Tables over two sequence indices made per block of rows from their positions, never whole
(passes/tables.py): at N = 512 and two heads, with 32 queries a block, a forward allocates no
tensor of N² elements: not a mask (sliding_window through the attention kernel,
softcap_window through its rows' function, doc_mask's from document ids on every call), not a
bias (ALiBi's of h·N², T5's learned bias gathered at bucket ids), not a decay (the forgetting
transformer's C_<μτ> − C_<μτ'>). Each equals the literal interpreter. The twins, with the pass
finding no table, build the N² table (and still equal it). `indexattn compile SPEC
--dump-after tables` names the tables."""

import contextlib
import itertools
from pathlib import Path

import pytest
import torch
from test_derive import Widest

import indexattn
from indexattn.cli import main
from indexattn.lower.printers import tables_emit
from indexattn.lower.program.passes import tables
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
N, HEADS = 512, 2
FRESH = itertools.count()
# the spec, its scalars: a window that hides most keys, a cap
KINDS = {
    "sliding_window": {"w": 64},  # a mask, the kernel's
    "softcap_window": {"w": 64, "c": 5.0},  # a mask, read by the rows' function
    "alibi": {},  # a bias of h·N², the kernel's
    "t5_bias": {},  # bucket ids of positions, a learned bias gathered at them per call
    "doc_mask": {},  # a mask from document ids, per call
    "forgetting": {},  # a decay: differences of a per-call running sum, and a causal mask
}


def widest(name: str, blocked: bool, monkeypatch) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The most elements of a tensor one forward at N = 512 makes, its output, and the
    literal interpreter's; with the pass on (`blocked`) or finding no table."""
    if not blocked:
        monkeypatch.setattr(tables, "wide_constants", lambda program: set())
        monkeypatch.setattr(tables, "per_call_tables", lambda program: set())
    text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
    spec = indexattn.compile_spec(text, name=f"{name}_blocks_{next(FRESH)}")
    namespace = spec.function.__globals__
    monkeypatch.setattr(rt, "QUERY_BLOCK", 32)
    for knob, value in {"BLOCK_SCORES": HEADS * N * 32, "BLOCK_ROWS": 1}.items():
        if knob in namespace:
            monkeypatch.setitem(namespace, knob, value)
    sizes = dict.fromkeys(sample_sizes(spec.ir), 4) | {"N": N, "h": HEADS}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required} | KINDS[name]
    with torch.no_grad(), Widest() as seen:
        out = spec(**args, **given)
    want = reference.evaluate(spec.ir, **args, **given)[0]
    return seen.most, out, want


@pytest.mark.parametrize("name", KINDS)
def test_a_table_made_by_blocks_is_never_whole(name, monkeypatch):
    most, out, want = widest(name, True, monkeypatch)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    assert most < N * N


@pytest.mark.parametrize("name", KINDS)
def test_twin_without_the_pass_builds_the_whole_table(name, monkeypatch):
    most, out, want = widest(name, False, monkeypatch)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    assert most >= N * N


def test_the_dump_names_the_tables(capsys):
    assert main(["compile", str(ROOT / "specs" / "alibi.attn"), "--dump-after", "tables"]) == 0
    dump = capsys.readouterr().out
    assert "\ntables by blocks of rows, from positions: " in dump  # the bias, and its
    assert "[table] Add: S_bias_sum" in dump and "[constant] Grid: m" in dump  # slopes per shape


@pytest.mark.parametrize("name, blocked", [("gpt2", False), ("sliding_window", True)])
def test_a_table_a_call_reads_whole_stays_per_shape(name, blocked, capsys):
    """GPT-2's causal mask is added to scores made whole (its padding mask P_<τ'> too): it
    stays a constant held per shape, and the dump says so; the twin, sliding_window's mask,
    only the kernel reads, by blocks, and nothing of N² is held."""
    assert main(["compile", str(ROOT / "specs" / f"{name}.attn"), "--dump-after", "tables"]) == 0
    dump = capsys.readouterr().out
    assert ("\ntables by blocks of rows" in dump) == blocked
    assert ("[table] Grid" in dump) == blocked
    assert ("(τ, τ') N², read whole" in dump) != blocked


def saved(name: str, recompute: bool, monkeypatch, saving) -> tuple[int, dict]:
    """The elements autograd saves, all together, over a forward at N = 256 (two heads, 32
    queries a block), and the gradients of a backward after it; with each block recomputed
    in the backward, or its scores, weights and mask saved (`recompute` off)."""
    n = 256
    spec = indexattn.compile_spec(
        (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8"),
        name=f"{name}_saved_{next(FRESH)}",
    )
    monkeypatch.setattr(rt, "QUERY_BLOCK", 32)
    sizes = dict.fromkeys(sample_sizes(spec.ir), 4) | {"N": n, "h": HEADS}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    leaves = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
    counts: list[int] = []
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: counts.append(t.numel()) or t, _same)
    with hooks, saving() if not recompute else contextlib.nullcontext():
        out = spec(**leaves, backward="autograd")
    out.square().sum().backward()
    return sum(counts), {k: v.grad for k, v in leaves.items() if v.grad is not None}


def test_a_training_step_recomputes_each_block_of_the_kernel(monkeypatch, saving):
    """T5's bias made by blocks, through the kernel by blocks of queries, under autograd: all
    the step saves is less than one h·N² tensor; the same gradients as with every block's
    mask and weights saved (the twin), which saves more than h·N² in all."""
    blocked, grads = saved("t5_bias", True, monkeypatch, saving)
    whole, want = saved("t5_bias", False, monkeypatch, saving)
    assert blocked < HEADS * 256 * 256 < whole
    for k, grad in want.items():
        torch.testing.assert_close(grads[k], grad, atol=1e-10, rtol=1e-10)


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@pytest.mark.parametrize(
    "name, distance",
    [("t5_bias", True), ("alibi", False), ("doc_mask", False), ("forgetting", False)],
)
def test_a_table_of_the_distance_alone_is_a_row_made_once_a_call(name, distance, monkeypatch):
    """T5's bias reads τ and τ' only through τ' − τ, through a sum and a gather: its blocks
    are gathered from one row over the 2N − 1 distances, made once a call; values and
    gradients by blocks of 32 queries equal those of the twin that makes each block's table
    from its positions (test_spans checks both against the literal). ALiBi's (a product per
    entry, cheaper than a gather), doc_mask's and forgetting's (values read at one position,
    D_<[τ]>, C_<[τ]>) are made per block."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    assert ("_row = " in spec.source) == distance
    if not distance:
        return
    found = []
    for made in ("row", "blocks"):
        if made == "blocks":
            monkeypatch.setattr(tables_emit, "by_distance", lambda steps, dims, indices: False)
        text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
        fresh = indexattn.compile_spec(text, name=f"{name}_distance_{next(FRESH)}")
        assert ("_row = " in fresh.source) == (made == "row")
        monkeypatch.setattr(rt, "QUERY_BLOCK", 32)
        sizes = dict.fromkeys(sample_sizes(fresh.ir), 4) | {"N": 100, "h": HEADS}
        args = sample_arguments(fresh.ir, sizes, (), torch.float64)
        leaves = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
        out = fresh(**leaves, backward="autograd")
        out.square().sum().backward()
        found.append({"out": out, **{k: v.grad for k, v in leaves.items() if v.grad is not None}})
    for k, want in found[1].items():
        torch.testing.assert_close(found[0][k], want, rtol=1e-12, atol=1e-12)
