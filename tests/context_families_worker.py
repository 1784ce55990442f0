"""One rank of tests/parallel/test_context_parallel_families.py: `python
context_families_worker.py RANK WORLD PORT OUT`.

Tiny causal LMs of the families whose layers are not all plainly causal, built from configs
(random weights, float64, nothing downloaded), split over the sequence with
indexattn.distributed.context_parallel_model, against the same model in one process (eager;
softmax and RMSNorms in float64): Mistral (a window on every layer), Gemma 2 (sliding and global
layers alternating, soft-capped scores), Gemma 3 (sliding and global layers, each with its
rotary), GPT-OSS (sinks, sliding and full layers), Llama 4 (chunked and full layers), Qwen2,
Cohere2 and OLMo 3 (sliding and full layers), and causal families with what the others lack:
GPT-2 (learned positions), DeepSeek V3 (latent attention, keys and values of other widths),
GPT-NeoX (rotary on half a head) and SmolLM3 (a layer without rotary). The
largest difference in this rank's block of the logits and in every parameter's gradient
(summed over the ranks) goes to OUT/rank{RANK}.json. The twins change one thing in what one
layer kind gets: its window or chunk one longer, a sliding layer run as a global one, or the
sinks left out, a causal layer given a window, on every rank (ranks called with different
windows raise: agree.py)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib

import torch
import transformers
from context_models_worker import B, N, step  # tests/ is on a script's path
from distributed_worker import run_checks, start

from indexattn.parallel.distributed import context_parallel_model, sequence_block, sum_gradients
from indexattn.transformers import context

# Shorter than a rank's block of 4, the masks cross the ranks' borders (Llama 4's chunks of 4
# on zig-zag blocks: positions 0, 1, 6, 7 on rank 0)
WINDOW, CHUNK = 3, 4
SMALL = {
    "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 64, "attention_dropout": 0.0, "eos_token_id": None,
    "pad_token_id": None, "bos_token_id": None,
}  # fmt: skip
ALTERNATING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}
LATENT = {  # DeepSeek V3's latent attention: keys of 8 features (rotary on 4), values of 6
    "head_dim": 4, "num_key_value_heads": 4, "q_lora_rank": 8, "kv_lora_rank": 8,
    "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 6, "first_k_dense_replace": 2,
    "n_routed_experts": 2, "num_experts_per_tok": 1, "n_group": 1, "topk_group": 1,
    "moe_intermediate_size": 8,
}  # fmt: skip
FAMILIES = {  # config class, its settings
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "gemma2": (
        "Gemma2Config",
        {**ALTERNATING, "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 10},
    ),
    "gemma3": ("Gemma3TextConfig", {**ALTERNATING, "query_pre_attn_scalar": 10}),
    "qwen2": ("Qwen2Config", {**ALTERNATING, "use_sliding_window": True}),  # biases on q, k, v
    "cohere2": ("Cohere2Config", ALTERNATING),  # a layer norm, a logit scale
    "gpt_oss": (
        "GptOssConfig",
        {**ALTERNATING, "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size": 8},
    ),
    "llama4": (
        "Llama4TextConfig",
        {
            "layer_types": ["chunked_attention", "full_attention"],
            "attention_chunk_size": CHUNK,
            "no_rope_layers": [1, 0],  # the chunked layer with rotary, the full one without
            "attn_temperature_tuning": False,
            "intermediate_size_mlp": 24,
            "num_local_experts": 2,
            "moe_layers": [1],
        },
    ),
    # causal on every layer, each with what the door's other families have that these lack
    "gpt2": (  # learned absolute positions, no rotary, every head its own keys, Conv1D
        "GPT2Config",
        {"n_embd": 16, "n_layer": 2, "n_head": 4}
        | {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
    ),
    "deepseek_v3": ("DeepseekV3Config", LATENT),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5}),  # rotary on half of each head
    "smollm3": ("SmolLM3Config", {"no_rope_layers": [1, 0]}),  # a layer without rotary
    "olmo3": ("Olmo3Config", ALTERNATING),  # queries and keys normed, sliding and full layers
}
EAGER = {"attn_implementation": "eager", "experts_implementation": "eager"}


def float64_norm(offset: float):
    """The family's RMSNorm forward in the input's dtype, its formula as transformers has it
    (Gemma's weight an offset from 1): transformers' casts to float32, whose rounding would
    hide a difference of 1e-10 (both models run it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + self.weight)

    return forward


def float64_layer_norm(self, x: torch.Tensor) -> torch.Tensor:
    """Cohere's layer norm (no bias) in the input's dtype, as transformers writes it."""
    centred = x - x.mean(-1, keepdim=True)
    variance = centred.pow(2).mean(-1, keepdim=True)
    return self.weight * centred * torch.rsqrt(variance + self.variance_epsilon)


NORMS = {  # the families' RMSNorm classes and the offset of their weight
    "mistral.modeling_mistral.MistralRMSNorm": 0.0,
    "gemma2.modeling_gemma2.Gemma2RMSNorm": 1.0,
    "gemma3.modeling_gemma3.Gemma3RMSNorm": 1.0,
    "gpt_oss.modeling_gpt_oss.GptOssRMSNorm": 0.0,
    "llama4.modeling_llama4.Llama4TextRMSNorm": 0.0,
    "qwen2.modeling_qwen2.Qwen2RMSNorm": 0.0,
    "deepseek_v3.modeling_deepseek_v3.DeepseekV3RMSNorm": 0.0,
    "smollm3.modeling_smollm3.SmolLM3RMSNorm": 0.0,
    "olmo3.modeling_olmo3.Olmo3RMSNorm": 0.0,
}
LAYER_NORMS = ["cohere2.modeling_cohere2.Cohere2LayerNorm"]  # mean removed, no bias


def model_of(family: str) -> torch.nn.Module:
    """The family's tiny causal LM, float64, every weight random (no zero bias or unit norm
    hides a mistake), eager attention."""
    config_class, settings = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SMALL, **settings, **EAGER})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.3)
    return model


