"""torch.compile of a model through the transformers door traces the door's mask function
(`layer_mask`): it meets no functools.cache there, where Dynamo warns at each one ("Dynamo
detected a call to a `functools.lru_cache`-wrapped function", three per model before)."""

import functools
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from indexattn.transformers import attention


def traced_warnings(function) -> list[str]:
    """The warnings Dynamo gives tracing `function` once."""
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(function, backend="eager")(torch.ones(2))
    return [str(w.message) for w in caught if "Dynamo" in str(w.message)]


@pytest.mark.slow
def test_the_mask_functions_memos_trace_without_warnings():
    def door(x):
        built = attention.builds_mask("llama") or attention.builds_mask("bigbird_pegasus")
        return x + 1 if built and attention.sdpa_mask() is not None else x - 1

    assert traced_warnings(door) == []


@pytest.mark.slow
def test_twin_a_functools_cache_in_the_trace_warns():
    memo = functools.cache(attention.runs_sdpa)

    def door(x):
        return x + 1 if memo("llama") else x - 1

    assert any("lru_cache" in w for w in traced_warnings(door))
