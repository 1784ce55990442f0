"""benchmarks/run.py --quick on two cases: every implementation agrees with the generated
module (run.py checks it before timing) and the report has a line per case, shape and mode;
and run.py's agreement check on the cases whose hand-written module is benchmarks/cases.py's
own (the others' are tests/reference/'s, tested there)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

ROOT = Path(__file__).resolve().parents[2]


def quick(cases: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--cases", cases]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def test_quick_run_reports_every_case_shape_and_mode():
    done = quick("mha,kv_decode")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| kv_decode |")]
    assert len(rows) == 2 * 4  # (1, 64) and the decode step, two modes, in two tables
    assert "| mha | (1, 64) | forward |" in done.stdout


def test_an_unknown_case_fails():
    assert quick("no_such_spec").returncode != 0


def built(name: str) -> dict:
    """The generated module and the eager hand-written one of a case, at (1, 16)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cases

    return {impl: cases.build(cases.CASES[name], impl, (1, 16)) for impl in ("generated", "eager")}


@pytest.mark.parametrize("name", ["retention", "mha_masked_fill", "shared_mask"])
def test_a_case_with_a_hand_module_of_its_own_agrees_with_the_spec(name):
    """The cases whose hand-written module lives in benchmarks/cases.py, not tests/reference/:
    run.py's own agreement check, and its twin (one hand-written weight nudged) fails."""
    both = built(name)
    from run import agree

    agree(both)
    with torch.no_grad():
        both["eager"][2][0].view(-1)[0] += 1.0
    with pytest.raises(AssertionError):
        agree(both)
