"""attn_implementation="indexattn": a core spec as transformers' attention function.

Tiny models of seven families built from configs with random weights (nothing downloaded),
float64. The reference is the same model with attn_implementation="eager", its softmax kept in
float64 (transformers' eager softmax upcasts to float32; `float64_softmax`); everything but the
attention core (projections, rotary tables, norms, experts) is the same code in both runs.
Gemma 2 (soft-capped scores, sliding layers) and GPT-OSS (sinks, sliding layers) run the same
one line: "indexattn" picks the shipped core that takes what the layer hands over
(specs/softcap_core.attn, specs/sinks_core.attn).
"""

import pytest
import torch
from models_common import ROOT, randomise
from packaging.version import Version

import indexattn

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")
# imported before `float64_softmax` patches softmax: transformers 5.0 scripts functions in it
from transformers.models.gpt_bigcode import modeling_gpt_bigcode  # noqa: E402

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

B, N, NEW = 2, 6, 8
WINDOW = 3  # shorter than the prompt: the sliding layers' masks hide keys

CORE_INPUTS = """
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
"""  # what every core reads (transformers' query, key, value, mask and scaling)

WEIGHTS_CORE = (
    CORE_INPUTS
    + """
S_<grτσ> = Q_<grτa> K_<gσa> scaling + M_<τσ>
A_<grτσ> = softmax_<σ>(S_<grτσ>)
O_<grτc> = A_<grτσ> V_<gσc>

output O, A
"""
)

hf.register("indexattn_gqa", hf.shipped("gqa_core.attn"))  # the default core alone
hf.register("indexattn_softcap", hf.shipped("softcap_core.attn"))
hf.register("indexattn_weights", indexattn.compile_spec(WEIGHTS_CORE, name="weights_core"))

SMALL = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "eos_token_id": None, "attention_dropout": 0.0,
}  # fmt: skip

GEMMA2 = {
    "head_dim": 8, "sliding_window": WINDOW, "query_pre_attn_scalar": 10,
    "attn_logit_softcapping": 2.0, "final_logit_softcapping": None,
}  # fmt: skip
GPT_OSS = {
    "head_dim": 8, "sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1,
    "intermediate_size": 16,
}  # fmt: skip
EAGER = {"attn_implementation": "eager", "experts_implementation": "eager"}

FAMILIES = {  # config class, its extra settings, the attn_implementation that runs it
    "llama": ("LlamaConfig", {}, "indexattn"),
    "qwen2": ("Qwen2Config", {}, "indexattn"),
    "mixtral": ("MixtralConfig", {"num_local_experts": 2, "num_experts_per_tok": 1}, "indexattn"),
    "phi3": ("Phi3Config", {"pad_token_id": 0}, "indexattn"),
    "olmo2": ("Olmo2Config", {}, "indexattn"),
    "gemma2": ("Gemma2Config", GEMMA2, "indexattn"),  # specs/softcap_core.attn
    "gpt_oss": ("GptOssConfig", GPT_OSS, "indexattn"),  # specs/sinks_core.attn
}
# Falcon's layers call transformers' attention functions from 5.25 on (before: `BYPASSING`)
FALCON_CALLS = Version(transformers.__version__) >= Version("5.25")
FALCON = {  # Falcon-7B's layout (one key/value head, rotary); Falcon-40B's with ALiBi instead
    "falcon": ("FalconConfig", {"multi_query": True}, "indexattn"),
    "falcon_alibi": (
        "FalconConfig", {"new_decoder_architecture": True, "num_kv_heads": 2, "alibi": True},
        "indexattn",
    ),
}  # fmt: skip
if FALCON_CALLS:
    FAMILIES |= FALCON


@pytest.fixture(autouse=True)
def float64_softmax(monkeypatch):
    """The eager reference without its float32 softmax (softmax(..., dtype=torch.float32))."""
    softmax = torch.nn.functional.softmax

    def softmax_as_is(x, dim=None, dtype=None, **kw):
        return softmax(x, dim=dim, **kw)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_as_is)


def model_of(family: str, **settings):
    """The family's tiny causal LM in float64 and eval mode, eager attention, random weights."""
    config_class, extra, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SMALL, **extra, **settings, **EAGER})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return randomise(model).double().eval()


