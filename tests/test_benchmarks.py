"""benchmarks/run.py --quick on two cases: every implementation agrees with the generated
module (run.py checks it before timing) and the report has a line per case, shape and mode."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
