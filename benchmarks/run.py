"""Generated code against hand-written PyTorch, in one interleaved run.

    .venv/bin/python benchmarks/run.py                 # every case, about 45 minutes on 2 cores
    .venv/bin/python benchmarks/run.py --cases mha,rope  # some cases
    .venv/bin/python benchmarks/run.py --quick         # a smoke run at n = 64, nothing written
    .venv/bin/python benchmarks/run.py --report        # results.md again from results.json

For every case of benchmarks/cases.py (each shipped spec and the phrasing pairs), forward
(under torch.inference_mode) and forward+backward: the median time of each implementation
(generated, hand-written eager, the same torch.compile'd, FlexAttention's forward) over
interleaved rounds (each round runs every implementation once, in a shuffled order, so a
noisy neighbour slows all alike), taken in two passes over every case minutes apart (so a
slow spell of the machine meets a case in part of its rounds, not all), each case in a fresh
process (so no case runs in the allocator state another left), its ratio to the
fastest, and the generated module's ratio to the best hand-written one. Then the peak
memory of one forward of the generated and the hand-written module, each in its own process;
compile_spec() per spec and the first one in a fresh process; the start-up of `indexattn
latex`; generated code in bfloat16 against float32.
Writes benchmarks/results.json and benchmarks/results.md.
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import startup as startup_benchmark  # noqa: E402
import torch  # noqa: E402
from cases import CASES, IMPLEMENTATIONS, build  # noqa: E402
from report import bf16_table, shape_text, startup_table  # noqa: E402

HAND = ("eager", "compiled")

MODES = ("forward", "forward+backward")
MEMORY_SHAPE = (1, 2048)
QUICK_SHAPES = ((1, 64),)
SAMPLE_SECONDS = 0.05
ROUND_BUDGET = 2.5  # seconds of rounds per case, shape and mode, in each pass
ROUNDS = 5  # at least, per case, shape and mode, in each pass
PASSES = 2  # over every case, their rounds pooled
BF16_CASES = ("mha", "gqa", "rope", "softcap_window", "mla")
STARTUP_SPECS = ["mha", "softcap_window", "mla", "t5_bias"]  # a fresh process each, 3 times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="few rounds, no torch.compile, nothing written"
    )
    parser.add_argument(
        "--report", action="store_true", help="rewrite results.md from results.json, no run"
    )
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    hidden = argparse.SUPPRESS  # internal: one measurement in a fresh process
    parser.add_argument("--probe", nargs=4, metavar=("KIND", "CASE", "IMPL", "SHAPE"), help=hidden)
    parser.add_argument("--time-case", metavar="CASE", help=hidden)  # a pass's fresh process
    args = parser.parse_args()
    if args.time_case:
        return print(json.dumps(time_case(CASES[args.time_case], ROUNDS, quick=False)))
    if args.probe:
        kind, case, name, shape = args.probe
        return print(json.dumps(PROBES[kind](case, name, tuple(map(int, shape.split("x"))))))
    if args.report:
        results = json.loads((HERE / "results.json").read_text())
        for row in results["timings"]:
            row |= summary(row["samples"])
        return (HERE / "results.md").write_text(markdown(results))
    started = time.perf_counter()
    rounds, passes = (1, 1) if args.quick else (ROUNDS, PASSES)
    names = args.cases.split(",") if args.cases else list(CASES)
    unknown = [name for name in names if name not in CASES]
    if unknown:  # before any measurement: a typo costs no minutes
        parser.error(f"no case {', '.join(unknown)}; the cases: {', '.join(CASES)}")
    shape = QUICK_SHAPES[0] if args.quick else MEMORY_SHAPE
    results = {
        "machine": machine(),
        "peak_matmul_gflops": peak_matmul(1024 if args.quick else 4096),
        "timings": pooled([time_cases(names, args.quick) for _ in range(passes)]),
        "memory": memory(names, shape),
        "startup": startup(
            STARTUP_SPECS[:2] if args.quick else STARTUP_SPECS, 1 if args.quick else 3
        ),
        "compile_spec_ms": {} if args.quick else compile_times(),
        "latex_startup": latex_startup(1 if args.quick else 5),
        "bfloat16": bfloat16([n for n in BF16_CASES if n in names], rounds, shape),
    }
    results["seconds"] = round(time.perf_counter() - started)
    if not args.quick and not args.cases:  # a partial run leaves the quoted results alone
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


def time_cases(names: list[str], quick: bool) -> list[dict]:
    """One pass over the cases, each in a fresh process (a quick run in this one): a case
    meets no allocator state, compiled frames or thread pools an earlier case left behind.
    In one process, single_head's time with backward went from 1.04x to 1.12x the compiled
    hand-written code's after t5_bias had run, and stayed there."""
    if quick:
        return [t for name in names for t in time_case(CASES[name], 1, quick)]
    return [t for name in names for t in timed_apart(name)]


