"""Translation validation: the program after every pass (lower/program/passes/), printed and run,
equals the literal interpreter in values and in gradients (float64), on every shipped spec
and on random specs; rows run in blocks of one row and key spans by blocks of two queries, so
that the passes' blocked paths run at these small sizes. A wrong pass planted in the list is
caught and named."""

from dataclasses import replace
from pathlib import Path

import pytest
import sympy
import torch
from hypothesis import HealthCheck, given, settings
from test_hidden import WEIGHTS as PHRASINGS
from test_hidden import spec_text
from test_robustness import valid_specs

import indexattn
from indexattn import derive, ir
from indexattn.ir.shapes import recipe, rules
from indexattn.lower.pipeline import pipeline, plan, stages
from indexattn.lower.planner import canonical
from indexattn.lower.printers.codegen import generate
from indexattn.lower.program import passes
from indexattn.lower.program.kinds import made
from indexattn.lower.program.passes import PASSES, Pass, inplace, rows, spans
from indexattn.lower.program.steps import Contract
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt
from indexattn.runtime.compiled import CompiledSpec, _plain

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.attn")) + sorted((ROOT / "specs" / "models").glob("*.attn"))
# one row per block, chunks of two positions (the module's knobs); two queries per span (the
# runtime's)
KNOBS = {"BLOCK_SCORES": 1, "BLOCK_ROWS": 1, "CHUNK": 2, "DECAY_CHUNK": 2}
QUERY_BLOCK = 2


class Case:
    """One spec's random arguments, and the literal interpreter's outputs and gradients."""

    def __init__(self, spec: ir.Spec) -> None:
        self.spec = spec
        sizes = sample_sizes(spec, seed=1)
        required = rules(spec, recipe(spec)).required
        self.given = {k: v for k, v in sizes.items() if k in required}
        self.args = sample_arguments(spec, sizes, (2,), torch.float64, seed=3)
        self.want = self.run(lambda **kw: reference.evaluate(spec, **kw))

    def run(self, function) -> list[torch.Tensor]:
        """The outputs, then the gradient of a fixed random weighting of them by each float
        argument."""
        leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in self.args.items()}
        outputs = function(**leaves, **self.given)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        generator = torch.Generator().manual_seed(7)
        weights = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in outputs]
        loss = sum((o * w).sum() for o, w in zip(outputs, weights) if o.is_floating_point())
        floats = [v for v in leaves.values() if v.is_floating_point()]
        grads = torch.autograd.grad(loss, floats, allow_unused=True) if loss.requires_grad else []
        return [o.detach() for o in outputs] + [g for g in grads if g is not None]

    def agrees(self, program) -> bool:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rt, "QUERY_BLOCK", QUERY_BLOCK)
            return self.equal(self.run(_callable(self.spec, program)))

    def literally(self, spec: ir.Spec) -> bool:
        """Whether another spec (the canonical form) reads literally as this one."""
        return self.equal(self.run(lambda **kw: reference.evaluate(spec, **kw)))

    def equal(self, got: list[torch.Tensor]) -> bool:
        return len(got) == len(self.want) and all(
            g.shape == w.shape and torch.allclose(g, w, rtol=0, atol=1e-10, equal_nan=True)
            for g, w in zip(got, self.want)
        )


def _callable(spec: ir.Spec, program) -> CompiledSpec:
    """The program printed and loaded like any compiled spec, its blocking knobs turned down."""
    compiled = CompiledSpec(None, plain=_plain(spec, program, generate(program)))
    compiled.ir = spec
    for knob, value in KNOBS.items():
        if knob in compiled.function.__globals__:
            compiled.function.__globals__[knob] = value
    return compiled


