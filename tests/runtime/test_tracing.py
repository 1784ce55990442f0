"""Per-shape state under pressure: 8 threads at different shapes (every shipped spec with a
mask: the ones whose generated code keeps per-shape state or reads a mask input), and tracing
with a dynamic sequence length on every shipped spec: torch.compile (fullgraph, dynamic) with
the eager backend or aot_eager (autograd's graph too, on one spec of each kind of generated
code), forward and backward, and torch.export; inductor on one; shape checks that hold when
traced. The module's knobs are made small (SMALL), so that the eager module the traced one
is compared with runs several blocks of rows, spans and chunks at N of 9 to 20.
Which specs, and the complete run: docs/testing.md, "Tracing"."""

import math
import os
import threading
from pathlib import Path

import pytest
import sympy
import torch

import indexattn
from indexattn.ir.shapes import quotients
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

ROOT = Path(__file__).resolve().parents[2]
MASKED = sorted(
    p.stem
    for p in (ROOT / "specs").glob("*.attn")
    if "where(" in p.read_text(encoding="utf-8") or "mask" in p.read_text(encoding="utf-8")
)


def sequence_sizes(spec) -> set[str]:
    """The sizes of the inputs' first axes: the ones a call may change. A size that a
    parameter also has is not among them (kv_decode's cache Kc_<μca> starts with the heads),
    nor one of an input's grouped axis (sinks_core's s_aux_<(gr)>: the heads)."""
    fixed = {
        spec.ir.size_ascii(s)
        for t in spec.ir.tensors_of("param", "buffer", "input")
        for axis in t.layout
        if t.role != "input" or len(axis) > 1
        for index in axis
        for s in index.size.free_symbols
    }
    return {spec.ir.size_ascii(t.layout[0][0].size) for t in spec.ir.tensors_of("input")} - fixed


EVERY = sorted(indexattn.shipped_specs())
# one spec per kind of generated code that autograd's tracing can meet: the attention kernel
# (is_causal, a float bias), rotary tables, positions gathered (T5's buckets), a KV cache
# joined, elu features, prefix products by chunks, a sink column, scores by hand with a soft
# cap and the safe softmax, Bloom's log of the head count
AOT = [
    "mha",
    "alibi",
    "rope",
    "t5_bias",
    "kv_decode",
    "linear_attention",
    "linear_attention_causal",
    "attention_sinks",
    "softcap_window",
    "models/bloom",
]
INDUCTOR = ["linear_attention_causal"]  # C++ kernels built on the CPU: ~30 s a spec
if os.environ.get("INDEXATTN_TRACE_ALL"):  # the complete run (docs/testing.md)
    AOT = INDUCTOR = EVERY


# the module's knobs at sizes that reach several blocks of rows and chunks at N of 9 to 20
# (the generated code's names; a second knob of a kind gets a suffix), and the runtime's, of
# spans
SMALL = {"BLOCK_SCORES": 16, "BLOCK_ROWS": 1, "CHUNK": 4, "DECAY_CHUNK": 4}
QUERY_BLOCK = 4


def small_blocks(spec, monkeypatch) -> None:
    """The spec's knobs set to SMALL for the test, and the runtime's to QUERY_BLOCK."""
    monkeypatch.setattr(rt, "QUERY_BLOCK", QUERY_BLOCK)
    namespace = spec.function.__globals__
    for name in list(namespace):
        if name.rstrip("_0123456789") in SMALL:
            monkeypatch.setitem(namespace, name, SMALL[name.rstrip("_0123456789")])


def layer(name, n: int | None = None, dtype=torch.float64):
    """A module of the spec (a name, or a compiled spec) built without its sequence sizes,
    and inputs of length n."""
    spec = name if isinstance(name, indexattn.CompiledSpec) else indexattn.compile_spec(name)
    sizes = sample_sizes(spec.ir)
    dynamic = sequence_sizes(spec)
    if n is not None:
        sizes |= dict.fromkeys(dynamic, n * multiple(spec, sizes))
    module = spec.module(**{k: v for k, v in sizes.items() if k not in dynamic})
    args = sample_arguments(spec.ir, sizes, (2,), dtype)
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    return spec, module.to(dtype).eval(), [args[t.ascii] for t in spec.ir.tensors_of("input")]


def multiple(spec, sizes: dict) -> int:
    """What a sequence length is a multiple of: the blocks of ranges `N / ℓ` (nsa's ℓ, a
    parameter's size, fixed while the length moves); 1 for a spec without one."""
    values = {s: sizes[a] for s, a in spec.ir.size_names.items()}
    unders = (sympy.fraction(sympy.together(q))[1] for q in quotients(spec.ir))
    return math.prod(int(under.subs(values)) for under in unders)


def test_the_masked_specs_are_found():
    assert {"alibi", "sliding_window", "mha", "torch_mha"} <= set(MASKED)


