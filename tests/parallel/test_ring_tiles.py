"""The ring's tile pairs through each pass's compiled tile spec (indexattn/parallel/tiles.py),
in one process: ring.forward on one rank with tiles of 2 positions merges many tile pairs by
their row statistics, and must equal the spec's compiled one-process call, values and
gradients, in float64. The launches on 2 and 4 ranks (test_context_parallel.py, slow tier)
run the same cores."""

from __future__ import annotations

from pathlib import Path

import context_worker
import numpy as np
import pytest
import sympy
import torch

import indexattn
from indexattn.parallel import ring, tiles
from indexattn.parallel.sequence import ZIGZAG, ring_form, ring_passes
from indexattn.runtime import flash

EXACT, MOVED = 1e-12, 1e-6
ROOT = Path(__file__).resolve().parents[2]
N = 12  # zig-zag chunks of 6 on one rank, tiles of 2: 36 tile pairs, some all hidden

UNSEEN = """
index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
param Wq_<(μa)i>
param Wk_<(μa)i>
param Wv_<(μa)i>
param g_<μ>
scalar m = 0.3
scalar w = 5
Q_<μτa> = Wq_<(μa)i> X_<τi>
K_<μτa> = Wk_<(μa)i> X_<τi>
V_<μτa> = Wv_<(μa)i> X_<τi>
M_<ττ'> = where(τ' > τ or τ - τ' >= w, -inf, -m (τ - τ'))
S_<μττ'> = 2 tanh(Q_<μτa> K_<μτ'a> / 2) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>) sigmoid(g_<μ>)
O_<μτa> = A_<μττ'> V_<μτ'a>
P_<μτ> = max_<τ'>(S_<μττ'>)
Y_<τμa> = O_<μτa> + P_<μτ>
output Y
"""  # ALiBi-like distances beside a window, a soft cap, a gate per head, a max over the keys

WINDOW = """
index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
param Wq_<(μa)i>
param Wk_<(μa)i>
param Wv_<(μa)i>
scalar w = 3
Q_<μτa> = Wq_<(μa)i> X_<τi>
K_<μτa> = Wk_<(μa)i> X_<τi>
V_<μτa> = Wv_<(μa)i> X_<τi>
M_<ττ'> = where(τ' > τ + 1 or τ - τ' >= w, -inf, 0)
S_<ττ'μ> = Q_<μτa> K_<μτ'a> / 2 + M_<ττ'>
A_<ττ'μ> = softmax_<τ'>(S_<ττ'μ>)
Y_<τaμ> = A_<ττ'μ> V_<μτ'a>
output Y
"""  # SDPA-shaped, a window one key ahead: tile rows that see no key, tiles half seen, axes moved

MEAN = UNSEEN.replace("P_<μτ> = max_<τ'>(S", "P_<μτ> = mean_<τ'>(A")  # the interpreter's

SPECS = {
    "mha": ("mha", {"d_m": 8, "h": 2, "d_k": 3}),
    "softcap_window": (
        "softcap_window",
        {"d_m": 8, "h": 2, "d_k": 3, "c": 1.0, "w": 3, "query_pre_attn_scalar": 3},
    ),
    "doc_mask": ("doc_mask", {"d_m": 8, "h": 2, "d_k": 3}),
    "attention_sinks": ("attention_sinks", {"d_m": 8, "h_kv": 2, "n_rep": 2, "d_k": 3, "w": 3}),
    "unseen": (UNSEEN, {"d_m": 8, "h": 2, "d_k": 3}),
    "gqa": ("gqa", {"d_m": 8, "h_kv": 2, "n_rep": 2, "d_k": 3}),
    "window": (WINDOW, {"d_m": 8, "h": 2, "d_k": 3}),
    "mean": (MEAN, {"d_m": 8, "h": 2, "d_k": 3}),
    # a chunk of 3: ⌊τ/C⌋ bounded with C a float read 3 as 0 (0.333… τ): pairs hidden wrongly
    "chunked": ("chunked", {"d_m": 8, "h_kv": 2, "n_rep": 2, "d_k": 3, "C": 3}),
    # the sequence's length read as a number in the scores (- log N): a scalar of the tile spec
    "sigmoid_attention": ("sigmoid_attention", {"d_m": 8, "h": 2, "d_k": 3}),
    # a prefix of 5 keys every query sees: `or` of a term of the keys alone (k < P)
    "prefix_lm": ("prefix_lm", {"d_m": 8, "h": 2, "d_k": 3, "P": 5}),
    # a mask read from an integer input on the key side alone: the kernel's mask (Terms)
    "padding": (context_worker.PADDED, {"d_m": 8, "h": 2, "d_k": 3}),
}


