"""The independent baselines of benchmarks/baselines/ compute what the specs compute: each
against the generated module in float64 (values and the gradients of the input and of every
parameter), at lengths that are and are not a multiple of the chunk; FlexAttention's values
only (a CPU has no backward for it), in float64 by its eager path and in float32 compiled, as
it is timed; each with a twin that changes one parameter on the baseline's side and sees the
output move."""

import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import indexattn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from baselines import (  # noqa: E402
    chunked_linear,
    flex,
    fused_qkv,
    retention,
    rotary,
    row_blocks,
    unseen,
)

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

SIZES = {"d_m": 24, "h": 3, "d_k": 8}
SEPARATE = {"d_in": 24, "d_out": 24, "h": 3, "d_k": 8}
ROTARY = {"d_m": 24, "h": 3, "d_r": 4}
SPECS, BENCH = ROOT / "specs", ROOT / "benchmarks" / "specs"
CASES = {  # name: (spec, baseline, sizes)
    "chunked_linear": (SPECS / "linear_attention_causal.attn", chunked_linear.forward, SIZES),
    "retention": (SPECS / "retention.attn", retention.forward, SIZES),
    "head_major": (SPECS / "mha.attn", fused_qkv.head_major, SIZES),
    "qkv_major": (BENCH / "mha_qkv_major.attn", fused_qkv.qkv_major, SIZES),
    "rotary_llama": (SPECS / "rope.attn", rotary.llama, ROTARY),
    "rotary_gptj": (SPECS / "rope_interleaved.attn", rotary.gptj, ROTARY),
    "rotary_neox": (
        SPECS / "rope_partial.attn",
        rotary.neox,
        ROTARY | {"d_r": 2, "d_p": 4},
    ),  # half rotated
}
FLEX = {  # windows and a soft cap small enough to bite at these lengths and widths
    "flex_mha": (SPECS / "mha.attn", flex.mha, SIZES),
    "flex_window": (SPECS / "sliding_window.attn", flex.sliding_window, SEPARATE | {"w": 3}),
    "flex_softcap": (
        SPECS / "softcap_window.attn",
        flex.softcap_window,
        SIZES | {"w": 5, "c": 0.3, "query_pre_attn_scalar": 5},
    ),
    "flex_alibi": (SPECS / "alibi.attn", flex.alibi, SEPARATE),
    "flex_doc_mask": (SPECS / "doc_mask.attn", flex.doc_mask, SIZES),
}
CHUNKS = {"chunked_linear": chunked_linear, "retention": retention}
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def setup(name: str, n: int, monkeypatch, dtype=torch.float64):
    path, baseline, sizes = {**CASES, **FLEX}[name]
    if name in CHUNKS:  # several chunks and a ragged last one at these small lengths
        monkeypatch.setattr(CHUNKS[name], "CHUNK", 4)
    torch.manual_seed(0)
    spec = indexattn.compile_spec(path)
    module = spec.module(**sizes).to(dtype).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))  # no zero bias hides a layout mistake
    x = torch.randn(2, n, 24, dtype=dtype, requires_grad=True)
    documents = torch.tensor([0] * 3 + [1] * (n - 5) + [2] * 2)  # three, the first short
    ids = torch.stack((documents, documents.roll(2)))  # the second row starts inside one
    inputs = [ids if t.dtype == "int" else x for t in spec.ir.tensors_of("input")]
    return module, (lambda *a, p: baseline(*a, p, sizes)), inputs


@pytest.mark.parametrize("n", [8, 11])
@pytest.mark.parametrize("name", CASES)
def test_baseline_equals_the_generated_module(name, n, monkeypatch):
    module, baseline, inputs = setup(name, n, monkeypatch)
    params = dict(module.named_parameters())
    ours, theirs = module(*inputs), baseline(*inputs, p=params)
    torch.testing.assert_close(theirs, ours, atol=1e-12, rtol=0)
    probe = torch.randn_like(ours)
    wrt = [inputs[0], *params.values()]
    for g, g_ref in zip(
        torch.autograd.grad((theirs * probe).sum(), wrt),
        torch.autograd.grad((ours * probe).sum(), wrt),
        strict=True,
    ):
        torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)


