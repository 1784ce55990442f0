"""docs/architecture.md states the code's own lists: the passes in order (with their modules
and guarantees), the derived backward's rewrites in order, the planner's product and
reduction rules in order, and the step kinds."""

import re
import sys
import typing
from pathlib import Path

from indexattn.derive import rewrites
from indexattn.lower.planner import canonical, plan, products
from indexattn.lower.program import passes, steps

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def section(name: str, page: str = PAGE) -> str:
    return page.split(f"<!-- {name}:", 1)[1].split(f"<!-- end {name} -->", 1)[0]


def rows(name: str, page: str = PAGE) -> list[list[str]]:
    """The table's rows below its header, cells stripped of code quotes."""
    lines = [line for line in section(name, page).splitlines() if line.startswith("| ")][2:]
    return [[cell.strip().strip("`") for cell in line.strip("|").split(" | ")] for line in lines]


def pass_table(page: str) -> list[tuple[str, str, str]]:
    return [tuple(r) for r in rows("passes", page)]


def code_passes() -> list[tuple[str, str, str]]:
    """Each pass's name, module (as the page writes it) and guarantees."""
    return [
        (p.name, f"passes/{p.run.__module__.rsplit('.', 1)[1]}.py", p.guarantees)
        for p in passes.PASSES
    ]


def test_the_pass_list_is_the_code_s():
    assert pass_table(PAGE) == code_passes()


def test_the_product_rules_are_the_code_s():
    assert [r[0] for r in rows("product rules")] == [r.name for r in products.PRODUCT_RULES]


def test_the_reduction_rules_are_the_code_s():
    assert [r[0] for r in rows("reduction rules")] == [r.name for r in plan.REDUCTION_RULES]


def test_the_canonical_rewrites_are_the_code_s():
    want = [(r.name, r.guarantees) for r in canonical.REWRITES]
    assert [tuple(r) for r in rows("rewrites")] == want


def test_the_backward_rewrites_are_the_code_s():
    want = [(r.name, r.hook, r.guarantee) for r in rewrites.BACKWARD_REWRITES]
    assert [tuple(r) for r in rows("backward rewrites")] == want


def test_a_page_with_two_backward_rewrites_swapped_is_seen():
    page = PAGE.replace("| `flash` |", "| `FLASH` |").replace("| `stack` |", "| `flash` |")
    want = [(r.name, r.hook, r.guarantee) for r in rewrites.BACKWARD_REWRITES]
    assert [tuple(r) for r in rows("backward rewrites", page)] != want


def test_the_step_kinds_are_the_code_s():
    listed = re.findall(r"`(\w+)`", section("kinds"))
    assert listed == [k.__name__ for k in typing.get_args(steps.Step)]


def test_a_page_with_two_passes_swapped_is_seen():
    lines = PAGE.splitlines(keepends=True)
    first = next(k for k, line in enumerate(lines) if line.startswith("| `hoist`"))
    lines[first], lines[first + 1] = lines[first + 1], lines[first]
    assert pass_table("".join(lines)) != code_passes()


def imported_folders(folder: str) -> set[str]:
    """The folders of indexattn that the modules of `folder` import from."""
    found = set()
    for path in (ROOT / "indexattn" / folder).rglob("*.py"):
        depth = len(path.relative_to(ROOT / "indexattn").parts) - 1
        for dots, name in re.findall(r"^\s*from (\.+)(\w*)", path.read_text(), re.M):
            if len(dots) == depth + 1 and name:  # from the package root: a sibling folder
                found.add(name)
    return found


def test_no_folder_loop_between_lower_and_derive():
    """derive/ reads lower/ (the numerics policy); lower/ never reads derive/: what both need
    (the spec printer, the sequence indices) is in ir/."""
    assert "lower" in imported_folders("derive")
    assert "derive" not in imported_folders("lower")
    assert "ir" in imported_folders("lower")  # the twin: the scan sees a folder's imports


def layout():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import layout as measured

    return measured.measure()


def listed_folders(page: str) -> set[str]:
    return {r[0] for r in rows("layout", page)}


def test_the_line_counts_list_every_sub_package_and_the_largest_are_named():
    """The table of lines per folder lists the folders benchmarks/layout.py measures, no more,
    no fewer; the largest class and function the page names are the ones it finds."""
    lines, largest_class, largest_function = layout()
    assert listed_folders(PAGE) == set(lines)
    assert all(int(r[1]) > 0 for r in rows("layout"))
    paragraph = PAGE.split("<!-- end layout -->", 1)[1].split("\n\n", 2)[1]
    assert "largest class" in paragraph and "largest function" in paragraph
    for _, where in (largest_class, largest_function):
        name, path = where.split(", ")
        assert f"`{name}` (`{path.removeprefix('indexattn/')}`" in paragraph


def test_a_folder_left_out_of_the_line_counts_is_seen():
    lines, _, _ = layout()
    page = PAGE.replace("| `indexattn/lifting/` |", "| `indexattn/lifted/` |")
    assert listed_folders(page) != set(lines)


def tree(page: str) -> str:
    return page.split("## The folders\n\n```\n", 1)[1].split("```", 1)[0]


def missing_from_tree(page: str) -> list[str]:
    """The package's sub-packages (and backends' modules) the folder tree does not name."""
    package = ROOT / "indexattn"
    wanted = [p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()]
    backends = package / "backends"
    wanted += [p.name + ("/" if p.is_dir() else "") for p in backends.iterdir()]
    wanted = [w for w in wanted if not w.startswith(("__", "."))]
    drawn = tree(page)
    return [w for w in wanted if not re.search(rf"^\s+{re.escape(w)}", drawn, re.M)]


def test_the_folder_tree_names_every_sub_package_and_backend():
    assert missing_from_tree(PAGE) == []
    assert missing_from_tree(PAGE.replace("  lifting/ ", "  lifted/ ")) == ["lifting/"]


def extension_files(page: str) -> dict[str, list[str]]:
    return {r[0]: [f.strip(" `") for f in r[1].split(",")] for r in rows("extensions", page)}


def unsupported(page: str) -> list[str]:
    """Files of the extensions table that do not exist, or that do not mention what the
    extension added (`cumprod`; the `flex` backend; a pass's PASSES; BACKWARD_REWRITES)."""
    marks = {"cumprod": "cumprod", "flex": "flex", "pass": "PASSES", "rewrite": "BACKWARD_REWRITES"}
    bad = []
    for what, files in extension_files(page).items():
        mark = next(m for k, m in marks.items() if k in what)
        for name in files:
            path = ROOT / name
            if "<name>" in name:
                continue
            text = "".join(p.read_text() for p in path.rglob("*.py")) if path.is_dir() else ""
            text = path.read_text() if path.is_file() else text
            if mark.lower() not in text.lower():
                bad.append(name)
    return bad


def test_each_extension_s_files_exist_and_hold_it():
    assert unsupported(PAGE) == []
    assert set(extension_files(PAGE)) == {
        "a function or reduction (`cumprod`)",
        "a pass",
        "a backward rewrite",
        "a backend (`flex`)",
    }


def test_a_file_that_does_not_hold_the_extension_is_seen():
    page = PAGE.replace("`indexattn/derive/adjoints.py` |", "`indexattn/errors.py` |")
    assert unsupported(page) == ["indexattn/errors.py"]
