"""context_parallel_model on every mask kind the transformers door takes: tiny Mistral (a window
on every layer), Gemma 2 (sliding and global layers, soft caps), Gemma 3 (sliding and global
layers), GPT-OSS (sinks, sliding and full layers), Llama 4 (chunked and full layers), Qwen2
(sliding and full layers, biases on q, k and v), Cohere2 (sliding and full layers, a layer
norm), OLMo 3 (sliding and full layers, queries and keys normed), and causal GPT-2 (learned
positions), DeepSeek V3 (latent attention), GPT-NeoX (partial rotary) and SmolLM3 (a layer
without rotary) on 2 CPU processes (gloo, float64), against the same model in one process (eager);
tests/context_families_worker.py runs every check in one launch. Without processes: the core
each layer kind gets, and the kinds refused by name."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_distributed import _largest, launch

pytest.importorskip("transformers")

from indexattn.transformers.context import Kind, _refuse, kind_of

WORKER = Path(__file__).resolve().parents[1] / "context_families_worker.py"
TIMEOUT = 600  # a bound on a hang: twelve families, both strategies, on the loaded 2-core machine
EXACT, CHANGED = 1e-12, 1e-6  # float64: equal to rounding; a twin differs by more


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(WORKER, 2, tmp_path_factory.mktemp("cpfamilies"), TIMEOUT)


SPLIT = [
    f"{family}_{strategy}"
    for family in (
        *("mistral", "gemma2", "gemma3", "gpt_oss", "llama4", "qwen2", "cohere2", "olmo3"),
        *("gpt2", "deepseek_v3", "gpt_neox", "smollm3"),
    )
    for strategy in ("ring", "ulysses")
]
TWINS = [
    "mistral_window_twin",
    "gemma2_global_twin",
    "gemma3_window_twin",
    "gpt_oss_sinks_twin",
    "llama4_chunk_twin",
    "qwen2_window_twin",
    "cohere2_global_twin",
    "olmo3_global_twin",
    "gpt2_windowed_twin",
    "deepseek_v3_windowed_twin",
    "gpt_neox_windowed_twin",
    "smollm3_windowed_twin",
]


@pytest.mark.parametrize("name", SPLIT)
def test_logits_and_every_gradient_equal_one_process(ranks, name):
    gaps = _largest(ranks, name)  # this rank's block of the logits; gradients summed over ranks
    assert all(g < EXACT for g in gaps.values()), gaps


@pytest.mark.parametrize("name", TWINS)
def test_twin_one_layer_kind_changed_on_one_rank_changes_the_result(ranks, name):
    gaps = _largest(ranks, name)
    assert gaps["out"] > CHANGED and gaps["grad"] > CHANGED, gaps


# -- without processes: the kind each layer's call asks for, and its core


def layer(layer_types=None, idx=0, **config) -> torch.nn.Module:
    module = torch.nn.Linear(1, 1)
    module.layer_idx, module.config = idx, SimpleNamespace(layer_types=layer_types, **config)
    return module


ALTERNATING = ["sliding_attention", "full_attention"]


@pytest.mark.parametrize(
    ("module", "given", "kind", "core"),
    [
        (layer(), {}, Kind(), "gqa_causal_core.attn"),
        (layer(), {"sliding_window": 4}, Kind(window=4), "gqa_window_core.attn"),
        (layer(ALTERNATING), {"sliding_window": 4}, Kind(window=4), "gqa_window_core.attn"),
        (layer(ALTERNATING, 1), {"sliding_window": None}, Kind(), "gqa_causal_core.attn"),
        (
            layer(ALTERNATING, 1),
            {"softcap": 2.0},
            Kind(softcap=2.0),
            "softcap_window_core.attn",
        ),
        (layer(), {"s_aux": torch.zeros(4)}, Kind(sinks=True), "sinks_window_core.attn"),
        (
            layer(["chunked_attention"], attention_chunk_size=5),
            {},
            Kind(chunk=5),
            "gqa_chunked_core.attn",
        ),
    ],
)
def test_each_layer_kind_gets_its_core_with_the_layers_values(module, given, kind, core):
    found = kind_of(module, given)
    assert found == kind and found.core() == core


def test_a_global_layer_of_a_windowed_core_sees_every_key_before_it():
    assert Kind(softcap=2.0).scalars(0.5) == {
        "scaling": 0.5,
        "softcap": 2.0,
        "sliding_window": math.inf,
    }
    assert Kind().scalars(0.5) == {"scaling": 0.5}  # the twin: the causal core has no window


@pytest.mark.parametrize(
    ("module", "given", "said"),
    [
        (layer(["linear_attention"]), {}, r"layer 0\) is a 'linear_attention' layer"),
        (layer(ALTERNATING), {}, "is a 'sliding_attention' layer and passes sliding_window=None"),
        (layer(ALTERNATING, 1), {"sliding_window": 3}, "the mask transformers builds and"),
        (
            layer(),
            {"softcap": 2.0, "s_aux": torch.zeros(4)},
            r"asks for Kind\(window=None, chunk=None, softcap=2.0, sinks=True\)",
        ),
        (
            layer(["chunked_attention"], attention_chunk_size=5),
            {"sliding_window": 3},
            "no core a context-parallel model runs takes all of that at once",
        ),
    ],
)
def test_a_kind_no_core_splits_is_refused_naming_the_layer_and_the_kind(module, given, said):
    with pytest.raises(NotImplementedError, match=said):
        kind_of(module, given)


def test_positions_counted_in_a_block_and_a_mask_tensor_are_refused():
    module = layer()
    module.attn_temperature_tuning, module.use_rope = True, False
    with pytest.raises(NotImplementedError, match="set the config's attn_temperature_tuning"):
        _refuse(module, None, {})
    module.use_rope = True  # the twin: a layer with rotary reads global positions
    _refuse(module, None, {})
    with pytest.raises(NotImplementedError, match=r"mask of shape \(2, 4, 3, 3\).*Doge's"):
        _refuse(module, torch.zeros(2, 4, 3, 3), {})