def first_wrong(spec: ir.Spec, pipeline=PASSES, rewrites=None) -> str | None:
    """The first stage ("canonical", "plan" or a pass's name) whose spec or program differs
    from the literal interpreter or fails to run; None where every one agrees. A stage that
    prints the same source as the one before it runs the same code and is not run again."""
    case, before = Case(spec), None
    for name, program in stages(spec, rewrites, pipeline):
        if name == "canonical":
            if program is not spec and not case.literally(program):
                return name
            continue
        source = generate(program).text
        if source == before:
            continue
        before = source
        try:
            if not case.agrees(program):
                return name
        except Exception:  # a program that cannot run is wrong too
            return name
    return None


@pytest.mark.parametrize("path", SPECS, ids=[f"{p.parent.name}/{p.stem}" for p in SPECS])
def test_every_pass_keeps_every_shipped_spec_equal_to_the_oracle(path):
    spec = ir.check(path.read_text(encoding="utf-8"), path.stem, str(path))
    assert first_wrong(spec) is None


@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_every_pass_keeps_random_specs_equal_to_the_oracle(text):
    assert first_wrong(ir.check(text, "random")) is None, text


@pytest.mark.parametrize("weights", PHRASINGS, ids=range(len(PHRASINGS)))
def test_every_pass_keeps_each_masked_phrasing_equal_to_the_oracle(weights):
    """The rows' phrasings of tests/lower/test_hidden.py: the spans pass skips keys in some and
    refuses in others; every stage agrees with the oracle either way."""
    assert first_wrong(ir.check(spec_text(weights), "phrasing")) is None


def test_rows_that_read_a_score_transposed_are_refused(monkeypatch):
    """Found by the test above: the rows read T_<τ'τ>, made by the rows as T_<ττ'>; a block
    of rows holds its own rows of T alone, so the rows are refused. The twin: without that
    rule the rows pass makes a program that fails in blocks, and is named."""
    spec = ir.check(spec_text("T_<ττ'> = S_<ττ'> + M_<ττ'>\nsigmoid(T_<ττ'>) + T_<τ'τ>"), "t")
    assert first_wrong(spec) is None
    monkeypatch.setattr(rows, "_aligned", lambda steps, row: True)
    assert first_wrong(spec) == "rows"


def _doubled(program):
    """A wrong pass: the first product's scale doubled."""
    step = next(s for s in program.steps if isinstance(s, Contract))
    return program.with_steps({step.out.var: replace(step, scale=2 * step.scale)})


def _careless(program, monkeypatch):
    """The in-place pass without its test that a tensor is read once."""
    with monkeypatch.context() as patch:
        patch.setattr(inplace, "_target", lambda term, out, free, reads: _free(term, out, free))
        return inplace.run(program)


def _free(term, out, free) -> bool:
    return getattr(term, "var", None) in free and term.dims == out.dims and not term.select


def test_a_wrong_pass_is_caught_and_named():
    spec = ir.check((ROOT / "specs" / "softcap_window.attn").read_text(), "softcap_window")
    wrong = Pass("doubled", _doubled, "nothing: the scale is doubled")
    assert first_wrong(spec, (*PASSES[:3], wrong, *PASSES[3:])) == "doubled"
    assert first_wrong(spec) is None  # the twin: the true passes agree


REPHRASED = [
    ROOT / "benchmarks" / "specs" / f"{n}.attn"
    for n in ("mha_one_equation", "mha_masked_fill", "llama_halves")
]


def _halved(spec):
    """A wrong rewrite: the last equation's right-hand side halved."""
    eq = spec.equations[-1]
    rhs = ir.Product((eq.rhs, ir.Field(sympy.Rational(1, 2), (), eq.rhs.span)), (), eq.rhs.span)
    return replace(spec, equations=(*spec.equations[:-1], replace(eq, rhs=rhs)))


@pytest.mark.parametrize("path", REPHRASED, ids=[p.stem for p in REPHRASED])
def test_the_canonical_form_is_checked_and_a_wrong_rewrite_named(path):
    """The whole of mha in one equation (the projections split out), Llama's layer with its
    head width as two halves (the halves made one index): the canonical form reads as the
    spec, and so does every program after it; a rewrite that changes the values is named."""
    spec = ir.check(path.read_text(encoding="utf-8"), path.stem)
    assert canonical.canonical(spec) is not spec
    assert first_wrong(spec) is None
    wrong = (*canonical.REWRITES, _halved_rewrite())
    assert first_wrong(spec, rewrites=wrong) == "canonical"


