"""docs/tutorial.md, run as a reader would, in an empty folder: each ```attn block is saved
under the name written above it and checked against the literal reading, each ```python
block is a doctest (one namespace for the page), each ```sh block's `$ ` lines are run in a
shell with this environment's `indexattn` and their output compared (`...` matches
anything, runs of white space are one)."""

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import indexattn
from indexattn.oracle.verify import compare

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "tutorial.md").read_text("utf-8")
BLOCKS = re.findall(r"(?:`([\w.]+)`:\n\n)?```(\w+)\n(.*?)```", PAGE, re.S)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Generated code runs without a warning, as everywhere else.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error")]


def test_the_page_has_every_kind_of_block():
    kinds = [kind for _, kind, _ in BLOCKS]
    assert {"python", "sh", "attn"} <= set(kinds) and kinds.count("python") >= 4
    assert all(name for name, kind, _ in BLOCKS if kind == "attn")  # each saved under a name


def commands(block: str) -> list[tuple[str, str]]:
    """`$ command` lines and the output that follows each."""
    parts = re.split(r"^\$ (.*)\n", block, flags=re.M)[1:]
    return list(zip(parts[::2], parts[1::2]))


def run_sh(block: str, where: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command, want in commands(block):
        if "--pdf" in command and shutil.which("pdflatex") is None:
            continue  # CI installs TeX (.ci/run); tests/views/test_latex.py skips the same way
        done = subprocess.run(command, shell=True, cwd=where, env=env, text=True, timeout=120,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        assert done.returncode == 0, (command, done.stdout)
        checker = doctest.OutputChecker()
        assert checker.check_output(want, done.stdout, FLAGS), (command, want, done.stdout)


def run_python(block: str, globs: dict, k: int) -> None:
    test = doctest.DocTestParser().get_doctest(block, globs, f"tutorial block {k}", None, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, clear_globs=False)
    globs.update(test.globs)  # the DocTest ran on a copy: the next block reads these names
    assert test.examples and runner.failures == 0, f"block {k} failed"


def run_attn(name: str, text: str, where: Path) -> None:
    (where / name).write_text(text, encoding="utf-8")
    spec = indexattn.compile_spec(where / name)
    assert compare(spec).ok and compare(spec, batch=(2,)).ok


def test_every_block_runs_in_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    globs: dict = {}
    for k, (name, kind, text) in enumerate(BLOCKS):
        if kind == "attn":
            run_attn(name, text, tmp_path)
        elif kind == "python":
            run_python(text, globs, k)
        elif kind == "sh":
            run_sh(text, tmp_path)
    assert (tmp_path / "pages" / "window.svg").exists()


def test_a_wrong_output_is_seen(tmp_path):
    """The twin: the comparison notices output that differs from the page."""
    with pytest.raises(AssertionError):
        run_sh("$ indexattn list | grep -E '^mha '\nmha  Some other title\n", tmp_path)
    with pytest.raises(AssertionError):
        run_python(">>> 1 + 1\n3\n", {}, 0)
