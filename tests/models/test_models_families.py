"""Every family transformers serves through its attention interface, in one line: the family
table of docs/models.md is this file's output.

The families are transformers' own list: every model type AutoModelForCausalLM knows whose
modeling file calls transformers' attention functions (`_can_set_attn_implementation`, the test
indexattn/transformers/guard.py refuses by). Each is built from its config class's defaults
shrunk to a tiny size (`tiny`: 2 layers, width 32, 4 heads on 2, vocabulary 64, its
sub-configs and per-layer lists shrunk alike), random weights, float64, nothing downloaded,
and checked in five columns against the same model with eager attention, computed in float64
throughout (`float64_throughout`: transformers' eager softmax, and some eager attentions and
MoE routers, work in float32 on purpose):

- logits: a left-padded batch's logits within 1e-10 of the largest, the core having run (a
  padding query's left out: it sees no key, and the door gives it sdpa's zeros);
- generate, left-padded generate: greedy generate() with the cache on, the same tokens and
  every step's logits within 1e-10, the core having run on the new tokens;
- save/load: save_pretrained under "indexattn", from_pretrained back: the same logits;
- gradients: in training mode, the gradient of every weight within 1e-9 relative (a gradient
  below 1e-6 of the model's largest, zero but rounding, relative to that 1e-6).

A cell is ✓ or why not, in one line; where a check raises, the same check with eager in
indexattn's place says whether transformers fails alike ("eager fails too: ..."). A family
not built at the tiny size says why in its first cell (a library missing here, transformers'
own default config failing too, its error, or its size).

The suite runs the rows of QUICK (seconds); the whole table (every family: minutes of CPU, too
slow for the suite) is `sweep`, run as `python tests/models/test_models_families.py`: it compares
the table it makes with docs/models.md's for the running transformers (between markers) and exits 1
where they differ; with INDEXATTN_WRITE_FAMILIES=1 it writes it there. With
INDEXATTN_FAMILY_SWEEP=1 the suite runs it too and fails where a family docs/models.md marks
every cell ✓ no longer is (.ci/run, on the oldest and newest transformers).
"""

import functools
import inspect
import os
import re
import tempfile
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloaded: no hub kernel looked up
transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("indexattn.transformers")

DOC = Path(__file__).parents[2] / "docs" / "models.md"  # run as a script too: no models_common
WRITE = "INDEXATTN_WRITE_FAMILIES"  # set to 1: the test writes its table into DOC
COLUMNS = ("logits", "generate", "left-padded generate", "save/load", "gradients")
B, N, NEW = 2, 5, 3
TINY = {  # a config field (by transformers' common name): its tiny size
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 64, "num_local_experts": 2, "num_experts": 2,
    "num_experts_per_tok": 1, "moe_intermediate_size": 16, "attention_dropout": 0.0,
    "eos_token_id": None, "pad_token_id": 0, "bos_token_id": 1,
    # encoder-decoder families (BART's): their own names for the same sizes
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "ffn_dim": 32,
    # latent attention (DeepSeek's): ranks and head widths
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 8, "index_head_dim": 8, "n_routed_experts": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1,  # expert groups (DeepSeek-V3's routing): one
    "rotary_dim": 4,  # partial rotary (GPT-J's): within the head
    "pronunciation_embed_dim": 8, "shape_embed_dim": 8,  # RoCBert's extra embeddings
    "shared_expert_intermediate_size": 16, "shared_experts_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 16,
    "ffn_hidden_size": 32, "expert_ffn_hidden_size": 16, "zero_expert_num": 1, "moe_topk": 2,
    # state-space and linear-attention mixers (Mamba's, Zamba's, Qwen3-Next's, Kimi's)
    "mamba_n_heads": 4, "n_mamba_heads": 4, "mamba_d_state": 8, "state_size": 8,
    "mamba_d_ssm": 64, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_head_dim": 8,
    "linear_num_heads": 4, "use_mamba_kernels": False,
    "ssm_state_size": 8, "mamba_num_heads": 8, "mamba_head_dim": 8,
    # embeddings of their own (Gemma 4's per layer, BLT's hashed bytes, Inkling's)
    "vocab_size_per_layer_input": 64, "hidden_size_per_layer_input": 8,
    "encoder_hash_byte_group_vocab": 64, "hidden_size_global": 32, "unpadded_vocab_size": 64,
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 8,
    # encoders of other inputs (Phi-4-multimodal's audio)
    "num_blocks": 2, "nemo_conv_channels": 8, "ext_pw_out_channel": 32,
    "depthwise_separable_out_channel": 32,
    "num_kv_shared_layers": 0,  # Gemma 3n's: layers reading another's cache
    "layer_group_size": 2,  # Bailing's hybrid: each group's last layer attends
    "attn_layer_indices": [1],  # Bamba's: which layers attend (by default none)
    "num_codebooks": 1,  # MusicGen's: one codebook, its ids a batch of token ids
}  # fmt: skip
LATENT = {"num_key_value_heads": TINY["num_attention_heads"]}  # latent attention's tiny size
EAGER = {"attn_implementation": "eager", "experts_implementation": "eager"}
DROPOUT = re.compile(r"drop")  # a config field of a dropout or layer-drop probability
TOO_BIG = 2_000_000  # parameters: a tiny config left larger than this was not shrunk by TINY


