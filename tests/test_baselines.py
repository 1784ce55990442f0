"""The independent baselines of benchmarks/baselines/ compute what the specs compute: each
against the generated module in float64 (values and the gradients of the input and of every
parameter), at lengths that are and are not a multiple of the chunk; each with a twin that
changes one parameter on the baseline's side and sees the output move."""

import sys
from pathlib import Path

import pytest
import torch

import indexattn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from baselines import chunked_linear, fused_qkv, retention  # noqa: E402

SIZES = {"d_m": 24, "h": 3, "d_k": 8}
CASES = {
    "chunked_linear": (ROOT / "specs" / "linear_attention_causal.attn", chunked_linear.forward),
    "retention": (ROOT / "specs" / "retention.attn", retention.forward),
    "head_major": (ROOT / "specs" / "mha.attn", fused_qkv.head_major),
    "qkv_major": (ROOT / "benchmarks" / "specs" / "mha_qkv_major.attn", fused_qkv.qkv_major),
}
CHUNKS = {"chunked_linear": chunked_linear, "retention": retention}


def setup(name: str, n: int, monkeypatch):
    path, baseline = CASES[name]
    if name in CHUNKS:  # several chunks and a ragged last one at these small lengths
        monkeypatch.setattr(CHUNKS[name], "CHUNK", 4)
    torch.manual_seed(0)
    module = indexattn.compile_spec(path).module(**SIZES).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))  # no zero bias hides a layout mistake
    x = torch.randn(2, n, SIZES["d_m"], dtype=torch.float64, requires_grad=True)
    return module, baseline, x


@pytest.mark.parametrize("n", [8, 11])
@pytest.mark.parametrize("name", CASES)
def test_baseline_equals_the_generated_module(name, n, monkeypatch):
    module, baseline, x = setup(name, n, monkeypatch)
    params = dict(module.named_parameters())
    ours, theirs = module(x), baseline(x, params, SIZES["h"])
    torch.testing.assert_close(theirs, ours, atol=1e-12, rtol=0)
    probe = torch.randn_like(ours)
    wrt = [x, *params.values()]
    for g, g_ref in zip(
        torch.autograd.grad((theirs * probe).sum(), wrt),
        torch.autograd.grad((ours * probe).sum(), wrt),
        strict=True,
    ):
        torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_baseline_twin_sees_a_nudged_parameter(name, monkeypatch):
    module, baseline, x = setup(name, 11, monkeypatch)
    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    last = list(params)[-1]
    params[last] = params[last] + 0.05
    with torch.no_grad():
        assert (baseline(x, params, SIZES["h"]) - module(x)).abs().max() > 1e-6