def prompt(n: int = N):
    """Two prompts, the second left-padded by two tokens."""
    ids = torch.randint(1, 40, (B, n), generator=torch.Generator().manual_seed(2))
    padding = torch.ones_like(ids)
    padding[1, :2] = 0
    return ids, padding


def logits(model, ids, padding):
    """The logits, the rows of padding queries zeroed (`unpadded`)."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=padding, use_cache=False).logits
    return unpadded(out, padding)


def unpadded(rows, padding):
    """`rows` [batch, N, ...] with a padding query's zeroed: it sees no key, and gets what the
    implementation gives such a query (sdpa's zeros, eager's mean of V; the door's: the one it
    stands in for, tests/models/test_door_hostile.py)."""
    return rows.masked_fill((padding == 0).reshape(*padding.shape, *[1] * (rows.dim() - 2)), 0)


def assert_relative(got, want, tol=1e-10):
    """Equal within `tol` of the reference's largest magnitude."""
    error, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert error <= tol * scale, f"error {error:.2e}, relative to {scale:.2e}"


@pytest.fixture
def counted(monkeypatch):
    """Starts counting a registered core spec's calls (the queries of each); undone after."""
    from transformers import AttentionInterface

    def start(name):
        function, seen = AttentionInterface._global_mapping[name], []
        for core in getattr(function, "cores", [function]):
            monkeypatch.setattr(core, "spec", Spy(core.spec, lambda _, q: seen.append(q.shape[-2])))
        return seen

    return start


class Spy:
    """A core's spec whose calls `record(spec, queries)` sees first."""

    def __init__(self, spec, record) -> None:
        self.spec, self.record = spec, record

    def in_order(self, tensors, scalars, *, training):
        self.record(self.spec, tensors[0])
        return self.spec.in_order(tensors, scalars, training=training)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_are_eager_s(family, counted):
    model = model_of(family)
    ids, padding = prompt()
    want = logits(model, ids, padding)
    implementation = FAMILIES[family][2]
    model.set_attn_implementation(implementation)
    seen = counted(implementation)
    got = logits(model, ids, padding)
    assert seen == [N] * 2  # the core ran in both layers
    assert_relative(got, want)
    model.set_attn_implementation("eager")  # and back: the model is unchanged
    assert_relative(logits(model, ids, padding), want, tol=0)


def test_the_models_own_loss_keywords_go_through_to_the_loss():
    """Trainer's num_items_in_batch and a shift_labels reach every layer's attention call too;
    the loss is sdpa's (float32, as transformers computes it). The twin: another count."""
    model = model_of("llama")
    model.set_attn_implementation("sdpa")
    ids, _ = prompt()
    given = {"labels": ids, "shift_labels": ids.roll(-1, 1), "use_cache": False}

    def loss(count):
        return model(input_ids=ids, **given, num_items_in_batch=torch.tensor(count)).loss

    want = loss(ids.numel())
    model.set_attn_implementation("indexattn")
    assert_relative(loss(ids.numel()), want, tol=1e-6)
    assert (loss(ids.numel() - 1) - want).abs() > 1e-3 * want.abs()


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_a_flipped_mask_bit_and_a_nudged_scale_are_caught(family):
    """The twins: a padding bit set, a layer's scale nudged by 1e-6, each moves the logits."""
    model = model_of(family)
    ids, padding = prompt()
    want = logits(model, ids, padding)
    model.set_attn_implementation(FAMILIES[family][2])
    flipped = padding.clone()
    flipped[1, 1] = 1
    with pytest.raises(AssertionError):
        assert_relative(logits(model, ids, flipped), want)
    layer = model.model.layers[0].self_attn
    layer.scaling += 1e-6
    with pytest.raises(AssertionError):
        assert_relative(logits(model, ids, padding), want)


def generate(model, ids, padding):
    """Greedy decoding with the cache on; the tokens, and every step's logits (float64)."""
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=padding, max_new_tokens=NEW, do_sample=False, use_cache=True,
            pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_the_cache_gives_eager_s_tokens(family, counted):
    model = model_of(family)
    ids, padding = prompt()
    tokens, steps = generate(model, ids, padding)
    implementation = FAMILIES[family][2]
    model.set_attn_implementation(implementation)
    seen = counted(implementation)
    tokens_ours, steps_ours = generate(model, ids, padding)
    assert seen == [N] * 2 + [1] * 2 * (NEW - 1)  # the prompt, then one query per step
    assert tokens.shape == (B, N + NEW)
    assert torch.equal(tokens_ours, tokens)
    assert_relative(steps_ours, steps)


