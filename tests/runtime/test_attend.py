"""indexattn.attend: equations run inline, every range read off the tensors passed; and the
same relaxation in spec files (an index a tensor's axis fixes needs no index line)."""

import pytest
import torch

import indexattn
from indexattn import inline as attend_module
from indexattn.inline import attend
from indexattn.oracle.reference import evaluate

VARIANT = """S_<μττ'> = c tanh(Q_<μτa> K_<μτ'a> / (c sqrt(n_a))) - m_<μ> (τ - τ') + where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)
O_<μτa> = softmax_<τ'>(S_<μττ'>) V_<μτ'a>"""  # noqa: E501


def variant_reference(q, k, v, docs, slopes, cap):
    """Document mask, causal, soft cap, a per-head bias (ALiBi's slopes), in plain PyTorch."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = cap * torch.tanh(s / cap)
    pos = torch.arange(q.shape[-2])
    s = s - slopes[:, None, None] * (pos[:, None] - pos[None, :])
    hidden = (pos[None, :] > pos[:, None]) | (docs[:, None] != docs[None, :])
    return s.masked_fill(hidden, -torch.inf).softmax(-1) @ v


def variant_inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    docs = torch.sort(torch.randint(0, 3, (n,), generator=g)).values
    slopes = torch.rand(3, generator=g, dtype=torch.float64)
    return q, k, v, docs, slopes


@pytest.mark.parametrize("n", [5, 9])
def test_the_variant_in_one_call_equals_plain_pytorch(n):
    q, k, v, docs, slopes = variant_inputs(n)
    q.requires_grad_()
    got = attend(VARIANT, Q=q, K=k, V=v, D=docs, m=slopes, c=20.0)
    want = variant_reference(q, k, v, docs, slopes, 20.0)
    torch.testing.assert_close(got, want)
    (dq,) = torch.autograd.grad(got.square().sum(), q)
    (dq_want,) = torch.autograd.grad(want.square().sum(), q)
    torch.testing.assert_close(dq, dq_want)


def test_the_variant_twin_sees_a_moved_document_boundary_and_the_cap():
    q, k, v, docs, slopes = variant_inputs(9)
    want = variant_reference(q, k, v, docs, slopes, 20.0)
    moved = docs.clone()
    moved[4] = moved[3] + 1  # a boundary where there was none (or a new document)
    assert (moved != docs).any() or moved[4] != moved[5]
    got = attend(VARIANT, Q=q, K=k, V=v, D=moved + (moved >= moved[4]), m=slopes, c=20.0)
    assert not torch.allclose(got, want)
    got = attend(VARIANT, Q=q, K=k, V=v, D=docs, m=slopes, c=0.5)
    assert not torch.allclose(got, want)


def test_compiled_once_per_text_and_kind_of_call():
    q, k, v, docs, slopes = variant_inputs(5)
    attend_module.compiled.cache_clear()
    attend(VARIANT, Q=q, K=k, V=v, D=docs, m=slopes, c=20.0)
    attend(VARIANT, Q=q[:, :, :3], K=k[:, :, :3], V=v[:, :, :3], D=docs[:3], m=slopes, c=3.0)
    assert attend_module.compiled.cache_info().misses == 1  # a new shape and value: same spec
    attend(VARIANT, Q=q, K=k, V=v, D=docs.double(), m=slopes, c=20.0)  # D a float input now
    assert attend_module.compiled.cache_info().misses == 2


def test_an_integer_tensor_is_an_integer_input_and_a_number_a_scalar():
    spec = attend_module.compiled(
        attend_module.read(VARIANT),
        (
            ("Q", "float"),
            ("K", "float"),
            ("V", "float"),
            ("D", "int"),
            ("m", "float"),
            ("c", "number"),
        ),
    )
    assert {t.name: t.dtype for t in spec.ir.tensors if t.role == "input"}["D"] == "int"
    assert [s.name for s in spec.ir.scalars] == ["c"]


def test_declarations_stay_allowed_and_win():
    # τ and τ' given ranges of their own by index lines: cross attention of unequal lengths,
    # which the one implied range of τ and τ' would refuse.
    text = "index τ : N_q\nindex τ' : N_k\nO_<τc> = softmax_<τ'>(Q_<τa> K_<τ'a>) V_<τ'c>"
    q, k, v = torch.randn(3, 4), torch.randn(6, 4), torch.randn(6, 2)
    torch.testing.assert_close(attend(text, Q=q, K=k, V=v), (q @ k.T).softmax(-1) @ v)
    plain = "O_<τc> = softmax_<τ'>(Q_<τa> K_<τ'a>) V_<τ'c>"
    with pytest.raises(indexattn.ShapeError):
        attend(plain, Q=q, K=k, V=v)


def test_a_size_an_index_line_names_is_passed_as_a_number():
    text = "index μ : h\nO_<μτc> = softmax_<τ'>(Q_<(μa)τ> K_<μτ'a>) V_<τ'c>"
    q, k, v = torch.randn(6, 5), torch.randn(2, 5, 3), torch.randn(5, 4)
    got = attend(text, Q=q, K=k, V=v, h=2)
    want = torch.einsum("mta,msa->mts", q.view(2, 3, 5).transpose(1, 2), k).softmax(-1) @ v
    torch.testing.assert_close(got, want)


def test_errors_quote_the_users_own_line():
    with pytest.raises(indexattn.SpecError) as caught:
        attend("A_<τ> = Q_<τa> Q_<τa>\nB_<τ> = sofmax_<a>(Q_<τa>)", Q=torch.ones(2, 3))
    message = str(caught.value)
    assert message.startswith("<attend>:2:")
    assert "B_<τ> = sofmax_<a>(Q_<τa>)" in message
    with pytest.raises(TypeError, match="pass it: K="):
        attend("O_<τ> = Q_<τa> K_<τa>", Q=torch.ones(2, 3))
    with pytest.raises(indexattn.SpecError, match="selects a slice"):
        attend("O_<τ> = W_<(τ0)>", W=torch.ones(4))


SPELLED = """index τ, τ' : N
index a : d
index c : d_v
input Q_<τa>
input K_<τ'a>
input V_<τ'c>
input D_<τ> : int
O_<τc> = softmax_<τ'>(Q_<τa> K_<τ'a> + where(D_<τ> != D_<τ'>, -inf, 0)) V_<τ'c>
"""


def test_a_spec_file_without_index_lines_means_the_same():
    implied = "\n".join(line for line in SPELLED.splitlines() if not line.startswith("index"))
    full, short = (indexattn.compile_spec(t, name="docs") for t in (SPELLED, implied))
    g = torch.Generator().manual_seed(1)
    args = {
        "Q": torch.randn(7, 4, generator=g, dtype=torch.float64),
        "K": torch.randn(7, 4, generator=g, dtype=torch.float64),
        "V": torch.randn(7, 3, generator=g, dtype=torch.float64),
        "D": torch.tensor([0, 0, 1, 1, 1, 2, 2]),
    }
    torch.testing.assert_close(short(**args), full(**args))
    torch.testing.assert_close(short(**args), evaluate(short.ir, **args)[0])
    assert [str(s) for s in short.sizes] == ["n_τ", "n_a", "n_c"]
    args["D"] = torch.zeros(7, dtype=torch.long)  # twin: one document
    assert not torch.allclose(short(**args), full(**{**args, "D": torch.arange(7) // 3}))


def test_an_index_only_inside_a_fused_axis_still_needs_a_line():
    with pytest.raises(indexattn.SpecError, match="fused axis fixes only a product"):
        indexattn.compile_spec(
            "input X_<τi>\nparam W_<(μa)i>\nQ_<μτa> = W_<(μa)i> X_<τi>", name="w"
        )
