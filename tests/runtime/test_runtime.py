"""compile_spec, calls, sizes, ShapeError, and the nn.Module."""

import math
from pathlib import Path

import pytest
import torch

import indexattn

ROOT = Path(__file__).resolve().parents[2]
MHA = ROOT / "specs" / "mha.attn"


def mha_args(b=(2,), n=5, d_m=12, h=3, d_k=4, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    return dict(
        X=torch.randn(*b, n, d_m, generator=gen, dtype=dtype),
        W=torch.randn(3 * h * d_k, d_m, generator=gen, dtype=dtype),
        W_O=torch.randn(d_m, h * d_k, generator=gen, dtype=dtype),
        b_O=torch.randn(d_m, generator=gen, dtype=dtype),
    )


def test_compile_spec_reads_paths_and_text_and_caches():
    by_path = indexattn.compile_spec(MHA)
    assert indexattn.compile_spec(str(MHA)) is by_path
    by_text = indexattn.compile_spec(MHA.read_text(encoding="utf-8"), name="mha")
    assert by_text.name == by_path.name == "mha" and by_text.source == by_path.source
    assert [str(s) for s in by_path.sizes] == ["N", "d_m", "h", "d_k"]


def test_sizes_that_shapes_cannot_determine_are_asked_for():
    spec = indexattn.compile_spec(MHA)
    assert spec.required == ("h",)
    with pytest.raises(indexattn.ShapeError, match=r"the size h cannot be read from the shapes"):
        spec(**mha_args())
    y = spec(**mha_args(), h=3)
    assert y.shape == (2, 5, 12)
    assert torch.equal(spec(**mha_args(), h=3, d_k=4, N=5), y)  # consistent extra sizes


def test_shape_error_names_tensor_axis_expected_and_actual():
    spec = indexattn.compile_spec(MHA)
    args = mha_args()
    args["W_O"] = torch.randn(11, 12, dtype=torch.float64)
    with pytest.raises(indexattn.ShapeError) as caught:
        spec(**args, h=3)
    assert str(caught.value) == "mha: W_O_<i(μa)>, axis 0 (i): expected size d_m = 12, got 11"


def test_shape_error_for_an_unsplittable_fused_axis():
    args = mha_args()
    args["W"] = torch.randn(35, 12, dtype=torch.float64)
    with pytest.raises(
        indexattn.ShapeError,
        match=r"W_<\(μBa\)i>, axis 0 \(μBa\): expected "
        r"size 3\*d_k\*h \(a multiple of 3\*h = 9\), got 35",
    ):
        indexattn.compile_spec(MHA)(**args, h=3)


def test_shape_error_for_rank_batch_dtype_and_given_size():
    spec = indexattn.compile_spec(MHA)
    args = mha_args()
    with pytest.raises(indexattn.ShapeError, match="has at least 2 axes"):
        spec(**{**args, "X": torch.randn(12, dtype=torch.float64)}, h=3)
    with pytest.raises(indexattn.ShapeError, match="has 1 axes"):
        spec(**{**args, "b_O": torch.randn(2, 12, dtype=torch.float64)}, h=3)
    with pytest.raises(
        indexattn.ShapeError,
        match=r"W is torch\.float32 on cpu, but it must be torch\.float64 on cpu, as X sets",
    ):
        spec(**{**args, "W": args["W"].float()}, h=3)
    given = r"d_k was given as 5, but W_<\(μBa\)i>, axis 0 \(μBa\) has size 36, which makes d_k = 4"
    with pytest.raises(indexattn.ShapeError, match=given):
        spec(**args, h=3, d_k=5)


def test_inputs_batch_axes_must_broadcast():
    spec = indexattn.compile_spec(
        "index i : n\ninput x_<i>\ninput y_<i>\nz_<i> = x_<i> y_<i>", name="two"
    )
    assert spec(x=torch.ones(2, 1, 3), y=torch.ones(4, 3)).shape == (2, 4, 3)
    with pytest.raises(indexattn.ShapeError, match="batch axes do not broadcast"):
        spec(x=torch.ones(2, 3), y=torch.ones(5, 3))


def test_call_keywords_are_checked():
    spec = indexattn.compile_spec(MHA)
    with pytest.raises(TypeError, match="missing W_O"):
        spec(X=torch.ones(2, 3), W=torch.ones(3, 3), b_O=torch.ones(3))
    with pytest.raises(TypeError, match="unexpected keywords: w_o"):
        spec(**mha_args(), h=3, w_o=1)


def test_several_outputs_come_as_a_tuple_in_output_order():
    spec = indexattn.compile_spec(
        "index i, j : n\ninput x_<i>\nA_<ij> = x_<i> x_<j>\ns_<i> = sum_<j>(A_<ij>)\noutput s, A",
        name="two_out",
    )
    s, a = spec(x=torch.arange(3.0))
    assert a.shape == (3, 3) and s.tolist() == [0.0, 3.0, 6.0]


def test_module_parameters_init_state_dict_and_devices():
    spec = indexattn.compile_spec(MHA)
    torch.manual_seed(0)
    m = spec.module(d_m=64, h=4, d_k=16)
    assert list(m.state_dict()) == ["W", "W_O", "b_O"]
    assert m.W.shape == (192, 64) and m.W_O.shape == (64, 64) and m.b_O.shape == (64,)
    assert abs(m.W.std().item() - 0.02) < 0.002 and torch.all(m.b_O == 0)
    y = m(torch.randn(2, 7, 64))
    assert y.shape == (2, 7, 64)
    y.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m64 = m.to(torch.float64)
    assert m64(torch.randn(7, 64, dtype=torch.float64)).dtype == torch.float64
    twin = spec.module(d_m=64, h=4, d_k=16)
    twin.load_state_dict(m.state_dict())
    x = torch.randn(7, 64, dtype=torch.float64)
    assert torch.equal(twin.to(torch.float64)(X=x), m64(x))


def test_module_needs_the_sizes_of_its_params():
    with pytest.raises(TypeError, match=r"needs the size d_k to build W_<\(μBa\)i>"):
        indexattn.compile_spec(MHA).module(d_m=64, h=4)


def test_default_init_is_nn_linear_like():
    spec = indexattn.compile_spec(
        "index i : d_in\nindex j : d_out\ninput x_<i>\n"
        "param W_<ji>\nparam b_<j>\ny_<j> = W_<ji> x_<i> + b_<j>",
        name="linear",
    )
    torch.manual_seed(0)
    m = spec.module(d_in=400, d_out=300)
    bound = 1 / math.sqrt(400)
    for p in (m.W, m.b):
        assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound


def test_dropout_follows_train_and_eval():
    spec = indexattn.compile_spec(
        "index i : n\ninput x_<i>\nscalar p = 0.5\ny_<i> = dropout(x_<i>, p)", name="drop"
    )
    m = spec.module()
    x = torch.ones(10_000)
    assert torch.equal(m.eval()(x), x)
    y = m.train()(x)
    assert set(y.unique().tolist()) == {0.0, 2.0} and abs(y.mean().item() - 1) < 0.05
    assert torch.equal(spec.module(p=0.0).train()(x), x)


def test_torch_compile_fullgraph():
    m = indexattn.compile_spec(MHA).module(d_m=12, h=3, d_k=4)
    x = torch.randn(2, 5, 12)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))


