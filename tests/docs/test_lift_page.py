"""docs/lift.md prints each lifted module's spec as lift prints it now (tests/docs/
lift_sections.py writes the sections); a twin: a page with one glyph of one spec changed is
seen as stale."""

import pytest
from lift_sections import PAGE, on_page, sections

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # lifts 17 modules


@pytest.fixture(scope="module")
def printed():
    return sections()


def test_the_pages_lifted_specs_are_what_lift_prints_now(printed):
    assert on_page(PAGE.read_text()) == printed


def test_twin_a_changed_spec_on_the_page_is_stale(printed):
    stale = printed.replace("softmax_<τ'>", "softmax_<τ>", 1)
    assert stale != printed and on_page(stale) != printed
