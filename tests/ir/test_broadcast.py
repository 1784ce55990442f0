"""Inputs whose batch axes differ: each is broadcast to the call's batch, as the language says,
whichever input carries the larger batch (a mask batched wider than the tokens included)."""

from pathlib import Path

import pytest
import torch

import indexattn
from indexattn.oracle import reference, verify

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted([*ROOT.glob("specs/*.attn"), *ROOT.glob("specs/models/*.attn")])


def _several_batched(path: Path) -> bool:
    return sum(t.batched for t in indexattn.compile_spec(path).ir.tensors_of("input")) > 1


BROADCAST = [p for p in SPECS if _several_batched(p)]


def _arguments(spec, wide: int) -> tuple[dict, dict]:
    """Sample arguments where batched input number `wide` has batch (3, 2) and the others
    (2,): the call's batch is (3, 2), carried by that input alone."""
    sizes = verify.sample_sizes(spec.ir)
    narrow = verify.sample_arguments(spec.ir, sizes, (2,))
    broad = verify.sample_arguments(spec.ir, sizes, (3, 2), seed=1)
    name = [t.ascii for t in spec.ir.tensors_of("input") if t.batched][wide]
    given = {k: v for k, v in sizes.items() if k in spec.required}
    return {**narrow, name: broad[name]}, given


@pytest.mark.parametrize("wide", [0, 1])
@pytest.mark.parametrize("path", BROADCAST, ids=lambda p: p.stem)
def test_one_input_carries_the_batch(path, wide):
    spec = indexattn.compile_spec(path)
    args, given = _arguments(spec, wide)
    got = verify._tuple(spec(**args, **given))
    want = reference.evaluate(spec.ir, **args, **given)
    for g, w in zip(got, want):
        assert g.shape[:2] == (3, 2)
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


def test_the_wide_input_is_read_per_batch_element():
    """Twin: the batch elements of the wide input give different outputs, so the comparison
    above cannot pass by reading one element only."""
    spec = indexattn.compile_spec(ROOT / "specs" / "dk_dv_mask.attn")
    args, given = _arguments(spec, 1)
    out = spec(**args, **given)
    assert not torch.allclose(out[0, 0], out[1, 0])
    assert BROADCAST  # the sweep above is not empty
