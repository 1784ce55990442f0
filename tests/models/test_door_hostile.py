"""The transformers door, tried as a first hour would (issue 51): torch.compile of a model
traces the door's mask function (`layer_mask`) and meets no functools.cache there, where
Dynamo warns at each one ("Dynamo detected a call to a `functools.lru_cache`-wrapped
function", three per model before); a model configured with output_attentions is refused
when it is built, naming the fix, where its cores output no weights."""

import functools
import warnings

import pytest
import torch

import indexattn

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
        built = attention.handed("llama") != attention.handed("bigbird_pegasus")
        return x + 1 if built and attention.masks().sdpa_mask is not None else x - 1

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


WEIGHTS = """
index τ : N
index σ : N_kv
index g : h_kv
index r : n_rep
index a : d_k
index c : d_v
input  Q_<grτa>
input  K_<gσa>
input  V_<gσc>
input  M_<τσ>
scalar scaling = 0.125
S_<grτσ> = Q_<grτa> K_<gσa> scaling + M_<τσ>
A_<grτσ> = softmax_<σ>(S_<grτσ>)
O_<grτc> = A_<grτσ> V_<gσc>
output O, A
"""  # gqa_core's scores, its weights output too


def test_twin_configured_with_a_core_that_outputs_weights_it_builds_and_returns_them():
    """The refusal's twin, the core changed: one that outputs A builds under output_attentions
    and returns each layer's weights, sdpa's own softmax of the scores (rows summing to 1)."""
    from indexattn.transformers import register

    register("indexattn_door_weights", indexattn.compile_spec(WEIGHTS, name="weights_core"))
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=48, output_attentions=True,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="indexattn_door_weights"
    )
    (weights,) = model(input_ids=torch.randint(0, 40, (1, 5))).attentions
    assert weights.shape == (1, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 5))
    assert weights.triu(1).abs().max() == 0  # causal
    with pytest.raises(NotImplementedError, match=r"output_attentions=True.*`output O, A`"):
        model.set_attn_implementation("indexattn")  # switched to weightless cores: refused


def left_padded(config, implementation: str):
    """A tiny model from `config` (float64, random weights) under `implementation`, given a
    batch whose second row is left-padded by two, its loss over every token, padding's too (as
    labels=input_ids gives it): the loss, the logits and every weight's gradient."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    model.set_attn_implementation(implementation)
    ids = torch.randint(2, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    padding = torch.ones_like(ids)
    padding[1, :2] = 0
    out = model(input_ids=ids, attention_mask=padding, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.item(), out.logits.detach(), grads


def sdpa_families():
    return {
        "llama": transformers.LlamaConfig(
            vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=48,
        ),
        "gpt2": transformers.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4),
    }  # fmt: skip


def assert_same_run(got, want, tol=1e-12):
    """Loss, logits and every weight's gradient within `tol` of the reference's largest."""
    (loss, logits, grads), (loss_w, logits_w, grads_w) = got, want
    assert abs(loss - loss_w) <= tol * abs(loss_w), (loss, loss_w)
    assert (logits - logits_w).abs().max() <= tol * logits_w.abs().max()
    assert grads.keys() == grads_w.keys()
    for name, g in grads_w.items():
        assert (grads[name] - g).abs().max() <= tol * g.abs().max().clamp_min(1e-300), name


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_left_padded_row_is_sdpas_values_and_gradients(family):
    """Where the door stands in for sdpa (a family transformers runs with sdpa), a query that
    sees no key (a left padding's) gets sdpa's zeros: the loss over every token, the logits and
    every weight's gradient are sdpa's. Failed before: the core gave the mean of V there, as
    eager does (the loss 0.0093 off on Llama, 0.0018 on GPT-2)."""
    config = sdpa_families()[family]
    assert_same_run(left_padded(config, "indexattn"), left_padded(config, "sdpa"))


def test_twin_eager_differs_from_the_door_only_at_the_padded_rows():
    """The same GPT-2 under eager: its padded rows take the mean of V (eager's mask hides by the
    dtype's minimum), so the door, sdpa's, is off there and only there."""
    config = sdpa_families()["gpt2"]
    (_, ours, _), (_, eager, _) = left_padded(config, "indexattn"), left_padded(config, "eager")
    apart = (ours - eager).abs().amax(-1)
    assert apart[1, :2].min() > 1e-3
    assert apart[0].max() <= 1e-10 and apart[1, 2:].max() <= 1e-10


def bigbird_padded(implementation: str):
    """A tiny BigBirdPegasus decoder's logits (float32) on a batch whose second row is
    left-padded by two. transformers runs BigBirdPegasus without sdpa (5.0 to 5.24)."""
    config = transformers.BigBirdPegasusConfig(
        vocab_size=40, d_model=32, decoder_layers=2, decoder_attention_heads=4,
        decoder_ffn_dim=48, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BigBirdPegasusForCausalLM(config).eval()
    model.set_attn_implementation(implementation)
    ids = torch.randint(2, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    padding = torch.ones_like(ids)
    padding[1, :2] = 0
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=padding).logits


def test_a_family_run_with_eager_keeps_eagers_mean_of_v():
    """Where transformers runs the family without sdpa (BigBirdPegasus), the door stands in for
    eager: it is handed eager's mask, and a left-padded row keeps eager's mean of V."""
    assert attention.handed("bigbird_pegasus") == attention.EAGER
    ours, eager = bigbird_padded("indexattn"), bigbird_padded("eager")
    torch.testing.assert_close(ours, eager, atol=1e-5, rtol=0)


def test_twin_handed_sdpas_mask_the_padded_rows_are_zeros(monkeypatch):
    """The same BigBirdPegasus handed sdpa's mask (as if transformers ran it with sdpa): its
    padded rows are zeros, off eager's there and only there."""
    monkeypatch.setitem(attention.HANDED, "bigbird_pegasus", attention.SDPA)
    apart = (bigbird_padded("indexattn") - bigbird_padded("eager")).abs().amax(-1)
    assert apart[1, :2].min() > 1e-3
    assert apart[0].max() <= 1e-5 and apart[1, 2:].max() <= 1e-5
