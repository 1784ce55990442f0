"""docs/cookbook.md stays true: each section links its spec's shipped file and page instead of
repeating them, its LaTeX lines are the spec page's current ones, and its code lines are in the
spec's current generated source. Each check has a twin that changes one line and is seen."""

import re
from pathlib import Path

import pytest

import indexattn

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "cookbook.md").read_text(encoding="utf-8")
SECTIONS = {s.split("\n", 1)[0].strip(): s for s in re.split(r"^## ", PAGE, flags=re.M)[1:]}


def blocks(section: str) -> dict[str, str]:
    return dict(re.findall(r"```(\w+)\n(.*?)```", section, re.S))


def stale_math(name: str, section: str) -> list[str]:
    """The section's LaTeX lines that the spec's page (docs/specs/NAME.md) does not hold."""
    page = (ROOT / "docs" / "specs" / f"{name}.md").read_text(encoding="utf-8")
    lines = [line for line in blocks(section)["math"].splitlines() if "{aligned}" not in line]
    return [line for line in lines if line.replace(" &= ", " = ").rstrip(" \\") not in page]


def stale_code(name: str, section: str) -> list[str]:
    source = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn").source
    return [line for line in blocks(section)["python"].splitlines() if line.strip() not in source]


def test_every_section_is_a_shipped_spec():
    shipped = {p.stem for p in (ROOT / "specs").glob("*.attn")}
    assert len(SECTIONS) >= 18 and set(SECTIONS) <= shipped


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_section_links_the_spec_and_quotes_its_latex_and_code(name):
    section = SECTIONS[name]
    assert f"(../specs/{name}.attn)" in section and f"(specs/{name}.md)" in section
    assert "text" not in blocks(section), "link the spec file instead of repeating it"
    assert stale_math(name, section) == [], "copy these lines from docs/specs/NAME.md"
    assert stale_code(name, section) == [], "regenerate these lines of docs/cookbook.md"


def test_a_changed_latex_or_code_line_is_seen():
    section = SECTIONS["rope"]
    math = section.replace("10000^{\\frac{-j}{d_r}}", "10000^{\\frac{-2j}{d_r}}")
    assert len(stale_math("rope", math)) == 1
    code = section.replace("cos = torch.cos(theta)", "cos = torch.cos(2*theta)")
    assert stale_code("rope", code) == ["cos = torch.cos(2*theta)  # (τ, j)"]


def test_mha_shows_its_derived_backward():
    """mha's section quotes the equations `indexattn grad specs/mha.attn` writes (after the
    scores and weights it computes again), next to FlashAttention's."""
    shown = blocks(SECTIONS["mha"])["attn"]
    written = indexattn.compile_spec(ROOT / "specs" / "mha.attn").backward_text()
    assert shown == written.split("\n\n")[-2] + "\n"
    assert "dS_<μττ'> = A_<μττ'> (dA_<μττ'> - dO_<μτa> O_<μτa>)" in shown  # D = rowsum(dO ∘ O)


def test_twin_without_flashattentions_identity_the_block_differs():
    from indexattn.derive import derive
    from indexattn.derive.rewrites import BACKWARD_REWRITES

    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    others = tuple(r for r in BACKWARD_REWRITES if r.name != "flash")
    shown = blocks(SECTIONS["mha"])["attn"]
    written = derive(spec.ir, spec.text, spec.file, rewrites=others).text
    assert shown != written.split("\n\n")[-2] + "\n"
    assert "sum_<τ'>(A_<μττ'> dA_<μττ'>)" in written
