"""Planning on meaning, not phrasing: two ways of writing one computation give the same plan
(the same steps, variable names aside), and a twin that changes the meaning gives another."""

import io
import re
import tokenize
from pathlib import Path

import pytest
import torch
from test_passes import first_wrong
from torch.utils.flop_counter import FlopCounterMode

import indexattn
from indexattn import ir
from indexattn.lower.pipeline import pipeline
from indexattn.lower.program.steps import Attention, Elementwise, PrefixProduct, Reduction
from indexattn.oracle.reference import evaluate
from indexattn.oracle.verify import compare, sample_arguments
from indexattn.views import cost

ROOT = Path(__file__).resolve().parents[2]

PROJECTIONS = """
index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
param W_Q_<(μa)i>
param W_K_<(μa)i>
param W_V_<(μa)i>
param W_O_<i(μa)>
Q_<μτa> = W_Q_<(μa)i> X_<τi>
K_<μτa> = W_K_<(μa)i> X_<τi>
V_<μτa> = W_V_<(μa)i> X_<τi>
M_<ττ'> = where(τ' > τ, -inf, 0)
"""

SEPARATE = (
    PROJECTIONS
    + """
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
"""
)

# the same computation, phrased otherwise
REPHRASED = {
    "scores inline in the softmax": PROJECTIONS
    + """
A_<μττ'> = softmax_<τ'>(Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
""",
    "softmax inline in the output": PROJECTIONS
    + """
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
""",
    "the core in one equation": (
        PROJECTIONS
        + """
O_<μτa> = softmax_<τ'>(Q_<μτb> K_<μτ'b> / sqrt(d_k) + M_<ττ'>) V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
"""
    ).replace("index a : d_k", "index a, b : d_k"),
    "weights, values and the output projection in one product": PROJECTIONS
    + """
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
Y_<τi> = W_O_<i(μa)> A_<μττ'> V_<μτ'a>
""",
    "other index names": (
        PROJECTIONS
        + """
S_<νσσ'> = Q_<νσb> K_<νσ'b> / sqrt(d_k) + M_<σσ'>
A_<νσσ'> = softmax_<σ'>(S_<νσσ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
"""
    ).replace("index a : d_k", "index a, b : d_k\nindex ν : h\nindex σ, σ' : N"),
}

# nanoGPT's masked_fill: the scores defined apart, the mask filled in by where
UNMASKED = PROJECTIONS.replace("M_<ττ'> = where(τ' > τ, -inf, 0)\n", "")
SCORES = "S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k)\n"
VALUES = "O_<μτa> = A_<μττ'> V_<μτ'a>\nY_<τi> = W_O_<i(μa)> O_<μτa>\n"
SCALED = (
    PROJECTIONS
    + "S_<μττ'> = Q_<μτa> K_<μτ'a>\nA_<μττ'> = softmax_<τ'>(S_<μττ'> / sqrt(d_k) + M_<ττ'>)\n"
    + VALUES
)
FILLED = UNMASKED + SCORES + "A_<μττ'> = softmax_<τ'>(where(τ' > τ, -inf, S_<μττ'>))\n" + VALUES
REPHRASED |= {
    "the mask filled by where, as masked_fill": FILLED,
    "the mask added to scores defined apart": PROJECTIONS
    + SCORES
    + "A_<μττ'> = softmax_<τ'>(S_<μττ'> + M_<ττ'>)\n"
    + VALUES,
    "the mask filled in an equation of its own": UNMASKED
    + SCORES
    + "F_<μττ'> = where(τ' > τ, -inf, S_<μττ'>)\nA_<μττ'> = softmax_<τ'>(F_<μττ'>)\n"
    + VALUES,
    "the scores kept where the key is seen, -inf elsewhere": FILLED.replace(
        "where(τ' > τ, -inf, S_<μττ'>)", "where(τ' <= τ, S_<μττ'>, -inf)"
    ),
    "the scale applied to the scores inside the softmax": SCALED,
    "the scale inside the fill": FILLED.replace(" / sqrt(d_k)", "").replace(
        "-inf, S_<μττ'>)", "-inf, S_<μττ'> / sqrt(d_k))"
    ),
    "the scores as an explicit sum over the width": SEPARATE.replace(
        "Q_<μτa> K_<μτ'a> / sqrt(d_k)", "sum_<a>(Q_<μτa> K_<μτ'a>) / sqrt(d_k)"
    ),
    "softmax written out, the max subtracted": SEPARATE.replace(
        "A_<μττ'> = softmax_<τ'>(S_<μττ'>)",
        "E_<μττ'> = exp(S_<μττ'> - max_<τ'>(S_<μττ'>))\nA_<μττ'> = E_<μττ'> / sum_<τ'>(E_<μττ'>)",
    ),
    "softmax written out with logsumexp": SEPARATE.replace(
        "softmax_<τ'>(S_<μττ'>)", "exp(S_<μττ'> - logsumexp_<τ'>(S_<μττ'>))"
    ),
    "the values as an explicit sum over the keys": SEPARATE.replace(
        "O_<μτa> = A_<μττ'> V_<μτ'a>", "O_<μτa> = sum_<τ'>(A_<μττ'> V_<μτ'a>)"
    ),
}

