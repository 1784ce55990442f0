"""The ring's block map with document ids (indexattn/parallel/sequence.py BlockMap, the ring's
read_ids): a mask that compares integer inputs read at the query and the key index skips the
tile pairs whose ids cannot meet, bounded exactly (Python integers, whatever their size), and
the tile is chosen for a window. One rank, zig-zag chunks of 6, tiles of 2 unless chosen; every
case equals one process to 1e-12 in float64, values and gradients (test_ring_tiles.py's check),
and its twin changes one thing and sees the difference. On 2 and 4 ranks:
test_context_parallel.py (slow tier, `ring_documents`)."""

from __future__ import annotations

import pytest
import test_ring_tiles
import torch
from test_ring_tiles import EXACT, MOVED, N, _module

from indexattn.parallel import ring, sequence
from indexattn.parallel.sequence import ZIGZAG, Tile

BOUNDARY = [0] * 6 + [1] * 6  # a document ends where the tile [4, 5] does
STRADDLING = [0] * 5 + [1] * 7  # the second starts inside the tile [4, 5]


def _run(name: str, ids=None, tile=2, n: int = N):
    """The one rank's ring and one process on the same inputs: (gaps, the ring's run)."""
    spec, layer = _module(name)
    torch.manual_seed(1)
    xs = {"X": torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True)}
    if ids is not None:
        xs["D"] = torch.tensor(ids).expand(2, n).contiguous()
    params = list(layer.parameters())
    one = layer(**xs)
    grads = torch.autograd.grad(one.sum(), [xs["X"], *params])
    setup = {"group": None, "rank": 0, "world": 1, "layout": ZIGZAG, "tile": tile}
    setup |= {"sizes": layer.sizes, "scalars": dict(layer.scalars), "training": False}
    arguments = {**xs, **dict(layer.named_parameters())}
    (split,), run = ring.forward(spec.ir, spec.sequence_plan("τ"), arguments, setup)
    split_grads = torch.autograd.grad(split.sum(), [xs["X"], *params])
    gaps = {
        "out": (split - one).abs().max().item(),
        "grad": max(  # relative where a gradient sums over many positions
            ((a - b).abs().max() / b.abs().max().clamp(min=1)).item()
            for a, b in zip(split_grads, grads)
        ),
    }
    return gaps, run


def _exact(gaps: dict) -> bool:
    return gaps["out"] < EXACT and gaps["grad"] < EXACT


def test_a_tile_pair_between_documents_is_skipped_and_equals_one_process():
    gaps, run = _run("doc_mask", BOUNDARY)
    assert _exact(gaps), gaps
    assert run.map.hides(Tile(0, 6, 2), Tile(0, 4, 2))  # doc 1's queries, doc 0's keys
    # positions alone skip only the causal triangle's pairs: 21 of 36 pairs of 2 × 2 are read
    assert run.counts["work"] == 4 * (6 + 6) < 4 * 21


def test_twin_a_document_across_the_tile_boundary_keeps_the_pair():
    gaps, run = _run("doc_mask", STRADDLING)
    assert _exact(gaps), gaps
    assert not run.map.hides(Tile(0, 6, 2), Tile(0, 4, 2))  # position 5 is doc 1's
    assert run.counts["work"] == 4 * (1 + 2 + 3 + 2 + 3 + 4)


@pytest.fixture
def unshared_maps():
    """A test that patches BlockMap's methods builds its own block maps and leaves none
    behind (a call's block map of positions is kept per kind of call: ring._block_map)."""
    ring._block_map.cache_clear()
    yield
    ring._block_map.cache_clear()


def test_twin_a_pair_skipped_that_the_documents_need_changes_the_result(monkeypatch, unshared_maps):
    seen = sequence.BlockMap.seen

    def fewer(self, rank, src):  # doc 1's last keys hidden from its first queries
        return [(q, k) for q, k in seen(self, rank, src) if (q.start, k.start) != (6, 6)]

    monkeypatch.setattr(sequence.BlockMap, "seen", fewer)
    gaps, _ = _run("doc_mask", BOUNDARY)
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


@pytest.mark.parametrize("base", [2**53, 2**62])
def test_ids_near_2_53_and_2_62_skip_as_small_ids_do(base):
    """Documents base, base + 1, base + 2: in float64 base and base + 1 are one number."""
    small = _run("doc_mask", [0] * 4 + [1] * 4 + [2] * 4)[1].counts["work"]
    gaps, run = _run("doc_mask", [base] * 4 + [base + 1] * 4 + [base + 2] * 4)
    assert _exact(gaps), gaps
    assert run.counts["work"] == small == 4 * (3 + 3 + 3)  # 2 tiles a document