@EAGER_FLEX
@pytest.mark.parametrize("n", [8, 11])
@pytest.mark.parametrize("name", FLEX)
def test_flex_baseline_equals_the_generated_module(name, n, monkeypatch):
    monkeypatch.setattr(flex, "attend", flex_attention)  # eager: float64, no compile
    module, baseline, inputs = setup(name, n, monkeypatch)
    params = dict(module.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(baseline(*inputs, p=params), module(*inputs), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", FLEX)
def test_compiled_flex_baseline_equals_the_generated_module(name, monkeypatch):
    module, baseline, inputs = setup(name, 11, monkeypatch, torch.float32)
    params = dict(module.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(baseline(*inputs, p=params), module(*inputs), atol=1e-5, rtol=0)


@EAGER_FLEX
@pytest.mark.parametrize("name", [*CASES, *FLEX])
def test_baseline_twin_sees_a_nudged_parameter(name, monkeypatch):
    monkeypatch.setattr(flex, "attend", flex_attention)
    module, baseline, inputs = setup(name, 11, monkeypatch)
    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    last = list(params)[-1]
    params[last] = params[last] + 0.05
    with torch.no_grad():
        assert (baseline(*inputs, p=params) - module(*inputs)).abs().max() > 1e-6


ROWS = {  # the scaling benchmark's blocked baselines, windows and caps that bite at these sizes
    "mha": SIZES,
    "sliding_window": SEPARATE | {"w": 5},
    "softcap_window": SIZES | {"w": 5, "c": 0.3, "query_pre_attn_scalar": 5},
    "alibi": SEPARATE,
    "t5_bias": SIZES,
    "doc_mask": SIZES,
    "attention_sinks": {"d_m": 24, "h_kv": 2, "n_rep": 2, "d_k": 6, "w": 5},
    "differential": {"d_m": 24, "h": 2, "d": 6},
}
UNSEEN = {  # benchmarks/baselines/unseen.py: the unseen combinations of benchmarks/unseen.py
    "rope_softcap_doc": ROTARY | {"cap": 0.3},
    "gqa_alibi_window_sinks": {"d_m": 24, "h_kv": 2, "n_rep": 2, "d_k": 6, "w": 5},
}


def row_blocks_case(name: str, monkeypatch, nudge: float = 0.0):
    """The module and the blocked baseline's output at N = 11, blocks of 4 queries (float64)."""
    monkeypatch.setattr(row_blocks, "BLOCK", 4)
    torch.manual_seed(0)
    shipped = name in ROWS
    folder, baselines, sizes = (SPECS, row_blocks, ROWS) if shipped else (BENCH, unseen, UNSEEN)
    spec = indexattn.compile_spec(folder / f"{name}.attn")
    module = spec.module(**sizes[name]).to(torch.float64).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(1, 11, 24, dtype=torch.float64, requires_grad=True)
    documents = torch.tensor([[0] * 3 + [1] * 6 + [2] * 2])  # a block starts inside one
    inputs = [documents if t.dtype == "int" else x for t in spec.ir.tensors_of("input")]
    params = dict(module.named_parameters())
    s = {**{c.ascii: c.value for c in spec.ir.scalars}, **(ROWS | UNSEEN)[name]}
    last = list(params)[-1]  # the twin's: the output projection, or a norm's or sink's weight
    moved = params[last] + nudge * torch.randn_like(
        params[last]
    )  # a uniform shift of T5's bias hides
    theirs = getattr(baselines, name)(*inputs, params | {last: moved}, s)
    return module, inputs, params, theirs


@pytest.mark.parametrize("name", [*ROWS, *UNSEEN])
def test_row_block_baseline_equals_the_generated_module(name, monkeypatch):
    module, inputs, params, theirs = row_blocks_case(name, monkeypatch)
    ours = module(*inputs)
    torch.testing.assert_close(theirs, ours, atol=1e-12, rtol=0)
    probe = torch.randn_like(ours)
    wrt = [inputs[0], *params.values()]
    for g, g_ref in zip(
        torch.autograd.grad((theirs * probe).sum(), wrt),  # through the per-block checkpoints
        torch.autograd.grad((ours * probe).sum(), wrt),
        strict=True,
    ):
        torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", [*ROWS, *UNSEEN])
def test_row_block_baseline_twin_sees_a_nudged_parameter(name, monkeypatch):
    module, inputs, _, theirs = row_blocks_case(name, monkeypatch, nudge=0.05)
    with torch.no_grad():
        assert (theirs - module(*inputs)).abs().max() > 1e-6
