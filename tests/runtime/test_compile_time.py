"""Compile time is linear in the spec's length: a chain twice as long takes about twice as
long (benchmarks/startup.py --lengths measures it; docs/performance.md has the figures).
Robust to a loaded machine: the ratio of two lengths, each the least of a few rounds, with the
cyclic collector paused as compile_spec pauses it (its full collections walk every object
alive, the compiler's and the test session's)."""

import gc
import sys
import time
from pathlib import Path

import pytest

import indexattn
from indexattn import ir
from indexattn.errors import SpecError
from indexattn.lower.pipeline import pipeline
from indexattn.lower.planner import canonical
from indexattn.lower.planner.plan import Planner
from indexattn.lower.printers.codegen import generate
from indexattn.runtime.compiled import _collector_paused

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from startup import chain

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out


def seconds(text: str) -> float:
    """CPU seconds of this process compiling `text` (what other processes take of the machine
    aside), with what earlier rounds left collected first."""
    gc.collect()
    with _collector_paused():
        start = time.process_time()
        compile_chain(text)
        return time.process_time() - start


def compile_chain(text: str) -> None:
    generate(pipeline(ir.check(text, "chain")))


def softmaxes(n: int) -> str:
    """n layers of attention with the softmax written out, three equations each: the canonical
    form checks each softmax's rows keep a key (it built a table of every tensor per softmax)."""
    lines = ["index τ : N", "index τ' : N", "index a : d", "input X_<τa>", "Y0_<τa> = X_<τa>"]
    for k in range(1, n):
        lines += [
            f"S{k}_<ττ'> = Y{k - 1}_<τa> Y{k - 1}_<τ'a>",
            f"A{k}_<ττ'> = exp(S{k}_<ττ'> - logsumexp_<τ'>(S{k}_<ττ'>))",
            f"Y{k}_<τa> = A{k}_<ττ'> Y{k - 1}_<τ'a>",
        ]
    return "\n".join(lines) + "\n"


def growth(short: int = 200, rounds: int = 2, text=chain) -> float:
    """How much longer twice the equations take: 2 when linear, 4 when quadratic."""
    times = {n: [] for n in (short, 2 * short)}
    for _ in range(rounds):
        for n in times:
            times[n].append(seconds(text(n)))
    return min(times[2 * short]) / min(times[short])


BOUND = 2.7  # measured 1.98-2.15 with the machine's load at 7 on 2 cores


def test_compile_time_is_linear_in_the_equations():
    assert growth() < BOUND


def test_compile_time_is_linear_in_written_out_softmaxes():
    assert growth(100, text=softmaxes) < BOUND


def test_twin_the_mask_table_built_per_softmax_is_seen(monkeypatch):
    """The table of every tensor's masks built again for each softmax, as it was (growth 3.1
    measured): the growth is seen."""
    monkeypatch.setattr(canonical, "cache", lambda table: table)
    assert growth(100, text=softmaxes) > BOUND


def spin(seconds: float) -> None:
    """Burn this much CPU time (process time: what other processes take aside)."""
    end = time.process_time() + seconds
    while time.process_time() < end:  # each reading of the clock is a system call
        sum(range(100))


def test_twin_a_quadratic_step_is_seen(monkeypatch):
    """A planted step whose work grows with the equations already planned (5 µs of CPU for
    each step planned before, growth 3.6 measured), as the planner's old renaming did (it
    rebuilt its table of planned steps for every equation): the growth is seen. The old
    renaming itself is too cheap per entry to show at these lengths."""
    assign = Planner.assign

    def quadratic(self, eq, value):
        spin(5e-6 * len(self.seen))
        return assign(self, eq, value)

    monkeypatch.setattr(Planner, "assign", quadratic)
    assert growth(rounds=1) > BOUND  # one round: the planted CPU time does not vary with load


def collections(run) -> int:
    """How many collections the cyclic collector starts while `run()` runs."""
    started = []

    def seen(phase: str, info: dict) -> None:
        started.extend([info["generation"]] if phase == "start" else [])

    gc.callbacks.append(seen)
    try:
        run()
    finally:
        gc.callbacks.remove(seen)
    return len(started)


def test_no_collection_runs_while_a_spec_compiles():
    text = chain(300)
    with _collector_paused():
        assert collections(lambda: compile_chain(text)) == 0
    assert gc.isenabled()


def test_twin_the_same_compile_unpaused_collects():
    text = chain(300)
    assert collections(lambda: compile_chain(text)) > 0


def test_a_failed_compile_turns_the_collector_back_on():
    with pytest.raises(SpecError, match="not declared"):
        indexattn.compile_spec("index i : n\ninput x_<i>\ny_<i> = x_<j>\n", name="failed")
    assert gc.isenabled()


def test_twin_a_collector_turned_off_before_stays_off():
    gc.disable()
    try:
        indexattn.compile_spec(chain(3), name="off_before")
        assert not gc.isenabled()
    finally:
        gc.enable()
