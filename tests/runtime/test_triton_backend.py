"""The triton backend's printed kernels, run in Triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py before triton is imported), forward and backward, against the oracle's literal
reading of the whole spec and its autograd: at sizes crossing the 16-wide block edges, batched,
grouped-query, with dead rows, in float32 and float64; and on buffers with guard regions that
must stay untouched (with a twin kernel whose one dropped mask they catch)."""

from __future__ import annotations

import pytest
import torch

import indexattn
from indexattn import ir
from indexattn.backends import triton as backend
from indexattn.oracle.reference import evaluate
from indexattn.oracle.verify import sample_arguments, sample_sizes

pytest.importorskip("triton")
if torch.cuda.is_available():
    pytest.skip(
        "Triton compiles for the GPU here (conftest.py): the GPU's checks are "
        "benchmarks/triton_gpu.py",
        allow_module_level=True,
    )
from indexattn.backends.triton import check
from indexattn.backends.triton.core import Refused, describe
from indexattn.backends.triton.emit import generate
from indexattn.backends.triton.launch import Launch

TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12}


def _spec(name: str) -> ir.Spec:
    return indexattn.compile_spec(name).ir


def compare(name, sizes, **options):
    return check.compare(_spec(name), sizes, **options)


CASES = [*check.CASES, *(pytest.param(*case, marks=pytest.mark.slow) for case in check.SLOW)]


@pytest.mark.parametrize(("name", "sizes", "what"), CASES)
def test_kernels_equal_the_oracle_forward_and_backward(name, sizes, what):
    errors = compare(name, sizes)
    assert max(errors.values()) < TOLERANCE[torch.float32], errors


@pytest.mark.slow
def test_float64():
    errors = compare(
        "sinks_core",
        {"N": 20, "N_kv": 23, "h_kv": 1, "n_rep": 2},
        dtype=torch.float64,
        learned=["Q", "K", "V", "s_aux"],
    )
    assert max(errors.values()) < TOLERANCE[torch.float64], errors


def test_the_sink_gradient_is_the_oracles_and_a_wrong_one_is_seen():
    """attention_sinks' learned sink: its gradient equals autograd's; with the sink's logits
    moved the forward differs (the twin: the comparison sees a sink at all)."""
    errors = compare(
        "sinks_core", {"N": 18, "N_kv": 18, "h_kv": 1, "n_rep": 2}, learned=["Q", "K", "V", "s_aux"]
    )
    assert errors["s_aux"] < 1e-5 and errors["forward"] < 1e-5, errors
    spec = _spec("sinks_core")
    sizes = sample_sizes(spec, fixed={"N": 18, "N_kv": 18, "h_kv": 1, "n_rep": 2})
    args = sample_arguments(spec, sizes, batch=(1,), dtype=torch.float32, seed=1)
    got = backend.run(spec, **args)[0]
    args["s_aux"] = args["s_aux"] + 1
    assert check.relative(got, evaluate(spec, **args)[0]) > 1e-3


def test_dead_rows_give_zeros_and_zero_gradients():
    """Rows whose every key is masked (-inf in M): the oracle's zeros, forward and backward."""

    def dead(args):
        args["M"][..., 3:7, :] = -torch.inf

    errors = compare(
        "gqa_core", {"N": 19, "N_kv": 21, "h_kv": 1, "n_rep": 2}, edit=dead, learned=["Q", "K", "V"]
    )
    assert max(errors.values()) < 2e-5, errors


def test_split_k_decode_equals_the_oracle_and_its_twin_differs():
    """Three queries over 70 keys in chunks of whole blocks (one row sees no key of the first
    chunk), the chunks' sums combined after: the oracle's outputs, and the backward from the
    combined logsumexp autograd's. The twin: the same with the sink's logits moved differs.
    (A row with no key at all and a sink: the oracle's gradient is NaN, autograd's through
    logsumexp of -inf only, where the kernels give the zeros it should be.)"""

    def dead(args):
        args["M"][..., 1, :32] = -torch.inf

    sizes = {"N": 3, "N_kv": 70, "h_kv": 1, "n_rep": 2}
    errors = compare("sinks_core", sizes, edit=dead, splits=3)
    assert max(errors.values()) < 2e-5, errors
    spec = _spec("sinks_core")
    args = sample_arguments(spec, sample_sizes(spec, fixed=sizes), dtype=torch.float32, seed=1)
    got = backend.run(spec, splits=3, **args)[0]
    args["s_aux"] = args["s_aux"] + 1
    assert check.relative(got, evaluate(spec, **args)[0]) > 1e-3


