"""The derived backward (indexattn/derive): its rules against sympy, its gradients against
autograd on the generated forward and on the literal interpreter for every shipped spec it
covers (dropout in training with the forward's masks), the refusals, and FlashAttention's
identity in mha's."""

import contextlib
import re
from functools import partial
from pathlib import Path

import pytest
import sympy
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_differential import call as fuzz_call
from test_differential import specs as fuzzed
from test_robustness import valid_specs

import indexattn
from indexattn import cli, ir, ops
from indexattn.derive import backward_text, defaults, derive, function
from indexattn.derive.function import gradients
from indexattn.derive.reverse import dropouts
from indexattn.derive.rewrites import BACKWARD_REWRITES
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt
from indexattn.views import markdown

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(ROOT.glob("specs/*.attn")) + sorted(ROOT.glob("specs/*/*.attn"))
# with dropout: derived in training with the forward's masks, compared with autograd's at one
# seed; against the oracle, in eval mode
DROPOUT = [
    "alibi",
    "causal_head",
    "gpt2",
    "gqa_core",
    "mha_separate",
    "sliding_window",
    "torch_mha",
    "models/bloom",
]


def key(path: Path) -> str:
    return path.stem if path.parent.name == "specs" else f"{path.parent.name}/{path.stem}"


DERIVED = [p for p in SPECS if key(p) not in DROPOUT]


# -- the rules beside the operators


def rule_expr(rule: str) -> sympy.Expr:
    """A rule read by the language's own checker: x, y, z are index variables, so the
    rule folds into one sympy expression by the operator table's forms."""
    text = f"index x, y, z : n\ninput t_<x>\nr_<xyz> = ({rule}) + 0 x + 0 y + 0 z\n"
    return ir.check(text, "rule").equations[0].rhs.expr


POINTS = [(0.7, 0.3, 1.9), (1.7, -0.8, 0.4), (0.45, 0.2, 0.9), (2.3, 1.1, 1.5), (-0.55, 0.2, 0.9)]
STEP = 1e-6  # of a central difference, where sympy cannot differentiate (Mod, floor, round)


def rule_error(name: str) -> float:
    """The largest difference between a rule and sympy's derivative of the op's form, in
    units of the comparison's tolerance: 1e-12 exactly, 1e-6 against a central difference."""
    op = ops.POW if name == "pow" else ops.FUNCTIONS[name]
    form = op.sympy or (lambda x: sympy.floor(x + sympy.Rational(1, 2)))  # round: flat too
    form = form if name != "pow" else (lambda x, y: x**y)
    real = sympy.symbols("x y z", real=True)
    index = sympy.symbols("x y z", integer=True, nonnegative=True)
    args = real[: op.arity]
    worst = 0.0
    for k, rule in enumerate(ops.DERIVATIVES[name]):
        got = rule_expr(rule).subs(dict(zip(index, real)))
        want = sympy.diff(form(*args), args[k])
        exact = not want.has(sympy.Derivative, sympy.DiracDelta, sympy.Subs)
        for point in POINTS:
            values = dict(zip(real, (abs(point[0]) if op.partial else point[0], *point[1:])))
            if exact:
                error = abs(complex(sympy.N(got.subs(values) - want.subs(values)))) / 1e-12
            else:
                up, down = (dict(values) for _ in range(2))
                up[args[k]] += STEP
                down[args[k]] -= STEP
                slope = (form(*args).subs(up) - form(*args).subs(down)) / (2 * STEP)
                error = abs(complex(sympy.N(got.subs(values) - slope))) / 1e-6
            worst = max(worst, error)
    return worst


def test_every_elementwise_function_has_a_rule():
    structural = {"where", "dropout"}  # derived in indexattn/derive itself
    assert set(ops.FUNCTIONS) - structural | {"pow"} == set(ops.DERIVATIVES)
    for name, rules in ops.DERIVATIVES.items():
        arity = ops.POW.arity if name == "pow" else ops.FUNCTIONS[name].arity
        assert len(rules) == arity, name


@pytest.mark.parametrize("name", sorted(ops.DERIVATIVES))
def test_each_rule_is_sympys_derivative(name):
    assert rule_error(name) < 1


def test_a_perturbed_rule_is_not_sympys_derivative(monkeypatch):
    monkeypatch.setitem(ops.DERIVATIVES, "tanh", ("1 - tanh(x)",))
    assert rule_error("tanh") > 1e6


# -- gradients of every shipped spec


