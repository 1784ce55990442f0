"""The modern variants of tests/reference/modern_b.py: each against its spec, and on its own.

Each module's state_dict is renamed onto the compiled specs/<name>.attn's parameters, and
outputs and the gradients of every input and parameter must agree in float64 to 1e-10, as for
the classic variants (the helpers are test_classic_variants.py's). Each module also has a twin
differing in one weight or one mask bit, which must be told apart, and a check against an
independent formulation of the same attention.
"""

from dataclasses import replace

import pytest
import sympy
import torch
from reference import classic
from reference import modern_b as mb
from reference.cases import BATCH, N
from reference.modern_b import MLA_SIZES, MODERN_B_CASES
from test_classic_variants import (
    SPECS,
    as_tuple,
    assert_all_close,
    assert_same_gradients,
    compiled,
    setup,
)

CASES = {case.spec: case for case in MODERN_B_CASES}
ids = [case.spec for case in MODERN_B_CASES]


def spec_or_skip(case):
    """The compiled specs/<name>.attn; skips while it is not shipped."""
    if not (SPECS / f"{case.spec}.attn").exists():
        pytest.skip(f"specs/{case.spec}.attn is not shipped")
    return compiled(case.spec)


def module(name):
    """The case's module in float64 and eval mode, with fixed weights, and one input."""
    case = CASES[name]
    torch.manual_seed(0)
    built = case.build(case.sizes).double().eval()
    return built, case.inputs(case.sizes)["X"]


def close(got, want):
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("case", MODERN_B_CASES, ids=ids)
def test_spec_matches_module(case):
    spec_or_skip(case)
    ref, spec_module, inputs = setup(case, case.build)
    want = as_tuple(ref(*inputs.values()))
    got = as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)

    assert_same_gradients(case, want, got, inputs, ref, spec_module, same_keys=True)


@pytest.mark.parametrize("case", MODERN_B_CASES, ids=ids)
def test_parameter_count_formula(case):
    """The module's parameters, counted on the meta device, at the test and the real sizes."""
    formula = sympy.sympify(case.count)
    for sizes in [case.sizes, *case.real.values()]:
        with torch.device("meta"):
            built = case.build(sizes)
        assert sum(p.numel() for p in built.parameters()) == formula.subs(sizes), sizes


@pytest.mark.parametrize("case", MODERN_B_CASES, ids=ids)
def test_parameter_count(case):
    count = spec_or_skip(case).param_count()
    formula = sympy.sympify(case.count)
    for sizes in [case.sizes, *case.real.values()]:
        value = count.subs({s: sizes[str(s)] for s in count.free_symbols})
        assert value == formula.subs(sizes), sizes


def reveal(query, key):
    """One mask bit flipped: key `key` becomes visible to query `query`."""

    def change(module):
        hidden = module.hidden

        def flipped(scores):
            mask = hidden(scores).clone()
            assert mask[query, key], "the twin must reveal a hidden key"
            mask[query, key] = False
            return mask

        module.hidden = flipped

    return change


def nudge(parameter, index):
    """One weight changed by 0.1."""

    def change(module):
        with torch.no_grad():
            module.get_parameter(parameter)[index] += 0.1

    return change


# One change per module; mask bits where the module has a mask to flip. At the test sizes
# (N = 5): the sliding window w = 3 hides key 1 from query 4, chunks of C = 2 hide key 1 from
# query 3; the rotary key of MLA starts at row d_c = 4 of kv_a_proj_with_mqa.
TWINS = {
    "linear_attention": nudge("k_proj.bias", 0),
    "linear_attention_causal": nudge("v_proj.weight", (0, 0)),
    "talking_heads": reveal(2, 3),
    "mla": nudge("kv_a_proj_with_mqa.weight", (4, 0)),
    "differential": nudge("lambda_q2", 0),
    "sigmoid_attention": reveal(0, 1),
    "attention_sinks": reveal(4, 1),
    "chunked": reveal(3, 1),
    "gated_output": nudge("q_proj.weight", (3, 0)),  # row 3 of head 0: its gate (d_k = 3)
    "forgetting": nudge("fgate_proj.bias", 0),  # head 0's forget gate
    "yarn_rope": lambda module: setattr(module, "factor", module.factor / 2),
}


def test_every_module_has_a_twin():
    assert TWINS.keys() == CASES.keys()


def twins(case):
    """The module and its twin, with the same weights but for the one change."""
    ref, x = module(case.spec)
    twin, _ = module(case.spec)
    TWINS[case.spec](twin)
    return ref, twin, x