READ_TWICE = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
S_<ττ'> = Q_<τa> K_<τ'a>
T_<ττ'> = S_<ττ'> / 3
U_<ττ'> = S_<ττ'> + T_<ττ'>
output U
"""


def test_an_in_place_pass_that_overwrites_a_value_read_twice_is_caught(monkeypatch):
    spec = ir.check(READ_TWICE, "read_twice")
    careless = Pass("careless_inplace", lambda p: _careless(p, monkeypatch), "")
    pipeline = tuple(careless if p.name == "inplace" else p for p in PASSES)
    assert first_wrong(spec, pipeline) == "careless_inplace"
    assert first_wrong(spec) is None


def test_the_dump_names_every_stage():
    spec = ir.check((ROOT / "specs" / "softcap_window.attn").read_text(), "softcap_window")
    names = [name for name, _ in stages(spec)]
    assert names == ["canonical", "plan", *passes.NAMES]
    final = pipeline(spec)
    assert "[rows]" in str(final) and "[constant] Spans" in str(final)
    assert "[rows]" not in str(pipeline(spec, after="hoist"))
    with pytest.raises(ValueError, match="no stage named 'hoisting'"):
        pipeline(spec, after="hoisting")


TWO = "index i : n\ninput x_<i>\ny_<i> = exp(x_<i>)\nz_<i> = tanh(y_<i>)\n"
FIRST = ["canonical", "plan"]  # the stages before the passes
# loses the block that makes y, which z's block reads
LOSES = Pass("loses_a_block", lambda p: replace(p, blocks=p.blocks[1:]), "")


def names_until_refused(pipeline, each: bool = True) -> list[str]:
    """The stages handed on before `Program.check` refuses one."""
    names = []
    with pytest.raises(AssertionError, match="is read, never made"):
        for name, _ in stages(ir.check(TWO, "two"), pipeline=pipeline, each=each):
            names.append(name)
    return names


def test_a_pass_that_loses_a_value_is_refused_before_it_is_handed_on():
    assert names_until_refused((PASSES[0], LOSES, *PASSES[1:])) == [*FIRST, PASSES[0].name]


def test_twin_a_compile_checks_the_planners_program_and_the_last_alone():
    """each=False (a compile's own run): the last program is still checked; the others not."""
    assert names_until_refused((*PASSES, LOSES), each=False) == [*FIRST, *passes.NAMES]
    clean = [name for name, _ in stages(ir.check(TWO, "two"), each=False)]
    assert clean == [*FIRST, *passes.NAMES]


def test_fresh_values_come_from_the_one_allocator():
    spec = ir.check((ROOT / "specs" / "softcap_window.attn").read_text(), "softcap_window")
    planned = plan(spec)
    final = pipeline(spec)
    spans = final.spans.step.out.var
    assert spans.id == planned.next_id and final.next_id == planned.next_id + 1
    assert spans.id not in {o.var.id for s in planned.steps for o in made(s)}


def test_the_command_line_dumps_the_program_after_a_pass(capsys):
    from indexattn import cli

    path = str(ROOT / "specs" / "gpt2.attn")
    assert cli.main(["compile", path, "--dump-after", "inplace"]) == 0
    before = capsys.readouterr().out
    assert cli.main(["compile", path, "--dump-after", "softmax_values"]) == 0
    after = capsys.readouterr().out
    assert "SoftmaxValues" in after and "SoftmaxValues" not in before
    assert before.startswith("program gpt2")
    assert cli.main(["compile", path, "--dump-after", "fusion"]) == 2
    assert "no stage named 'fusion'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mha_one_equation", "mha_masked_fill"])
