"""What a new user stumbled on, each with its twin: GELU's tanh form, a keyword in the
spec's own glyphs, compile_spec of something that is no spec, the cache's parent folders."""

import os
from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle.reference import evaluate
from indexattn.runtime import compiled

GELU = "index i : n\ninput x_<i>\ny_<i> = {}(x_<i>)\n"


def test_gelu_tanh_is_torchs_tanh_approximation():
    spec = indexattn.compile_spec(GELU.format("gelu_tanh"), name="gelu_tanh")
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    want = torch.nn.functional.gelu(x, approximate="tanh")
    torch.testing.assert_close(spec(x=x), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(evaluate(spec.ir, x=x)[0], want, rtol=1e-12, atol=1e-12)
    assert 'F.gelu(x, approximate="tanh")' in spec.source
    assert r"\operatorname{GELU}_{\tanh}" in spec.latex()


def test_twin_gelu_is_the_erf_form():
    """`gelu` stays the exact (erf) form, 1e-4 away from the tanh one somewhere."""
    spec = indexattn.compile_spec(GELU.format("gelu"), name="gelu")
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    approximate = torch.nn.functional.gelu(x, approximate="tanh")
    torch.testing.assert_close(spec(x=x), torch.nn.functional.gelu(x), rtol=0, atol=1e-15)
    assert (spec(x=x) - approximate).abs().max() > 1e-4


THETA = "index u : M\ninput x_<u>\nparam θ_<u>\ny_<u> = θ_<u> x_<u>\n"


def test_a_keyword_in_the_specs_own_glyphs_names_its_argument():
    spec = indexattn.compile_spec(THETA, name="theta")
    x, theta = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(spec(x=x, θ=theta), x * theta)
    torch.testing.assert_close(spec(x=x, θ=theta), spec(x=x, theta=theta))


def test_twin_a_glyph_and_its_ascii_spelling_at_once_are_refused():
    spec = indexattn.compile_spec(THETA, name="theta")
    x = torch.randn(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="θ and theta name one argument"):
        spec(x=x, theta=x, θ=x)
    with pytest.raises(TypeError, match="unexpected keywords: φ"):
        spec(x=x, theta=x, φ=x)


def test_a_positional_call_says_the_keywords():
    """Failed before: Python's `takes 1 positional argument but 3 were given`."""
    spec = indexattn.compile_spec(THETA, name="theta")
    x = torch.randn(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"keywords only, .* write theta\(x=\.\.\., theta=\.\.\.\)"):
        spec(x, x)


def test_twin_the_same_call_by_keywords_runs():
    spec = indexattn.compile_spec(THETA, name="theta")
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(spec(x=x, theta=2 * x), 2 * x * x)


@pytest.mark.parametrize("thing", [b"index i : n\n", None, 3, ["mha"]])
def test_compile_spec_of_no_spec_says_what_it_takes(thing):
    with pytest.raises(TypeError, match=r"takes a spec's text \(str\), the name of a shipped"):
        indexattn.compile_spec(thing)


def test_twin_compile_spec_takes_text_a_name_and_a_path():
    root = Path(__file__).resolve().parents[2]
    assert indexattn.compile_spec("mha").name == "mha"
    assert indexattn.compile_spec(root / "specs/mha.attn").name == "mha"
    assert indexattn.compile_spec(GELU.format("exp"), name="e").name == "e"


def test_the_caches_parent_folders_are_private_whatever_the_umask(tmp_path, monkeypatch):
    where = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("INDEXATTN_CACHE_DIR", str(where))
    monkeypatch.delenv("INDEXATTN_CACHE", raising=False)
    old = os.umask(0)
    try:
        compiled._compile(GELU.format("exp"), "parents", "<parents>")
    finally:
        os.umask(old)
    for folder in (where, where.parent, where.parent.parent):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert list(where.glob("*.pickle"))


def test_twin_a_folder_there_before_keeps_its_mode(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(mode=0o755)
    (tmp_path / "a").chmod(0o755)
    where = tmp_path / "a" / "cache"
    monkeypatch.setenv("INDEXATTN_CACHE_DIR", str(where))
    monkeypatch.delenv("INDEXATTN_CACHE", raising=False)
    compiled._compile(GELU.format("exp"), "before", "<before>")
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755
    assert where.stat().st_mode & 0o777 == 0o700


CORES = ("gqa_core", "gqa_causal_core", "gqa_unmasked_core")  # the transformers door's cores


def sdpa_layout(batch: int):
    """sdpa's layout, [batch, heads, N, d]: 4 query heads on 2 key/value heads."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(batch, h, 5, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
    return q, k, v, torch.randn(5, 5, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("batch", [2, 3])  # 2 = h_kv: broadcast silently before
@pytest.mark.parametrize("name", CORES)
def test_sdpas_layout_given_to_a_core_is_refused_naming_the_layout_it_takes(name, batch):
    """Failed before: with the batch equal to h_kv, out came [2, 2, 4, 5, 8] (Q's batch read as
    h_kv and broadcast); else `K_<gσa>, axis 0 (g): expected size h_kv = 3`, a size the user
    never set."""
    core = indexattn.compile_spec(name)
    q, k, v, m = sdpa_layout(batch)
    masks = {"M": m} if "M" in core.arguments else {}
    refused = r"Q_<grτa> and K_<g\S+a> both begin with g"
    with pytest.raises(indexattn.ShapeError, match=refused) as e:
        core(Q=q, K=k, V=v, scaling=0.3, **masks)
    assert "Q as [*batch, h_kv, n_rep, N, d_k]" in str(e.value)
    assert "Q.unflatten(1, (h_kv, -1))" in str(e.value)


@pytest.mark.parametrize("name", CORES)
def test_twin_the_layout_the_message_names_runs_and_is_sdpas(name):
    """The same tensors, Q's heads split as the message says: sdpa's output (its keys and
    values repeated per group, as transformers' repeat_kv); the mask unbatched still broadcasts."""
    core = indexattn.compile_spec(name)
    q, k, v, m = sdpa_layout(2)
    masks = {"M": m} if "M" in core.arguments else {}
    out = core(Q=q.unflatten(1, (2, -1)), K=k, V=v, scaling=0.3, **masks).flatten(1, 2)
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = sdpa(q, k, v, attn_mask=masks.get("M"), is_causal=name == "gqa_causal_core", scale=0.3)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
