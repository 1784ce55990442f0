"""The README's two commands are what a new user runs; CI runs the second one verbatim."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(.*?)\n```", text, re.S)[:2]


def test_readme_starts_with_the_two_commands():
    head = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ")[0]
    main, tests = readme_commands()
    assert main in head and tests in head
    assert "indexattn check specs/*.attn" in main
    assert "pytest" in tests and "constraints.txt" in tests and "constraints.txt" in main


def quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)\n```", text, re.S)[0]


def test_the_quick_start_runs_as_pasted(capsys):
    """Failed before: NameError: name 'x' is not defined (no shapes given)."""
    names: dict = {}
    exec(quick_start(), names)
    assert names["y"].shape == names["x"].shape
    assert "def mha(" in capsys.readouterr().out
    assert sum(p.numel() for p in names["layer"].parameters()) == 4 * 64 * 768 * 12 + 768


def test_twin_a_quick_start_missing_its_input_fails():
    code = "\n".join(line for line in quick_start().splitlines() if not line.startswith("x ="))
    with pytest.raises(NameError, match="'x'"):
        exec(code, {})


def test_ci_runs_the_readme_test_command():
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci


def test_constraints_pin_torch_and_pyproject_keeps_a_lower_bound():
    constraints = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    assert "torch==2.13.0" in constraints.splitlines()
    assert '"torch>=' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_ruff_is_clean():
    for command in (["check", "."], ["format", "--check", "indexattn", "tests"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
