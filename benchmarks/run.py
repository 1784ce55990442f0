"""Generated code against hand-written PyTorch, in one interleaved run.

    .venv/bin/python benchmarks/run.py            # about 8 minutes on 2 cores
    .venv/bin/python benchmarks/run.py --quick    # a smoke run, printed, not written
    .venv/bin/python benchmarks/run.py --report   # results.md again from results.json

For every case of benchmarks/cases.py, forward (under torch.inference_mode) and
forward+backward: the median time of each implementation over interleaved rounds (each round
runs every implementation once, in a shuffled order, so a noisy neighbour slows all alike),
its ratio to the fastest, and its GFLOP/s against a measured large float32 matrix product.
Then peak memory per implementation, each in its own process; compile_spec() time per
shipped spec; the start-up time of `indexattn latex`; and torch.compile of the generated
module against torch.compile of the hand-written fused one. Writes benchmarks/results.json
and benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import CASES, IMPLEMENTATIONS, build  # noqa: E402
from torch.utils.flop_counter import (  # noqa: E402
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

MODES = ("forward", "forward+backward")
MEMORY_CASE, MEMORY_SHAPE = "gpt2-small causal", (1, 2048)
LITERAL_ROUNDS = 3
SAMPLE_SECONDS = 0.05
ROUND_BUDGET = 12.0  # seconds of rounds per case and mode, literal interpreter aside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="few rounds, no torch.compile, nothing written"
    )
    parser.add_argument(
        "--report", action="store_true", help="rewrite results.md from results.json, no run"
    )
    hidden = argparse.SUPPRESS  # internal: one measurement in a fresh process
    parser.add_argument("--probe", nargs=4, metavar=("KIND", "IMPL", "MODE", "SHAPE"), help=hidden)
    args = parser.parse_args()
    if args.probe:
        kind, name, mode, shape = args.probe
        b, n = map(int, shape.split("x"))
        return print(json.dumps(PROBES[kind](name, mode, b, n)))
    if args.report:
        results = json.loads((HERE / "results.json").read_text())
        for row in [*results["timings"], *(results["torch_compile"] or [])]:
            row |= summary(row["samples"])
        return (HERE / "results.md").write_text(markdown(results))
    started = time.perf_counter()
    rounds = 3 if args.quick else 15
    results = {
        "machine": machine(),
        "peak_matmul_gflops": peak_matmul(),
        "timings": [timing for case in CASES.values() for timing in time_case(case, rounds)],
        "memory": memory(),
        "compile_spec_ms": compile_times(),
        "latex_startup": latex_startup(),
        "torch_compile": None if args.quick else compiled(rounds),
    }
    results["seconds"] = round(time.perf_counter() - started)
    if not args.quick:  # a smoke run leaves the quoted results alone
        (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (HERE / "results.md").write_text(markdown(results))
    print(markdown(results))


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }


def peak_matmul(n: int = 4096, repeats: int = 5) -> float:
    """GFLOP/s of a large float32 matrix product, its best of a few runs: the ceiling the
    GFLOP/s below are measured against."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return round(2 * n**3 / min(times) / 1e9, 1)


# -- timing


def time_case(case, rounds: int) -> list[dict]:
    out = []
    for b, n in case.shapes:
        built = {name: build(case, name, b, n) for name in IMPLEMENTATIONS}
        built = {name: impl for name, impl in built.items() if impl is not None}
        agree(built)
        for mode in MODES:
            flops = count_flops(built.get("fused") or built["classic"], mode)
            timing = summary(interleaved(built, mode, rounds))
            out.append(
                {"case": case.name, "note": case.note, "b": b, "n": n, "mode": mode}
                | {"flops": flops, **timing}
            )
            print(f"{case.name} {(b, n)} {mode}: {timing['ratio']}", file=sys.stderr)
    return out


def agree(built: dict) -> None:
    """Every implementation computes what the generated module computes."""
    with torch.inference_mode():
        want = first(built["generated"][0](*built["generated"][1]))
        for name, (call, inputs, _) in built.items():
            torch.testing.assert_close(first(call(*inputs)), want, atol=1e-4, rtol=1e-3, msg=name)


def first(out):
    return out[0] if isinstance(out, tuple) else out