TWINS = {  # what rank 1's layers of one kind get instead
    "window": lambda kind: dataclasses.replace(kind, window=kind.window + 1),
    "chunk": lambda kind: dataclasses.replace(kind, chunk=kind.chunk + 1),
    "global": lambda kind: dataclasses.replace(kind, window=None),
    "no sinks": lambda kind: dataclasses.replace(kind, sinks=False),
    "windowed": lambda kind: dataclasses.replace(kind, window=WINDOW),
}


@contextlib.contextmanager
def perturbed(twin: str):
    """The layers of the kind the twin changes (a window, a chunk, sinks) get the twin's kind,
    on every rank; every other layer as it is."""
    if not twin:
        yield
        return
    kind_of, changed = context.ContextAttention.kind, TWINS[twin]

    def kind(self, module, kwargs):
        found = kind_of(self, module, kwargs)
        touched = {
            "chunk": found.chunk,
            "no sinks": found.sinks or None,
            "windowed": found.window is None or None,  # a causal layer given a window
        }.get(twin, found.window)
        if touched is None:
            return found
        return changed(found)

    context.ContextAttention.kind = kind
    try:
        yield
    finally:
        context.ContextAttention.kind = kind_of


def check(mesh, family: str, strategy: str, layout: str, twin: str = "") -> dict:
    model, device = model_of(family).to(mesh.device_type), mesh.device_type
    ids = torch.randint(0, 40, (B, N), generator=torch.Generator().manual_seed(2)).to(device)
    positions = torch.arange(N, device=device).expand(B, N)

    def block(v):
        return sequence_block(v, mesh, dim=1, layout=layout)

    out1, grads1 = step(copy.deepcopy(model), ids, positions, lambda v: v)
    split = context_parallel_model(model, mesh, strategy=strategy, layout=layout)
    with perturbed(twin):
        out2, grads2 = step(split, ids, block(positions), block)
    sum_gradients(split, mesh)
    grads2 = [torch.zeros_like(a) if b is None else b for a, b in zip(grads1, grads2)]
    grad = max((a - b).abs().max().item() for a, b in zip(grads1, grads2))
    return {"out": (block(out1) - out2).abs().max().item(), "grad": grad}


CHECKS = {  # name: family, strategy, layout, twin
    "mistral_ring": ("mistral", "ring", "zigzag", ""),
    "mistral_ulysses": ("mistral", "ulysses", "contiguous", ""),
    "mistral_window_twin": ("mistral", "ring", "zigzag", "window"),
    "gemma2_ring": ("gemma2", "ring", "contiguous", ""),
    "gemma2_ulysses": ("gemma2", "ulysses", "zigzag", ""),
    "gemma2_global_twin": ("gemma2", "ring", "contiguous", "global"),
    "gemma3_ring": ("gemma3", "ring", "zigzag", ""),
    "gemma3_ulysses": ("gemma3", "ulysses", "contiguous", ""),
    "gemma3_window_twin": ("gemma3", "ulysses", "contiguous", "window"),
    "gpt_oss_ring": ("gpt_oss", "ring", "zigzag", ""),
    "gpt_oss_ulysses": ("gpt_oss", "ulysses", "contiguous", ""),
    "gpt_oss_sinks_twin": ("gpt_oss", "ring", "zigzag", "no sinks"),
    "llama4_ring": ("llama4", "ring", "zigzag", ""),
    "llama4_ulysses": ("llama4", "ulysses", "contiguous", ""),
    "llama4_chunk_twin": ("llama4", "ulysses", "contiguous", "chunk"),
    "qwen2_ring": ("qwen2", "ring", "zigzag", ""),
    "qwen2_ulysses": ("qwen2", "ulysses", "contiguous", ""),
    "qwen2_window_twin": ("qwen2", "ring", "zigzag", "window"),
    "cohere2_ring": ("cohere2", "ring", "contiguous", ""),
    "cohere2_ulysses": ("cohere2", "ulysses", "zigzag", ""),
    "cohere2_global_twin": ("cohere2", "ring", "contiguous", "global"),
    "gpt2_ring": ("gpt2", "ring", "zigzag", ""),
    "gpt2_ulysses": ("gpt2", "ulysses", "contiguous", ""),
    "gpt2_windowed_twin": ("gpt2", "ring", "zigzag", "windowed"),
    "deepseek_v3_ring": ("deepseek_v3", "ring", "zigzag", ""),
    "deepseek_v3_ulysses": ("deepseek_v3", "ulysses", "contiguous", ""),
    "deepseek_v3_windowed_twin": ("deepseek_v3", "ring", "zigzag", "windowed"),
    "gpt_neox_ring": ("gpt_neox", "ring", "contiguous", ""),
    "gpt_neox_ulysses": ("gpt_neox", "ulysses", "zigzag", ""),
    "gpt_neox_windowed_twin": ("gpt_neox", "ulysses", "zigzag", "windowed"),
    "smollm3_ring": ("smollm3", "ring", "zigzag", ""),
    "smollm3_ulysses": ("smollm3", "ulysses", "contiguous", ""),
    "smollm3_windowed_twin": ("smollm3", "ring", "zigzag", "windowed"),
    "olmo3_ring": ("olmo3", "ring", "zigzag", ""),
    "olmo3_ulysses": ("olmo3", "ulysses", "contiguous", ""),
    "olmo3_global_twin": ("olmo3", "ring", "zigzag", "global"),
}


def float64() -> None:
    """Eager's softmax and the families' RMSNorms in float64 (transformers' cast to float32),
    in both models: set before any model runs."""
    torch.set_default_dtype(torch.float64)
    softmax = torch.nn.functional.softmax
    torch.nn.functional.softmax = lambda x, dim=None, dtype=None, **kw: softmax(x, dim, **kw)
    for name, offset in NORMS.items():
        module, _, norm = name.rpartition(".")
        code = importlib.import_module(f"transformers.models.{module}")
        getattr(code, norm).forward = float64_norm(offset)
    for name in LAYER_NORMS:
        module, _, norm = name.rpartition(".")
        code = importlib.import_module(f"transformers.models.{module}")
        getattr(code, norm).forward = float64_layer_norm


def main() -> None:
    float64()
    rank, out, mesh = start()
    run_checks({name: lambda c=c: check(mesh, *c) for name, c in CHECKS.items()}, rank, out)


if __name__ == "__main__":
    main()