@pytest.mark.parametrize("base", [2**53, 2**62])
def test_twin_ids_bounded_in_float64_merge_and_skip_less(base, monkeypatch):
    bounds = ring._bounds
    monkeypatch.setattr(ring, "_bounds", lambda ids, grain: bounds(ids.double(), grain))
    gaps, run = _run("doc_mask", [base] * 4 + [base + 1] * 4 + [base + 2] * 4)
    assert _exact(gaps), gaps  # skipping less is still exact
    assert run.counts["work"] > 4 * 9


def test_a_window_s_tile_is_chosen_for_it_and_equals_one_process():
    """attention_sinks' window of 3 at N = 1024: zig-zag chunks of 512 cut into tiles of 256
    (the block map's choice for the window: 7 tile pairs a pass, where tiles of 128 make 15
    and chunks 3 of four times the scores), not a chunk. Each query tile's key tile before
    its diagonal one is cut to its last quarter, the 64 keys the window reaches, and joined
    to it (BlockMap.spans): 4 tile pairs, one diagonal tile alone (the first of the
    sequence)."""
    gaps, run = _run("attention_sinks", tile=None, n=1024)
    assert _exact(gaps), gaps
    assert run.counts["tile"] == 256
    assert run.counts["work"] == 256 * (256 + 3 * (64 + 256))  # one pass: L its log-sum-exp


def test_twin_a_span_cut_past_the_window_s_first_key_differs(monkeypatch, unshared_maps):
    """The spans of the test above, each joined one cut to the diagonal tile and one key
    before it: of the two keys of the tile before that the window of 3 reaches, the first is
    left out, and the values and gradients move."""
    spans = sequence.BlockMap.spans

    def late(self, rows, src, pairs):
        found = spans(self, rows, src, pairs)
        return [
            (q, Tile(k.offset + k.length - 257, k.start + k.length - 257, 257))
            if k.length > 256
            else (q, k)
            for q, k in found
        ]

    monkeypatch.setattr(sequence.BlockMap, "spans", late)
    gaps, _ = _run("attention_sinks", tile=None, n=1024)
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


def test_twin_a_window_of_every_key_keeps_the_chunk(monkeypatch):
    source, sizes = test_ring_tiles.SPECS["attention_sinks"]
    monkeypatch.setitem(test_ring_tiles.SPECS, "attention_sinks", (source, {**sizes, "w": 1024}))
    gaps, run = _run("attention_sinks", tile=None, n=1024)
    assert _exact(gaps), gaps
    assert run.counts["tile"] == 512


def test_the_count_says_a_document_mask_s_work_is_an_upper_bound():
    spec, _ = _module("doc_mask")
    sizes = {s: 4096 if a == "N" else 8 for s, a in spec.ir.size_names.items()}
    lines = sequence.work_lines(spec.ir, spec.sequence_plan("τ"), sizes, 2)
    assert any("an upper bound: the mask reads D" in line for line in lines), lines
    # the twin: a window's work is no bound, and its tile is chosen
    spec, _ = _module("attention_sinks")
    sizes = {s: 4096 if a == "N" else 2 for s, a in spec.ir.size_names.items()}
    lines = sequence.work_lines(spec.ir, spec.sequence_plan("τ"), sizes, 2)
    assert not any("upper bound" in line for line in lines), lines
    assert "  tiles: 256 positions, chosen for the mask's window (tile= overrides)" in lines


TWO_MASKS = """
index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
input D_<τ> : int
param Wq_<(μa)i>
param Wk_<(μa)i>
param Wv_<(μa)i>
scalar w = 3
Q_<μτa> = Wq_<(μa)i> X_<τi>
K_<μτa> = Wk_<(μa)i> X_<τi>
V_<μτa> = Wv_<(μa)i> X_<τi>
L_<μττ'> = Q_<μτa> K_<μτ'a> + where(τ' > τ or τ - τ' >= w, -inf, 0)
G_<μττ'> = Q_<μτa> K_<μτ'a> + where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)
O_<μτa> = softmax_<τ'>(L_<μττ'>) V_<μτ'a>
P_<μτa> = softmax_<τ'>(G_<μττ'>) V_<μτ'a>
Y_<τμa> = O_<μτa> + P_<μτa>
output Y
"""  # a local and a document-wide head side by side: two masks in one block map


@pytest.mark.parametrize(("ids", "pairs"), [(BOUNDARY, 13), ([0] * N, 21)])
def test_two_masks_skip_the_pairs_both_hide(ids, pairs, monkeypatch):
    """The window keeps a query tile's own and the one before (11 pairs), the documents the
    pairs inside each (12): a pair is skipped where both hide it, 13 read a pass. The twin,
    one document: the causal triangle's 21."""
    sizes = {"d_m": 8, "h": 2, "d_k": 3}
    monkeypatch.setitem(test_ring_tiles.SPECS, "two_masks", (TWO_MASKS, sizes))
    gaps, run = _run("two_masks", ids)
    assert _exact(gaps), gaps
    assert run.counts["work"] == 2 * 4 * pairs  # two passes of 2 × 2 tile pairs
