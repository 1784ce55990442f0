"""docs/decisions.md's contents list every topic (`## ` heading), in order, each linked by
the anchor GitHub gives it (its decisions, `### `, follow it on the page; a list of all
of them took 25k of the page's characters). `python tests/docs/test_decisions_page.py`
rewrites the list after headings were added or renamed."""

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "decisions.md"
START, END = "## Contents\n\n", "\n\n## "


def anchor(heading: str, seen: dict[str, int]) -> str:
    """GitHub's anchor: lower case, punctuation but '-' and '_' dropped, spaces as '-';
    a repeated anchor gets -1, -2, ..."""
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return f"{slug}-{count}" if count else slug


def contents(text: str) -> str:
    body = text[text.index(START) + len(START) :]
    body = body[body.index(END) + 2 :]
    seen: dict[str, int] = {}
    lines = []
    for level, heading in re.findall(r"^(##|###) (.+)$", body, flags=re.MULTILINE):
        link = f"- [{heading}](#{anchor(heading, seen)})"  # every heading counts for anchors
        lines += [link] if level == "##" else []
    return "\n".join(lines)


def current(text: str) -> str:
    start = text.index(START) + len(START)
    return text[start : text.index(END, start)]


def test_contents_list_every_heading():
    text = PAGE.read_text(encoding="utf-8")
    assert current(text) == contents(text), "rerun: python tests/docs/test_decisions_page.py"


def test_contents_would_see_a_renamed_topic():
    text = PAGE.read_text(encoding="utf-8")
    renamed = text.replace("\n## Text", "\n## Renamed: Text", 1)
    assert current(renamed) != contents(renamed)


if __name__ == "__main__":
    text = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(text.replace(current(text), contents(text), 1), encoding="utf-8")
