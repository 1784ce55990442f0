"""The blocks of queries (of rows) of a training step as one autograd step, the runtime's
`by_blocks`: its backward makes each block again and adds the block's gradients into one per
tensor, so that no block makes a gradient the size of a whole input (autograd's backward of
a slice does, once per block: work that grows as blocks × N). Against the twin that runs the
same blocks through autograd's own steps (`saving`, tests/conftest.py): the same gradients,
fewer whole-size tensors; dropout's draws replayed; no second derivative, but under
torch.func."""

import itertools
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import indexattn
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
FRESH = itertools.count()
N, BLOCK = 64, 8  # eight blocks of queries
# a window of 8 (each block's keys a span), a soft cap the kernel cannot take (rows)
CASES = {
    "sliding_window": ({"w": 8, "p": 0.0}, {"QUERY_BLOCK": BLOCK}),
    "softcap_window": (
        {"w": 8, "c": 5.0},
        {"QUERY_BLOCK": BLOCK, "BLOCK_SCORES": 2 * 3 * BLOCK, "BLOCK_ROWS": 1},
    ),
}


class Whole(TorchDispatchMode):
    """Counts the tensors made with at least `size` elements (a view makes none)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.count = size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made = out if isinstance(out, tuple | list) else (out,)
        if not any(r.alias_info for r in func._schema.returns):
            self.count += sum(isinstance(t, torch.Tensor) and t.numel() >= self.size for t in made)
        return out


def spec_in_blocks(name: str, monkeypatch, text: str | None = None):
    """The spec compiled afresh, its knobs set for eight blocks of queries at N = 64: the
    runtime's (QUERY_BLOCK), and the module's own (BLOCK_SCORES, BLOCK_ROWS)."""
    text = text or (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
    spec = indexattn.compile_spec(text, name=f"{name}_{next(FRESH)}")
    for knob, value in CASES.get(name, ({}, {"QUERY_BLOCK": BLOCK}))[1].items():
        if hasattr(rt, knob):
            monkeypatch.setattr(rt, knob, value)
        else:
            monkeypatch.setitem(spec.function.__globals__, knob, value)
    return spec


def step(spec, name: str, seed: int = 0, dtype=torch.float64, n: int = N, **given):
    """A training step (the mean square's backward) on fixed data: the output, the gradients,
    and how many tensors the backward made of at least the queries' size (h · N · d_k)."""
    sizes = sample_sizes(spec.ir) | {"N": n, "h": 3}
    given = {k: v for k, v in sizes.items() if k in spec.required} | given
    args = sample_arguments(spec.ir, sizes, (), dtype, seed=1)
    leaves = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
    torch.manual_seed(seed)
    out = spec(**leaves, **given, **CASES.get(name, ({}, {}))[0], backward="autograd")
    whole = Whole(3 * n * sizes.get("d_k", 1))
    with whole:
        out.square().mean().backward()
    return out, {k: v.grad for k, v in leaves.items() if v.grad is not None}, whole.count


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_block_makes_no_gradient_of_a_whole_input(name, monkeypatch, saving):
    """Eight blocks: the twin's backward makes a gradient of each of Q, K and V per block
    (at least 24 tensors of their size), by_blocks' one sum each; the gradients are equal."""
    out, grads, count = step(spec_in_blocks(name, monkeypatch), name)
    twin = spec_in_blocks(name, monkeypatch)
    with saving():
        want_out, want, twin_count = step(twin, name)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    assert grads.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=0, atol=1e-12)
    assert count < 3 * N // BLOCK <= twin_count


SOFTCAP_DROPOUT = (
    (ROOT / "specs" / "softcap_window.attn")
    .read_text(encoding="utf-8")
    .replace("scalar w = 4096", "scalar w = 4096\nscalar p = 0.5")
    .replace(
        "O_<μτa>  = A_<μττ'> V_<μτ'a>",
        "Ã_<μττ'> = dropout(A_<μττ'>, p)\nO_<μτa> = Ã_<μττ'> V_<μτ'a>",
    )
)


def test_dropout_in_blocks_draws_again_what_the_forward_drew(monkeypatch, saving):
    """Dropout on the soft-capped weights, in training, by blocks of rows: the backward makes
    each block again with the random state its forward drew from, so the gradients equal
    those of the twin that saved every block's mask, at the same seed; the twin: another
    seed draws other masks, and other gradients."""
    spec = spec_in_blocks("softcap_window", monkeypatch, SOFTCAP_DROPOUT)
    assert "draws=training" in spec.source
    twin = spec_in_blocks("softcap_window", monkeypatch, SOFTCAP_DROPOUT)
    out, grads, _ = step(spec, "softcap_window", training=True)
    with saving():
        want_out, want, _ = step(twin, "softcap_window", training=True)
        other_out, other, _ = step(twin, "softcap_window", seed=1, training=True)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=0, atol=1e-12)
    assert not torch.allclose(other_out, want_out)
    assert not torch.allclose(other["X"], want["X"])