def run(fn, args: dict, cotangents: list) -> dict:
    """Autograd's gradients of Σ output · cotangent through `fn`."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    out = fn(leaves)
    out = out if isinstance(out, tuple) else (out,)
    loss = sum((o * c).sum() for o, c in zip(out, cotangents))
    wanted = [k for k, v in leaves.items() if v.requires_grad]
    grads = torch.autograd.grad(loss, [leaves[k] for k in wanted], allow_unused=True)
    return {k: g for k, g in zip(wanted, grads) if g is not None}


def errors(path: Path, batch: tuple[int, ...] = (), training: bool = True) -> tuple[float, float]:
    """Derived against autograd on the generated forward, and on the literal interpreter:
    max |difference| / (1 + max |gradient|) over every argument."""
    spec = indexattn.compile_spec(path)
    sizes = sample_sizes(spec.ir)
    return compared(spec, sample_arguments(spec.ir, sizes, batch), sizes, training)


def compared(spec, args: dict, sizes: dict, training: bool = True) -> tuple[float, float]:
    """The derived gradients of a compiled spec at these arguments against autograd's and the
    literal interpreter's (as `errors`)."""
    given_sizes = {k: v for k, v in sizes.items() if k in spec.required}
    out = spec(**args, **given_sizes)
    generator = torch.Generator().manual_seed(1)
    cots = [
        torch.randn(o.shape, generator=generator, dtype=torch.float64)
        for o in (out if isinstance(out, tuple) else (out,))
    ]
    derived = gradients(spec, tuple(cots), training=training, **args, **sizes)
    worst = []
    for fn in (
        lambda leaves: spec(**leaves, **given_sizes),
        lambda leaves: reference.evaluate(spec.ir, **leaves, **given_sizes),
    ):
        want = run(fn, args, cots)
        for k in set(want) ^ set(derived):  # not reached: autograd's is zero (a step function)
            assert k in want and not want[k].any(), f"{k}'s gradient: {want.get(k)}"
        worst.append(
            max(
                (derived[k] - g).abs().max().item() / (1 + g.abs().max().item())
                for k, g in want.items()
                if k in derived
            )
        )
    return worst[0], worst[1]


@pytest.mark.parametrize("path", DERIVED, ids=[key(p) for p in DERIVED])
def test_derived_gradients_equal_autograd_and_the_oracle(path):
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10


@pytest.mark.parametrize("name", ["mha", "rope_partial"])
def test_with_batch_axes_a_params_gradient_sums_them(name):
    autograd, oracle = errors(ROOT / "specs" / f"{name}.attn", batch=(2,))
    assert autograd < 1e-10 and oracle < 1e-10


def trained(spec, args: dict, given: dict, mode: str, seed: int) -> dict:
    """The gradients of one training step (dropout at 0.3) after `torch.manual_seed(seed)`."""
    rates = {n.args[1].expr for _, n in dropouts(spec.ir)}
    rates = {s.ascii: 0.3 for s in spec.ir.scalars if s.symbol in rates}
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    torch.manual_seed(seed)
    out = spec(**leaves, **given, **rates, training=True, backward=mode)
    generator = torch.Generator().manual_seed(2)
    out = out if isinstance(out, tuple) else (out,)
    sum(
        (o * torch.randn(o.shape, generator=generator, dtype=o.dtype)).sum() for o in out
    ).backward()
    return {k: v.grad for k, v in leaves.items() if v.grad is not None}


@pytest.mark.parametrize("name", DROPOUT)
def test_in_training_the_derived_backward_reads_the_forwards_masks(name):
    """Dropout's masks are drawn by the forward in its own order, as autograd's forward draws
    them, and handed to the derived backward: at one seed, in float64, its gradients in
    training are autograd's. The twin: masks drawn at another seed give other gradients."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (2,))
    given = {k: v for k, v in sizes.items() if k in spec.required}
    autograd = trained(spec, args, given, "autograd", 5)
    for seed, same in ((5, True), (6, False)):
        derived = trained(spec, args, given, "derived", seed)
        assert set(derived) == set(autograd)
        worst = max((derived[k] - g).abs().max().item() for k, g in autograd.items())
        assert worst < 1e-10 if same else worst > 1e-3


@pytest.mark.parametrize("name", DROPOUT)
def test_in_eval_mode_dropout_is_the_identity(name):
    autograd, oracle = errors(ROOT / "specs" / f"{name}.attn", training=False)  # calls in eval
    assert autograd < 1e-10 and oracle < 1e-10


@pytest.fixture
def perturbed(monkeypatch):
    """A derivative rule to perturb; derivations cached before and during it are dropped."""
    function.compiled.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    function.compiled.cache_clear()


def test_a_perturbed_rule_gives_wrong_gradients(perturbed):
    path = ROOT / "specs" / "gated_output.attn"
    assert max(errors(path)) < 1e-10
    function.compiled.cache_clear()
    perturbed.setitem(ops.DERIVATIVES, "sigmoid", ("sigmoid(x) (1 + sigmoid(x))",))
    assert min(errors(path)) > 1e-3


POWER = "index i : n\nscalar p = 2.5\ninput x_<i>\ny_<i> = (x_<i>^2 + 1)^{c}\n"


@pytest.mark.parametrize("c", ["1", "2", "3", "0.5", "p"])
def test_a_power_s_slope_is_its_rule_with_the_numbers_folded(c, tmp_path):
    """pow's rule y x^(y - 1) at a number: y - 1 worked out, x^1 as x, x^0 as 1."""
    path = tmp_path / "power.attn"
    path.write_text(POWER.format(c=c), encoding="utf-8")
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10


