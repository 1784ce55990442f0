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
    assert growth() < 3.3


def spin(seconds: float) -> None:
    """Burn this much CPU time (process time: what other processes take aside)."""
    end = time.process_time() + seconds
    while time.process_time() < end:  # each reading of the clock is a system call
        sum(range(100))


def test_twin_a_quadratic_step_is_seen(monkeypatch):
    """A planted step whose work grows with the equations already planned (150 µs of CPU
    for each, growth 3.96 measured), as the planner's old renaming
    did (it rebuilt its table of planned steps for every equation): the growth is seen.
    The old renaming itself is too cheap per entry to show at these lengths."""
    assign = Planner.assign

    def quadratic(self, eq, value):
        spin(150e-6 * len(self.seen))
        return assign(self, eq, value)

    monkeypatch.setattr(Planner, "assign", quadratic)
    assert growth(rounds=1) > 3.3  # one round: the planted CPU time does not vary with load
