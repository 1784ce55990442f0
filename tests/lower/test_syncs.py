"""Value-dependent branches: how many times one call of each shipped spec reads a tensor's
values back to the host (`.item()`, `bool()`, `.tolist()`, an op whose output shape depends on
values) — on a GPU each is a synchronisation that stalls the call and forbids CUDA graphs.
Counted from what runs, not from the text: aten's scalar reads and value-shaped ops under a
dispatch mode, and `Tensor.tolist` (which aten does not see). On the CPU the counts are
docs/performance.md's table; on any other device (the runtime's `HOST_READS` emptied)
every spec reads nothing."""

import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import indexattn
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"
NAMES = sorted(indexattn.shipped_specs())
aten = torch.ops.aten
READS = {  # a value read back, or an output whose shape the host must learn first
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
}


class Reads(TorchDispatchMode):
    """Counts the reads of values back to the host while active, by where they come from."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist = torch.Tensor.tolist

        def counted(tensor):
            self.seen["Tensor.tolist"] += 1
            return tolist(tensor)

        self._tolist, torch.Tensor.tolist = tolist, counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def documented() -> dict[str, tuple[int, int]]:
    """docs/performance.md's table of the specs that read values on the CPU, per call: forward
    alone, and forward and backward."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- reads per call: kept equal by tests/lower/test_syncs.py -->")[1]
    table = table.split("<!-- end reads per call -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| (\d+) \|", table, flags=re.M)
    return {name: (int(forward), int(both)) for name, forward, both in rows}


def call(spec, backward: bool):
    """One call of the spec on random float32 data with a batch axis (its second: the first
    builds the constants), forward without gradients or forward and backward."""
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, batch=(2,), dtype=torch.float32)
    args = {k: v.requires_grad_(backward) if v.is_floating_point() else v for k, v in args.items()}
    given = {k: v for k, v in sizes.items() if k in spec.required}

    def run():
        with torch.set_grad_enabled(backward):
            out = spec(**args, **given)
            if backward:
                outs = out if isinstance(out, tuple) else (out,)
                sum(o.float().sum() for o in outs if o.requires_grad).backward()

    run()
    return run


def reads(run) -> int:
    with Reads() as counter:
        run()
    return sum(counter.seen.values())


@pytest.mark.parametrize("name", NAMES)
def test_reads_per_call_are_the_documented_ones(name, monkeypatch):
    """On the CPU, the documented reads (0 for a spec the table leaves out), with and without
    a backward; on another device, none."""
    spec = indexattn.compile_spec(name)
    want = documented().get(name, (0, 0))
    for backward in (False, True):
        assert reads(call(spec, backward)) == want[backward], (name, backward)
    monkeypatch.setattr(rt, "HOST_READS", ())
    for backward in (False, True):
        assert reads(call(spec, backward)) == 0, (name, backward)


def test_the_table_names_shipped_specs_that_read():
    table = documented()
    assert table and set(table) <= set(NAMES) and all(min(counts) > 0 for counts in table.values())


@pytest.mark.parametrize("planted", ["item", "bool", "tolist", "nonzero"])
def test_a_planted_read_is_counted(planted, monkeypatch):
    """The twin: mha reads nothing; with one read planted in its function, one is counted."""
    spec = indexattn.compile_spec("mha")
    run = call(spec, backward=False)
    assert reads(run) == 0
    function = spec.function
    read = {
        "item": lambda x: x.sum().item(),
        "bool": lambda x: bool(x.sum() > 0),
        "tolist": lambda x: x[..., 0, 0].tolist(),
        "nonzero": lambda x: x.nonzero(),
    }[planted]

    def planted_function(*args, **kwargs):
        read(args[0])
        return function(*args, **kwargs)

    monkeypatch.setattr(spec, "function", planted_function)
    assert reads(run) == 1


MASKED = """index τ, τ' : N
index a : d
input X_<τa>
input M_<ττ'>
S_<ττ'> = X_<τa> X_<τ'a> + M_<ττ'>
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
output A
"""


@pytest.mark.parametrize("host", [True, False], ids=["cpu", "device"])
def test_a_row_hidden_everywhere_gives_zeros_on_every_path(host, monkeypatch):
    """A safe softmax (the mask is an input: a row can be -inf everywhere) gives zeros there,
    values and gradients, with and without gradients, whether it branches on values (the CPU)
    or not (any other device); its live rows equal the CPU's. The twin: the plain softmax of
    the same scores makes the dead row NaN."""
    spec = indexattn.compile_spec(MASKED, name="masked")
    x = torch.randn(5, 3, dtype=torch.float64)
    mask = torch.zeros(5, 5, dtype=torch.float64).index_fill_(0, torch.tensor([2]), -torch.inf)
    mask[0, 3] = -torch.inf
    cotangent = torch.randn(5, 5, dtype=torch.float64)

    def run():
        leaf = x.clone().requires_grad_()
        weights = spec(X=leaf, M=mask)
        weights.backward(cotangent)
        with torch.no_grad():
            return weights.detach(), leaf.grad, spec(X=x, M=mask)

    want, want_grad, _ = run()  # the CPU's
    if not host:
        monkeypatch.setattr(rt, "HOST_READS", ())
    got, grad, overwritten = run()
    for weights in (got, overwritten):
        assert weights[2].eq(0).all() and not weights.isnan().any()
        torch.testing.assert_close(weights, want, rtol=0, atol=1e-15)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-14)
    assert torch.isfinite(grad).all()
    assert torch.softmax(x @ x.T + mask, -1)[2].isnan().all()
