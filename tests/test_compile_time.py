"""Compile time is linear in the spec's length: a chain twice as long takes about twice as
long (benchmarks/startup.py --lengths measures it; docs/performance.md has the figures).
Robust to a loaded machine: the ratio of two lengths, each the least of a few rounds."""

import gc
import sys
import time
from pathlib import Path

from indexattn import ir
from indexattn.lower.codegen import generate
from indexattn.lower.passes import lower
from indexattn.lower.plan import Planner, plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from startup import chain


def seconds(n: int) -> float:
    """CPU seconds of this process (what other processes take of the machine aside), with
    what earlier rounds left collected first."""
    text = chain(n)
    gc.collect()
    start = time.process_time()
    generate(lower(plan(ir.check(text, "chain"))))
    return time.process_time() - start


def growth(short: int = 200, rounds: int = 2) -> float:
    """How much longer twice the equations take: 2 when linear, 4 when quadratic."""
    times = {n: [] for n in (short, 2 * short)}
    for _ in range(rounds):
        for n in times:
            times[n].append(seconds(n))
    return min(times[2 * short]) / min(times[short])


def test_compile_time_is_linear_in_the_equations():
    assert growth() < 2.9


def renamed(v, value):
    return value if v == value else v


def test_twin_a_quadratic_step_is_seen(monkeypatch):
    """The planner's old renaming planted back (its table of planned steps rebuilt, every
    entry compared, for each equation), four times over so that the quadratic term dominates
    the linear work even on a loaded machine (once, it moved the ratio to 2.7-4.0): the
    growth is seen."""
    assign = Planner.assign

    def rebuilding(self, eq, value):
        for _ in range(4):
            self.seen = {k: renamed(v, value) for k, v in self.seen.items()}
        return assign(self, eq, value)

    monkeypatch.setattr(Planner, "assign", rebuilding)
    assert growth() > 2.9