def test_twin_a_perturbed_power_rule_is_seen(perturbed, tmp_path):
    path = tmp_path / "power.attn"
    path.write_text(POWER.format(c="3"), encoding="utf-8")
    perturbed.setitem(ops.DERIVATIVES, "pow", ("y x^(y - 2)", "x^y log(x)"))
    assert min(errors(path)) > 1e-3


@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_random_specs_derived_gradients_equal_autograd(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("derive") / "random.attn"
    path.write_text(text, encoding="utf-8")
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10, text


def test_the_differential_fuzzers_specs_derived_gradients_equal_autograd():
    """tests/oracle/test_differential.py's random specs (every function of the table, masks,
    gathers at token ids and at relative positions, concatenation, prefix sums, batch axes):
    the derived gradients equal autograd's and the oracle's; dropout's in eval mode."""

    @settings(deadline=None, max_examples=12, suppress_health_check=list(HealthCheck))
    @given(fuzzed(), st.integers(0, 1))
    def check(drawn, seed):
        text, fn = drawn
        spec = indexattn.compile_spec(text, name="fuzz")
        args, given = fuzz_call(spec, torch.float64, seed)
        autograd, oracle = compared(spec, args, given, training=fn != "dropout")
        assert autograd < 1e-10 and oracle < 1e-10, text

    check()


def test_twin_a_perturbed_rule_is_seen_on_a_fuzzed_spec(perturbed):
    text = (
        "index μ : h\nindex τ, τ' : N\nindex a : d\ninput X_<μτa>\ninput Y_<μτa>\n"
        "F_<μτa> = tanh(X_<μτa>)\nS_<μττ'> = F_<μτa> Y_<μτ'a> / sqrt(d)\n"
        "A_<μττ'> = softmax_<τ'>(S_<μττ'>)\nO_<μτa> = A_<μττ'> Y_<μτ'a>\noutput O, A\n"
    )
    spec = indexattn.compile_spec(text, name="fuzz")
    args, given = fuzz_call(spec, torch.float64, 0)
    assert max(compared(spec, args, given)) < 1e-10
    function.compiled.cache_clear()
    perturbed.setitem(ops.DERIVATIVES, "tanh", ("1 - tanh(x)",))
    assert min(compared(spec, args, given)) > 1e-3


# -- FlashAttention's form


def symbolic(node: ir.Node) -> sympy.Expr:
    """A node of plain references, products, sums and sum_<...> as a sympy expression."""
    if isinstance(node, ir.Field):
        return node.expr
    if isinstance(node, ir.Ref):
        return sympy.IndexedBase(node.tensor.name)[tuple(i.symbol for i in node.written)]
    if isinstance(node, ir.Sum):
        return sympy.Add(*(symbolic(t) for t in node.terms))
    if isinstance(node, ir.Product):
        return summed(sympy.Mul(*(symbolic(f) for f in node.factors)), node.summed)
    assert isinstance(node, ir.Reduce) and node.fn == "sum", node
    return summed(symbolic(node.body), node.over)


def summed(expr: sympy.Expr, over) -> sympy.Expr:
    for i in over:
        expr = sympy.Sum(expr, (i.symbol, 0, i.size - 1))
    return expr


def equation(text: str, name: str) -> ir.Equation:
    spec = ir.check(text, "backward")
    return next(eq for eq in spec.equations if eq.tensor.name == name)


def flash(text: str) -> bool:
    """Whether dS is A ∘ (dA − Σ_a dO ∘ O), FlashAttention's dS = P ∘ (dP − rowsum(dO ∘ O)),
    entry by entry at d_k = 3."""
    eq = equation(text, "dS")
    mu, tau, tau_p, a = (
        sympy.Symbol(g, integer=True, nonnegative=True) for g in ("μ", "τ", "τ'", "a")
    )
    A, dA, dO, out = (sympy.IndexedBase(n) for n in ("A", "dA", "dO", "O"))
    d_k = sympy.Symbol("d_k", integer=True, positive=True)
    want = A[mu, tau, tau_p] * (
        dA[mu, tau, tau_p] - sympy.Sum(dO[mu, tau, a] * out[mu, tau, a], (a, 0, d_k - 1))
    )
    got = symbolic(eq.rhs)
    return sympy.expand((got - want).subs(d_k, 3).doit()) == 0


def test_mha_backward_is_flashattentions():
    assert flash(indexattn.compile_spec(ROOT / "specs" / "mha.attn").backward_text())


def test_without_the_identity_it_is_the_softmax_backward_only():
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    others = tuple(r for r in BACKWARD_REWRITES if r.name != "flash")
    text = derive(spec.ir, spec.text, spec.file, rewrites=others).text
    assert not flash(text)
    assert "sum_<τ'>(A_<μττ'> dA_<μττ'>)" in text  # Σ_τ' A dA, the row sum it replaces


def test_fused_weights_get_one_cotangent():
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    derived = derive(spec.ir, spec.text, spec.file)
    assert [t.name for t in derived.reached] == ["X", "W", "W_O", "b_O"]
    dw = equation(derived.text, "dW")
    assert [str(i) for i in dw.tensor.layout[0]] == ["μ", "B", "a"]


def products(eq: ir.Equation) -> list[ir.Product]:
    return [n for n in ir.walk(eq.rhs) if isinstance(n, ir.Product)]


def test_a_fused_projections_cotangents_are_one_product_each():
    """dX and dW of mha's fused W: one contraction over B each, the cotangents stacked along
    B (the plan makes one matmul of each); with three weights (mha_separate) they stay three
    products, and the values equal autograd's either way."""
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    text = derive(spec.ir, spec.text, spec.file).text
    for name in ("dX", "dW"):
        eq = equation(text, name)
        assert len(products(eq)) == 1, eq.text
        assert "B" in {i.glyph for i in products(eq)[0].summed} or name == "dW"
    separate = indexattn.compile_spec(ROOT / "specs" / "mha_separate.attn")
    dx = equation(derive(separate.ir, separate.text, separate.file).text, "dX")
    assert len(products(dx)) == 3  # the twin: nothing to stack
    assert "B ==" not in dx.text


SLICES = """index τ : N
index i : d
index B : 3
index a : d
input X_<τi>
param W_<(Ba)i>
Y_<τa> = W_<(0a)i> X_<τi> + tanh(W_<(2a)i> X_<τi>)
"""


def test_slices_that_miss_a_constant_stack_with_zeros(tmp_path):
    """W read at B = 0 and B = 2 of three: the stack is 0 at B = 1, so dW_<(1a)i> is zero,
    and the gradients equal autograd's and the literal interpreter's."""
    path = tmp_path / "slices.attn"
    path.write_text(SLICES, encoding="utf-8")
    text = indexattn.compile_spec(path).backward_text()
    assert re.search(r"= where\(B == 0, dY\S*, where\(B == 2, \S+, 0\)\)", text), text
    assert len(products(equation(text, "dW"))) == 1
    assert len(products(equation(text, "dX"))) == 1
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10


RENAMED = """index τ : N
index i : d
index B : 2
index C : 2
index a : d
input X_<τi>
param W_<(Ba)i>
Z_<Cτa> = W_<(Ca)i> X_<τi>
Y_<τa> = Z_<0τa> Z_<1τa> + W_<(0a)i> X_<τi> + tanh(W_<(1a)i> X_<τi>)
"""


def test_a_stack_takes_the_index_the_cotangent_is_written_with(tmp_path):
    """W is also read plainly as W_<(Ca)i>, so dW is written over C: its slices' cotangents
    stack along C, not along W's declared B (which once gave `dW_stack_<τBa> = where(C == 0,
    ...)`, a SpecError); the gradients equal autograd's and the oracle's."""
    path = tmp_path / "renamed.attn"
    path.write_text(RENAMED, encoding="utf-8")
    text = indexattn.compile_spec(path).backward_text()
    assert re.search(r"_<τCa> = where\(C == 0, ", text), text
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10


# -- the backward is a spec: it prints, typesets, counts, and runs from the command line


def test_backward_typesets_and_counts():
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    backward = spec.backward()
    assert r"\operatorname{softmax}" in backward.latex()
    n, d_m, h, d_k = (
        sympy.Symbol(s, integer=True, positive=True) for s in ("N", "d_m", "h", "d_k")
    )
    values = {str(s): v for s, v in zip((n, d_m, h, d_k), (128, 256, 4, 64))}
    forward, both = (
        float(f.subs({s: values[str(s)] for s in f.free_symbols}))
        for f in (spec.flops(), backward.flops())
    )
    assert 2 * forward < both < 2.5 * forward  # the scores again (Q, K, V, O kept), then twice


def test_cli_grad_prints_the_backward(capsys):
    path = ROOT / "specs" / "sdpa.attn"
    assert cli.main(["grad", str(path)]) == 0
    text = capsys.readouterr().out
    assert text == backward_text(ir.check(path.read_text(), "sdpa"), path.read_text())
    assert "output dQ, dK, dV" in text


def test_cli_grad_writes_dropouts_masks_and_refusals(capsys, tmp_path):
    assert cli.main(["grad", str(ROOT / "specs" / "gpt2.attn")]) == 0
    assert "dA_<μττ'> = dÃ_2_<μττ'> Ξ_<μττ'>" in capsys.readouterr().out
    assert cli.main(["grad", "--eval", str(ROOT / "specs" / "gpt2.attn")]) == 0
    assert "Ξ" not in capsys.readouterr().out
    (tmp_path / "flat.attn").write_text(FLAT, encoding="utf-8")
    assert cli.main(["grad", str(tmp_path / "flat.attn")]) == 1
    assert "no cotangent reaches" in capsys.readouterr().err


def test_docs_show_what_the_derivation_writes():
    page = (ROOT / "docs" / "gradients.md").read_text(encoding="utf-8")
    shown = page.split("```text\n", 1)[1].split("```", 1)[0]
    written = indexattn.compile_spec(ROOT / "specs" / "mha.attn").backward_text()
    assert shown == written.split("\n\n")[-2] + "\n"


def test_language_reference_shows_what_the_derivation_writes():
    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    section = page.split("## Derivatives", 1)[1]
    forward, shown = re.findall(r"```attn\n(.*?)```", section, re.S)[:2]
    assert shown == backward_text(ir.check(forward, "attention"), forward)


# -- the derived backward as what autograd runs


def both_modes(name: str, batch=(2,)) -> tuple[dict, dict]:
    return both_modes_of(indexattn.compile_spec(ROOT / "specs" / f"{name}.attn"), batch)


def both_modes_of(spec, batch=(2,)) -> tuple[dict, dict]:
    """The gradients of one random loss under autograd's backward and the derived one."""
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, batch)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    found = []
    for mode in ("autograd", "derived"):
        leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
        out = spec(**leaves, **given, backward=mode)
        out = out if isinstance(out, tuple) else (out,)
        generator = torch.Generator().manual_seed(2)
        loss = sum(
            (o * torch.randn(o.shape, generator=generator, dtype=o.dtype)).sum() for o in out
        )
        loss.backward()
        found.append({k: v.grad for k, v in leaves.items() if v.grad is not None})
    return found[0], found[1]


@pytest.mark.parametrize(
    "name", ["mha", "kv_decode", "linear_attention_causal", "rope_partial", "models/gptj"]
)
def test_backward_derived_is_what_autograd_runs(name):
    """Called with the sizes the spec needs only (rope_partial and GPT-J need d_r; their
    keeping forwards, which return the unrotated part too, need d_p: the call's sizes are
    solved and handed on)."""
    autograd, derived = both_modes(name)
    assert set(autograd) == set(derived)
    for k, g in autograd.items():
        torch.testing.assert_close(derived[k], g, rtol=0, atol=1e-10)


def test_backward_derived_runs_the_derived_rules(perturbed):
    perturbed.setitem(ops.DERIVATIVES, "sigmoid", ("sigmoid(x) (1 + sigmoid(x))",))
    autograd, derived = both_modes("gated_output", batch=())
    assert max((derived[k] - g).abs().max().item() for k, g in autograd.items()) > 1e-3


def test_backward_derived_passes_gradcheck_and_gradgradcheck():
    spec = indexattn.compile_spec(ROOT / "specs" / "sdpa.attn")
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )

    def call(q, k, v):
        return spec(Q=q, K=k, V=v, backward="derived")

    assert torch.autograd.gradcheck(call, (q, k, v))
    assert torch.autograd.gradgradcheck(call, (q, k, v))