def test_a_dead_row_beside_a_sink_gives_zeros_and_zero_gradients():
    """A row that sees no key at all, and a sink: the oracle's output (zeros), and a zero
    gradient at it, where the oracle's autograd is NaN (logsumexp over -inf only)."""
    spec = _spec("sinks_core")
    sizes = sample_sizes(spec, fixed={"N": 3, "N_kv": 20, "h_kv": 1, "n_rep": 2})
    args = sample_arguments(spec, sizes, dtype=torch.float32, seed=1)
    args["M"][..., 1, :] = -torch.inf
    args["Q"].requires_grad_(True)
    got = backend.run(spec, **args)[0]
    assert check.relative(got, evaluate(spec, **args)[0]) < 1e-6
    assert got[..., 1, :].abs().max() == 0
    (dq,) = torch.autograd.grad(got, [args["Q"]], torch.ones_like(got))
    assert dq[..., 1, :].abs().max() == 0 and dq.abs().max() > 0


@pytest.mark.parametrize("n", check.EDGES)
@pytest.mark.parametrize(("name", "sizes", "what"), check.SWEPT)
def test_features_across_block_edges(name, sizes, what, n):
    """Each feature at N around the 64-wide block's edges, batched, every gradient."""
    sizes = check.at_length(name, sizes, n)
    errors = compare(name, sizes, block=check.SWEPT_BLOCK)
    assert max(errors.values()) < 5e-5, errors


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("differential", "attention cores"),
        ("t5_bias", "computed positions"),
        ("talking_heads", "not softmax"),
        ("linear_attention", "no attention cores"),
    ],
)
def test_other_cores_are_refused_by_name(name, reason):
    with pytest.raises(Refused, match=reason):
        describe(_spec(name))


def test_refused_without_triton(monkeypatch):
    monkeypatch.setattr(backend, "available", lambda: False)
    with pytest.raises(Refused, match=r"indexattn\[triton\]"):
        backend.run("sinks_core")


# -- memory safety: guard regions


SENTINEL = float("nan")  # a read of it poisons what it touches, 0 · NaN included
# guards of 4096 elements each side: a twin's unmasked tile (a block past the view) stays inside


def _guarded(shape, dtype, fill=None, pad=4096):
    """A tensor of `shape` in the middle of a larger buffer whose rest holds a sentinel; its
    rows strided wider than it is (so that a read past a row's end reads the sentinel)."""
    rows = shape[-1] + 5
    outer = int(torch.tensor(shape[:-1]).prod())
    buffer = torch.full((2 * pad + outer * rows,), SENTINEL, dtype=dtype)
    view = buffer[pad : pad + outer * rows].view(*shape[:-1], rows)[..., : shape[-1]]
    if fill is not None:
        view.copy_(fill)
    return buffer, view


def _untouched(buffer: torch.Tensor, view: torch.Tensor) -> bool:
    mask = torch.ones_like(buffer, dtype=torch.bool)
    offset = view.storage_offset()
    index = torch.as_strided(torch.arange(buffer.numel()), view.shape, view.stride(), offset)
    mask[index.flatten()] = False
    return bool(buffer[mask].isnan().all())


