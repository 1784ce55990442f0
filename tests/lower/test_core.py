"""The attention core as one value (lower/planner/core.py, issue 48): phrasings that compute the
same core meet the same `Core` (a soft cap in one equation or two, a mask added as a tensor,
inline or as a fill, the scale before or after the product, rotary's halves written as two
equations or as one over c), read off the canonical form; each equality has a twin that
changes one thing (the cap, the window, the sink) and sees another core."""

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import sympy

import indexattn
from indexattn.lower.planner.canonical import canonical
from indexattn.lower.planner.core import QK, find_cores, predicate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lower"))
from combinations import CAPS, PHRASINGS, draw  # noqa: E402


def cores(text: str):
    spec = indexattn.compile_spec(text, name="core_phrasing")
    return find_cores(canonical(spec.ir))


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


SOFTCAP = read("specs/softcap_window.attn")
R_LINE = "R_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(query_pre_attn_scalar)   # raw scores\n"
S_LINE = "S_<μττ'> = c tanh(R_<μττ'> / c) + M_<ττ'>                   # soft cap, then mask\n"
DOC = read("specs/doc_mask.attn")
DOC_S = "S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>\n"
DOC_M = "M_<ττ'>  = where(τ' > τ or D_<τ> != D_<τ'>, -inf, 0)   # causal, and one document only\n"
PHRASED = {
    "softcap in one equation": (
        SOFTCAP,
        SOFTCAP.replace(R_LINE, "").replace(
            S_LINE,
            "S_<μττ'> = c tanh(Q_<μτa> K_<μτ'a> / (c sqrt(query_pre_attn_scalar))) + M_<ττ'>\n",
        ),
    ),
    "softcap in three": (
        SOFTCAP,
        SOFTCAP.replace(S_LINE, "T_<μττ'> = tanh(R_<μττ'> / c)\nS_<μττ'> = T_<μττ'> c + M_<ττ'>\n"),
    ),
    "mask as a fill": (
        DOC,
        DOC.replace(DOC_M, "").replace(
            DOC_S,
            "S_<μττ'> = where(τ' > τ or D_<τ> != D_<τ'>, -inf, Q_<μτa> K_<μτ'a> / sqrt(d_k))\n",
        ),
    ),
    "mask inline, kept written as its complement": (
        DOC,
        DOC.replace(DOC_M, "").replace(
            DOC_S,
            "S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k)"
            " + where(τ' <= τ and D_<τ> == D_<τ'>, 0, -inf)\n",
        ),
    ),
    "scale before the product": (
        DOC,
        DOC.replace(
            DOC_S, "Qs_<μτa> = Q_<μτa> / sqrt(d_k)\nS_<μττ'> = Qs_<μτa> K_<μτ'a> + M_<ττ'>\n"
        ),
    ),
    "rotary halves as two equations": (
        read("specs/rope.attn"),
        read("benchmarks/specs/rope_halves.attn"),
    ),
}
TWINS = {
    "another cap": (SOFTCAP, SOFTCAP.replace("c tanh(R_<μττ'> / c)", "c tanh(R_<μττ'> / (2 c))")),
    "another mask": (DOC, DOC.replace("D_<τ> != D_<τ'>", "D_<τ> > D_<τ'>")),
    "another scale": (DOC, DOC.replace("/ sqrt(d_k) + M", "/ d_k + M")),
    "no sink": (
        read("specs/attention_sinks.attn"),
        read("specs/attention_sinks.attn").replace(
            "softmax_<τ'>(S_<grττ'>) sigmoid(L_<grτ> - sinks_<(gr)>)", "softmax_<τ'>(S_<grττ'>)"
        ),
    ),
}


@pytest.mark.parametrize("case", PHRASED)
def test_phrasings_meet_the_same_core(case):
    first, second = PHRASED[case]
    assert first != second
    found = cores(first)
    assert len(found) == 1
    assert cores(second) == found


@pytest.mark.parametrize("case", TWINS)
def test_twin_a_changed_core_is_another(case):
    first, second = TWINS[case]
    assert len(cores(first)) == len(cores(second)) == 1
    assert cores(second) != cores(first)


def test_the_core_reads_as_the_spec_writes_it():
    """softcap_window's core: the cap of the scaled product, the causal window, softmax."""
    (core,) = cores(SOFTCAP)
    named = {str(s): s for s in core.score.free_symbols | core.keep.free_symbols}
    c, scalar, w, query, key = (
        named[n] for n in ("c", "query_pre_attn_scalar", "w", "query", "key")
    )
    assert sympy.simplify(core.score - c * sympy.tanh(QK / (c * sympy.sqrt(scalar)))) == 0
    assert core.keep == predicate(sympy.And(key <= query, query - key < w))
    assert (core.normaliser, core.sink, core.reads) == ("softmax", None, ())


@pytest.mark.parametrize("seed", range(6))
def test_generated_phrasings_meet_the_same_core(seed):
    """A drawn combination, its mask written in each way and its cap in one equation or two
    (and rotary's halves either way): one core, found."""
    combination = draw(random.Random(seed))
    found = cores(combination.text)
    assert len(found) == 1, combination.name
    caps = CAPS[1:] if combination.cap != "none" else ("none",)
    rotary = (
        ("halves", "rotate")
        if combination.rotary in ("halves", "rotate")
        else (combination.rotary,)
    )
    for phrasing in PHRASINGS:
        for cap in caps:
            for turn in rotary:
                other = replace(combination, phrasing=phrasing, cap=cap, rotary=turn)
                assert cores(other.text) == found, other.name
