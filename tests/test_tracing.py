"""Per-shape state under pressure: 8 threads at different shapes, torch.compile with dynamic
shapes, torch.export with a dynamic sequence length, and shape checks that hold when traced.
Run on every shipped spec with a mask (the ones whose generated code keeps per-shape state
or reads a mask input)."""

import threading
from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle.verify import sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parent.parent
MASKED = sorted(
    p.stem
    for p in (ROOT / "specs").glob("*.attn")
    if "where(" in p.read_text(encoding="utf-8") or "mask" in p.read_text(encoding="utf-8")
)


def sequence_sizes(spec) -> set[str]:
    """The sizes of the inputs' first axes: the ones a call may change. A size that a
    parameter also has is not among them (kv_decode's cache Kc_<μca> starts with the heads)."""
    fixed = {
        spec.ir.size_ascii(s)
        for t in spec.ir.tensors_of("param", "buffer")
        for axis in t.layout
        for index in axis
        for s in index.size.free_symbols
    }
    return {spec.ir.size_ascii(t.layout[0][0].size) for t in spec.ir.tensors_of("input")} - fixed


def layer(name: str, n: int | None = None, dtype=torch.float64):
    """A module of the spec built without its sequence sizes, and inputs of length n."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    sizes = sample_sizes(spec.ir)
    dynamic = sequence_sizes(spec)
    if n is not None:
        sizes |= dict.fromkeys(dynamic, n)
    module = spec.module(**{k: v for k, v in sizes.items() if k not in dynamic})
    args = sample_arguments(spec.ir, sizes, (2,), dtype)
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    return spec, module.to(dtype).eval(), [args[t.ascii] for t in spec.ir.tensors_of("input")]


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


@pytest.mark.parametrize("name", MASKED)
def test_torch_compile_with_dynamic_shapes(name):
    torch._dynamo.reset()
    _, module, _ = layer(name, dtype=torch.float32)
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend="eager")
    for n in (5, 7, 9):
        _, _, longer = layer(name, n, torch.float32)
        for got, want in zip(_tuple(compiled(*longer)), _tuple(module(*longer))):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", MASKED)
def test_torch_export_with_a_dynamic_sequence_length(name):
    spec, module, inputs = layer(name)
    sizes = sequence_sizes(spec)
    dims = {size: torch.export.Dim(size, min=2, max=64) for size in sorted(sizes)}
    shapes = {  # by the inputs' names, as forward's signature has them
        t.ascii: {
            k + 1: dims[spec.ir.size_ascii(axis[0].size)]
            for k, axis in enumerate(t.layout)
            if len(axis) == 1
            and axis[0].size.is_Symbol
            and spec.ir.size_ascii(axis[0].size) in sizes
        }
        for t in spec.ir.tensors_of("input")
    }
    exported = torch.export.export(module, tuple(inputs), dynamic_shapes=shapes).module()
    _, _, longer = layer(name, 11)
    for got, want in zip(_tuple(exported(*longer)), _tuple(module(*longer))):
        torch.testing.assert_close(got, want)


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


def _tuple(value):
    return value if isinstance(value, tuple) else (value,)
