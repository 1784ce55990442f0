"""docs/performance.md is a short page whose tables and plots come from benchmarks/*.json:
benchmarks/report.py makes them again here, and the page and the SVGs must be what it makes,
so a figure on the page cannot drift from the file that keeps its run. Each check has a twin
that changes one figure in the JSON and sees the page (or the plot) change."""

import copy
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402

PAGE = ROOT / "docs" / "performance.md"


@pytest.fixture(scope="module")
def data() -> dict:
    return report.load()


def made(data: dict) -> str:
    return report.render(PAGE.read_text("utf-8"), report.tables(data))


def test_page_is_at_most_25k_characters():
    assert len(PAGE.read_text("utf-8")) <= 25_000


def test_every_table_on_the_page_is_the_one_the_json_makes(data):
    # To accept a change: .venv/bin/python benchmarks/report.py
    page = PAGE.read_text("utf-8")
    assert made(data) == page
    marked = re.findall(r"<!-- table: ([\w-]+) -->", page)
    assert sorted(marked) == sorted(report.tables(data)), "a table report.py makes is not shown"


def test_a_changed_figure_in_the_json_is_seen(data):
    changed = copy.deepcopy(data)
    alibi = next(t for t in changed["results"]["timings"] if t["case"] == "alibi")
    alibi["vs_hand"] = 3.21
    changed["gpu_h200"]["rows"][0]["ratio"] = 9.87
    page = made(changed)
    assert page != PAGE.read_text("utf-8")
    assert "| alibi | 3.21 |" in page and "| mha (causal) | FlexAttention | 9.87 (" in page


def test_a_table_the_script_does_not_make_is_refused(data):
    page = "<!-- table: nowhere -->\n| a |\n<!-- end nowhere -->\n"
    with pytest.raises(KeyError, match="nowhere"):
        report.render(page, report.tables(data))


def test_plots_are_the_ones_the_json_makes_and_follow_it(data):
    for path, text in report.plots(data).items():
        assert path.read_text("utf-8") == text, f"{path.name} is stale: run benchmarks/report.py"
    changed = copy.deepcopy(data)
    record = next(r for r in changed["scaling"] if (r["n"], r["mode"]) == (512, "forward"))
    record["s"] *= 3
    assert report.scaling_svg(changed["scaling"]) != report.scaling_svg(data["scaling"])


def test_the_log_axis_draws_small_times_where_they_are(data):
    """Times under 0.1 s keep their order and distance on the axis (they were all drawn at
    0.1 s before): 0.02 s lies below 0.05 s, as far below as 0.05 s is from 0.125 s."""
    panel = report.Panel((0, 0, 100, 100), [512, 8192], [0.016, 8.2])
    low, mid, high = (panel.px(512, t)[1] for t in (0.02, 0.05, 0.125))
    assert low > mid > high
    assert abs((low - mid) - (mid - high)) < 0.2


def test_twin_two_times_under_a_tenth_of_a_second_draw_apart(data):
    """Through the plot itself: one of the run's times at 0.02 s or at 0.05 s draws another
    plot (before, every time under 0.1 s was drawn at 0.1 s: one plot for both)."""

    def drawn(seconds: float) -> str:
        changed = copy.deepcopy(data)
        record = next(r for r in changed["scaling"] if (r["n"], r["mode"]) == (512, "forward"))
        record["s"] = seconds
        return report.scaling_svg(changed["scaling"])

    assert drawn(0.02) != drawn(0.05)


def test_the_scaling_plot_is_one_runs_data(data):
    """scaling.svg draws the records of the one run (report.ONE_RUN) and none from another:
    each of that run's records once per panel (memory, time), and a record at another N
    changes nothing."""
    svg = (ROOT / "docs" / "scaling.svg").read_text("utf-8")
    run = [r for r in data["scaling"] if r["n"] in report.ONE_RUN.get(r["mode"], ())]
    assert len(run) == 10 * 2 * 5 and max(max(r["load"]) for r in run) <= 2.2
    assert svg.count("<circle") == 2 * len(run)
    other = {**run[0], "n": 4096, "s": 99.0}
    assert report.scaling_svg([*data["scaling"], other]) == report.scaling_svg(data["scaling"])


def slug(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def broken(text: str, here: Path) -> list[str]:
    """The page's links to a file outside the repository or that does not exist, or to a
    heading that does not exist."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        file, _, anchor = target.partition("#")
        if target.startswith("http"):
            continue
        path = (here.parent / file).resolve() if file else here
        if not path.exists() or not path.is_relative_to(ROOT):
            bad.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text("utf-8"), flags=re.M)
            bad += [] if anchor in {slug(h) for h in headings} else [target]
    return bad


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_links_lead_to_files_and_headings_that_exist(path):
    assert broken(path.read_text("utf-8"), path) == []


def test_a_link_to_a_missing_heading_or_file_is_seen():
    path = ROOT / "docs" / "performance.md"
    text = "[a](measurements.md#phrasings) [b](measurements.md#phrasing) [c](nowhere.md)"
    outside = os.path.relpath(os.__file__, path.parent)  # a file that exists, not in the repository
    text += f" [d]({outside}) [e](../README.md#performance-in-one-paragraph)"
    assert broken(text, path) == ["measurements.md#phrasing", "nowhere.md", outside]
