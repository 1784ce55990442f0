"""The canonical form (lower/planner/canonical.py) on small specs: what each rewrite makes of a
spec, where it must leave one alone, and that the outputs read literally as before (values and
gradients, float64). Whole phrasings planned alike: tests/lower/test_phrasings.py; every shipped
spec's canonical form against the literal reading: tests/lower/test_passes.py."""

from pathlib import Path

import pytest
import torch

import indexattn
from indexattn import ir
from indexattn.lower.planner.canonical import (
    canonical,
    groups,
    projections,
    softmax_arguments,
    softmaxes,
    sums,
)
from indexattn.lower.program.steps import Attention
from indexattn.oracle.verify import compare

ROOT = Path(__file__).resolve().parents[2]

HALVES = """
index τ : N
index c, e : 2
index j, k : d
input X_<τ(ek)>
param W_<(cj)(ek)>
T_<τcj> = W_<(cj)(ek)> X_<τ(ek)>
Y_<τ(cj)> = exp(T_<τcj>)
output Y
"""


def layouts(spec: ir.Spec) -> dict[str, list[list[str]]]:
    return {t.name: [[i.glyph for i in axis] for axis in t.layout] for t in spec.tensors}


def test_a_pair_every_use_keeps_together_is_one_index():
    spec = ir.check(HALVES, "halves")
    merged = groups(spec)
    assert layouts(merged)["T"] == [["τ"], ["cj"]]
    # fused axes keep their shapes: the weight's and the output's are one index each
    assert layouts(merged)["W"] == [["cj"], ["ek"]] and layouts(merged)["Y"] == [["τ"], ["cj"]]
    assert [t.shape for t in merged.arguments] == [t.shape for t in spec.arguments]
    assert compare(indexattn.compile_spec(HALVES, name="t"), torch.float64, (2,)).ok


TWINS = {
    # j read alone (a per-feature scale): c and j stay two indices everywhere
    "read alone": HALVES.replace("exp(T_<τcj>)", "exp(T_<τcj>) j"),
    # c summed without j
    "summed apart": HALVES.replace("Y_<τ(cj)> = exp(T_<τcj>)", "Y_<τj> = sum_<c>(T_<τcj>)"),
}


@pytest.mark.parametrize("twin", TWINS)
def test_a_pair_read_apart_somewhere_stays_two_indices(twin):
    text = TWINS[twin]
    spec = ir.check(text, "twin")
    assert "cj" not in {i.glyph for t in groups(spec).tensors for i in t.indices}
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


def test_an_output_over_two_axes_keeps_them():
    """An output's shape is what the caller gets: two axes stay two, though every use keeps
    them together."""
    text = HALVES.replace("Y_<τ(cj)>", "Y_<τcj>")
    assert layouts(groups(ir.check(text, "t")))["Y"] == [["τ"], ["c"], ["j"]]


ONE = (ROOT / "benchmarks" / "specs" / "mha_one_equation.attn").read_text(encoding="utf-8")


def test_a_projection_in_a_longer_product_is_an_equation_heads_positions_width():
    spec = projections(ir.check(ONE, "one"))
    made = [eq for eq in spec.equations if eq.tensor.name.startswith("W_X")]
    assert [[i.glyph for i in eq.indices] for eq in made] == [
        ["μ", "τ", "b"],
        ["μ", "τ'", "b"],
        ["μ", "τ'", "a"],
    ]
    assert not any(
        isinstance(f, ir.Ref) and f.tensor.name == "W" for f in ir.walk(spec.equations[-1].rhs)
    )


def test_a_projection_alone_or_with_numbers_only_stays_where_it_is():
    """`Q = W X / √d` is one linear already: nothing to split (the twin of the above)."""
    text = ONE.replace(
        "M_<ττ'> = where(τ' > τ, -inf, 0)\n",
        "M_<ττ'> = where(τ' > τ, -inf, 0)\nQ_<μτb> = W_<(μ0b)j> X_<τj> / sqrt(d_k)\n",
    )
    spec = ir.check(text, "t")
    assert projections(spec).equations[1] == spec.equations[1]
    assert (
        canonical(ir.check((ROOT / "specs" / "mha.attn").read_text(), "mha")).equations
        == ir.check((ROOT / "specs" / "mha.attn").read_text(), "mha").equations
    )


