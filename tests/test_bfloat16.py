"""Every shipped spec's module runs in bfloat16 (module.to(torch.bfloat16), bfloat16 inputs)
and agrees with its float64 result to bfloat16's precision (8 bits of mantissa: 2^-8 ≈ 0.004
per rounding, a few roundings deep)."""

import pytest
import torch

from indexattn.oracle.verify import sample_arguments, sample_sizes

TOLERANCE = 0.02  # max |bf16 - f64| / (1 + max |f64|); float64 against itself gives 0


def run(spec, dtype, bump: bool = False, device="cpu"):
    sizes = sample_sizes(spec.ir)
    args = sample_arguments(spec.ir, sizes, (2,), torch.float64)
    module = spec.module(**sizes)
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    if bump:  # the twin: every entry of every parameter moved, far beyond bfloat16's error
        with torch.no_grad():  # (the last alone can be a small one: mta's kernel over scores)
            for weight in module.parameters():  # unevenly: softmax ignores a constant
                weight.add_(
                    torch.linspace(0, 2, weight.numel(), dtype=weight.dtype).view_as(weight)
                )
    module = module.to(device=device, dtype=dtype).eval()
    inputs = [args[t.ascii].to(device) for t in spec.ir.tensors_of("input")]
    out = module(*(x.to(dtype) if x.is_floating_point() else x for x in inputs))
    return (out[0] if isinstance(out, tuple) else out).double().cpu()


def error(got, want) -> float:
    return float((got - want).abs().max() / (1 + want.abs().max()))


def test_every_spec_runs_in_bfloat16_close_to_float64(shipped):
    want = run(shipped, torch.float64)
    got = run(shipped, torch.bfloat16)
    assert got.dtype == torch.float64 and error(got, want) < TOLERANCE


def test_twin_a_moved_weight_shows_beyond_the_tolerance(shipped):
    if not list(shipped.module(**sample_sizes(shipped.ir)).parameters()):
        pytest.skip("no parameter to move (simple, sdpa)")
    want = run(shipped, torch.float64)
    assert error(run(shipped, torch.bfloat16, bump=True), want) > TOLERANCE
