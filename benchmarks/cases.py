"""What is benchmarked: every shipped spec (specs/*.attn) and the phrasing pairs of
benchmarks/specs/*.attn, each against its hand-written PyTorch (benchmarks/handwritten.py,
eager and torch.compile'd) and FlexAttention's forward where the spec's core is a mask or a
score modification. All share one set of weights (the reference module's, mapped onto the
spec's parameters as tests/reference does) and are checked to agree before they are timed."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.reference: the hand-written modules' parameters

import handwritten  # noqa: E402
from baselines import retention  # noqa: E402

import indexattn  # noqa: E402
import indexattn.oracle.verify  # noqa: E402
from tests.reference import classic  # noqa: E402
from tests.reference.cases import CASES as CLASSIC  # noqa: E402
from tests.reference.cases import positional, torch_mha_call  # noqa: E402
from tests.reference.modern_a import MODERN_A_CASES  # noqa: E402
from tests.reference.modern_b import MODERN_B_CASES  # noqa: E402
from tests.reference.mta import MTA_CASES  # noqa: E402
from tests.reference.nsa import NativeSparseAttention  # noqa: E402
from tests.reference.selective import SelectiveAttention  # noqa: E402
from tests.reference.ssd import SSD  # noqa: E402

IMPLEMENTATIONS = ("generated", "eager", "compiled", "flex")
SHAPES = ((1, 512), (1, 2048))
DECODE = (1, 1, 2048)  # kv_decode's decode step: batch, new tokens, cached keys

# GPT-2 small's width and heads, 12 of 64; the variants' own sizes where they need others.
SIZES = {
    **dict.fromkeys(("d_m", "d_in", "d_out", "d_q", "d_c", "d"), 768),
    **{"h": 12, "d_k": 64, "h_kv": 4, "n_rep": 3, "d_r": 32, "offset": 0},
    **{"w": 256, "P": 256, "C": 512, "c": 50.0, "query_pre_attn_scalar": 64},
}
PER_SPEC = {
    "rope_partial": {"d_r": 8, "d_p": 48},  # heads of 64, a quarter rotated
    "mla": {"d_q": 384, "d_c": 128, "d_n": 64, "d_r": 32, "d_v": 64},
    "differential": {"d": 32},  # 2·12 heads of 32 for the two maps
    "simple": {"d": 64},
    "sdpa": {"d_k": 64, "d_v": 64},
    "cross": {"L": 77},  # Stable Diffusion's text context
}


@dataclass(frozen=True)
class Case:
    name: str  # the spec's name
    path: Path  # its .attn file
    reference: object  # tests/reference Case: the module, its sizes and weight mapping
    note: str = ""

    @property
    def sizes(self) -> dict:
        own = PER_SPEC.get(self.name, {})
        return {k: own.get(k, SIZES.get(k, v)) for k, v in self.reference.sizes.items()}

    @property
    def call(self):
        return torch_mha_call if self.reference.call is torch_mha_call else positional

    def shapes(self) -> tuple:
        return (*SHAPES, DECODE) if self.name == "kv_decode" else SHAPES


def rename_mha(state: dict) -> dict:
    """FusedHeadMajorAttention -> specs/mha.attn: W_qkv.weight -> W, W_O -> W_O, b_O."""
    names = {"W_qkv.weight": "W", "W_O.weight": "W_O", "W_O.bias": "b_O"}
    return {names[k]: v for k, v in state.items()}


# The cores `attn_implementation="indexattn"` picks per call, and those context_parallel_model
# splits per layer kind: checked against transformers' eager attention
# (tests/models/test_models_interface.py, tests/parallel/test_context_parallel_families.py),
# not against a hand module of this folder.
INTERFACE_CORES = frozenset(
    {"softcap_core", "sinks_core", "gqa_causal_core", "gqa_unmasked_core", "gqa_heads_core"}
    | {"gqa_chunked_core", "gqa_window_core", "sinks_window_core", "softcap_window_core"}
)


def _cases() -> dict[str, Case]:
    reference = {c.spec: c for c in (*CLASSIC, *MODERN_A_CASES, *MODERN_B_CASES, *MTA_CASES)}
    mha = next(c for c in CLASSIC if c.spec == "mha_math")
    reference["mha"] = type(mha)("mha", mha.build, mha.inputs, mha.sizes, mapping=rename_mha)
    reference["retention"] = RETENTION
    reference["nsa"] = NSA
    reference["ssd"] = SSD_CASE
    reference["selective"] = SELECTIVE
    out = {
        path.stem: Case(path.stem, path, reference[path.stem])
        for path in sorted((ROOT / "specs").glob("*.attn"))
        if path.stem not in INTERFACE_CORES
    }
    pairs = {  # phrasing -> the shipped spec it rephrases
        "mha_inline": "mha",
        "mha_one_product": "mha",
        "mha_one_equation": "mha",
        "mha_masked_fill": "mha",
        "rope_halves": "rope",
        "shared_mask": None,
    }
    for name, of in pairs.items():
        path = ROOT / "benchmarks" / "specs" / f"{name}.attn"
        ref = reference[of] if of else SHARED_MASK
        out[name] = Case(name, path, ref, note=f"phrasing of {of}" if of else "phrasing")
    return out


class SharedMask(torch.nn.Module):
    """benchmarks/specs/shared_mask.attn by hand: two causal cores, their outputs summed."""

    def __init__(self, d_m, h, d_k):
        super().__init__()
        self.h = h
        self.W1 = torch.nn.Parameter(torch.randn(h * 3 * d_k, d_m) * 0.02)
        self.W2 = torch.nn.Parameter(torch.randn(h * 3 * d_k, d_m) * 0.02)
        self.W_O = torch.nn.Parameter(torch.randn(d_m, h * d_k) * 0.02)

    def forward(self, x):
        out = 0
        for w in (self.W1, self.W2):
            q, k, v = classic.split_head_major(torch.nn.functional.linear(x, w), self.h)
            out = out + handwritten.sdpa(q, k, v, is_causal=True)
        return torch.nn.functional.linear(classic.merge_heads(out), self.W_O)


def own_reference(name: str, module: type[torch.nn.Module]):
    """A reference whose hand-written module is here, its weights named as the spec's."""
    return type(CLASSIC[0])(
        name,
        lambda s: module(s["d_m"], s["h"], s["d_k"]),
        None,
        {"d_m": 768, "h": 12, "d_k": 64},
        mapping=lambda state: dict(state),
    )


