"""The shape rules' straight-line function (sizes.straight_line), which a call of a new shape
runs in place of the rules' interpreter (a decode step brings a new length every token): the
same sizes wherever the interpreter finds them, None wherever it raises (then the interpreter
runs and says why), on every shipped spec; and a call's checks of dtypes and devices, made
once per kind, still refuse a tensor of another dtype at a new shape."""

import dataclasses

import pytest
import torch

import indexattn
from indexattn.errors import ShapeError
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.sizes import straight_line


def _shapes(spec, seed: int, batch: tuple[int, ...]) -> list[tuple[int, ...]]:
    sizes = sample_sizes(spec.ir, seed)
    args = sample_arguments(spec.ir, sizes, batch, seed=seed)
    return [tuple(args[name].shape) for name in spec.arguments]


def _interpreted(rules, shapes):
    """The interpreter's sizes, where they fit and the batched arguments share one batch (the
    straight line leaves a batch to widen to the interpreter and the call's `_widen`)."""
    try:
        sizes = rules.solve(shapes, {})
    except ShapeError:
        return None
    batched = [r for r in rules.ranks if r.batched]
    batches = {shapes[r.argument][: len(shapes[r.argument]) - r.rank] for r in batched}
    return sizes if len(batches) <= 1 else None


def _perturbed(shapes: list[tuple[int, ...]]):
    """Every shape with one axis one longer, one axis dropped, or one axis added in front (a
    batch axis of one argument alone, or a shape that does not fit)."""
    for k, shape in enumerate(shapes):
        for axis in range(len(shape)):
            longer = (*shape[:axis], shape[axis] + 1, *shape[axis + 1 :])
            yield [*shapes[:k], longer, *shapes[k + 1 :]]
        yield [*shapes[:k], shape[1:], *shapes[k + 1 :]]
        yield [*shapes[:k], (3, *shape), *shapes[k + 1 :]]


@pytest.mark.parametrize(("seed", "batch"), [(0, ()), (1, (2,))])
def test_the_straight_line_solves_as_the_rules_do(shipped, seed, batch):
    rules, straight = shipped.rules, straight_line(shipped.rules)
    shapes = _shapes(shipped, seed, batch)
    if rules.required:  # a size only a keyword gives: the interpreter, always
        assert straight(shapes) is None
        return
    assert straight(shapes) == rules.solve(shapes, {})
    for wrong in _perturbed(shapes):
        assert straight(wrong) == _interpreted(rules, wrong), wrong


def test_twin_a_rule_left_out_is_seen(shipped):
    """A check of an axis no size is read off, dropped from the rules, lets a wrong shape
    through the straight line, where the interpreter of the whole rules refuses it."""
    rules = shipped.rules
    read = {(r.argument, r.axis) for r in rules.reads}
    checks = [c for c in rules.checks if (c.argument, c.axis) not in read]
    if rules.required or not checks:
        pytest.skip("no check of an axis that no size is read off")
    kept = tuple(c for c in rules.checks if c != checks[0])
    fewer = straight_line(dataclasses.replace(rules, checks=kept))
    shapes = _shapes(shipped, 0, ())
    seen = [w for w in _perturbed(shapes) if fewer(w) != _interpreted(rules, w)]
    assert seen


def test_a_tree_from_a_cache_entry_is_never_run_as_code():
    spec = indexattn.compile_spec("specs/gqa_core.attn")
    read = spec.rules.reads[0]
    hostile = dataclasses.replace(read, divisor=("__import__('os').system('false')", 1, 1))
    rules = dataclasses.replace(spec.rules, reads=(hostile, *spec.rules.reads[1:]))
    assert straight_line(rules)(_shapes(spec, 0, ())) is None  # the interpreter's to say
    assert straight_line(spec.rules)(_shapes(spec, 0, ())) is not None  # the twin


def _decode_step(n_kv: int, dtype=torch.float32, values: int | None = None):
    q = torch.randn(1, 2, 4, 1, 8, dtype=dtype)
    k = torch.randn(1, 2, n_kv, 8, dtype=dtype)
    v = torch.randn(1, 2, n_kv if values is None else values, 8, dtype=dtype)
    return {"Q": q, "K": k, "V": v}


def test_a_new_length_each_call_is_checked_as_the_first():
    spec = indexattn.compile_spec("specs/gqa_unmasked_core.attn")
    for n_kv in (5, 6, 7):  # a decode step each: a new shape, the same kind
        out = spec(**_decode_step(n_kv), scaling=0.5)
        assert out.shape == (1, 2, 4, 1, 8)
    with pytest.raises(ShapeError, match=r"V_<gσc>, axis 1 \(σ\): expected size N_kv = 8, got 9"):
        spec(**_decode_step(8, values=9), scaling=0.5)
    mixed = _decode_step(10)
    mixed["V"] = mixed["V"].double()  # a kind checked once: a new one is checked again
    wrong = r"V is torch\.float64 on cpu, but it must be torch\.float32"
    with pytest.raises(ShapeError, match=wrong):
        spec(**mixed, scaling=0.5)
