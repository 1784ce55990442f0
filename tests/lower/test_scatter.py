"""The planner's scatter rule (lower/planner/scatter.py): a sum over J of `where(b == P, E, 0)`, P
whole numbers over indices all summed, is one scatter-add, never the b × J tensor of the `where`;
it equals the literal interpreter, with positions out of range adding nothing, in values and
gradients, batched or not, traced by torch.compile; a `where` that is no scatter (another else
branch, positions that read b) is planned as written and equals the interpreter too."""

import pytest
import torch

import indexattn
from indexattn.lower.planner import plan
from indexattn.lower.program import kinds
from indexattn.lower.program.steps import Elementwise, Flip, Rename, Scatter
from indexattn.oracle import reference
from indexattn.oracle.verify import compare

ONE_HOT = """# rows of E added into the slots P names
index τ : N
index v : V
index a : d
input P_<τ> : int
input E_<τa>
Y_<va> = sum_<τ>(where(v == P_<τ>, E_<τa>, {other}))
"""

BUCKETS = """# as T5's buckets' backward: E read through a renaming, two summed indices
index τ, τ' : N
index b : 5
index μ : h
input E_<μττ'>
β_<ττ'> = mod(τ + 2 τ', 5) + where(τ' > τ + 1, 2, 0)
F_<ττ'μ> = E_<μττ'>
Y_<bμ> = sum_<ττ'>(where(β_<ττ'> == b, F_<ττ'μ>, 0))
"""


def compiled(text: str, name: str):
    return indexattn.compile_spec(text, name=name)


def scatters(spec) -> list[Scatter]:
    return [s for s in spec.program.steps if isinstance(s, Scatter)]


def wheres(spec) -> list[Elementwise]:
    return [s for s in spec.program.steps if isinstance(s, Elementwise) and s.fn == "where"]


def one_hot(positions: list[int], batch: tuple[int, ...] = ()) -> dict:
    generator = torch.Generator().manual_seed(0)
    n = len(positions)
    return {
        "P": torch.tensor(positions).expand(*batch, n).clone(),
        "E": torch.randn(*batch, n, 3, generator=generator, dtype=torch.float64),
    }


def error(spec, args: dict, **sizes) -> float:
    """max |generated - literal| over the output and the gradient of E."""
    found = []
    for run in (spec, lambda **kw: reference.evaluate(spec.ir, **kw)[0]):
        leaf = args["E"].clone().requires_grad_()
        out = run(**{**args, "E": leaf}, **sizes)
        found.append((out, *torch.autograd.grad((out * out).sum(), leaf)))
    (y, dy), (y_want, dy_want) = found
    return max((y - y_want).abs().max().item(), (dy - dy_want).abs().max().item())


def test_a_one_hot_sum_is_one_scatter_equal_to_the_interpreter():
    spec = compiled(ONE_HOT.format(other=0), "one_hot")
    assert len(scatters(spec)) == 1 and not wheres(spec)
    assert error(spec, one_hot([0, 2, 3, 2, 1, 0]), V=4) < 1e-12


@pytest.mark.parametrize("outside", [-1, 4, 9])
def test_a_position_out_of_range_adds_nothing(outside):
    spec = compiled(ONE_HOT.format(other=0), "one_hot")
    args = one_hot([0, 2, outside, 2])
    changed = {**args, "E": args["E"].clone()}
    changed["E"][2] += 1.0  # the row at the position out of range
    assert torch.equal(spec(**args, V=4), spec(**changed, V=4))
    assert error(spec, args, V=4) < 1e-12
    # the twin: the same change at a position in range is seen
    changed["E"][1] += 1.0
    assert not torch.equal(spec(**args, V=4), spec(**changed, V=4))


def test_batched_positions_into_an_unbatched_source():
    text = ONE_HOT.format(other=0).replace("input E_<τa>", "param E_<τa>")
    spec = compiled(text, "one_hot_param")
    assert len(scatters(spec)) == 1
    args = one_hot([0, 3, 1, 5])
    args["P"] = torch.tensor([[0, 3, 1, 5], [2, 2, -1, 0]])
    assert spec(**args, V=4).shape == (2, 4, 3)
    assert error(spec, args, V=4) < 1e-12


def test_batched_positions_and_source():
    spec = compiled(ONE_HOT.format(other=0), "one_hot")
    args = one_hot([0, 3, 1, 5], batch=(2,))
    args["P"][1] = torch.tensor([2, 2, -1, 0])
    assert error(spec, args, V=4) < 1e-12


@pytest.mark.parametrize(
    "other, rhs",
    [
        ("else", "where(v == P_<τ>, E_<τa>, 1)"),  # the else branch is not 0
        ("reads b", "where(v == mod(P_<τ> + v, 4), E_<τa>, 0)"),  # positions read b
    ],
)
def test_a_where_that_is_no_scatter_is_planned_as_written(other, rhs):
    text = ONE_HOT.format(other=0).replace("where(v == P_<τ>, E_<τa>, 0)", rhs)
    spec = compiled(text, "not_scatter")
    assert not scatters(spec) and wheres(spec), other
    assert error(spec, one_hot([0, 2, 3, 7, 1, -2]), V=4) < 1e-12


