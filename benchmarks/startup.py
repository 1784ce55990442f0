"""Start-up, each in a fresh process: seconds from `import torch` done to the first
`compile_spec()` done, for a spec this process and its compile cache have never seen (a cache
directory of its own, empty: the spec is checked, planned, generated and stored) and for one
an earlier process compiled (the same directory, filled: read back). The median and the
spread (least to most) over several processes per case, the cases interleaved.

    .venv/bin/python benchmarks/startup.py [--processes 7] [--specs mha gpt2]
    .venv/bin/python benchmarks/startup.py --profile cold.prof   # cProfile of one cold start
    .venv/bin/python benchmarks/startup.py --lengths 100 1000 10000  # compile time by length

Python may write the package's bytecode, as an installed package has it: with
PYTHONDONTWRITEBYTECODE set (as on the CI machines) an editable install compiles every module
of indexattn from source in each process. Targets (issue 31): cold ≤ 0.5 s, cached ≤ 0.05 s
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMED = """
import sys, time
import torch
start = time.perf_counter()
import indexattn
indexattn.compile_spec(sys.argv[1])
print(time.perf_counter() - start)
"""
PROFILED = """
import cProfile, sys
import torch
cProfile.run("import indexattn; indexattn.compile_spec(sys.argv[1])", sys.argv[2])
"""


def environment(directory: str) -> dict[str, str]:
    """This process's environment with the compile cache on, in `directory` alone."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**base, "INDEXATTN_CACHE": "1", "INDEXATTN_CACHE_DIR": directory}


def seconds(name: str, directory: str) -> float:
    command = [sys.executable, "-c", TIMED, name]
    done = subprocess.run(command, capture_output=True, text=True, env=environment(directory))
    if done.returncode != 0:
        raise RuntimeError(f"compile_spec({name!r}) failed: {done.stderr.strip()}")
    return float(done.stdout)


def measure(names: list[str], processes: int) -> dict[str, dict[str, dict]]:
    """Per spec, cold and cached: the median, least and most seconds over `processes` fresh
    processes, cold and cached alternating so that a slow spell of the machine meets both."""
    samples = {name: {"cold": [], "cached": []} for name in names}
    with tempfile.TemporaryDirectory(prefix="indexattn-startup-") as root:
        for name in names:
            filled = tempfile.mkdtemp(dir=root)
            seconds(name, filled)  # an earlier process compiled it
            for _ in range(processes):
                samples[name]["cold"].append(seconds(name, tempfile.mkdtemp(dir=root)))
                samples[name]["cached"].append(seconds(name, filled))
    return {
        name: {kind: summary(times) for kind, times in kinds.items()}
        for name, kinds in samples.items()
    }


def summary(times: list[float]) -> dict:
    return {
        "median": round(statistics.median(times), 3),
        "least": round(min(times), 3),
        "most": round(max(times), 3),
        "processes": len(times),
    }


LENGTH = """
import sys, time
sys.path.insert(0, sys.argv[2])
from startup import chain
import indexattn
indexattn.compile_spec(chain(2), name="warm")  # the compiler's imports (sympy) done first
text = chain(int(sys.argv[1]))
start, cpu = time.perf_counter(), time.process_time()
indexattn.compile_spec(text, name="chain")
print(time.perf_counter() - start, time.process_time() - cpu)
"""


def chain(n: int) -> str:
    """A spec of n equations, each reading the one before and an input: what a long spec
    costs the compiler per equation (docs/measurements.md, "Compile time")."""
    lines = ["index τ : N", "index a : d", "input X_<τa>", "param w_<a>", "Y0_<τa> = X_<τa>"]
    lines += [f"Y{k}_<τa> = tanh(Y{k - 1}_<τa>) w_<a> + X_<τa>" for k in range(1, n)]
    return "\n".join(lines) + "\n"


def lengths(ns: list[int], processes: int) -> dict[int, dict]:
    """Per length, seconds of one compile_spec (cache off, after one of a two-equation spec
    has imported the compiler) and per equation, over fresh processes, lengths interleaved;
    and the CPU time of the process over the same call (what other processes take aside)."""
    samples: dict[int, list[float]] = {n: [] for n in ns}
    cpu: dict[int, list[float]] = {n: [] for n in ns}
    env = {**os.environ, "INDEXATTN_CACHE": "0"}
    for _ in range(processes):
        for n in ns:
            command = [sys.executable, "-c", LENGTH, str(n), str(Path(__file__).parent)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            wall, used = map(float, done.stdout.split())
            samples[n].append(wall)
            cpu[n].append(used)
    return {
        n: {
            **summary(t),
            "ms per equation": round(1000 * statistics.median(t) / n, 2),
            "CPU ms per equation": round(1000 * statistics.median(cpu[n]) / n, 2),
        }
        for n, t in samples.items()
    }


def profile(name: str, out: str) -> None:
    """cProfile of one cold start (an empty cache directory) into `out`."""
    with tempfile.TemporaryDirectory(prefix="indexattn-startup-") as directory:
        command = [sys.executable, "-c", PROFILED, name, out]
        subprocess.run(command, check=True, env=environment(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--specs", nargs="+", default=["mha", "gpt2", "softcap_window"])
    parser.add_argument("--profile", metavar="OUT", help="profile one cold start of the first")
    parser.add_argument("--lengths", type=int, nargs="+", help="compile chains of these lengths")
    args = parser.parse_args()
    if args.lengths:
        print(json.dumps(lengths(args.lengths, args.processes), indent=1))
        return
    if args.profile:
        profile(args.specs[0], args.profile)
        return
    print(json.dumps(measure(args.specs, args.processes), indent=1))


if __name__ == "__main__":
    main()