def _module(name: str):
    source, sizes = SPECS[name]
    spec = indexattn.compile_spec(source, name=None if source == name else name)
    torch.manual_seed(0)
    layer = spec.module(**sizes).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return spec, layer


def _inputs(spec) -> dict:
    torch.manual_seed(1)
    xs = {"X": torch.randn(2, N, 8, dtype=torch.float64, requires_grad=True)}
    if "D" in spec.arguments:  # documents straddling the zig-zag chunks
        xs["D"] = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 2 + [1] * 10])
    if "P" in spec.arguments:  # padding (2) at the end, two and five positions of it
        xs["P"] = torch.tensor([[0] * 10 + [2] * 2, [1] * 7 + [2] * 5])
    return xs


def _ring(spec, layer, xs: dict, training: bool = False) -> torch.Tensor:
    """This one rank's ring over zig-zag chunks, in the layout's order: positions 0 … 5, then
    6 … 11 (ZIGZAG at one rank is the whole sequence, in order)."""
    arguments = {**xs, **dict(layer.named_parameters())}
    setup = {
        "group": None,
        "rank": 0,
        "world": 1,
        "layout": ZIGZAG,
        "tile": 2,
        "sizes": layer.sizes,
        "scalars": dict(layer.scalars),
        "training": training,
    }
    return ring.forward(spec.ir, spec.sequence_plan("τ"), arguments, setup)[0][0]


def _gaps(name: str) -> dict:
    spec, layer = _module(name)
    xs = _inputs(spec)
    one = layer(**xs)
    grads = torch.autograd.grad(one.sum(), [xs["X"], *layer.parameters()])
    split = _ring(spec, layer, xs)
    split_grads = torch.autograd.grad(split.sum(), [xs["X"], *layer.parameters()])
    return {
        "out": (split - one).abs().max().item(),
        "grad": max((a - b).abs().max().item() for a, b in zip(split_grads, grads)),
    }


@pytest.mark.parametrize("name", [*SPECS])
def test_tile_pairs_merged_equal_one_process(name):
    gaps = _gaps(name)
    assert gaps["out"] < EXACT and gaps["grad"] < EXACT, gaps


TWINS = [
    "mha",
    "softcap_window",
    "doc_mask",
    "attention_sinks",
    "unseen",
    "gqa",
    "window",
    "chunked",
    "sigmoid_attention",
    "prefix_lm",
]


@pytest.mark.parametrize("name", TWINS)
def test_twin_a_key_tile_at_the_wrong_global_position_is_seen(name, monkeypatch):
    given = tiles.TileCore.given

    def shifted(self, sizes, scalars, q0, k0):  # every key tile one position late
        return given(self, sizes, scalars, q0, k0 + 1)

    monkeypatch.setattr(tiles.TileCore, "given", shifted)
    gaps = _gaps(name)
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


COMPILED = ["mha", "softcap_window", "doc_mask", "attention_sinks", "unseen", "sigmoid_attention"]


@pytest.mark.parametrize("name", COMPILED)
def test_every_pass_of_the_four_and_an_unseen_spec_is_compiled(name):
    spec, _ = _module(name)
    lines = tiles.plan_lines(spec.ir, spec.sequence_plan("τ"))
    assert len(lines) > 1 and all("compiled tile spec" in line for line in lines[1:]), lines


def test_a_pass_the_tile_spec_cannot_take_is_named_in_the_plan():
    spec, _ = _module("mean")
    lines = tiles.plan_lines(spec.ir, spec.sequence_plan("τ"))
    assert any("literal interpreter, slow (mean over a key index" in line for line in lines)
    assert any("compiled tile spec" in line for line in lines), lines  # O's pass is compiled


FLASHED = {"mha": True, "gqa": True, "window": True, "softcap_window": False, "unseen": False}
FLASHED |= {"doc_mask": True, "padding": True}  # masks read off integer inputs (Terms)