@pytest.mark.parametrize("family", ["llama", "mixtral", "gemma2", "gpt_oss"])
def test_gradients_are_eager_s(family):
    """Training mode (no dropout): the loss's gradients of every weight. The loss leaves out
    the padding's positions: a padding query sees no key, and the gradient through such a row
    is each kernel's own convention (sdpa's is not eager's)."""
    model = model_of(family).train()
    ids, padding = prompt()
    labels = ids.masked_fill(padding == 0, -100)
    labels[:, 1:][padding[:, :-1] == 0] = -100  # predicted at a padding position

    def gradients():
        model.zero_grad()
        model(input_ids=ids, attention_mask=padding, labels=labels, use_cache=False).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = gradients()
    model.set_attn_implementation(FAMILIES[family][2])
    got = gradients()
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        assert_relative(got[name], want[name], tol=1e-9)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_dropout_is_the_core_spec_s(family):
    """Each shipped core declares dropout: in training, with one seed, it draws eager's masks
    (torch's dropout on weights of the same shape), so the logits are equal; in eval none is
    drawn (the twin)."""
    model = model_of(family, attention_dropout=0.3).train()
    ids, padding = prompt()

    def train_logits():
        torch.manual_seed(5)
        out = model(input_ids=ids, attention_mask=padding, use_cache=False).logits.detach()
        return unpadded(out, padding)

    want = train_logits()
    model.set_attn_implementation("indexattn")
    assert_relative(train_logits(), want)
    with pytest.raises(AssertionError):
        assert_relative(logits(model.eval(), ids, padding), want)


def test_a_keyword_the_core_spec_lacks_is_refused_by_name():
    """gqa_core alone refuses Gemma 2's cap and GPT-OSS's sinks; a core without dropout refuses
    dropout; softcap_core alone refuses a layer with no cap."""
    gemma, oss = model_of("gemma2"), model_of("gpt_oss")
    ids, padding = prompt()
    for model, keyword in ((gemma, "softcap=2.0"), (oss, "s_aux=a tensor")):
        model.set_attn_implementation("indexattn_gqa")
        with pytest.raises(NotImplementedError, match=keyword):
            logits(model, ids, padding)
    dropping = model_of("llama", attention_dropout=0.1).train()
    dropping.set_attn_implementation("indexattn_weights")
    with pytest.raises(NotImplementedError, match=r"dropout=0\.1.*declares no p"):
        dropping(input_ids=ids, use_cache=False)
    llama = model_of("llama")
    llama.set_attn_implementation("indexattn_softcap")
    with pytest.raises(NotImplementedError, match="passes no softcap"):
        logits(llama, ids, padding)


def test_an_unknown_keyword_is_an_error_naming_it():
    layer = model_of("llama").model.layers[0].self_attn
    q, k = torch.randn(B, 4, N, 8), torch.randn(B, 2, N, 8)
    with pytest.raises(TypeError, match="block_indices"):  # MiniMax-M3's
        hf.CORE(layer, q, k, k, None, scaling=0.3, block_indices=torch.zeros(1))
    out, weights = hf.CORE(layer, q, k, k, None, scaling=0.3, position_ids=None)
    assert out.shape == (B, N, 4, 8) and weights is None
    layer.train()  # no dropout keyword: none applied, in training too
    assert torch.equal(hf.CORE(layer, q, k, k, None, scaling=0.3)[0], out)


def test_a_spec_that_is_not_a_core_is_refused():
    with pytest.raises(ValueError, match=r"not an attention core.*its inputs are X"):
        hf.register("broken", ROOT / "specs/gqa.attn")
    three = "index τ : N\nindex σ : N_kv\nindex a : d\ninput Q_<τa>\ninput K_<σa>\ninput M_<τσ>\n"
    three += "scalar scaling = 1\nO_<τσ> = softmax_<σ>(Q_<τa> K_<σa> scaling + M_<τσ>)\noutput O"
    with pytest.raises(ValueError, match=r"its inputs are Q, K, M, in this order"):  # no V
        hf.register("broken", three)


