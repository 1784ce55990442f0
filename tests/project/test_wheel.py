"""The wheel a user installs: built from this checkout, installed with the constraints into a
fresh virtual environment, and used from a directory outside the repository, so that no file
of the checkout is at hand: docs/tutorial.md's first steps, and the command line.

About 30 s on 2 cores: pip installs without compiling every module of torch to bytecode
(Python compiles what is imported), and the fresh environment gets no pip of its own (this
environment's pip installs into it)."""

import doctest
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=300, **kwargs
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # the build backend comes from the test extra (hatchling), as pyproject.toml names it
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", out, ROOT])  # fmt: skip
    (found,) = out.glob("indexattn-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed: its bin/ folder."""
    where = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", where])
    python = where / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile",
         "-c", ROOT / "constraints.txt", wheel])  # fmt: skip
    return where / "bin"


@pytest.fixture
def outside(tmp_path) -> dict:
    """Keywords for subprocess.run: a folder outside the repository, an environment that
    points nowhere into it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    assert not tmp_path.is_relative_to(ROOT)
    return {"cwd": tmp_path, "env": env}


def test_the_wheel_holds_the_license_and_every_shipped_spec(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    specs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "specs").rglob("*.attn")}
    assert {f"indexattn/{s}" for s in specs} <= names and len(specs) > 40
    assert "indexattn/__main__.py" in names


def quick_start() -> str:
    """The tutorial's first Python block, as a doctest."""
    return re.search(r"```python\n(.*?)```", TUTORIAL, re.S).group(1)


def test_the_tutorial_quick_start_runs_from_the_wheel(venv, outside):
    script = (
        "import doctest, sys\n"
        "test = doctest.DocTestParser().get_doctest(sys.stdin.read(), {}, 'quick start', "
        "None, 0)\n"
        "runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)\n"
        "runner.run(test)\n"
        "sys.exit(1 if runner.failures or not runner.tries else 0)\n"
    )
    run([venv / "python", "-c", script], input=quick_start(), **outside)
    assert doctest.DocTestParser().get_examples(quick_start())


def test_shipped_specs_come_from_the_installed_package(venv, outside):
    where = run([venv / "python", "-c", "import indexattn; print(indexattn.shipped('mha'))"],
                **outside).stdout.strip()  # fmt: skip
    assert Path(where).is_file() and not Path(where).is_relative_to(ROOT)
    assert "site-packages" in where and where.endswith("indexattn/specs/mha.attn")


def test_the_command_line_from_the_wheel(venv, outside):
    indexattn = venv / "indexattn"
    assert run([indexattn, "--version"], **outside).stdout == "indexattn 0.1.0\n"
    listed = run([venv / "python", "-m", "indexattn", "list"], **outside).stdout
    assert re.search(r"^mha +Causal multi-head", listed, re.M) and "\nmodels/llama3 " in listed
    assert "ok   mha" in run([indexattn, "check", "mha"], **outside).stdout
    text = (ROOT / "specs" / "gqa.attn").read_text(encoding="utf-8")
    compiled = run([indexattn, "compile", "-"], input=text, **outside).stdout
    assert "def spec(" in compiled
    counted = run([indexattn, "count", "models/deepseek_v3"], **outside).stdout
    assert max(map(len, counted.splitlines())) <= 100
