"""A kept ring pass sends another rank's blocks in pieces (indexattn/parallel/ring.py, `cuts`):
runs of about 1/PIECES of a block, cut only where no tile pair's keys straddle, so that a rank
holds one run of another's keys at a time. The launches of test_context_parallel.py run the
pieces end to end (zig-zag blocks of two tiles: two pieces a step) against one process."""

from indexattn.parallel.sequence import PIECES, Tile, cuts, read_runs


def _pairs(keys: list[tuple[int, int]]) -> list[tuple[Tile, Tile]]:
    query = Tile(0, 0, 4)
    return [(query, Tile(offset, 100 + offset, length)) for offset, length in keys]


def test_a_block_of_tiles_is_cut_into_runs_of_about_one_piece():
    tiles = [(offset, 8) for offset in range(0, 256, 8)]  # 32 tiles of 8: 8 runs of 32
    runs = cuts(_pairs(tiles), 256)
    assert runs == [(a, a + 32) for a in range(0, 256, 32)]
    assert len(runs) == PIECES


def test_twin_a_span_across_a_cut_keeps_its_keys_in_one_run():
    tiles = [(offset, 8) for offset in range(0, 256, 8) if offset not in (24, 32)]
    runs = cuts(_pairs([*tiles, (24, 16)]), 256)  # a span of keys 24 … 39
    assert (0, 40) in runs and all(not a < 32 < b or (a, b) == (0, 40) for a, b in runs)
    assert all(not a < 24 < b or a == 0 for a, b in runs[1:])


def test_keys_no_pair_reads_are_cut_into_runs_of_their_own_and_not_sent():
    pairs = _pairs([(224, 16), (240, 16)])  # a window reading the last 32 keys alone
    assert cuts(pairs, 256) == [(a, a + 32) for a in range(0, 256, 32)]  # every key, 32 a run
    assert read_runs(pairs, 256) == [(224, 256)]


def test_twin_a_run_that_one_pair_reads_is_sent():
    pairs = _pairs([(0, 8), (224, 16), (240, 16)])  # and the first 8 keys
    assert read_runs(pairs, 256) == [(0, 32), (224, 256)]