@pytest.mark.parametrize("name", [*FLASHED])
def test_an_sdpa_shaped_core_runs_through_the_flash_kernel_and_says_so(name, monkeypatch):
    calls = []
    kernel = flash.attention_lse

    def counted(*args):
        calls.append(args[4])  # causal: a diagonal tile under a causal mask
        return kernel(*args)

    monkeypatch.setattr(flash, "attention_lse", counted)
    spec, layer = _module(name)
    _ring(spec, layer, _inputs(spec)).sum().backward()
    assert bool(calls) == FLASHED[name]
    assert any(calls) == (name in ("mha", "gqa", "doc_mask"))  # doc_mask: inside a document
    lines = tiles.plan_lines(spec.ir, spec.sequence_plan("τ"))
    assert any("SDPA's kernel" in line for line in lines) == FLASHED[name], lines


KEPT = {"mha": True, "gqa": True, "softcap_window": True, "doc_mask": True}
KEPT |= {"attention_sinks": True, "unseen": True, "mean": False}  # mean: a mean of A


@pytest.mark.parametrize("name", [*KEPT])
def test_a_softmax_core_makes_its_gradients_from_the_rows_and_says_so(name, monkeypatch):
    """FlashAttention's ring backward: each tile pair's gradients from the rows' merged output
    and log-sum-exp (no autograd graph kept over the merge); the others by autograd."""
    pairs = []
    made = ring._Kept.pair

    def counted(self, *args):
        pairs.append(args[:2])
        return made(self, *args)

    monkeypatch.setattr(ring._Kept, "pair", counted)
    spec, layer = _module(name)
    _ring(spec, layer, _inputs(spec)).sum().backward()
    assert bool(pairs) == KEPT[name]
    lines = tiles.plan_lines(spec.ir, spec.sequence_plan("τ"))
    assert any("gradients from the rows'" in line for line in lines) == KEPT[name], lines


def test_a_sink_s_logsumexp_is_its_pass_s_statistic_and_its_gradient_counts(monkeypatch):
    """attention_sinks' L = logsumexp(S) is the online pass's merged log-sum-exp (its σ(L − s)
    taken out of the sum: one pass over K and V, not two), and L's gradient enters each tile
    pair's backward (D − dL); the twin drops it and the gradients move."""
    spec, _ = _module("attention_sinks")
    passes = [p for each in ring_passes(spec.ir, spec.sequence_plan("τ")).values() for p in each]
    assert len(passes) == 1 and passes[0].statistic is not None
    assert set(passes[0].travels) == {"K", "V"}
    assert _gaps("attention_sinks")["grad"] < EXACT
    backward = ring._KeptPass.backward

    def dropped(ctx, g_token, g_value, g_lse):
        return backward(ctx, g_token, g_value, None)

    monkeypatch.setattr(ring._KeptPass, "backward", staticmethod(dropped))
    assert _gaps("attention_sinks")["grad"] > MOVED


def test_a_diagonal_tile_past_one_block_of_rows_is_read_as_causal():
    """The mask kind of a tile pair (tiles._kind), compared by blocks of rows: a causal keep
    on a diagonal tile of 600 (three blocks) is the triangle; the twin, one key ahead, is a
    mask; a tile pair the predicate holds on whole needs none."""
    q, k = sympy.symbols("q k", integer=True)
    causal, ahead = k <= q, k <= q + 1
    assert tiles._kind(causal, (q, k), 1200, 600, 1200, 600) == "causal"
    assert tiles._kind(ahead, (q, k), 1200, 600, 1200, 600) == "mask"
    assert tiles._kind(sympy.And(causal, k > q - 300), (q, k), 0, 600, 0, 600) == "mask"
    assert tiles._kind(causal, (q, k), 1200, 600, 0, 600) == "all"


