"""Semantics nailed down (docs/language.md): literals on any axis, the summation scope of a
fraction, constants in the dtype of the call. Each was a silent wrong result; each test has a
twin that changes one thing and sees the difference."""

import torch

import indexattn
from indexattn.oracle.verify import compare


def test_a_literal_on_a_plain_axis_selects_that_axis():
    spec = indexattn.compile_spec("index t : N\nindex C : 2\ninput X_<tC>\nY_<t> = X_<t1>\n")
    x = torch.arange(12.0).reshape(2, 3, 2)  # a batch axis, then (t, C)
    assert torch.equal(spec(X=x), x[..., 1])
    assert not torch.equal(spec(X=x), x[..., 0])  # the twin: the other column
    assert compare(spec).ok and compare(spec, batch=(2,)).ok


def test_a_literal_on_a_leading_plain_axis():
    spec = indexattn.compile_spec("index t : N\nindex C : 2\ninput X_<Ct>\nY_<t> = X_<1t>\n")
    x = torch.arange(12.0).reshape(2, 2, 3)
    assert torch.equal(spec(X=x), x[:, 1])


LINEAR = """index μ : h
index τ : N
index a : D
index b : E
input F_<μτa>
input KV_<μab>
input z_<μa>
O_<μτb> = F_<μτa> KV_<μab> / (F_<μτa> z_<μa>)
"""


def test_numerator_and_denominator_each_sum_as_on_paper():
    spec = indexattn.compile_spec(LINEAR, name="linear")
    g = torch.Generator().manual_seed(0)
    f, kv, z = (
        torch.rand(s, generator=g, dtype=torch.float64) for s in ((2, 3, 4), (2, 4, 5), (2, 4))
    )
    numerator = torch.einsum("mta,mab->mtb", f, kv)
    denominator = torch.einsum("mta,ma->mt", f, z)
    got = spec(F_=f, KV=kv, z=z)
    torch.testing.assert_close(got, numerator / denominator[..., None], rtol=0, atol=1e-12)
    whole = torch.einsum("mta,mab,mta,ma->mtb", f, kv, 1 / f, 1 / z)  # v1's reading
    assert (got - whole).abs().max() > 0.1
    assert compare(spec).ok


def test_a_constant_spread_along_an_index_keeps_float64():
    spec = indexattn.compile_spec(
        "index μ : h\nscalar c = 0.1\ninput x_<μ>\nm_<μ> = c + 0 μ\nY_<μ> = m_<μ> x_<μ>\n"
    )
    y = spec(x=torch.ones(3, dtype=torch.float64), h=3)
    assert torch.equal(y, torch.full((3,), 0.1, dtype=torch.float64))
    assert (torch.tensor(0.1, dtype=torch.float32).double() - 0.1).abs() > 1e-9  # the twin


def test_a_concat_alone_is_a_whole_module():
    # torch.cat was the only torch call, and the import was missing
    spec = indexattn.compile_spec(
        "index c : M\nindex τ : N\nindex σ : M + N\ninput A_<c>\ninput B_<τ>\n"
        "C_<σ> = concat_<σ>(A_<c>, B_<τ>)\n"
    )
    a, b = torch.arange(2.0), torch.arange(3.0) + 10
    assert torch.equal(spec(A=a, B=b), torch.cat([a, b]))
    assert not torch.equal(spec(A=a, B=b), torch.cat([b, a]))  # the twin: order matters