def run_once(call, inputs, params, mode: str) -> None:
    if mode == "forward":
        with torch.inference_mode():
            call(*inputs)
        return
    for t in params:
        t.grad = None
    inputs = [x.detach().requires_grad_(x.dim() > 2) for x in inputs]
    out = call(*inputs)
    loss = sum(o.sum() for o in out) if isinstance(out, tuple) else out.sum()
    loss.backward()


def interleaved(built: dict, mode: str, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call, each round running every implementation in a shuffled order
    (the literal interpreter, far behind, only in the first rounds). A sample repeats the
    call for at least SAMPLE_SECONDS, so one preemption by a neighbour weighs little; quick
    cases get more rounds, up to ROUND_BUDGET seconds. As timeit does, the garbage collector
    is off while a sample runs (and run between samples): a collection of the many objects
    sympy leaves would otherwise land on whichever implementation happens to run then."""
    shuffle = random.Random(0)
    calls = {name: repeats(impl, mode) for name, impl in built.items()}
    per_round = sum(seconds for name, (_, seconds) in calls.items() if name != "literal")
    rounds = min(max(rounds, int(ROUND_BUDGET / per_round)), 4 * rounds)
    calls = {name: n for name, (n, _) in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in built}
    gc.freeze()  # what exists now is never garbage: collections between samples skip it
    for k in range(rounds):
        names = [name for name in built if name != "literal" or k < LITERAL_ROUNDS]
        shuffle.shuffle(names)
        for name in names:
            gc.collect()
            gc.disable()
            start = time.perf_counter()
            for _ in range(calls[name]):
                run_once(*built[name], mode)
            samples[name].append((time.perf_counter() - start) / calls[name] * 1e3)
            gc.enable()
    gc.unfreeze()
    return samples


def summary(samples: dict[str, list[float]]) -> dict:
    """Medians, and each implementation's time over the fastest one's (lowest median, of
    those timed in every round) as the median of the ratios within a round: samples taken
    moments apart share the machine's load, so the ratio of a pair is steadier than the
    ratio of two medians."""
    ms = {name: statistics.median(s) for name, s in samples.items()}
    full = max(map(len, samples.values()))  # the literal interpreter runs fewer rounds
    best = samples[min((n for n, s in samples.items() if len(s) == full), key=ms.get)]
    ratio = {name: statistics.median(a / b for a, b in zip(s, best)) for name, s in samples.items()}
    return {
        "ms": {name: round(t, 4) for name, t in ms.items()},
        "ratio": {name: round(r, 3) for name, r in ratio.items()},
        "samples": {name: [round(t, 4) for t in s] for name, s in samples.items()},
    }


def repeats(impl, mode: str) -> tuple[int, float]:
    """How many calls make a sample of SAMPLE_SECONDS, and the seconds a sample will take,
    from two warm-up calls."""
    run_once(*impl, mode)
    start = time.perf_counter()
    run_once(*impl, mode)
    seconds = time.perf_counter() - start
    calls = max(1, math.ceil(SAMPLE_SECONDS / seconds))
    return calls, calls * seconds


SDPA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: (
        sdpa_flop_count(q, k, v)
    ),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda grad, q, k, v, *a, **kw: sdpa_backward_flop_count(grad, q, k, v)
    ),
}


def count_flops(impl, mode: str) -> int:
    """Matrix-product FLOPs as torch counts them (the fused kernel's causal half included)."""
    with FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS) as counter:
        run_once(*impl, mode)
    return counter.get_total_flops()


# -- memory, in fresh processes


def memory() -> list[dict]:
    """Each implementation and mode in a fresh process."""
    b, n = MEMORY_SHAPE
    out = []
    for name in IMPLEMENTATIONS:
        row = {"implementation": name, "b": b, "n": n}
        for mode in MODES:
            row[mode] = fresh("memory", name, mode, (b, n))
        out.append(row)
        print(f"memory {row}", file=sys.stderr)
    return out


def fresh(kind: str, name: str, mode: str, shape: tuple[int, int]):
    """One probe in a new process, with a cold torch.compile cache of its own."""
    with tempfile.TemporaryDirectory() as cache:
        command = [sys.executable, __file__, "--probe", kind, name, mode, "{}x{}".format(*shape)]
        # glibc then maps every block above 128 kB on its own and unmaps it when freed, so
        # the peak counts tensors alive together, not what earlier frees left in the heap.
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "MALLOC_MMAP_THRESHOLD_": "131072"}
        done = subprocess.run(command, capture_output=True, check=True, env=env)
    return json.loads(done.stdout)