def test_two_summed_indices_read_through_a_renaming():
    spec = compiled(BUCKETS, "buckets")
    (step,) = scatters(spec)
    renamed = {s.out.var for s in spec.program.steps if isinstance(s, Rename)}
    assert step.arg.var not in renamed  # E's storage, in its own order, not F's view
    assert compare(spec).ok
    assert error(spec, {"E": torch.randn(3, 6, 6, dtype=torch.float64)}) < 1e-12


def test_a_sum_over_more_indices_than_the_positions_sums_the_rest_first():
    text = BUCKETS.replace("index μ : h", "index μ : h\nindex σ : m")
    text = text.replace("input E_<μττ'>", "input E_<μττ'σ>").replace("= E_<μττ'>", "= E_<μττ'σ>")
    text = text.replace("F_<ττ'μ> =", "F_<ττ'μσ> =").replace("sum_<ττ'>(", "sum_<ττ'σ>(")
    spec = compiled(text.replace("F_<ττ'μ>, 0", "F_<ττ'μσ>, 0"), "buckets_more")
    assert len(scatters(spec)) == 1
    assert error(spec, {"E": torch.randn(3, 6, 6, 2, dtype=torch.float64)}) < 1e-12


def test_positions_that_reverse_a_whole_axis_are_a_flip():
    """Rotary's `sum_<c'>(where(c == 1 - c', dK_<μτc'j>, 0))`: each slot gets one value."""
    text = "index c, c' : 2\nindex j : d\ninput E_<c'j>\n"
    text += "Y_<cj> = sum_<c'>(where(c == 1 - c', E_<c'j>, 0))\n"
    spec = compiled(text, "halves")
    assert any(isinstance(s, Flip) for s in spec.program.steps) and not wheres(spec)
    e = torch.randn(2, 3, dtype=torch.float64)
    assert torch.equal(spec(E=e), e.flip(0))
    # the twin: onto an axis of 3, the same positions are a scatter, slot 2 left 0
    wider = compiled(text.replace("index c, c' : 2", "index c : 3\nindex c' : 2"), "onto_three")
    assert len(scatters(wider)) == 1
    assert torch.equal(wider(E=e), torch.cat([e.flip(0), torch.zeros(1, 3, dtype=e.dtype)]))


def test_the_reduction_rules_are_a_table_the_planner_follows(monkeypatch):
    assert [rule.name for rule in plan.REDUCTION_RULES] == ["scatter", "convolve", "reduce"]
    # the twin: without the scatter rule the same sum is the where, equal in value
    monkeypatch.setattr(plan, "REDUCTION_RULES", plan.REDUCTION_RULES[1:])
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    spec = compiled(ONE_HOT.format(other=0) + "\n", "one_hot_plain")
    assert not scatters(spec) and wheres(spec)
    assert error(spec, one_hot([0, 2, 3, 7, 1, -2]), V=4) < 1e-12


def test_torch_compile_traces_the_scatter_and_its_backward():
    torch._dynamo.reset()
    spec = compiled(ONE_HOT.format(other=0), "one_hot")
    module = spec.module(V=4)
    traced = torch.compile(module, fullgraph=True, dynamic=True, backend="aot_eager")
    for positions in ([0, 2, 5, 2, 1, -1], [3, 3, 0, -4, 1, 2, 2, 9]):
        args = one_hot(positions)
        found = []
        for run in (traced, module):
            leaf = args["E"].clone().requires_grad_()
            out = run(args["P"], leaf)
            found.append((out, *torch.autograd.grad((out * out).sum(), leaf)))
        (y, dy), (y_want, dy_want) = found
        assert torch.allclose(y, y_want) and torch.allclose(dy, dy_want)


def test_a_sum_of_a_reference_keeps_its_axes_order_then_renames():
    """`sum_<k>(X_<ijk>)` into Y_<ji>: X.sum leaves (i, j), then the transpose (it was taken
    for (j, i) itself); the twin, Y_<ij>, needs no transpose."""
    text = "index i : n\nindex j : m\nindex k : p\ninput X_<ijk>\nY_<ji> = sum_<k>(X_<ijk>)\n"
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    assert torch.equal(compiled(text, "sum_ji")(X=x), x.sum(-1).T)
    same = compiled(text.replace("Y_<ji>", "Y_<ij>"), "sum_ij")
    assert torch.equal(same(X=x), x.sum(-1))


def test_a_mod_of_a_sum_of_indices_is_printed_whole():
    text = "index τ, σ : N\ninput X_<τ>\nY_<τσ> = X_<τ> + mod(τ + 2 σ, 5)\n"
    tau, sigma = torch.arange(6.0)[:, None], torch.arange(6.0)[None, :]
    got = compiled(text, "mod_sum")(X=torch.zeros(6, dtype=torch.float64))
    assert torch.equal(got, ((tau + 2 * sigma) % 5).double())
    assert not torch.equal(got, (tau + (2 * sigma) % 5).double())  # as Python read it before


def test_a_scatter_is_row_wise_along_its_other_axes_only():
    (step,) = scatters(compiled(BUCKETS, "buckets"))
    heads, buckets = step.out.dims
    assert kinds.row_wise(step, heads) and kinds.pure(step) and not kinds.view(step)
    assert not kinds.row_wise(step, buckets)  # the twin: a slot reads every position