@functools.cache
def families() -> dict:
    """model type: its causal LM class, for each family whose layers call the interface."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = {}
    for model_type, class_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        cls = getattr(transformers, class_name, None)
        if cls is not None and cls._can_set_attn_implementation():
            found[model_type] = cls
    return found


def causal_lm(family: str):
    """The family's causal LM class, its modeling file alone imported."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])


def tiny(config_class, **settings):
    """The config class's defaults, each TINY field it has set to its tiny size, its per-layer
    lists cut to the tiny model's layers, and every sub-config (a vision tower's, a text
    model's) shrunk alike."""
    default = config_class()
    names = getattr(config_class, "attribute_map", {})
    fields = vars(default)  # not a property (xLSTM's head widths) nor a per-layer attribute
    latent = "kv_lora_rank" in fields  # its keys have every head: none shared
    given = {
        names.get(field, field): size
        for field, size in {**TINY, **(LATENT if latent else {})}.items()
        if names.get(field, field) in fields
    }
    layers = names.get("num_hidden_layers", "num_hidden_layers")
    every_layer = {layers: fields[layers]} if layers in given else {}
    every = sized(config_class, given | every_layer)  # the tiny sizes, every layer kept
    if layers in given:  # up to the first attention layer at the tiny sizes
        given[layers] = max(TINY["num_hidden_layers"], first_attending(every) + 1)
    if {"expand", "num_heads", "head_dim", "hidden_size"} <= fields.keys():  # Mamba-2's heads
        given["num_heads"] = fields["expand"] * given["hidden_size"] // given["head_dim"]
    for name, value in fields.items():
        if isinstance(value, transformers.PretrainedConfig):
            given[name] = tiny(type(value), **settings)
        elif DROPOUT.search(name) and isinstance(value, float):
            given[name] = 0.0  # training mode draws no mask: eager's and ours see the same
        elif isinstance(value, list | tuple) and layers in given and len(value) == fields[layers]:
            # one entry a layer (Zamba's layer kinds, Gemma 3n's widths): the tiny model's
            kept = vars(every).get(name, value)  # as the tiny sizes make it (Bailing's kinds)
            given[name] = [given[name]] * given[layers] if name in given else kept[: given[layers]]
    if fields.get("languages") and fields.get("default_language", "") is None:
        given["default_language"] = fields["languages"][0]  # X-MOD's adapters: the first's
    config = config_class(**given, **settings)
    if not hasattr(config, "pad_token_id"):  # transformers 5.0's Phi, StableLM, ... read it
        config.pad_token_id = TINY["pad_token_id"]
    return config


def sized(config_class, given: dict):
    """The config at the tiny sizes but with every layer (Bailing's group size decides where
    the first attention layer is), or else its defaults."""
    try:
        return config_class(**given)
    except Exception:  # the tiny sizes alone break a rule of the config's
        return config_class()


BLOCKS = "layers_block_type"


def first_attending(config) -> int:
    """The index of a hybrid model's first attention layer (Jamba's, Qwen3-Next's: after Mamba
    or linear layers), so that the tiny model has one; 0 where its layers say nothing."""
    try:  # transformers 5.0's Jamba and Zamba name them layers_block_type
        kinds = list(getattr(config, "layer_types", None) or getattr(config, BLOCKS, None) or [])
    except Exception:  # a per-layer property some configs raise on
        return 0
    attending = [i for i, kind in enumerate(kinds) if ATTENDING.search(str(kind))]
    return attending[0] if attending else 0


# a layer kind that attends (Zamba's "hybrid": a Mamba mixer and the shared attention)
ATTENDING = re.compile(r"^(?!linear).*attention$|^attention$|^hybrid$")


def float64_softmax(x, dim=None, dtype=None, **kw):
    """transformers' eager softmax without its float32 upcast."""
    return SOFTMAX(x, dim=dim, **kw)


def float64_tensor_softmax(x, dim=None, dtype=None, **kw):
    """`Tensor.softmax` without its float32 upcast (DeepSeek-V4's compressor gates)."""
    return TENSOR_SOFTMAX(x, dim, **kw)


def float64_kept(x, *args, **kw):
    """`Tensor.float()` leaving float64 as it is: some eager attentions (Flint's) compute their
    scores in float32 on purpose, which float64's comparison would read as 1e-7 apart."""
    return x if x.dtype == torch.float64 else FLOAT(x, *args, **kw)


def float64_kept_by(function):
    """`function(x, ..., torch.float32)` leaving a float64 `x` float64: `Tensor.to` (CodeGen's,
    GPT-J's and Granite's eager attentions compute their scores or sinks in float32 on
    purpose) and `torch.zeros_like` (Hunyuan's routing weights)."""

    def kept(x, *args, **kw):
        if x.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kw.get("dtype") is torch.float32:
                kw["dtype"] = torch.float64
        return function(x, *args, **kw)

    return kept


SOFTMAX, TENSOR_SOFTMAX = torch.nn.functional.softmax, torch.Tensor.softmax
FLOAT, TO, ZEROS_LIKE = torch.Tensor.float, torch.Tensor.to, torch.zeros_like


def float64_throughout(monkeypatch, cls) -> None:
    """Eager's reference computed in float64 throughout: its softmax, `.float()`,
    `.to(torch.float32)` and `zeros_like(dtype=torch.float32)` keep float64, and no module is
    kept in float32 when the model is built or loaded (MoE routers: `_keep_in_fp32_modules`).
    Patched after the modeling file's import: some of its functions are scripts."""
    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)
    monkeypatch.setattr(torch.Tensor, "softmax", float64_tensor_softmax)
    monkeypatch.setattr(torch.Tensor, "float", float64_kept)
    monkeypatch.setattr(torch.Tensor, "to", float64_kept_by(TO))
    monkeypatch.setattr(torch, "zeros_like", float64_kept_by(ZEROS_LIKE))
    for name in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"):
        monkeypatch.setattr(cls, name, None)


class Ran:
    """Counts the calls of the attention function registered as "indexattn"; `nudge`: its
    outputs are multiplied by 1 + nudge (the twin's planted error). `ours`: the implementation
    the checks compare with eager, "indexattn", or "eager" itself where a check raised (does
    transformers fail alike?)."""

    def __init__(self, monkeypatch):
        from transformers import AttentionInterface

        self.calls, self.nudge, self.ours = 0, 0.0, "indexattn"
        function = AttentionInterface._global_mapping["indexattn"]

        def counting(*args, **kwargs):
            self.calls += 1
            out, weights = function(*args, **kwargs)
            return out * (1 + self.nudge) if self.nudge else out, weights

        monkeypatch.setitem(AttentionInterface._global_mapping, "indexattn", counting)

    def missed(self, start: int) -> bool:
        """Whether the core, ours being indexattn, was not called since `start` calls."""
        return self.ours == "indexattn" and self.calls == start


def relative(got, want, floor: float = 1e-300) -> float:
    """The largest difference over the largest magnitude wanted (at least `floor`: a gradient
    that vanishes in exact arithmetic, as a key projection's bias's does, since softmax does not
    see a constant added to a row of scores, is rounding on both sides, compared against the
    model's largest gradient)."""
    return ((got - want).abs().max() / want.abs().max().clamp_min(floor)).item()


def prompt(padded: bool):
    ids = torch.randint(2, 64, (B, N), generator=torch.Generator().manual_seed(2))
    padding = torch.ones_like(ids)
    if padded:
        padding[1, :2] = 0
    return ids, padding


def forward(model, ids, padding):
    """The logits, a padding query's row zeroed: it sees no key, and gets what the
    implementation the door stands in for gives it (sdpa's zeros, eager's mean of V: compared
    with sdpa in tests/models/test_door_hostile.py), not eager's wherever the family runs sdpa."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=padding, use_cache=False).logits
    return logits.masked_fill((padding == 0).reshape(*padding.shape, *[1] * (logits.dim() - 2)), 0)


def greedy(model, ids, padding):
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=padding, max_new_tokens=NEW, min_new_tokens=NEW,
            do_sample=False, use_cache=True, pad_token_id=0, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    return out.sequences, torch.stack(out.logits)


def gradients(model, ids, padding):
    """Training mode: every weight's gradient of the loss over the tokens that are not padding
    (a padding query sees no key: its gradient is each kernel's own convention)."""
    model.train()
    labels = ids.masked_fill(padding == 0, -100)
    labels[:, 1:][padding[:, :-1] == 0] = -100
    if hasattr(model, "lm_heads"):  # MusicGen's: a head a codebook, a label a codebook
        labels = labels[..., None]
    model.zero_grad()
    kinds = {"token_type_ids": torch.zeros_like(ids)}  # Gemma 3's, required when training
    kinds = {k: v for k, v in kinds.items() if k in inspect.signature(model.forward).parameters}
    model(
        input_ids=ids, attention_mask=padding, labels=labels, use_cache=False, **kinds
    ).loss.backward()
    model.eval()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def check_logits(model, ran):
    ids, padding = prompt(padded=True)
    want = forward(model, ids, padding)
    start = ran.calls
    got = switched(model, ran, forward, ids, padding)
    if ran.missed(start):
        return "the core never ran"
    return close(relative(got, want), 1e-10)


def check_generate(padded: bool):
    def check(model, ran):
        ids, padding = prompt(padded)
        tokens, steps = greedy(model, ids, padding)
        start = ran.calls
        tokens_ours, steps_ours = switched(model, ran, greedy, ids, padding)
        if ran.missed(start):
            return "the core never ran"
        if not torch.equal(tokens_ours, tokens):
            return "other tokens"
        return close(relative(steps_ours, steps), 1e-10)

    return check


def check_save_load(model, ran):
    ids, padding = prompt(padded=True)
    model.set_attn_implementation(ran.ours)
    want = forward(model, ids, padding)
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        loaded = type(model).from_pretrained(
            path, dtype=torch.float64, **EAGER | {"attn_implementation": ran.ours}
        )
        float64(loaded)
    model.set_attn_implementation("eager")
    start = ran.calls
    got = forward(loaded.eval(), ids, padding)
    if ran.missed(start):
        return "the core never ran"
    return close(relative(got, want), 1e-10)


def check_gradients(model, ran):
    ids, padding = prompt(padded=True)
    want = gradients(model, ids, padding)
    got = switched(model, ran, gradients, ids, padding)
    if got.keys() != want.keys():
        return "other weights have gradients"
    return close(max(relative(got[n], want[n], floor=VANISHING * top(want)) for n in want), 1e-9)


VANISHING = 1e-6  # a weight's gradient this far below the model's largest: zero but rounding


def top(grads: dict) -> float:
    """The largest gradient magnitude of any weight."""
    return max(g.abs().max().item() for g in grads.values())


def switched(model, ran, work, *args):
    """`work` run with ours ("indexattn"), then the model back on eager."""
    model.set_attn_implementation(ran.ours)
    try:
        return work(model, *args)
    finally:
        model.set_attn_implementation("eager")


def close(error: float, tol: float) -> str:
    return "✓" if error <= tol else f"{error:.0e} apart"


CHECKS = dict(
    zip(COLUMNS, (check_logits, check_generate(False), check_generate(True), check_save_load,
                  check_gradients))
)  # fmt: skip


def reason(error: Exception) -> str:
    """An exception in one short line: its type and the start of its message, no addresses."""
    text = re.sub(r"0x[0-9a-f]+", "…", str(error).strip().split("\n")[0])
    text = text.replace("|", "/")
    return f"{type(error).__name__}: {text[:90]}" + ("…" if len(text) > 90 else "")


def row(cls, ran) -> dict:
    """One family's five cells (or one cell saying why it was not built), eager's softmax kept
    in float64 meanwhile (patched after the modeling file's import: some script functions)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        float64_throughout(monkeypatch, cls)
        return _row(cls, ran)


def _row(cls, ran) -> dict:
    try:
        config = tiny(cls.config_class, **EAGER)
        count = size(cls, config)
        if count > TOO_BIG:
            return {"whole": f"not built: {count:,} parameters at the tiny size (sizes of its own)"}
        torch.manual_seed(0)
        model = float64(cls._from_config(config, dtype=torch.float64)).eval()
    except Exception as error:  # the row says what it was
        return {"whole": f"not built: {unbuilt(cls, error)}"}
    return {column: cell(check, model, ran) for column, check in CHECKS.items()}


def float64(model):
    """Every weight in float64, those built in float32 too (Hunyuan's router); the buffers as
    built (a rotary table's float32 frequencies meet float32 positions in transformers 5.0)."""
    for weight in model.parameters():
        weight.data = weight.data.double()
    return model


def size(cls, config) -> int:
    """The parameters of the model `config` makes (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in cls(config).parameters())


def unbuilt(cls, error: Exception) -> str:
    """Why the tiny model was not built: a library this machine lacks, transformers failing
    alike with the config class's own defaults, or else the error."""
    library = re.search(r"requires the (\S+) library", str(error))
    if isinstance(error, ImportError) and library:
        return f"needs {library[1]}, not installed here"
    try:
        size(cls, cls.config_class(**EAGER))
    except Exception as default_error:
        return f"transformers' default config fails too: {reason(default_error)}"
    return reason(error)


def cell(check, model, ran) -> str:
    """The check's outcome; where it raises, the same check with eager in indexattn's place
    says whether transformers fails alike ("eager fails too"), so that no cell blames indexattn
    for transformers' own failure."""
    try:
        return check(model, ran)
    except Exception as error:
        ours = reason(error)
    finally:
        model.set_attn_implementation("eager")
        model.eval()
    ran.ours = "eager"
    try:
        check(model, ran)
    except Exception as error:
        return f"eager fails too: {reason(error)}"
    finally:
        ran.ours = "indexattn"
        model.set_attn_implementation("eager")
        model.eval()
    return ours


def table(rows: dict) -> str:
    lines = ["| family | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for family, cells in rows.items():
        if "whole" in cells:
            lines.append(f"| {family} | {cells['whole']} |" + " |" * (len(COLUMNS) - 1))
        else:
            lines.append(f"| {family} | " + " | ".join(cells[c] for c in COLUMNS) + " |")
    return "\n".join(lines)


def markers(version: str) -> tuple[str, str]:
    return f"<!-- family table: transformers {version} -->", "<!-- end of family table -->"


def in_docs(version: str) -> str | None:
    """The family table docs/models.md holds for `version`, or None."""
    begin, end = markers(version)
    text = DOC.read_text(encoding="utf-8")
    if begin not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def write(version: str, made: str) -> None:
    """`made` into docs/models.md as `version`'s table: in place of the one there, else after
    the last table (the runs of several versions may write at once: one at a time)."""
    from filelock import FileLock

    begin, end = markers(version)
    with FileLock(f"{DOC}.lock"), open(DOC, "r+", encoding="utf-8") as file:
        text = file.read()
        block = f"{begin}\n\n{made}\n\n{end}"
        if begin in text:
            before, rest = text.split(begin, 1)
            text = before + block + rest.split(end, 1)[1]
        else:
            before, after = text.rsplit(end, 1)
            text = f"{before}{end}\n\n{block}{after}"
        file.seek(0)
        file.write(text)
        file.truncate()


@pytest.fixture
def ran(monkeypatch):
    from transformers.utils import logging

    logging.disable_progress_bar()
    return Ran(monkeypatch)


# The suite's rows: ✓ on 5.0.0, 5.23.0 and 5.25.0. GPT-2 and Cohere among them: on 5.0.0 GPT-2
# scales and masks by flags of its own, and Cohere's layers are handed output_hidden_states.
QUICK = ("llama", "qwen2", "gemma2", "phi3", "olmo2", "gpt2", "cohere")


@pytest.mark.parametrize("family", QUICK)
def test_a_family_runs_every_column(family, ran):
    """The suite's share of the table: these families' rows, every cell ✓."""
    assert row(causal_lm(family), ran) == dict.fromkeys(COLUMNS, "✓")


class Stopped(BaseException):
    """A row's time is up."""


LIMIT = 60  # seconds of wall time a family's row may take in the sweep
STOPPED = "stopped after"


def timed(cls, ran) -> dict:
    """`row`, or a row saying it was stopped after LIMIT seconds (a reference scan, a hang)."""
    import signal

    def stop(*_):
        raise Stopped  # not an Exception: no cell's `except` takes it

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(LIMIT)
    try:
        return row(cls, ran)
    except Stopped:
        return {"whole": f"not run: {STOPPED} {LIMIT} s (the machine was loaded)"}
    finally:
        signal.alarm(0)


def every_row() -> dict:
    """Every family's row (each stopped after LIMIT seconds), and the CPU time they took."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    with pytest.MonkeyPatch.context() as monkeypatch:
        start = time.process_time()
        rows = {family: timed(cls, Ran(monkeypatch)) for family, cls in families().items()}
    print(f"{len(rows)} families: {time.process_time() - start:.1f} s of CPU")
    return rows


def sweep() -> int:
    """Every family's row: the table written into docs/models.md (with INDEXATTN_WRITE_FAMILIES
    set) or compared with it; 1 where it differs (`python tests/models/test_models_families.py`)."""
    made = table(every_row())
    version = transformers.__version__
    if os.environ.get(WRITE):
        write(version, made)
    if in_docs(version) != made:
        print(f"docs/models.md's family table for transformers {version} differs: {WRITE}=1")
        return 1
    return 0


SWEEP = "INDEXATTN_FAMILY_SWEEP"  # set to 1: the suite runs the whole table (minutes)


def ticked(text: str) -> set:
    """The families whose every cell is ✓ in a family table's text."""
    rows = (line.strip("| ").split(" | ") for line in text.splitlines()[2:])
    return {cells[0] for cells in rows if cells[1:] == ["✓"] * len(COLUMNS)}


@pytest.mark.skipif(not os.environ.get(SWEEP), reason=f"the whole table: minutes ({SWEEP}=1)")
def test_every_family_docs_marks_ticked_stays_ticked():
    """The whole table on the running transformers (printed): a family whose row in
    docs/models.md is every cell ✓ still is; a row stopped for time is printed, not failed."""
    version = transformers.__version__
    documented = in_docs(version)
    assert documented is not None, f"no family table for {version}: {WRITE}=1 writes it"
    rows = every_row()
    print(table(rows))
    assert not untick(documented, rows), untick(documented, rows)


def untick(documented: str, rows: dict) -> dict:
    """The families ticked in `documented` (every cell ✓) whose row now is not, but for rows
    stopped for time: each with its row."""
    stopped = {family for family, cells in rows.items() if STOPPED in cells.get("whole", "")}
    lost = ticked(documented) - ticked(table(rows)) - stopped
    return {family: rows.get(family, "no longer a family") for family in sorted(lost)}


def test_a_ticked_family_whose_row_is_not_fails_the_sweep_unless_stopped_for_time():
    """`untick` against a table of two ticked families: one cell apart is caught; the twins,
    every cell ✓ and a row stopped for time, are not."""
    ticks = dict.fromkeys(COLUMNS, "✓")
    documented = table({"llama": ticks, "qwen2": ticks, "bloom": {"whole": "not built: x"}})
    stopped = {"whole": f"not run: {STOPPED} {LIMIT} s"}
    assert untick(documented, {"llama": ticks, "qwen2": {**ticks, "gradients": "1e-08 apart"}}) == {
        "qwen2": {**ticks, "gradients": "1e-08 apart"}
    }
    assert untick(documented, {"llama": ticks, "qwen2": ticks}) == {}
    assert untick(documented, {"llama": ticks, "qwen2": stopped}) == {}


class Failing:
    """A model stand-in whose check raises with the implementations in `failing`."""

    def __init__(self, failing):
        self.failing, self.name = failing, "eager"

    def set_attn_implementation(self, name):
        self.name = name

    def eval(self):
        return self


def raising(model, ran):
    model.set_attn_implementation(ran.ours)
    if model.name in model.failing:
        raise TypeError(f"{model.name} failed")
    return "✓"


def test_a_check_that_raises_with_eager_too_says_so(ran):
    """A check raising with indexattn and with eager: "eager fails too", eager's reason; the
    twin, raising with indexattn alone: indexattn's reason."""
    both, ours = Failing({"indexattn", "eager"}), Failing({"indexattn"})
    assert cell(raising, both, ran) == "eager fails too: TypeError: eager failed"
    assert cell(raising, ours, ran) == "TypeError: indexattn failed"
    assert ran.ours == "indexattn"


def test_a_core_that_is_not_eager_s_is_seen_in_every_column_it_computes(ran):
    """The twin: the core's outputs nudged by 1e-8 relative show in logits, both generates and
    gradients (save/load compares the nudged core with itself: still equal)."""
    ran.nudge = 1e-8
    cells = row(causal_lm("llama"), ran)
    assert cells["save/load"] == "✓"
    for column in ("logits", "generate", "left-padded generate", "gradients"):
        assert cells[column].endswith("apart"), (column, cells[column])


if __name__ == "__main__":
    raise SystemExit(sweep())