def test_a_second_derivative_raises_and_torch_func_gives_it(monkeypatch, saving):
    """create_graph through the blocks raises, naming torch.func; under torch.func the blocks
    run plain, and the first and second derivatives equal autograd's through the plain
    blocks (the twin)."""
    spec = spec_in_blocks("softcap_window", monkeypatch)
    sizes = sample_sizes(spec.ir) | {"N": N, "h": 3}
    args = sample_arguments(spec.ir, sizes, (), torch.float64, seed=1)
    given = {k: v for k, v in sizes.items() if k in spec.required} | CASES["softcap_window"][0]
    x = args.pop("X").requires_grad_()
    out = spec(X=x, **args, **given, backward="autograd")
    with pytest.raises(RuntimeError, match=r"torch\.func"):
        torch.autograd.grad(out.square().sum(), x, create_graph=True)

    def loss(x):
        return spec(X=x, **args, **given, backward="autograd").square().sum()

    (want,) = torch.autograd.grad(loss(x), x)
    torch.testing.assert_close(torch.func.grad(loss)(x.detach()), want, rtol=0, atol=1e-12)
    twice = torch.func.grad(lambda x: torch.func.grad(loss)(x).sum())(x.detach())
    with saving():
        (grad,) = torch.autograd.grad(loss(x), x, create_graph=True)
        (want,) = torch.autograd.grad(grad.sum(), x)
    assert want.abs().sum() > 0
    torch.testing.assert_close(twice, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("floor", [64, 1])
def test_a_block_holds_at_least_block_rows_rows(floor, monkeypatch):
    """sigmoid_attention at N = 256 with a budget of one score a block: blocks of 64 rows
    (BLOCK_ROWS), two to each causal span of 128 queries; the twin, the floor at 1, runs a
    block per row."""
    spec = spec_in_blocks("sigmoid_attention", monkeypatch)
    namespace, rows = spec.function.__globals__, []
    name = spec.function.__name__ + "_rows"
    function = namespace[name]
    monkeypatch.setitem(
        namespace,
        name,
        lambda q, *a, **k: rows.append(q.shape[-2]) or function(q, *a, **k),
    )
    monkeypatch.setitem(namespace, "BLOCK_SCORES", 1)
    monkeypatch.setattr(rt, "QUERY_BLOCK", 128)
    if floor != 64:
        monkeypatch.setitem(namespace, "BLOCK_ROWS", floor)
    sizes = sample_sizes(spec.ir) | {"N": 256, "h": 2}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    spec(**args, **{k: v for k, v in sizes.items() if k in spec.required})
    assert rows == [64] * 4 if floor == 64 else rows == [1] * 256


def test_under_autocast_the_backward_makes_the_blocks_as_the_forward_did(monkeypatch, saving):
    """In float32 under the CPU's bfloat16 autocast, the backward makes each block again under
    the same autocast, as its forward ran (every call of the rows' function sees it, with
    gradients and without); the gradients equal those of the twin that saved every block's,
    to bfloat16's rounding of sums made in float32 (the twin's are made in bfloat16)."""
    spec = spec_in_blocks("softcap_window", monkeypatch)
    namespace, seen = spec.function.__globals__, []
    name = spec.function.__name__ + "_rows"
    rows = namespace[name]

    def recording(*args, **kwargs):
        seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
        return rows(*args, **kwargs)

    monkeypatch.setitem(namespace, name, recording)
    twin = spec_in_blocks("softcap_window", monkeypatch)
    with torch.autocast("cpu", torch.bfloat16):
        _, grads, _ = step(spec, "softcap_window", dtype=torch.float32)
        with saving():
            _, want, _ = step(twin, "softcap_window", dtype=torch.float32)
    assert set(seen) == {(False, True), (True, True)}  # the forward's blocks, the backward's
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-2, atol=2**-12)
    seen.clear()
    step(spec, "softcap_window", dtype=torch.float32)  # the twin: no autocast
    assert set(seen) == {(False, False), (True, False)}


@pytest.mark.parametrize("floor", [0, -1, 2.5])
def test_a_block_rows_knob_below_one_is_refused_by_name(floor, monkeypatch):
    """Failed before: `range() arg 3 must not be zero` (BLOCK_ROWS = 0 and a budget of 0)."""
    spec = spec_in_blocks("sigmoid_attention", monkeypatch)
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_SCORES", 0)
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_ROWS", floor)
    sizes = sample_sizes(spec.ir) | {"N": 32}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    with pytest.raises(ValueError, match=rf"BLOCK_ROWS = {floor}: .* whole number of 1 or more"):
        spec(**args, **{k: v for k, v in sizes.items() if k in spec.required})


def test_twin_block_rows_of_one_runs_as_the_whole(monkeypatch):
    spec = spec_in_blocks("sigmoid_attention", monkeypatch)
    sizes = sample_sizes(spec.ir) | {"N": 32}
    args = sample_arguments(spec.ir, sizes, (), torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    whole = spec(**args, **given)
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_SCORES", 0)
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_ROWS", 1)
    torch.testing.assert_close(spec(**args, **given), whole, rtol=1e-12, atol=1e-12)
