"""Key spans told from a mask's condition on each box of queries and keys (ir/boxes.py, the
generated `key_spans`' `box`) equal those read off every value of the mask, on every shipped
spec whose mask is made by blocks (doc_mask's from its document ids), at several N with 8
queries a block; and the condition spares the reads: a window's, a causal mask's and
documents' spans read O(N) entries of the mask, where the twin without the condition reads
all N². A condition perturbed (a window one wider) gives other spans."""

import itertools
from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
FRESH = itertools.count()
MASKED = (
    "alibi",
    "attention_sinks",
    "chunked",
    "differential",
    "doc_mask",
    "forgetting",
    "kv_decode",
    "prefix_lm",
    "sigmoid_attention",
    "sliding_window",
    "softcap_window",
    "talking_heads",
)


def spans(text: str, n: int, block: int, batch=(), runs=True, **scalars) -> list[dict]:
    """Per `key_spans` call of one forward at N = n, `block` queries a block: the spans told
    with the condition and those read off the values, and the entries each read. Scalars of
    16 or more (windows, chunks, a prefix) are 11 unless given; document ids in 4 runs (or,
    without `runs`, drawn at random, for each of a `batch`)."""
    spec = indexattn.compile_spec(text, name=f"spans_{next(FRESH)}")
    original, calls = rt.key_spans, []

    def key_spans(mask, hides, shape=None, every_call=False, blocks=False, box=None, values=()):
        counts, found = [0, 0], {}
        for k, told in enumerate((box, None)):

            def counted(q0, q1, k0, k1, k=k):
                counts[k] += (q1 - q0) * (k1 - k0)
                return mask(q0, q1, k0, k1)

            found[k] = original(counted, hides, shape, every_call, blocks, told, values)
        entries = shape[0] * shape[1]
        calls.append({"told": found[0], "read": found[1], "counts": counts, "all": entries})
        return found[0]

    sizes = dict.fromkeys(sample_sizes(spec.ir), 4) | {"N": n, "h": 2}
    args = sample_arguments(spec.ir, sizes, batch, torch.float64)
    if "D" in args and runs:
        args["D"] = (torch.arange(n) * 4 // n).to(args["D"].dtype).expand_as(args["D"])
    given = {k: v for k, v in sizes.items() if k in spec.required}
    given |= {s.ascii: 11 for s in spec.ir.scalars if s.value >= 16} | scalars
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(rt, "QUERY_BLOCK", block)
        patch.setattr(rt, "key_spans", key_spans)
        spec(**args, **given)
    return calls


@pytest.mark.parametrize("name", MASKED)
def test_spans_told_from_the_condition_equal_those_read_off_the_values(name):
    text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
    for n in (37, 64, 100):
        (call,) = spans(text, n, 8)
        assert call["told"] == call["read"]
        assert call["counts"][0] < call["counts"][1] == call["all"]


@pytest.mark.parametrize("name, w", [("sliding_window", 16), ("doc_mask", None)])
def test_the_condition_spares_the_n_squared_read(name, w):
    text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
    n, block = 512, 16
    (call,) = spans(text, n, block, **({"w": w} if w else {}))
    told, read = call["counts"]
    assert call["told"] == call["read"]
    assert told <= 4 * block * n  # the edges of the window, the diagonal, the documents'
    assert read == n * n  # the twin, without the condition: every entry


def test_twin_a_wider_window_gives_other_spans():
    text = (ROOT / "specs" / "sliding_window.attn").read_text(encoding="utf-8")
    wider = text.replace("τ - τ' >= w", "τ - τ' > w")
    assert wider != text
    (narrow,), (wide,) = spans(text, 64, 8, w=12), spans(wider, 64, 8, w=12)
    assert narrow["told"] == narrow["read"] and wide["told"] == wide["read"]
    assert narrow["told"] != wide["told"]


def test_documents_drawn_at_random_in_a_batch_give_the_spans_read():
    """Ids in no order, each batch entry its own: the least and greatest ids of a box over
    the batch tell less, and the keys they cannot tell are read."""
    text = (ROOT / "specs" / "doc_mask.attn").read_text(encoding="utf-8")
    for n in (37, 64):
        (call,) = spans(text, n, 8, batch=(3,), runs=False)
        assert call["told"] == call["read"]


def _row_blocks(scores: int, monkeypatch) -> tuple[int, torch.Tensor, torch.Tensor]:
    """softcap_window at N = 64, a window of 8, 2 heads, 8 queries a span: how many blocks its
    rows' function runs on, with `scores` the budget of a block; its output and the oracle's."""
    text = (ROOT / "specs" / "softcap_window.attn").read_text(encoding="utf-8")
    spec = indexattn.compile_spec(text, name=f"row_blocks_{next(FRESH)}")
    namespace, calls = spec.function.__globals__, []
    name = f"{spec.name}_rows"  # the rows' function, named after the spec
    rows = namespace[name]
    monkeypatch.setitem(namespace, name, lambda *a, **k: calls.append(1) or rows(*a, **k))
    monkeypatch.setattr(rt, "QUERY_BLOCK", 8)
    monkeypatch.setitem(namespace, "BLOCK_SCORES", scores)
    monkeypatch.setitem(namespace, "BLOCK_ROWS", 1)
    sizes = dict.fromkeys(sample_sizes(spec.ir), 4) | {"N": 64, "h": 2}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    out = spec(**args, h=2, w=8, c=5.0)
    (want,) = reference.evaluate(spec.ir, **args, h=2, w=8, c=5.0)
    return len(calls), out, want


def test_a_block_of_rows_spends_its_scores_on_the_keys_of_its_span(monkeypatch):
    """Eight spans of 8 queries, each over at most 16 keys: a budget of 2 heads × 8 rows × 16
    keys runs one block a span (budgeted against every key, 4 blocks a span); the twin, half
    that budget, runs two where a span sees more than 8 keys. Values are the oracle's either
    way."""
    blocks, out, want = _row_blocks(2 * 8 * 16, monkeypatch)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    assert blocks == 8
    blocks, out, want = _row_blocks(2 * 8 * 16 // 2, monkeypatch)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    assert 8 < blocks <= 16