@pytest.mark.parametrize("case", MODERN_B_CASES, ids=ids)
def test_a_twin_with_one_change_differs_from_the_module(case):
    ref, twin, x = twins(case)
    assert (twin(x) - ref(x)).abs().max() > 1e-4


@pytest.mark.parametrize("case", MODERN_B_CASES, ids=ids)
def test_the_spec_tells_the_twin_apart(case):
    """The spec holding the module's weights matches the module and differs from the twin
    far beyond the tolerance: the comparison at 1e-10 would catch that one change."""
    spec = spec_or_skip(case)
    ref, twin, x = twins(case)
    spec_module = spec.module(**case.sizes).double().eval()
    spec_module.load_state_dict(case.mapping(ref.state_dict()))
    close(spec_module(x), ref(x))
    assert (twin(x) - spec_module(x)).abs().max() > 1e-4


# Independent formulations of the same attention, on the modules alone.


def heads_qkv(h=2, n=N, d=3):
    torch.manual_seed(1)
    return [torch.randn(*BATCH, h, n, d, dtype=torch.float64) for _ in range(3)]


def quadratic_linear_attention(q, k, v, eps, causal):
    """φ(Q) φ(K)ᵀ as an n×n weight matrix, normalised per row, then times V."""
    weights = mb.elu_feature_map(q) @ mb.elu_feature_map(k).transpose(-2, -1)
    if causal:
        weights = weights.masked_fill(classic.causal_mask(weights), 0.0)
    return (weights @ v) / (weights.sum(dim=-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_linear_attention_equals_its_quadratic_form(causal):
    layer, _ = module("linear_attention_causal" if causal else "linear_attention")
    q, k, v = heads_qkv()
    close(layer.attend(q, k, v), quadratic_linear_attention(q, k, v, layer.eps, causal))


def test_causal_linear_attention_agrees_with_the_non_causal_at_the_last_query():
    causal, _ = module("linear_attention_causal")
    full, _ = module("linear_attention")
    q, k, v = heads_qkv()
    close(causal.attend(q, k, v)[..., -1, :], full.attend(q, k, v)[..., -1, :])


def gqa_with_the_same_weights(layer, num_kv_heads, **weights):
    """classic.GroupedQueryAttention holding `layer`'s q/k/v/o projections (or `weights`)."""
    d_model = layer.o_proj.out_features
    plain = classic.GroupedQueryAttention(d_model, layer.num_heads, num_kv_heads, layer.head_dim)
    state = {k: v for k, v in layer.state_dict().items() if k in plain.state_dict()}
    plain.load_state_dict({**state, **weights})
    return plain.double().eval()


def test_talking_heads_with_identity_mixing_is_causal_attention():
    layer, x = module("talking_heads")
    with torch.no_grad():
        layer.P_l.copy_(torch.eye(layer.num_heads))
        layer.P_w.copy_(torch.eye(layer.num_heads))
    close(layer(x), gqa_with_the_same_weights(layer, layer.num_heads)(x))


def rotate_pairs(x):
    """Rotary as complex numbers: feature r and r + d/2 form x_r + i x_(r+d/2), turned by
    τ·base^(-2r/d) at position τ (transformers' rotate-half convention)."""
    half = x.shape[-1] // 2
    inv_freq = 10000.0 ** (-2 * torch.arange(half, dtype=x.dtype) / x.shape[-1])
    angle = torch.arange(x.shape[-2], dtype=x.dtype)[:, None] * inv_freq
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


def absorbed_mla(layer, x):
    """DeepSeek-V2's inference form: the key part of kv_b_proj absorbed into the queries and
    its value part applied after the weights, so attention runs on the shared latent."""
    h, d_n, d_c = layer.num_heads, layer.qk_nope_head_dim, layer.kv_lora_rank
    q = layer.q_b_proj(layer.q_a_layernorm(layer.q_a_proj(x)))
    q = q.unflatten(-1, (h, -1)).transpose(-3, -2)  # (..., h, n, d_n + d_r)
    latent = layer.kv_a_proj_with_mqa(x)
    c = layer.kv_a_layernorm(latent[..., :d_c])  # (..., n, d_c)
    k_rope = rotate_pairs(latent[..., d_c:])  # (..., n, d_r), one for all heads
    w_uk, w_uv = layer.kv_b_proj.weight.unflatten(0, (h, -1)).split([d_n, layer.v_head_dim], 1)
    q_latent = torch.einsum("...htn,hnc->...htc", q[..., :d_n], w_uk)
    scores = torch.einsum("...htc,...sc->...hts", q_latent, c)
    scores = scores + torch.einsum("...htr,...sr->...hts", rotate_pairs(q[..., d_n:]), k_rope)
    scores = scores.masked_fill(classic.causal_mask(scores), -torch.inf)
    weights = torch.softmax(scores * layer.scaling, dim=-1)
    out = torch.einsum("...hts,...sc,hec->...the", weights, c, w_uv)
    return layer.o_proj(out.flatten(-2))


def test_mla_equals_its_absorbed_latent_form():
    layer, x = module("mla")
    close(layer(x), absorbed_mla(layer, x))


# mla's kernel gets V zero-padded to the query/key width d_n + d_r = 7 where V is narrower, and
# its result cut back to d_v: the spec must equal the module below, at and above that width.
VALUE_WIDTHS = {"narrower": 2, "equal": 7, "wider": 9}


def mla_at(d_v):
    """The mla module and the spec's, same weights, at value width d_v, and their inputs."""
    case = replace(CASES["mla"], sizes={**MLA_SIZES, "d_v": d_v})
    return case, *setup(case, case.build)


@pytest.mark.parametrize("d_v", VALUE_WIDTHS.values(), ids=VALUE_WIDTHS)
def test_mla_equals_its_module_at_any_value_width(d_v):
    case, ref, spec_module, inputs = mla_at(d_v)
    want, got = as_tuple(ref(*inputs.values())), as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)
    assert_same_gradients(case, want, got, inputs, ref, spec_module, same_keys=True)


@pytest.mark.parametrize("d_v", VALUE_WIDTHS.values(), ids=VALUE_WIDTHS)
def test_mla_with_its_last_value_feature_changed_differs_from_its_module(d_v):
    """The twin: one weight of head 0's last value feature (the column next to the zeros)
    changed in the spec's module only; values and the gradient of X both see it."""
    _, ref, spec_module, inputs = mla_at(d_v)
    with torch.no_grad():
        spec_module.kv_b_proj_weight[MLA_SIZES["d_n"] + d_v - 1, 0] += 0.1
    x = inputs["X"]
    got, want = spec_module(x), ref(x)
    assert (got - want).abs().max() > 1e-4
    cotangent = torch.randn_like(want)
    (mine,) = torch.autograd.grad(got, x, cotangent)
    (theirs,) = torch.autograd.grad(want, x, cotangent)
    assert (mine - theirs).abs().max() > 1e-4


def rms_norm(x, eps):
    return x / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps)


