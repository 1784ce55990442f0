"""indexattn.relayout: a tensor moved between two layouts of the same indices.

Round trips and einops on random layouts; the checkpoint conversions it exists for (GPT-2's
Conv1D and nn.Linear c_attn, nn.MultiheadAttention's in_proj_weight, into the head-major
(μBa) of specs/mha_math.attn) against hand-written split/transpose code and against the
modules themselves; and its errors, word for word.
"""

import doctest
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from einops import rearrange
from hypothesis import given, settings
from hypothesis import strategies as st
from reference.classic import GPT2Attention, causal_mask
from torch import nn

import indexattn
from indexattn import ShapeError, SpecError, relayout
from indexattn.notation.names import ascii_name

SPECS = Path(__file__).resolve().parents[2] / "specs"


def test_docstring_examples_run():
    module = importlib.import_module("indexattn.parallel.relayout")  # the attribute is the function
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_importing_indexattn_does_not_import_torch():
    code = "import sys, indexattn; indexattn.relayout; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# Random layouts: up to five indices with small sizes, shuffled and grouped at random.
GLYPHS = ["B", "μ", "a", "i", "τ'"]


@st.composite
def layouts(draw, glyphs):
    order = draw(st.permutations(glyphs))
    cuts = sorted(draw(st.sets(st.integers(1, len(order)), max_size=len(order) - 1)) - {len(order)})
    return [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)])]


def write(axes):
    return "<" + "".join(a[0] if len(a) == 1 else "(" + "".join(a) + ")" for a in axes) + ">"


