"""What is benchmarked: each case is a shipped spec at real sizes, and the implementations of
its mathematics: the generated module, hand-written classic and fused PyTorch,
nn.MultiheadAttention (where it computes the same thing), and the literal interpreter. All
share one set of weights, and are checked to agree before they are timed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from handwritten import GPT2, GQA, MHA, Cross
from torch import nn

import indexattn
from indexattn.oracle import reference

SPECS = Path(__file__).resolve().parent.parent / "specs"
IMPLEMENTATIONS = ("generated", "fused", "classic", "nn.MultiheadAttention", "literal")


@dataclass(frozen=True)
class Case:
    name: str
    spec: str  # specs/<spec>.attn
    sizes: dict  # spec.module(**sizes)
    shapes: tuple[tuple[int, int], ...]  # (batch, sequence) pairs
    hand: type | None  # the hand-written module class (fused= selects the style)
    hand_sizes: tuple[str, ...] = ()  # its positional size arguments, from `sizes`
    context: int = 0  # cross-attention: the context length
    fusable: bool = True  # whether a fused kernel computes the spec
    note: str = ""
    extra: dict = field(default_factory=dict)


GPT2_SMALL = {"d_m": 768, "h": 12, "d_k": 64}
CASES = {
    "gpt2-small causal": Case(
        "gpt2-small causal",
        "mha",
        GPT2_SMALL,
        ((1, 128), (4, 512), (2, 1024), (1, 2048)),
        MHA,
        ("d_m", "h", "d_k"),
        note="specs/mha.attn: fused (μBa) projection, causal, 12 heads of 64, width 768",
    ),
    "gqa 32/8": Case(
        "gqa 32/8",
        "gqa",
        {"d_m": 1024, "h_kv": 8, "n_rep": 4, "d_k": 32},
        ((4, 512),),
        GQA,
        ("d_m", "h_kv", "n_rep", "d_k"),
        note="specs/gqa.attn: 32 query heads sharing 8 key/value heads, width 1024, causal",
    ),
    "cross": Case(
        "cross",
        "cross",
        {"d_q": 768, "d_c": 768, "h": 12, "d_k": 64},
        ((2, 1024),),
        Cross,
        ("d_q", "d_c", "h", "d_k"),
        context=77,
        note="specs/cross.attn: 1024 queries attend to a 77-token context, width 768",
    ),
    "gpt2 weights returned": Case(
        "gpt2 weights returned",
        "gpt2",
        GPT2_SMALL,
        ((4, 512),),
        GPT2,
        ("d_m", "h", "d_k"),
        fusable=False,
        note="specs/gpt2.attn: returns the attention weights, so no fused kernel computes it",
    ),
    "per-call overhead": Case(
        "per-call overhead",
        "mha",
        {"d_m": 64, "h": 4, "d_k": 16},
        ((1, 16),),
        MHA,
        ("d_m", "h", "d_k"),
        note="specs/mha.attn at (b, n, d) = (1, 16, 64): Python overhead per call",
    ),
}


def build(case: Case, implementation: str, b: int, n: int, dtype=torch.float32):
    """(call, inputs, parameters) for one implementation; None where it does not apply."""
    spec = indexattn.compile_spec(SPECS / f"{case.spec}.attn")
    torch.manual_seed(0)
    generated = spec.module(**case.sizes).to(dtype).eval()
    with torch.no_grad():
        for p in generated.parameters():
            p.normal_(0, 0.02)
    inputs = make_inputs(case, spec, b, n, dtype)
    if implementation == "generated":
        return generated, inputs, list(generated.parameters())
    if implementation == "literal":
        return literal(spec, generated), inputs, list(generated.parameters())
    if implementation in ("fused", "classic"):
        if implementation == "fused" and not case.fusable:
            return None
        sizes = (case.sizes[k] for k in case.hand_sizes)
        module = case.hand(*sizes, fused=implementation == "fused").to(dtype).eval()
        module.load_state_dict(generated.state_dict())
        return module, inputs, list(module.parameters())
    return torch_mha(case, generated, inputs, dtype)


def make_inputs(case: Case, spec, b: int, n: int, dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for tensor in spec.ir.tensors_of("input"):
        if tensor.ascii == "P":  # the padding mask: every row keeps its keys
            out.append(torch.zeros(b, n, dtype=dtype))
            continue
        length = case.context if tensor.ascii == "C" else n
        width = case.sizes[str(tensor.shape[-1])]  # the model width: one size symbol
        out.append(torch.randn(b, length, width, generator=generator, dtype=dtype))
    return out


def literal(spec, module):
    """The literal interpreter with the module's weights."""
    names = [t.ascii for t in spec.ir.tensors_of("input")]

    def run(*inputs):
        params = {name: getattr(module, name) for name, _ in module.named_parameters()}
        out = reference.evaluate(spec.ir, **dict(zip(names, inputs)), **params, **module.sizes)
        return out[0] if len(out) == 1 else out

    return run


def torch_mha(case: Case, generated, inputs, dtype):
    """nn.MultiheadAttention with the same weights, where it computes the same thing."""
    s = case.sizes
    if case.spec == "gqa":
        return None
    width, h, d_k = s.get("d_m", s.get("d_q")), s["h"], s["d_k"]
    mha = nn.MultiheadAttention(width, h, batch_first=True).to(dtype).eval()
    state = generated.state_dict()
    with torch.no_grad():
        mha.in_proj_weight.copy_(_in_proj(case, state, h, d_k))
        mha.in_proj_bias.copy_(state.get("c_attn_bias", torch.zeros(3 * h * d_k)))
        weight, bias = OUT_PROJ[case.spec]
        mha.out_proj.weight.copy_(state[weight])
        mha.out_proj.bias.copy_(state[bias])
    n = inputs[0].shape[1]
    hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
    if case.spec == "mha":
        return (
            (lambda x: mha(x, x, x, attn_mask=hidden, is_causal=True, need_weights=False)[0]),
            inputs,
            list(mha.parameters()),
        )
    if case.spec == "cross":
        return (lambda x, c: mha(x, c, c, need_weights=False)[0]), inputs, list(mha.parameters())
    additive = torch.zeros(n, n, dtype=dtype).masked_fill(hidden, float("-inf"))

    def gpt2(x, padding):
        return mha(
            x,
            x,
            x,
            attn_mask=additive,
            key_padding_mask=padding,
            need_weights=True,
            average_attn_weights=False,
        )

    return gpt2, inputs, list(mha.parameters())


OUT_PROJ = {  # spec -> its output projection's weight and bias
    "mha": ("W_O", "b_O"),
    "cross": ("to_out_weight", "to_out_bias"),
    "gpt2": ("c_proj_weight", "c_proj_bias"),
}


def _in_proj(case: Case, state: dict, h: int, d_k: int) -> torch.Tensor:
    """in_proj_weight, rows (Bμa): query, key and value blocks."""
    if case.spec == "mha":  # rows (μBa) -> (Bμa)
        w = state["W"]
        return w.view(h, 3, d_k, -1).transpose(0, 1).reshape(3 * h * d_k, -1)
    if case.spec == "cross":
        return torch.cat([state["to_q_weight"], state["to_k_weight"], state["to_v_weight"]])
    return state["c_attn_weight"]