@pytest.mark.parametrize("name", MASKED)
def test_eight_threads_at_different_shapes(name):
    calls = {n: layer(name, n) for n in (3, 4, 5, 6, 7, 8, 9, 10)}
    want = {n: module(*inputs) for n, (_, module, inputs) in calls.items()}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        _, module, inputs = calls[n]
        try:
            for _ in range(300):
                got = module(*inputs)
                assert all(torch.equal(g, w) for g, w in zip(_tuple(got), _tuple(want[n])))
        except BaseException as error:  # reported below, from the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    assert not any(thread.is_alive() for thread in threads)


def test_every_shipped_spec_is_traced():
    assert set(AOT) | set(INDUCTOR) <= set(EVERY) and len(EVERY) >= 60


def forward_backward(module, inputs):
    """The outputs and the gradients of every float input and parameter, for one loss."""
    inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    outputs = [o for o in _tuple(module(*inputs)) if o.is_floating_point()]
    weights = [torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o) for o in outputs]
    loss = sum((o * w).sum() for o, w in zip(outputs, weights))
    leaves = [t for t in inputs if t.requires_grad] + list(module.parameters())
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return outputs + [g for g in grads if g is not None]


# specs whose graph dynamo specialises to the traced length (their values still checked at
# every length, after a recompile): the interface cores and the decode specs (issue 38, open)
RECOMPILED = {
    "gqa_causal_core", "gqa_core", "gqa_heads_core", "gqa_unmasked_core", "sinks_core",
    "softcap_core", "gqa_chunked_core", "gqa_window_core", "sinks_window_core",
    "softcap_window_core",
    "kv_decode", "models/gpt2_decode", "models/gpt_neox_decode",
}  # fmt: skip


def compiled_matches_eager(name: str, backend: str, monkeypatch) -> None:
    """Traced once with dynamic shapes at SMALL, run forward and backward at 6 positions and
    then, with no graph traced again, at 2 and 17 (eager: several blocks and chunks)."""
    torch._dynamo.reset()
    spec, module, _ = layer(name, dtype=torch.float32)
    small_blocks(spec, monkeypatch)
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend=backend)
    for n in (6, 2, 17):
        _, _, longer = layer(name, n, torch.float32)
        want = forward_backward(module, longer)  # first: einops' caches, which dynamo guards
        once = n != 6 and name not in RECOMPILED
        with torch.compiler.set_stance("fail_on_recompile" if once else "default"):
            got = forward_backward(compiled, longer)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(set(EVERY) - set(AOT)))
def test_torch_compile_with_dynamic_shapes(name, monkeypatch):
    """Dynamo's graph, whole; aot_eager below traces the same graph and autograd's too."""
    compiled_matches_eager(name, "eager", monkeypatch)


@pytest.mark.parametrize("name", AOT)
def test_aot_eager_forward_and_backward_with_dynamic_shapes(name, monkeypatch):
    """linear_attention's backward failed ("view size is not compatible": elu's backward of a
    strided view); Bloom's `2^floor(log(h) / log(2))` read a tensor's value."""
    compiled_matches_eager(name, "aot_eager", monkeypatch)


@pytest.mark.parametrize("name", INDUCTOR)
def test_inductor_forward_and_backward_with_dynamic_shapes(name, monkeypatch):
    compiled_matches_eager(name, "inductor", monkeypatch)


LENGTHS = (2, 3, 9, 20)  # one row to several blocks of rows, spans and chunks at SMALL


def exported(spec, module, inputs):
    """The module exported with each of its sequence sizes a Dim from 2 to 8192, a multiple of
    the blocks of a range `N / ℓ` where the spec has one (nsa's N: a derived Dim)."""
    step = multiple(spec, sample_sizes(spec.ir))

    def dim(size: str):
        # named apart from the sizes: a derived Dim reads its name with sympy (N is a function)
        free = torch.export.Dim(f"{size}_dim", min=2, max=8192 // step)
        return free if step == 1 else step * free

    dims = {s: dim(s) for s in sorted(sequence_sizes(spec))}
    shapes = {  # by the inputs' names, as forward's signature has them
        t.ascii: {
            k + 1: dim
            for k, axis in enumerate(t.layout)
            if len(axis) == 1 and (dim := _dim(spec, axis[0].size, dims)) is not None
        }
        for t in spec.ir.tensors_of("input")
    }
    return torch.export.export(module, tuple(inputs), dynamic_shapes=shapes).module()


def largest_error(spec, program, module) -> float:
    """The largest difference of the program's outputs from the eager module's at LENGTHS,
    relative to the largest output."""
    errors = []
    for n in LENGTHS:
        _, _, longer = layer(spec, n)
        for got, want in zip(_tuple(program(*longer)), _tuple(module(*longer))):
            assert got.shape == want.shape and got.dtype == want.dtype
            if got.is_floating_point():
                errors.append(((got - want).abs().max() / want.abs().max().clamp(min=1)).item())
            else:
                errors.append(float(not torch.equal(got, want)))
    return max(errors)


# torch 2.9's symbolic shapes cannot prove the guards the chunked prefix sums raise on the chunk
# count (`2 % (10*((N + 7)//4)) != 0`); 2.13 and 2.15 can (docs/testing.md, "Tracing")
CHUNKED = ("linear_attention_causal", "retention")
OLD_TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 10)
EXPORTED = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            OLD_TORCH and name in CHUNKED,
            reason="torch < 2.10 cannot export the chunk count's guards at a dynamic N",
        ),
    )
    for name in EVERY
]