# one thing changed: another computation
TWINS = {
    "filled with 0, not -inf": FILLED.replace("-inf, S_<μττ'>", "0, S_<μττ'>"),
    "filled on the diagonal too": FILLED.replace("τ' > τ, -inf", "τ' >= τ, -inf"),
    "scaled by d_k inside the softmax": SCALED.replace("/ sqrt(d_k)", "/ d_k"),
    "logsumexp over the queries": SEPARATE.replace(
        "softmax_<τ'>(S_<μττ'>)", "exp(S_<μττ'> - logsumexp_<τ>(S_<μττ'>))"
    ),
    "normalised over the queries": SEPARATE.replace(
        "A_<μττ'> = softmax_<τ'>(S_<μττ'>)",
        "E_<μττ'> = exp(S_<μττ'>)\nA_<μττ'> = E_<μττ'> / sum_<τ>(E_<μττ'>)",
    ),
    "the weights summed before the values": SEPARATE.replace(
        "O_<μτa> = A_<μττ'> V_<μτ'a>", "O_<μτa> = sum_<τ'>(A_<μττ'>) V_<μτa>"
    ),
    "the diagonal masked too": SEPARATE.replace("τ' > τ", "τ' >= τ"),
    "scaled by d_k": SEPARATE.replace("/ sqrt(d_k)", "/ d_k"),
    "softmax over the queries": SEPARATE.replace("softmax_<τ'>", "softmax_<τ>"),
    # a decay that carries the key too: the sum over the key is not the core's alone
    "a decay on the keys in the one product": PROJECTIONS
    + """
S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
Y_<τi> = W_O_<i(μa)> A_<μττ'> V_<μτ'a> exp(τ' - τ)
""",
    # a is on the left, so the one-equation core without its own width index keeps a free
    # inside the softmax: no sum over a in the scores
    "the width kept free in the scores": PROJECTIONS
    + """
O_<μτa> = softmax_<τ'>(Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>) V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
""",
}


def body(text: str) -> list[str]:
    """The generated function's code (its scores' function by rows first, where it has one),
    comments and `del` lines dropped (when a name is let go follows the equations' blocks, not
    the steps), its local variables and the words of its strings (einsum's index names)
    renamed in the order they first appear."""
    source = indexattn.compile_spec(text, name="t").source
    start = source.find("\ndef t_rows(")
    start = source.index("\ndef t(") if start < 0 else start
    code = re.sub(r"^ +del .*\n", "", source[start:], flags=re.MULTILINE)
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    targets = re.findall(r"^ +([\w, ]+?) = ", code, re.MULTILINE)
    local = {name.strip() for line in targets for name in line.split(",")}
    names: dict[str, str] = {}
    words: dict[str, str] = {}
    out = []
    for t in tokens:
        if t.type == tokenize.COMMENT:
            continue
        string = t.string
        if t.type == tokenize.NAME and string in local:
            string = names.setdefault(string, f"v{len(names)}")
        elif t.type == tokenize.STRING:
            string = re.sub(
                r"[A-Za-z_]\w*", lambda m: words.setdefault(m[0], f"w{len(words)}"), string
            )
        out.append(string)
    return [line for line in " ".join(out).split("\n") if line.strip()]


def word(words: dict[str, str], found: str) -> str:
    return words.setdefault(found, f"w{len(words)}")


@pytest.mark.parametrize("phrasing", REPHRASED)
def test_phrasings_of_one_computation_plan_the_same_steps(phrasing):
    assert body(REPHRASED[phrasing]) == body(SEPARATE)


@pytest.mark.parametrize("twin", TWINS)
def test_a_twin_that_means_something_else_plans_other_steps(twin):
    assert body(TWINS[twin]) != body(SEPARATE)


@pytest.mark.parametrize("text", [FILLED, TWINS["filled with 0, not -inf"]])
def test_a_mask_filled_by_where_equals_the_literal_reading(text):
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