@pytest.mark.parametrize("kept", [True, False])
def test_a_double_backward_goes_through_what_the_forward_kept(kept, monkeypatch):
    """mha's backward reads Q, K, V and O as the forward kept them, without a record; under
    a double backward it computes them again with one, and gradgradcheck passes. The twin:
    reading them as kept, the second derivative misses their dependence on the weights."""
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    sizes = sample_sizes(spec.ir) | {"N": 3, "d_m": 4, "h": 2, "d_k": 2}
    args = sample_arguments(spec.ir, sizes)
    if not kept:
        monkeypatch.setattr(function, "again", lambda spec, ctx, tensors, held: list(held))

    def call(w):
        return spec(**(args | {"W": w}), h=2, backward="derived")

    leaves = (args["W"].clone().requires_grad_(),)
    assert torch.autograd.gradgradcheck(call, leaves, raise_exception=False) == kept


def test_backward_derived_of_a_refused_spec_is_a_spec_error():
    spec = indexattn.compile_spec(FLAT, name="flat")
    x = torch.randn(3)
    spec(x=x, backward="derived")  # no gradient asked for: the forward
    with pytest.raises(indexattn.SpecError, match="no cotangent reaches"):
        spec(x=x.requires_grad_(), backward="derived")
    with pytest.raises(ValueError, match="autograd"):
        spec(x=x, backward="symbolic")


def test_spec_pages_show_the_backward_or_why_not():
    mha = (ROOT / "docs" / "specs" / "mha.md").read_text(encoding="utf-8")
    backward = mha.split("## Backward", 1)[1].split("\n## ", 1)[0]
    assert (
        r"\left(\mathit{dA}_{\mu\tau\tau'} - \mathit{dO}_{\mu\tau a} \, O_{\mu\tau a}\right)"
        in (backward)
    )
    gpt2 = (ROOT / "docs" / "specs" / "gpt2.md").read_text(encoding="utf-8")
    assert "`O`, `Ξ`, `Ξ_2`, kept by the forward)" in gpt2
    why = markdown.backward(ir.check(FLAT, "flat"))
    assert why.startswith("## Backward\n\nNot derived: no derived backward: no cotangent reaches")


EMBEDDING = """# Token embedding, then a projection
index τ : N
index v : V
index a, b : d
input P_<τ> : int
param T_<va>
param W_<ab>
Y_<τb> = T_<[P_<τ>]a> W_<ab>
"""


def test_a_gather_at_token_ids_is_scattered_back(tmp_path):
    path = tmp_path / "embedding.attn"
    path.write_text(EMBEDDING, encoding="utf-8")
    assert "dT_<va> = sum_<τ'>(where(v == P_<τ'>, " in indexattn.compile_spec(path).backward_text()
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10