def test_the_core_spec_runs_under_torch_compile():
    """torch.compile (the aot_eager backend: dynamo's graph and autograd's, no C++ build) of a
    model running "indexattn": eager's logits and gradients, and the core inside a graph."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model = model_of("llama")
    ids, padding = prompt()
    labels = ids.masked_fill(padding == 0, -100)
    labels[:, 1:][padding[:, :-1] == 0] = -100

    def loss_and_grad(forward):
        model.zero_grad()
        out = forward(input_ids=ids, attention_mask=padding, labels=labels, use_cache=False)
        out.loss.backward()
        logits = unpadded(out.logits.detach(), padding)
        return logits, model.model.layers[0].self_attn.q_proj.weight.grad.clone()

    want = loss_and_grad(model)
    model.set_attn_implementation("indexattn")
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    got = loss_and_grad(torch.compile(model, backend=counter))
    assert counter.frame_count >= 1 and counter.op_count > 0
    for g, w in zip(got, want):
        assert_relative(g, w)


def tiny(config_class: str, implementation: str, **settings):
    """A tiny model of a family outside FAMILIES, built with `implementation`."""
    sizes = {"vocab_size": 40, "hidden_size": 32, "num_hidden_layers": 2, **settings}
    config = getattr(transformers, config_class)(**sizes)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)


BYPASSING = {  # families whose layers never call transformers' attention functions
    "bloom": ("BloomConfig", {"n_head": 4}),
    **({} if FALCON_CALLS else {"falcon": ("FalconConfig", {"num_attention_heads": 4})}),
}


@pytest.mark.skipif(not FALCON_CALLS, reason="Falcon computes its own attention before 5.25")
def test_falcon_s_alibi_reaches_the_core_in_its_mask(monkeypatch):
    """Falcon-40B-like layers with ALiBi hand the bias over in the mask, one per head: the
    logits are eager's (test_logits_are_eager_s). The twin: the core handed the mask's −∞
    pattern alone, the bias dropped, gives other logits."""
    from transformers import AttentionInterface

    model = model_of("falcon_alibi")
    ids, padding = prompt()
    want = logits(model, ids, padding)
    model.set_attn_implementation("indexattn")
    assert_relative(logits(model, ids, padding), want)
    function = AttentionInterface._global_mapping["indexattn"]

    def unbiased(module, query, key, value, mask, **kwargs):
        assert mask.dtype == torch.float64 and mask.shape[1] == 4  # a mask per head
        hidden = mask.masked_fill(mask > torch.finfo(mask.dtype).min / 2, 0)
        return function(module, query, key, value, hidden, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "indexattn", unbiased)
    with pytest.raises(AssertionError):
        assert_relative(logits(model, ids, padding), want)


@pytest.mark.parametrize("family", BYPASSING)
def test_a_model_whose_layers_bypass_the_interface_is_refused_when_built(family):
    """Bloom would run its own attention under "indexattn", Falcon raise KeyError: 'indexattn'.
    The twin: the same model builds with eager attention, and Llama builds with indexattn."""
    config_class, settings = BYPASSING[family]
    with pytest.raises(ValueError, match=r"compute their own attention.*would not run indexattn"):
        tiny(config_class, "indexattn", **settings)
    assert tiny(config_class, "eager", **settings).config._attn_implementation == "eager"
    llama = tiny("LlamaConfig", "indexattn", num_attention_heads=4, intermediate_size=48)
    assert llama.config._attn_implementation == "indexattn"


@pytest.mark.parametrize("family", BYPASSING)
def test_switching_a_bypassing_model_to_indexattn_is_refused(family):
    """set_attn_implementation("indexattn") would log a warning and stay as it was. The twin:
    Llama switches."""
    config_class, settings = BYPASSING[family]
    model = tiny(config_class, "eager", **settings)
    with pytest.raises(ValueError, match="never call transformers' attention functions"):
        model.set_attn_implementation("indexattn")
    assert model.config._attn_implementation == "eager"
    llama = model_of("llama")
    llama.set_attn_implementation("indexattn")
    assert llama.config._attn_implementation == "indexattn"


UNUSED = {  # families transformers lets set "indexattn", where it would never run: why
    "mamba": ("MambaConfig", {"state_size": 4}, "has no attention layers"),
    "git": (
        "GitConfig",
        {"num_attention_heads": 4, "intermediate_size": 48, "vision_config": {
            "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 48, "image_size": 32, "patch_size": 16,
        }},
        "compute their own attention",
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", UNUSED)
def test_a_model_where_indexattn_would_never_run_is_refused_when_built_or_switched(family):
    """transformers builds Mamba (no attention at all) and GIT (text layers computing their own)
    with "indexattn" and runs them without it, saying nothing. The twin: the same model builds
    with eager attention, and Llama builds and switches to indexattn."""
    config_class, settings, why = UNUSED[family]
    with pytest.raises(ValueError, match=why):
        tiny(config_class, "indexattn", **settings)
    model = tiny(config_class, "eager", **settings)
    with pytest.raises(ValueError, match=why):
        model.set_attn_implementation("indexattn")
    assert model.config._attn_implementation == "eager"
    llama = tiny("LlamaConfig", "indexattn", num_attention_heads=4, intermediate_size=48)
    llama.set_attn_implementation("eager")
    llama.set_attn_implementation("indexattn")
    assert llama.config._attn_implementation == "indexattn"


def test_output_attentions_returns_the_weights_or_is_refused():
    """A core that outputs no weights refuses output_attentions=True (it returned an empty
    tuple); one that outputs A returns eager's weights, but a padding query's: zeros, as its
    output is (sdpa's, which the door stands in for). The twin: another padding moves them."""
    model = model_of("llama")
    ids, padding = prompt()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=padding, output_attentions=True).attentions
    model.set_attn_implementation("indexattn")
    with pytest.raises(NotImplementedError, match=r"output_attentions=True.*outputs no weights"):
        model(input_ids=ids, attention_mask=padding, output_attentions=True)
    model.set_attn_implementation("indexattn_weights")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=padding, output_attentions=True).attentions
        other = model(input_ids=ids, output_attentions=True).attentions
    assert len(got) == len(want) == 2
    for g, w, o in zip(got, want, other):
        assert g.shape == w.shape == (B, 4, N, N)
        assert_relative(unpadded(g.transpose(1, 2), padding), unpadded(w.transpose(1, 2), padding))
        assert g[1, :, :2].abs().max() == 0 < w[1, :, :2].abs().min()
        with pytest.raises(AssertionError):
            assert_relative(o, w)


