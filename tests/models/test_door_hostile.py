"""The transformers door, tried as a first hour would (issue 51): torch.compile of a model
traces the door's mask function (`layer_mask`) and meets no functools.cache there, where
Dynamo warns at each one ("Dynamo detected a call to a `functools.lru_cache`-wrapped
function", three per model before); a model configured with output_attentions is refused
when it is built, naming the fix, where its cores output no weights."""

import functools
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from indexattn.transformers import attention  # noqa: E402


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


def llama(**settings):
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=48, **settings,
    )  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="indexattn")


def test_output_attentions_in_the_config_is_refused_when_built():
    """Failed before: built, then NotImplementedError at the first forward."""
    with pytest.raises(NotImplementedError, match=r"output_attentions=True.*`output O, A`"):
        llama(output_attentions=True)


def test_twin_without_output_attentions_the_model_builds_and_runs():
    model = llama(output_attentions=False)
    ids = torch.randint(0, 40, (1, 5))
    assert model(input_ids=ids).logits.shape == (1, 5, 40)