def einops_side(axes, names):
    return " ".join(
        names[a[0]] if len(a) == 1 else f"({' '.join(names[g] for g in a)})" for a in axes
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_layouts_round_trip_and_agree_with_einops(data):
    glyphs = GLYPHS[: data.draw(st.integers(1, len(GLYPHS)))]
    sizes = {g: data.draw(st.integers(1, 4)) for g in glyphs}
    src, dst = data.draw(layouts(glyphs)), data.draw(layouts(glyphs))
    batch = data.draw(st.sampled_from([(), (2,), (2, 1)]))
    names = {g: f"x{k}" for k, g in enumerate(glyphs)}
    shape = [*batch] + [int(torch.tensor([sizes[g] for g in a]).prod()) for a in src]
    x = torch.randn(shape)
    # Each fused axis tells one size: leave out at most one index per source axis.
    omitted = {data.draw(st.sampled_from([None, *axis])) for axis in src}
    keywords = {ascii_name(g): sizes[g] for g in glyphs if g not in omitted}

    y = relayout(x, write(src), write(dst), **keywords)
    pattern = f"... {einops_side(src, names)} -> ... {einops_side(dst, names)}"
    axis_sizes = {names[g]: s for g, s in sizes.items()}
    torch.testing.assert_close(y, rearrange(x, pattern, **axis_sizes), atol=0, rtol=0)
    back = relayout(y, write(dst), write(src), **{ascii_name(g): n for g, n in sizes.items()})
    torch.testing.assert_close(back, x, atol=0, rtol=0)


def test_a_fused_axis_needs_all_sizes_but_one():
    x = torch.randn(2 * 3 * 4, 5)
    y = relayout(x, "<(Bμa)i>", "<μBai>", B=2, a=4)
    assert y.shape == (3, 2, 4, 5)
    torch.testing.assert_close(y, x.view(2, 3, 4, 5).transpose(0, 1), atol=0, rtol=0)


def test_sizes_may_be_named_by_ascii_name_glyph_or_macro_and_primes_work():
    x = torch.randn(6, 5)
    want = relayout(x, "<(μτ')i>", "<i(τ'μ)>", mu=2)
    torch.testing.assert_close(relayout(x, "<(μτ')i>", "<i(τ'μ)>", μ=2), want)
    torch.testing.assert_close(relayout(x, "<(μτ')i>", "<i(τ'μ)>", tau_p=3), want)
    torch.testing.assert_close(relayout(x, r"<(\mu\tau')i>", r"<i(\tau'\mu)>", mu=2), want)
    torch.testing.assert_close(want, x.view(2, 3, 5).permute(2, 1, 0).reshape(5, 6))


def test_leading_batch_axes_pass_through():
    x = torch.randn(4, 3, 2 * 3 * 5, 7)
    y = relayout(x, "<(Bμa)i>", "<(μBa)i>", B=2, mu=3)
    assert y.shape == x.shape
    for b in range(4):
        for c in range(3):
            torch.testing.assert_close(
                y[b, c], relayout(x[b, c], "<(Bμa)i>", "<(μBa)i>", B=2, mu=3)
            )


def test_a_view_where_reshape_gives_one_and_gradients_flow():
    x = torch.randn(12, 5, requires_grad=True)
    split = relayout(x, "<(μa)i>", "<μai>", mu=3)
    assert split.data_ptr() == x.data_ptr()
    relayout(x, "<(μa)i>", "<i(aμ)>", mu=3).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


# Checkpoint conversions. GPT-2's c_attn maps width d to (Bμa): B = 3 (query, key, value),
# μ = heads, a = head width. nn.Linear stores it <(Bμa)i>; Hugging Face's Conv1D, transposed,
# stores it <i(Bμa)>; the math layout of specs/mha_math.attn is head-major <(μBa)i>.
D, H = 8, 2
DK = D // H


def head_major_by_hand(linear_weight):
    """(Bμa)i -> (μBa)i as tutorials write it: chunk q, k, v, then interleave per head."""
    q, k, v = linear_weight.chunk(3, dim=0)  # each (h·d_k, d): rows (μa)
    heads = [torch.cat([t[m * DK : (m + 1) * DK] for t in (q, k, v)]) for m in range(H)]
    return torch.cat(heads)


def test_gpt2_conv1d_to_head_major_equals_the_manual_split_and_transpose():
    conv1d = torch.randn(D, 3 * D)  # Hugging Face GPT-2 c_attn.weight: (in, out)
    got = relayout(conv1d, "<i(Bμa)>", "<(μBa)i>", B=3, mu=H)
    torch.testing.assert_close(got, head_major_by_hand(conv1d.t()), atol=0, rtol=0)
    torch.testing.assert_close(
        got, conv1d.view(D, 3, H, DK).permute(2, 1, 3, 0).reshape(3 * D, D), atol=0, rtol=0
    )
    linear = relayout(conv1d, "<i(Bμa)>", "<(Bμa)i>", B=3, mu=H)  # Conv1D -> nn.Linear
    torch.testing.assert_close(linear, conv1d.t(), atol=0, rtol=0)


def head_major_spec(weights):
    """specs/mha_math.attn at width D and H heads, holding the given parameters, float64."""
    spec = indexattn.compile_spec(SPECS / "mha_math.attn")
    module = spec.module(d_m=D, h=H, d_k=DK).double().eval()
    module.load_state_dict(weights)
    return module


def test_gpt2_weights_relaid_run_in_the_head_major_spec():
    torch.manual_seed(0)
    gpt2 = GPT2Attention(D, H).double().eval()  # c_attn bias is zero: mha_math has none
    module = head_major_spec(
        {
            "W_qkv_weight": relayout(gpt2.c_attn.weight, "<(Bμa)i>", "<(μBa)i>", B=3, mu=H),
            "W_O_weight": gpt2.c_proj.weight,
            "W_O_bias": gpt2.c_proj.bias,
        }
    )
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(module(x), gpt2(x)[0], atol=1e-12, rtol=0)


def test_torch_mha_in_proj_weight_to_head_major():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, batch_first=True).double().eval()  # in_proj_bias is zero
    in_proj = mha.in_proj_weight.detach()
    head_major = relayout(in_proj, "<(Bμa)i>", "<(μBa)i>", B=3, mu=H)
    torch.testing.assert_close(head_major, head_major_by_hand(in_proj), atol=0, rtol=0)
    back = relayout(head_major, "<(μBa)i>", "<(Bμa)i>", B=3, mu=H)
    torch.testing.assert_close(back, in_proj, atol=0, rtol=0)

    module = head_major_spec(
        {
            "W_qkv_weight": head_major,
            "W_O_weight": mha.out_proj.weight,
            "W_O_bias": mha.out_proj.bias,
        }
    )
    x = torch.randn(2, 5, D, dtype=torch.float64)
    want, _ = mha(x, x, x, attn_mask=causal_mask(torch.empty(5, 5)))
    torch.testing.assert_close(module(x), want, atol=1e-12, rtol=0)


# Errors. A malformed layout is a SpecError with a caret under the place in that layout.
SPEC_ERRORS = {
    "unclosed group": (
        ("<(Bμa i>", "<(μBa)i>"),
        """\
<src>:1:8: error: expected ')' to close the index group opened at column 2
  <(Bμa i>
         ^
  close the group inside the list, e.g. W_<(μa)i>.""",
    ),
    "no angle brackets": (
        ("<(Bμa)i>", "(μBa)i"),
        """\
<dst>:1:1: error: expected '<' to open the layout
  (μBa)i
  ^
  a layout is written as the subscript of a tensor reference, e.g. '<(Bμa)i>'.""",
    ),
    "text after the layout": (
        ("<(Bμa)i> W", "<(μBa)i>"),
        """\
<src>:1:10: error: unexpected text after the layout's closing '>'
  <(Bμa)i> W
           ^
  remove it.""",
    ),
    "a literal": (
        ("<(B0a)i>", "<(μBa)i>"),
        """\
<src>:1:4: error: the literal 0 selects a slice, but relayout only moves axes
  <(B0a)i>
     ^
  name the index here, and slice the tensor before or after relayout.""",
    ),
    "an index twice": (
        ("<(Bμa)i>", "<(μBa)μ>"),
        """\
<dst>:1:7: error: index μ appears twice in this layout
  <(μBa)μ>
        ^
  a layout names each index once: one index per axis or per part of a fused axis.""",
    ),
    "an index only in src": (
        ("<(Bμa)i>", "<(μB)i>"),
        """\
<src>:1:5: error: index a is in src but not in dst, <(μB)i>
  <(Bμa)i>
      ^
  relayout moves axes and cannot add or drop one: both layouts name the same indices.""",
    ),
    "an index only in dst": (
        ("<(Bμa)i>", "<(μBa)ij>"),
        """\
<dst>:1:8: error: index j is in dst but not in src, <(Bμa)i>
  <(μBa)ij>
         ^
  relayout moves axes and cannot add or drop one: both layouts name the same indices.""",
    ),
    "an unknown macro": (
        (r"<(B\foo a)i>", "<(μBa)i>"),
        """\
<src>:1:4: error: unknown index macro \\foo
  <(B\\foo a)i>
     ^^^^
  write a Greek letter's name (\\mu, \\tau, \\Delta) or the letter itself.""",
    ),
}