def test_a_cotangent_constant_along_an_index_is_refused():
    spec = indexattn.compile_spec("index i : n\ninput x_<i>\ny_<> = sum_<i>(x_<i>)\n", name="total")
    with pytest.raises(indexattn.SpecError, match="the cotangent of x, constant along i"):
        spec.backward_text()


FLAT = "index i : n\ninput x_<i>\ny_<i> = floor(x_<i>)\n"


def test_a_spec_whose_gradient_is_zero_everywhere_is_refused():
    spec = indexattn.compile_spec(FLAT, name="flat")
    with pytest.raises(indexattn.SpecError, match="no cotangent reaches"):
        spec.backward_text()


# -- random chains of the derived constructs

STEPS = [
    *(f"{{n}}_<ij> = {fn}({{t}}_<ij>)" for fn in ("exp", "tanh", "sigmoid", "relu", "gelu")),
    *(f"{{n}}_<ij> = {fn}({{t}}_<ij>)" for fn in ("silu", "elu", "softplus", "abs", "sin")),
    *(f"{{n}}_<ij> = {fn}({{t}}_<ij>^2 + 1)" for fn in ("log", "sqrt", "rsqrt")),
    *(f"{{n}}_<ij> = {fn}({{t}}_<ij>, X_<ij>)" for fn in ("min", "max")),
    "{n}_<ij> = clamp({t}_<ij>, -0.3, 0.4) + mod({t}_<ij>, 0.7) + floor({t}_<ij>)",
    "{n}_<ij> = ({t}_<ij>^2 + 1)^X_<ij> - {t}_<ij>^3",
    "{n}_<ij> = where({t}_<ij> > 0, {t}_<ij>, 2 X_<ij>)",
    "{n}_<ij> = {t}_<ik> W_<kj> / ({t}_<ik> W_<kj> W_<kj> + 3)",
    "{n}_<ij> = softmax_<j>({t}_<ij>) - cumsum_<j>({t}_<ij>)",
    *(f"{{n}}_<ij> = {{t}}_<ij> {r}_<j>({{t}}_<ij>)" for r in ("sum", "mean", "max", "min")),
    "{n}_<ij> = {t}_<ij> logsumexp_<i>({t}_<ij>) + {t}_<i[m - 1 - j]>",
]