@pytest.mark.parametrize("name", EXPORTED)
def test_torch_export_with_a_dynamic_sequence_length(name, monkeypatch):
    """Exported at 13 positions and run from 2 to 20 at SMALL, in float64: eager runs several
    blocks of rows, spans and chunks; the program, one block and its chunks counted from N."""
    spec, module, inputs = layer(name, 13)
    small_blocks(spec, monkeypatch)
    assert largest_error(spec, exported(spec, module, inputs), module) < 1e-12


def test_twin_the_exported_program_is_compared_to_rounding(monkeypatch):
    """A weight moved by 1e-9 after the export: the comparison above sees it."""
    spec, module, inputs = layer("sigmoid_attention", 13)
    small_blocks(spec, monkeypatch)
    program = exported(spec, module, inputs)
    moved = module.o_proj_weight.detach().clone()  # the program shares the module's tensors
    moved[0, 0] += 1e-9
    module.o_proj_weight = torch.nn.Parameter(moved)
    assert largest_error(spec, program, module) > 1e-12


def test_small_blocks_reach_several_blocks(monkeypatch):
    """The twin of SMALL: at N = 20, sigmoid_attention's eager call runs its rows function by
    blocks; with the shipped knobs, once."""
    spec, module, _ = layer("sigmoid_attention", 20)
    rows, calls = spec.function.__globals__["sigmoid_attention_rows"], []
    counting = lambda *args, **kwargs: calls.append(1) or rows(*args, **kwargs)  # noqa: E731
    monkeypatch.setitem(spec.function.__globals__, "sigmoid_attention_rows", counting)
    _, _, inputs = layer(spec, 20)
    module(*inputs)
    small_blocks(spec, monkeypatch)
    module(*inputs)
    assert calls[0] == 1 and len(calls) > 5


@pytest.mark.parametrize("name", ["softcap_window", "linear_attention_causal", "retention"])
def test_torch_export_of_the_derived_backward(name, monkeypatch):
    """The derived backward is a spec: exported like one, its blocks of rows summing dK and
    dV, and its chunks, from 2 to 20 positions."""
    spec, module, inputs = layer(indexattn.compile_spec(name).backward(), 13)
    small_blocks(spec, monkeypatch)
    assert largest_error(spec, exported(spec, module, inputs), module) < 1e-12


def test_shape_errors_hold_under_torch_compile():
    torch._dynamo.reset()
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    module = spec.module(d_m=12, h=3, d_k=4)
    compiled = torch.compile(module, backend="eager")
    compiled(torch.randn(2, 5, 12))
    with pytest.raises(indexattn.ShapeError, match=r"X_<τi>, axis 1 \(i\) has size 13"):
        compiled(torch.randn(2, 5, 13))  # a wrong width: was a raw TorchRuntimeError
    module._parameters["b_O"] = torch.nn.Parameter(torch.zeros(1))  # would broadcast
    with pytest.raises(indexattn.ShapeError, match=r"b_O_<i>, axis 0 \(i\)"):
        compiled(torch.randn(2, 5, 12))


def test_shape_errors_under_fullgraph_carry_the_message():
    torch._dynamo.reset()
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    compiled = torch.compile(spec.module(d_m=12, h=3, d_k=4), fullgraph=True, backend="eager")
    compiled(torch.randn(2, 5, 12))
    with pytest.raises(Exception, match=r"ShapeError.*X_<τi>, axis 1 \(i\) has size 13"):
        compiled(torch.randn(2, 5, 13))


def _dim(spec, size, dims: dict):
    """The export Dim of an axis of this size: a dynamic size's own, or one plus a number
    (a decode step's keys, `N_c + N` with the cache's length fixed); None for a fixed axis."""
    names = {s: spec.ir.size_ascii(s) for s in size.free_symbols}
    moving = [s for s, name in names.items() if name in dims]
    if len(moving) != 1 or sympy.diff(size, moving[0]) != 1:
        return None
    fixed = sample_sizes(spec.ir)
    offset = (size - moving[0]).subs({s: fixed[n] for s, n in names.items() if s != moving[0]})
    dim = dims[names[moving[0]]]
    return dim + int(offset) if offset != 0 else dim


def _tuple(value):
    return value if isinstance(value, tuple) else (value,)


def test_twin_the_comparison_sees_another_module():
    torch._dynamo.reset()
    _, module, _ = layer("mha", dtype=torch.float32)
    _, other, longer = layer("mha", 5, torch.float32)
    with torch.no_grad():
        other.W.add_(0.01)
    compiled = torch.compile(other, dynamic=True, fullgraph=True, backend="eager")
    got, want = forward_backward(compiled, longer), forward_backward(module, longer)
    assert not all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want))
