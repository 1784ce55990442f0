"""Scores that take their masks in place (lower/program/passes/inplace.py) and a scale spread over
a sum of contractions (lower/planner/products.py): the generated code adds onto the product it
owns, leaves a product it returns alone, and equals the literal interpreter in values and
gradients."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_kernels import mla_key_with_query

import indexattn
from indexattn import ops
from indexattn.lower.program.kinds import over
from indexattn.lower.program.steps import Contract
from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parents[2]

MASKED = """
index τ, τ' : N
index a     : d
input Q_<τa>
input K_<τa>
input P_<τ'>
R_<ττ'> = Q_<τa> K_<τ'a>
S_<ττ'> = R_<ττ'> + P_<τ'>
output S
"""


def gradients(spec) -> None:
    """The generated function's gradients equal the literal interpreter's."""
    sizes = sample_sizes(spec.ir, seed=1)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64, seed=3)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    twins = {k: v.clone().requires_grad_() for k, v in args.items()}
    got = spec(**leaves, **given)
    got = got if isinstance(got, tuple) else (got,)
    want = reference.evaluate(spec.ir, **twins, **given)
    for g, w in zip(got, want):
        weights = torch.randn_like(g)
        (g * weights).sum().backward(retain_graph=True)
        (w * weights).sum().backward(retain_graph=True)
    for name in args:
        torch.testing.assert_close(leaves[name].grad, twins[name].grad, rtol=0, atol=1e-12)


def kind(step) -> str:
    """A step's kind, with its function where it has one: `Elementwise:tanh`."""
    fn = getattr(step, "fn", None)
    return type(step).__name__ + (f":{fn}" if fn else "")


def overwritten(spec) -> list[tuple[str, str]]:
    """For each step of the final program that writes over what it reads (kinds.over): its
    kind, and the kind of the step that made the tensor it writes over."""
    makers = {s.out.var: kind(s) for s in spec.program.steps}
    return [(kind(s), makers[over(s).var]) for s in spec.program.steps if over(s) is not None]


def test_the_scores_take_the_mask_in_place():
    spec = indexattn.compile_spec(MASKED, name="masked")
    assert overwritten(spec) == [("Add", "Contract")]
    assert compare(spec, batch=(2,)).ok
    gradients(spec)


def test_a_product_that_is_returned_is_left_alone():
    """The twin: R is an output too, so S is a new tensor and R keeps the bare product."""
    spec = indexattn.compile_spec(MASKED.replace("output S", "output S, R"), name="both")
    assert overwritten(spec) == []
    assert compare(spec, batch=(2,)).ok
    gradients(spec)


def test_the_returned_weights_are_held_once():
    """gpt2 returns its weights: the masks go onto the product; values and gradients hold."""
    spec = indexattn.compile_spec(ROOT / "specs" / "gpt2.attn")
    assert overwritten(spec) == [("Add", "Contract")]
    assert compare(spec, batch=(2,)).ok


def scaled_over_positions(spec) -> set[str]:
    """What the program's scales multiply, by the planner's hints, over token positions."""
    steps = [s for s in spec.program.steps if isinstance(s, Contract) and s.scale != 1]
    wide = [s for s in steps if any(i.glyph.startswith("τ") for i in s.out.dims)]
    return {a.var.hint for s in wide for a in s.args}


def test_a_scale_over_a_sum_of_products_goes_onto_their_factors():
    """mla without the kernel (its shared key part also reads the query position):
    (Qn Kn + Qθ Kq) / sqrt(d_n + d_r) scales Qn and Kq, never the N×N sum; the twin without
    the scale has no scaled factors, and both equal the literal interpreter."""
    text = mla_key_with_query()
    spec = indexattn.compile_spec(text, name="mla_general")
    assert "scaled_dot_product_attention" not in spec.source
    scaled = scaled_over_positions(spec)
    assert "Qn" in scaled and scaled.isdisjoint({"S_prod", "S_sum"})  # a factor, never N×N
    assert compare(spec, batch=(2,)).ok
    gradients(spec)
    plain = text.replace(") / sqrt(d_n + d_r) + M_<ττ'>", ") + M_<ττ'>")
    assert plain != text
    unscaled = indexattn.compile_spec(plain, name="mla_unscaled")
    assert scaled_over_positions(unscaled) == set()
    assert compare(unscaled, batch=(2,)).ok


