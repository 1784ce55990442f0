"""rank_<j>(e): top-k selection as a rank compared, against torch.topk scattered into a mask
(values and gradients, float64), its twin, ties, and the rule that keeps it gradient-free."""

import pytest
import torch

import indexattn
from indexattn.oracle import reference

TOP_K = """
index τ, τ' : N
index a : d
index j : k
input Q_<τa>
input K_<τ'a>
input V_<τ'a>
S_<ττ'> = Q_<τa> K_<τ'a>
A_<ττ'> = softmax_<τ'>(S_<ττ'> + where(rank_<τ'>(S_<ττ'>) < k, 0, -inf))
O_<τa>  = A_<ττ'> V_<τ'a>
"""


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 7, 3, dtype=torch.float64, generator=g).requires_grad_() for _ in "qkv"]


def by_topk(q, k, v, keep):
    s = q @ k.transpose(-2, -1)
    hidden = torch.full_like(s, -torch.inf).scatter(-1, s.topk(keep, dim=-1).indices, 0.0)
    return torch.softmax(s + hidden, dim=-1) @ v


@pytest.mark.parametrize("keep", [3, 4])
def test_top_k_equals_topk_scattered_into_a_mask(keep):
    spec, (q, k, v) = indexattn.compile_spec(TOP_K, name="top_k"), qkv()
    got = spec(Q=q, K=k, V=v, k=3)
    want = by_topk(q, k, v, keep)
    if keep == 4:  # the twin: one more key kept
        assert (got - want).abs().max() > 1e-3
        return
    assert (got - want).abs().max() < 1e-14
    for g, w in zip(
        torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))
    ):
        assert (g - w).abs().max() < 1e-13


def test_ties_go_to_the_earlier_position_in_the_code_and_the_oracle():
    spec = indexattn.compile_spec(
        "index j : n\ninput e_<j>\nR_<j> = rank_<j>(e_<j>)\noutput R", name="ranks"
    )
    e = torch.tensor([1.0, 3.0, 1.0, 3.0, 2.0], dtype=torch.float64)
    want = torch.tensor([3, 0, 4, 1, 2])
    assert torch.equal(spec(e=e), want)
    (literal,) = reference.evaluate(spec.ir, e=e)
    assert torch.equal(literal, want)


def test_a_rank_outside_a_comparison_says_what_to_write():
    text = TOP_K.replace("where(rank_<τ'>(S_<ττ'>) < k, 0, -inf)", "rank_<τ'>(S_<ττ'>)")
    with pytest.raises(indexattn.SpecError, match=r"select by it, where\(rank_<τ'>"):
        indexattn.compile_spec(text, name="loose")


TIES = "index j : n\nscalar k = 4\ninput e_<j>\nT_<j> = where({keep}, 1, 0)\noutput T"
TIED = torch.tensor([1.0, 3.0, 1.0, 3.0, 2.0, 1.0, -torch.inf], dtype=torch.float64)


@pytest.mark.parametrize(
    "keep", ["rank_<j>(e_<j>) < k", "rank_<j>(e_<j>) <= k - 1", "k > rank_<j>(e_<j>)"]
)
@pytest.mark.parametrize("k, want", [(4, [1, 1, 0, 1, 1, 0, 0]), (5, [1, 1, 1, 1, 1, 0, 0])])
def test_the_k_largest_with_ties_at_the_kth_keep_the_earlier_in_code_and_oracle(keep, k, want):
    """Three 1s tie for the k-th place: the first of them (k = 4), the first two (k = 5, the
    twin); the compiled mask, the literal interpreter's and the expected one are one."""
    spec = indexattn.compile_spec(TIES.format(keep=keep), name="ties")
    got, (literal,) = spec(e=TIED, k=k), reference.evaluate(spec.ir, e=TIED, k=k)
    assert torch.equal(got, torch.tensor(want, dtype=got.dtype))
    assert torch.equal(literal.to(got.dtype), got)


@pytest.mark.parametrize("k", [0, 7, 9])
def test_none_or_all_kept_when_k_reaches_an_end(k):
    spec = indexattn.compile_spec(TIES.format(keep="rank_<j>(e_<j>) < k"), name="ends")
    assert torch.equal(spec(e=TIED, k=k), torch.full((7,), float(k > 0), dtype=torch.float64))


def calls_of(monkeypatch, name: str) -> list:
    """Each call of torch.Tensor.<name> from now on, recorded."""
    seen, method = [], getattr(torch.Tensor, name)

    def recorded(self, *args, **kwargs):
        seen.append(args)
        return method(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, name, recorded)
    return seen


@pytest.mark.parametrize("compared", [True, False])
def test_a_rank_compared_runs_topk_and_no_sort(compared, monkeypatch):
    """`rank < k` is torch.topk's k (one call, no order of all keys); the twin, a rank of its
    own equation, is each entry's place: two argsorts, no topk."""
    text = TIES.format(keep="rank_<j>(e_<j>) < k")
    if not compared:
        text = "index j : n\ninput e_<j>\nR_<j> = rank_<j>(e_<j>)\noutput R"
    spec = indexattn.compile_spec(text, name="calls")
    topk, argsort = calls_of(monkeypatch, "topk"), calls_of(monkeypatch, "argsort")
    spec(e=TIED, **({"k": 3} if compared else {}))
    assert (len(topk), len(argsort)) == ((1, 0) if compared else (0, 2))