def test_a_window_s_mask_is_read_at_the_tiles_distance_and_a_chunk_s_is_not():
    """A keep predicate of q − k alone (a window) gives tile pairs as far apart one mask, made
    once (tiles._relative); a chunk's ⌊q/C⌋ = ⌊k/C⌋ is not of q − k: two pairs as far apart
    differ, and each gets its own (the twin: read at their distance, one would be wrong)."""
    q, k = sympy.symbols("q k", integer=True)
    window = sympy.And(k <= q, q - k < 5)
    chunk = sympy.Eq(sympy.floor(q / 4), sympy.floor(k / 4))
    assert tiles._relative(window, (q, k)) and not tiles._relative(chunk, (q, k))
    core = tiles.FlashCore(*[None] * 5, keep=None, positions=(q, k), offsets=(), out=(), lse=())

    def mask(keep, q0):  # a tile pair of 6 by 6, its keys 3 positions before its queries
        return core.mask(keep, q0, 6, q0 - 3, 6, torch.float64, "cpu")[0]

    assert mask(window, 3) is mask(window, 9)
    assert torch.equal(mask(window, 9).isneginf(), torch.from_numpy(~grid_seen(window, 9)))
    assert not torch.equal(mask(chunk, 3), mask(chunk, 9))
    assert torch.equal(mask(chunk, 9).isneginf(), torch.from_numpy(~grid_seen(chunk, 9)))


RELATIVE = {"softcap_window": True, "window": True, "unseen": True, "doc_mask": True}
RELATIVE |= {"chunked": False}  # ⌊(q0 + τ)/C⌋: a chunk's mask moves with the tiles, not by q0 − k0


@pytest.mark.parametrize("name", [*RELATIVE])
def test_a_tile_spec_reading_positions_as_their_distance_is_called_at_it(name):
    """Where every number a tile spec computes from positions is a function of q0 − k0 (a
    window, ALiBi's distances, causal beside document ids), tile pairs as far apart are one
    kind of call: the same sizes and scalars, their tables made once (TileSpec); a chunk's
    mask is not, and each pair keeps its own positions."""
    spec, layer = _module(name)
    plan = spec.sequence_plan("τ")
    form = ring_form(spec.ir, plan)
    cores = [tiles.core(form, plan, p) for ps in ring_passes(spec.ir, plan).values() for p in ps]
    symbols = {s for i in spec.ir.indices for s in i.size.free_symbols}
    sizes = {s: layer.sizes.get(spec.ir.size_ascii(s), N) for s in symbols}
    scalars = tiles.defaults(spec.ir)
    for core in cores:
        assert core.relative is RELATIVE[name]
        near, far = (core.given(sizes, scalars, q0, 2) for q0 in (6, 10))
        shifted = core.given(sizes, scalars, 10, 6)
        assert (near == shifted) is RELATIVE[name] and near != far


def test_twin_a_chunk_s_tiles_called_at_their_distance_are_seen(monkeypatch):
    """The twin: a chunked spec's tile pairs called at their distance, as a window's are,
    put keys in the wrong chunks."""
    monkeypatch.setattr(tiles, "_offsets_relative", lambda spec: True)
    tiles.core.cache_clear()
    try:
        gaps = _gaps("chunked")
    finally:
        tiles.core.cache_clear()
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


def grid_seen(keep, q0):
    q, k = sympy.symbols("q k", integer=True)
    return sympy.lambdify((q, k), keep)(
        np.arange(q0, q0 + 6)[:, None], np.arange(q0 - 3, q0 + 3)[None, :]
    )


DROPPED = WINDOW.replace("scalar w = 3", "scalar w = 3\nscalar p = 0").replace(
    "Y_<τaμ> = A_<ττ'μ> V_<μτ'a>", "B_<ττ'μ> = dropout(A_<ττ'μ>, p)\nY_<τaμ> = B_<ττ'μ> V_<μτ'a>"
)  # a transformers core's dropout, 0 by default
CAPPED = DROPPED.replace("Q_<μτa> K_<μτ'a> / 2", "2 tanh(Q_<μτa> K_<μτ'a> / 4)")