CAPPED = """
index τ, τ' : N
index a     : d
scalar c = 5
input Q_<τa>
input K_<τa>
input P_<τ'>
R_<ττ'> = Q_<τa> K_<τ'a>
S_<ττ'> = c tanh(R_<ττ'> / c) + P_<τ'>
output S
"""


def test_a_soft_cap_writes_over_the_product_until_tanh_keeps_its_result():
    """R / c and tanh overwrite the product (a scale keeps nothing, tanh keeps its result);
    `* c` then makes a tensor, since tanh's backward reads what it wrote, and the mask goes
    onto that. Values and gradients equal the literal interpreter's."""
    spec = indexattn.compile_spec(CAPPED, name="capped")
    # the scale over the product, tanh over the scale, the mask onto the new `* c`
    assert overwritten(spec) == [
        ("Contract", "Contract"),
        ("Elementwise:tanh", "Contract"),
        ("Add", "Contract"),
    ]
    assert "R.div_(c)" in spec.source and "R.tanh_()" in spec.source  # R keeps its name
    assert compare(spec, batch=(2,)).ok
    gradients(spec)


def test_a_product_that_is_returned_is_left_alone_and_its_scaled_copy_capped_in_place():
    spec = indexattn.compile_spec(CAPPED.replace("output S", "output S, R"), name="both")
    assert overwritten(spec) == [("Elementwise:tanh", "Contract"), ("Add", "Contract")]
    assert "div_(" not in spec.source
    assert compare(spec, batch=(2,)).ok
    gradients(spec)


def test_functions_whose_backward_reads_their_argument_make_a_tensor():
    """sin's backward reads its argument (cos x), exp's its result: sin makes a tensor, which
    the scale then writes over; exp writes over the product, and the scale after it makes a
    tensor (it must not touch what exp keeps). Values and gradients hold."""
    for fn, inplace in (("sin", False), ("exp", True), ("expm1", True)):
        text = CAPPED.replace("c tanh(R_<ττ'> / c)", f"{fn}(R_<ττ'>) / c")
        spec = indexattn.compile_spec(text, name=fn)
        first = (f"Elementwise:{fn}", "Contract") if inplace else ("Contract", f"Elementwise:{fn}")
        assert overwritten(spec) == [first, ("Add", "Contract")]
        assert compare(spec, batch=(2,)).ok
        gradients(spec)


def test_twin_a_function_that_keeps_its_result_must_not_be_written_over(monkeypatch):
    """expm1's backward reads its result (y + 1): taken for one that keeps its argument, the
    scale after it writes over it, and autograd's backward refuses."""
    monkeypatch.setitem(ops.FUNCTIONS, "expm1", replace(ops.FUNCTIONS["expm1"], inplace=""))
    text = CAPPED.replace("c tanh(R_<ττ'> / c)", "expm1(R_<ττ'>) / c")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        gradients(indexattn.compile_spec(text, name="expm1_twin"))


def test_a_condition_is_never_the_tensor_a_sum_adds_onto():
    text = CAPPED.replace("c tanh(R_<ττ'> / c)", "where(R_<ττ'> > 0, 1, 0) + log(R_<ττ'> R_<ττ'>)")
    spec = indexattn.compile_spec(text, name="condition")
    assert overwritten(spec) == [("Add", "Elementwise:log")]  # not the where's
    assert compare(spec, batch=(2,)).ok
    gradients(spec)


