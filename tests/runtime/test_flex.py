"""The FlexAttention backend (indexattn/backends/flex): backend= dispatch and refusals, values
against the literal interpreter (flex_attention's eager path; compiled in the slow tests),
`spec.block_mask` against `create_block_mask` of `spec.mask_mod`, and `score_mod`."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from indexattn import catalog, compile_spec
from indexattn.backends.flex import callables, mods, run
from indexattn.oracle import verify


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    """flex_attention's eager path: exact, no compile (tens of seconds a shape on a CPU)."""
    monkeypatch.setattr(run, "COMPILE", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- values: the generated module with backend="flex" against the literal reading


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        "softcap_window",
        "doc_mask",
        *(pytest.param(n, marks=SLOW) for n in ("alibi", "gqa_core", "chunked", "prefix_lm")),
        pytest.param("t5_bias", marks=SLOW),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flex_values_are_the_literal_reading(name, dtype):
    spec = compile_spec(name, backend="flex")
    assert "indexattn_flex.attention(" in spec.source
    for batch in ((), (2,)):
        found = verify.compare(spec, dtype, batch)
        assert found.ok, (name, dtype, batch, found.error)


def test_a_wrong_score_mod_is_seen():
    """Twin: the same module with its soft cap's score_mod changed differs from the oracle."""
    spec = compile_spec("softcap_core", backend="flex")
    sizes = verify.sample_sizes(spec.ir)
    args = verify.sample_arguments(spec.ir, sizes, (), torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    right = spec(**args, **given, softcap=0.5)
    namespace = spec.function.__globals__
    original = namespace["O_score"]
    namespace["O_score"] = lambda score, b, h, q_idx, kv_idx, *, softcap, M: original(
        score, b, h, q_idx, kv_idx, softcap=2 * softcap, M=M
    )
    try:
        wrong = spec(**args, **given, softcap=0.5)
    finally:
        namespace["O_score"] = original
    assert (right - wrong).abs().max() > 1e-3


def test_auto_and_blocks_and_sdpa_print_what_they_say():
    auto = compile_spec("mha").source
    assert "scaled_dot_product_attention" in auto and "indexattn_flex" not in auto
    blocks = compile_spec("mha", backend="blocks")
    assert "scaled_dot_product_attention" not in blocks.source
    assert verify.compare(blocks, torch.float64).ok
    assert "scaled_dot_product_attention" in compile_spec("mha", backend="sdpa").source


def test_flex_in_the_dump_and_the_module(tmp_path):
    from indexattn.ir import check
    from indexattn.lower.pipeline import dump

    spec = check(catalog.shipped("doc_mask").read_text(), "doc_mask")
    assert "Flex: O" in dump(spec, "plan", "flex")
    assert "Flex:" not in dump(spec, "plan")
    assert (
        "# the attention core by FlexAttention" in compile_spec("doc_mask", backend="flex").source
    )


def test_backends_refuse_by_name_with_the_reason():
    with pytest.raises(ValueError, match=r"backend='sdpa' cannot .* softcap_window: .*tanh"):
        compile_spec("softcap_window", backend="sdpa")
    with pytest.raises(ValueError, match=r"backend='flex' cannot .* linear_attention: no softmax"):
        compile_spec("linear_attention", backend="flex")
    with pytest.raises(ValueError, match=r"no backend 'triton2'.*'auto', 'blocks'"):
        compile_spec("mha", backend="triton2")


def test_flex_has_no_cpu_backward_and_says_what_to_use():
    spec = compile_spec("softcap_core", backend="flex")
    sizes = verify.sample_sizes(spec.ir)
    args = verify.sample_arguments(spec.ir, sizes, (), torch.float32)
    args["Q"].requires_grad_()
    given = {k: v for k, v in sizes.items() if k in spec.required}
    with pytest.raises(ValueError, match=r"no backward on a CPU.*backend='blocks'"):
        spec(**args, **given)


def test_module_takes_a_backend():
    layer = compile_spec("doc_mask").module(d_m=8, h=2, d_k=4, backend="flex")
    assert layer.spec.backend == "flex"
    x, d = torch.randn(6, 8), torch.tensor([0, 0, 1, 1, 1, 2])
    with torch.no_grad():
        got = layer(X=x, D=d)
        want = compile_spec("doc_mask").module(d_m=8, h=2, d_k=4)
        want.load_state_dict(layer.state_dict())
        assert torch.allclose(got, want(X=x, D=d), atol=1e-5)
        assert not torch.allclose(got, want(X=x, D=torch.zeros_like(d)), atol=1e-5)


# -- block masks read off the notation


def _canonical(mask) -> list:
    """kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices: each row's blocks, sorted."""
    out = []
    for counts, indices in (
        (mask.kv_num_blocks, mask.kv_indices),
        (mask.full_kv_num_blocks, mask.full_kv_indices),
    ):
        rows = indices.flatten(0, -2)
        out.append([sorted(r[:c].tolist()) for r, c in zip(rows, counts.flatten())])
    return out


def _inputs(spec, n: int, seed: int = 0) -> dict:
    """What a spec's mask reads at n positions: sorted document ids, a window, a prefix and a
    chunk a fraction of n (not their defaults, which would make most masks plain causal)."""
    core = callables.one_core(spec.ir)
    source = mods.mask_mod(spec.ir, core)
    generator = torch.Generator().manual_seed(seed)
    values = {"N": n, "N_kv": n}
    for _, name in source.keywords:
        tensor = next((t for t in core.tensors if t.ascii == name), None)
        if tensor is not None:
            ids = torch.randint(0, 4, (n,), generator=generator).sort().values
            values[name] = ids[None] if tensor.batched else ids
        else:
            values[name] = max(1, n // 3 + seed)
    return values


def masked_specs() -> list[str]:
    found = []
    for name in catalog.names():
        try:
            cores = callables.cores_of(compile_spec(name).ir)
        except (ValueError, LookupError):
            continue
        if len(cores) == 1 and cores[0].keep is not None:
            found.append(name)
    return found


FEW = ["mha", "doc_mask", "sliding_window", "prefix_lm", "chunked"]


def _lengths(spec, values: dict) -> tuple[int, int]:
    """The query and key lengths from the spec's own sizes (kv_decode's keys: N_c + N)."""
    core = callables.one_core(spec.ir)
    names = dict(zip(spec.ir.sizes, spec.ir.size_asciis))
    given = {s: values[a] for s, a in names.items() if a in values}
    return tuple(int(i.size.xreplace(given)) for i in (core.query, core.key))


def _check_block_mask(name: str, n: int, block: int, seed: int = 0) -> None:
    spec = compile_spec(name)
    values = _inputs(spec, n, seed)
    made = spec.block_mask(BLOCK_SIZE=block, **values)
    heads = made.kv_num_blocks.shape[1]
    batch = made.kv_num_blocks.shape[0]
    n_q, n_kv = _lengths(spec, values)
    want = create_block_mask(
        spec.mask_mod(**values), batch, heads, n_q, n_kv, device="cpu", BLOCK_SIZE=block
    )
    assert made.seq_lengths == (n_q, n_kv), (name, made.seq_lengths, n_q, n_kv)
    assert _canonical(made) == _canonical(want), (name, n, block)


@pytest.mark.parametrize("name", FEW)
@pytest.mark.parametrize("n,block", [(512, 128), (300, 64), (777, 128)])
def test_block_mask_is_create_block_mask(name, n, block):
    _check_block_mask(name, n, block)


@pytest.mark.slow
def test_block_mask_of_every_masked_shipped_spec():
    names = masked_specs()
    assert {"mha", "doc_mask", "softcap_window", "chunked"} <= set(names)
    for name in names:
        for n, block in ((1024, 128), (1000, 64), (257, 32)):
            _check_block_mask(name, n, block)


@pytest.mark.parametrize("n,block,seed", [(1, 128, 40), (1, 32, 7), (64, 64, 3), (300, 128, 0)])
def test_block_mask_of_kv_decode(n, block, seed):
    """A cached offset: N new queries at N_c + τ over N_c + N keys, N_c not a block's multiple
    (one decode step, a chunked prefill)."""
    _check_block_mask("kv_decode", n, block, seed)


def test_block_mask_of_kv_decode_without_its_offset_differs():
    """Twin: the same queries read as if no keys were cached (N_c = 0) give another mask."""
    spec = compile_spec("kv_decode")
    values = {"N": 300, "N_c": 200}
    made = spec.block_mask(BLOCK_SIZE=64, **values)
    no_cache = create_block_mask(
        spec.mask_mod(N=300, N_c=0), 1, 1, 300, 500, device="cpu", BLOCK_SIZE=64
    )
    assert _canonical(made) != _canonical(no_cache)


def test_a_flipped_block_is_seen():
    """Twin: one block's kind changed (a partial block made full) is told apart."""
    spec = compile_spec("sliding_window")
    made = spec.block_mask(N=512, w=100, BLOCK_SIZE=64)
    want = create_block_mask(spec.mask_mod(w=100), 1, 1, 512, 512, device="cpu", BLOCK_SIZE=64)
    assert _canonical(made) == _canonical(want)
    counts, indices = made.kv_num_blocks.clone(), made.kv_indices.clone()
    full_counts, full = made.full_kv_num_blocks.clone(), made.full_kv_indices.clone()
    row = 3
    moved = indices[0, 0, row, counts[0, 0, row] - 1].item()  # its last partial block
    counts[0, 0, row] -= 1
    full[0, 0, row, full_counts[0, 0, row]] = moved
    full_counts[0, 0, row] += 1
    flipped = type(made).from_kv_blocks(counts, indices, full_counts, full, BLOCK_SIZE=64)
    assert _canonical(flipped) != _canonical(want)


def test_block_mask_never_reads_every_entry(monkeypatch):
    """Only the blocks the box bounds cannot tell are read entry by entry: for a causal mask
    the diagonal's, n / block of them, not (n / block)²."""
    from indexattn.backends.flex import masks

    read = []
    original = masks.build

    def counting(mask_mod, *args, **kwargs):
        def counted(b, h, q, k):
            read.append(b.shape[0])
            return mask_mod(b, h, q, k)

        return original(counted, *args, **kwargs)

    monkeypatch.setattr(masks, "build", counting)
    compile_spec("mha").block_mask(N=4096)
    assert sum(read) == 4096 // 128


def test_document_ids_keep_their_integer_dtype():
    """Per-tile least and greatest ids in the ids' own dtype: ids past 2^53 stay apart."""
    big = 2**60
    ids = torch.tensor([big] * 128 + [big + 1] * 128)
    made = compile_spec("doc_mask").block_mask(D=ids[None], N=256)
    # the diagonal's blocks partial (causal), the block of the second document's queries
    # against the first's keys empty: as doubles, the two ids would be one
    assert _canonical(made) == [[[0], [1]], [[], []]]


# -- the callables alone


def test_score_mod_and_mask_mod_are_the_spec_s():
    spec = compile_spec("softcap_window")
    score = spec.score_mod(c=2.0)
    x = torch.tensor([-10.0, 0.5, 30.0])
    assert torch.allclose(score(x, 0, 0, 0, 0), 2.0 * torch.tanh(x / 2.0))
    keep = spec.mask_mod(w=3)
    q, k = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(keep(0, 0, q, k), (k <= q) & (q - k < 3))
    assert not torch.equal(keep(0, 0, q, k), k <= q)  # twin: the window is read


def test_alibi_s_slopes_read_the_head():
    spec = compile_spec("alibi")
    score = spec.score_mod(h=8)
    got = score(torch.tensor(0.0), 0, torch.tensor(1), torch.tensor(5), torch.tensor(2))
    assert torch.isclose(got, torch.tensor(-(2 ** (-2.0)) * 3))


# -- compiled FlexAttention (tens of seconds per shape family on a CPU)


@pytest.mark.slow
def test_compiled_flex_forward_is_the_literal_reading(monkeypatch):
    monkeypatch.setattr(run, "COMPILE", True)
    spec = compile_spec("softcap_window", backend="flex")
    for n in (256, 384):  # a second length: no recompile (dynamic shapes)
        found = verify.compare(spec, torch.float32, fixed={"N": n})
        assert found.ok, found.error


def test_a_block_mask_is_kept_while_the_ids_it_reads_are_the_same(monkeypatch):
    """One build for equal document ids (a fresh tensor: as a model's layers share them); a
    rebuild, and the other output, when they change (the twin)."""
    from indexattn.backends.flex import masks

    built = []
    original = masks.build
    monkeypatch.setattr(masks, "build", lambda *a, **k: built.append(1) or original(*a, **k))
    monkeypatch.setattr(run, "_MASKS", {})
    layer = compile_spec("doc_mask").module(d_m=8, h=2, d_k=4, backend="flex")
    blocks = compile_spec("doc_mask").module(d_m=8, h=2, d_k=4, backend="blocks")
    blocks.load_state_dict(layer.state_dict())
    x, d = torch.randn(6, 8), torch.tensor([0, 0, 1, 1, 1, 2])
    other = torch.tensor([0, 1, 1, 1, 2, 2])
    with torch.no_grad():
        first = layer(X=x, D=d)
        again = layer(X=x, D=d.clone())
        assert len(built) == 1 and torch.equal(first, again)
        changed = layer(X=x, D=other)
        assert len(built) == 2
        assert torch.allclose(changed, blocks(X=x, D=other), atol=1e-5)
        assert not torch.allclose(changed, first, atol=1e-5)


LEARNED = """index τ, τ' : N
index μ : h
index a : d
input Q_<μτa>
input K_<μτ'a>
input V_<μτ'a>
input D_<τ> : int
param b_<μ>
scalar c = 20
M_<ττ'> = where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)
S_<μττ'> = c tanh(Q_<μτa> K_<μτ'a> / (sqrt(d) c)) + b_<μ> (τ' - τ) + M_<ττ'>
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>
output O
"""


def _by_mods(spec, q, k, v, d, b):
    """softmax(score_mod(scale · q·k)) · v where mask_mod keeps, every score at once: what
    flex_attention computes (eagerly, so with gradients on a CPU)."""
    h, n, width = q.shape
    score = spec.score_mod(b=b)
    keep = spec.mask_mod(D=d[None])
    hh, qq, kk = torch.arange(h)[:, None, None], torch.arange(n)[:, None], torch.arange(n)
    zero = torch.zeros((), dtype=torch.long)
    raw = q @ k.transpose(-1, -2) / (width**0.5 * 20)  # the module's scale, 1/(c √d)
    s = score(raw, zero, hh, qq, kk).masked_fill(~keep(zero, hh, qq, kk), float("-inf"))
    return s.softmax(-1) @ v


def test_a_learned_bias_the_score_reads_has_the_spec_s_gradient():
    """The score_mod's math and its gradient in a learned per-head slope b_<μ> against the
    blocked path's autograd (FlexAttention has no CPU backward: the mods run eagerly)."""
    spec = compile_spec(LEARNED, name="learned_bias")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    d = torch.tensor([0] * 5 + [1] * 7)
    grads = []
    for way in (lambda b: spec(Q=q, K=k, V=v, D=d, b=b), lambda b: _by_mods(spec, q, k, v, d, b)):
        b = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
        out = way(b)
        (out * v.flip(-1)).sum().backward()
        grads.append((out.detach(), b.grad))
    (want, want_grad), (got, got_grad) = grads
    assert torch.allclose(got, want, atol=1e-10) and torch.allclose(got_grad, want_grad, atol=1e-10)
    assert want_grad.abs().min() > 1e-4


def test_a_learned_bias_read_at_the_wrong_head_is_seen():
    """Twin: the slopes swapped between the heads change the output and the gradient."""
    spec = compile_spec(LEARNED, name="learned_bias")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    d = torch.tensor([0] * 5 + [1] * 7)
    b = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    right = spec(Q=q, K=k, V=v, D=d, b=b)
    swapped = _by_mods(spec, q, k, v, d, b.flip(0))
    assert (right - swapped).abs().max() > 1e-4


# -- "auto" off a CPU: FlexAttention where it takes the spec and the call (runtime/compiled.py)

ALIBI = {"d_in": 32, "d_out": 32, "h": 2, "d_k": 16}


def _route(name: str, sizes: dict, training: bool = False, **scalars):
    chosen = compile_spec(name)._route(sizes, scalars, training, "cuda")
    return None if chosen is None else chosen.backend


def test_auto_on_cuda_takes_flex_only_for_calls_flex_runs():
    sizes = {"N": 300, **ALIBI}
    assert _route("alibi", sizes) == "flex"
    assert _route("alibi", sizes, training=True) is None  # dropout p = 0.1 in training
    assert _route("alibi", sizes, training=True, p=0.0) == "flex"
    assert _route("alibi", {**sizes, "d_out": 30, "d_k": 15}) is None  # tl.dot: 16 or more
    assert _route("softcap_window", {"N": 300, "d_m": 32, "h": 2, "d_k": 16}) == "flex"


def test_auto_on_cuda_keeps_the_cores_sdpa_s_fused_kernels_run():
    """mha's core is SDPA's causal call: flash or memory-efficient whole (on the H200, mha in
    float32: 4.6 ms forward against FlexAttention's 12.3)."""
    assert _route("mha", {"N": 300, "d_m": 32, "h": 2, "d_k": 16}) is None
    assert _route("gqa", {"N": 300, "d_m": 32, "h": 4, "h_kv": 2, "d_k": 16}) is None


def test_refusals_of_a_call_say_why_and_what_to_write():
    from indexattn.backends import flex

    spec = compile_spec("alibi", backend="flex")
    sizes = {"N": 300, **ALIBI, "d_k": 8, "d_out": 16}
    values = {s: sizes[n] for s, n in spec.ir.size_names.items()}
    values.update({s.symbol: s.value for s in spec.ir.scalars})  # p = 0.1
    assert "16 or more" in flex.refuses_call(spec, values, False, "cuda")
    assert "backend='blocks'" in flex.refuses_call(spec, values, False, "cuda")
    assert flex.refuses_call(spec, values, False, "cpu") is None  # the CPU kernel takes any
    assert "no dropout" in flex.refuses_call(spec, values, True, "cpu")


def _counted(monkeypatch) -> list:
    """Pretend the CPU is a GPU for "auto" (compiled.UNROUTED, backends.auto) and count the
    calls of FlexAttention."""
    from indexattn import backends
    from indexattn.runtime import compiled

    monkeypatch.setattr(compiled, "UNROUTED", ())
    monkeypatch.setattr(
        backends, "auto", lambda device, flex, triton=False: "flex" if flex else "auto"
    )
    calls = []
    attention = run.attention
    monkeypatch.setattr(run, "attention", lambda *a, **k: calls.append(1) or attention(*a, **k))
    return calls


def test_a_module_s_calls_take_flex_where_auto_routes_them(monkeypatch):
    """The module's fast path (spec._run) routes as spec(...) does: in eval, FlexAttention,
    equal to the spec's own code; in training with dropout, its own code."""
    torch.manual_seed(0)
    spec = compile_spec("alibi")
    module = spec.module(**ALIBI).double().eval()
    x = torch.randn(2, 140, 32, dtype=torch.float64)
    with torch.no_grad():
        want = module(x)
        calls = _counted(monkeypatch)
        got = module(x)
        assert calls == [1]
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        module.train()
        module(x)
        assert calls == [1]  # dropout in training: the spec's own code
        given = {k: v for k, v in ALIBI.items() if k in spec.required}
        spec(X=x, **dict(module.named_parameters()), **given, p=0.0, training=True)
        assert calls == [1, 1]  # p = 0: FlexAttention again


def test_twin_a_module_not_routed_does_not_call_flex(monkeypatch):
    spec = compile_spec("alibi")
    module = spec.module(**ALIBI).double().eval()
    calls = []
    attention = run.attention
    monkeypatch.setattr(run, "attention", lambda *a, **k: calls.append(1) or attention(*a, **k))
    with torch.no_grad():
        module(torch.randn(2, 140, 32, dtype=torch.float64))
    assert calls == []
