"""The ring over attention layers drawn at random from their features (tests/lower/combinations.py:
rotary in each phrasing, soft caps, ALiBi, T5 buckets, windows, prefixes, documents, chunks,
sinks, grouped-query heads, masks added or written as fills), not only the shipped specs: each
spec that has a sequence plan runs ring.forward on one rank in tiles of 2 positions (many tile
pairs, some hidden, merged by their row statistics; test_ring_tiles.py) and must equal its
compiled one-process call in values and every gradient, float64. The twin cuts every key tile
one row off, at the same positions, and must see it.

`COMBINATIONS=100 pytest tests/parallel/test_ring_combinations.py` runs seeds 0-99 (the suite:
a few)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch
from test_ring_tiles import EXACT, MOVED, N, _inputs, _ring

import indexattn
from indexattn.parallel import ring
from indexattn.parallel.sequence import Tile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from combinations import draw

SEEDS = range(int(os.environ.get("COMBINATIONS", 8)))
SIZES = {"d_m": 8, "h": 2, "h_kv": 2, "n_rep": 2, "d_k": 3, "d_r": 2}


def _module(seed: int):
    combination = draw(random.Random(seed))
    spec = indexattn.compile_spec(combination.text, name=f"combination_{seed}")
    torch.manual_seed(0)
    sizes = {k: v for k, v in SIZES.items() if k in spec.ir.size_asciis}
    layer = spec.module(**sizes).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return combination, spec, layer


def _gaps(seed: int) -> dict:
    """The ring's largest difference from one process, relative to the largest magnitude: the
    output, and every gradient (a squared loss: gradients up to thousands)."""
    _, spec, layer = _module(seed)
    xs = _inputs(spec)
    leaves = [xs["X"], *layer.parameters()]
    one = layer(**xs)
    want = torch.autograd.grad(one.square().sum(), leaves)
    split = _ring(spec, layer, xs)
    got = torch.autograd.grad(split.square().sum(), leaves)
    return {
        "out": _relative(split, one),
        "grad": max(_relative(a, b) for a, b in zip(got, want)),
    }


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_drawn_layer_on_the_ring_equals_one_process(seed):
    combination, spec, _ = _module(seed)
    assert spec.sequence_plan("τ") is not None, combination.name  # every drawn layer splits
    gaps = _gaps(seed)
    assert gaps["out"] < EXACT and gaps["grad"] < EXACT, (combination.name, gaps)


@pytest.mark.parametrize("seed", SEEDS)
def test_twin_a_key_tile_cut_one_row_off_is_seen(seed, monkeypatch):
    """Every key tile's keys and values cut one row later (one earlier at the block's end),
    at the same positions: through the compiled tile spec and the literal interpreter alike."""
    combination, _, _ = _module(seed)
    seen = ring._Ring.seen

    def moved(self, src, counted=True):
        length = len(self.grid(self.query))
        return [
            (q, Tile(k.offset + (1 if k.offset + k.length < length else -1), k.start, k.length))
            for q, k in seen(self, src, counted)
        ]

    monkeypatch.setattr(ring._Ring, "seen", moved)
    gaps = _gaps(seed)
    assert gaps["out"] > MOVED and gaps["grad"] > MOVED, (combination.name, gaps)


def test_the_drawn_layers_reach_the_ring_s_kinds_of_pass():
    """The seeds the suite runs cover a window, documents and sinks (their tile pairs are the
    ones the block map skips, the ids' constant and the sink's statistic): N positions, tiles
    of 2, so several key tiles each."""
    drawn = [draw(random.Random(seed)) for seed in SEEDS]
    assert N // 2 > 2
    assert any(c.order == "window" for c in drawn), [c.name for c in drawn]
    assert any(c.documents for c in drawn) and any(c.sinks for c in drawn)
