"""specs/ssd.attn (Mamba-2's SSD, quadratic form) against the recurrence it is the dual of
and against ssd_minimal's einsum: values, gradients, counts and a twin, float64."""

from pathlib import Path

import torch
from reference.ssd import SSD, recurrence

import indexattn

SPEC = Path(__file__).resolve().parents[2] / "specs" / "ssd.attn"


def inputs(seed=0, h=2, n=9, p=3, s=4):
    g = torch.Generator().manual_seed(seed)
    x, b, c = (torch.randn(2, h, n, k, dtype=torch.float64, generator=g) for k in (p, s, s))
    a = -torch.rand(2, h, n, dtype=torch.float64, generator=g)  # dt · A ≤ 0
    return [t.requires_grad_() for t in (x, a, b, c)]


def grads(out, args):
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return torch.autograd.grad((out * weight).sum(), args)


def close(got, want):
    assert (got - want).abs().max() < 1e-12, (got - want).abs().max()


def test_ssd_equals_the_recurrence_and_the_einsum_in_values_and_gradients():
    spec, args = indexattn.compile_spec(SPEC), inputs()
    got = spec(**dict(zip(("X", "a", "B", "C"), args)))
    got_grads = grads(got, args)
    for want in (recurrence(*args), SSD()(*args)):
        close(got, want)
        for g, w in zip(got_grads, grads(want, args)):
            close(g, w)


def test_a_twin_with_one_decay_changed_differs():
    spec, args = indexattn.compile_spec(SPEC), inputs()
    changed = [t.detach().clone() for t in args]
    changed[1][0, 0, 3] -= 0.5  # one position forgets more
    got = spec(**dict(zip(("X", "a", "B", "C"), changed)))
    assert (got - recurrence(*args)).abs().max() > 1e-3
    close(got, recurrence(*changed))


def test_counts_are_quadratic_in_the_sequence():
    """No parameters; FLOPs (the plan's, chosen by sizes) four times as many at twice N."""
    spec = indexattn.compile_spec(SPEC)
    sizes = {str(s): s for s in spec.ir.sizes}
    at = {sizes["h"]: 8, sizes["d_head"]: 64, sizes["d_state"]: 128}
    flops = [spec.flops().subs({**at, sizes["N"]: n}) for n in (1024, 2048)]
    assert spec.param_count() == 0
    assert 3.9 < flops[1] / flops[0] < 4.1