@pytest.mark.parametrize("source", [DROPPED, CAPPED], ids=["sdpa", "softcap"])
@pytest.mark.parametrize(("p", "training"), [(0.0, True), (0.5, False), (0.5, True)])
def test_a_dropout_that_draws_nothing_runs_the_kernel_and_one_that_draws_does_not(
    source, p, training, monkeypatch
):
    """A dropout of probability 0, or out of training, draws nothing: the tile pairs run the
    kernel (SDPA's, or the one-step softmax) with their gradients from the rows, and equal
    one process; in training at p = 0.5 (the twin) they run the compiled tile spec, which
    draws it: the output moves from the undropped one."""
    pairs = []
    made = ring._Kept.pair
    monkeypatch.setattr(ring._Kept, "pair", lambda self, *a: pairs.append(1) or made(self, *a))
    spec = indexattn.compile_spec(source, name="dropped")
    torch.manual_seed(0)
    layer = spec.module(d_m=8, h=2, d_k=3, p=p).double().train(training)
    xs = _inputs(spec)
    split = _ring(spec, layer, xs, training)
    split.sum().backward()
    assert bool(pairs) == (p == 0 or not training)
    undropped = layer.train(False)(**xs)
    if p == 0 or not training:
        assert (split - undropped).abs().max() < EXACT
    else:
        assert (split - undropped).abs().max() > MOVED


SINK = (ROOT / "specs" / "attention_sinks.attn").read_text()
SINK_DROPPED = SINK.replace("scalar w = 128", "scalar w = 128\nscalar p = 0").replace(
    "O_<grτa>  = A_<grττ'> V", "Ã_<grττ'> = dropout(A_<grττ'>, p)\nO_<grτa>  = Ã_<grττ'> V"
)  # GPT-OSS's core as transformers writes it: a dropout of the weights, 0 by default
SINK_TWICE = SINK_DROPPED.replace(
    "O_<grτa>  = Ã_<grττ'> V_<gτ'a>", "O_<grτa>  = Ã_<grττ'> V_<gτ'a> + max_<τ'>(A_<grττ'>)"
)  # A read again: its row factor cannot leave the sum


@pytest.mark.parametrize(("source", "fused"), [(SINK_DROPPED, True), (SINK_TWICE, False)])
def test_a_sink_s_row_factor_leaves_the_sum_through_a_dropout(source, fused):
    """Through `Ã = dropout(A, p)` the sink's σ(L − s) is taken out of the sum as without a
    dropout: one pass over K and V, on SDPA's kernel, equal to one process; where A is read
    again (the twin) it stays, and the sink's logsumexp takes a pass of its own."""
    spec = indexattn.compile_spec(source, name="sink_dropped")
    plan = spec.sequence_plan("τ")
    found = [p for each in ring_passes(spec.ir, plan).values() for p in each]
    assert any(p.statistic is not None for p in found) == fused
    lines = tiles.plan_lines(spec.ir, plan)
    assert any("L over K, V" in line and "SDPA's kernel" in line for line in lines) == fused
    torch.manual_seed(0)
    sizes = {"d_m": 8, "h_kv": 2, "n_rep": 2, "d_k": 3, "w": 3}
    layer = spec.module(**sizes).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    xs = _inputs(spec)
    one = layer(**xs)
    grads = torch.autograd.grad(one.sum(), [xs["X"], *layer.parameters()])
    split = _ring(spec, layer, xs, training=True)
    split_grads = torch.autograd.grad(split.sum(), [xs["X"], *layer.parameters()])
    assert (split - one).abs().max() < EXACT
    assert max((a - b).abs().max() for a, b in zip(split_grads, grads)) < EXACT


def test_twin_a_document_mask_left_out_of_the_kernel_is_seen(monkeypatch):
    """doc_mask's tile pairs run SDPA's kernel with the mask its document ids make
    (tiles.Terms, documents straddling the tiles and differing per batch element); the mask
    left out, the values move."""
    assert tiles.core(*_pass_of("doc_mask")).flash.terms is not None
    monkeypatch.setattr(tiles.Terms, "__call__", lambda self, *args: None)
    gaps = _gaps("doc_mask")
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


def _pass_of(name: str) -> tuple:
    spec, _ = _module(name)
    plan = spec.sequence_plan("τ")
    run = ring_form(spec.ir, plan)
    (each,) = [p for passes in ring_passes(run, plan).values() for p in passes]
    return run, plan, each