def _launch_guarded(unmasked=frozenset()):
    """Every kernel of sinks_core on guarded buffers, the gradients of its mask M and of its
    scalars written too: (whether each one's guards are untouched, all outputs finite)."""
    spec = _spec("sinks_core")
    kernels = generate(describe(spec), unmasked)
    g = torch.Generator().manual_seed(0)
    B, H, HK, NQ, NK, D, DV = 1, 2, 1, 19, 21, 6, 5
    made = {}

    def tensor(name, shape, data=None):
        made[name] = _guarded(shape, torch.float32, data)
        return made[name][1]

    q = tensor("q", (B, H, NQ, D), torch.randn(B, H, NQ, D, generator=g))
    k = tensor("k", (B, HK, NK, D), torch.randn(B, HK, NK, D, generator=g))
    v = tensor("v", (B, HK, NK, DV), torch.randn(B, HK, NK, DV, generator=g))
    mask = tensor("mask", (B, H, NQ, NK), torch.zeros(B, H, NQ, NK))
    sink = tensor("sink", (B, H, NQ), torch.randn(1, H, 1, generator=g).expand(B, H, NQ))
    values = {s.symbol: s.value for s in spec.scalars}
    values.update(dict(zip(spec.sizes, [NQ, NK, HK, H // HK, D, DV])))
    launch = Launch(kernels, q, k, v, sink, [mask], values, params=True)
    o, lse = tensor("o", (B, H, NQ, DV)), tensor("lse", (B, H, NQ))
    launch.forward(o, lse)
    do = tensor("do", (B, H, NQ, DV), torch.randn(B, H, NQ, DV, generator=g))
    grads = [tensor(n, s) for n, s in (("dq", q.shape), ("dk", k.shape), ("dv", v.shape))]
    delta, dsink = tensor("delta", (B, H, NQ)), tensor("dsink", (B, H, NQ))
    params = (
        tensor("dload", (len(kernels.graded), B * H, NQ, NK)),
        tensor("dscalar", (len(kernels.scalars), B * H, NQ)),
    )
    launch.backward(o, lse, do, *grads, delta, dsink, params)
    untouched = {name: _untouched(*pair) for name, pair in made.items()}
    finite = all(torch.isfinite(pair[1]).all() for pair in made.values())
    return untouched, finite


def test_guard_regions_stay_untouched():
    untouched, finite = _launch_guarded()
    assert all(untouched.values()) and finite, untouched


def test_a_dropped_store_mask_is_caught_by_the_guards():
    """The twin: the output's store printed without its mask writes past the rows."""
    untouched, _ = _launch_guarded(frozenset({"o"}))
    assert not untouched["o"], untouched


def test_a_dropped_gradient_store_mask_is_caught_by_the_guards():
    """The twin for the mask's gradient, written per element: without its store's mask the
    dQ kernel writes past each row of the buffer."""
    untouched, _ = _launch_guarded(frozenset({"dload"}))
    assert not untouched["dload"] and untouched["o"], untouched


def test_a_dropped_load_mask_is_caught():
    """The keys read without their mask read the sentinels past each row: the outputs are no
    longer the guarded run's (that twin of the value check)."""
    _, finite = _launch_guarded(frozenset({"k"}))
    assert not finite


# -- the backend seam: backend="triton" in compile_spec, module, auto


def test_compile_spec_backend_triton_runs_the_kernels(monkeypatch):
    """backend="triton": the spec's outputs, equal to the blocked path's, computed by the
    kernels (each call of `whole.attend` counted); the twin: "auto" never calls them."""
    from indexattn.backends.triton import whole

    calls = []
    attend = whole.attend
    monkeypatch.setattr(whole, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    spec = _spec("sigmoid_attention")
    sizes = sample_sizes(spec, fixed={"N": 20, "h": 2, "d_k": 3, "d_m": 4})
    args = sample_arguments(spec, sizes, batch=(2,), dtype=torch.float32, seed=1)
    want = indexattn.compile_spec("sigmoid_attention", backend="blocks")(**args, h=2)
    got = indexattn.compile_spec("sigmoid_attention", backend="triton")(**args, h=2)
    assert check.relative(got, want) < 1e-6 and calls == [1]
    indexattn.compile_spec("sigmoid_attention")(**args, h=2)
    assert calls == [1]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("differential", "no attention cores"),
        ("t5_bias", "T5 buckets"),
        ("talking_heads", "stick-breaking, top-k"),
    ],
)
def test_backend_triton_refuses_by_name(name, reason):
    from indexattn.backends import Refused as BackendRefused

    with pytest.raises(BackendRefused, match=f"backend='triton' cannot .* {name}: .*{reason}"):
        indexattn.compile_spec(name, backend="triton")


def test_backend_triton_without_the_package_is_refused_by_name(monkeypatch):
    """The twin of a spec it takes: causal_head compiles with triton there, not without it."""
    from indexattn.backends import Refused as BackendRefused
    from indexattn.runtime import compiled

    monkeypatch.setattr(backend, "available", lambda: False)
    monkeypatch.setattr(compiled, "_CACHE", {})
    with pytest.raises(BackendRefused, match=r"pip install 'indexattn\[triton\]'"):
        indexattn.compile_spec("causal_head", backend="triton")
    monkeypatch.undo()
    assert indexattn.compile_spec("causal_head", backend="triton").backend == "triton"


def test_auto_picks_triton_on_cuda_where_flex_cannot():
    from indexattn.backends import auto

    assert auto("cuda", False, True) == "triton"
    assert auto("cuda", True, True) == "flex"
    assert auto("xpu", False, True) == "auto"
    assert auto("cpu", False, True) == "auto"
    assert auto("cuda", False, False) == "auto"


# -- the gradients of what else the score reads: a bias per element, scalars


def _softcap_gradients(cap_for_reference: float):
    """softcap_core's gradients on the kernels and on the blocked path's autograd: Q, K, V,
    the additive mask M (per element) and the scalars softcap and scaling (tensors)."""
    spec = _spec("softcap_core")
    fixed = {"N": 20, "N_kv": 21, "h_kv": 1, "n_rep": 2, "d_k": 4, "d_v": 4}
    args = sample_arguments(spec, sample_sizes(spec, fixed=fixed), dtype=torch.float32, seed=1)
    names = ("Q", "K", "V", "M")
    for n in names:
        args[n].requires_grad_(True)
    errors = {}
    outs = []
    for name, cap in (("triton", 1.5), ("blocks", cap_for_reference)):
        scalars = [torch.tensor(cap, requires_grad=True), torch.tensor(0.3, requires_grad=True)]
        out = indexattn.compile_spec("softcap_core", backend=name)(
            **args, softcap=scalars[0], scaling=scalars[1]
        )
        seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        outs.append(torch.autograd.grad(out, [args[n] for n in names] + scalars, seed))
    for n, a, b in zip((*names, "softcap", "scaling"), *outs):
        errors[n] = check.relative(a, b)
    return errors


def test_the_gradients_of_a_bias_and_of_scalars_are_autograds():
    errors = _softcap_gradients(1.5)
    assert max(errors.values()) < 2e-5, errors


def test_a_moved_scalar_moves_its_gradient():
    """The twin: against the reference at another cap, the cap's gradient differs."""
    errors = _softcap_gradients(2.0)
    assert errors["softcap"] > 1e-3, errors