def peak_memory(name: str, mode: str, b: int, n: int) -> float | None:
    """The growth of peak resident memory (MB) over one call, after a call at a tiny size
    has done the lazy imports and first-call work."""
    case = CASES[MEMORY_CASE]
    impl = build(case, name, b, n)
    if impl is None:
        return None
    run_once(*build(case, name, b, 16), mode)
    before = high_water_mb()
    run_once(*impl, mode)
    return round(high_water_mb() - before, 1)


def high_water_mb() -> float:
    """Peak resident memory of this process. Linux's VmHWM: getrusage's ru_maxrss would
    carry over the peak of the parent process across exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status: peak memory needs Linux")


def compile_time(name: str, mode: str, b: int, n: int) -> float:
    """Seconds from torch.compile to the end of the first call."""
    call, inputs, params = build(CASES["gpt2-small causal"], name, b, n)
    start = time.perf_counter()
    run_once(torch.compile(call, fullgraph=True), inputs, params, mode)
    return round(time.perf_counter() - start, 1)


PROBES = {"memory": peak_memory, "compile": compile_time}


# -- compiling specs, and the start-up of the command line


def compile_times() -> dict[str, dict[str, float]]:
    """compile_spec() per shipped spec in a fresh process, once the package is imported: the
    first compile of each spec, and a repeat (sympy's caches warm); the garbage collector
    off while one runs, as in the timings."""
    script = """
import gc, json, time, pathlib, indexattn
from indexattn import ir
from indexattn.runtime import CompiledSpec
CompiledSpec(ir.check("index i : n\\ninput x_<i>\\ny_<i> = x_<i>", "warm"))
out = {}
for path in sorted(pathlib.Path("specs").glob("*.attn")):
    text = path.read_text(encoding="utf-8")
    times = []
    for _ in range(3):
        gc.collect()
        gc.disable()  # a full collection of torch's and sympy's objects takes ~100 ms
        start = time.perf_counter()
        CompiledSpec(ir.check(text, path.stem, str(path)))
        times.append((time.perf_counter() - start) * 1e3)
        gc.enable()
    out[path.stem] = {"first": round(times[0], 1), "again": round(min(times[1:]), 1)}
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def latex_startup(repeats: int = 5) -> dict:
    """Wall time of `indexattn latex specs/mha.attn`, and whether it imports torch."""
    command = [str(Path(sys.executable).parent / "indexattn"), "latex", "specs/mha.attn"]
    check = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if check.returncode != 0:
        return {"available": False, "error": check.stderr.strip().splitlines()[-1:]}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    script = (
        "import sys; from indexattn.cli import main; main(['latex', 'specs/mha.attn']); "
        "sys.stderr.write(str('torch' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    return {
        "available": True,
        "ms": round(statistics.median(times) * 1e3),
        "imports_torch": done.stderr.strip().endswith("True"),
    }


# -- torch.compile


def compiled(rounds: int, shape: tuple[int, int] = (4, 512)) -> list[dict]:
    """Inductor on the generated module and on the hand-written fused one: compile time in a
    fresh process with an empty cache, then the compiled calls timed as above."""
    case = CASES["gpt2-small causal"]
    out = []
    for mode in MODES:
        names = ("generated", "fused")
        row = {"b": shape[0], "n": shape[1], "mode": mode}
        row["compile s"] = {name: fresh("compile", name, mode, shape) for name in names}
        built = {}
        for name in names:
            call, inputs, params = build(case, name, *shape)
            built[name] = (torch.compile(call, fullgraph=True), inputs, params)
        row |= summary(interleaved(built, mode, rounds))
        out.append(row)
        print(f"torch.compile {row}", file=sys.stderr)
    return out


# -- the report


def markdown(results: dict) -> str:
    peak = results["peak_matmul_gflops"]
    lines = [
        "# Benchmark results",
        "",
        f"{machine_line(results['machine'])}; float32; a 4096×4096 matrix product runs at "
        f"{peak} GFLOP/s (best of 5). Medians of interleaved rounds, in ms; ×: time over the "
        "fastest implementation's, the median of the ratios within a round; "
        "GFLOP/s: matrix-product FLOPs as torch's FlopCounterMode counts them, with the "
        "full N×N scores also under a causal mask, of which the fused kernel skips half "
        "(so it can pass 100% of the ceiling there).",
    ]
    lines += ["", "## Summary", "", *summary_table(results["timings"])]
    for (case, b, n), rows in grouped(results["timings"]).items():
        lines += ["", f"## {case}, (b, n) = ({b}, {n})", "", rows[0]["note"], ""]
        lines += timing_table(rows, peak)
    lines += ["", f"## Peak memory at {MEMORY_CASE} (b, n) = {MEMORY_SHAPE}", ""]
    lines += memory_table(results["memory"])
    lines += ["", "## compile_spec() per shipped spec (ms)", ""]
    lines += compile_table(results["compile_spec_ms"])
    lines += ["", "## Start-up of `indexattn latex specs/mha.attn`", "", latex_line(results)]
    if results.get("torch_compile"):
        lines += ["", "## torch.compile (inductor, fullgraph)", ""]
        lines += compile_speed(results["torch_compile"])
    lines += ["", f"Whole run: {results['seconds']} s.", ""]
    return "\n".join(lines)


def machine_line(m: dict) -> str:
    return f"torch {m['torch']}, {m['threads']} threads on {m['cores']} cores ({m['cpu']})"


def grouped(timings: list[dict]) -> dict:
    out: dict = {}
    for row in timings:
        out.setdefault((row["case"], row["b"], row["n"]), []).append(row)
    return out


def summary_table(timings: list[dict]) -> list[str]:
    """One line per case, shape and mode: the generated module's time, and every
    implementation's time over the fastest."""
    names = IMPLEMENTATIONS
    lines = [
        "| case | (b, n) | mode | generated ms | " + " | ".join(f"{n} ×" for n in names) + " |",
        "|---|---|---|---:|" + "---:|" * len(names),
    ]
    for row in timings:
        ratios = [f"{row['ratio'][n]:.2f}" if n in row["ratio"] else "—" for n in names]
        cells = [
            row["case"],
            f"({row['b']}, {row['n']})",
            row["mode"],
            f"{row['ms']['generated']:.3g}",
        ]
        lines.append("| " + " | ".join(cells + ratios) + " |")
    return lines


def timing_table(rows: list[dict], peak: float) -> list[str]:
    forward, both = rows
    header = "| implementation | forward ms | × | GFLOP/s | fwd+bwd ms | × | GFLOP/s |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for name in forward["ms"]:
        cells = []
        for row in (forward, both):
            ms, ratio = row["ms"][name], row["ratio"][name]
            gflops = row["flops"] / ms / 1e6
            cells += [f"{ms:.3g}", f"{ratio:.2f}", f"{gflops:.0f} ({gflops / peak:.0%})"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def memory_table(rows: list[dict]) -> list[str]:
    fused = next(r for r in rows if r["implementation"] == "fused")
    lines = [
        "Growth of peak resident memory over one call, each in a fresh process (MB), "
        "and its ratio to the hand-written fused code.",
        "",
        "| implementation | forward MB | × fused | fwd+bwd MB | × fused |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = []
        for mode in MODES:
            mb, base = row[mode], fused[mode]
            cells += ["—", "—"] if mb is None else [f"{mb:.0f}", f"{mb / base:.2f}"]
        lines.append(f"| {row['implementation']} | " + " | ".join(cells) + " |")
    return lines


def compile_table(times: dict) -> list[str]:
    lines = ["| spec | first | again |", "|---|---:|---:|"]
    lines += [f"| {name} | {t['first']} | {t['again']} |" for name, t in times.items()]
    return lines


def latex_line(results: dict) -> str:
    latex = results["latex_startup"]
    if not latex["available"]:
        return f"Not available when this ran: {' '.join(latex['error'])}"
    torch_note = "imports torch" if latex["imports_torch"] else "does not import torch"
    return f"{latex['ms']} ms (median of 5 runs); it {torch_note}."


def compile_speed(rows: list[dict]) -> list[str]:
    b, n = rows[0]["b"], rows[0]["n"]
    lines = [
        f"specs/mha.attn at (b, n) = ({b}, {n}), each compiled from a cold cache.",
        "",
        "| implementation | mode | compile s | ms | × |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        for name, ms in row["ms"].items():
            cells = [
                name,
                row["mode"],
                str(row["compile s"][name]),
                f"{ms:.3g}",
                f"{row['ratio'][name]:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
