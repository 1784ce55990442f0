"""The kernel by blocks of queries, each over the keys its mask lets it see: every shipped spec
whose mask may hide whole blocks of keys reads the blocks off the mask (`key_spans`); forced
into blocks of one query (the runtime's QUERY_BLOCK knob) it equals the literal interpreter in
values and gradients, calls the kernel once per block, and a span cut one key short is seen.
A block whose mask hides nothing (a decode step's one query) runs without it. Where the blocks
would skip too little, or when traced, the kernel runs once; or, where the mask is a table
made by blocks from positions (passes/tables.py), by blocks of queries over every key."""

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SPANNED = sorted(p.stem for p in GOLDEN.glob("*.py") if "rt.key_spans(" in p.read_text())
# scalars that make the masks hide more than the causal half at the sampled sizes
SCALARS = {"sliding_window": {"w": 2}, "chunked": {"C": 2}, "prefix_lm": {"P": 2}}
FRESH = itertools.count()
SIZES = {"kv_decode": {"N": 6, "N_c": 1}}  # a prefill after one cached token


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """The number of queries of every call of the kernel while the test runs."""
    seen: list[int] = []
    kernel = F.scaled_dot_product_attention

    def record(q, *args, **kwargs):
        seen.append(q.shape[-2])
        return kernel(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return seen


def spec_in_blocks(name: str, monkeypatch, block: int = 1, calls: list[int] | None = None):
    """The shipped spec compiled afresh (its own caches of constants), at `block` queries;
    `calls` records the queries of every call of its rows' function (scores by blocks of
    queries, where the kernel cannot take them)."""
    text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
    spec = indexattn.compile_spec(text, name=f"{name}_{next(FRESH)}")
    namespace = spec.function.__globals__
    monkeypatch.setattr(rt, "QUERY_BLOCK", block)
    rows = namespace.get(spec.function.__name__ + "_rows")
    if rows is not None and calls is not None:

        def record(first, *args, **kwargs):
            calls.append(first.shape[-2])
            return rows(first, *args, **kwargs)

        monkeypatch.setitem(namespace, rows.__name__, record)
    return spec


def run(spec, name: str, seed: int = 0, sizes: dict[str, int] | None = None):
    """Generated and literal outputs and gradients on the same data."""
    sizes = sample_sizes(spec.ir, seed) | (sizes or {}) | SIZES.get(name, {})
    given = {k: v for k, v in sizes.items() if k in spec.required} | SCALARS.get(name, {})
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, seed)
    floats = {k for k, v in args.items() if v.is_floating_point()}
    results = []
    for fn in (lambda **kw: spec(**kw), lambda **kw: reference.evaluate(spec.ir, **kw)):
        mine = {k: v.clone().requires_grad_(k in floats) for k, v in args.items()}
        out = fn(**mine, **given)
        out = out if isinstance(out, tuple) else (out,)
        sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in out).backward()
        results.append((out, [mine[k].grad for k in sorted(floats)]))
    return results


def test_the_masked_kernels_and_rows_take_spans():
    kernels = set(KERNELS)
    rows = {"softcap_window", "differential", "sigmoid_attention", "talking_heads"}
    assert kernels | rows | {"attention_sinks"} <= set(SPANNED)