@pytest.mark.parametrize("layouts, message", SPEC_ERRORS.values(), ids=SPEC_ERRORS.keys())
def test_malformed_layouts_are_spec_errors_with_a_caret(layouts, message):
    with pytest.raises(SpecError) as error:
        relayout(torch.zeros(2304, 768), *layouts, B=3, mu=12)
    assert str(error.value) == message


SHAPE_ERRORS = {
    "24 heads at width 1024": (
        (1024, 1024),
        ("<(μa)i>", "<μai>"),
        {"mu": 24},
        "relayout: src <(μa)i>, axis 0 (μa) has size 1024, which is not a multiple of μ = 24",
    ),
    "a fused axis with two unknowns": (
        (2304, 768),
        ("<(Bμa)i>", "<(μBa)i>"),
        {"mu": 12},
        "relayout: src <(Bμa)i>, axis 0 (Bμa) has size 2304 = B·μ·a, which does not tell "
        "B, a apart: give all but one of them (B=..., a=...)",
    ),
    "a product that is not the axis": (
        (2304, 768),
        ("<(Bμa)i>", "<(μBa)i>"),
        {"B": 3, "mu": 12, "a": 32},
        "relayout: src <(Bμa)i>, axis 0 (Bμa): expected size B·μ·a = 3·12·32 = 1152, got 2304",
    ),
    "a size that is not the axis": (
        (2304, 768),
        ("<(Bμa)i>", "<(μBa)i>"),
        {"B": 3, "mu": 12, "i": 1024},
        "relayout: src <(Bμa)i>, axis 1 (i): expected size i = 1024, got 768",
    ),
    "too few axes": (
        (2304,),
        ("<(Bμa)i>", "<(μBa)i>"),
        {"B": 3, "mu": 12},
        "relayout: src <(Bμa)i> has 2 axes (leading batch axes aside), but the tensor has "
        "shape (2304,)",
    ),
    "a size of zero": (
        (2304, 768),
        ("<(Bμa)i>", "<(μBa)i>"),
        {"B": 3, "mu": 0},
        "relayout(): mu = 0, but a size must be positive",
    ),
}


@pytest.mark.parametrize("shape, layouts, sizes, message", SHAPE_ERRORS.values(), ids=SHAPE_ERRORS)
def test_sizes_that_do_not_fit_are_shape_errors(shape, layouts, sizes, message):
    with pytest.raises(ShapeError) as error:
        relayout(torch.zeros(shape), *layouts, **sizes)
    assert str(error.value) == message


def test_a_size_named_after_no_index_is_a_type_error():
    with pytest.raises(TypeError) as error:
        relayout(torch.zeros(2304, 768), "<(Bμa)i>", "<(μBa)i>", h=12)
    assert str(error.value) == (
        "relayout() got h=12, but h is no index of <(Bμa)i>: sizes are named after the "
        "layout's indices (B=..., mu=..., a=..., i=...)"
    )


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"mu": 12.0}, "relayout(): mu must be a whole number, got 12.0"),
        ({"mu": True}, "relayout(): mu must be a whole number, got True"),
        ({"mu": 12, "μ": 12}, "relayout() got the size of index μ twice"),
    ],
)
def test_sizes_must_be_whole_numbers_given_once(sizes, message):
    with pytest.raises(TypeError) as error:
        relayout(torch.zeros(2304, 768), "<(Bμa)i>", "<(μBa)i>", B=3, **sizes)
    assert str(error.value) == message


def test_a_tensor_is_required():
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor, got list"):
        relayout([[1.0]], "<ij>", "<ji>")


def test_layouts_are_strings():
    with pytest.raises(TypeError, match="a layout is a str"):
        relayout(torch.zeros(2, 3), ["i", "j"], "<ji>")
