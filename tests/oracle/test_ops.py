"""The operator table is the one list of functions: every stage reads it, and the literal
interpreter, which keeps its own torch code, covers every entry. Each function, reduction and
operator is compiled from a one-line spec and compared with the literal reading."""

import pytest
import torch

import indexattn
from indexattn import ops
from indexattn.derive import adjoints
from indexattn.oracle import reference
from indexattn.oracle.verify import compare
from indexattn.views import cost

# Generated code runs without a warning (torch.tensor of a tensor warns, for one).
pytestmark = pytest.mark.filterwarnings("error")
APPLIED = {*ops.FUNCTIONS, *(n for n, op in ops.OPERATORS.items() if op.kind != "arithmetic")}


def test_the_oracle_covers_every_entry():
    assert APPLIED | {"pow"} <= set(reference.ELEMENTWISE)
    # every reduction its literal reading and its rule of reverse mode, by name; concat is a
    # node of its own in both
    assert set(ops.REDUCTIONS) - {"concat"} == set(reference.LITERAL)
    assert hasattr(reference.Interpreter, "concat")
    assert set(ops.REDUCTIONS) - {"concat", "rank"} == set(adjoints.ADJOINTS)


def test_every_entry_is_complete():
    for op in [*ops.FUNCTIONS.values(), *ops.REDUCTIONS.values(), *ops.OPERATORS.values()]:
        assert op.torch and op.latex and op.flops >= 0, op
        assert op.imports <= {"torch", "F", "math"}, op


def call(name: str) -> str:
    op = ops.FUNCTIONS[name]
    args = {1: "abs(x_<i>) + 0.5", 2: "x_<i>, 0.25", 3: "x_<i>, -0.25, 0.25"}[op.arity]
    args = "x_<i> > 0, x_<i>, 2 x_<i>" if name == "where" else args
    return f"index i : n\ninput x_<i>\ny_<i> = {name}({args})\n"


@pytest.mark.parametrize("name", sorted(ops.FUNCTIONS))
def test_each_function_equals_the_literal_reading(name):
    spec = indexattn.compile_spec(call(name), name=name)
    result = compare(spec)
    assert result.ok, (result.error, spec.source)
    assert "y" in spec.latex()
    assert cost.flops(spec.plan).free_symbols <= set(spec.sizes)


@pytest.mark.parametrize("name", sorted(set(ops.REDUCTIONS) - {"concat"}))  # its own test
def test_each_reduction_equals_the_literal_reading(name):
    left = "y_<ij>" if ops.REDUCTIONS[name].keeps else "y_<i>"
    text = f"index i, j : n\ninput x_<ij>\n{left} = {name}_<j>(x_<ij>)\n"
    spec = indexattn.compile_spec(text, name=name)
    assert compare(spec).ok, spec.source


def test_a_wrong_template_is_seen():
    # the twin: the comparison notices when generated code computes another function
    spec = indexattn.compile_spec(call("exp"), name="exp")
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    assert not torch.allclose(spec.function(x), torch.log(x.abs() + 1))


FINITE = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
NUMERIC = [*sorted(n for n in ops.FUNCTIONS if n not in ("where", "dropout")), "pow"]


@pytest.mark.parametrize("name", NUMERIC)
def test_partial_marks_exactly_the_functions_that_make_inf_or_nan_of_finite_numbers(name):
    """`partial` (read by lower/hidden.py) against the literal interpreter's own code, on
    every combination of a few finite arguments: log 0, 1 / sqrt 0, a root of -1, 0 ** -1,
    and x mod 0 are not finite; the others are, wherever they are tried."""
    op = ops.lookup(name)
    grids = torch.meshgrid(*[FINITE] * op.arity, indexing="ij")
    made = reference.ELEMENTWISE[name](None, *grids)
    assert op.partial == (not bool(made.isfinite().all())), name
    assert ops.OPERATORS["/"].partial and not ops.OPERATORS["*"].partial


def _saves_its_result(name: str) -> bool:
    """Whether torch's autograd keeps the function's result (not its argument) for the
    backward, read off the node its template records."""
    x = torch.rand(4, dtype=torch.float64, requires_grad=True) + 0.5
    namespace = {"torch": torch, "F": torch.nn.functional, "math": __import__("math"), "x": x}
    y = eval(ops.FUNCTIONS[name].torch.format("x"), namespace)
    return any(a == "_saved_result" for a in dir(y.grad_fn))


UNARY = sorted(n for n, op in ops.FUNCTIONS.items() if op.arity == 1 and not op.integers)


def test_inplace_is_exactly_the_functions_whose_backward_keeps_their_result():
    """The in-place pass overwrites the result of every other function: one that torch saves
    (expm1's, once missing here) would fail the backward with "modified by an inplace
    operation"."""
    assert {name for name in UNARY if _saves_its_result(name)} == ops.INPLACE