def timed_apart(name: str) -> list[dict]:
    """One case's timings (`time_case`) in a new process."""
    command = [sys.executable, __file__, "--time-case", name]
    return json.loads(subprocess.run(command, stdout=subprocess.PIPE, check=True).stdout)


def pooled(passes: list[list[dict]]) -> list[dict]:
    """Each case, shape and mode summarised over the rounds of every pass."""
    rows = []
    for row, *again in zip(*passes):
        samples = {k: [t for r in (row, *again) for t in r["samples"][k]] for k in row["samples"]}
        rows.append(row | summary(samples))
    return rows


def time_case(case, rounds: int, quick: bool) -> list[dict]:
    """Every shape and mode of one case; a quick run at n = 64, eager implementations only
    (torch.compile takes seconds per case)."""
    out = []
    shapes = case.shapes()
    if quick:  # n = 64, and the decode step with 64 cached keys
        shapes = [*QUICK_SHAPES, *[(s[0], 1, 64) for s in shapes if len(s) == 3]]
    for shape in shapes:
        names = [n for n in IMPLEMENTATIONS if not quick or n in ("generated", "eager")]
        built = {name: build(case, name, shape) for name in names}
        built = {name: impl for name, impl in built.items() if impl is not None}
        agree(built)
        for mode in MODES:
            timed = {k: v for k, v in built.items() if mode == "forward" or k != "flex"}
            timing = summary(interleaved(timed, mode, rounds))
            out.append(
                {"case": case.name, "note": case.note, "shape": shape, "mode": mode} | timing
            )
            print(f"{case.name} {shape} {mode}: {timing['ratio']}", file=sys.stderr)
    return out


def agree(built: dict) -> None:
    """Every implementation computes what the generated module computes."""
    with torch.inference_mode():
        want = first(built["generated"][0](*built["generated"][1]))
        for name, (call, inputs, _) in built.items():
            got = first(call(*inputs))
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3, msg=name)


def first(out):
    return out[0] if isinstance(out, tuple) else out


def run_once(call, inputs, params, mode: str) -> None:
    if mode == "forward":
        with torch.inference_mode():
            call(*inputs)
    else:
        for t in params:
            t.grad = None
        grads = [x.detach().requires_grad_(x.dim() > 2) for x in inputs]
        out = call(*grads)
        loss = sum(o.sum() for o in out) if isinstance(out, tuple) else out.sum()
        loss.backward()
    if inputs[0].is_cuda:  # a sample times the device's work, not only its launches
        torch.cuda.synchronize()