def test_mixed_devices_are_a_shape_error():
    spec = indexattn.compile_spec(MHA)
    args = mha_args()
    args["W_O"] = args["W_O"].to("meta")
    with pytest.raises(
        indexattn.ShapeError,
        match=r"W_O is torch\.float64 on meta, but it must be torch\.float64 on cpu, as X",
    ):
        spec(**args, h=3)


def test_sizes_must_be_whole_numbers():
    spec = indexattn.compile_spec(MHA)
    with pytest.raises(indexattn.ShapeError, match=r"the size h must be a positive whole number"):
        spec(**mha_args(), h=1.5)
    with pytest.raises(indexattn.ShapeError, match=r"the size d_k must be a positive whole"):
        spec.module(d_m=12, h=3, d_k=4.5)


def test_constants_built_under_inference_mode_serve_a_later_backward():
    spec = indexattn.compile_spec(ROOT / "specs" / "sigmoid_attention.attn")
    module = spec.module(d_m=8, h=2, d_k=4)
    x = torch.randn(1, 5, 8)
    with torch.inference_mode():
        module(x)
    module(x.requires_grad_()).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_a_call_of_a_kind_seen_before_is_looked_up_and_still_checked(monkeypatch):
    spec = indexattn.compile_spec(MHA.read_text(encoding="utf-8") + "\n", name="mha")
    solved = []
    prepare = type(spec)._prepare
    monkeypatch.setattr(spec, "_prepare", lambda *a: solved.append(1) or prepare(spec, *a))
    args = mha_args()
    first = spec(**args, h=3)
    assert torch.equal(spec(**args, h=3), first) and len(solved) == 1  # looked up
    spec(**mha_args(dtype=torch.float32), h=3)
    assert len(solved) == 2  # the twin: another dtype is another kind of call
    args["W_O"] = args["W_O"].float()  # shapes seen before, one dtype not
    with pytest.raises(indexattn.ShapeError, match=r"W_O is torch\.float32 on cpu, but it must"):
        spec(**args, h=3)
    with pytest.raises(indexattn.ShapeError, match=r"a multiple of 3\*h = 15\), got 36"):
        spec(**mha_args(), h=5)  # shapes seen before, another given size


@pytest.mark.parametrize("backward", ["autograd", "derived"])
def test_a_call_in_argument_order_is_the_keyword_call(backward, monkeypatch):
    """`in_order` (transformers' attention function at every step) equals the keyword call in
    values and gradients, by either default backward; the twin: the same tensors in another
    order are read as other arguments, and the values differ."""
    spec = indexattn.compile_spec(ROOT / "specs" / "gqa_core.attn")
    monkeypatch.setitem(spec.__dict__, "default_backward", backward)  # the cached property
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 6, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    m = torch.zeros(4, 6, dtype=torch.float64)
    want = spec(Q=q, K=k, V=v, M=m, scaling=0.3)
    got = spec.in_order((q, k, v, m), {"scaling": 0.3}, training=False)
    assert torch.equal(got, want)
    assert torch.allclose(*(torch.autograd.grad(o.sin().sum(), q)[0] for o in (got, want)))
    swapped = spec.in_order((q, v, k, m), {"scaling": 0.3}, training=False)
    assert (swapped - want).abs().max() > 1e-3