RELOAD = """
import json, sys, transformers
from transformers import AutoModelForCausalLM
saved, plain = sys.argv[1:]
seen = {}
try:
    AutoModelForCausalLM.from_pretrained(saved)
except ValueError as error:
    seen["without"] = str(error)
seen["plain"] = AutoModelForCausalLM.from_pretrained(plain).config._attn_implementation
import indexattn.transformers
seen["with"] = AutoModelForCausalLM.from_pretrained(saved).config._attn_implementation
print(json.dumps(seen))
"""


def same_imports() -> dict[str, str]:
    """This process's environment with PYTHONPATH made absolute, so that a child started in
    another folder imports the same transformers (CI puts a relative folder first on the path)."""
    import os

    folders = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    absolute = os.pathsep.join(os.path.abspath(folder) for folder in folders if folder)
    return {**os.environ, "PYTHONPATH": absolute}


def reads_saved_implementation() -> bool:
    """Whether this transformers reads a config.json's attn_implementation (5.0 drops it)."""
    return (
        transformers.LlamaConfig.from_dict({"attn_implementation": "x"})._attn_implementation == "x"
    )


def test_a_saved_indexattn_model_reloads_as_indexattn_or_says_what_to_import(tmp_path):
    """In a new process: without the import, transformers' error says `import
    indexattn.transformers` (its config.json keeps the implementation, where transformers keeps
    none and the model came back on sdpa); with it, the model is indexattn again. The twin: the
    same model saved with sdpa loads without the import."""
    import json
    import subprocess
    import sys

    model = model_of("llama")
    model.save_pretrained(tmp_path / "plain")
    model.set_attn_implementation("indexattn")
    model.save_pretrained(tmp_path / "saved")
    run = subprocess.run(
        [sys.executable, "-c", RELOAD, str(tmp_path / "saved"), str(tmp_path / "plain")],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path, env=same_imports(),
    )  # fmt: skip
    seen = json.loads(run.stdout.splitlines()[-1])
    if not reads_saved_implementation():  # transformers 5.0: from_dict sets it to None
        assert seen == {"plain": "sdpa", "with": "sdpa"}
        return
    assert "import indexattn.transformers" in seen.get("without", "")
    assert seen["plain"] == "sdpa" and seen["with"] == "indexattn"  # eager is not kept


