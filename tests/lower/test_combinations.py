"""Issue 48, item 6: attention layers drawn at random from their features (lower/combinations.py),
each compiled and checked (1) against the literal interpreter at N = 24 with the blocks forced
small (four queries a block, the rows one or two queries at a time), in values and gradients,
float64; and (2) at N = 4096 (tiny widths: the scores dominate) for memory: no tensor the
forward or the training step makes, in any op, holds N² elements or more (a dispatch mode sees
every op's results, the backward's too). That is the property, checked where it holds, on
what runs: a program that made one N×N mask or one head's N×N scores fails it.

`COMBINATIONS=100 pytest tests/lower/test_combinations.py` runs seeds 0-99 (the suite: a few)."""

import os
import random
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import indexattn
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from combinations import draw

SEEDS = range(int(os.environ.get("COMBINATIONS", 4)))
SMALL = {"QUERY_BLOCK": 4, "BLOCK_SCORES": 1, "BLOCK_ROWS": 2}
SIZES = {"d_m": 8, "h": 2, "h_kv": 2, "n_rep": 2, "d_k": 4, "d_r": 2}


def compiled(seed: int, knobs: dict | None = None):
    c = draw(random.Random(seed))
    spec = indexattn.compile_spec(c.text, name=f"combination_{seed}")
    namespace = spec.function.__globals__
    for knob, value in (knobs or {}).items():
        if knob in namespace:
            namespace[knob] = value
    return c, spec


def arguments(spec, n: int, documents: torch.Tensor | None = None) -> tuple[dict, dict]:
    sizes = {k: v for k, v in SIZES.items() if k in spec.ir.size_asciis} | {"N": n}
    args = sample_arguments(spec.ir, sizes, (1,), torch.float64, seed=1)
    if "D" in args and documents is not None:
        args["D"] = documents
    given = {k: v for k, v in sizes.items() if k in spec.required}
    return {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}, given


def gradients(out: torch.Tensor, args: dict) -> tuple[torch.Tensor, ...]:
    leaves = [v for v in args.values() if v.requires_grad]
    return torch.autograd.grad(out.square().sum(), leaves)


def oracle_error(seed: int, documents: torch.Tensor | None = None) -> float:
    """The largest difference from the literal interpreter, in the output and the gradients."""
    _, spec = compiled(seed, SMALL)
    args, given = arguments(spec, 24, documents)
    got = spec(**args, **given)
    (want,) = reference.evaluate(spec.ir, **args, **given)
    errors = [(got - want).abs().max().item()]
    errors += [
        (a - b).abs().max().item() for a, b in zip(gradients(got, args), gradients(want, args))
    ]
    return max(errors)


class Largest(TorchDispatchMode):
    """The most elements of any tensor an op makes (views make none)."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info for r in func._schema.returns):
            made = out if isinstance(out, tuple | list) else (out,)
            sizes = [t.numel() for t in made if isinstance(t, torch.Tensor)]
            self.most = max([self.most, *sizes])
        return out


def largest(seed: int, n: int = 4096) -> tuple[int, int]:
    """The most elements of a tensor made in the forward (no gradients) and in a training step,
    at N = n, four documents."""
    _, spec = compiled(seed)
    documents = (torch.arange(n) * 4 // n)[None]
    args, given = arguments(spec, n, documents)
    args = {k: v.float() if v.is_floating_point() else v for k, v in args.items()}
    forward, step = Largest(), Largest()
    with torch.no_grad(), forward:
        spec(**args, **given)
    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    with step:
        spec(**leaves, **given).square().mean().backward()
    return forward.most, step.most


@pytest.mark.parametrize("seed", SEEDS)
def test_a_combination_equals_the_literal_reading(seed):
    assert oracle_error(seed) < 1e-10, draw(random.Random(seed)).name


def test_twin_a_changed_literal_reading_is_seen():
    """The twin: the same comparison against inputs the literal reading does not get (one
    document id changed) fails, for a combination that reads documents."""
    seed = next(s for s in range(100) if draw(random.Random(s)).documents)
    _, spec = compiled(seed, SMALL)
    args, given = arguments(spec, 24)
    changed = {**args, "D": args["D"].clone()}
    changed["D"][..., 5] = 1 - changed["D"][..., 5]
    (want,) = reference.evaluate(spec.ir, **changed, **given)
    assert (spec(**args, **given) - want).abs().max() > 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_a_combination_holds_no_n_squared_tensor(seed):
    n = 4096
    forward, step = largest(seed, n)
    name = draw(random.Random(seed)).name
    assert forward < n * n and step < n * n, f"{name}: {forward}, {step} elements"


def test_twin_an_n_squared_tensor_is_seen():
    """The twin: the check sees a program that makes one N×N mask (a mask read whole)."""
    n = 256
    with Largest() as seen:
        torch.where(torch.arange(n)[:, None] > torch.arange(n), -torch.inf, 0.0)
    assert seen.most == n * n