@st.composite
def chains(draw) -> str:
    """Input X_<ij> and param W_<kj>, then one to three random steps, each reading the last."""
    lines = ["index i : n", "index j, k : m", "input X_<ij>", "param W_<kj>"]
    last = "X"
    for k, step in enumerate(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=3))):
        lines.append(step.format(n=f"T{k}", t=last))
        last = f"T{k}"
    return "\n".join(lines) + "\n"


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_random_chains_derived_gradients_equal_autograd(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("chain") / "chain.attn"
    path.write_text(text, encoding="utf-8")
    autograd, oracle = errors(path)
    assert autograd < 1e-10 and oracle < 1e-10, text


# -- the backward by blocks of query rows


BLOCKED = [  # the specs whose forward is blocked, and some whose backward alone is
    *("softcap_window", "attention_sinks", "differential", "talking_heads", "sigmoid_attention"),
    *("mha", "gqa", "chunked", "mla", "prefix_lm", "qk_norm", "yarn_rope"),
    *("layers/gemma2", "layers/llama", "models/llama3"),  # the mask's cotangent joined by rows
]


def blocked(name: str, monkeypatch, lost: int | None = None) -> list[int]:
    """The derived backward of a shipped spec turned down to one query row per block (where
    it skips keys, spans of two queries); its rows function counted per call, and the
    outputs of the call `lost` dropped (zeros)."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    _, backward = function.compiled(spec, True)
    namespace = backward.function.__globals__
    rows = namespace[f"{backward.name}_rows"]
    calls: list[int] = []

    def counting(*args, **kwargs):
        calls.append(1)
        out = rows(*args, **kwargs)
        return tuple(o * 0 for o in out) if len(calls) == lost else out

    monkeypatch.setitem(namespace, f"{backward.name}_rows", counting)
    monkeypatch.setitem(namespace, "BLOCK_SCORES", 1)
    monkeypatch.setitem(namespace, "BLOCK_ROWS", 1)
    if "rt.key_spans(" in backward.source:  # blocks of two queries, over the keys they see
        monkeypatch.setattr(rt, "QUERY_BLOCK", 2)
        monkeypatch.setattr(backward, "_constants", {})
    return calls


@pytest.mark.parametrize("name", BLOCKED)
def test_the_backward_by_blocks_of_rows_equals_autograd(name, monkeypatch):
    calls = blocked(name, monkeypatch)
    autograd, oracle = errors(ROOT / "specs" / f"{name}.attn")
    assert len(calls) > 1 and autograd < 1e-10 and oracle < 1e-10


@pytest.mark.parametrize("name", ["softcap_window", "layers/gemma2"])
def test_every_block_of_the_backward_counts(name, monkeypatch):
    blocked(name, monkeypatch, lost=2)
    assert min(errors(ROOT / "specs" / f"{name}.attn")) > 1e-3


class Widest(torch.utils._python_dispatch.TorchDispatchMode):
    """The most elements of any tensor an operation makes while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


def keep(counts: list[int], tensor: torch.Tensor) -> torch.Tensor:
    """A saved tensor, its elements counted."""
    counts.append(tensor.numel())
    return tensor


@pytest.mark.parametrize("budget", [4, None])
@pytest.mark.parametrize(
    "name, heads, given",
    [
        ("softcap_window", {"h": 2}, {"h": 2, "c": 5.0, "w": 8}),
        ("layers/gemma2", {"h_kv": 1, "n_rep": 2}, {"h_kv": 1}),  # the rest of the layer too
    ],
)
def test_a_training_step_holds_no_tensor_of_every_score(
    name, heads, given, budget, monkeypatch, saving
):
    """softcap_window, and a whole Gemma 2 decoder layer, at 2 heads and N = 32: with four
    query rows per block, no tensor the derived backward makes, and none saved for it, has
    h N² elements; nor any autograd saves, the forward's blocks recomputed in its backward.
    The twin: with every row in one block, the backward makes one; with the blocks' scores
    saved (not recomputed), autograd saves one."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    sizes = sample_sizes(spec.ir) | heads | {"N": 32}
    args = sample_arguments(spec.ir, sizes)
    _, backward = function.compiled(spec, True)
    every = 2 * 32 * 32
    for namespace in (backward.function.__globals__, spec.function.__globals__):
        monkeypatch.setitem(namespace, "BLOCK_SCORES", 2 * 32 * (budget or 32))
        monkeypatch.setitem(namespace, "BLOCK_ROWS", 1)
    saved = {}
    for mode in ("autograd", "derived"):
        leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
        counts: list[int] = []
        hooks = torch.autograd.graph.saved_tensors_hooks(partial(keep, counts), lambda t: t)
        with hooks, saving() if budget is None else contextlib.nullcontext():
            out = spec(**leaves, **given, backward=mode)
        saved[mode] = max(counts)
        with Widest() as widest:
            out.sum().backward()
    assert every > saved["derived"]
    assert (saved["autograd"] < every) == (budget is not None)
    assert (widest.most < every) == (budget is not None)


@pytest.mark.parametrize("budget", [4, None])
def test_a_block_holds_as_many_rows_as_its_scores_allow(budget, monkeypatch):
    """rope's backward at h = 2, N = 32 with a budget of four rows of scores (2 · 32 · 4):
    eight blocks of four rows. Its blocks also make dKr_<μτ'cj>, larger than the scores at
    planning sizes; sizing the blocks by that (h · N · 2 · d_r per row) ran one row per
    block (1024 calls at N = 1024, 6× autograd's time). The twin: one block of every row."""
    spec = indexattn.compile_spec(ROOT / "specs" / "rope.attn")
    sizes = sample_sizes(spec.ir) | {"h": 2, "N": 32}
    args = sample_arguments(spec.ir, sizes)
    _, backward = function.compiled(spec, True)
    namespace, calls = backward.function.__globals__, []
    rows = namespace[f"{backward.name}_rows"]
    monkeypatch.setitem(
        namespace, f"{backward.name}_rows", lambda *a, **k: calls.append(1) or rows(*a, **k)
    )
    monkeypatch.setitem(namespace, "BLOCK_SCORES", 2 * 32 * (budget or 32))
    monkeypatch.setitem(namespace, "BLOCK_ROWS", 1)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    given = {k: v for k, v in sizes.items() if k in spec.required}
    out = spec(**leaves, **given, backward="derived")
    with Widest() as widest:
        out.sum().backward()
    assert len(calls) == (8 if budget else 1)
    assert (widest.most < 2 * 32 * 32) == (budget is not None)


@pytest.mark.parametrize("budget", [4, None])
@pytest.mark.parametrize(
    "name, heads", [("softcap_window", {"h": 2}), ("attention_sinks", {"h_kv": 1, "n_rep": 2})]
)
def test_the_forward_that_keeps_runs_by_blocks_as_the_forward(name, heads, budget, monkeypatch):
    """What the derived backward keeps (Q, K, V, O) is returned by a forward that still
    runs by blocks of query rows: with four rows per block, at 2 heads and N = 32, no tensor
    it makes has every score (sinks' row statistic L, which only the scores read, is not
    kept: returning it would take it out of the blocks). The twin: one block makes one."""
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    sizes = sample_sizes(spec.ir) | heads | {"N": 32}
    args = sample_arguments(spec.ir, sizes)
    keeping = function.keeping(spec, True)
    monkeypatch.setitem(keeping.function.__globals__, "BLOCK_SCORES", 2 * 32 * (budget or 32))
    monkeypatch.setitem(keeping.function.__globals__, "BLOCK_ROWS", 1)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    with Widest() as widest:
        keeping(**args, **given, w=8)
    assert (widest.most < 2 * 32 * 32) == (budget is not None)


# -- the default backward, chosen by the benchmark


def test_the_defaults_table_is_the_benchmarks_choice_on_todays_specs():
    """benchmarks/gradients.py wrote it: each row's choice follows from its measurements,
    and its hash is the shipped spec's text (a spec edited since runs autograd's until it is
    measured again)."""
    table = defaults.table()
    assert {"derived", "autograd"} >= {r["backward"] for r in table.values()} and table
    for name, row in table.items():
        text = (ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8")
        assert row["sha256"] == defaults.digest(text), f"{name}: rerun benchmarks/gradients.py"
        assert defaults.choose(row["measured"]) == row["backward"], name


def test_the_default_rule_wants_less_memory_and_at_most_1_1x_the_time_at_every_long_n():
    """Derived where, at every measured N >= 4096, it held less memory and took at most 1.1x
    autograd's time; each twin breaks one condition."""
    row = {"autograd ms": 100.0, "derived ms": 110.0, "autograd MB": 50.0, "derived MB": 49.0}
    assert defaults.choose({"2048": {**row, "derived ms": 500.0}, "4096": row}) == "derived"
    for twin in (
        {"4096": {**row, "derived ms": 111.0}},
        {"4096": {**row, "derived MB": 50.0}},
        {"2048": row},
        {"4096": row, "8192": {**row, "derived MB": 51.0}},
    ):
        assert defaults.choose(twin) == "autograd", twin


def default_gradients(spec) -> torch.Tensor:
    """Every argument's gradient of the sum of the outputs, from a call that names no
    backward, flattened into one."""
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes)
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    out = spec(**leaves, **{k: v for k, v in sizes.items() if k in spec.required})
    out = out if isinstance(out, tuple) else (out,)
    sum(o.sum() for o in out if o.is_floating_point()).backward()
    return torch.cat([v.grad.flatten() for v in leaves.values() if v.grad is not None])


def test_a_spec_runs_its_default_backward(monkeypatch):
    """Where the table says derived (here, a table naming one text of sigmoid_attention), a
    call that names no backward runs the derived one: its cotangents doubled, the gradients
    differ from autograd's. The same text with one more comment line is another spec, and
    runs autograd's."""
    text = (ROOT / "specs" / "sigmoid_attention.attn").read_text(encoding="utf-8") + "# a\n"
    row = {"backward": "derived", "sha256": defaults.digest(text)}
    monkeypatch.setattr(defaults, "table", lambda: {"sigmoid_attention": row})
    defaults.default.cache_clear()
    chosen, edited = (indexattn.compile_spec(t, name="chosen") for t in (text, text + "# b\n"))
    assert (chosen.default_backward, edited.default_backward) == ("derived", "autograd")
    assert (default_gradients(chosen) - default_gradients(edited)).abs().max() < 1e-10
    backward = function._backward
    doubled = lambda *args: {k: 2 * g for k, g in backward(*args).items()}  # noqa: E731
    monkeypatch.setattr(function, "_backward", doubled)
    assert (default_gradients(chosen) - default_gradients(edited)).abs().max() > 1e-3
    defaults.default.cache_clear()


def test_torch_func_takes_autogradss_backward():
    """torch.func's transforms would need the Function's setup_context: a derived call
    under them runs autograd's backward, and equals it."""
    spec = indexattn.compile_spec(ROOT / "specs" / "sdpa.attn")
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, generator=generator, dtype=torch.float64) for _ in range(3))
    got = [
        torch.func.grad(lambda q, mode=mode: spec(Q=q, K=k, V=v, backward=mode)[0].sum())(q)
        for mode in ("derived", "autograd")
    ]
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=1e-12)


