"""Forward + backward of shipped specs with autograd's backward and with the derived one
(`backward="derived"`): time and peak memory, each measurement in a fresh process on one
thread, the two modes interleaved round by round; writes the measurements and the default
backward each spec gets (indexattn/derive/defaults.json).

    .venv/bin/python benchmarks/gradients.py --n 2048,4096,8192 --rounds 3,2,1 --write

Sizes: N = each of --n, heads 8 (h_kv 2 × n_rep 4), d_m 512, every other size 64; float32 on CPU,
one batch element. Time: the first forward+backward pass at N, after one at N = 16 (the
lazy imports, the compiled backward); its per-shape work (sizes, constants) is included, a
small part of a step at these N, and one pass a process keeps N = 8192 affordable; the median
over rounds, with its spread. Memory: the growth of the process's peak resident memory (MB)
over that pass, with glibc mapping every block above 128 kB on its own (as
benchmarks/spec_memory.py), so the peak counts the tensors alive together and each pass
touches fresh pages. Each probe's figures are appended to --log as they come (a long run that
stops keeps what it measured). The derived backward is a spec's default where, at every
measured N >= 4096, its peak memory is below autograd's and its median time at most 1.1x
autograd's (indexattn/derive/defaults.py, docs/gradients.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from indexattn.catalog import shipped_specs  # noqa: E402
from indexattn.derive.defaults import TABLE, choose, digest  # noqa: E402

SIZES = {"h": 8, "h_kv": 2, "n_rep": 4, "d_m": 512}
BLOCKED = "softcap_window,attention_sinks,differential,talking_heads,sigmoid_attention"
DEFAULT = f"mha,gqa,{BLOCKED}"
MODES = ("autograd", "derived")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="2048", help="comma-separated sequence lengths")
    parser.add_argument("--specs", default=DEFAULT, help="comma-separated, or `all` shipped")
    parser.add_argument("--rounds", default="3", help="comma-separated, one for each N")
    parser.add_argument("--log", type=Path, help="append each probe's figures (JSON lines)")
    parser.add_argument("--from-log", type=Path, help="summarise a log instead of measuring")
    parser.add_argument("--write", action="store_true", help="write the defaults' table")
    parser.add_argument("--probe", nargs=2, metavar=("SPEC", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe, int(args.n))))
        return
    names = sorted(shipped_specs()) if args.specs == "all" else args.specs.split(",")
    lengths = [int(n) for n in args.n.split(",")]
    rounds = [int(r) for r in args.rounds.split(",")]
    rounds += rounds[-1:] * (len(lengths) - len(rounds))
    rows = []
    for n, r in zip(lengths, rounds, strict=True):
        found = logged(args.from_log, n) if args.from_log else measure(names, n, r, args.log)
        rows += [summary(name, n, found[name]) for name in names if name in found]
    print("| spec | N | autograd ms | derived ms | derived / autograd | autograd MB | derived MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['spec']} | {r['n']} | {r['autograd ms']} | {r['derived ms']} | "
            f"{r['ratio']:.2f} | {r['autograd MB']:.0f} | {r['derived MB']:.0f} |"
        )
    if args.write:
        write(rows)


def measure(
    names: list[str], n: int, rounds: int, log: Path | None
) -> dict[str, dict[str, list[dict]]]:
    """Every spec in every mode, once a round; within a round the modes alternate which goes
    first, so that a change of the machine's load falls on both."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT)}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    found = {name: {mode: [] for mode in MODES} for name in names}
    for r in range(rounds):
        for name in names:
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                command = [sys.executable, __file__, "--probe", name, mode, "--n", str(n)]
                done = subprocess.run(
                    command, stdout=subprocess.PIPE, check=True, env=env, text=True
                )
                found[name][mode].append(json.loads(done.stdout))
                if log:
                    with log.open("a", encoding="utf-8") as out:
                        print(
                            json.dumps(
                                {"spec": name, "mode": mode, "n": n, **found[name][mode][-1]}
                            ),
                            file=out,
                        )
    return found


def logged(log: Path, n: int) -> dict[str, dict[str, list[dict]]]:
    """The probes of a --log at N, by spec and mode (a spec with both modes measured)."""
    found: dict = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        probe = json.loads(line)
        if probe["n"] == n:
            found.setdefault(probe["spec"], {m: [] for m in MODES})[probe["mode"]].append(probe)
    return {name: modes for name, modes in found.items() if all(modes.values())}


def summary(name: str, n: int, found: dict[str, list[dict]]) -> dict:
    """The medians of the rounds; the times with their spread (min–max) over several."""
    row: dict = {"spec": name, "n": n}
    for mode in MODES:
        times = [p["ms"] for p in found[mode]]
        spread = f" ({min(times):.0f}–{max(times):.0f})" if len(times) > 1 else ""
        row[f"{mode} ms"] = f"{statistics.median(times):.0f}{spread}"
        row[f"{mode} median ms"] = statistics.median(times)
        row[f"{mode} MB"] = statistics.median(p["mb"] for p in found[mode])
    row["ratio"] = row["derived median ms"] / row["autograd median ms"]
    return row


def write(rows: list[dict]) -> None:
    """The table each spec's default backward is read from: its measurements by N, the
    choice, and the hash of the spec's text it was measured on (a changed spec falls back to
    autograd until the benchmark is run again). A spec's earlier rows at other N are kept
    only where its text is unchanged."""
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    for row in rows:
        text = (ROOT / "specs" / f"{row['spec']}.attn").read_text(encoding="utf-8")
        old = table.get(row["spec"], {})
        measured = old.get("measured", {}) if old.get("sha256") == digest(text) else {}
        measured[str(row["n"])] = {
            f"{m} {u}": round(row[f"{m} {k}"], 1)
            for m in MODES
            for u, k in (("ms", "median ms"), ("MB", "MB"))
        }
        measured = dict(sorted(measured.items(), key=lambda item: int(item[0])))
        table[row["spec"]] = {
            "backward": choose(measured),
            "sha256": digest(text),
            "measured": measured,
        }
    TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=1, ensure_ascii=False) + "\n")


def probe(name: str, mode: str, n: int) -> dict[str, float]:
    import resource
    import time

    import torch

    import indexattn
    from indexattn.oracle.verify import sample_arguments

    torch.set_num_threads(1)
    spec = indexattn.compile_spec(ROOT / "specs" / f"{name}.attn")

    def arguments(length: int) -> dict:
        sizes = {a: SIZES.get(a, 64) for a in spec.ir.size_asciis} | {"N": length}
        args = sample_arguments(spec.ir, sizes, (1,), torch.float32)
        given = {k: v for k, v in sizes.items() if k in spec.required}
        leaves = {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}
        return leaves | given

    def step(kwargs: dict) -> None:
        out = spec(**kwargs, backward=mode)
        out = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in out if o.is_floating_point()).backward()

    step(arguments(16))
    big = arguments(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    step(big)
    ms = (time.perf_counter() - start) * 1000
    return {"ms": ms, "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}


if __name__ == "__main__":
    main()