def interleaved(built: dict, mode: str, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call, each round running every implementation in a shuffled order.
    A sample repeats the
    call for at least SAMPLE_SECONDS, so one preemption by a neighbour weighs little; quick
    cases get more rounds, up to ROUND_BUDGET seconds. As timeit does, the garbage collector
    is off while a sample runs (and run between samples): a collection of the many objects
    sympy leaves would otherwise land on whichever implementation happens to run then."""
    shuffle = random.Random(0)
    calls = {name: repeats(impl, mode) for name, impl in built.items()}
    per_round = sum(seconds for _, seconds in calls.values())
    rounds = min(max(rounds, int(ROUND_BUDGET / per_round)), 4 * rounds)
    calls = {name: n for name, (n, _) in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in built}
    gc.freeze()  # what exists now is never garbage: collections between samples skip it
    for _ in range(rounds):
        names = list(built)
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
    ratio of two medians. `vs_hand`: the generated module's time over the faster hand-written
    implementation's (eager or compiled, whichever has the lower median)."""
    ms = {name: statistics.median(s) for name, s in samples.items()}
    best = samples[min(ms, key=ms.get)]
    ratio = {name: statistics.median(a / b for a, b in zip(s, best)) for name, s in samples.items()}
    hand = samples[min((n for n in HAND if n in ms), key=ms.get)]
    return {
        "ms": {name: round(t, 4) for name, t in ms.items()},
        "ratio": {name: round(r, 3) for name, r in ratio.items()},
        "vs_hand": round(statistics.median(a / b for a, b in zip(samples["generated"], hand)), 3),
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


# -- memory, in fresh processes


def memory(names: list[str], shape: tuple) -> list[dict]:
    """One forward of the generated and of the hand-written eager module, each in a fresh
    process."""
    out = []
    for name in names:
        row = {"case": name, "shape": shape}
        row |= {impl: fresh("memory", name, impl, shape) for impl in ("generated", "eager")}
        out.append(row)
        print(f"memory {row}", file=sys.stderr)
    return out


def fresh(kind: str, case: str, name: str, shape: tuple):
    """One probe in a new process."""
    command = [sys.executable, __file__, "--probe", kind, case, name, "x".join(map(str, shape))]
    # glibc then maps every block above 128 kB on its own and unmaps it when freed, so
    # the peak counts tensors alive together, not what earlier frees left in the heap.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(command, capture_output=True, check=True, env=env)
    return json.loads(done.stdout)


def peak_memory(case: str, name: str, shape: tuple) -> float:
    """The growth of peak resident memory (MB) over one forward, after a forward at a tiny
    size has done the lazy imports and first-call work."""
    impl = build(CASES[case], name, shape)
    small = build(CASES[case], name, (*shape[:-1], 16) if len(shape) == 3 else (shape[0], 16))
    run_once(*small, "forward")
    before = high_water_mb()
    run_once(*impl, "forward")
    return round(high_water_mb() - before, 1)


def high_water_mb() -> float:
    """Peak resident memory of this process. Linux's VmHWM: getrusage's ru_maxrss would
    carry over the peak of the parent process across exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status: peak memory needs Linux")


PROBES = {"memory": peak_memory}


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


# -- start-up and bfloat16


def startup(names: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """Seconds from `import torch` done to the first compile_spec() done, the median over
    fresh processes per spec (benchmarks/startup.py): cold, never seen by the process or its
    compile cache; warm, compiled by an earlier process and read from the cache."""
    found = startup_benchmark.measure(names, repeats)
    kinds = {"cold": "cold", "warm": "cached"}
    return {kind: {n: found[n][key]["median"] for n in names} for kind, key in kinds.items()}


def bfloat16(names: list[str], rounds: int, shape: tuple) -> list[dict]:
    """The generated module in bfloat16 against float32, forward, interleaved."""
    out = []
    for name in names:
        built = {
            str(dtype).removeprefix("torch."): build(CASES[name], "generated", shape, dtype)
            for dtype in (torch.float32, torch.bfloat16)
        }
        samples = interleaved(built, "forward", rounds)
        ms = {k: statistics.median(v) for k, v in samples.items()}
        out.append(
            {"case": name, "shape": shape, "ms": ms, "speedup": ms["float32"] / ms["bfloat16"]}
        )
        print(f"bfloat16 {out[-1]}", file=sys.stderr)
    return out


# -- the report


def markdown(results: dict) -> str:
    lines = [
        "# Benchmark results",
        "",
        f"{machine_line(results['machine'])}; float32; a 4096×4096 matrix product runs at "
        f"{results['peak_matmul_gflops']} GFLOP/s (best of 5). Medians of interleaved rounds "
        "(two passes over every case, pooled; each case in a fresh process), in ms; × hand: "
        "the generated module's time over the faster hand-written one's (eager or "
        "torch.compile'd), the median of the ratios within a round; peak MB: the growth of "
        "peak resident memory over one forward, each in a fresh process.",
    ]
    lines += ["", "## Summary", "", *summary_table(results)]
    lines += ["", "## Every implementation over the fastest", "", *ratio_table(results["timings"])]
    lines += ["", "## Start-up: first compile_spec() after `import torch` (s)", ""]
    lines += [
        "Cold: a spec the process and its compile cache (an empty directory) never saw, so "
        "sympy, the checker, the planner and the code generator run; warm: the spec compiled "
        "by an earlier process, read from the cache (benchmarks/startup.py).",
        "",
    ]
    lines += startup_table(results["startup"])
    lines += ["", "## compile_spec() per shipped spec (ms)", ""]
    lines += compile_table(results["compile_spec_ms"])
    lines += ["", "## Start-up of `indexattn latex specs/mha.attn`", "", latex_line(results)]
    lines += ["", "## bfloat16 against float32, generated, forward", "", *bf16_table(results)]
    lines += ["", f"Whole run: {results['seconds']} s.", ""]
    return "\n".join(lines)


def machine_line(m: dict) -> str:
    return f"torch {m['torch']}, {m['threads']} threads on {m['cores']} cores ({m['cpu']})"


def summary_table(results: dict) -> list[str]:
    """One line per case, shape and mode: the generated module's time, its ratio to the
    best hand-written one, and (forward at the memory shape) peak MB, generated and by hand."""
    memory = {(r["case"], tuple(r["shape"])): r for r in results["memory"]}
    lines = [
        "| case | shape | mode | generated ms | × hand | peak MB generated | peak MB hand |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in results["timings"]:
        mb = memory.get((row["case"], tuple(row["shape"])), {})
        peak = [
            f"{mb[k]:.0f}" if k in mb and row["mode"] == "forward" else ""
            for k in ("generated", "eager")
        ]
        cells = [
            row["case"],
            shape_text(row["shape"]),
            row["mode"],
            f"{row['ms']['generated']:.3g}",
        ]
        lines.append("| " + " | ".join([*cells, f"{row['vs_hand']:.2f}", *peak]) + " |")
    return lines


def ratio_table(timings: list[dict]) -> list[str]:
    names = IMPLEMENTATIONS
    lines = [
        "| case | shape | mode | " + " | ".join(f"{n} ×" for n in names) + " |",
        "|---|---|---|" + "---:|" * len(names),
    ]
    for row in timings:
        ratios = [f"{row['ratio'][n]:.2f}" if n in row["ratio"] else "—" for n in names]
        cells = [row["case"], shape_text(row["shape"]), row["mode"]]
        lines.append("| " + " | ".join(cells + ratios) + " |")
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


if __name__ == "__main__":
    main()