POSITIONS = """
index τ, τ' : N
index μ : h
index a : d
input Q_<μτa>
input K_<μτa>
input V_<μτa>
input P_<τ> : int
S_<μττ'> = Q_<μτa> K_<μτ'a> - 1.0 (P_<τ> - P_<τ'>)
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
output O, A
"""


def own_lines(spec) -> str:
    """The spec's function, without the module's helpers (softmax_values writes in place)."""
    return spec.source.split(f"def {spec.function.__name__}(")[1]


def test_a_difference_of_integer_positions_is_never_scaled_in_place():
    """P_<τ> - P_<τ'> of integer data is an integer tensor: a float scale makes a new one."""
    spec = indexattn.compile_spec(POSITIONS, name="positions")
    assert ".mul_(" not in own_lines(spec)
    assert compare(spec, batch=(2,)).ok
    twin = indexattn.compile_spec(POSITIONS.replace(" : int", ""), name="float_positions")
    assert ".mul_(" in own_lines(twin)  # float data: the difference is scaled in place
    assert compare(twin, batch=(2,)).ok


BLOCKED_INPUT = """
index τ, τ' : N
index a : d
input X_<τa>
input Y_<τa>
input Z_<τa>
input V_<τa>
input P_<τa>
param G_<a>
S1_<ττ'> = X_<τa> Y_<τ'a>
A1_<ττ'> = softmax_<τ'>(S1_<ττ'>)
W_<ττ'> = Z_<τa> Y_<τ'a>
S_<ττ'> = W_<ττ'> + A1_<ττ'>
T_<ττ'> = tanh(S_<ττ'>)
O_<τa> = T_<ττ'> V_<τ'a> G_<a>
S3_<ττ'> = P_<τa> Y_<τ'a>
A3_<ττ'> = softmax_<τ'>(sin(S3_<ττ'>))
O3_<τa> = A3_<ττ'> V_<τ'a>
output O, O3
"""


def test_blocks_of_rows_never_write_over_what_they_are_given(monkeypatch):
    """W is made before the rows and read by them a block at a time: each block's slice is a
    view of W, so writing over it would change what an earlier block kept for its backward.
    Gradients through blocks of one query equal the literal interpreter's."""
    spec = indexattn.compile_spec(BLOCKED_INPUT, name="given")
    program = spec.program
    inside = [s for s in program.steps if program.region(s) == "rows"]
    targets = {over(s).var for s in inside if over(s) is not None}
    assert "W" in {v.hint for v in program.rows.inputs}
    assert targets and targets.isdisjoint(program.rows.inputs)
    assert ("Elementwise:tanh", "Add") in overwritten(spec)  # tanh writes over S, its own
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_SCORES", 1)
    monkeypatch.setitem(spec.function.__globals__, "BLOCK_ROWS", 1)
    gradients(spec)


FEATURES = """
index τ : N
index a : d
input Q_<τa>
Φ_<τa> = elu(Q_<τa>) + 1
Y_<τa> = Φ_<τa> Q_<τa>
output Y
"""


def test_a_fresh_tensor_plus_a_number_is_shifted_in_place():
    """Linear attention's feature map at any width: elu keeps its argument, so its result
    takes the 1 in place; values and gradients hold. The twin: the exponential keeps its
    result for the backward pass, so the 1 makes a new tensor."""
    spec = indexattn.compile_spec(FEATURES, name="features")
    assert overwritten(spec) == [("Add", "Elementwise:elu")]
    assert "Phi.add_(1)" in spec.source  # the result keeps the name of what it writes over
    assert compare(spec, batch=(2,)).ok
    gradients(spec)
    spec = indexattn.compile_spec(FEATURES.replace("elu(", "exp("), name="exp_features")
    assert overwritten(spec) == [] and ".add_(" not in spec.source
    assert compare(spec, batch=(2,)).ok
    gradients(spec)
