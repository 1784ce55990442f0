"""Modern attention variants (set A): each spec against its hand-written module, and each module
against an independent formulation of its paper.

The spec comparisons (float64, outputs and the gradients of every float input and parameter
to 1e-10, as in test_classic_variants.py) run on specs/<name>.attn. The self-checks: rotary
as complex multiplication, GPT-J's interleaving as a permutation of Llama's features, T5's
buckets in integer arithmetic, masks and caps one query row at a time in Python, the KV-cache
step as the tail of a full forward.
"""

import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from reference import classic
from reference.classic import merge_heads, split_heads
from reference.modern_a import (
    MODERN_A_CASES,
    TWINS,
    DocumentMaskedAttention,
    Gemma2Attention,
    GPTJAttention,
    GPTNeoXAttention,
    KVCacheAttention,
    PrefixLMAttention,
    Qwen3Attention,
    RoPEAttention,
    T5Attention,
    t5_relative_position_bucket,
)
from test_classic_variants import as_tuple, assert_all_close, assert_same_gradients, compiled

CASES = {case.spec: case for case in MODERN_A_CASES}
ids = pytest.mark.parametrize("case", MODERN_A_CASES, ids=lambda c: c.spec)


def floats(inputs):
    """The inputs that carry gradients: all but integer ones (document ids)."""
    return {name: t for name, t in inputs.items() if t.is_floating_point()}


def setup(case, sizes=None, perturb=None):
    """The reference module, the spec module holding its weights, and fresh inputs; with
    `perturb`, the twin: module, inputs and sizes changed in one place before the spec loads."""
    spec = compiled(case.spec)  # skips while the spec is missing
    torch.manual_seed(0)
    sizes = sizes or case.sizes
    ref = case.build(sizes).double().eval()
    inputs = case.inputs(sizes)
    if perturb is not None:
        inputs, sizes = perturb(ref, inputs, sizes)
    spec_module = spec.module(**sizes).double().eval()
    spec_module.load_state_dict(case.mapping(ref.state_dict()))
    for t in floats(inputs).values():
        t.requires_grad_()
    return ref, spec_module, inputs


# ------------------------------------------------------------------------- spec vs module


@ids
def test_spec_matches_module(case):
    ref, spec_module, inputs = setup(case)
    want = as_tuple(case.call(ref, inputs))
    got = as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)

    assert_same_gradients(case, want, got, floats(inputs), ref, spec_module, same_keys=True)


@ids
def test_spec_follows_the_twin(case):
    """The one-place change of TWINS (a weight, a mask bit) reaches the spec as the module."""
    ref, spec_module, inputs = setup(case, perturb=TWINS[case.spec])
    assert_all_close(as_tuple(spec_module(*inputs.values())), as_tuple(case.call(ref, inputs)))


@ids
def test_spec_parameter_count(case):
    count = compiled(case.spec).param_count()
    for sizes in [case.sizes, *case.real.values()]:
        value = count.subs({s: sizes[str(s)] for s in count.free_symbols})
        assert value == sympy.sympify(case.count).subs(sizes), sizes


# ------------------------------------------------------------------------ modules alone


@ids
def test_twin_changes_the_output(case):
    torch.manual_seed(0)
    ref = case.build(case.sizes).double().eval()
    inputs = case.inputs(case.sizes)
    before = as_tuple(case.call(ref, inputs))[0]
    inputs, _ = TWINS[case.spec](ref, inputs, case.sizes)
    after = as_tuple(case.call(ref, inputs))[0]
    assert (after - before).abs().max() > 1e-3


@ids
def test_parameter_count_formula(case):
    formula = sympy.sympify(case.count)
    for sizes in [case.sizes, *case.real.values()]:
        with torch.device("meta"):
            module = case.build(sizes)
        assert sum(p.numel() for p in module.parameters()) == formula.subs(sizes), sizes


@ids
def test_modules_take_any_number_of_batch_axes(case):
    torch.manual_seed(0)
    module = case.build(case.sizes).double().eval()
    inputs = case.inputs(case.sizes)
    batched = as_tuple(case.call(module, inputs))
    unbatched = as_tuple(case.call(module, {k: v[1] for k, v in inputs.items()}))
    two_axes = as_tuple(case.call(module, {k: v[None] for k, v in inputs.items()}))
    for one, none, two in zip(batched, unbatched, two_axes, strict=True):
        torch.testing.assert_close(one[1], none, atol=1e-12, rtol=0)
        torch.testing.assert_close(one, two[0], atol=1e-12, rtol=0)


