"""The scales pass (lower/program/passes/scales.py): a scale of a scale that nothing else reads is
one scale, in values equal to the literal interpreter; a scale read twice stays."""

import sympy
import torch

import indexattn
from indexattn import ir
from indexattn.lower.pipeline import plan
from indexattn.lower.program.passes import scales
from indexattn.lower.program.steps import Contract
from indexattn.oracle.verify import compare

HEAD = "index i : n\ninput x_<i>\n"


def contracts(program) -> list[Contract]:
    return [s for s in program.steps if isinstance(s, Contract)]


def test_a_chain_of_scales_is_one_scale():
    text = HEAD + "T_<i> = x_<i> / 3\nU_<i> = 2 T_<i>\ny_<i> = U_<i> / 5\n"
    program = plan(ir.check(text, "chain"))
    third, fifth = sympy.Rational(1, 3), sympy.Rational(1, 5)
    assert [s.scale for s in contracts(program)] == [third, 2, fifth]
    folded = scales.run(program)
    folded.check()
    (only,) = contracts(folded)
    assert only.scale == sympy.Rational(2, 15) and only.args[0].var.argument
    spec = indexattn.compile_spec(text, name="chain")
    assert compare(spec).ok
    x = torch.linspace(-1, 1, 4, dtype=torch.float64)
    assert torch.allclose(spec(x=x), x * 2 / 15)


def test_a_scale_read_twice_stays():
    text = HEAD + "T_<i> = x_<i> / 3\ny_<i> = 2 T_<i>\noutput T, y\n"
    program = plan(ir.check(text, "twice"))
    assert scales.run(program) == program
    assert compare(indexattn.compile_spec(text, name="twice")).ok


def test_a_scale_transposed_after_folds_into_one_relayout():
    text = "index i, j : n\ninput x_<ij>\nT_<ij> = x_<ij> / 3\ny_<ji> = 2 T_<ij>\n"
    (only,) = contracts(scales.run(plan(ir.check(text, "turned"))))
    assert only.out.dims != only.args[0].dims  # x read as (i, j), written as (j, i)
    spec = indexattn.compile_spec(text, name="turned")
    x = torch.randn(3, 3, dtype=torch.float64)
    assert compare(spec).ok and torch.allclose(spec(x=x), x.T * 2 / 3)
    assert not torch.allclose(spec(x=x), x * 2 / 3)  # the twin: the transpose is seen