TWO_CORES = """
index τ, τ' : N
index μ : h
index a : d
input Q_<μτa>
input K_<μτa>
input P_<μτa>
input R_<μτa>
input V_<μτa>
M_<ττ'> = where(τ' > τ, -inf, 0)
L_<ττ'> = where(τ' > τ, -inf, 0)
O_<μτa> = softmax_<τ'>(Q_<μτb> K_<μτ'b> / sqrt(d) + M_<ττ'>) V_<μτ'a>
U_<μτa> = softmax_<τ'>(P_<μτb> R_<μτ'b> / sqrt(d) + L_<ττ'>) V_<μτ'a>
Y_<μτa> = O_<μτa> - U_<μτa>
""".replace("index a : d", "index a, b : d")
ONE_MASK = TWO_CORES.replace("+ L_<ττ'>", "+ M_<ττ'>").replace(
    "L_<ττ'> = where(τ' > τ, -inf, 0)\n", ""
)


def test_one_causal_mask_read_by_two_cores_is_causal_in_both():
    assert body(ONE_MASK) == body(TWO_CORES)
    assert cores(indexattn.compile_spec(ONE_MASK, name="t")) == ["causal", "causal"]


def test_a_shared_mask_read_elsewhere_too_is_built_and_still_causal_in_the_cores():
    spec = indexattn.compile_spec(ONE_MASK + "output Y, M\n", name="t")
    assert cores(spec) == ["causal", "causal"]
    assert compare(spec, torch.float64, (2,)).ok
    twin = indexattn.compile_spec(ONE_MASK.replace("τ' > τ", "τ' >= τ"), name="t")
    assert cores(twin) == ["mask", "mask"]  # each core a mask (by blocks: test_spans.py)


def cores(spec) -> list[str]:
    """The attention kernel's steps in the final program: "causal", or "mask" (read whole)."""
    kernels = [s for s in spec.program.steps if isinstance(s, Attention)]
    return ["causal" if s.causal else "mask" if s.mask is not None else "plain" for s in kernels]


def shipped(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def test_the_output_projection_in_one_product_is_mha_with_the_kernel():
    """`Y = W_O A V + b_O`: A and V alone carry the key, so they are the core and W_O projects
    the kernel's result, as mha.attn's two equations say."""
    one = shipped("benchmarks/specs/mha_one_product.attn")
    assert body(one) == body(shipped("specs/mha.attn"))
    spec = indexattn.compile_spec(one, name="t")
    assert cores(spec) == ["causal"]
    assert compare(spec, torch.float64, (2,)).ok


def test_a_factor_that_carries_the_key_too_leaves_no_core_and_still_equals_the_literal_reading():
    spec = indexattn.compile_spec(TWINS["a decay on the keys in the one product"], name="t")
    assert cores(spec) == []
    assert compare(spec, torch.float64, (2,)).ok


SHARED = shipped("benchmarks/specs/shared_mask.attn")
SUMMED = "A1_<μττ'> V1_<μτ'a> + A2_<μττ'> V2_<μτ'a>"
APART = SHARED.replace(
    f"O_<μτa>   = {SUMMED}",
    "O1_<μτa> = A1_<μττ'> V1_<μτ'a>\nO2_<μτa> = A2_<μττ'> V2_<μτ'a>\nO_<μτa> = O1_<μτa> + O2_<μτa>",
)


def test_two_cores_summed_in_one_equation_are_two_causal_kernel_calls_then_added():
    assert APART != SHARED and body(SHARED) == body(APART)
    spec = indexattn.compile_spec(SHARED, name="t")
    assert cores(spec) == ["causal", "causal"]
    assert compare(spec, torch.float64, (2,)).ok


def test_two_cores_subtracted_are_two_kernel_calls_and_a_subtraction():
    twin = SHARED.replace(SUMMED, SUMMED.replace("+", "-"))
    assert body(twin) != body(SHARED)
    spec = indexattn.compile_spec(twin, name="t")
    assert cores(spec) == ["causal", "causal"]
    assert compare(spec, torch.float64, (2,)).ok


HALVES = """
index τ, τ' : N
index i : d_m
index μ : h
index j : d_r
index a : 2 d_r
input X_<τi>
param W_Q_<(μa)i>
param W_K_<(μa)i>
param W_V_<(μa)i>
param W_O_<i(μa)>
θ_<τj> = τ 10000^(-j / d_r)
Q_<μτa> = W_Q_<(μa)i> X_<τi>
K_<μτa> = W_K_<(μa)i> X_<τi>
V_<μτa> = W_V_<(μa)i> X_<τi>
R0_<μτj> = Q_<μτ[j]> cos(θ_<τj>) - Q_<μτ[d_r + j]> sin(θ_<τj>)
R1_<μτj> = Q_<μτ[d_r + j]> cos(θ_<τj>) + Q_<μτ[j]> sin(θ_<τj>)
T0_<μτj> = K_<μτ[j]> cos(θ_<τj>) - K_<μτ[d_r + j]> sin(θ_<τj>)
T1_<μτj> = K_<μτ[d_r + j]> cos(θ_<τj>) + K_<μτ[j]> sin(θ_<τj>)
M_<ττ'> = where(τ' > τ, -inf, 0)
S_<μττ'> = (R0_<μτj> T0_<μτ'j> + R1_<μτj> T1_<μτ'j>) / sqrt(2 d_r) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> V_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
"""


def test_rotary_written_as_two_halves_is_the_kernel_on_whole_queries_and_keys():
    spec = indexattn.compile_spec(HALVES, name="t")
    (core,) = [s for s in spec.program.steps if isinstance(s, Attention)]
    assert core.causal and [q.var.hint for q in core.q] == ["R0", "R1"]
    assert [k.var.hint for k in core.k] == ["T0", "T1"]  # whole queries and keys, joined
    assert "softmax" not in step_functions(spec) and cores(spec) == ["causal"]
    assert compare(spec, torch.float64, (2,)).ok


def test_halves_scaled_apart_are_not_one_kernel_call_and_still_equal_the_literal_reading():
    twin = HALVES.replace(
        "(R0_<μτj> T0_<μτ'j> + R1_<μτj> T1_<μτ'j>) / sqrt(2 d_r)",
        "R0_<μτj> T0_<μτ'j> / sqrt(2 d_r) + R1_<μτj> T1_<μτ'j>",
    )
    spec = indexattn.compile_spec(twin, name="t")
    assert cores(spec) == []
    assert compare(spec, torch.float64, (2,)).ok


ONE_PRODUCT = SEPARATE.replace(
    "O_<μτa> = A_<μττ'> V_<μτ'a>\nY_<τi> = W_O_<i(μa)> O_<μτa>\n",
    "Y_<τi> = W_O_<i(μa)> A_<μττ'> V_<μτ'a>\n",
)
# the weights returned too: computed, so no kernel, and W_O A V is a product of three
PRODUCT = ONE_PRODUCT + "output Y, A\n"


@pytest.mark.parametrize(("d_m", "h", "d_k"), [(96, 4, 8), (8, 2, 16)])
def test_a_product_of_three_takes_the_order_with_fewer_flops_at_the_calls_sizes(d_m, h, d_k):
    """Y = W_O A V: GPT-2's shape (d_m > d_k) contracts A with V first (2 h N² d_k), a head
    wider than the model W_O with V (2 h N² d_m); flops() counts the order taken, as torch
    counts it."""
    n = 32
    spec = indexattn.compile_spec(PRODUCT, name="t")
    sizes = {"N": n, "d_m": d_m, "h": h, "d_k": d_k}
    args = sample_arguments(spec.ir, sizes, (1,), torch.float64, seed=0)
    with FlopCounterMode(display=False) as counter:
        spec(**args, h=h)
    projections = 4 * 2 * n * d_m * h * d_k  # Q, K, V and the output's W_O
    scores = 2 * h * n * n * d_k
    assert counter.get_total_flops() == projections + scores + 2 * h * n * n * min(d_m, d_k)
    matmul = sum((c for _, c in cost.block_costs(spec.plan)), cost.Cost()).matmul
    assert cost.evaluate(matmul, cost.sizes_for(spec.ir, sizes)) == counter.get_total_flops()
    assert compare(spec, torch.float64, (2,)).ok


def test_the_order_chosen_by_sizes_traces_under_compile_and_export():
    spec = indexattn.compile_spec(PRODUCT, name="t")
    module = spec.module(d_m=16, h=2, d_k=4).double().eval()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), module(x))
    n = torch.export.Dim("N", min=2, max=64)
    exported = torch.export.export(module, (x,), dynamic_shapes={"X": {1: n}}).module()
    longer = torch.randn(2, 12, 16, dtype=torch.float64)
    torch.testing.assert_close(exported(longer), module(longer))


SINKS = shipped("specs/attention_sinks.attn")
SINK_LINE = "A_<grττ'> = softmax_<τ'>(S_<grττ'>) sigmoid(L_<grτ> - sinks_<(gr)>)"
LSE_LINE = "L_<grτ>   = logsumexp_<τ'>(S_<grττ'>)\n"
SINK_PHRASINGS = {
    "the logsumexp inline": SINKS.replace(LSE_LINE, "").replace(
        "L_<grτ> - sinks", "logsumexp_<τ'>(S_<grττ'>) - sinks"
    ),
    "the logsumexp with other index names": SINKS.replace(
        LSE_LINE, "L_<grσ> = logsumexp_<κ>(S_<grσκ>)\n"
    ).replace("index a     : d_k", "index a     : d_k\nindex σ, κ : N"),
    "the factors the other way round": SINKS.replace(
        SINK_LINE, "A_<grττ'> = sigmoid(L_<grτ> - sinks_<(gr)>) softmax_<τ'>(S_<grττ'>)"
    ),
}


def step_functions(spec) -> list[str]:
    """The functions and reductions of a spec's final program, a softmax with a sink's logit
    as `softmax+sink`."""
    found = []
    for step in spec.program.steps:
        if isinstance(step, Reduction | Elementwise):
            found.append(step.fn + ("+sink" if getattr(step, "sink", None) else ""))
    return found


def code_lines(source: str) -> str:
    return "\n".join(line.split("#")[0] for line in source.splitlines())


@pytest.mark.parametrize("phrasing", SINK_PHRASINGS)
def test_a_sink_is_one_more_column_of_the_softmax_however_it_is_written(phrasing):
    """softmax(S) σ(L - s), L the logsumexp of S: GPT-OSS's softmax over [S, s] without the
    sink's column; the logsumexp is never computed."""
    assert SINK_PHRASINGS[phrasing] != SINKS
    assert body(SINK_PHRASINGS[phrasing]) == body(SINKS)
    functions = step_functions(indexattn.compile_spec(SINKS, name="t"))
    assert functions.count("softmax+sink") == 1
    assert "logsumexp" not in functions and "sigmoid" not in functions


SINK_TWINS = {
    # σ(L + s) is the sink -s: another sign, the literal steps
    "the sink's logit added": SINKS.replace("L_<grτ> - sinks", "L_<grτ> + sinks"),
    # the logsumexp of other scores (the mask left out) is no sink
    "the logsumexp of other scores": SINKS.replace(
        LSE_LINE,
        "P_<grττ'> = Q_<grτa> K_<gτ'a> / sqrt(d_k)\nL_<grτ> = logsumexp_<τ'>(P_<grττ'>)\n",
    ),
    # a logsumexp over the queries is no sink either
    "the logsumexp over the queries": SINKS.replace(
        LSE_LINE, "L_<grτ'> = logsumexp_<τ>(S_<grττ'>)\n"
    ).replace("L_<grτ> - sinks", "L_<grτ'> - sinks"),
}


@pytest.mark.parametrize("twin", SINK_TWINS)
def test_a_sink_twin_is_computed_as_written_and_equals_the_literal_reading(twin):
    spec = indexattn.compile_spec(SINK_TWINS[twin], name="t")
    assert body(SINK_TWINS[twin]) != body(SINKS)
    assert "logsumexp" in code_lines(spec.source) and "sigmoid" in code_lines(spec.source)
    assert compare(spec, torch.float64, (2,)).ok


def test_a_logsumexp_read_elsewhere_too_is_computed_and_the_sink_still_one_column():
    spec = indexattn.compile_spec(SINKS.replace("output Y", "output Y, L"), name="t")
    functions = step_functions(spec)
    assert functions.count("logsumexp") == 1 and functions.count("softmax+sink") == 1
    assert compare(spec, torch.float64, (2,)).ok


def test_a_row_with_every_key_hidden_gives_zeros_with_a_sink_as_without():
    """The first query sees no key: the sink takes the whole row, as the literal σ(L - s) = 0
    with L = -inf says (values and gradients)."""
    hidden = SINKS.replace("where(τ' > τ or", "where(τ' > τ or τ == 0 or")
    assert hidden != SINKS
    spec = indexattn.compile_spec(hidden, name="t")
    assert compare(spec, torch.float64, (2,)).ok
    args = sample_arguments(
        spec.ir, {"N": 6, "d_m": 8, "h_kv": 2, "n_rep": 2, "d_k": 4}, (1,), torch.float64, seed=0
    )
    args = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
    y = spec(**args, h_kv=2)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(args["sinks"].grad).all()
    assert torch.allclose(y[0, 0], args["o_proj_bias"], atol=0, rtol=0)


SHARED_SCORES = """
index τ, τ' : N
index i : d
index μ : h
input X_<τi>
input V_<μτi>
input s_<μ>
S_<ττ'> = X_<τi> X_<τ'i>
L_<τ> = logsumexp_<τ'>(S_<ττ'>)
A_<μττ'> = softmax_<τ'>(S_<ττ'>) sigmoid(L_<τ> - s_<μ>)
O_<μτi> = A_<μττ'> V_<μτ'i>
output O
"""


def test_a_sink_with_axes_of_its_own_is_computed_as_written():
    """One logit per head over scores the heads share is no column of the scores' rows; one
    logit per query (the twin) is."""
    spec = indexattn.compile_spec(SHARED_SCORES, name="shared")
    assert "torch.logsumexp" in spec.source and "torch.cat" not in spec.source
    assert compare(spec, torch.float64, (2,)).ok
    per_query = SHARED_SCORES.replace("s_<μ>", "s_<τ>").replace("A_<μττ'>", "A_<ττ'>")
    twin = indexattn.compile_spec(per_query, name="per_query")
    assert "torch.logsumexp" not in twin.source and "torch.cat" in twin.source
    assert compare(twin, torch.float64, (2,)).ok


TWICE = """
index τ, τ' : N
index a : d
input Z_<τa>
input Y_<τa>
W_<ττ'> = Z_<τa> Y_<τ'a>
S3_<ττ'> = Z_<τa> Y_<τ'a>
O_<ττ'> = W_<ττ'> + 2 S3_<ττ'>
output O
"""


def test_one_product_written_in_two_equations_is_computed_once_under_its_first_name():
    spec = indexattn.compile_spec(TWICE, name="twice")
    code = code_lines(spec.source)
    assert code.count("@") + code.count("einsum(") == 1
    assert compare(spec, torch.float64, (2,)).ok
    twin = indexattn.compile_spec(TWICE.replace("S3_<ττ'> = Z_<τa>", "S3_<ττ'> = Y_<τa>"))
    assert code_lines(twin.source).count("@") + code_lines(twin.source).count("einsum(") == 2
    assert compare(twin, torch.float64, (2,)).ok


GATED_MLP = """
index τ : N
index i : d_m
index f : d_ff
input X_<τi>
param W_g_<fi>
param W_u_<fi>
param W_d_<if>
G_<τf> = W_g_<fi> X_<τi>
U_<τf> = W_u_<fi> X_<τi>
"""
GATED_SPLIT = GATED_MLP + "H_<τf> = silu(G_<τf>) U_<τf>\nY_<τi> = W_d_<if> H_<τf>\n"
GATED_INLINE = GATED_MLP + "Y_<τi> = W_d_<if> (silu(G_<τf>) U_<τf>)\n"


def test_a_weight_times_a_gated_product_is_one_linear_however_it_is_written():
    """SwiGLU's down projection written inline, `W_d (silu(G) U)`, is the gate times the up
    projection, then one `F.linear`, as with the product in an equation of its own."""
    assert body(GATED_INLINE) == body(GATED_SPLIT)
    spec = indexattn.compile_spec(GATED_INLINE, name="t")
    assert spec.source.count("F.linear(") == 3 and "einsum" not in spec.source
    assert compare(spec, torch.float64, (2,)).ok


def test_a_weight_times_factors_with_other_indices_is_not_split_so():
    """The twin: a per-token factor `g_<τ>` beside `U_<τf>` is not one elementwise product of
    equal shapes, so the factors keep opt_einsum's order (W_d U first, then g), not the
    split's; still the literal reading."""
    per_token = GATED_MLP + "input g_<τ>\n"
    inline = per_token + "Y_<τi> = W_d_<if> (g_<τ> U_<τf>)\n"
    split = per_token + "H_<τf> = g_<τ> U_<τf>\nY_<τi> = W_d_<if> H_<τf>\n"
    assert body(inline) != body(split)
    assert compare(indexattn.compile_spec(inline, name="t"), torch.float64, (2,)).ok


ONE_EQUATION = shipped("benchmarks/specs/mha_one_equation.attn")
VALUES_LINE = "W_<(μ2a)l> X_<τ'l> + b_O_<i>"
ONE_EQUATION_TWINS = {
    # the values scaled by the scores' factor too: another product, still by the kernel
    "the values scaled": ONE_EQUATION.replace(VALUES_LINE, "W_<(μ2a)l> X_<τ'l> / 2 + b_O_<i>"),
    # the keys projected by the queries' slice of the weight: no whole fused projection
    "the keys by the queries' weights": ONE_EQUATION.replace("W_<(μ1b)k>", "W_<(μ0b)k>"),
}


def test_the_whole_of_mha_in_one_equation_is_mha_with_the_kernel():
    """The projections inline in the softmax's argument and in the values: the canonical form
    (lower/planner/canonical.py) makes each an equation of its own, so the plan is mha.attn's (one
    fused projection, the kernel with is_causal, no N×N softmax)."""
    assert body(ONE_EQUATION) == body(shipped("specs/mha.attn"))
    spec = indexattn.compile_spec(ONE_EQUATION, name="t")
    code = code_lines(spec.source)
    assert "is_causal=True" in code and "softmax" not in code and code.count("F.linear(") == 2
    assert compare(spec, torch.float64, (2,)).ok


@pytest.mark.parametrize("twin", ONE_EQUATION_TWINS)
def test_a_twin_of_mha_in_one_equation_plans_otherwise_and_equals_the_literal_reading(twin):
    text = ONE_EQUATION_TWINS[twin]
    assert text != ONE_EQUATION and body(text) != body(ONE_EQUATION)
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


RETENTION = shipped("specs/retention.attn")
DECAY_LINE = "D_<μττ'> = where(τ' > τ, 0, exp((τ - τ') λ_<μ>))"
FACTOR = "C_<ττ'> = where(τ' > τ, 0, 1)\nD_<μττ'> = C_<ττ'> exp((τ - τ') λ_<μ>)"
KEPT = "D_<μττ'> = where(τ >= τ', exp((τ - τ') λ_<μ>), 0)"
POWER = RETENTION.replace(
    "param  λ_<μ> ~ uniform(-0.1, -0.01)   # log of each head's decay γ",
    "param  γ_<μ> ~ uniform(0.9, 0.99)   # each head's decay",
).replace("exp((τ - τ') λ_<μ>)", "γ_<μ>^(τ - τ')")
DECAYS = {  # RetNet's decay times the scores: by chunks, or by rows (skipping the 0 keys)
    "where puts 0 above the diagonal": (RETENTION, "chunks"),
    "a factor of 0s and 1s": (RETENTION.replace(DECAY_LINE, FACTOR), "chunks"),
    "where keeps the decay at and below": (RETENTION.replace(DECAY_LINE, KEPT), "chunks"),
    "a power of a parameter γ": (POWER, "chunks"),
    # the twins: no causal 0-mask times γ^(τ - τ')
    "where puts 1 above the diagonal": (RETENTION.replace("τ, 0, exp", "τ, 1, exp"), "rows"),
    "a factor of halves and 1s": (
        RETENTION.replace(DECAY_LINE, FACTOR.replace("τ, 0, 1", "τ, 1 / 2, 1")),
        "rows",
    ),
    "exp of the distance squared": (
        RETENTION.replace("exp((τ - τ') λ_<μ>)", "exp((τ - τ')^2 λ_<μ>)"),
        "spans",
    ),
    "a power of the distance squared": (POWER.replace("^(τ - τ')", "^((τ - τ')^2)"), "rows"),
    "a power of the distance the other way": (POWER.replace("^(τ - τ')", "^(τ' - τ)"), "rows"),
}


@pytest.mark.parametrize("phrasing", DECAYS)
def test_a_decay_that_multiplies_the_scores_runs_by_chunks_or_skips_the_keys_it_zeroes(phrasing):
    """Retention (no softmax): a causal 0-mask times γ^(τ - τ'), however written, is computed
    by chunks of positions (lower/planner/decay.py); other decays by blocks of queries, which go
    over the keys at or before the block's last query only where the decay is 0 above the
    diagonal. Every stage equals the literal reading in values and gradients, in blocks of one
    row, spans of two queries and chunks of two positions (tests/lower/test_passes.py)."""
    text, path = DECAYS[phrasing]
    spec = ir.check(text, "retention")
    program = pipeline(spec)
    chunked = [s for s in program.steps if isinstance(s, PrefixProduct)]
    assert len(chunked) == (path == "chunks")
    if path != "chunks":
        assert program.rows is not None and (program.spans is not None) == (path == "spans")
    assert first_wrong(spec) is None


def test_the_phrasings_of_retention_plan_the_same_steps():
    """where's 0 above the diagonal, a factor of 0s and 1s, where's decay at and below it:
    one program."""
    for phrasing in ("a factor of 0s and 1s", "where keeps the decay at and below"):
        assert body(DECAYS[phrasing][0]) == body(RETENTION)


def test_twin_a_faster_decay_is_chunked_by_other_steps_and_equals_the_literal_reading():
    faster = RETENTION.replace("exp((τ - τ') λ_<μ>)", "exp(2 (τ - τ') λ_<μ>)")
    assert body(faster) != body(RETENTION)
    spec = indexattn.compile_spec(faster, name="t")
    assert [type(s) for s in spec.program.steps].count(PrefixProduct) == 1
    assert compare(spec, torch.float64, (2,)).ok


def test_a_power_of_a_parameter_is_the_decay_itself_not_its_log():
    """γ^(τ - τ') is chunked with the powers of γ (its log would be NaN for γ ≤ 0, where the
    literal reading is not): a γ of 0 and one below 0 equal the literal reading."""
    spec = indexattn.compile_spec(POWER, name="t")
    (step,) = [s for s in spec.program.steps if isinstance(s, PrefixProduct)]
    assert step.power
    sizes = {"N": 5, "d_m": 4, "h": 3, "d_k": 2}
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64)
    args["gamma"] = torch.tensor([0.0, -0.5, 0.9], dtype=torch.float64)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    torch.testing.assert_close(spec(**args, **given), evaluate(spec.ir, **args, **given)[0])


LLAMA = shipped("specs/layers/llama.attn")
HALVES_LAYER = shipped("benchmarks/specs/llama_halves.attn")
HALVES_TWINS = {
    # the values' halves swapped: read at [1 - c], not the values as stored
    "the values' halves swapped": HALVES_LAYER.replace(
        "O_<grτcj>  = A_<grττ'> V_<gτ'cj>", "O_<grτcj>  = A_<grττ'> V_<gτ'[1 - c]j>"
    ),
    # each half of the values turned by its feature's angle: j read alone there
    "the values turned": HALVES_LAYER.replace(
        "self_attn_v_proj_weight_<(gcj)i> H_<τi>",
        "self_attn_v_proj_weight_<(gcj)i> H_<τi> cos(θ_<τj>)",
    ),
}


def test_a_layer_with_the_head_width_as_two_halves_everywhere_plans_as_with_one_index():
    """Llama's layer with the values and the output written over the rotary halves `(c j)`
    too: every use keeps c and j together, so the canonical form makes them one index, and the
    plan is the layer written with `a : 2 d_r` (the kernel, no N×N softmax)."""
    assert body(HALVES_LAYER) == body(LLAMA)
    spec = indexattn.compile_spec(HALVES_LAYER, name="t")
    assert "scaled_dot_product_attention" in spec.source and "softmax" not in code_lines(
        spec.source
    )
    assert compare(spec, torch.float64, (2,)).ok


@pytest.mark.parametrize("twin", HALVES_TWINS)
def test_halves_read_apart_stay_apart_and_equal_the_literal_reading(twin):
    text = HALVES_TWINS[twin]
    assert text != HALVES_LAYER and body(text) != body(HALVES_LAYER)
    assert compare(indexattn.compile_spec(text, name="t"), torch.float64, (2,)).ok


SUFFIX = shipped("benchmarks/specs/suffix_flip.attn")
FLIPS = {  # a reversed read, and whether the steps from the scores still run by rows
    "the keys read reversed": (SUFFIX, True),
    # the twin: the queries read reversed, so a block of rows would need other rows
    "the queries read reversed": (
        SUFFIX.replace("cumsum_<σ>(E_<μτ[N - 1 - σ]>)", "cumsum_<σ>(E_<μ[N - 1 - τ]σ>)"),
        False,
    ),
}


@pytest.mark.parametrize("phrasing", FLIPS)
def test_a_flip_along_the_keys_keeps_the_blocks_of_rows(phrasing):
    """A suffix sum over the keys by flipping (`E_<μτ[N - 1 - σ]>`): each query's row is
    reversed in place, so the steps from the scores to the output run by blocks of queries
    (peak memory at N = 2048: docs/performance.md); a flip of the queries does not, and both
    equal the literal reading in blocks of one row."""
    text, by_rows = FLIPS[phrasing]
    spec = ir.check(text, "suffix")
    program = pipeline(spec)
    flips = [s for s in program.steps if type(s).__name__ == "Flip"]
    inside = program.rows.steps if program.rows is not None else set()
    assert len(flips) == 2 and all(s.out.var in inside for s in flips) == by_rows
    assert first_wrong(spec) is None
