"""torch.export with a dynamic sequence length (a Dim from 2 to 8192) on every shipped spec,
at its shipped knobs (blocks of rows, spans, chunks as a call meets them), the program run at
N = 2 up to 8192 against the eager module, float32, at the specs' small sample widths; and
with --compile, torch.compile(dynamic=True, fullgraph=True) the same way, no graph traced
again after the first length. Prints one line per spec (export seconds, the largest
difference relative to the largest output, over the lengths) and with --write the table
between the markers of docs/robustness.md ("Tracing at every length").

    .venv/bin/python benchmarks/tracing.py [--n 2 3 100 1000 8192] [--specs mha ...] [--write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import indexattn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from test_tracing import _tuple, exported, layer  # noqa: E402

PAGE = ROOT / "docs" / "robustness.md"
BEGIN, END = "<!-- tracing: benchmarks/tracing.py -->", "<!-- end tracing -->"


def error(program, module, name: str, lengths) -> float:
    """The largest difference of the program from the eager module over the lengths."""
    worst = 0.0
    for n in lengths:
        _, _, inputs = layer(name, n, torch.float32)
        with torch.no_grad():
            for got, want in zip(_tuple(program(*inputs)), _tuple(module(*inputs))):
                scale = want.abs().max().clamp(min=1) if want.is_floating_point() else 1
                worst = max(worst, ((got - want).abs().max() / scale).item())
    return worst


def traced(name: str, how: str, lengths) -> tuple[float, float]:
    """Seconds to trace, and the error over the lengths."""
    torch._dynamo.reset()
    spec, module, inputs = layer(name, 13, torch.float32)
    start = time.perf_counter()
    if how == "export":
        program = exported(spec, module, inputs)
    else:
        program = torch.compile(module, dynamic=True, fullgraph=True, backend="eager")
        with torch.no_grad():
            program(*inputs)
    seconds = time.perf_counter() - start
    with torch.compiler.set_stance("fail_on_recompile"):
        return seconds, error(program, module, name, lengths)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[2, 3, 100, 1000, 8192])
    parser.add_argument("--specs", nargs="+", default=sorted(indexattn.shipped_specs()))
    parser.add_argument("--compile", action="store_true", help="torch.compile, not export")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    how = "compile" if args.compile else "export"
    rows = []
    for name in args.specs:
        try:
            seconds, worst = traced(name, how, args.n)
            row = f"| {name} | {how} | {seconds:.1f} | {worst:.1e} |"
        except Exception as failure:  # reported in the table, the next spec goes on
            row = f"| {name} | {how} | failed | {type(failure).__name__} |"
        print(row, flush=True)
        rows.append(row)
    if args.write:
        lengths = ", ".join(map(str, args.n))
        head = [f"| spec ({how}; N = {lengths}) | how | seconds to trace | largest error |"]
        table = "\n".join([*head, "| --- | --- | ---: | ---: |", *rows])
        text = PAGE.read_text(encoding="utf-8")
        before, rest = text.split(BEGIN)
        after = rest.split(END)[1]
        PAGE.write_text(f"{before}{BEGIN}\n{table}\n{END}{after}", encoding="utf-8")


if __name__ == "__main__":
    main()
