"""A kept ring pass sends another rank's blocks in pieces (indexattn/parallel/ring.py, `cuts`):
runs of about 1/PIECES of a block, cut only where no tile pair's keys straddle, so that a rank
holds one run of another's keys at a time. The launches of test_context_parallel.py run the
pieces end to end (zig-zag blocks of two tiles: two pieces a step) against one process. The
tiles themselves are at most MAX_TILE positions where no mask chooses them."""

import indexattn
from indexattn.parallel.sequence import MAX_TILE, PIECES, Tile, cuts, position_map, read_runs


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


def _mha_map(n: int, world: int):
    spec = indexattn.compile_spec("mha")
    sizes = {"N": n, "d_m": 64, "h": 2, "d_k": 32}
    values = {s: sizes[a] for s, a in spec.ir.size_names.items()}
    return position_map(spec.ir, spec.sequence_plan(), values, world, "zigzag")


def test_a_chunk_longer_than_max_tile_is_cut_into_tiles_of_max_tile():
    """mha's causal mask chooses no tile: a zig-zag chunk of 8,192 (N = 32768, W = 2) is cut
    into tiles of MAX_TILE, and the tile pairs above the diagonal inside a chunk are skipped
    (a pair of 2,048 tiles hidden where a chunk's pair was computed whole)."""
    block_map = _mha_map(32768, 2)
    assert block_map.tile == MAX_TILE
    rows = block_map.tiles_of(block_map.query, 0)
    assert len(rows) == 2 * 8192 // MAX_TILE
    first, second = rows[0], rows[1]  # the first chunk's first two tiles
    assert block_map.hides(first, second) and not block_map.hides(second, first)


def test_twin_a_chunk_up_to_max_tile_is_one_tile():
    block_map = _mha_map(8192, 2)  # chunks of 2,048
    assert block_map.tile is None and block_map.chunk == MAX_TILE
    assert len(block_map.tiles_of(block_map.query, 0)) == 2