def test_a_plainly_causal_mask_reaches_the_core_as_a_predicate(monkeypatch):
    """Registered with sdpa's mask function: an unpadded prompt hands the layers no mask, and
    the core that is causal by a predicate (gqa_causal_core: sdpa's is_causal) runs, giving
    eager's logits; the twin: a left-padded prompt hands over a mask, and gqa_core runs."""
    from transformers import AttentionInterface

    ran = []
    for core in AttentionInterface._global_mapping["indexattn"].cores:
        monkeypatch.setattr(core, "spec", Spy(core.spec, lambda spec, _: ran.append(spec.name)))
    model = model_of("llama")
    ids, padding = prompt()
    for mask, core in ((torch.ones_like(padding), "gqa_causal_core"), (padding, "gqa_core")):
        model.set_attn_implementation("eager")
        want = logits(model, ids, mask)
        model.set_attn_implementation("indexattn")
        ran.clear()
        assert_relative(logits(model, ids, mask), want)
        assert ran == [core] * 2


def test_a_decode_step_reaches_the_core_unmasked(monkeypatch):
    """One new query after its cache, no padding: transformers hands no mask, and the core with
    none (gqa_unmasked_core: sdpa without a mask) runs every step after the prompt, giving
    eager's tokens and logits; the twin: a left-padded batch hands a mask, and gqa_core runs."""
    from transformers import AttentionInterface

    ran = []
    for core in AttentionInterface._global_mapping["indexattn"].cores:
        monkeypatch.setattr(core, "spec", Spy(core.spec, lambda spec, _: ran.append(spec.name)))
    model = model_of("llama")
    ids, padding = prompt()
    for mask, prefill, step in (
        (torch.ones_like(padding), "gqa_causal_core", "gqa_unmasked_core"),
        (padding, "gqa_core", "gqa_core"),
    ):
        model.set_attn_implementation("eager")
        tokens, steps = generate(model, ids, mask)
        model.set_attn_implementation("indexattn")
        ran.clear()
        tokens_ours, steps_ours = generate(model, ids, mask)
        assert torch.equal(tokens_ours, tokens)
        assert_relative(steps_ours, steps)
        assert ran == [prefill] * 2 + [step] * 2 * (NEW - 1)


def test_cross_attention_is_eager_s(counted):
    """A BERT decoder's cross-attention layers hand over encoder_hidden_states (their keys and
    values made from it, N_kv != N, the encoder's padding as the mask): eager's logits. Twin:
    other encoder states give other logits, so the keys and values are the encoder's."""
    from transformers import BertConfig, BertLMHeadModel

    config = BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, is_decoder=True, add_cross_attention=True,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **EAGER,
    )  # fmt: skip
    torch.manual_seed(0)
    model = BertLMHeadModel(config).double().eval()
    ids, padding = prompt()
    encoder = torch.randn(B, N + 3, 32, dtype=torch.float64)
    kept = torch.ones(B, N + 3, dtype=torch.long)
    kept[1, -2:] = 0

    def run(states):
        with torch.no_grad():
            out = model(
                input_ids=ids, attention_mask=padding, encoder_hidden_states=states,
                encoder_attention_mask=kept, use_cache=False,
            ).logits  # fmt: skip
        return unpadded(out, padding)

    want = run(encoder)
    model.set_attn_implementation("indexattn")
    seen = counted("indexattn")
    assert_relative(run(encoder), want)
    assert seen == [N] * 4  # self- and cross-attention in both layers
    assert (run(torch.randn_like(encoder)) - want).abs().max() > 1e-6 * want.abs().max()