SHARED_MASK = own_reference("shared_mask", SharedMask)


class Retention(torch.nn.Module):
    """specs/retention.attn by hand: RetNet's chunkwise form (benchmarks/baselines/retention.py),
    its weights named as the spec's parameters."""

    def __init__(self, d_m, h, d_k):
        super().__init__()
        self.h = h
        for name in ("W_Q", "W_K", "W_V"):
            setattr(self, name, torch.nn.Parameter(torch.randn(h * d_k, d_m) * 0.02))
        self.W_O = torch.nn.Parameter(torch.randn(d_m, h * d_k) * 0.02)
        self.lambda_ = torch.nn.Parameter(torch.empty(h).uniform_(-0.1, -0.01))

    def forward(self, x):
        return retention.forward(x, dict(self.named_parameters()), {"h": self.h})


RETENTION = own_reference("retention", Retention)
NSA = type(CLASSIC[0])(  # blocks of 64 keys, as the paper's selection blocks
    "nsa",
    lambda s: NativeSparseAttention(s["d_m"], s["h"], s["d_k"], block=s["l"]),
    None,
    {"d_m": 768, "h": 12, "d_k": 64, "l": 64},
    mapping=lambda state: {k.replace(".", "_"): v for k, v in state.items()},
)
SSD_CASE = type(CLASSIC[0])(  # Mamba-2's heads: 64 wide, a state of 128
    "ssd", lambda s: SSD(), None, {"h": 12, "d_head": 64, "d_state": 128}, mapping=lambda _: {}
)
SELECTIVE = type(CLASSIC[0])(  # 12 heads of 64, head 0 selecting
    "selective", lambda s: SelectiveAttention(), None, {"h": 12, "d_k": 64}, mapping=lambda _: {}
)
CASES = _cases()


def build(case: Case, implementation: str, shape: tuple, dtype=torch.float32):
    """(call, inputs, parameters) for one implementation; None where it does not apply."""
    spec = indexattn.compile_spec(case.path)
    torch.manual_seed(0)
    hand = case.reference.build(case.sizes).to(dtype).eval()
    inputs = make_inputs(case, spec, shape, dtype)
    if implementation == "generated":
        module = spec.module(**case.sizes).to(dtype).eval()
        module.load_state_dict(case.reference.mapping(hand.state_dict()))
        return module, inputs, list(module.parameters())
    if implementation == "flex":
        hand = handwritten.flex(hand)
        if hand is None:
            return None
    else:
        hand = handwritten.fast(hand)
    call = hand if case.call is positional else (lambda *a: case.call(hand, dict(enumerate(a))))
    if implementation == "compiled":
        call = torch.compile(call)
    return call, inputs, list(hand.parameters())


def make_inputs(case: Case, spec, shape: tuple, dtype) -> list[torch.Tensor]:
    """The spec's inputs at batch b and sequence n (the decode step: 1 new token and the cache
    of n_c); document ids in 4 packed documents; masks that hide nothing."""
    b, n, n_c = shape if len(shape) == 3 else (*shape, shape[1])
    sizes = {**dict.fromkeys(("N", "N_q", "N_kv"), n), "N_c": n_c}
    sizes |= case.sizes | PER_SPEC.get(case.name, {})
    values = indexattn.oracle.verify.sample_arguments(spec.ir, sizes, (b,), dtype, seed=1)
    out = []
    for tensor in spec.ir.tensors_of("input"):
        x = values[tensor.ascii]
        if tensor.dtype == "int":
            x = torch.arange(n).div(n // 4, rounding_mode="floor").expand(b, n)
        elif x.dim() - 1 == len(tensor.shape) == 1 or tensor.ascii == "M":  # additive masks
            x = torch.zeros_like(x)
        out.append(x)
    return out
