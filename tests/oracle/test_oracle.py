"""Every shipped spec: the generated code equals the literal interpreter (the oracle) in
float64 and float32, with 0, 1 and 2 leading batch axes, in values and in gradients."""

import pytest
import torch

from indexattn.oracle import reference
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes

# Generated code runs without a warning (torch.tensor of a tensor warns, for one).
pytestmark = pytest.mark.filterwarnings("error")
BATCHES = [(), (3,), (2, 3)]


@pytest.mark.parametrize("batch", BATCHES, ids=["unbatched", "batch1", "batch2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_generated_equals_literal(shipped, dtype, batch):
    result = compare(shipped, dtype, batch, seed=len(batch))
    assert result.ok, f"{shipped.name}: error {result.error:.2e} in {dtype}"


def _loss(outputs, weights):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return sum((o * w).sum() for o, w in zip(outputs, weights))


def test_gradients_equal_literal(shipped):
    sizes = sample_sizes(shipped.ir, seed=1)
    given = {k: v for k, v in sizes.items() if k in shipped.required}
    args = sample_arguments(shipped.ir, sizes, (2,), torch.float64, seed=3)
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    twins = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in args.items()}
    outputs = reference.evaluate(shipped.ir, **twins, **given)
    weights = [torch.randn_like(o) for o in outputs]
    _loss(shipped(**leaves, **given), weights).backward()
    _loss(outputs, weights).backward()
    for name in (k for k, v in args.items() if v.is_floating_point()):  # not integer ids
        assert leaves[name].grad is not None, f"no gradient reaches {name}"
        torch.testing.assert_close(
            leaves[name].grad,
            twins[name].grad,
            rtol=0,
            atol=1e-12,
            msg=f"{shipped.name}: gradient of {name}",
        )


def test_gradcheck_on_a_tiny_case(shipped):
    sizes = {k: 2 for k in sample_sizes(shipped.ir)}
    given = {k: v for k, v in sizes.items() if k in shipped.required}
    args = sample_arguments(shipped.ir, sizes, (), torch.float64, seed=5)
    names = list(args)

    def run(*tensors):
        return shipped(**dict(zip(names, tensors)), **given)

    inputs = tuple(args[n].requires_grad_(args[n].is_floating_point()) for n in names)
    assert torch.autograd.gradcheck(run, inputs, atol=1e-8)


def test_a_nan_where_the_literal_reading_has_one_agrees_and_only_there():
    """A row that is 0/0 read literally (every key hidden, softmax written out) is NaN in
    both: that is agreement; a NaN against a number, or a number against a NaN, is not."""
    from indexattn.oracle.verify import _error

    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert _error(nan, nan.clone()) == 0.0
    assert _error(nan, torch.tensor([0.0, 1.0], dtype=torch.float64)) == float("inf")
    assert _error(torch.tensor([0.0, 1.0], dtype=torch.float64), nan) == float("inf")
