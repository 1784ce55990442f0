"""What the model tests share (tests/test_models*.py): random weights, transformers' masks and
rotary tables in float64, the spec-against-layer comparison, a whole model's logits.

Not a test file: pytest puts tests/ on the path (rootdir-relative imports), so the test files
import it as `models_common`. Nothing here imports transformers.
"""

from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).parent.parent
TOL = {"atol": 1e-10, "rtol": 0}
B = 2


def randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every weight and bias random, so that no zero bias hides a layout mistake."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return module


def causal_mask(n: int, padded: dict) -> torch.Tensor:
    """transformers' 4D additive mask [B, 1, N, N]: causal, and key t of batch b hidden for each
    (b, t) in `padded` (never key 0, so that no query row is hidden everywhere)."""
    mask = torch.zeros(B, 1, n, n, dtype=torch.float64)
    mask.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    for b, t in padded.items():
        mask[b, :, :, t] = torch.finfo(torch.float64).min
    return mask


def rotary(positions: torch.Tensor, d_k: int, theta: float):
    """cos and sin as transformers' LlamaRotaryEmbedding makes them, but in float64."""
    inv_freq = theta ** -(torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    freqs = positions[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def float64_rotary(model):
    """Give a Llama-like model the float64 rotary table: transformers computes it in float32."""
    config = model.config
    d_k = config.hidden_size // config.num_attention_heads

    def forward(x, position_ids):
        return rotary(position_ids, d_k, config.rope_parameters["rope_theta"])

    model.model.rotary_emb.forward = forward
    return model


def float64_rms_norm(norm):
    """DeepseekV3RMSNorm without its float32 upcast: the same formula, in the input's dtype."""

    def forward(x):
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * x * rms

    norm.forward = forward
    return norm


def _ascii(key: str) -> str:
    """A transformers state_dict key as the spec's parameter name: dots become underscores."""
    return key.replace(".", "_")


def compare(layer, module, x, extra, run, tol=TOL):
    """Outputs, attention weights, and gradients of a random loss to the input and every
    weight: the spec's module against the transformers layer, within `tol`."""
    (y, a, *_), (y_hf, a_hf) = run(layer, module, x, *extra)
    torch.testing.assert_close(y, y_hf, **tol)
    if a_hf is not None:  # sdpa returns no weights
        torch.testing.assert_close(a.reshape(a_hf.shape), a_hf, **tol)
    probe = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    params = dict(module.named_parameters())
    names, weights = zip(*layer.named_parameters())
    ours = torch.autograd.grad((y * probe).sum(), [x, *(params[_ascii(n)] for n in names)])
    theirs = torch.autograd.grad((y_hf * probe).sum(), [x, *weights])
    assert len(ours) == len(theirs) == len(names) + 1
    for name, g, g_hf in zip(["input", *names], ours, theirs, strict=True):
        torch.testing.assert_close(g, g_hf, **tol, msg=lambda m, n=name: f"{n}: {m}")


def logits(model, ids, padding):
    """A whole model's logits, the cache off."""
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=padding, use_cache=False).logits