FILLED = """
index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
input D_<τ> : int
S_<ττ'> = Q_<τa> K_<τ'a> / sqrt(d)
A_<ττ'> = softmax_<τ'>(where(τ' > τ or D_<τ> != D_<τ'>, -inf, S_<ττ'>))
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""


def softmax_body(spec: ir.Spec) -> ir.Node:
    (body,) = [n.body for eq in spec.equations for n in ir.walk(eq.rhs) if isinstance(n, ir.Reduce)]
    return body


def kernels(text: str) -> list[bool]:
    """Whether each attention kernel step of the final program takes a mask."""
    steps = indexattn.compile_spec(text, name="t").program.steps
    return [s.mask is not None for s in steps if isinstance(s, Attention)]


def test_a_fill_of_minus_infinity_is_the_scores_plus_a_mask_and_takes_the_kernel():
    """masked_fill as nanoGPT writes it: `where(c, -inf, S)` with S's definition read in
    place is `Q K / √d + where(c, -inf, 0)`, a mask that reads tensors (document ids)."""
    spec = softmax_arguments(ir.check(FILLED, "t"))
    assert "S" not in {eq.tensor.name for eq in spec.equations}
    scores, mask = softmax_body(spec).terms
    assert isinstance(scores, ir.Product) and scores.summed
    assert isinstance(mask, ir.Apply) and mask.fn == "where"
    assert kernels(FILLED) == [True]
    assert compare(indexattn.compile_spec(FILLED, name="t"), torch.float64, (2,)).ok


FILLED_TWINS = {
    # S is an output too: it stays an equation, and the fill stays a where of it
    "scores read elsewhere too": FILLED.replace("output O", "output O, S"),
    # filled with 0: no mask, computed as written
    "filled with 0": FILLED.replace("-inf, S_<ττ'>", "0, S_<ττ'>"),
    # S kept in float32 or wider: its definition stays, so its precision does
    "scores with a precision": FILLED.replace("S_<ττ'> =", "S_<ττ'> : float32 ="),
}


@pytest.mark.parametrize("twin", FILLED_TWINS)
def test_a_fill_the_kernel_cannot_take_stays_and_equals_the_literal_reading(twin):
    text = FILLED_TWINS[twin]
    spec = softmax_arguments(ir.check(text, "t"))
    body = softmax_body(spec)
    if twin == "filled with 0":
        assert body == softmax_body(ir.check(text, "t")) and kernels(text) == []
    else:
        assert "S" in {eq.tensor.name for eq in spec.equations}
        assert any(isinstance(t, ir.Ref) and t.tensor.name == "S" for t in body.terms)
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


SUMMED = """
index τ, τ' : N
index a : d
input A_<ττ'>
input V_<τa>
O_<τa> = sum_<τ'>(A_<ττ'> V_<τ'a>)
output O
"""


def test_a_sum_of_a_product_is_a_contraction():
    (eq,) = sums(ir.check(SUMMED, "t")).equations
    assert isinstance(eq.rhs, ir.Product) and [i.glyph for i in eq.rhs.summed] == ["τ'"]
    assert compare(indexattn.compile_spec(SUMMED, name="t"), torch.float64, (2,)).ok


@pytest.mark.parametrize(
    "text",
    [
        SUMMED.replace("sum_<τ'>(A_<ττ'> V_<τ'a>)", "sum_<τ'>(A_<ττ'>) V_<τa>"),  # one tensor
        SUMMED.replace("sum_<τ'>(A_<ττ'> V_<τ'a>)", "max_<τ'>(A_<ττ'> V_<τ'a>)"),  # not a sum
    ],
)
def test_a_sum_of_one_tensor_or_another_reduction_stays(text):
    spec = ir.check(text, "t")
    assert sums(spec) is spec
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


TWO_SUMS = """
index i : n
input x_<i>
input y_<i>
z_<> = sum_<i>(x_<i> x_<i>) sum_<i>(y_<i> y_<i>)
output z
"""


def test_two_sums_over_one_index_name_stay_two_sums():
    """(Σ x²)(Σ y²) is not Σ x² y²: the first sum joins the product, the second, over the
    same name, stays a product of its own."""
    (eq,) = sums(ir.check(TWO_SUMS, "t")).equations
    assert isinstance(eq.rhs, ir.Product) and [i.glyph for i in eq.rhs.summed] == ["i"]
    inner = [f for f in eq.rhs.factors if isinstance(f, ir.Product)]
    assert len(eq.rhs.factors) == 3 and [[i.glyph for i in f.summed] for f in inner] == [["i"]]
    assert compare(indexattn.compile_spec(TWO_SUMS, name="t"), torch.float64, (2,)).ok


WRITTEN_OUT = """
index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
S_<ττ'> = Q_<τa> K_<τ'a> / sqrt(d) + where(τ' > τ, -inf, 0)
E_<ττ'> = exp(S_<ττ'> - max_<τ'>(S_<ττ'>))
A_<ττ'> = E_<ττ'> / sum_<τ'>(E_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""


def names(spec: ir.Spec) -> set[str]:
    return {eq.tensor.name for eq in spec.equations}


def test_a_softmax_written_out_is_softmax_where_every_row_sees_a_key():
    """E / Σ E is softmax: E's equation goes and the kernel takes the causal core (the
    causal mask keeps each query's own key, so no row is 0/0)."""
    assert "E" not in names(softmaxes(ir.check(WRITTEN_OUT, "t")))
    assert kernels(WRITTEN_OUT) == [False]  # is_causal, no mask tensor
    assert compare(indexattn.compile_spec(WRITTEN_OUT, name="t"), torch.float64, (2,)).ok


WRITTEN_TWINS = {
    # the first query sees no key: the written form is 0/0 there, softmax's policy 0
    "a row with no key": WRITTEN_OUT.replace("τ' > τ", "τ' >= τ"),
    # E is an output too: computed, and A divides it by its sum as written
    "the exponential read elsewhere too": WRITTEN_OUT.replace("output O", "output O, E"),
}


@pytest.mark.parametrize("twin", WRITTEN_TWINS)
def test_a_softmax_written_out_stays_as_written_where_softmax_could_differ(twin):
    text = WRITTEN_TWINS[twin]
    assert "E" in names(softmaxes(ir.check(text, "t"))) and kernels(text) == []
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok
