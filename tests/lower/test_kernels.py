"""Kernel selection: where the equations mean exactly softmax(Q·Kᵀ·s + M)·V the plan calls
F.scaled_dot_product_attention (and nowhere else), projections become F.linear, and the
result still equals the literal interpreter, in values and gradients."""

from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.lower.program.steps import Attention, Linear, Pad, Split
from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parents[2]

# shipped spec -> how the kernel is called (None: no fused kernel, the weights are returned)
SHIPPED = {
    "mha": "is_causal",
    "mha_math": "is_causal",
    "mha_separate": "is_causal",
    "causal_head": "is_causal",
    "gqa": "is_causal",
    "mqa": "is_causal",
    "rope": "is_causal",
    "rope_interleaved": "is_causal",
    "rope_partial": "is_causal",
    "qk_norm": "is_causal",
    "sliding_window": "attn_mask",
    "alibi": "attn_mask",
    "dk_dv_mask": "attn_mask",
    "single_head": "plain",
    "dk_dv": "plain",
    "concat_heads": "plain",
    "concat_heads_proj": "plain",
    "cross": "plain",
    "gpt2": None,
    "torch_mha": None,
    "sdpa": None,
    "simple": None,
}


def steps(spec, kind):
    return [s for b in spec.plan.blocks for s in b.steps if isinstance(s, kind)]


def code(spec):
    """The generated source without its comments (which quote the equations)."""
    return "\n".join(line.split("#")[0] for line in spec.source.splitlines())


def compile_text(text, name="t"):
    return indexattn.compile_spec(text, name=name)


def assert_equals_literal(spec, batch=(2,)):
    """Values (float64, 1e-12) and the gradients of every argument, against the oracle."""
    assert compare(spec, torch.float64, batch).ok
    sizes = sample_sizes(spec.ir, seed=1)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    args = sample_arguments(spec.ir, sizes, batch, torch.float64, seed=2)
    mine = {k: v.clone().requires_grad_() for k, v in args.items()}
    theirs = {k: v.clone().requires_grad_() for k, v in args.items()}
    got = spec(**mine, **given)
    want = reference.evaluate(spec.ir, **theirs, **given)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
        weights = torch.randn_like(w)
        (g * weights).sum().backward(retain_graph=True)
        (w * weights).sum().backward(retain_graph=True)
    for name in args:
        torch.testing.assert_close(mine[name].grad, theirs[name].grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_specs_call_the_kernel_exactly_where_it_computes_them(name):
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    fused = steps(spec, Attention)
    if SHIPPED[name] is None:
        assert not fused and "scaled_dot_product_attention" not in spec.source
        return
    (core,) = fused
    assert core.causal == (SHIPPED[name] == "is_causal")
    assert (core.mask is not None) == (SHIPPED[name] == "attn_mask")
    assert core.grouped == (name in ("gqa", "mqa", "qk_norm"))
    assert "einsum(" not in code(spec) and "softmax" not in code(spec)


def test_no_materialised_scores_when_the_kernel_runs():
    """The causal specs build no N x N tensor at all: no mask, no scores."""
    for name, how in SHIPPED.items():
        if how == "is_causal":
            spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
            (core,) = steps(spec, Attention)
            square = {core.q_dims[-1], core.k_dims[-1]}
            assert not any(square <= set(s.out.dims) for s in spec.plan.steps), name
            assert "torch.where" not in code(spec), name


def test_a_scaled_output_is_the_kernel_then_the_scale():
    """`O = A V / 2`: the scale carries no key, so the kernel computes A V and the scale
    follows (the twin above weighs each key: no kernel)."""
    spec = compile_text(core(O="O_<μτa> = A_<μττ'> V_<μτ'a> / 2"))
    assert len(steps(spec, Attention)) == 1 and "softmax" not in code(spec)
    assert_equals_literal(spec)


def test_fused_projections_are_one_matrix_product_and_a_split():
    for name in ("mha", "mha_math", "gpt2"):
        spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
        qkv, _ = steps(spec, Linear)
        assert steps(spec, Split) and spec.source.count("F.linear(") == 2
        assert qkv.bias == (spec.ir.tensors[3] if name == "gpt2" else None)
        assert "rearrange" not in spec.source and ".contiguous()" not in spec.source


# Near misses: each is one change away from the kernel's mathematics.
HEAD = """index τ, τ' : N
index μ : h
index a : d_k
input Q_<μτa>
input K_<μτ'a>
input V_<μτ'a>
"""
CORE = {
    "S": "S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k)",
    "A": "A_<μττ'> = softmax_<τ'>(S_<μττ'>)",
    "O": "O_<μτa> = A_<μττ'> V_<μτ'a>",
}


def core(output="O", **changes):
    lines = [changes.pop(k, v) for k, v in CORE.items()] + list(changes.values())
    return HEAD + "\n".join(lines) + f"\noutput {output}\n"


NEAR_MISSES = {
    "softmax over the query": core(A="A_<μττ'> = softmax_<τ>(S_<μττ'>)"),
    "softmax over two indices": core(A="A_<μττ'> = softmax_<μτ'>(S_<μττ'>)"),
    "exp instead of softmax": core(A="A_<μττ'> = exp(S_<μττ'>)"),
    "scores used twice": core(R="R_<μτ> = sum_<τ'>(S_<μττ'>)", output="O, R"),
    "weights returned": core(output="O, A"),
    "scores an output": core(output="O, S"),
    "dropout on the scores": core(
        A="D_<μττ'> = dropout(S_<μττ'>, 0.1)\nA_<μττ'> = softmax_<τ'>(D_<μττ'>)"
    ),
    "dropped weights returned": core(
        O="D_<μττ'> = dropout(A_<μττ'>, 0.1)\nO_<μτa> = D_<μττ'> V_<μτ'a>", output="O, D"
    ),
    "mask multiplied, not added": core(
        S="M_<ττ'> = where(τ' > τ, 0, 1)\nS_<μττ'> = Q_<μτa> K_<μτ'a> M_<ττ'>"
    ),
    "mask inside the scale": core(
        S="M_<ττ'> = where(τ' > τ, -inf, 0)\nS_<μττ'> = (Q_<μτa> K_<μτ'a> + M_<ττ'>) / 2"
    ),
    "a constant added": core(S="S_<μττ'> = Q_<μτa> K_<μτ'a> + 1"),
    "the output weighted per key": core(O="O_<μτa> = A_<μττ'> V_<μτ'a> exp(-τ')"),
    "values summed over the query": HEAD.replace("input V_<μτ'a>", "input V_<μτa>")
    + "\n".join([CORE["S"], CORE["A"], "O_<μτ'a> = A_<μττ'> V_<μτa>"]),
    "values carry the query": HEAD.replace("input V_<μτ'a>", "input V_<μττ'a>")
    + "\n".join([CORE["S"], CORE["A"], "O_<μτa> = A_<μττ'> V_<μττ'a>"]),
}


@pytest.mark.parametrize("text", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_do_not_use_the_kernel(text):
    spec = compile_text(text)
    assert not steps(spec, Attention)
    assert "scaled_dot_product_attention" not in spec.source
    assert_equals_literal(spec)


GROUPED = """index τ, τ' : N
index g : h_kv
index r : n_rep
index a : d_k
input Q_<grτa>
input K_<gτ'a>
input V_<gτ'a>
input P_<rτ'>
S_<grττ'> = Q_<grτa> K_<gτ'a> + P_<rτ'>
A_<grττ'> = softmax_<τ'>(S_<grττ'>)
O_<grτa> = A_<grττ'> V_<gτ'a>
"""


def test_no_kernel_for_a_mask_per_query_head_of_grouped_heads():
    """Merged into one head axis (g r), the heads cannot keep a mask that varies along r."""
    spec = compile_text(GROUPED)
    assert not steps(spec, Attention)
    assert_equals_literal(spec)


CAUSAL_LOOKALIKES = {
    "not strict": "where(τ' >= τ, -inf, 0)",
    "shifted": "where(τ' > τ + 1, -inf, 0)",
    "mirrored": "where(τ > τ', -inf, 0)",
    "as a keep mask": "where(τ' <= τ, 0, -inf)",
    "with a padding mask": "where(τ' > τ, -inf, 0) + P_<τ'>",
}


@pytest.mark.parametrize("mask", CAUSAL_LOOKALIKES.values(), ids=CAUSAL_LOOKALIKES.keys())
def test_is_causal_only_for_exactly_key_after_query(mask):
    text = core(S=f"S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + {mask}")
    spec = compile_text(text.replace("input V", "input P_<τ'>\ninput V"))
    (step,) = steps(spec, Attention)
    assert step.causal == (mask == CAUSAL_LOOKALIKES["as a keep mask"])
    assert ("attn_mask=" in spec.source) != step.causal
    assert_equals_literal(spec)


def test_is_causal_needs_one_range_for_queries_and_keys():
    """With N queries and L keys, τ' > τ is a boolean mask, not the kernel's is_causal."""
    text = core(S="S_<μττ'> = Q_<μτa> K_<μτ'a> + where(τ' > τ, -inf, 0)")
    text = text.replace("index τ, τ' : N", "index τ : N\nindex τ' : L")
    spec = compile_text(text)
    (step,) = steps(spec, Attention)
    assert not step.causal and "attn_mask=" in spec.source
    assert_equals_literal(spec)


RENAMED = """index s, t : n
index c : w
index H : heads
input Q_<sHc>
input K_<cHt>
input V_<tcH>
S_<Hts> = Q_<sHc> K_<cHt> * 0.3 + where(t > s, -inf, 0)
A_<sHt> = softmax_<t>(S_<Hts>)
O_<cHs> = A_<sHt> V_<tcH>
"""

SELF = """index τ, σ : N
index i : d
input X_<τi>
S_<τσ> = X_<τi> X_<σi>
A_<τσ> = softmax_<σ>(S_<τσ>)
Z_<τi> = A_<τσ> X_<σi>
"""

GROUPED_RG = """index τ, τ' : N
index g : h_kv
index r : n_rep
index a : d_k
input Q_<rτga>
input K_<τ'ga>
input V_<gτ'a>
S_<grττ'> = Q_<rτga> K_<τ'ga> / sqrt(d_k) + where(τ' > τ, -inf, 0)
A_<grττ'> = softmax_<τ'>(S_<grττ'>)
O_<τrga> = A_<grττ'> V_<gτ'a>
"""

FIRES = {"renamed and reordered": RENAMED, "queries are keys": SELF, "grouped (r g)": GROUPED_RG}


@pytest.mark.parametrize("text", FIRES.values(), ids=FIRES.keys())
def test_the_match_reads_structure_not_names_or_axis_orders(text):
    spec = compile_text(text)
    assert len(steps(spec, Attention)) == 1
    for batch in ((), (2,), (2, 3)):
        assert compare(spec, torch.float64, batch).ok, batch
    assert_equals_literal(spec)


def test_rows_masked_everywhere_give_zeros_with_the_kernel():
    """A predicate that hides all of row 1, and an additive mask of -inf on row 2."""
    text = core(S="S_<μττ'> = Q_<μτa> K_<μτ'a> + where(τ' > τ or τ == 1, -inf, 0) + M_<ττ'>")
    spec = compile_text(text.replace("input V", "input M_<ττ'>\ninput V"))
    assert steps(spec, Attention)
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes)
    args["M"] = torch.zeros_like(args["M"])
    args["M"][..., 2, :] = -torch.inf
    leaves = {k: v.requires_grad_() for k, v in args.items() if k != "M"}
    out = spec(**args)
    assert torch.all(out[..., 1:3, :] == 0) and not out.isnan().any()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves.values())
    assert compare(spec, torch.float64).ok


def test_dropout_on_the_weights_is_the_kernels_dropout_p():
    spec = indexattn.compile_spec(ROOT / "specs" / "mha_separate.attn")
    assert "dropout_p=p if training else 0.0" in spec.source and "F.dropout" not in spec.source


def test_weights_stored_in_out_use_matmul_without_copies():
    text = """index τ : N
index i : d
index j : e
input X_<τi>
param W_<ij>
param U_<ij>
param b_<j>
Y_<τj> = W_<ij> X_<τi>
Z_<τj> = U_<ij> X_<τi> + b_<j>
output Y, Z
"""
    spec = compile_text(text)
    assert "Y = X @ W" in spec.source and "Z = F.linear(X, U.mT, b)" in spec.source
    assert_equals_literal(spec)


def test_slices_that_do_not_cover_the_weight_are_not_fused():
    """Two of three slices: one product over the whole weight would waste a third."""
    text = """index τ : N
index i : d
index a : k
index B : 3
input X_<τi>
param W_<(Ba)i>
Q_<τa> = W_<(0a)i> X_<τi>
K_<τa> = W_<(1a)i> X_<τi>
Y_<τa> = Q_<τa> K_<τa>
"""
    spec = compile_text(text)
    assert not steps(spec, Split)
    assert_equals_literal(spec)


SLICED = """index τ : N
index i : d
index μ : h
index a : k
index B : 3
input X_<τi>
input Y_<τi>
param W_<{w}i>
param b_<{w}>
Q_<μτa> = W_<{q}i> X_<τi> + b_<{q}>
K_<μτa> = W_<{k}i> Y_<τi> + b_<{k}>
Z_<μτa> = Q_<μτa> K_<μτa>
output Z
"""


def test_a_slice_leading_a_weights_rows_is_f_linear_on_a_view():
    """nn.MultiheadAttention's packed weight against distinct inputs: each slice is the
    block of rows its literal selects, one F.linear with its bias, no copy; a literal that
    does not lead the rows (the twin) is an einsum over the split weight. Both equal the
    literal reading."""
    spec = compile_text(SLICED.format(w="(Bμa)", q="(0μa)", k="(1μa)"))
    assert len(steps(spec, Linear)) == 2 and not steps(spec, Split)
    assert "F.linear(X, W.unflatten(0, (3, -1))[0], b.unflatten(0, (3, -1))[0])" in spec.source
    assert_equals_literal(spec)
    twin = compile_text(SLICED.format(w="(μBa)", q="(μ0a)", k="(μ1a)"))
    assert not steps(twin, Linear) and "einsum(" in twin.source
    assert_equals_literal(twin)


PARTS = """index τ : N
index i : d
index μ : h
index n : d_n
index r : d_r
index j : {j}
input X_<τi>
input Y_<τi>
param W_<(μj)i>
param b_<(μj)>
Qn_<μτn> = W_<(μ[n])i> X_<τi> + b_<(μ[n])>
Qr_<μτr> = W_<(μ[{start} + r])i> {x}_<τi> + b_<(μ[{start} + r])>
Z_<μτ> = sum_<n>(Qn_<μτn>) sum_<r>(Qr_<μτr>)
output Z
"""


def test_runs_of_a_weight_end_to_end_are_one_matrix_product_and_a_split():
    """MLA's q_b_proj: `[n]` and `[d_n + r]` of one head's block cover it, so one F.linear
    over the whole weight (and bias), and `split([d_n, d_r])`, compute both. Twins: a gap
    between the runs, or another operand, leave two products; all equal the oracle."""
    spec = compile_text(PARTS.format(j="d_n + d_r", start="d_n", x="X"))
    (split,) = steps(spec, Split)
    assert [i.glyph for i in split.parts] == ["n", "r"] and len(steps(spec, Linear)) == 1
    assert "F.linear(X, W, b).unflatten(-1, (h, d_n + d_r))" in spec.source
    assert ".split([d_n, d_r], dim=-1)" in spec.source and "einsum(" not in spec.source
    assert_equals_literal(spec)
    for twin in (
        compile_text(PARTS.format(j="d_n + d_r + 1", start="d_n + 1", x="X")),
        compile_text(PARTS.format(j="d_n + d_r", start="d_n", x="Y")),
    ):
        assert not steps(twin, Split) and "einsum(" in twin.source
        assert_equals_literal(twin)


def test_runs_written_in_any_order_split_in_the_weights_order():
    """Three runs, the last written first, the declared index a sum of sizes."""
    text = """index τ : N
index i : d
index c : d_c
index r : d_r
index e : d_e
index k : d_c + d_r + d_e
input X_<τi>
param W_<ki>
E_<τe> = W_<[d_c + d_r + e]i> X_<τi>
C_<τc> = W_<[c]i> X_<τi>
R_<τr> = W_<[d_c + r]i> X_<τi>
output C, R, E
"""
    spec = compile_text(text)
    (split,) = steps(spec, Split)
    assert [i.glyph for i in split.parts] == ["c", "r", "e"]
    assert [o.var.hint for o in split.outs] == ["C", "R", "E"]  # the equations' own values
    assert_equals_literal(spec)
    twin = compile_text(text.replace("[d_c + d_r + e]", "[d_c + e]"))  # overlaps R's run
    assert not steps(twin, Split)
    assert_equals_literal(twin)


def test_masks_from_positions_are_built_once_per_shape():
    spec = indexattn.compile_spec(ROOT / "specs" / "sliding_window.attn")
    cache = spec._constants
    cache.clear()
    for n in (5, 5, 6):
        sizes = {**sample_sizes(spec.ir), "N": n}
        args = sample_arguments(spec.ir, sizes)
        spec(**args, h=sizes["h"], w=3)
        key = list(cache)[-1]
        assert key[0] == (n, 3)
    assert len(cache) == 2  # one entry per shape, kept
    first = cache[key]
    spec(**args, h=sizes["h"], w=3)
    assert cache[key] is first


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_torch_compile_fullgraph_on_every_generated_module(name):
    """Dynamo traces the module whole (no graph break), twice: the mask caches too."""
    torch._dynamo.reset()
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (2,), torch.float32)
    module = spec.module(**sizes).eval()
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    inputs = [args[t.ascii] for t in spec.ir.tensors_of("input")]
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    for _ in range(2):
        got, want = compiled(*inputs), module(*inputs)
        got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


MLA = (ROOT / "specs" / "mla.attn").read_text(encoding="utf-8")


def mla_key_with_query() -> str:
    """mla with the shared key part multiplied by a table of the query position τ."""
    text = MLA.replace("Qθ_<μτr> Kθ_<τ'r>)", "Qθ_<μτr> Kq_<ττ'r>)").replace(
        "M_<ττ'>   = where", "Kq_<ττ'r> = Rc_<τr> Kθ_<τ'r>\nM_<ττ'>   = where"
    )
    assert text.count("Kq_<ττ'r>") == 2
    return text


def test_a_key_part_without_heads_is_viewed_over_them():
    """mla: the rotary key Kθ_<τ'r> is one for all heads; it joins the kernel expanded over
    them (a view), and no N x N tensor is built. Values and gradients equal the oracle."""
    spec = indexattn.compile_spec(MLA, name="mla")
    (core,) = steps(spec, Attention)
    assert "is_causal=True" in spec.source and ".unsqueeze(-3).expand(" in spec.source
    square = {core.q_dims[-1], core.k_dims[-1]}
    assert not any(square <= set(s.out.dims) for s in spec.plan.steps)
    assert_equals_literal(spec)


def test_a_key_part_that_reads_the_query_is_not_viewed_over_heads():
    """The twin: the shared key part also carries the query position τ, so it is no key of
    the kernel's; the scores are built and softmaxed, and still equal the oracle."""
    spec = indexattn.compile_spec(mla_key_with_query(), name="mla_query_key")
    assert not steps(spec, Attention) and "scaled_dot_product_attention" not in spec.source
    assert_equals_literal(spec)


def test_a_query_part_without_heads_is_viewed_over_them():
    """A query part every head shares (P_<τa>) joins the kernel as the shared key part does;
    its twin that also carries the key position is no query of the kernel's. Both equal the
    oracle."""
    shared = HEAD + "input P_<τa>\ninput R_<μτ'a>\n"
    scores = "S_<μττ'> = (Q_<μτa> K_<μτ'a> + P_<τa> R_<μτ'a>) / sqrt(d_k)"
    spec = compile_text(core(S=scores).replace(HEAD, shared))
    assert len(steps(spec, Attention)) == 1 and "softmax" not in code(spec)
    assert ".unsqueeze(-3).expand(" in spec.source
    assert_equals_literal(spec)
    keyed = shared.replace("P_<τa>", "P_<ττ'a>")
    twin = compile_text(core(S=scores.replace("P_<τa>", "P_<ττ'a>")).replace(HEAD, keyed))
    assert not steps(twin, Attention) and "softmax" in code(twin)
    assert_equals_literal(twin)


def test_values_narrower_than_the_keys_are_padded_for_the_kernel():
    """mla: V (d_v) may be narrower than the queries and keys (d_n + d_r), and on CPU the
    causal kernel takes its fused path only at equal widths: V gains zero features up to
    theirs where narrower, and the result is cut back to d_v. No spec of equal widths pads."""
    spec = indexattn.compile_spec(MLA, name="mla")
    (pad,) = steps(spec, Pad)
    (core,) = steps(spec, Attention)
    assert core.v == pad.out and core.cut
    assert (str(pad.over.size), str(pad.width)) == ("d_v", "d_n + d_r")
    assert_equals_literal(spec)  # padded and cut back: the values' own width
    for name in SHIPPED:
        assert not steps(indexattn.compile_spec(ROOT / "specs" / f"{name}.attn"), Pad), name


def test_values_are_not_padded_for_a_kernel_with_a_mask():
    """The twin: mla with a mask that also hides the next key, so the kernel gets attn_mask
    (where padding was measured not to pay, docs/decisions.md): V goes in as it is."""
    text = MLA.replace("where(τ' > τ, -inf, 0)", "where(τ' > τ + 1, -inf, 0)")
    spec = indexattn.compile_spec(text, name="mla_masked")
    (core,) = steps(spec, Attention)
    assert core.mask is not None and not core.cut and not steps(spec, Pad)
    assert "F.pad(" not in spec.source
    assert_equals_literal(spec)


@pytest.mark.parametrize("d_v", [2, 9])
def test_padded_values_trace_whole_with_dynamic_sizes(d_v):
    """mla at a value width below (padded) and above (as it is) d_n + d_r = 7: one graph
    under torch.compile(dynamic=True, fullgraph=True), and torch.export with a dynamic N."""
    torch._dynamo.reset()
    spec = indexattn.compile_spec(MLA, name="mla")
    sizes = {**sample_sizes(spec.ir), "d_n": 3, "d_r": 4, "d_v": d_v}
    module = spec.module(**{k: v for k, v in sizes.items() if k != "N"}).eval()
    inputs = {}
    for n in (5, 8):
        args = sample_arguments(spec.ir, {**sizes, "N": n}, (2,), torch.float32)
        module.load_state_dict({k: args[k] for k in module.state_dict()})
        inputs[n] = args["X"]
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend="eager")
    dims = {"X": {1: torch.export.Dim("N", min=2, max=64)}}  # forward(X), by name
    exported = torch.export.export(module, (inputs[5],), dynamic_shapes=dims).module()
    for x in inputs.values():
        torch.testing.assert_close(compiled(x), module(x))
        torch.testing.assert_close(exported(x), module(x))


NARROW = """index τ, τ' : N
index μ : h
index a : 4
index e : 2
input Q_<μτa>
input K_<μτ'a>
input V_<μeτ'>
M_<ττ'> = where(τ' > τ, -inf, 0)
S_<μττ'> = Q_<μτa> K_<μτ'a> / 2 + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτe> = A_<μττ'> V_<μeτ'>
output O
"""


def test_values_known_to_be_narrower_are_padded_along_their_own_axis():
    """Widths 4 and 2, the value width not V's last axis: the pad needs no condition and
    pads that axis. The twin with values as wide as the keys is not padded. Both equal the
    oracle."""
    spec = compile_text(NARROW)
    lines = [line.strip() for line in code(spec).splitlines()]
    assert "V_pad = F.pad(V, (0, 0, 0, 2))" in lines and "O = O[..., :2]" in lines
    assert_equals_literal(spec)
    twin = compile_text(NARROW.replace("index e : 2", "index e : 4"))
    assert not steps(twin, Pad) and "[..., :4]" not in code(twin)
    assert_equals_literal(twin)