@pytest.mark.parametrize("name", SPANNED)
def test_blocks_of_one_query_equal_the_literal(name, monkeypatch, kernel_calls):
    spec = spec_in_blocks(name, monkeypatch, calls=kernel_calls)
    (got, got_grads), (want, want_grads) = run(spec, name)
    for g, w in zip([*got, *got_grads], [*want, *want_grads], strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
    whole = WHOLE_CALLS.get(name, set())
    assert kernel_calls.count(1) > 1 and set(kernel_calls) - {1} <= whole


# a kernel call of a spec that has no band to span, beside its spanned ones: NSA's compressed
# branch (every query against the block summaries, one call)
WHOLE_CALLS = {"nsa": {4}}


@pytest.mark.parametrize("name", SPANNED)
def test_a_span_cut_one_key_short_is_seen(name, monkeypatch):
    """The twin: the same blocks with each span's last key left out differ from the literal."""
    spec = spec_in_blocks(name, monkeypatch)
    spans = rt.key_spans

    def short(*args, **kwargs):
        found = spans(*args, **kwargs)
        return [(t, u, k0, k1 - 1 if k1 - k0 > 1 else k1, w) for t, u, k0, k1, w in found]

    monkeypatch.setattr(rt, "key_spans", short)
    (got, _), (want, _) = run(spec, name)
    assert any((g - w).abs().max() > 1e-6 for g, w in zip(got, want))


def test_spans_are_the_keys_each_block_sees(monkeypatch):
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    spans = rt.key_spans
    tau = torch.arange(12)
    keep = (tau[:, None] >= tau[None, :]) & (tau[:, None] - tau[None, :] < 3)
    assert spans(keep, "false") == [
        (0, 4, 0, 4, False),
        (4, 8, 2, 8, False),
        (8, 12, 6, 12, False),
    ]
    assert spans(keep.expand(2, 3, 12, 12), "false") == spans(keep, "false")  # their union
    causal = tau[:, None] >= tau[None, :]  # 2/3 of the scores at blocks of 4 of 12
    assert spans(causal, "false") == [
        (0, 4, 0, 4, False),
        (4, 8, 0, 8, False),
        (8, 12, 0, 12, False),
    ]
    wide = tau[:, None] + 6 >= tau[None, :]  # 17/18 of them: one call; a table made by
    assert spans(wide, "false") is None  # blocks: every key for each block of queries
    assert spans(wide, "false", blocks=True) == [(t, t + 4, 0, 12, False) for t in (0, 4, 8)]
    assert spans(keep[:0], "false") is None


def test_spans_of_a_table_made_by_blocks_are_those_of_the_whole(monkeypatch):
    """A mask given as a function of a block of queries and keys (a table never made whole,
    passes/tables.py) has the spans of the same mask given whole; the twin, a function that
    gives another block's rows, does not."""
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    spans = rt.key_spans
    tau = torch.arange(12)
    keep = (tau[:, None] >= tau[None, :]) & (tau[:, None] - tau[None, :] < 3)
    zeros = torch.zeros(12, 12).masked_fill(~keep, -torch.inf)
    for mask, hides in ((keep, "false"), (~keep, "true"), (zeros, "-inf")):
        rows = spans(lambda t, u, k, e, m=mask: m[t:u, k:e], hides, (12, 12))
        assert rows == spans(mask, hides)
        assert spans(lambda t, u, k, e, m=mask: m[: u - t, k:e], hides, (12, 12)) != rows


def test_a_block_whose_mask_hides_nothing_is_whole(monkeypatch):
    """Chunks of 4 at blocks of 4: every block sees its chunk, all of it; a mask that hides
    nothing is one whole span; a float mask is whole only where it adds zeros."""
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    spans = rt.key_spans
    tau = torch.arange(12)
    chunks = tau[:, None] // 4 == tau[None, :] // 4
    assert spans(chunks, "false") == [
        (0, 4, 0, 4, True),
        (4, 8, 4, 8, True),
        (8, 12, 8, 12, True),
    ]
    assert spans(torch.ones(2, 12, 12, dtype=torch.bool), "false") == [(0, 12, 0, 12, True)]
    seen = chunks.clone()
    seen[0, 1] = False  # one query of the first block misses one key of its chunk: not whole
    assert [w for *_, w in spans(seen, "false")] == [False, True, True]
    zeros = torch.zeros(12, 12).masked_fill(~chunks, -torch.inf)
    assert spans(zeros, "-inf") == spans(chunks, "false")
    bias = zeros + 0.5 * (tau[:, None] - tau[None, :])  # finite, but not zero: the mask stays
    assert [w for *_, w in spans(bias, "-inf")] == [False] * 3
    one = torch.ones(1, 12, dtype=torch.bool)  # one query
    assert spans(one, "false") == [(0, 1, 0, 12, True)]


def decode(spec, n: int, cached: int):
    """kv_decode's output and its literal value for `n` new tokens after `cached` ones."""
    sizes = sample_sizes(spec.ir, 0) | {"N": n, "N_c": cached}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, 0)
    return spec(**args)[0], reference.evaluate(spec.ir, **args)[0]


def test_a_decode_step_runs_the_kernel_without_its_mask(monkeypatch, masks):
    """One new token sees every cached key and itself: its mask hides nothing, so the kernel
    runs without it, as hand-written decoding does; a prefill of six after one keeps it."""
    spec = spec_in_blocks("kv_decode", monkeypatch, block=128)
    got, want = decode(spec, 1, 7)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert masks == [None]
    got, want = decode(spec, 6, 1)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert len(masks) == 2 and masks[1].dtype == torch.bool


KERNELS = ["sliding_window", "chunked", "prefix_lm", "alibi", "doc_mask", "kv_decode"]