def test_a_mask_longer_than_the_keys_is_cut_to_them_as_eager_cuts_it():
    """transformers 5.0's BERT, left-padded, in generate: the mask covers the whole prompt while
    the layer (no cache) hands only the new keys; its eager (and sdpa) read the mask's first
    N_kv columns. The twin: a bit flipped inside those columns moves the output, one flipped
    past them does not."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(B, 4, n, 8, dtype=torch.float64) for n in (1, 2, 2))
    module = torch.nn.Module()
    mask = torch.zeros(B, 1, 1, N, dtype=torch.float64)
    mask[1, ..., 1:] = torch.finfo(torch.float64).min  # key 0 seen, key 1 not, then past them

    def eager(mask):  # BERT's eager_attention_forward in transformers 5.0
        scores = query @ key.transpose(2, 3) * 0.3 + mask[:, :, :, : key.shape[-2]]
        return (scores.softmax(-1) @ value).transpose(1, 2)

    def ours(mask):
        return hf.CORE(module, query, key, value, mask, scaling=0.3)[0]

    assert_relative(ours(mask), eager(mask))
    inside, past = mask.clone(), mask.clone()
    inside[1, ..., 1], past[1, ..., 3] = 0.0, 0.0
    assert_relative(ours(past), eager(mask))
    with pytest.raises(AssertionError):
        assert_relative(ours(inside), eager(mask))


@pytest.mark.parametrize("scaled", [True, False])
def test_gpt2_s_own_scale_and_causal_mask_are_eager_s(scaled, monkeypatch):
    """transformers 5.0's GPT-2 passes no scaling (its eager divides by √d_v where
    scale_attn_weights, and by the layer's index + 1 where scale_attn_by_inverse_layer_idx) and
    masks its scores with its own causal buffer before adding the mask (a left-padding query,
    seeing no key, spreads its weight over the keys before it): where the door stands in for
    eager (handed eager's mask, as for a family transformers runs without sdpa), every logit,
    padding's too, is eager's. The twin: the flag moves the logits, so the core honours it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def model(by_layer: bool):
        config = GPT2Config(
            vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=scaled,
            scale_attn_by_inverse_layer_idx=by_layer, **EAGER,
        )  # fmt: skip
        torch.manual_seed(0)
        return GPT2LMHeadModel(config).double().eval()

    monkeypatch.setitem(hf.attention.HANDED, "gpt2", hf.attention.EAGER)
    ids, padding = prompt()
    gpt2 = model(by_layer=True)
    want = every_logit(gpt2, ids, padding)
    gpt2.set_attn_implementation("indexattn")
    assert_relative(every_logit(gpt2, ids, padding), want)
    with pytest.raises(AssertionError):
        assert_relative(every_logit(model(by_layer=False), ids, padding), want)


def every_logit(model, ids, padding):
    """The logits, padding queries' too."""
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=padding, use_cache=False).logits


def test_a_mask_per_head_is_eager_s():
    """Doge hands a mask per query head, [batch, h, N, N_kv] (its learned dynamic bias, the
    top keep_window_size keys of each head kept): "indexattn" runs gqa_heads_core, giving
    eager's logits, padding's too, and unpadded (the mask built: Doge's layer adds it to its
    own, not causal without it, in transformers 5.0). The twin: each head's mask made the
    first head's moves the core's output, so it reads every head's."""
    from transformers import DogeConfig, DogeForCausalLM

    config = DogeConfig(**{**SMALL, "keep_window_size": 4, "pad_token_id": 0, **EAGER})
    torch.manual_seed(0)
    model = randomise(DogeForCausalLM(config)).double().eval()
    ids, padding = prompt()
    for mask in (padding, torch.ones_like(padding)):  # unpadded: transformers 5.0's skips it
        model.set_attn_implementation("eager")
        want = logits(model, ids, mask)
        model.set_attn_implementation("indexattn")
        assert_relative(logits(model, ids, mask), want)

    query, key, value = (torch.randn(B, h, N, 8, dtype=torch.float64) for h in (4, 2, 2))
    mask = torch.randn(B, 4, N, N, dtype=torch.float64)
    layer = model.model.layers[0].self_attn
    out = hf.CORE(layer, query, key, value, mask, scaling=0.3)[0]
    first = hf.CORE(layer, query, key, value, mask[:, :1].expand_as(mask), scaling=0.3)[0]
    assert (out - first).abs().max() > 1e-3


