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


NO_FCNTL = """
import sys
sys.modules["fcntl"] = None  # as on Windows: `import fcntl` raises ImportError
sys.path.insert(0, sys.argv[1])
import scaling
scaling.RESULTS = scaling.Path(sys.argv[2])
scaling.keep({"name": "mha", "n": 16, "who": "spec", "mode": "forward", "s": 1.0})
print(len(scaling.load()))
"""


def test_the_scaling_benchmark_keeps_its_results_where_fcntl_does_not_exist(tmp_path):
    """Failed before (issue 51, the first hour): benchmarks/scaling.py imported fcntl, which
    Windows has not; its lock is filelock's (shipped with torch)."""
    where = [str(ROOT / "benchmarks"), str(tmp_path / "scaling.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", NO_FCNTL, *where], capture_output=True, text=True, env=env,
        timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"mha"' in (tmp_path / "scaling.json").read_text()


def test_twin_a_module_importing_fcntl_fails_there(tmp_path):
    (tmp_path / "locking.py").write_text("import fcntl\n")
    source = NO_FCNTL.replace("import scaling", "import locking").split("scaling.RESULTS")[0]
    done = subprocess.run(
        [sys.executable, "-c", source, str(tmp_path), "x"], capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0 and "fcntl" in done.stderr
