"""transformers attention layers built from tiny configs (nothing downloaded), with what their
model hands them, for `indexattn.lift` (tests/runtime/test_lift_families.py, the sections of
docs/lift.md printed by tests/docs/lift_sections.py). Not a test file."""

import importlib

WIDTH = 32
WINDOW = 3
BASE = dict(
    vocab_size=40, hidden_size=WIDTH, intermediate_size=48, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)  # fmt: skip

SOFT_CAP = {"attn_logit_softcapping": 20.0, "sliding_window": WINDOW}
# family -> (module, config and class stem, config fields); rotary: <stem>RotaryEmbedding
FAMILIES = {
    "llama": ("llama", "Llama", {}),
    "mistral": ("mistral", "Mistral", {"sliding_window": WINDOW}),
    "mixtral": ("mixtral", "Mixtral", {}),
    "qwen2": ("qwen2", "Qwen2", {}),
    "gemma": ("gemma", "Gemma", {"head_dim": 8}),
    "gemma2": (
        "gemma2",
        "Gemma2",
        {
            "head_dim": 8,
            "query_pre_attn_scalar": 6,
            "attn_logit_softcapping": 20.0,
            "sliding_window": WINDOW,
        },
    ),
    "granite": ("granite", "Granite", {"attention_multiplier": 0.3}),
    "olmo": ("olmo", "Olmo", {}),
    "starcoder2": ("starcoder2", "Starcoder2", {"sliding_window": WINDOW}),
    "gpt_neox": ("gpt_neox", "GPTNeoX", {"rotary_pct": 0.5}),
    "phi": ("phi", "Phi", {"partial_rotary_factor": 0.5}),
    "stablelm": ("stablelm", "StableLm", {"partial_rotary_factor": 0.5}),
}
EAGER = {"gemma2"}  # a soft cap: transformers' eager attention (softmax in float32)

# refused, and the op that refuses them: q/k RMSNorm's mean, interleaved rotary's x[..., ::2],
# GPT-2's Conv1D
REFUSED = {
    "qwen3": ("qwen3", "Qwen3", {"head_dim": 8}, "aten.mean.dim"),
    "olmo2": ("olmo2", "Olmo2", {}, "aten.mean.dim"),
    "cohere": ("cohere", "Cohere", {}, "aten.slice.Tensor"),
    "gpt2": ("gpt2", "GPT2", {"n_embd": WIDTH, "n_head": 4}, "aten.addmm.default"),
}


def build(module: str, stem: str, fields: dict, eager: bool = False):
    """(layer, keywords for lift): the family's attention layer of layer 0, eval, its rotary
    module and its mask function (sliding-window causal where the config has a window)."""
    import transformers
    from transformers.masking_utils import (
        causal_mask_function,
        sliding_window_causal_mask_function,
    )

    code = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = getattr(transformers, f"{stem}Config")(
        **{**BASE, **fields}, attn_implementation="eager" if eager else "sdpa"
    )
    layer = getattr(code, f"{stem}Attention")(config, 0).eval()
    keywords = {}
    rotary = getattr(code, f"{stem}RotaryEmbedding", None)
    if rotary is not None:
        keywords["position_embeddings"] = rotary(config)
    window = "sliding_window" in fields
    keywords["attention_mask"] = (
        sliding_window_causal_mask_function(WINDOW) if window else causal_mask_function
    )
    return layer, keywords


def family(name: str):
    module, stem, fields = FAMILIES[name]
    return build(module, stem, fields, name in EAGER)
