"""The canonical form (lower/canonical.py) on small specs: what each rewrite makes of a spec,
where it must leave one alone, and that the outputs read literally as before (values and
gradients, float64). Whole phrasings planned alike: tests/test_phrasings.py; every shipped
spec's canonical form against the literal reading: tests/test_passes.py."""

from pathlib import Path

import pytest
import torch

import indexattn
from indexattn import ir
from indexattn.lower.canonical import canonical, groups, projections
from indexattn.oracle.verify import compare

ROOT = Path(__file__).resolve().parent.parent

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
