"""The step kinds' table (lower/program/kinds.py) covers every kind of step as
tests/oracle/test_ops.py checks the operator table: each kind has its facts, a printer and a cost,
and a kind missing one is seen. The planner's product rules are a table it follows in order."""

import dataclasses
import typing

import sympy

import indexattn
from indexattn.ir import Index
from indexattn.lower.pipeline import plan
from indexattn.lower.planner import products
from indexattn.lower.printers.emit import PRINTERS
from indexattn.lower.program import kinds, steps
from indexattn.lower.program.steps import Contract, Elementwise, Linear, Operand, Reduction, Var
from indexattn.oracle.verify import compare
from indexattn.views import cost

KINDS = typing.get_args(steps.Step)


def missing(kind: type) -> list[str]:
    """What a step kind lacks of the facts every stage reads."""
    gaps = []
    if kind not in kinds.KINDS:
        gaps.append("facts (lower/program/kinds.py)")
    if kind not in PRINTERS:
        gaps.append(f"a printer (@prints({kind.__name__}) in lower/printers/)")
    if cost.step_cost.dispatch(kind) is cost.step_cost.dispatch(object):
        gaps.append("a cost (views/cost.py)")
    if not kind.__doc__ or kind.__doc__.startswith(kind.__name__ + "("):
        gaps.append("a docstring")
    return gaps


def test_every_step_kind_has_every_fact():
    assert len(KINDS) >= 20
    assert {k: missing(k) for k in KINDS if missing(k)} == {}
    assert set(kinds.KINDS) == set(KINDS)  # no facts for a kind that no longer exists


def test_a_kind_missing_its_facts_is_seen():
    @dataclasses.dataclass(frozen=True)
    class Shift:
        out: Operand

    assert len(missing(Shift)) == 4


ROW = Index("i", "i", sympy.Symbol("n"))
KEY = Index("j", "j", sympy.Symbol("n"))


def operand(hint: str, *dims: Index) -> Operand:
    return Operand(Var(len(hint), hint), dims, False)


def test_facts_that_depend_on_the_step():
    x, y = operand("x", ROW, KEY), operand("y", ROW, KEY)
    assert kinds.fresh(Contract(operand("p", ROW, KEY), (x, y)))
    assert not kinds.fresh(Contract(operand("p", ROW, KEY), (x,)))  # a lone operand: a view
    assert kinds.fresh(Contract(operand("p", ROW, KEY), (x,), sympy.Integer(2)))
    assert kinds.pure(Elementwise(operand("e", ROW, KEY), "exp", (x,)))
    assert not kinds.pure(Elementwise(operand("d", ROW, KEY), "dropout", (x,)))
    softmax = Reduction(operand("s", ROW, KEY), "softmax", x, (KEY,))
    assert kinds.row_wise(softmax, ROW) and not kinds.row_wise(softmax, KEY)
    assert kinds.reads(Contract(operand("p", ROW, KEY), (x, y))) == (x, y)


def test_a_product_reads_its_weight_by_name():
    mha = indexattn.compile_spec("specs/mha.attn")
    linear = next(s for s in mha.program.steps if isinstance(s, Linear))
    assert [v.hint for v in kinds.tensors(linear)] == ["W"]
    assert all(v.argument for v in kinds.tensors(linear))


def test_the_product_rules_are_a_table_the_planner_follows(monkeypatch):
    names = [rule.name for rule in products.PRODUCT_RULES]
    assert names == ["prefix", "sink", "convolve", "linear", "spread", "quotient", "contract"]
    text = "index τ : N\nindex i, j : d\ninput X_<τi>\nparam W_<ji>\nY_<τj> = W_<ji> X_<τi>\n"
    planned = indexattn.compile_spec(text, name="rules_linear")
    assert any(isinstance(s, Linear) for s in planned.program.steps)
    # the twin: without the linear rule the same product is an einsum, equal in value
    without = tuple(r for r in products.PRODUCT_RULES if r.name != "linear")
    monkeypatch.setattr(products, "PRODUCT_RULES", without)
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    plain = indexattn.compile_spec(text + "\n", name="rules_plain")
    assert not any(isinstance(s, Linear) for s in plain.program.steps)
    assert compare(plain).ok and compare(planned).ok


WHOLE = (
    "index τ, τ' : N\ninput P_<τ> : int\ninput x_<τ>\n"
    "C_<τ> = cumsum_<τ>(P_<τ>)\nT_<> = max_<τ>(P_<τ>)\nH_<τ> = P_<τ> / 2\nA_<τ> = 0.5 P_<τ>\n"
    "y_<τ> = (C_<τ> + T_<> + H_<τ> + A_<τ>) x_<τ>\noutput y\n"
)


def test_one_answer_to_which_steps_make_floats_of_integers():
    """kinds.makes_floats, which the casts of tables (lower/program/numerics.py) and the in-place
    pass (lower/program/passes/inplace.py) both read (they disagreed on the running sum): a maximum
    or running sum of integers stays whole, a quotient and a product with 0.5 do not."""
    program = plan(indexattn.compile_spec(WHOLE, name="whole").ir)
    found = {s.out.var.hint: kinds.makes_floats(s) for s in program.steps if hasattr(s, "out")}
    assert {k: found[k] for k in "CTHA"} == {"C": False, "T": False, "H": True, "A": True}
