"""Counts: parameters against the built modules, FLOPs against torch's FlopCounterMode on the
matrix products, the cost registry, and `indexattn count`."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import sympy
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import indexattn
from indexattn.cli import main
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.views import cost

ROOT = Path(__file__).resolve().parents[2]

FOUR_BIASED_PROJECTIONS = """
index τ, τ' : N
index i     : d_m
index μ     : h
index a     : d_k

input X_<τi>
param W_Q_<(μa)i>
param b_Q_<(μa)>
param W_K_<(μa)i>
param b_K_<(μa)>
param W_V_<(μa)i>
param b_V_<(μa)>
param W_O_<i(μa)>
param b_O_<i>

Q_<μτa>  = W_Q_<(μa)i> X_<τi> + b_Q_<(μa)>
K_<μτa>  = W_K_<(μa)i> X_<τi> + b_K_<(μa)>
V_<μτa>  = W_V_<(μa)i> X_<τi> + b_V_<(μa)>
A_<μττ'> = softmax_<τ'>(Q_<μτa> K_<μτ'a> / sqrt(d_k))
O_<μτa>  = A_<μττ'> V_<μτ'a>
Y_<τi>   = W_O_<i(μa)> O_<μτa> + b_O_<i>
"""


def test_four_biased_projections_of_width_768_with_12_heads():
    spec = indexattn.compile_spec(FOUR_BIASED_PROJECTIONS, name="biased")
    count = spec.param_count()
    assert str(count) == "4*d_k*d_m*h + 3*d_k*h + d_m"
    sizes = cost.sizes_for(spec.ir, {"d_m": 768, "h": 12, "d_k": 64})
    assert cost.evaluate(count, sizes) == 4 * 768**2 + 4 * 768
    module = spec.module(d_m=768, h=12, d_k=64)
    assert sum(p.numel() for p in module.parameters()) == 4 * 768**2 + 4 * 768


def sizes_of(spec) -> dict:
    names = sample_sizes(spec.ir)
    return {s: names[n] for n, s in cost.size_names(spec.ir).items() if n in names}


def test_param_count_is_what_the_module_holds(shipped):
    values = sample_sizes(shipped.ir)
    module = shipped.module(**values)
    expected = cost.evaluate(shipped.param_count(), sizes_of(shipped))
    assert sum(p.numel() for p in module.parameters()) == expected


def test_matrix_product_flops_are_what_torch_counts(shipped):
    values = sample_sizes(shipped.ir)
    args = sample_arguments(shipped.ir, values, dtype=torch.float32)
    with FlopCounterMode(display=False) as counter, sdpa_kernel([SDPBackend.MATH]):
        shipped(**args, **values)  # the math kernel: its matrix products are counted on CPU
    matmul = sum((c for _, c in cost.block_costs(shipped.plan)), cost.Cost()).matmul
    assert counter.get_total_flops() == cost.evaluate(matmul, sizes_of(shipped))


def test_flops_of_the_spec_are_the_plans():
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    assert spec.flops() == cost.flops(spec.plan)
    assert spec.flops().free_symbols == set(spec.sizes)


@pytest.mark.parametrize(
    "equation, per_element",
    [
        ("Y_<ij> = softmax_<j>(X_<ij>)", cost.SOFTMAX_PER_ELEMENT),
        ("Y_<ij> = exp(X_<ij>)", 1),
        ("Y_<ij> = X_<ij> + X_<ij>", 1),
        ("Y_<ij> = dropout(X_<ij>, 0.1)", 0),
        ("Y_<ij> = 2 X_<ij>", 1),
    ],
)
def test_documented_costs_per_element(equation, per_element):
    text = f"index i : n\nindex j : m\ninput X_<ij>\n{equation}"
    spec = indexattn.compile_spec(text, name="t")
    n, m = sorted(spec.sizes, key=str)[::-1]
    assert spec.flops() == per_element * n * m


def test_a_contraction_costs_two_per_multiply_add():
    text = (
        "index i : n\nindex j : m\nindex k : p\ninput A_<ij>\ninput B_<jk>\nC_<ik> = A_<ij> B_<jk>"
    )
    spec = indexattn.compile_spec(text, name="t")
    n, m, p = (sympy.Symbol(s, integer=True, positive=True) for s in "nmp")
    assert spec.flops() == 2 * n * m * p


def test_a_step_kind_without_a_cost_is_an_error():
    @dataclass(frozen=True)
    class Teleport:
        out: object

    with pytest.raises(NotImplementedError, match="no FLOP count for the plan step kind Teleport"):
        cost.step_cost(Teleport(None))


def test_count_prints_an_aligned_table(capsys):
    assert main(["count", str(ROOT / "specs" / "mha.attn"), "--size", "h=16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mha at N = 1024, d_m = 768, h = 16, d_k = 64\n")
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    assert any(r.split()[:2] == ["W_<(μBa)i>", "3*d_k*d_m*h"] for r in rows)
    assert any(r.split()[-1] == f"{4 * 64 * 768 * 16 + 768:,}" for r in rows)
    assert len({len(r) for r in rows if r.split()[0] == "total"}) == 1  # aligned


@pytest.mark.parametrize("size", ["h=0", "h", "h=x"])
def test_count_with_a_wrong_size_is_a_usage_error(size, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["count", str(ROOT / "specs" / "mha.attn"), "--size", size])
    assert caught.value.code == 2


def test_count_with_an_unknown_size_name(capsys):
    assert main(["count", str(ROOT / "specs" / "mha.attn"), "--size", "zz=3"]) == 2
    assert "mha has no size zz; its sizes are N, d_m, h, d_k" in capsys.readouterr().err
