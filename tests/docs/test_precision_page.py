"""docs/precision.md: `benchmarks/precision.py --write` rewrites the table above the marker
and keeps the part written by hand after it (the figures behind the numerics decisions)."""

from pathlib import Path

from benchmarks import precision

PAGE = Path(__file__).resolve().parents[2] / "docs" / "precision.md"


def test_regenerating_the_table_keeps_the_hand_written_part():
    page = PAGE.read_text(encoding="utf-8")
    hand = page[page.index(precision.HAND) :]
    assert "## Measured for the numerics decisions" in hand
    assert precision.HAND not in precision.generated_part(page)
    table = "# Low precision, measured again\n"
    assert precision.with_hand_part(table, page) == f"{table}\n{hand}"


def test_a_page_without_the_marker_is_all_generated():
    page = PAGE.read_text(encoding="utf-8").replace(precision.HAND, "<!-- a comment -->")
    assert precision.generated_part(page) == page
    assert precision.with_hand_part("# table\n", page) == "# table\n"