def test_twin_without_the_fallback_torch_func_refuses_the_function(monkeypatch):
    spec = indexattn.compile_spec(ROOT / "specs" / "sdpa.attn")
    q, k, v = (torch.randn(2, 3, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(function, "_transformed", lambda: False)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda q: spec(Q=q, K=k, V=v, backward="derived")[0].sum())(q)


# -- the backward built as IR, printed once

PRINTED = "index i, j : n\ninput x_<ij>\ninput b_<i>\ny_<ij> = {}\n"


def reread(rhs: str) -> ir.Node:
    return ir.check(PRINTED.format(rhs), "p").equations[-1].rhs


@pytest.mark.parametrize(
    "rhs",
    [
        "where(i == 0 and j > i, x_<ij> - b_<i> b_<i>, 0)",
        "where((i == j) or (j == 1), -x_<ij> x_<ij> + b_<i>, x_<ij>)",
        "x_<ij> (1 - sum_<j>(x_<ij> x_<ij>)) + where(x_<ij> == b_<i>, 1, 0)",
    ],
)
def test_the_printer_writes_what_reads_back_as_the_same_ir(rhs):
    """What the derivation builds is printed by ir/printer.py only: comparisons with their
    names and numbers bare, a product in a sum unbracketed, and the text checks to the IR."""
    node = reread(rhs)
    assert reread(ir.printer.text(node)) == node


def test_twin_the_printer_tells_one_number_apart():
    node = reread("where(i == 0 and j > i, x_<ij> - b_<i> b_<i>, 0)")
    other = reread("where(i == 1 and j > i, x_<ij> - b_<i> b_<i>, 0)")
    assert ir.printer.text(other) != ir.printer.text(node)
    assert reread(ir.printer.text(other)) != node