def close(got, want):
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def x_for(case, n=None):
    torch.manual_seed(1)
    shape = (2, n or 5, case.sizes["d_m"])
    return torch.randn(*shape, dtype=torch.float64)


def build(case, **changes):
    torch.manual_seed(0)
    return case.build({**case.sizes, **changes}).double().eval()


# --- rotary: RoFormer's complex form, relative positions, GPT-J = Llama up to a permutation


def rotate_complex(x, offset, dim):
    """RoFormer eq. 34: features (j, j + dim/2) of the first `dim` are one complex number,
    multiplied by e^{i m θ_j} at position m, θ_j = 10000^(-2j/dim); the rest pass through."""
    half = dim // 2
    z = torch.complex(x[..., :half], x[..., half:dim])
    m = torch.arange(offset, offset + x.shape[-2], dtype=torch.float64)[:, None]
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / dim)
    z = z * torch.exp(1j * m * theta)
    return torch.cat((z.real, z.imag, x[..., dim:]), dim=-1)


@pytest.mark.parametrize("offset", [0, 7])
def test_rope_is_a_complex_rotation(offset):
    case = CASES["rope"]
    module, x = build(case), x_for(case)
    q, k, v = module.heads(x)
    d = module.head_dim
    q, k = rotate_complex(q, offset, d), rotate_complex(k, offset, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(module(x, offset=offset), module.o_proj(merge_heads(out)))


def test_gpt_neox_rotates_a_quarter_of_each_head_as_complex_numbers():
    case = CASES["rope_partial"]
    module, x = build(case), x_for(case)
    h, d = module.num_heads, module.head_size
    w = module.query_key_value.weight.view(h, 3, d, -1)  # head-major (h, 3, d_k)
    b = module.query_key_value.bias.view(h, 3, d)
    q, k, v = (torch.einsum("...ni,hai->...hna", x, w[:, B]) + b[:, B, None] for B in range(3))
    assert module.rotary_ndims == d // 4 == 4
    q, k = rotate_complex(q, 3, d // 4), rotate_complex(k, 3, d // 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(module(x, offset=3), module.dense(merge_heads(out)))


def test_gptj_is_llama_rope_with_pairs_regrouped_into_halves():
    """Rotating pairs (2j, 2j+1) is rotating halves (j, j + d/2) after reordering each head's
    query and key features from (j c) to (c j): the two layouts differ by a weight permutation."""
    case = CASES["rope_interleaved"]
    gptj, x = build(case), x_for(case)
    h, d_m = gptj.num_heads, x.shape[-1]

    def halves(weight):
        return weight.view(h, -1, 2, d_m).transpose(1, 2).reshape(-1, d_m)

    def llama(regroup):
        module = RoPEAttention(d_m, h, gptj.head_dim).double()
        q, k = gptj.q_proj.weight, gptj.k_proj.weight
        state = {"q_proj.weight": regroup(q), "k_proj.weight": regroup(k)}
        state |= {"v_proj.weight": gptj.v_proj.weight, "o_proj.weight": gptj.out_proj.weight}
        module.load_state_dict(state)
        return module(x, offset=3)

    close(gptj(x, offset=3), llama(halves))
    assert not torch.allclose(gptj(x, offset=3), llama(lambda w: w), atol=1e-3)


def test_qwen3_against_rms_norm_complex_rotary_and_sdpa():
    case = CASES["qk_norm"]
    module, x = build(case), x_for(case)
    d, eps = module.head_dim, case.sizes["eps"]
    q = split_heads(module.q_proj(x), module.num_heads)
    k = split_heads(module.k_proj(x), module.num_kv_heads)
    v = split_heads(module.v_proj(x), module.num_kv_heads)
    q = F.rms_norm(q, (d,), module.q_norm.weight, eps)
    k = F.rms_norm(k, (d,), module.k_norm.weight, eps)
    q, k = rotate_complex(q, 3, d), rotate_complex(k, 3, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    close(module(x, offset=3), module.o_proj(merge_heads(out)))


@pytest.mark.parametrize("spec", ["rope", "rope_partial", "rope_interleaved", "qk_norm"])
def test_rotary_sees_only_relative_positions(spec):
    """q_m·k_n depends on m - n alone, so shifting every position changes nothing."""
    case = CASES[spec]
    module, x = build(case), x_for(case)
    close(module(x, offset=0), module(x, offset=1000))


# --- masks, caps and biases: one query row at a time in Python


def loop_attention(q, k, v, score, visible):
    """out[b, μ, τ] = Σ over visible τ' of softmax(score) v, for (b, h, n, d) tensors;
    score(μ, τ, τ', q·k) and visible(b, τ, τ') are plain Python."""
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    batch, heads, n = q.shape[:3]
    for b in range(batch):
        for mu in range(heads):
            for tau in range(n):
                keys = [t for t in range(k.shape[-2]) if visible(b, tau, t)]
                s = torch.stack([score(mu, tau, t, q[b, mu, tau] @ k[b, mu, t]) for t in keys])
                weights = torch.softmax(s, dim=0)
                out[b, mu, tau] = sum(w * v[b, mu, t] for w, t in zip(weights, keys))
    return out


def scaled(d_k):
    return lambda mu, tau, t, dot: dot / math.sqrt(d_k)


def test_gemma2_soft_cap_and_window_by_loop():
    case = CASES["softcap_window"]
    module, x = build(case), x_for(case)
    c, w, s = (case.sizes[k] for k in ("c", "w", "query_pre_attn_scalar"))
    out = loop_attention(
        *module.heads(x),
        score=lambda mu, tau, t, dot: c * torch.tanh(dot / math.sqrt(s) / c),
        visible=lambda b, tau, t: tau - w < t <= tau,
    )
    close(module(x), module.o_proj(merge_heads(out)))


def test_gemma2_without_cap_and_window_is_causal_attention():
    torch.manual_seed(0)
    gemma = Gemma2Attention(6, 2, 4, query_pre_attn_scalar=4, softcap=1e12, sliding_window=5)
    plain = classic.GroupedQueryAttention(6, 2, 2, 4)
    plain.load_state_dict(gemma.state_dict())
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(gemma(x), plain(x))


def t5_bucket_by_hand(relative):
    """T5's bucket of key - query (32 buckets, max distance 128) in integers only: 16 buckets
    for keys after the query; distances 0..7 exact; from 8 on, bucket 8 + m where m counts
    the thresholds 8·√2^m (m = 1..7, up to 128·√2/2 ≈ 90.5) the distance reaches."""
    n = abs(relative)
    bucket = n if n < 8 else 8 + sum(n * n >= 64 * 2**m for m in range(1, 8))
    return bucket + (16 if relative > 0 else 0)


def test_t5_buckets_against_integer_arithmetic():
    relative = torch.arange(-300, 301)
    got = t5_relative_position_bucket(relative).tolist()
    assert got == [t5_bucket_by_hand(r) for r in relative.tolist()]
    known = (0, -1, 1, -7, -8, -11, -12, 16, -64, 64, 90, 91, -128, 300)
    assert {r: got[r + 300] for r in known} == {
        **{0: 0, -1: 1, 1: 17, -7: 7, -8: 8, -11: 8, -12: 9, 16: 26},
        **{-64: 14, 64: 30, 90: 30, 91: 31, -128: 15, 300: 31},
    }
    # Why specs/t5_bias.attn counts thresholds: the float64 logarithm misses bucket 14 at 64.
    assert math.floor(math.log(64 / 8) * (8 / math.log(16))) == 5


def test_t5_attention_by_loop():
    case = CASES["t5_bias"]
    module, x = build(case), x_for(case, n=70)
    h = module.num_heads
    table = module.relative_attention_bias.weight
    out = loop_attention(
        *(split_heads(proj(x), h) for proj in (module.q, module.k, module.v)),
        score=lambda mu, tau, t, dot: dot + table[t5_bucket_by_hand(t - tau), mu],
        visible=lambda b, tau, t: True,
    )
    close(module(x), module.o(merge_heads(out)))


def test_document_mask_by_loop():
    case = CASES["doc_mask"]
    module = build(case)
    x, docs = case.inputs(case.sizes).values()
    out = loop_attention(
        *module.heads(x),
        score=scaled(module.head_dim),
        visible=lambda b, tau, t: t <= tau and docs[b, t] == docs[b, tau],
    )
    close(module(x, docs), module.o_proj(merge_heads(out)))


def test_one_document_is_causal_attention():
    torch.manual_seed(0)
    module = DocumentMaskedAttention(6, 2, 3)
    plain = classic.GroupedQueryAttention(6, 2, 2, 3)
    plain.load_state_dict(module.state_dict())
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(module(x, torch.full((2, 5), 7)), plain(x))


DOCS_BF16 = [[256, 256, 257, 257]], [[0, 0, 1, 1]], [[0, 0, 0, 0]]


def bf16_runs(module):
    """The module in bfloat16 on documents (256, 257), (0, 1) and one document."""
    torch.manual_seed(2)
    x = torch.randn(1, 4, 6).bfloat16()
    return [module(x, torch.tensor(ids)) for ids in DOCS_BF16]


def test_document_ids_256_and_257_stay_apart_in_bfloat16():
    """bfloat16 has 8 significant bits: 257 rounds to 256, so ids cast to the scores' dtype
    would merge the two documents. The module compares them as integers."""
    ids = torch.tensor([256, 257])
    assert ids.bfloat16()[0] == ids.bfloat16()[1]
    torch.manual_seed(0)
    apart, renamed, merged = bf16_runs(DocumentMaskedAttention(6, 2, 3).bfloat16().eval())
    assert torch.equal(apart, renamed)
    assert not torch.equal(apart, merged)


def test_spec_keeps_document_ids_256_and_257_apart_in_bfloat16():
    case = CASES["doc_mask"]
    spec = compiled(case.spec)
    torch.manual_seed(0)
    ref = DocumentMaskedAttention(6, 2, 3)
    spec_module = spec.module(**case.sizes)
    spec_module.load_state_dict(case.mapping(ref.state_dict()))
    apart, renamed, merged = bf16_runs(spec_module.bfloat16().eval())
    assert torch.equal(apart, renamed)
    assert not torch.equal(apart, merged)


@pytest.mark.parametrize("n_new", [1, 3])
def test_kv_decode_is_the_tail_of_the_full_forward(n_new):
    """Prefill 4 tokens into the cache, decode n_new more: the output is the last n_new rows
    of causal attention over all 4 + n_new tokens, the cache their keys and values."""
    torch.manual_seed(0)
    decode = KVCacheAttention(6, 2, 3).double()
    full = classic.GroupedQueryAttention(6, 2, 2, 3).double()
    full.load_state_dict(decode.state_dict())
    x = torch.randn(2, 4 + n_new, 6, dtype=torch.float64)
    prefix, new = x[..., :4, :], x[..., 4:, :]
    cache = [split_heads(proj(prefix), 2) for proj in (decode.k_proj, decode.v_proj)]
    y, k, v = decode(new, *cache)
    close(y, full(x)[..., 4:, :])
    close(k, split_heads(decode.k_proj(x), 2))
    close(v, split_heads(decode.v_proj(x), 2))


def test_prefix_lm_mask_by_loop():
    case = CASES["prefix_lm"]
    module, x = build(case), x_for(case)
    p = case.sizes["P"]
    out = loop_attention(
        *module.heads(x),
        score=scaled(module.head_dim),
        visible=lambda b, tau, t: t <= tau or t < p,
    )
    close(module(x), module.o_proj(merge_heads(out)))


def test_prefix_lm_at_the_ends_is_causal_and_bidirectional():
    """P = 0 is causal attention (classic.GroupedQueryAttention), P = N attention with no mask."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    causal = classic.GroupedQueryAttention(6, 2, 2, 3).double()
    for p, is_causal in ((0, True), (5, False)):
        module = PrefixLMAttention(6, 2, 3, prefix_length=p).double()
        module.load_state_dict(causal.state_dict())
        out = F.scaled_dot_product_attention(*module.heads(x), is_causal=is_causal)
        close(module(x), module.o_proj(merge_heads(out)))
        if is_causal:
            close(module(x), causal(x))


def test_every_module_has_a_case_and_a_twin():
    modules = {GPTJAttention, GPTNeoXAttention, Qwen3Attention, T5Attention}
    assert len(MODERN_A_CASES) == len(CASES) == 9
    assert TWINS.keys() == CASES.keys()
    built = {type(case.build(case.sizes)) for case in MODERN_A_CASES}
    assert modules <= built and len(built) == 9