def test_differential_attention_equals_a_loop_over_heads():
    layer, x = module("differential")
    h, d = layer.num_heads, layer.head_dim
    w_q = layer.q_proj.weight.view(h, 2, d, -1)
    w_k = layer.k_proj.weight.view(h, 2, d, -1)
    w_v = layer.v_proj.weight.view(h, 2 * d, -1)
    lam = (
        torch.exp(layer.lambda_q1 @ layer.lambda_k1)
        - torch.exp(layer.lambda_q2 @ layer.lambda_k2)
        + layer.lambda_init
    )
    future = torch.ones(N, N, dtype=torch.bool).triu(1)
    heads = []
    for mu in range(h):
        maps = []
        for b in range(2):
            scores = (x @ w_q[mu, b].T) @ (x @ w_k[mu, b].T).transpose(-2, -1) / d**0.5
            maps.append(torch.softmax(scores.masked_fill(future, -torch.inf), dim=-1))
        out = (maps[0] - lam * maps[1]) @ (x @ w_v[mu].T)
        heads.append(rms_norm(out, 1e-5) * layer.subln.weight * (1 - layer.lambda_init))
    close(layer(x), layer.out_proj(torch.cat(heads, dim=-1)))


def test_sigmoid_weights_are_one_over_one_plus_n_exp_minus_score():
    layer, _ = module("sigmoid_attention")
    scores = torch.randn(*BATCH, 2, N, N, dtype=torch.float64)
    want = torch.tril(1 / (1 + N * torch.exp(-scores)))
    close(layer.weights(scores), want)


