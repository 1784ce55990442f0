"""On a GPU (marked `cuda`; skipped where torch sees no CUDA device): every shipped spec on
CUDA equals its CPU result in float64, values and every gradient, at a length that reaches
several blocks of rows, spans and chunks; in bfloat16 it is as close to float64 as on the
CPU; the derived backward equals autograd's; a long-context forward and backward holds no
table over two sequence indices; inductor (Triton) compiles the generated code with a
dynamic length. Run on a lent card: `python -m pytest -m cuda tests/runtime/test_cuda.py`
(docs/performance.md, "On a GPU", has the card and the figures)."""

import pytest
import test_precision as low
import torch
from test_tracing import EVERY, _tuple, forward_backward, layer, small_blocks

import indexattn
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
CUDA = torch.device("cuda")
LONG = 8192  # positions: one head's float32 table over two of them is LONG² × 4 B = 268 MB


def table_megabytes(n: int) -> float:
    """One head's float32 table over two sequence indices of n positions."""
    return n * n * 4 / 1e6


def on_cuda(module, inputs):
    """The module moved (not a copy: a copy compiles the spec again, and the knobs set on the
    spec's function would not reach it) and its inputs copied."""
    return module.to(CUDA), [x.to(CUDA) for x in inputs]


def largest_difference(got, want) -> float:
    """max |got - want| / (1 + max |want|) over the tensors, each compared on the CPU."""
    assert len(got) == len(want)
    return max(
        ((g.cpu() - w.cpu()).abs().max() / (1 + w.abs().max().cpu())).item()
        for g, w in zip(got, want)
    )


@pytest.mark.parametrize("name", EVERY)
def test_every_shipped_spec_on_cuda_equals_the_cpu(name, monkeypatch):
    spec, module, inputs = layer(name, 20)
    small_blocks(spec, monkeypatch)
    want = forward_backward(module, inputs)
    assert largest_difference(forward_backward(*on_cuda(module, inputs)), want) < 1e-10


def test_twin_a_weight_moved_on_cuda_is_seen(monkeypatch):
    spec, module, inputs = layer("softcap_window", 20)
    small_blocks(spec, monkeypatch)
    want = forward_backward(module, inputs)
    moved, moved_inputs = on_cuda(module, inputs)
    with torch.no_grad():
        next(moved.parameters()).view(-1)[0] += 1e-6
    assert largest_difference(forward_backward(moved, moved_inputs), want) > 1e-10


def test_every_spec_in_bfloat16_on_cuda_close_to_float64(shipped):
    want = low.run(shipped, torch.float64)
    assert low.error(low.run(shipped, torch.bfloat16, device=CUDA), want) < low.MODULE_TOLERANCE


def test_twin_a_moved_weight_in_bfloat16_on_cuda_shows():
    spec = indexattn.compile_spec("mha")
    want = low.run(spec, torch.float64)
    assert (
        low.error(low.run(spec, torch.bfloat16, bump=True, device=CUDA), want)
        > low.MODULE_TOLERANCE
    )


def gradients(spec, args: dict, backward: str) -> dict:
    """Every float argument's gradient of one weighted sum of the first output."""
    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    given = {k: v for k, v in sample_sizes(spec.ir).items() if k in spec.required}
    out = _tuple(spec(**leaves, **given, backward=backward))[0]
    weights = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype)
    wanted = [k for k, v in leaves.items() if v.requires_grad]
    grads = torch.autograd.grad(
        (out * weights.view_as(out)).sum(), [leaves[k] for k in wanted], allow_unused=True
    )
    return {k: g for k, g in zip(wanted, grads) if g is not None}


DERIVED = ["mha", "alibi", "softcap_window", "differential", "retention", "linear_attention_causal"]


@pytest.mark.parametrize("name", DERIVED)
def test_the_derived_backward_on_cuda_equals_autograd(name):
    spec = indexattn.compile_spec(name)
    args = sample_arguments(spec.ir, sample_sizes(spec.ir), (2,), device=CUDA)
    want, got = gradients(spec, args, "autograd"), gradients(spec, args, "derived")
    assert set(got) == set(want)
    assert largest_difference(list(got.values()), list(want.values())) < 1e-10


def test_twin_the_derived_backward_at_a_moved_argument_differs():
    spec = indexattn.compile_spec("softcap_window")
    args = sample_arguments(spec.ir, sample_sizes(spec.ir), (2,), device=CUDA)
    want = gradients(spec, args, "autograd")
    name = next(k for k, v in args.items() if v.is_floating_point())
    args[name] = args[name] + 1e-6
    got = gradients(spec, args, "derived")
    assert largest_difference([got[k] for k in want], list(want.values())) > 1e-10


def peak_megabytes(module, inputs) -> float:
    """What the allocator holds above its start at the peak of a forward and backward."""
    forward_backward(module, inputs)  # per-shape tables and the gradients' storage first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    forward_backward(module, inputs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - start) / 1e6


LONG_CONTEXT = ["alibi", "t5_bias", "sliding_window", "softcap_window", "doc_mask", "forgetting"]


@pytest.mark.parametrize("name", LONG_CONTEXT)
def test_a_long_context_step_holds_no_table_over_two_sequence_indices(name):
    _, module, inputs = layer(name, LONG, torch.float32)
    assert peak_megabytes(*on_cuda(module, inputs)) < table_megabytes(LONG)


def test_twin_one_block_of_every_query_holds_the_table(monkeypatch):
    """At a length of its own: the spans of LONG, kept per shape, have blocks of 128."""
    n = LONG + 128
    _, module, inputs = layer("alibi", n, torch.float32)
    monkeypatch.setattr(rt, "QUERY_BLOCK", n)
    assert peak_megabytes(*on_cuda(module, inputs)) > table_megabytes(n)


@pytest.mark.parametrize("name", ["mha", "softcap_window"])
def test_inductor_on_cuda_with_a_dynamic_length(name, monkeypatch):
    """Triton kernels, traced once at 6 positions, run at 2 and 17 without a new graph
    (the eager module: several blocks of rows at SMALL)."""
    torch._dynamo.reset()
    spec, module, _ = layer(name, dtype=torch.float32)
    small_blocks(spec, monkeypatch)
    module = module.to(CUDA)
    compiled = torch.compile(module, dynamic=True, fullgraph=True)
    for n in (6, 2, 17):
        _, _, inputs = layer(name, n, torch.float32)
        inputs = [x.to(CUDA) for x in inputs]
        want = forward_backward(module, inputs)
        with torch.compiler.set_stance("default" if n == 6 else "fail_on_recompile"):
            got = forward_backward(compiled, inputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
