"""The package's folders as docs/architecture.md draws them: lines per sub-package (every line
of its .py files, those of its own sub-packages apart), and the largest class and function by
lines, with where they stand. No timing: it reads the source.

    .venv/bin/python benchmarks/layout.py
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "indexattn"


def room(path: Path) -> str:
    """The sub-package a module belongs to: its folder, relative to the repository."""
    return str(path.parent.relative_to(PACKAGE.parent)) + "/"


def measure() -> tuple[Counter, tuple[int, str], tuple[int, str]]:
    lines: Counter = Counter()
    largest = {ast.ClassDef: (0, ""), ast.FunctionDef: (0, "")}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines[room(path)] += len(text.splitlines())
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(text)):
            if type(node) in largest:
                size = node.end_lineno - node.lineno + 1
                largest[type(node)] = max(largest[type(node)], (size, f"{node.name}, {where}"))
    return lines, largest[ast.ClassDef], largest[ast.FunctionDef]


def main() -> None:
    lines, cls, function = measure()
    for name, count in sorted(lines.items()):
        print(f"| `{name}` | {count} |")
    print(f"total {sum(lines.values())} lines")
    print(f"largest class: {cls[1]} ({cls[0]} lines)")
    print(f"largest function: {function[1]} ({function[0]} lines)")


if __name__ == "__main__":
    main()