def test_sink_weights_are_exp_over_the_sum_plus_the_sinks_exp():
    layer, _ = module("attention_sinks")
    scores = torch.randn(*BATCH, layer.num_heads, N, N, dtype=torch.float64)
    seen = torch.exp(scores).masked_fill(layer.hidden(scores), 0.0)
    sink = torch.exp(layer.sinks)[:, None, None]
    close(layer.weights(scores), seen / (seen.sum(dim=-1, keepdim=True) + sink))


def test_a_sink_at_minus_infinity_leaves_sliding_window_softmax():
    layer, _ = module("attention_sinks")
    scores = torch.randn(*BATCH, layer.num_heads, N, N, dtype=torch.float64)
    want = torch.softmax(scores.masked_fill(layer.hidden(scores), -torch.inf), dim=-1)
    with torch.no_grad():
        layer.sinks.fill_(-torch.inf)
    close(layer.weights(scores), want)


def test_chunked_attention_equals_causal_attention_chunk_by_chunk():
    layer, x = module("chunked")
    plain = gqa_with_the_same_weights(layer, layer.num_kv_heads)
    chunks = x.split(layer.chunk_size, dim=-2)
    close(layer(x), torch.cat([plain(chunk) for chunk in chunks], dim=-2))


def test_a_zero_gate_halves_causal_attention():
    layer, x = module("gated_output")
    h, d_k = layer.num_heads, layer.head_dim
    query_rows = layer.q_proj.weight.view(h, 2, d_k, -1)[:, 0].reshape(h * d_k, -1)
    plain = gqa_with_the_same_weights(layer, h, **{"q_proj.weight": query_rows})
    with torch.no_grad():
        layer.q_proj.weight.view(h, 2, d_k, -1)[:, 1] = 0.0  # sigmoid(0) = 1/2
    close(layer(x), plain(x) / 2)


def test_forgetting_weights_are_exp_scores_times_the_product_of_the_gates():
    """The paper's form: softmax weight of key j for query i ∝ exp(q·k/√d) ∏_{j<l<=i} f_l."""
    layer, x = module("forgetting")
    f = torch.sigmoid(layer.fgate_proj(x)).transpose(-2, -1)  # (..., h, n)
    q, k, v = (split(x) for split in (layer.q_proj, layer.k_proj, layer.v_proj))
    q, k, v = (t.unflatten(-1, (layer.num_heads, -1)).transpose(-3, -2) for t in (q, k, v))
    weights = torch.zeros(*BATCH, layer.num_heads, N, N, dtype=torch.float64)
    for i in range(N):
        for j in range(i + 1):
            gates = f[..., j + 1 : i + 1].prod(dim=-1)  # the empty product is 1
            score = (q[..., i, :] * k[..., j, :]).sum(dim=-1) / layer.head_dim**0.5
            weights[..., i, j] = torch.exp(score) * gates
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = (weights @ v).transpose(-3, -2).flatten(-2)
    close(layer(x), layer.o_proj(out))
    with torch.no_grad():
        layer.fgate_proj.bias.fill_(40.0)  # gates of 1: nothing forgotten, plain causal attention
    plain = gqa_with_the_same_weights(layer, layer.num_heads)
    close(layer(x), plain(x))


@pytest.mark.parametrize(
    "config",
    [
        {"head_dim": 128, "factor": 32.0, "original": 4096, "base": 10000.0},  # YaRN Llama 2
        {"head_dim": 128, "factor": 4.0, "original": 32768, "base": 1000000.0},  # Qwen2.5's
        {"head_dim": 8, "factor": 4.0, "original": 4096, "base": 10000.0},  # the test's
    ],
)
def test_yarn_frequencies_are_transformers_own(config):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    rope = {"rope_type": "yarn", "factor": config["factor"], "rope_theta": config["base"]}
    hf = LlamaConfig(
        hidden_size=2 * config["head_dim"],
        num_attention_heads=2,
        head_dim=config["head_dim"],
        max_position_embeddings=int(config["factor"] * config["original"]),
        rope_parameters={**rope, "original_max_position_embeddings": config["original"]},
    )
    want, want_scale = _compute_yarn_parameters(hf)
    dim, base, factor, original = (config[k] for k in ("head_dim", "base", "factor", "original"))
    got, scale = mb.yarn_frequencies(dim, base, factor, original)
    torch.testing.assert_close(got.float(), want, rtol=1e-6, atol=0)
    assert scale == pytest.approx(want_scale, rel=1e-12)
    other, _ = mb.yarn_frequencies(dim, base, 2 * factor, original)  # the twin
    assert not torch.allclose(other.float(), want, rtol=1e-3, atol=0)
