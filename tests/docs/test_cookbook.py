"""docs/cookbook.md stays true: each section's spec is the shipped file and its code lines are
in the spec's current generated source."""

import re
from pathlib import Path

import pytest

import indexattn

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "cookbook.md").read_text(encoding="utf-8")
SECTIONS = {s.split("\n", 1)[0].strip(): s for s in re.split(r"^## ", PAGE, flags=re.M)[1:]}


def test_every_section_is_a_shipped_spec():
    shipped = {p.stem for p in (ROOT / "specs").glob("*.attn")}
    assert len(SECTIONS) >= 18 and set(SECTIONS) <= shipped


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_section_quotes_the_shipped_spec_and_its_code(name):
    blocks = dict(re.findall(r"```(\w+)\n(.*?)```", SECTIONS[name], re.S))
    path = ROOT / "specs" / f"{name}.attn"
    assert blocks["text"].strip() == path.read_text(encoding="utf-8").strip()
    source = indexattn.compile_spec(path).source
    stale = [line for line in blocks["python"].splitlines() if line.strip() not in source]
    assert not stale, f"regenerate these lines of docs/cookbook.md: {stale}"
    assert "math" in blocks


def test_mha_shows_its_derived_backward():
    """mha's section quotes the equations `indexattn grad specs/mha.attn` writes (after the
    scores and weights it computes again), next to FlashAttention's."""
    shown = dict(re.findall(r"```(\w+)\n(.*?)```", SECTIONS["mha"], re.S))["attn"]
    written = indexattn.compile_spec(ROOT / "specs" / "mha.attn").backward_text()
    assert shown == written.split("\n\n")[-2] + "\n"
    assert "dS_<μττ'> = A_<μττ'> (dA_<μττ'> - dO_<μτa> O_<μτa>)" in shown  # D = rowsum(dO ∘ O)


def test_twin_without_flashattentions_identity_the_block_differs():
    from indexattn.derive import derive
    from indexattn.derive.rewrites import BACKWARD_REWRITES

    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    others = tuple(r for r in BACKWARD_REWRITES if r.name != "flash")
    shown = dict(re.findall(r"```(\w+)\n(.*?)```", SECTIONS["mha"], re.S))["attn"]
    written = derive(spec.ir, spec.text, spec.file, rewrites=others).text
    assert shown != written.split("\n\n")[-2] + "\n"
    assert "sum_<τ'>(A_<μττ'> dA_<μττ'>)" in written