@pytest.mark.parametrize("name", KERNELS)
def test_blocks_run_without_their_mask_where_it_hides_nothing(name, monkeypatch):
    """Blocks of two of eight queries (kv_decode: six after one cached), whole (prefix_lm's
    prefix) or not, equal the literal; blocks of one query, where every block of a causal
    mask is whole, are the test above. The twin marks every block whole, runs each without
    its mask, and differs (a spec compiled afresh: the first caches its spans)."""
    spec = spec_in_blocks(name, monkeypatch, block=2)
    (got, got_grads), (want, want_grads) = run(spec, name, sizes={"N": 8})
    for g, w in zip([*got, *got_grads], [*want, *want_grads], strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
    spec = spec_in_blocks(name, monkeypatch, block=2)
    spans = rt.key_spans

    def whole(*args, **kwargs):
        return [(*span[:4], True) for span in spans(*args, **kwargs)]

    monkeypatch.setattr(rt, "key_spans", whole)
    (got, _), (want, _) = run(spec, name, sizes={"N": 8})
    assert any((g - w).abs().max() > 1e-6 for g, w in zip(got, want))


def test_a_mask_that_hides_too_little_runs_the_kernel_once(monkeypatch, kernel_calls, masks):
    """A prefix as long as the sequence hides nothing: one call, without the mask; one of 11
    hides 11 of the 144 scores: one call with it; a short one hides a third of the scores at
    blocks of 4 of 12: three calls."""
    spec = spec_in_blocks("prefix_lm", monkeypatch, block=4)
    weights = dict(spec.module(d_m=16, h=2, d_k=8).named_parameters())
    x = torch.randn(1, 12, 16)
    spec(**weights, X=x, h=2, P=12)
    assert kernel_calls == [12] and masks == [None]
    spec(**weights, X=x, h=2, P=11)  # its mask, made by blocks, is never made whole
    assert kernel_calls == [12, 4, 4, 4] and masks[1].shape == (4, 12)
    spec(**weights, X=x, h=2, P=2)
    assert kernel_calls == [12, 4, 4, 4, 4, 4, 4]


def test_rows_that_see_no_key_give_zeros_in_blocks(monkeypatch):
    """Queries before 3 see nothing: their block's span is every key, and the kernel's zeros
    (values and gradients) stay zeros."""
    text = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
M_<ττ'> = where(τ' > τ or τ < 3, -inf, 0)
A_<ττ'> = softmax_<τ'>(Q_<τa> K_<τ'a> + M_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""
    spec = indexattn.compile_spec(text, name="dead_rows_in_blocks")
    monkeypatch.setattr(rt, "QUERY_BLOCK", 2)
    q, k, v = (torch.randn(10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = spec(Q=q, K=k, V=v)
    want = reference.evaluate(spec.ir, Q=q, K=k, V=v)[0]
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    assert out[:3].eq(0).all()
    out.sum().backward()
    assert q.grad.isfinite().all() and q.grad[:3].eq(0).all()


def test_traced_code_runs_the_kernel_once(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert rt.key_spans(torch.eye(8, dtype=torch.bool), "false") is None


@pytest.mark.parametrize("w, calls", [(12, [12]), (2, [4, 4, 4])])
def test_rows_whose_mask_hides_nothing_run_in_one_call(monkeypatch, w, calls):
    """softcap_window's soft-capped scores by rows, its window made two-sided: as wide as
    the sequence it hides nothing, one call over every key; the twin, a window of 2, runs
    three blocks of 4 queries."""
    text = (ROOT / "specs" / "softcap_window.attn").read_text(encoding="utf-8")
    causal = "where(τ' > τ or τ - τ' >= w, -inf, 0)"
    assert causal in text
    text = text.replace(causal, "where(τ' - τ >= w or τ - τ' >= w, -inf, 0)")
    spec = indexattn.compile_spec(text, name=f"two_sided_{next(FRESH)}")
    namespace = spec.function.__globals__
    monkeypatch.setattr(rt, "QUERY_BLOCK", 4)
    rows, seen = namespace[spec.function.__name__ + "_rows"], []

    def record(first, *args, **kwargs):
        seen.append(first.shape[-2])
        return rows(first, *args, **kwargs)

    monkeypatch.setitem(namespace, rows.__name__, record)
    sizes = sample_sizes(spec.ir, 0) | {"N": 12}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, 0)
    given = {k: v for k, v in sizes.items() if k in spec.required} | {"w": w}
    out = spec(**args, **given)
    torch.testing.assert_close(out, reference.evaluate(spec.ir, **args, **given)[0])
    assert seen == calls