def test_a_family_that_does_not_run_sdpa_gets_its_causal_mask_built():
    """BigBirdPegasus's decoder layers say is_causal=False, and transformers never runs them
    with sdpa (its mask is always built): an unpadded prompt hands them the causal mask, not
    none, and the logits are eager's. The twin: the last token changed moves only the last
    position's logits (a layer seeing every key would move every position's)."""
    from transformers import BigBirdPegasusConfig, BigBirdPegasusForCausalLM

    config = BigBirdPegasusConfig(
        vocab_size=40, d_model=32, decoder_layers=2, decoder_attention_heads=4,
        decoder_ffn_dim=48, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        **EAGER,
    )  # fmt: skip
    torch.manual_seed(0)
    model = randomise(BigBirdPegasusForCausalLM(config)).double().eval()
    ids, _ = prompt()
    unpadded = torch.ones_like(ids)
    want = logits(model, ids, unpadded)
    model.set_attn_implementation("indexattn")
    assert_relative(logits(model, ids, unpadded), want)
    other = ids.clone()
    other[:, -1] = (other[:, -1] + 1) % 40
    moved = (logits(model, other, unpadded) - want).abs().amax(dim=(0, 2))
    assert moved[:-1].max() <= 1e-12 < moved[-1]


def eager_core(query, key, value, mask):
    """transformers' eager attention (repeat_kv, scaling 0.3), float64: [batch, N, h, d_v]."""
    key, value = (t.repeat_interleave(query.shape[1] // t.shape[1], dim=1) for t in (key, value))
    return ((query @ key.transpose(2, 3) * 0.3 + mask).softmax(-1) @ value).transpose(1, 2)


def test_the_keys_each_query_selects_are_a_mask():
    """DeepSeek-V3.2's indexer hands `indices` [batch, N, k], the keys each query selects, to
    any implementation but eager and sdpa, whose mask hides the others: the core hides them
    too, giving eager's output. The twin: other indices give another output."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(B, h, N, 8, dtype=torch.float64) for h in (4, 2, 2))
    mask = torch.zeros(B, 1, N, N, dtype=torch.float64)
    indices = torch.randperm(N)[:3].expand(B, N, 3)
    hidden = torch.ones(B, N, N, dtype=torch.bool).scatter(-1, indices, False)[:, None]
    want = eager_core(query, key, value, mask.masked_fill(hidden, torch.finfo(mask.dtype).min))
    module = torch.nn.Module()
    got = hf.CORE(module, query, key, value, mask, scaling=0.3, indices=indices)[0]
    assert_relative(got, want)
    other = hf.CORE(module, query, key, value, mask, scaling=0.3, indices=indices.flip(-1) % 2)
    with pytest.raises(AssertionError):
        assert_relative(other[0], want)


def test_a_position_bias_is_added_to_the_scores():
    """Inkling hands its relative position bias, [batch, h, N, N_kv], as `position_bias`, which
    eager adds to the scores: the core adds it to its mask (one per head: gqa_heads_core),
    giving eager's output. The twin: without the bias, another output."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(B, h, N, 8, dtype=torch.float64) for h in (4, 2, 2))
    mask = torch.zeros(B, 1, N, N, dtype=torch.float64)
    mask[1, ..., :2] = torch.finfo(mask.dtype).min
    bias = torch.randn(B, 4, N, N, dtype=torch.float64)
    module = torch.nn.Module()
    got = hf.CORE(module, query, key, value, mask, scaling=0.3, position_bias=bias)[0]
    assert_relative(got, eager_core(query, key, value, bias + mask))
    with pytest.raises(AssertionError):
        assert_relative(got, eager_core(query, key, value, mask))


def test_a_layer_with_gpt2_s_flag_that_passes_its_scaling_keeps_it():
    """GPTBigCode's layers have GPT-2's scale_attn_weights but pass their scaling (and have no
    scale_attn_by_inverse_layer_idx): its logits are eager's. The twin: the flag moves them."""

    def model(scaled: bool):
        config = modeling_gpt_bigcode.GPTBigCodeConfig(
            vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=scaled, **EAGER,
        )  # fmt: skip
        torch.manual_seed(0)
        return modeling_gpt_bigcode.GPTBigCodeForCausalLM(config).double().eval()

    ids, padding = prompt()
    bigcode = model(scaled=False)
    want = logits(bigcode, ids, padding)
    bigcode.set_attn_implementation("indexattn")
    assert_relative(logits(bigcode, ids, padding), want)
    with pytest.raises(AssertionError):
        assert_relative(logits(model(scaled=True), ids, padding), want)
