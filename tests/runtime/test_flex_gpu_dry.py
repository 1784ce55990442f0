"""benchmarks/on_a_gpu.sh, dry on a CPU (`--device cpu`). Its flex section (N = 64, eager
flex_attention): every spec asked for timed through backend="flex" and "blocks", and the three
cores of benchmarks/flex.py against hand-written flex_attention. Its triton section (N = 40,
Triton's interpreter): the kernels, FlexAttention's eager forward and the blocked path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry(tmp_path, **chosen: str) -> subprocess.CompletedProcess:
    """The dry run with `chosen` set in its environment (DRY_SECTIONS, DRY_SPECS, ...)."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), **chosen}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    script = ROOT / "benchmarks" / "on_a_gpu.sh"
    return subprocess.run(
        ["bash", str(script), "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_dry_run_times_each_spec_and_core(tmp_path):
    done = _dry(tmp_path, DRY_SECTIONS="flex", DRY_SPECS="doc_mask,softcap_core")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [
        json.loads(line)
        for line in (tmp_path / "flex.jsonl").read_text().splitlines()
        if line.startswith("{")
    ]
    timed = {(r["spec"], r["backend"]) for r in rows if "spec" in r and r["forward_ms"] > 0}
    assert timed == {(s, b) for s in ("doc_mask", "softcap_core") for b in ("flex", "blocks")}
    cores = {r["core"]: r["forward_ms"] for r in rows if "core" in r}
    assert set(cores) == {"doc+causal", "causal+cap", "doc+cap+bias"}
    assert all(len(times) == 3 and min(times.values()) > 0 for times in cores.values())


@pytest.mark.slow
def test_the_dry_run_fails_on_a_spec_it_cannot_time(tmp_path):
    """Twin: a spec that does not exist makes the dry run fail, not pass silently."""
    assert _dry(tmp_path, DRY_SECTIONS="flex", DRY_SPECS="no_such_spec").returncode != 0


@pytest.mark.slow
def test_the_triton_section_times_the_kernels(tmp_path):
    """The kernels, FlexAttention's eager forward and the blocked path timed, equal outputs."""
    pytest.importorskip("triton")
    done = _dry(tmp_path, DRY_SECTIONS="triton", TRITON_DRY_SPECS="softcap_core")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (row,) = [json.loads(line) for line in (tmp_path / "triton.jsonl").read_text().splitlines()]
    timed = ("triton_forward", "triton_train", "flex_forward", "blocks_forward", "blocks_train")
    assert all(isinstance(row[k]["s"], float) for k in timed), row
    assert row["config"] == "b16" and row["max_error_vs_blocks"] < 1e-5, row