def test_the_command_line_dumps_the_canonical_form_as_a_spec(name, capsys, monkeypatch):
    """`--dump-after canonical`: the spec the planner reads (the projections split out of
    the one equation, the masked fill made a sum), printed as a spec that checks again and
    computes the written spec's values and gradients. The twin: with a wrong rewrite
    planted, the dump is that rewrite's spec, and its values differ."""
    from indexattn import cli

    path = ROOT / "benchmarks" / "specs" / f"{name}.attn"
    spec = ir.check(path.read_text(encoding="utf-8"), name)
    case = Case(spec)
    assert cli.main(["compile", str(path), "--dump-after", "canonical"]) == 0
    dumped = ir.check(capsys.readouterr().out, name)
    assert dumped.equations != spec.equations and case.literally(dumped)
    monkeypatch.setattr(canonical, "REWRITES", (*canonical.REWRITES, _halved_rewrite()))
    assert cli.main(["compile", str(path), "--dump-after", "canonical"]) == 0
    assert not case.literally(ir.check(capsys.readouterr().out, name))


def _halved_rewrite() -> canonical.Rewrite:
    return canonical.Rewrite("halved", _halved, "nothing")


# -- each pass on its own: what it marks in a small program, and where it has nothing to do

WINDOW = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
input V_<τa>
param g_<a>  # a width of its own: the sequence is the one index no parameter has
scalar w = 3
M_<ττ'> = where(τ' > τ or τ - τ' >= w, -inf, 0)
S_<ττ'> = 2 tanh(Q_<τa> g_<a> K_<τ'a> / 2) + M_<ττ'>
A_<ττ'> = softmax_<τ'>(S_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""
PLAIN = "index i : n\ninput x_<i>\ny_<i> = exp(x_<i>)\n"
WEIGHTS = ROOT / "specs" / "simple.attn"  # returns its weights: softmax times values fused


def before_after(text: str, name: str):
    """The program before and after the named pass."""
    found = dict(stages(ir.check(text, "one_pass")))
    k = [*found].index(name)
    return found[[*found][k - 1]], found[name]


def made_by(program, kind: str) -> list:
    return [s for s in program.steps if type(s).__name__ == kind]


def test_hoist_marks_the_mask_constant_and_held():
    before, after = before_after(WINDOW, "hoist")
    (mask,) = made_by(after, "Grid")
    assert after.region(mask) == "constant" and mask.out.var in after.held
    assert not before.constant and not before_after(PLAIN, "hoist")[1].constant


def test_rows_marks_the_scores_to_their_product_with_the_values():
    before, after = before_after(WINDOW, "rows")
    assert {after.region(s) for s in made_by(after, "Reduction")} == {"rows"}
    assert [e.var.hint for e in after.rows.exits] == ["O"] and before.rows is None
    assert before_after(PLAIN, "rows")[1].rows is None


def test_spans_adds_one_constant_step_from_the_allocator():
    before, after = before_after(WINDOW, "spans")
    (spans,) = made_by(after, "Spans")
    assert after.region(spans) == "constant" and after.held[-1] == spans.out.var
    assert spans.out.var.id == before.next_id and after.spans.hidden.hides == "-inf"
    # the twin: a tanh after the mask sees the hidden keys (tanh(-inf) is -1): no spans
    turned = WINDOW.replace(
        "2 tanh(Q_<τa> g_<a> K_<τ'a> / 2) + M_<ττ'>", "tanh(Q_<τa> g_<a> K_<τ'a> + M_<ττ'>)"
    )
    assert before_after(turned, "spans")[1].spans is None


def test_inplace_marks_the_mask_added_onto_the_scores():
    _, after = before_after(WINDOW, "inplace")
    (add,) = made_by(after, "Add")
    assert add.into is not None and add.args[add.into].var.hint != "M"
    assert all(
        getattr(s, "into", None) in (None, False) for s in before_after(PLAIN, "inplace")[1].steps
    )


def test_softmax_values_replaces_three_steps_by_one():
    before, after = before_after(WEIGHTS.read_text(), "softmax_values")
    assert len(made_by(after, "SoftmaxValues")) == 1
    assert len(after.steps) == len(before.steps) - 1  # the softmax goes into the product's
    assert not made_by(before_after(WINDOW, "softmax_values")[1], "SoftmaxValues")


CHAIN = """index i, j : n
input x_<i>
param W_<ji>
h_<j> = W_<ji> x_<i>
u_<j> = exp(h_<j>)
y_<j> = u_<j> + 1
"""


def test_liveness_drops_what_no_later_block_reads():
    before, after = before_after(CHAIN, "liveness")
    assert [[v.hint for v in b.drop] for b in after.blocks] == [[], ["h"], []]
    assert not any(b.drop for b in before.blocks)
    # the twin: y reads h too, so h lives to the last block (the function returns there)
    later = before_after(CHAIN.replace("u_<j> + 1", "u_<j> + h_<j>"), "liveness")[1]
    assert not any(b.drop for b in later.blocks)


SUMMED = """index τ, τ' : N
index a : d
input Q_<τa>
input K_<τa>
param g_<a>
M_<ττ'> = where(τ' > τ, -inf, 0)
A_<ττ'> = sigmoid(Q_<τa> K_<τ'a> + M_<ττ'>)
O_<τa> = A_<ττ'> K_<τ'a> g_<a>
Z_<τ'a> = ({weights}) Q_<τa>
output O, Z
"""


@pytest.mark.parametrize("weights", ["A_<ττ'>", "A_<ττ'> + 1"])
def test_rows_that_sum_the_rows_away_add_up_the_blocks(weights, monkeypatch):
    """Z sums the rows away: each block gives its part. Where the part is zero at the keys
    no row of the block sees (A), the blocks skip them; where it is not (A + 1), they go over
    every key. The twin: without that rule, the spans pass makes a program that is wrong."""
    spec = ir.check(SUMMED.format(weights=weights), "summed")
    program = pipeline(spec)
    assert program.rows is not None and program.rows.summed
    assert (program.spans is None) == ("+ 1" in weights)
    assert first_wrong(spec) is None
    monkeypatch.setattr(spans, "_zero_at_hidden", lambda proof, summed: True)
    assert first_wrong(spec) == ("spans" if "+ 1" in weights else None)


BIASED = """index τ, τ' : N
index a : 4
input Q_<τa>
input K_<τa>
input V_<τa>
input B_<ττ'>
M_<ττ'> = where(τ' > τ, -inf, 0)
A_<ττ'> = softmax_<τ'>(Q_<τa> K_<τ'a> + B_<ττ'> + M_<ττ'>)
O_<τa> = A_<ττ'> V_<τ'a>
output O
"""


def test_rows_that_give_a_value_over_the_keys_go_over_every_key(monkeypatch):
    """The backward of attention with an input bias under a causal mask: its rows give dB_<ττ'>
    (joined over the blocks, a row over every key) besides dK and dV (added up), so the
    blocks go over every key. The twin: blocks over the keys the mask lets them see (the
    scores' key taken for the spans) give part of dB's rows, and the spans pass is wrong."""
    text = derive.backward_text(ir.check(BIASED, "biased"), BIASED)
    spec = ir.check(text, "biased_backward")
    program = pipeline(spec)
    assert program.rows is not None and program.rows.summed and program.spans is None
    assert first_wrong(spec) is None
    key = next(i for i in program.rows.scores.dims if i != program.rows.row)
    monkeypatch.setattr(spans, "_key", lambda spec, rows: key)
    assert first_wrong(spec) == "spans"


BACKWARDS = ["softcap_window", "attention_sinks", "differential", "talking_heads"]
BACKWARDS += ["layers/gemma2", "layers/llama"]  # a whole layer's, and the mask's dM by rows


@pytest.mark.parametrize("name", BACKWARDS)
def test_every_pass_keeps_a_derived_backward_equal_to_the_oracle(name):
    text = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn").backward_text()
    assert first_wrong(ir.check(text, f"{name}_backward")) is None