def test_a_tile_pair_inside_one_document_makes_no_mask_from_the_ids(monkeypatch):
    """Where each tile's document ids are one number (over the whole batch), the keep
    predicate with that number put in is on positions alone: the kernel runs causal on a
    diagonal tile and unmasked below it, no mask made from the ids; a pair whose tiles
    straddle documents gets the ids' mask; the values are one process's."""
    kernel, made, terms = flash.attention_lse, [], tiles.Terms.__call__
    calls = []

    def counted(*args):  # (q, k, v, mask, causal, scale)
        calls.append((args[3] is None, args[4]))
        return kernel(*args)

    def making(self, *args):
        made.append(args)
        return terms(self, *args)

    monkeypatch.setattr(flash, "attention_lse", counted)
    monkeypatch.setattr(tiles.Terms, "__call__", making)
    spec, layer = _module("doc_mask")
    ids = torch.tensor([[0] * 6 + [1] * 6, [0] * 5 + [1] * 7])  # tile (4, 5) straddles
    xs = {**_inputs(spec), "D": ids}
    gap = (_ring(spec, layer, xs) - layer(**xs)).abs().max().item()
    assert (True, True) in calls and (True, False) in calls  # causal, and no mask at all
    assert 0 < len(made) < len(calls) and gap < EXACT


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
scalar w = 4
Q_<μτa> = Wq_<(μa)i> X_<τi>
K_<μτa> = Wk_<(μa)i> X_<τi>
V_<μτa> = Wv_<(μa)i> X_<τi>
C_<ττ'> = where(τ' > τ or τ - τ' >= w, -inf, 0)
M_<ττ'> = where(D_<τ> != D_<τ'>, -inf, 0)
S_<μττ'> = Q_<μτa> K_<μτ'a> / 2 + C_<ττ'> + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
Y_<τμa> = A_<μττ'> V_<μτ'a>
output Y
"""  # a window and the documents as two terms of the scores: a mask of positions beside the ids'


def test_a_window_beside_document_ids_inside_one_document_is_the_window_alone(monkeypatch):
    """Two mask terms, one of positions (a window, folded to a field) and one of the ids:
    inside one document the window's keep predicate alone, read at the tiles' distance (no
    mask made from the ids); the values are one process's."""
    kernel, calls = flash.attention_lse, []

    def counted(*args):  # (q, k, v, mask, causal, scale)
        calls.append((args[3] is None, args[4]))
        return kernel(*args)

    monkeypatch.setattr(flash, "attention_lse", counted)
    spec = indexattn.compile_spec(TWO_MASKS, name="two_masks")
    torch.manual_seed(0)
    layer = spec.module(d_m=8, h=2, d_k=3).double()
    xs = {**_inputs(spec), "D": torch.tensor([[0] * 6 + [1] * 6, [0] * 5 + [1] * 7])}
    gap = (_ring(spec, layer, xs) - layer(**xs)).abs().max().item()
    assert gap < EXACT and (True, True) in calls and (True, False) in calls, (gap, calls)


def test_twin_ids_read_as_one_number_where_they_straddle_documents_are_seen(monkeypatch):
    """The twin: every tile's ids read as one number, 0, whether or not they are, let queries
    see keys of other documents."""

    def one(self, given):
        return tiles._put(self.keep, tuple((symbol, 0) for symbol, _ in self.ids))

    monkeypatch.setattr(tiles.Terms, "constant", one)
    gaps = _gaps("doc_mask")
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, gaps


def test_document_ids_with_a_batch_the_tokens_lack_equal_one_process():
    """X of batch 1 and two rows of document ids: one process's output has batch 2, and so
    has the ring's, each row of ids masking its own element (tiles.Terms.batch); the twin
    gives the ring the rows swapped, and the values move."""
    spec, layer = _module("doc_mask")
    torch.manual_seed(1)
    x = torch.randn(1, N, 8, dtype=torch.float64, requires_grad=True)
    ids = _inputs(spec)["D"]
    one = layer(X=x, D=ids)
    grads = torch.autograd.grad(one.sum(), [x, *layer.parameters()])
    split = _ring(spec, layer, {"X": x, "D": ids})
    split_grads = torch.autograd.grad(split.sum(), [x, *layer.parameters()])
    assert split.shape == one.shape == (2, N, 8)
    assert (split - one).abs().max() < EXACT
    assert max((a - b).abs().max() for a, b in zip(split_grads, grads)) < EXACT
    swapped = _ring(spec, layer, {"X": x, "D": ids.flip(0)})
    assert (swapped - one).abs().max() > MOVED
